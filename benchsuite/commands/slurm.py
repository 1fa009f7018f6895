"""`benchsuite slurm SUITE.toml`: an sbatch script that runs the suite on a Slurm allocation."""

from __future__ import annotations

import argparse
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from benchsuite.commands.common import (COUNT, INDEX, OUTPUT, REPEAT, UsageError, check_repeat, err, make_folder,
                                        number, output_file, path_arg)
from benchsuite.config import RANKS_PER_CORE
from benchsuite.config.preflight import load_suite
from benchsuite.slurm import GPU_REQUESTS, MAX_REQUEUES, MEM_SIZE, SIGNAL_SECONDS
from benchsuite.terminal import printable

DEFAULT_JOB_OUTPUT = "OUT/logs/slurm-%j.out"


def node_counts(text: str) -> list[int]:
    """--node-counts 1,2,4: distinct whole numbers >= 1, in ascending order (the steps' order)."""
    try:
        counts = sorted({int(part) for part in text.split(",")})
    except ValueError:
        counts = []
    if not counts or counts[0] < 1:
        raise argparse.ArgumentTypeError(f"expected node counts >= 1 separated by commas, e.g. 1,2, got {text!r}")
    return counts


def mem_size(text: str) -> str:
    """--mem as Slurm reads it: checked now, not after the job's wait in the queue."""
    if not MEM_SIZE.match(text):
        raise argparse.ArgumentTypeError(f"expected a size as Slurm takes it: megabytes or a K, M, G or T suffix, "
                                         f"e.g. 64G, 500000M, or 0 for all of the node's memory; got {text!r}")
    return text


def python_command(text: str) -> list[str]:
    """--python: the words of the command that runs `-m benchsuite.cli` on the nodes."""
    try:
        words = shlex.split(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{text!r}: {e}") from None
    if not words:
        raise argparse.ArgumentTypeError("expected a command, e.g. python3, got ''")
    return words


def add_parser(sub) -> None:
    sl = sub.add_parser("slurm", parents=[REPEAT],
                        help="write an sbatch script that runs the suite on a Slurm allocation")
    sl.add_argument("suite", type=path_arg, help="suite TOML file the job runs, e.g. workloads/smoke.toml")
    sl.add_argument("--cpus-per-task", type=COUNT, default=None,
                    help="CPUs of the node's one task, which runs all G ranks (default: 8 × --gpus-per-node; "
                         f"Slurm's own default of 1 CPU per task would be shared by every rank; `run` starts at most "
                         f"{RANKS_PER_CORE} ranks per CPU)")
    sl.add_argument("--exclusive", action="store_true",
                    help="the nodes to this job alone: CPU and DRAM energy (RAPL) is measured per host, so "
                         "another job on the node would be counted in the run's joules")
    sl.add_argument("--job-output", type=path_arg, metavar="PATTERN",
                    help="the job's stdout/stderr (#SBATCH --output; %%j is the job id, %%u the user); its folder is "
                         "created now, as Slurm creates none, so %%-patterns, which Slurm expands at job start, go in "
                         f"the file name only; default {DEFAULT_JOB_OUTPUT.replace('%', '%%')}")
    sl.add_argument("--nodes", type=COUNT, default=None,
                    help="nodes of the allocation (#SBATCH --nodes), one of the suite's node counts (default: the "
                         "largest of the job's node counts)")
    sl.add_argument("--node-counts", type=node_counts, default=None, metavar="K[,K...]",
                    help="the suite's node counts this job runs, each as its own srun step on the allocation's first "
                         "K hosts (default: every node count of the suite up to --nodes); a smaller step leaves the "
                         "other nodes idle: give one count for a job of its own")
    sl.add_argument("--gpus-per-node", type=COUNT, required=True,
                    help="GPUs of each node; at least the suite's ranks per node")
    sl.add_argument("--gpu-request", choices=GPU_REQUESTS, default="gpus-per-node",
                    help="how the GPUs are asked for: #SBATCH --gpus-per-node=G (default) or --gres=gpu:G, "
                         "whichever the cluster takes")
    sl.add_argument("--mem", type=mem_size, default=None,
                    help="memory of each node (#SBATCH --mem), e.g. 64G, 500000M, 0 for all of it; default: the "
                         "cluster's")
    sl.add_argument("--setup", action="append", default=[], metavar="FILE_OR_LINES",
                    help="shell lines run in the job before benchsuite, in the submit folder: `module load ...`, "
                         "activating an environment; an existing file's lines are copied in, any other value is "
                         "the lines themselves; repeatable, in order")
    sl.add_argument("--python", type=python_command, default=["python3"], metavar="COMMAND",
                    help="the command that runs `-m benchsuite.cli` on every node, looked up on the job's PATH "
                         "after the set-up (default: python3); its words, e.g. 'apptainer exec --nv IMAGE python3'")
    sl.add_argument("--requeue", action=argparse.BooleanOptionalAction, default=True,
                    help="on SIGTERM (the time-limit warning, preemption) stop the runs and requeue the job, which "
                         "resumes: runs recorded ok are skipped (default: on)")
    sl.add_argument("--signal-seconds", type=number(int, at_least=1, at_most=65535), default=SIGNAL_SECONDS,
                    metavar="S", help=f"SIGTERM this long before the time limit (#SBATCH --signal=B:TERM@S; "
                                      f"default {SIGNAL_SECONDS}), for the run in progress to be recorded interrupted")
    sl.add_argument("--max-requeues", type=INDEX, default=MAX_REQUEUES, metavar="N",
                    help=f"requeues after which the job stops for good (default {MAX_REQUEUES}): a run longer than "
                         f"--time would otherwise be requeued forever")
    sl.add_argument("--partition", help="Slurm partition (#SBATCH --partition); default: the cluster's")
    sl.add_argument("--time", help="wall-clock limit, e.g. 02:00:00")
    sl.add_argument("--account", help="account charged for the job (#SBATCH --account)")
    sl.add_argument("--out", type=path_arg, default="results",
                    help="results folder, shared by all nodes (created now, as `run` would)")
    sl.add_argument("-o", "--output", type=path_arg, default="-", help=OUTPUT + "the sbatch script file (default: stdout)")
    sl.set_defaults(fn=run)


def run(args) -> int:
    """Everything the job's `run` would refuse is refused here, by the same rules, and every folder the job
    writes to exists before it is submitted: a job that fails after its wait in the queue costs the most."""
    from benchsuite.atomic import atomic_file
    from benchsuite.slurm import sbatch_script

    suite = load_suite(args.suite)
    check_repeat(suite, args.repeat)
    nodes, counts, left_out = _steps(args, sorted({r.nodes for r in suite.runs}))
    runs = [r for r in suite.runs if r.nodes in counts]
    ranks_per_node = max(r.nproc_per_node for r in runs)  # one rank per GPU
    where = f"on {', '.join(map(str, counts))} node(s)"
    if args.gpus_per_node < ranks_per_node:
        raise UsageError(f"--gpus-per-node {args.gpus_per_node}: the suite's runs {where} start up to "
                         f"{ranks_per_node} ranks per node, one per GPU; give --gpus-per-node {ranks_per_node} or more")
    if args.cpus_per_task is not None and args.cpus_per_task * RANKS_PER_CORE < ranks_per_node:
        raise UsageError(f"--cpus-per-task {args.cpus_per_task}: the suite's runs {where} start up to "
                         f"{ranks_per_node} ranks per node, and `benchsuite run` starts at most {RANKS_PER_CORE} per "
                         f"CPU; give --cpus-per-task {math.ceil(ranks_per_node / RANKS_PER_CORE)} or more")
    setup = [_setup_text(value) for value in args.setup]
    hint = "" if args.job_output else f"; give --job-output PATTERN (the default is {DEFAULT_JOB_OUTPUT})"
    suite_path, out_dir = _submit_relative(args.suite), _submit_relative(args.out)
    job_output = _submit_relative(args.job_output) if args.job_output else str(Path(out_dir, "logs", "slurm-%j.out"))
    try:
        script = sbatch_script(suite_path, suite.name, out_dir, nodes, args.gpus_per_node, args.partition,
                               args.time, args.account, python=args.python, cpus_per_task=args.cpus_per_task,
                               exclusive=args.exclusive, job_output=job_output, repeat=args.repeat,
                               node_counts=counts, setup=setup, mem=args.mem, gpu_request=args.gpu_request,
                               requeue=args.requeue, signal_seconds=args.signal_seconds,
                               max_requeues=args.max_requeues, left_out=left_out)
    except ValueError as e:
        raise UsageError(f"{e}{hint}") from None
    _check_job_output_folder(job_output, hint)
    if args.output != "-":
        output_file("-o", args.output, "sbatch script", source=args.suite)
    make_folder("--out", args.out, "results folder")
    output_file("--job-output", job_output, "job output")  # its folder: without it the job dies with no output
    if left_out:
        err.print(printable(f"note: the suite's runs on {', '.join(map(str, left_out))} node(s) are not in this job; "
                            f"another job runs them: benchsuite slurm --node-counts "
                            f"{','.join(map(str, left_out))} ..."), markup=False)
    if args.output == "-":
        sys.stdout.write(script)
        return 0
    with atomic_file(args.output, "w", encoding="utf-8") as f:
        f.write(script)
    err.print(printable(f"wrote {args.output}; submit it from this folder (relative paths resolve against it): "
                        f"sbatch {args.output}"), markup=False)
    return 0


def _steps(args, suite_counts: list[int]) -> tuple[int, list[int], list[int]]:
    """The allocation's nodes, the node counts run as steps, and the suite's node counts left to another job."""
    known = ", ".join(map(str, suite_counts))
    if args.node_counts:
        unknown = [k for k in args.node_counts if k not in suite_counts]
        if unknown:
            raise UsageError(f"--node-counts {','.join(map(str, args.node_counts))}: no run of {args.suite} has nodes "
                             f"= {', '.join(map(str, unknown))} (its node counts: {known})")
        counts = args.node_counts
    else:
        counts = [k for k in suite_counts if args.nodes is None or k <= args.nodes]
    nodes = args.nodes or max(counts)
    if nodes not in suite_counts or max(counts, default=nodes + 1) > nodes:
        raise UsageError(f"{args.suite}: no run has nodes = {nodes}; set [sweep] nodes to include it, or give "
                         f"--nodes as one of the suite's node counts ({known}) and at least each of --node-counts")
    return nodes, counts, [k for k in suite_counts if k not in counts]


def _setup_text(value: str) -> str:
    """--setup: an existing file's text, or the value itself as shell lines. Refused now what would only fail
    on the node, after the queue: a lone word naming a script (a / in it, or .sh) that is no file, and text
    bash cannot parse on its own."""
    path = Path(value)
    if "\n" not in value and path.is_file():
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise UsageError(f"--setup {value}: cannot read it ({e})") from None
        _check_setup_syntax(value, text)
        return text
    if len(value.split()) == 1 and ("/" in value or value.endswith(".sh")):
        raise UsageError(f"--setup {value}: no such file; to run a script of the cluster give the line itself, "
                         f"e.g. --setup 'source {value}'")
    _check_setup_syntax(repr(value if len(value) <= 60 else value[:57] + "..."), value)
    return value


SETUP_CHECK_TIMEOUT_S = 10
# bash -n's complaint -> what to do about it; the first that matches
_SETUP_FIXES = ((re.compile(r"looking for matching `([\"'`])'"), "close the {0} quote it opens"),
                (re.compile(r"looking for matching `\)'"), "close the $( or ( it opens with a )"),
                (re.compile(r"looking for matching `}'"), "close the ${{ it opens with a }}"),
                (re.compile(r"here-document .*\(wanted `(.*)'\)"), "end the here-document with a line that is "
                                                                 "exactly {0}"),
                (re.compile(r"unexpected end of file"), "close the if (fi), case (esac), loop (done), {{ (}}) or "
                                                        "( ()) it opens"))


def _check_setup_syntax(shown: str, text: str) -> None:
    """Set-up text bash cannot parse on its own is refused here, with bash's words and the fix: in the job it
    would fail only after the queue. Checked alone, as the job runs it (its own eval; slurm._setup_block).
    shown: the --setup value as the message names it (a file's name, or the lines, clipped)."""
    if "\0" in text:
        raise UsageError(f"--setup {shown}: holds a NUL byte, which bash cannot run; remove it")
    bash = shutil.which("bash")
    # BASH_ENV, ENV: no start-up file runs; LC_ALL=C: bash's words in English, as _SETUP_FIXES reads them
    env = {**{k: v for k, v in os.environ.items() if k not in ("BASH_ENV", "ENV")}, "LC_ALL": "C"}
    try:
        if bash is None:
            raise FileNotFoundError("bash is not on PATH")
        res = subprocess.run(["bash", "-n", "-c", text], executable=bash, capture_output=True, env=env,
                             encoding="utf-8", errors="replace", timeout=SETUP_CHECK_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        why = f"bash -n took over {SETUP_CHECK_TIMEOUT_S} s" if isinstance(e, subprocess.TimeoutExpired) else e
        err.print(printable(f"note: --setup {shown}: its shell syntax is not checked ({why}); the job stops at "
                            f"the set-up if bash cannot parse it"), markup=False)
        return
    said = [re.sub(r"^bash: (-c: )?", "", line) for line in res.stderr.splitlines() if line.strip()]
    if res.returncode == 0 and not said:  # a warning (an unterminated here-document) exits 0
        return
    complaint = "; ".join(said) or f"bash -n exit status {res.returncode}"
    fix = next((fix.format(*m.groups()) for pattern, fix in _SETUP_FIXES if (m := pattern.search(complaint))),
               "correct that line")
    raise UsageError(f"--setup {shown}: bash cannot parse it on its own ({complaint}); {fix} (each --setup value "
                     f"runs on its own, as complete shell code)")


def _submit_relative(path: str) -> str:
    """A path inside this folder, where the job is submitted from, written relative to it: the script holds
    no absolute path of this machine. A path outside it is kept as given (a cluster's /scratch)."""
    if not os.path.isabs(path):
        return path
    for candidate in (Path(os.path.abspath(path)), Path(path).resolve()):
        try:
            return str(candidate.relative_to(Path.cwd()))
        except ValueError:
            continue
    return path


def _check_job_output_folder(pattern: str, hint: str) -> None:
    """Slurm opens the job's output before the script runs, in a folder it does not create, and expands
    %-patterns only then: a folder named by one cannot be created beforehand, so it is refused."""
    parts = Path(pattern).parts
    first = next((i for i, part in enumerate(parts[:-1]) if "%" in part), None)
    if first is not None:
        suggestion = Path(*parts[:first], "-".join(parts[first:]))
        raise UsageError(f"--job-output {pattern}: a folder named by a %-pattern cannot be created before Slurm "
                         f"expands it at job start, and Slurm creates none (the job would end with no output at "
                         f"all); keep the patterns in the file name, e.g. --job-output {suggestion}{hint}")
