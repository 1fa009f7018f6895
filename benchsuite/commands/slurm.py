"""`benchsuite slurm SUITE.toml`: an sbatch script that runs the suite on a Slurm allocation."""

from __future__ import annotations

import math
import sys
from pathlib import Path

from benchsuite.commands.common import (COUNT, OUTPUT, REPEAT, UsageError, check_repeat, err, make_folder, output_file,
                                        path_arg)
from benchsuite.config import RANKS_PER_CORE, load_suite
from benchsuite.terminal import printable

DEFAULT_JOB_OUTPUT = "OUT/logs/slurm-%j.out"


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
    sl.add_argument("--nodes", type=COUNT, required=True, help="nodes of the allocation (#SBATCH --nodes)")
    sl.add_argument("--gpus-per-node", type=COUNT, required=True,
                    help="GPUs of each node (#SBATCH --gpus-per-node); at least the suite's ranks per node")
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
    runs = [r for r in suite.runs if r.nodes == args.nodes]
    if not runs:
        raise UsageError(f"{args.suite}: no run has nodes = {args.nodes}; set [sweep] nodes to include it")
    ranks_per_node = max(r.nproc_per_node for r in runs)  # one rank per GPU
    if args.gpus_per_node < ranks_per_node:
        raise UsageError(f"--gpus-per-node {args.gpus_per_node}: the suite's runs on {args.nodes} node(s) start up to "
                         f"{ranks_per_node} ranks per node, one per GPU; give --gpus-per-node {ranks_per_node} or more")
    if args.cpus_per_task is not None and args.cpus_per_task * RANKS_PER_CORE < ranks_per_node:
        raise UsageError(f"--cpus-per-task {args.cpus_per_task}: the suite's runs on {args.nodes} node(s) start up to "
                         f"{ranks_per_node} ranks per node, and `benchsuite run` starts at most {RANKS_PER_CORE} per "
                         f"CPU; give --cpus-per-task {math.ceil(ranks_per_node / RANKS_PER_CORE)} or more")
    hint = "" if args.job_output else f"; give --job-output PATTERN (the default is {DEFAULT_JOB_OUTPUT})"
    out_dir = Path(args.out).resolve()
    job_output = args.job_output or str(out_dir / "logs" / "slurm-%j.out")
    try:
        script = sbatch_script(Path(args.suite).resolve(), suite.name, out_dir, args.nodes, args.gpus_per_node,
                               args.partition, args.time, args.account, cpus_per_task=args.cpus_per_task,
                               exclusive=args.exclusive, job_output=job_output, repeat=args.repeat)
    except ValueError as e:
        raise UsageError(f"{e}{hint}") from None
    _check_job_output_folder(job_output, hint)
    if args.output != "-":
        output_file("-o", args.output, "sbatch script", source=args.suite)
    make_folder("--out", args.out, "results folder")
    output_file("--job-output", job_output, "job output")  # its folder: without it the job dies with no output
    if args.output == "-":
        sys.stdout.write(script)
        return 0
    with atomic_file(args.output, "w", encoding="utf-8") as f:
        f.write(script)
    err.print(printable(f"wrote {args.output}; submit with: sbatch {args.output}"), markup=False)
    return 0


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
