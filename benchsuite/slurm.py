"""An sbatch script for a suite: one launcher per node via srun, c10d rendezvous on the
allocation's first host. Every interpolated value is shell-quoted; #SBATCH values, which
Slurm reads without a shell, are checked against a strict pattern instead."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

from benchsuite.results.store import slug

_SBATCH_SAFE = re.compile(r"^[A-Za-z0-9_.:+,=@/-]+$")
RDZV_PORT = 29500


def _directive(name: str, value: str | int) -> str:
    value = str(value)
    if not _SBATCH_SAFE.match(value):
        raise ValueError(f"--{name} {value!r}: only letters, digits and _.:+,=@/- are allowed in #SBATCH values")
    return f"#SBATCH --{name}={value}"


def sbatch_script(suite_path: str | Path, suite_name: str, out_dir: str | Path, nodes: int, gpus_per_node: int,
                  partition: str | None = None, time: str | None = None, account: str | None = None,
                  python: str = sys.executable) -> str:
    job = slug(suite_name, 53)
    lines = ["#!/bin/bash", _directive("job-name", f"benchsuite-{job}"[:64]), _directive("nodes", nodes),
             _directive("ntasks-per-node", 1), _directive("gpus-per-node", gpus_per_node)]
    for name, value in (("partition", partition), ("time", time), ("account", account)):
        if value:
            lines.append(_directive(name, value))
    lines += [
        "set -euo pipefail",
        f"SUITE={shlex.quote(str(suite_path))}",
        f"OUT={shlex.quote(str(out_dir))}",
        f"PYTHON={shlex.quote(python)}",
        "# sed reads the whole list (head would close the pipe early: SIGPIPE under pipefail)",
        'HEAD_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)',
        f'RDZV="$HEAD_NODE:{RDZV_PORT}"',
        "# One launcher per node; each starts torchrun for every run, rendezvous at the first host.",
        'srun --kill-on-bad-exit=1 --ntasks-per-node=1 bash -c \'exec "$0" -m benchsuite.cli run "$1" --out "$2" '
        '--nnodes "$SLURM_NNODES" --node-rank "$SLURM_NODEID" --rdzv-endpoint "$3" --rdzv-id "$SLURM_JOB_ID"\' '
        '"$PYTHON" "$SUITE" "$OUT" "$RDZV"',
    ]
    return "\n".join(lines) + "\n"
