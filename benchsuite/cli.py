"""The `benchsuite` command: parse, call, print. Nothing here measures anything.

Exit codes: 0 success, 1 a run failed, 2 bad input (nothing launched), 130 Ctrl-C.
Under --json, stdout holds exactly one JSON document; progress and warnings go to stderr.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import warnings
from pathlib import Path

from rich.console import Console

from benchsuite.config import RANKS_PER_CORE, ConfigError, check_ranks_per_node, load_suite, usable_cores
from benchsuite.terminal import printable

# Every user string reaches these through benchsuite.terminal.printable; emoji=False: a name like
# ":warning:" is shown as typed (markup=False alone still replaces emoji codes).
err = Console(stderr=True, highlight=False, emoji=False, soft_wrap=True)  # messages are never cut into lines
# Piped into a file or a CI log there is no terminal width: tables get room instead of 80 columns.
out = Console(highlight=False, emoji=False, soft_wrap=True, width=None if sys.stdout.isatty() else 200)


class UsageError(Exception):
    """Bad command-line input: printed as one line, exit code 2."""


def number(kind: type = float, *, above: float | None = None, at_least: float | None = None):
    """An argparse `type=` for a numeric option: a finite `kind` (int or float), > `above` or >=
    `at_least`. Anything else is refused by argparse with the option's name, exit code 2."""
    what = "an integer" if kind is int else "a finite number"
    bound = f" > {above:g}" if above is not None else f" >= {at_least:g}" if at_least is not None else ""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not math.isfinite(value) or (above is not None and not value > above) or (
                at_least is not None and not value >= at_least):
            raise argparse.ArgumentTypeError(f"expected {what}{bound}, got {text!r}")
        return value

    return parse


COUNT = number(int, at_least=1)  # nodes, GPUs per node, devices, data-parallel degree
INDEX = number(int, at_least=0)  # --node-rank
POSITIVE = number(above=0)  # amounts that scale a result: chips, hours, watts, tokens, TFLOP/s
PARAMS = number(at_least=1)  # a parameter count, e.g. 7.5e9
NON_NEGATIVE = number(at_least=0)  # grid intensity (0 g/kWh: a carbon-free supply)
PUE = number(at_least=1)  # facility energy / IT energy, >= 1 by definition


def _file_in_the_way(path: Path) -> Path | None:
    """The file (not a folder) at `path` or at the nearest existing folder above it, if any."""
    nearest = next((p for p in (path, *path.parents) if p.exists() or p.is_symlink()), None)
    return None if nearest is None or nearest.is_dir() else nearest


def make_folder(option: str, path: str | Path, what: str) -> Path:
    """The folder an option names, created if missing: a file at or above it is bad input."""
    path = Path(path)
    blocker = _file_in_the_way(path)
    if blocker is not None:
        where = "exists and is not a folder" if blocker == path else f"{blocker} is a file, not a folder"
        raise UsageError(f"{option} {path}: {where}; give a {what} (created if missing)")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"{option} {path}: cannot create the {what}: {e.strerror or e}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise UsageError(f"{option} {path}: the {what} is not writable")
    return path


def output_file(option: str, path: str | Path, what: str) -> Path:
    """The file an option names, to be (over)written: not a folder, and its folder can be made."""
    path = Path(path)
    if path.is_dir():
        raise UsageError(f"{option} {path}: is a folder; give the {what}'s file name")
    blocker = _file_in_the_way(path.parent)
    if blocker is not None:
        raise UsageError(f"{option} {path}: {blocker} is a file, not a folder; give a {what} path in a folder")
    make_folder(option, path.parent, f"folder of the {what}")
    return path


def _print_json(doc) -> None:
    sys.stdout.write(json.dumps(doc, indent=2, allow_nan=False, default=str) + "\n")


def cmd_run(args) -> int:
    if args.node_rank >= args.nnodes:
        raise UsageError(f"--node-rank {args.node_rank} must be < --nnodes {args.nnodes} (ranks count from 0)")
    suite = load_suite(args.suite)  # before the heavy imports: a bad file is refused at once
    _check_ranks_per_node(suite, args)

    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from benchsuite.launch import Rendezvous, RunStatus, run_suite

    if args.nnodes > 1 and not args.rdzv_endpoint:
        raise UsageError("--nnodes > 1 needs --rdzv-endpoint HOST:PORT (the first node's address)")
    rdzv = Rendezvous(nnodes=args.nnodes, node_rank=args.node_rank, endpoint=args.rdzv_endpoint,
                      rdzv_id=args.rdzv_id)
    runs_here = [r for r in suite.runs if r.nodes == rdzv.nnodes]
    if not runs_here:
        raise UsageError(f"{args.suite}: no run of this suite has nodes = {rdzv.nnodes}")
    make_folder("--out", args.out, "results folder")
    progress = Progress(TextColumn("{task.description}", markup=False), BarColumn(),
                        TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(), console=err, transient=True,
                        disable=args.json)
    task = progress.add_task(printable(suite.name), total=len(suite.runs))

    def on_event(kind, i, total, payload):
        label = printable(f"{suite.runs[i].workload} · world {suite.runs[i].world_size} · {suite.runs[i].scaling}")
        if kind == "start":
            progress.update(task, description=label)
            return
        if kind == "progress":  # the bar's text on a terminal; a plain stderr line otherwise (--json too)
            if err.is_terminal and not args.json:
                progress.update(task, description=f"{label} · {printable(payload.text)}")
            else:
                err.print(f"{label}: {printable(payload.text)}", markup=False)
            return
        progress.advance(task)
        if not args.json:
            progress.console.print(_outcome_line(payload))

    try:
        with progress:
            outcomes = run_suite(suite, args.out, resume=args.resume, peak_tflops=args.peak_tflops, rdzv=rdzv,
                                 on_event=on_event)
    except OSError as e:  # disk full, folder removed mid-suite, ...: say so, no traceback
        err.print(f"benchsuite: cannot write to the results folder {printable(args.out)}: {printable(e)}\n"
                  "records completed before this are kept; free space and rerun the same command to resume",
                  markup=False, soft_wrap=True)
        return 1
    interrupted = any(o.interrupted for o in outcomes)
    if interrupted:  # the suite is over: more Ctrl-C presses must not cut short its last words or exit code
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)
    if args.json:
        _print_json({"suite": suite.name, "out": str(args.out), "interrupted": interrupted,
                     "runs": [{"workload": o.run.workload, "world_size": o.run.world_size, "scaling": o.run.scaling,
                               "run_key": o.run_key, "status": o.status.value, "record": o.record_path,
                               "error": o.error, "holder": str(o.holder) if o.holder else None,
                               "kept_earlier_record": o.kept_earlier,
                               "flags": (_ok_record(o) or {}).get("flags") or []}
                              for o in outcomes]})
    else:
        err.print(_summary_line(outcomes, len(suite.runs))
                  + f" → {printable(args.out)}   next: benchsuite report {printable(args.out)}",
                  markup=False)
    if interrupted:
        err.print("interrupted: completed records are kept; rerun the same command to resume")
        return 130
    return 1 if any(o.status in (RunStatus.FAILED, RunStatus.INTERRUPTED) for o in outcomes) else 0


SUMMARY_WORDS = {  # RunStatus value → how the summary line counts it
    "ok": "ok", "failed": "failed", "interrupted": "interrupted", "skipped_recorded": "skipped (already recorded)",
    "skipped_other_nodes": "left to a job with another --nnodes",
    "skipped_locked": "being measured by another launcher",
}


def _summary_line(outcomes, total: int) -> str:
    """'2 ok, 0 failed, 1 skipped (already recorded)': ok and failed always, the other statuses when present."""
    counts = {word: sum(o.status.value == status for o in outcomes) for status, word in SUMMARY_WORDS.items()}
    parts = [f"{n} {word}" for word, n in counts.items() if n or word in ("ok", "failed")]
    if len(outcomes) < total:
        parts.append(f"{total - len(outcomes)} not started")
    return ", ".join(parts)


def _check_ranks_per_node(suite, args) -> None:
    """Every run this launcher starts fits the ranks one node can start (CPU bound, or --max-ranks-per-node);
    on GPU, ranks beyond one per GPU run gloo on shared GPUs: allowed as a correctness run, and said."""
    if args.max_ranks_per_node is not None and args.max_ranks_per_node < 1:
        raise UsageError(f"--max-ranks-per-node must be >= 1, got {args.max_ranks_per_node}")
    runs = [r for r in suite.runs if r.nodes == args.nnodes]
    cores = usable_cores()
    limit, source = ((args.max_ranks_per_node, "--max-ranks-per-node") if args.max_ranks_per_node is not None
                     else (RANKS_PER_CORE * cores, f"{RANKS_PER_CORE} × {cores} usable cores"))
    check_ranks_per_node(suite, runs, limit, source)
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    shared = sorted({r.nproc_per_node for r in runs if gpus and r.nproc_per_node > gpus})
    if shared:
        err.print(f"note: runs with {', '.join(map(str, shared))} ranks per node share this node's {gpus} GPU(s): "
                  "they use gloo (NCCL needs one GPU per rank), correctness runs whose records are not speed "
                  "figures", markup=False)


def _ok_record(o) -> dict | None:
    """The record an ok outcome wrote (None for the other statuses)."""
    return json.loads(Path(o.record_path).read_text()) if o.status == "ok" else None


def _outcome_line(o) -> str:
    """One line per run for every RunStatus (a status without a line here is a KeyError, caught by the tests)."""
    from rich.markup import escape as _escape

    from benchsuite.results.report import printable

    def escape(text) -> str:
        return _escape(printable(text))

    name = escape(f"{o.run.workload} · world {o.run.world_size} · {o.run.scaling}")
    kept = f"; the earlier ok record is kept as the run's result ({escape(o.record_path)})" if o.kept_earlier else ""
    lines = {
        "failed": lambda: f"[red]✗[/red] {name}: {escape(o.error['type'])}: {escape(o.error['message'][:300])}{kept}",
        "interrupted": lambda: f"[yellow]■[/yellow] {name}: interrupted ({escape(o.error['message'])})"
                               + (kept or ("; recorded failed" if o.record_path else "")),
        "skipped_recorded": lambda: f"[dim]↷ {name}: already recorded ({o.run_key})[/dim]",
        "skipped_other_nodes": lambda: f"[dim]↷ {name}: nodes = {o.run.nodes}, left to a job started with "
                                       f"--nnodes {o.run.nodes}[/dim]",
        "skipped_locked": lambda: f"[dim]↷ {name}: being measured by {escape(o.holder)}; its record appears in "
                                  "the results folder when it finishes[/dim]",
        "ok": lambda: _ok_line(o, name, escape),
    }
    return lines[o.status.value]()


def _ok_line(o, name: str, escape) -> str:
    rec = _ok_record(o)
    m = rec["metrics"]
    mfu = f"{m['mfu']:.1%}" if m.get("mfu") is not None else "n/a"
    tps = f"{m['tokens_per_s']:,.0f}" if m.get("tokens_per_s") is not None else "n/a"
    line = f"[green]✓[/green] {name}: {tps} tok/s, MFU {mfu}, {o.duration_s:.1f} s"
    if rec.get("flags"):  # impossible figures (results/sanity.py) are never shown as a plain ok
        from benchsuite.results.sanity import flag_summary

        line += f"\n  [yellow]⚠ flagged:[/yellow] {escape(flag_summary(rec['flags']))}"
    return line


def _load_records(path) -> list[dict]:
    from benchsuite.results.store import load_records

    if not Path(path).exists():
        raise UsageError(f"{path}: no such results folder (run `benchsuite run SUITE.toml --out {path}` first)")
    return load_records(path)


def _load_df(path):
    from benchsuite.results.store import dataframe_of

    return dataframe_of(_load_records(path))


def cmd_list(args) -> int:
    df = _load_df(args.dir)
    cols = ["run_key", "suite", "workload", "world_size", "nodes", "scaling", "status", "flagged", "started_at",
            "path"]
    rows = [] if df.empty else df[cols].to_dict("records")
    if args.json:
        _print_json(rows)
        return 0
    from benchsuite.results.report import printable

    for r in rows:  # printable: a record's strings never drive the terminal (escape sequences)
        status = f"{r['status']}{' ⚠' if r['flagged'] else ''}"
        out.print(printable(f"{r['run_key']}  {status:8}  {r['suite']}/{r['workload']}  w{r['world_size']} "
                            f"n{r['nodes']} {r['scaling']}  {r['started_at']}"), markup=False)
    if not rows:
        err.print(f"no records in {printable(args.dir)}", markup=False)
    return 0


def cmd_report(args) -> int:
    from benchsuite.results.report import (ENERGY_COLUMNS, ENERGY_WHEN, ColumnError, Fit, report_rows, report_table,
                                           section_rows, section_tables, verdict_tables)
    from benchsuite.results.store import dataframe_of
    from benchsuite.results.verdicts import verdicts, verdicts_doc

    fit = Fit(width=out.width, columns=None if args.columns is None else
              tuple(c.strip().lower() for c in args.columns.split(",") if c.strip()))
    try:
        fit.check()
    except ColumnError as e:
        raise UsageError(str(e)) from None
    records = _load_records(args.dir)  # read once: one warning per file that does not load
    df = dataframe_of(records)
    seeds = verdicts(records)  # over seeds: intervals, dense/sparse ratios, the papers' claims
    if args.json:
        _print_json({"runs": report_rows(df), "verdicts": verdicts_doc(seeds),
                     "energy": section_rows(df, ENERGY_COLUMNS, ENERGY_WHEN)})
        return 0
    if df.empty:
        err.print(f"no records in {printable(args.dir)}", markup=False)
        return 0
    out.print(report_table(df, fit))
    for table in section_tables(df, fit) + verdict_tables(seeds):
        out.print(table)
    return 0


def cmd_compare(args) -> int:
    """B against A, run by run; exit 1 on a significant regression only with --fail-on-regression."""
    from benchsuite.results.compare import CompareError, compare_folders, comparison_doc, comparison_table
    from benchsuite.results.report import printable

    if not 0 <= args.threshold < 1:
        raise UsageError(f"--threshold must be in [0, 1) (a fraction: 0.05 is 5 %), got {args.threshold:g}")
    try:
        c = compare_folders(args.a, args.b, threshold=args.threshold)
    except CompareError as e:
        raise UsageError(str(e)) from None
    if args.json:
        _print_json(comparison_doc(c))
    else:
        if c.runs:
            out.print(comparison_table(c))
        for side, folder, runs in (("A", c.a, c.only_a), ("B", c.b, c.only_b)):
            for run in runs:
                out.print(printable(f"only in {side} ({folder}): {run.run} on {run.hardware} "
                                    f"(config {run.identity})"), markup=False)
        if not c.runs:
            err.print(f"no run of {c.a} matches a run of {c.b} (same resolved config)", markup=False)
        for run in c.regressions:
            err.print(printable(f"regression: {run.run}"), markup=False)
    return 1 if args.fail_on_regression and c.regressions else 0


def cmd_dashboard(args) -> int:
    from dashboard import build_site
    from dashboard.build import SiteError

    if not Path(args.dir).exists():
        raise UsageError(f"{args.dir}: no such results folder (run `benchsuite run SUITE.toml --out {args.dir}` first)")
    make_folder("-o", args.out, "site folder")
    try:
        res = build_site(args.dir, args.out)
    except SiteError as e:
        raise UsageError(f"-o {e}") from None
    except OSError as e:  # a page's path taken by a folder, the disk full, ...
        raise UsageError(f"-o {args.out}: cannot write the site: {e}") from None
    if args.json:
        _print_json({"index": str(res.index), "records": res.records, "pages": res.pages})
        return 0
    if not res.records:
        err.print(f"no records in {printable(args.dir)}: the site says so", markup=False)
    err.print(f"{res.records} runs, {len(res.pages)} pages, {res.bytes / 2**20:.1f} MiB → {printable(args.out)}",
              markup=False)
    out.print(printable(res.index), markup=False)
    return 0


def cmd_flops(args) -> int:
    from benchsuite.metrics.flops import flops_per_token, hardware_basis

    suite = load_suite(args.suite)
    rows = []
    for run in suite.runs:
        f = flops_per_token(run.model, run.moe, micro_batch=run.micro_batch_per_rank, recompute=run.train.recompute)
        rows.append({"workload": run.workload, "kind": run.kind, "router": run.moe.router if run.moe else None,
                     "world_size": run.world_size, "scaling": run.scaling, "recompute": run.train.recompute,
                     "params": f.params, "params_active": f.params_active, "model_flops_per_token": f.model,
                     "hardware_flops_per_token": f.hardware, "hardware_source": hardware_basis(run, None)})
    if args.json:
        _print_json({"suite": suite.name, "runs": rows})
    else:
        out.print("model FLOPs (MFU): no recompute, active experts; hardware FLOPs (HFU): what runs, recompute "
                  "and every expert slot included (grouped_mm runs count only the filled slots)", markup=False)
        for r in rows:
            out.print(f"{printable(r['workload']):<24} w{r['world_size']:<3} params {r['params']:10.4g}  "
                      f"active {r['params_active']:10.4g}  model {r['model_flops_per_token']:10.4g} FLOP/tok  "
                      f"hardware {r['hardware_flops_per_token']:10.4g} FLOP/tok", markup=False)
    return 0


def cmd_memory(args) -> int:
    """Per-device model-state bytes of DDP and ZeRO 1/2/3 (ZeRO paper formulas), and activations.
    With a suite, each run's own precision sets the constants, as in its record; --precision overrides."""
    from benchsuite.metrics import memory as mem

    if args.suite is None and args.params is None:
        raise UsageError("give a suite (its models' parameter counts) or --params N")
    if args.suite is None and args.dp is None:
        raise UsageError("--dp N (the data-parallel degree) is needed with --params")
    doc = {"precision": args.precision,
           "source": "Rajbhandari et al. 2019 (ZeRO), per-device model states; GB = 1e9 bytes"}
    if args.suite is None:
        consts = mem.FP32 if args.precision == "fp32" else mem.PAPER  # the paper's mixed precision by default
        doc.update(_constants_doc(mem, consts), precision=args.precision or "mixed", params=args.params, dp=args.dp,
                   stages=mem.stage_table(args.params, args.dp, consts))
        rows = [("--params", consts, args.params, args.dp, doc["stages"], None, None)]
    else:
        import torch

        from benchsuite.dist import ParallelDims, resolve_precision
        from benchsuite.metrics.flops import param_counts

        suite = load_suite(args.suite)
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # what "auto" resolves to here
        doc.update(suite=suite.name, device=device.type, runs=[])
        rows = []
        for run in suite.runs:
            precision = {"mixed": "bf16", "fp32": "fp32"}.get(args.precision) or \
                resolve_precision(run.train.precision, device)
            consts = mem.constants_for(precision)
            psi = args.params or param_counts(run.model, run.moe).total
            dp = args.dp or run.data_parallel
            psi_rank = args.params or mem.params_per_rank(run.model, run.moe, run.parallel.tensor)
            stages = mem.stage_table(psi_rank, dp, consts)
            act = mem.activation_estimates(run)
            fsdp_precision = "bf16" if precision == "bf16" and device.type == "cuda" else "fp32"  # parallel/zero.py
            record = mem.analytic_model_state(run.model, run.moe, ParallelDims.from_run(run), compute=precision,
                                              forward_params=fsdp_precision)
            doc["runs"].append({"workload": run.workload, "world_size": run.world_size, "tensor": run.parallel.tensor,
                                "zero": run.parallel.zero, "precision": precision, **_constants_doc(mem, consts),
                                "params": psi, "params_per_rank": psi_rank, "dp": dp, "stages": stages,
                                "record_model_state": record,
                                "activation_bytes_per_micro_batch": act})
            rows.append((f"{run.workload} w{run.world_size}", consts, psi_rank, dp, stages, act, record))
    if args.json:
        _print_json(doc)
        return 0
    out.print("model states per device (GB = 1e9 bytes)" + ("" if args.suite is None or args.precision else
              f"; each run's train.precision, \"auto\" as on this machine ({doc['device']})"), markup=False)
    for name, consts, psi, dp, stages, act, record in rows:
        cells = "  ".join(f"{r['name']} {r['total'] / 1e9:10.4g} GB" for r in stages)
        out.print(f"{printable(name):<24} {consts.name}, K = {consts.k:g}", markup=False)
        out.print(f"{'':<24} Ψ {psi:,.0f}  N {dp:<4} {cells}", markup=False)
        if record and record["analytic"]:
            out.print(f"{'':<24} the record's analytic figure: {record['formula']} = "
                      f"{record['analytic']['total'] / 1e9:.4g} GB", markup=False)
        if act:
            out.print(f"{'':<24} activations per micro-batch (Korthikanti et al. 2022): "
                      f"{act['none'] / 1e9:.4g} GB none, {act['selective'] / 1e9:.4g} GB selective, "
                      f"{act['full'] / 1e9:.4g} GB full recompute", markup=False)
    return 0


def _constants_doc(mem, consts) -> dict:
    return {"constants": consts.name, "K": consts.k,
            "formulas": {mem.STAGE_LABELS[s]: mem.zero_formula(s, consts) for s in range(4)}}


def cmd_slurm(args) -> int:
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
                               exclusive=args.exclusive, job_output=job_output)
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


def _check_place(args) -> None:
    """--country/--region must be in codecarbon's data: a typo must not become the world average."""
    from benchsuite.energy.carbon import place_problems

    problems = place_problems(args.country, args.region)
    if problems:
        raise UsageError("; ".join(f"--{field} {reason}" for field, reason in problems))


def cmd_carbon_estimate(args) -> int:
    from benchsuite.energy import carbon

    _check_place(args)
    try:
        res = carbon.estimate(args.chips, args.hours, args.watts, args.pue, args.intensity, args.country, args.region)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if args.json:
        _print_json(res)
        return 0
    out.print(f"{res['chips']:g} chips × {res['hours']:g} h × {res['watts']:g} W = {res['energy_kwh']:,.1f} kWh; "
              f"× PUE {res['pue']:g} × {res['intensity_g_per_kwh']:.0f} g/kWh ({res['intensity_source']}) "
              f"= {res['co2e_kg']:,.1f} kg CO2e", markup=False)
    if res.get("intensity_note"):
        err.print(f"note: {printable(res['intensity_note'])}", markup=False)
    return 0


def cmd_carbon_project(args) -> int:
    from benchsuite.energy import carbon
    from benchsuite.results.store import load_records

    _check_place(args)
    if not Path(args.records).exists():
        raise UsageError(f"{args.records}: no such record or results folder")
    records = [r for r in load_records(args.records) if r["status"] == "ok"]
    if not records:
        raise UsageError(f"{args.records}: no ok record to project from")
    intensity = None
    if args.intensity is not None or args.country:
        try:
            intensity = carbon.lookup(args.intensity, args.country, args.region)
        except ValueError as e:
            raise UsageError(str(e)) from None
    rows = []
    for rec in records:
        try:
            proj = carbon.project_from_record(rec, args.tokens, args.devices, args.pue, intensity)
        except ValueError as e:
            proj = {"error": str(e)}
        rows.append({"run_key": rec["run_key"], "suite": rec["suite"], "workload": rec["workload"],
                     "world_size": rec["config"]["world_size"],
                     "short_window": bool((rec.get("energy") or {}).get("short_window")), **proj})
    if args.json:
        _print_json(rows)
        return 0
    for r in rows:
        head = printable(f"{r['suite']}/{r['workload']} (world {r['world_size']})")
        if "error" in r:
            out.print(f"{head}: cannot project: {printable(r['error'])}", markup=False)
        else:
            out.print(f"{head}: {r['hours']:,.1f} h on {r['devices']} devices, {r['energy_kwh']:.3g} kWh, "
                      f"{r['co2e_t']:.3g} t CO2e (PUE {r['pue']:g}, {r['intensity_g_per_kwh']:.0f} g/kWh, "
                      f"{r['intensity_source']})", markup=False)
            for line in _projection_assumptions(r, pue_given=args.pue is not None):
                out.print(printable(f"  {line}"), markup=False)
    return 0


def _projection_assumptions(r: dict, pue_given: bool) -> list[str]:
    """What a projection takes for granted and where each input came from, so a reader can weigh it."""
    parts = ", ".join(r["energy_includes"]) or "no part"
    how = "a measured counter" if r["energy_source"] == "measured" else "an estimate, not a measured counter"
    return [
        f"energy: {r['j_per_token']:.3g} J/token from the record's {r['energy_source']} energy of {parts} ({how})",
        ("short window: the record's energy window was shorter than the meters resolve (energy.short_window), "
         "so its J/token is uncertain") if r["short_window"] else
        "window: long enough for the meters (no short-window flag)",
        f"throughput: {r['tokens_per_s_per_device']:,.0f} tok/s per device as measured at world "
        f"{r['world_size']}, held constant at {r['devices']} devices (no scaling loss assumed); "
        f"J/token held constant too",
        f"PUE {r['pue']:g} from {'--pue' if pue_given else 'the record'}; intensity "
        f"{r['intensity_g_per_kwh']:.0f} g/kWh from {r['intensity_source']}",
    ]


def cmd_export(args) -> int:
    from benchsuite.energy.carbon import ExportError, write_codecarbon_csv
    from benchsuite.results.store import load_records

    if not Path(args.dir).exists():
        raise UsageError(f"{args.dir}: no such results folder")
    try:
        res = write_codecarbon_csv(load_records(args.dir), Path(args.output or Path(args.dir) / "emissions.csv"))
    except ExportError as e:
        raise UsageError(str(e)) from None
    if res.appended:
        skipped = f" ({res.rows_already_there} already there)" if res.rows_already_there else ""
        err.print(f"appended {res.rows_written} rows to {res.path}{skipped}", markup=False)
    else:
        err.print(f"wrote {res.path}: {res.rows_written} rows", markup=False)
    return 0


def cmd_tokenize(args) -> int:
    """Text files → a .bin of byte-level tokens that train.data can name."""
    from benchsuite.data import tokenize_files

    output_file("-o", args.output, "token file")
    try:
        doc = tokenize_files(args.files, args.output)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if args.json:
        _print_json(doc)
    else:
        out.print(f"wrote {printable(doc['path'])}: {doc['tokens']:,} tokens from {doc['files']} file(s), "
                  f"byte-level ids (model.vocab >= {doc['vocab_needed']}), sha256 {doc['sha256'][:12]}…; "
                  f'use it with train.data = "{printable(doc["path"])}"', markup=False)
    return 0


def package_version() -> str:
    """The installed package's version; the source tree's pyproject.toml when it is not installed."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("benchsuite")
    except PackageNotFoundError:
        import tomllib
        pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
        return tomllib.loads(pyproject.read_text())["project"]["version"]


OUTPUT = "output path of this verb: "  # -o means this on every verb that has it


class Parser(argparse.ArgumentParser):
    """argparse, with its messages (which quote what was typed) shown through `printable`."""

    def error(self, message: str):
        super().error(printable(message))


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="benchsuite", description="What training a transformer really costs: "
               "throughput, FLOPs/MFU, scaling, memory, energy and CO2e.")
    p.add_argument("--version", action="version", version=f"benchsuite {package_version()}",
                   help="print the version and exit")
    sub = p.add_subparsers(dest="verb", required=True)

    r = sub.add_parser("run", help="run a suite (one torchrun per run) and write one record per run")
    r.add_argument("suite", help="suite TOML file, e.g. workloads/smoke.toml")
    r.add_argument("--out", default="results", help="results folder (default: results)")
    r.add_argument("--resume", action=argparse.BooleanOptionalAction, default=True,
                   help="skip runs already recorded ok (default: on)")
    r.add_argument("--peak-tflops", type=POSITIVE, default=None,
                   help="peak FLOP/s of one device (TFLOP/s) for MFU where the device is not in the table")
    r.add_argument("--nnodes", type=COUNT, default=1, help="nodes in this job (multi-node: one launcher per node)")
    r.add_argument("--node-rank", type=INDEX, default=0, help="this node's rank; node 0 writes the records")
    r.add_argument("--rdzv-endpoint", default=None, help="HOST:PORT of the c10d rendezvous (multi-node)")
    r.add_argument("--rdzv-id", default="benchsuite", help="job id shared by every node's launcher")
    r.add_argument("--max-ranks-per-node", type=int, default=None, metavar="N",
                   help=f"most ranks one node may start (default: {RANKS_PER_CORE} × the usable CPU cores)")
    r.add_argument("--json", action="store_true", help="print a JSON summary on stdout")
    r.set_defaults(fn=cmd_run)

    ls = sub.add_parser("list", help="list the records in a results folder")
    ls.add_argument("dir", nargs="?", default="results", help="results folder (default: results)")
    ls.add_argument("--json", action="store_true", help="print the records' summaries as JSON on stdout")
    ls.set_defaults(fn=cmd_list)

    rp = sub.add_parser("report", help="table of results: throughput, MFU, step time, scaling")
    rp.add_argument("dir", nargs="?", default="results", help="results folder (default: results)")
    rp.add_argument("--columns", metavar="A,B,...",
                    help="the columns to show, by name (e.g. workload,world,tok_s,mfu,hfu); default: the most "
                         "important that fit the console width, the others named under each table")
    rp.add_argument("--json", action="store_true",
                    help='print {"runs", "verdicts", "energy"} on stdout, typed values')
    rp.set_defaults(fn=cmd_report)

    db = sub.add_parser("dashboard", help="build the static, offline Plotly site from a results folder")
    db.add_argument("dir", nargs="?", default="results", help="results folder (default: results)")
    db.add_argument("-o", "--out", default="site",
                    help=OUTPUT + "the site folder (default: site); opens as OUT/index.html")
    db.add_argument("--json", action="store_true", help='print {"index", "records", "pages"} on stdout')
    db.set_defaults(fn=cmd_dashboard)

    cm = sub.add_parser("compare", help="B against A (two commits, two clusters): ratios of tok/s, MFU, J/token "
                        "and gCO2e/Mtok with bootstrap 95 % CIs, run by run")
    cm.add_argument("a", help="results folder A (the baseline)")
    cm.add_argument("b", help="results folder B (compared against A)")
    cm.add_argument("--threshold", type=float, default=0.05,
                    help="smallest change that counts, as a fraction (default 0.05: 5 %%)")
    cm.add_argument("--fail-on-regression", action="store_true",
                    help="exit 1 when any figure of B is significantly worse than A (for CI)")
    cm.add_argument("--json", action="store_true", help="print the comparison as one JSON document")
    cm.set_defaults(fn=cmd_compare)

    sl = sub.add_parser("slurm", help="write an sbatch script that runs the suite on a Slurm allocation")
    sl.add_argument("suite", help="suite TOML file the job runs, e.g. workloads/smoke.toml")
    sl.add_argument("--cpus-per-task", type=COUNT, default=None,
                    help="CPUs of the node's one task, which runs all G ranks (default: 8 × --gpus-per-node; "
                         "Slurm's own default of 1 CPU per task would be shared by every rank)")
    sl.add_argument("--exclusive", action="store_true",
                    help="the nodes to this job alone: CPU and DRAM energy (RAPL) is measured per host, so "
                         "another job on the node would be counted in the run's joules")
    sl.add_argument("--job-output", metavar="PATTERN",
                    help="the job's stdout/stderr (#SBATCH --output; %%j is the job id); default "
                         "OUT/logs/slurm-%%j.out, its folder created now (Slurm does not create it)")
    sl.add_argument("--nodes", type=COUNT, required=True, help="nodes of the allocation (#SBATCH --nodes)")
    sl.add_argument("--gpus-per-node", type=COUNT, required=True,
                    help="GPUs of each node (#SBATCH --gpus-per-node); at least the suite's ranks per node")
    sl.add_argument("--partition", help="Slurm partition (#SBATCH --partition); default: the cluster's")
    sl.add_argument("--time", help="wall-clock limit, e.g. 02:00:00")
    sl.add_argument("--account", help="account charged for the job (#SBATCH --account)")
    sl.add_argument("--out", default="results", help="results folder, shared by all nodes")
    sl.add_argument("-o", "--output", default="-", help=OUTPUT + "the sbatch script file (default: stdout)")
    sl.set_defaults(fn=cmd_slurm)

    c = sub.add_parser("carbon", help="carbon accounting: plain estimates and projections from records")
    csub = c.add_subparsers(dest="carbon_verb", required=True)
    ce = csub.add_parser("estimate", help="chips × hours × watts × PUE × grid intensity")
    ce.add_argument("--chips", type=POSITIVE, required=True, help="number of accelerators")
    ce.add_argument("--hours", type=POSITIVE, required=True, help="wall-clock hours they run")
    ce.add_argument("--watts", type=POSITIVE, required=True, help="average power per chip")
    ce.add_argument("--pue", type=PUE, default=1.0, help="data-centre PUE, >= 1 (default: 1.0)")
    where = ce.add_mutually_exclusive_group()
    where.add_argument("--intensity", type=NON_NEGATIVE, help="grid intensity, g CO2e per kWh")
    where.add_argument("--country", help="ISO 3166 alpha-3 code, looked up in codecarbon's offline data")
    ce.add_argument("--region", help="region within --country (codecarbon's offline data), e.g. a US state")
    ce.add_argument("--json", action="store_true", help="print the estimate as JSON on stdout")
    ce.set_defaults(fn=cmd_carbon_estimate)
    cp = csub.add_parser("project", help="hours, kWh and t CO2e of a full training run from measured rates")
    cp.add_argument("records", help="a record file or a results folder")
    cp.add_argument("--tokens", type=POSITIVE, required=True, help="tokens of the full training run")
    cp.add_argument("--devices", type=COUNT, help="devices of the full run (default: the record's world size)")
    cp.add_argument("--pue", type=PUE, help="data-centre PUE, >= 1 (default: the record's)")
    where = cp.add_mutually_exclusive_group()
    where.add_argument("--intensity", type=NON_NEGATIVE, help="grid intensity, g CO2e per kWh (default: the record's)")
    where.add_argument("--country", help="ISO 3166 alpha-3 code, looked up in codecarbon's offline data")
    cp.add_argument("--region", help="region within --country (codecarbon's offline data), e.g. a US state")
    cp.add_argument("--json", action="store_true", help="print one projection per record as JSON on stdout")
    cp.set_defaults(fn=cmd_carbon_project)

    ex = sub.add_parser("export", help="export records, e.g. as codecarbon's emissions.csv")
    ex.add_argument("dir", nargs="?", default="results", help="results folder (default: results)")
    ex.add_argument("--format", choices=["codecarbon"], default="codecarbon",
                    help="codecarbon: its emissions.csv columns and units (the only format)")
    ex.add_argument("-o", "--output", help=OUTPUT + "the CSV file (default: DIR/emissions.csv); an existing "
                    "codecarbon file gets the rows appended, as codecarbon does")
    ex.set_defaults(fn=cmd_export)

    tk = sub.add_parser("tokenize", help="text files → a .bin of byte-level tokens for train.data")
    tk.add_argument("files", nargs="+", help="UTF-8 text files; each is one document, followed by EOS")
    tk.add_argument("-o", "--output", required=True, help=OUTPUT + "the token file to write, e.g. data/train.bin")
    tk.add_argument("--json", action="store_true", help='print {"path", "tokens", "sha256", ...} on stdout')
    tk.set_defaults(fn=cmd_tokenize)

    f = sub.add_parser("flops", help="parameters and FLOPs per token of every run of a suite")
    f.add_argument("suite", help="suite TOML file, e.g. workloads/smoke.toml")
    f.add_argument("--json", action="store_true", help="print the counts as JSON on stdout")
    f.set_defaults(fn=cmd_flops)

    mm = sub.add_parser("memory", help="per-device model-state bytes of DDP and ZeRO stages 1/2/3")
    mm.add_argument("suite", nargs="?", default=None, help="suite TOML: use its models' parameter counts")
    mm.add_argument("--params", type=PARAMS, default=None, help="parameter count Ψ (e.g. 7.5e9)")
    mm.add_argument("--dp", type=COUNT, default=None,
                    help="data-parallel degree N (default with a suite: each run's own)")
    mm.add_argument("--precision", choices=("mixed", "fp32"), default=None,
                    help="mixed: 2+2+K with K = 12 (the paper); fp32: 4+4+8. Default: each run's train.precision "
                         "(\"auto\": bf16 with a CUDA device here, else fp32); with --params only, mixed")
    mm.add_argument("--json", action="store_true", help="print the byte counts as JSON on stdout")
    mm.set_defaults(fn=cmd_memory)
    return p


def _terminate_like_ctrl_c(signum, frame):
    """SIGTERM (Slurm's scancel, a job's time limit) stops the suite as Ctrl-C does: the run in
    progress is recorded as interrupted and its processes are reaped."""
    raise KeyboardInterrupt


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """A warning (e.g. a skipped record, named by its file) as one line, through `printable`."""
    err.print(f"warning: {printable(message)}", markup=False)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate_like_ctrl_c)
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _show_warning
            return args.fn(args)
    except ConfigError as e:  # one problem a line (keys and values inside are quoted by the loader)
        err.print("\n".join(printable(line) for line in str(e).split("\n")), markup=False)
        if getattr(args, "json", False):  # a jq pipeline still gets its one document
            _print_json({"error": "config", "file": e.path,
                         "problems": [{"key": key, "reason": reason} for key, reason in e.problems]})
        return 2
    except UsageError as e:
        err.print(f"benchsuite: {printable(e)}", markup=False)
        if getattr(args, "json", False):
            _print_json({"error": "usage", "message": str(e)})
        return 2
    except KeyboardInterrupt:
        err.print("interrupted: completed records are kept; rerun the same command to resume")
        return 130


if __name__ == "__main__":
    sys.exit(main())
