"""`benchsuite slurm SUITE.toml`: an sbatch script that runs the suite on a Slurm allocation."""

from __future__ import annotations

import sys
from pathlib import Path

from benchsuite.commands.common import COUNT, OUTPUT, UsageError, err, output_file, path_arg
from benchsuite.config import load_suite
from benchsuite.terminal import printable


def add_parser(sub) -> None:
    sl = sub.add_parser("slurm", help="write an sbatch script that runs the suite on a Slurm allocation")
    sl.add_argument("suite", type=path_arg, help="suite TOML file the job runs, e.g. workloads/smoke.toml")
    sl.add_argument("--cpus-per-task", type=COUNT, default=None,
                    help="CPUs of the node's one task, which runs all G ranks (default: 8 × --gpus-per-node; "
                         "Slurm's own default of 1 CPU per task would be shared by every rank)")
    sl.add_argument("--exclusive", action="store_true",
                    help="the nodes to this job alone: CPU and DRAM energy (RAPL) is measured per host, so "
                         "another job on the node would be counted in the run's joules")
    sl.add_argument("--job-output", type=path_arg, metavar="PATTERN",
                    help="the job's stdout/stderr (#SBATCH --output; %%j is the job id); default "
                         "OUT/logs/slurm-%%j.out, its folder created now (Slurm does not create it)")
    sl.add_argument("--nodes", type=COUNT, required=True, help="nodes of the allocation (#SBATCH --nodes)")
    sl.add_argument("--gpus-per-node", type=COUNT, required=True,
                    help="GPUs of each node (#SBATCH --gpus-per-node); at least the suite's ranks per node")
    sl.add_argument("--partition", help="Slurm partition (#SBATCH --partition); default: the cluster's")
    sl.add_argument("--time", help="wall-clock limit, e.g. 02:00:00")
    sl.add_argument("--account", help="account charged for the job (#SBATCH --account)")
    sl.add_argument("--out", type=path_arg, default="results", help="results folder, shared by all nodes")
    sl.add_argument("--repeat", type=COUNT, default=1, metavar="N",
                    help="passed to `benchsuite run --repeat N`: measure each run N times (default 1)")
    sl.add_argument("-o", "--output", type=path_arg, default="-", help=OUTPUT + "the sbatch script file (default: stdout)")
    sl.set_defaults(fn=run)


def run(args) -> int:
    from benchsuite.slurm import sbatch_script

    suite = load_suite(args.suite)
    runs = [r for r in suite.runs if r.nodes == args.nodes]
    if not runs:
        raise UsageError(f"{args.suite}: no run has nodes = {args.nodes}; set [sweep] nodes to include it")
    ranks_per_node = max(r.nproc_per_node for r in runs)  # one rank per GPU
    if args.gpus_per_node < ranks_per_node:
        raise UsageError(f"--gpus-per-node {args.gpus_per_node}: the suite's runs on {args.nodes} node(s) start up to "
                         f"{ranks_per_node} ranks per node, one per GPU; give --gpus-per-node {ranks_per_node} or more")
    try:
        out_dir = Path(args.out).resolve()
        job_output = args.job_output or str(out_dir / "logs" / "slurm-%j.out")
        script = sbatch_script(Path(args.suite).resolve(), suite.name, out_dir, args.nodes, args.gpus_per_node,
                               args.partition, args.time, args.account, cpus_per_task=args.cpus_per_task,
                               exclusive=args.exclusive, job_output=job_output, repeat=args.repeat)
    except ValueError as e:
        hint = "" if args.job_output else "; give --job-output PATTERN (the default is OUT/logs/slurm-%j.out)"
        raise UsageError(f"{e}{hint}") from None
    log_dir = Path(job_output).parent
    if "%" not in str(log_dir):  # Slurm does not create it: without it the job dies with no output at all
        try:
            log_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UsageError(f"--job-output {job_output}: cannot create {log_dir}: {e.strerror or e}") from None
    if args.output == "-":
        sys.stdout.write(script)
    else:
        from benchsuite.atomic import atomic_file

        output_file("-o", args.output, "sbatch script")
        with atomic_file(args.output, "w", encoding="utf-8") as f:
            f.write(script)
        err.print(printable(f"wrote {args.output}; submit with: sbatch {args.output}"), markup=False)
    return 0
