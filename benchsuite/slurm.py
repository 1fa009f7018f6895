"""An sbatch script for a suite: each node count of the job is its own srun step, one launcher per node,
c10d rendezvous on the step's first host. Every interpolated value is shell-quoted; #SBATCH values, which
Slurm reads without a shell, are checked against a strict pattern instead. The set-up lines are the
user's shell code: written verbatim into a quoted here-document and run by `eval`, so that their text, even
an unclosed quote or here-document, cannot change the script's own syntax (swallow the lines after it).

Nothing of the generating machine is written in: the interpreter is a command looked up on the job's
PATH after the set-up, and paths are as the caller gives them (relative ones resolve against the submit
directory, which the script changes to).

The node's one task runs torchrun with G ranks, so it asks for many CPUs (Slurm's default is one
per task, which every rank would share). The rendezvous port comes from the job id, so two jobs
whose first host is the same node do not collide.

Requeue: Slurm sends SIGTERM to the batch shell `signal_seconds` before the time limit (--signal=B:TERM),
and on preemption or scancel. The trap forwards it to the running step (each `benchsuite run` then records
the run in progress interrupted and exits, as on Ctrl-C), waits for the step, and requeues the job; the
next start runs the same `benchsuite run`s, which resume: a run recorded ok is never measured again, the
interrupted one is. scancel's SIGTERM comes after Slurm has marked the job cancelled, which it does not requeue.
`set -u` starts after the set-up: environment activation scripts read unset variables."""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from pathlib import Path

from benchsuite.record.names import slug

_SBATCH_SAFE = re.compile(r"^[A-Za-z0-9_.:+,=@/%-]+$")
MEM_SIZE = re.compile(r"^[0-9]+[KMGT]?$")  # Slurm's --mem: megabytes, or a K/M/G/T suffix; 0: all of the node's
GPU_REQUESTS = ("gpus-per-node", "gres")  # #SBATCH --gpus-per-node=G, or --gres=gpu:G (clusters without GPU TRES)
CPUS_PER_GPU = 8  # the default --cpus-per-task is this × GPUs per node (DGX-class nodes have 14-16)
RDZV_PORT_BASE, RDZV_PORT_SPAN = 20000, 10000  # port = base + job id % span, below the ephemeral range
SIGNAL_SECONDS, MAX_REQUEUES = 300, 10  # the time-limit warning; requeues after which the job stops for good


def _directive(name: str, value: str | int, option: str | None = None) -> str:
    """#SBATCH --name=value; option: the command-line option the value came from (default --name)."""
    value = str(value)
    if not _SBATCH_SAFE.match(value):
        raise ValueError(f"{option or '--' + name} {value!r}: only letters, digits and _.:+,=@/%- are allowed in "
                         "#SBATCH values")
    return f"#SBATCH --{name}={value}"


def gpu_option(gpu_request: str, gpus_per_node: int) -> str:
    """The sbatch/srun option asking for G GPUs on every node, in the form the cluster takes."""
    if gpu_request not in GPU_REQUESTS:
        raise ValueError(f"--gpu-request {gpu_request!r}: one of {', '.join(GPU_REQUESTS)}")
    return f"--gres=gpu:{gpus_per_node}" if gpu_request == "gres" else f"--gpus-per-node={gpus_per_node}"


def sbatch_script(suite_path: str | Path, suite_name: str, out_dir: str | Path, nodes: int, gpus_per_node: int,
                  partition: str | None = None, time: str | None = None, account: str | None = None,
                  python: str | Sequence[str] = "python3", cpus_per_task: int | None = None, exclusive: bool = False,
                  job_output: str | None = None, repeat: int = 1, *, node_counts: Sequence[int] | None = None,
                  setup: Sequence[str] = (), mem: str | None = None, gpu_request: str = "gpus-per-node",
                  requeue: bool = True, signal_seconds: int = SIGNAL_SECONDS,
                  max_requeues: int = MAX_REQUEUES, left_out: Sequence[int] = ()) -> str:
    """nodes: the allocation; node_counts: the steps, run in this order (default: one step on all nodes);
    left_out: the suite's node counts no step runs, named in the script.
    python: the command (a name on the job's PATH, or its words, e.g. a container's `apptainer exec
    IMAGE python3`) that runs `-m benchsuite.cli`. setup: shell texts run before it, in the submit directory,
    each by its own eval (a text that does not parse stops the job there; it cannot reach the lines after it).
    job_output: the #SBATCH --output pattern (e.g. DIR/logs/slurm-%j.out); None keeps Slurm's
    slurm-%j.out in the submit directory. repeat: `run --repeat`, measurements of each run."""
    counts = list(node_counts or [nodes])
    if max(counts) > nodes or min(counts) < 1:
        raise ValueError(f"node counts {counts}: each must be from 1 to the allocation's {nodes} nodes")
    if mem is not None and not MEM_SIZE.match(mem):
        raise ValueError(f"--mem {mem!r}: a size as Slurm takes it, e.g. 64G, 500000M or 0 (all of the node's)")
    python = [python] if isinstance(python, str) else list(python)
    gpus = gpu_option(gpu_request, gpus_per_node)
    lines = _directives(suite_name, nodes, gpus, cpus_per_task or CPUS_PER_GPU * gpus_per_node, mem, exclusive,
                        {"output": (job_output, "--job-output"), "partition": (partition, None),
                         "time": (time, None), "account": (account, None)}, signal_seconds, requeue)
    lines += _prologue(counts, left_out)
    lines += _setup_block(setup)
    lines += _variables(suite_path, out_dir, python, repeat, requeue, max_requeues, gpus)
    lines += STEP_FUNCTION + _steps(counts)
    return "\n".join(lines) + "\n"


_SETUP_END = "BENCHSUITE_SETUP_END"  # the here-document's terminator, suffixed when a set-up line is this word


def _setup_block(setup: Sequence[str]) -> list[str]:
    """Each set-up text read verbatim by a quoted here-document and run by eval, in this shell (its exports
    and `source`s stay). Inline, an unclosed quote would swallow the script's own lines, and a text ending in
    a backslash would join one of them; here only the terminator line ends it, chosen to be none of its lines."""
    if not setup:
        return []
    lines = ["# --- set-up (--setup), before benchsuite; srun passes its environment to every node's task "
             "(--export=ALL, Slurm's default). Each text is read as it is and run by eval: it cannot change "
             "this script's syntax ---"]
    for text in setup:
        body = text.rstrip("\n").split("\n")
        end, n = _SETUP_END, 1
        while end in body:
            n += 1
            end = f"{_SETUP_END}_{n}"
        lines += [f"IFS= read -r -d '' BENCHSUITE_SETUP <<'{end}' || true  # read stops at the end: status 1",
                  *body, end, 'eval "$BENCHSUITE_SETUP"']
    return lines + ["unset BENCHSUITE_SETUP", "# --- end of set-up ---"]


def _directives(suite_name: str, nodes: int, gpus: str, cpus: int, mem: str | None, exclusive: bool,
                optional: dict[str, tuple[str | None, str | None]], signal_seconds: int, requeue: bool) -> list[str]:
    """The #SBATCH lines: the job's name and shape, the options given (optional: name -> (value, the
    benchsuite option that set it)), the warning signal, requeue."""
    lines = ["#!/bin/bash", _directive("job-name", f"benchsuite-{slug(suite_name, 53)}"[:64]),
             _directive("nodes", nodes), _directive("ntasks-per-node", 1), "#SBATCH " + gpus,
             _directive("cpus-per-task", cpus)]
    if mem is not None:
        lines.append(_directive("mem", mem))
    if exclusive:  # node CPU/DRAM energy (RAPL) is per host: another job on the node would be counted
        lines.append("#SBATCH --exclusive")
    lines += [_directive(name, value, option) for name, (value, option) in optional.items() if value]
    lines.append(_directive("signal", f"B:TERM@{int(signal_seconds)}", "--signal-seconds"))
    if requeue:  # append: a requeued start keeps the earlier start's output
        lines += ["#SBATCH --requeue", "#SBATCH --open-mode=append"]
    return lines


def _prologue(counts: list[int], left_out: Sequence[int]) -> list[str]:
    """What the job does, where it runs from, and the SIGTERM trap (set before the set-up, so a signal during
    it still stops the job)."""
    return [
        "# Steps: " + ", ".join(f"{k} node(s)" for k in counts) + ", each its own srun step on the allocation's "
        "first hosts (a smaller step leaves the other nodes idle).",
        *([f"# Not in this job: the runs on {', '.join(map(str, left_out))} node(s); another job runs them "
           "(benchsuite slurm --node-counts)."] if left_out else []),
        "set -eo pipefail",
        "# From where sbatch was called, as Slurm would by default: relative paths (the suite, --out, train.data) "
        "resolve here.",
        'cd "$SLURM_SUBMIT_DIR"',
        "# Before the set-up: a signal during it still stops the job (and requeues it).",
        'STEP_PID=""',
        "STOPPING=0",
        "",
        "stop() {  # SIGTERM: --signal's warning before the time limit, preemption, scancel",
        "    STOPPING=1",
        '    echo "benchsuite job: SIGTERM; stopping: the run in progress is recorded interrupted" >&2',
        '    if [[ -n "$STEP_PID" ]]; then kill -TERM "$STEP_PID" 2>/dev/null || true; fi',
        "}",
        "trap stop TERM",
        "",
    ]


def _variables(suite_path: str | Path, out_dir: str | Path, python: list[str], repeat: int, requeue: bool,
               max_requeues: int, gpus: str) -> list[str]:
    """The job's settings as shell variables, the check that the set-up put Python on PATH, the hosts and
    the rendezvous port."""
    return [
        "set -u",
        f"SUITE={shlex.quote(str(suite_path))}",
        f"OUT={shlex.quote(str(out_dir))}",
        f"PYTHON=({' '.join(shlex.quote(word) for word in python)})",
        f"REPEAT={int(repeat)}",
        f"REQUEUE={int(requeue)}",
        f"MAX_REQUEUES={int(max_requeues)}",
        f"GPUS={gpus}",
        'command -v "${PYTHON[0]}" >/dev/null || { echo "benchsuite job: ${PYTHON[0]} is not on PATH after the '
        'set-up; give --setup lines that load benchsuite\'s environment" >&2; exit 2; }',
        "# a variable first: set -e sees scontrol fail, which a here-string would hide",
        'NODE_LIST=$(scontrol show hostnames "$SLURM_JOB_NODELIST")',
        'mapfile -t HOSTS <<< "$NODE_LIST"',
        f"RDZV_PORT=$(({RDZV_PORT_BASE} + SLURM_JOB_ID % {RDZV_PORT_SPAN}))",
        "STATUS=0",
        "",
    ]


# One launcher per node of a step, in the background so that the trap runs at once.
STEP_FUNCTION = [
    "# One launcher per node of the step, rendezvous at its first host. In the background, so that the trap",
    "# runs at once; the CPUs are passed to srun explicitly: Slurm 22.05 on does not hand sbatch's",
    "# --cpus-per-task to srun.",
    "step() {",
    "    local nodes=$1 hosts status=0",
    "    if (( ${#HOSTS[@]} < nodes )); then",
    '        echo "benchsuite job: the ${nodes}-node step skipped: the allocation has ${#HOSTS[@]} node(s)" >&2',
    "        return 1",
    "    fi",
    '    hosts=$(IFS=,; echo "${HOSTS[*]:0:nodes}")',
    '    srun --kill-on-bad-exit=1 --nodes="$nodes" --ntasks="$nodes" --ntasks-per-node=1 --nodelist="$hosts" '
    '--cpus-per-task="$SLURM_CPUS_PER_TASK" "$GPUS" \\',
    '        bash -c \'exec "${@:6}" -m benchsuite.cli run "$1" --out "$2" --nnodes "$3" '
    '--node-rank "$SLURM_NODEID" --rdzv-endpoint "$4" --rdzv-id "$SLURM_JOB_ID" --repeat "$5"\' \\',
    '        benchsuite "$SUITE" "$OUT" "$nodes" "${HOSTS[0]}:$RDZV_PORT" "$REPEAT" "${PYTHON[@]}" &',
    "    STEP_PID=$!",
    '    wait "$STEP_PID" || status=$?',
    '    while kill -0 "$STEP_PID" 2>/dev/null; do  # the trap ended the wait, not the step',
    "        status=0",
    '        wait "$STEP_PID" || status=$?',
    "    done",
    '    STEP_PID=""',
    '    return "$status"',
    "}",
    "",
]


def _steps(counts: list[int]) -> list[str]:
    """Each node count's step in turn, then, when stopped, the requeue (or why not) and exit 130."""
    return [
        'echo "benchsuite job $SLURM_JOB_ID: start $(( ${SLURM_RESTART_COUNT:-0} + 1 )); runs recorded ok are '
        'skipped" >&2',
        f"for NODES in {' '.join(str(k) for k in counts)}; do",
        "    if (( STOPPING )); then break; fi",
        '    step "$NODES" || STATUS=$?',
        "done",
        "if (( STOPPING )); then",
        "    if (( REQUEUE && ${SLURM_RESTART_COUNT:-0} < MAX_REQUEUES )); then",
        '        echo "benchsuite job: requeueing job $SLURM_JOB_ID; the next start resumes: runs recorded ok are not '
        'measured again, the interrupted one is" >&2',
        '        scontrol requeue "$SLURM_JOB_ID" || echo "benchsuite job: not requeued (Slurm does not requeue '
        'a cancelled job)" >&2',
        "    elif (( REQUEUE )); then",
        '        echo "benchsuite job: not requeued: it was requeued $MAX_REQUEUES times (--max-requeues); '
        'submit it again to resume" >&2',
        "    fi",
        "    exit 130",
        "fi",
        'exit "$STATUS"',
    ]
