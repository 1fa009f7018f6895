"""An sbatch script for a suite: one launcher per node via srun, c10d rendezvous on the
allocation's first host. Every interpolated value is shell-quoted; #SBATCH values, which
Slurm reads without a shell, are checked against a strict pattern instead.

The node's one task runs torchrun with G ranks, so it asks for many CPUs (Slurm's default is one
per task, which every rank would share). The rendezvous port comes from the job id, so two jobs
whose first host is the same node do not collide."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

from benchsuite.record.names import slug

_SBATCH_SAFE = re.compile(r"^[A-Za-z0-9_.:+,=@/%-]+$")
CPUS_PER_GPU = 8  # the default --cpus-per-task is this × GPUs per node (DGX-class nodes have 14-16)
RDZV_PORT_BASE, RDZV_PORT_SPAN = 20000, 10000  # port = base + job id % span, below the ephemeral range


def _directive(name: str, value: str | int, option: str | None = None) -> str:
    """#SBATCH --name=value; option: the command-line option the value came from (default --name)."""
    value = str(value)
    if not _SBATCH_SAFE.match(value):
        raise ValueError(f"{option or '--' + name} {value!r}: only letters, digits and _.:+,=@/%- are allowed in "
                         "#SBATCH values")
    return f"#SBATCH --{name}={value}"


def sbatch_script(suite_path: str | Path, suite_name: str, out_dir: str | Path, nodes: int, gpus_per_node: int,
                  partition: str | None = None, time: str | None = None, account: str | None = None,
                  python: str = sys.executable, cpus_per_task: int | None = None, exclusive: bool = False,
                  job_output: str | None = None, repeat: int = 1) -> str:
    """job_output: the #SBATCH --output pattern (e.g. DIR/logs/slurm-%j.out); None keeps Slurm's
    slurm-%j.out in the submit directory. repeat: `run --repeat`, measurements of each run."""
    job = slug(suite_name, 53)
    lines = ["#!/bin/bash", _directive("job-name", f"benchsuite-{job}"[:64]), _directive("nodes", nodes),
             _directive("ntasks-per-node", 1), _directive("gpus-per-node", gpus_per_node),
             _directive("cpus-per-task", cpus_per_task or CPUS_PER_GPU * gpus_per_node)]
    if exclusive:  # node CPU/DRAM energy (RAPL) is per host: another job on the node would be counted
        lines.append("#SBATCH --exclusive")
    for name, value, option in (("output", job_output, "--job-output"), ("partition", partition, None),
                                ("time", time, None), ("account", account, None)):
        if value:
            lines.append(_directive(name, value, option))
    lines += [
        "set -euo pipefail",
        '# From where sbatch was called, as Slurm would by default: relative train.data paths resolve.',
        'cd "$SLURM_SUBMIT_DIR"',
        f"SUITE={shlex.quote(str(suite_path))}",
        f"OUT={shlex.quote(str(out_dir))}",
        f"PYTHON={shlex.quote(python)}",
        f"REPEAT={int(repeat)}",
        "# sed reads the whole list (head would close the pipe early: SIGPIPE under pipefail)",
        'HEAD_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)',
        f"RDZV_PORT=$(({RDZV_PORT_BASE} + SLURM_JOB_ID % {RDZV_PORT_SPAN}))",
        'RDZV="$HEAD_NODE:$RDZV_PORT"',
        "# One launcher per node; each starts torchrun for every run, rendezvous at the first host.",
        "# The CPUs are passed to srun explicitly: Slurm 22.05 on does not hand sbatch's --cpus-per-task to srun.",
        'srun --kill-on-bad-exit=1 --ntasks-per-node=1 --cpus-per-task="$SLURM_CPUS_PER_TASK" '
        'bash -c \'exec "$0" -m benchsuite.cli run "$1" --out "$2" '
        '--nnodes "$SLURM_NNODES" --node-rank "$SLURM_NODEID" --rdzv-endpoint "$3" --rdzv-id "$SLURM_JOB_ID" '
        '--repeat "$4"\' "$PYTHON" "$SUITE" "$OUT" "$RDZV" "$REPEAT"',
    ]
    return "\n".join(lines) + "\n"
