"""The `benchsuite` command: parse, call, print. Nothing here measures anything.

Exit codes: 0 success, 1 a run failed, 2 bad input (nothing launched), 130 Ctrl-C.
Under --json, stdout holds exactly one JSON document; progress and warnings go to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path

from rich.console import Console

from benchsuite.config import ConfigError, load_suite

err = Console(stderr=True, highlight=False, soft_wrap=True)  # messages are never cut into lines
# Piped into a file or a CI log there is no terminal width: tables get room instead of 80 columns.
out = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 200)


class UsageError(Exception):
    """Bad command-line input: printed as one line, exit code 2."""


def _print_json(doc) -> None:
    sys.stdout.write(json.dumps(doc, indent=2, allow_nan=False, default=str) + "\n")


def cmd_run(args) -> int:
    suite = load_suite(args.suite)  # before the heavy imports: a bad file is refused at once

    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from benchsuite.launch import Rendezvous, run_suite

    if args.nnodes > 1 and not args.rdzv_endpoint:
        raise UsageError("--nnodes > 1 needs --rdzv-endpoint HOST:PORT (the first node's address)")
    rdzv = Rendezvous(nnodes=args.nnodes, node_rank=args.node_rank, endpoint=args.rdzv_endpoint,
                      rdzv_id=args.rdzv_id)
    runs_here = [r for r in suite.runs if r.nodes == rdzv.nnodes]
    if not runs_here:
        raise UsageError(f"{args.suite}: no run of this suite has nodes = {rdzv.nnodes}")
    out_dir = Path(args.out)
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"--out {out_dir}: exists and is not a folder; give a results folder (created if missing)")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"--out {out_dir}: cannot create the results folder: {e.strerror or e}") from None
    if not os.access(out_dir, os.W_OK | os.X_OK):
        raise UsageError(f"--out {out_dir}: the results folder is not writable")
    progress = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                        TimeElapsedColumn(), console=err, transient=True, disable=args.json)
    task = progress.add_task(suite.name, total=len(suite.runs))

    def on_event(kind, i, total, payload):
        if kind == "start":
            progress.update(task, description=f"{payload.workload} · world {payload.world_size} · {payload.scaling}")
            return
        progress.advance(task)
        if not args.json:
            progress.console.print(_outcome_line(payload))

    try:
        with progress:
            outcomes = run_suite(suite, args.out, resume=args.resume, peak_tflops=args.peak_tflops, rdzv=rdzv,
                                 on_event=on_event)
    except OSError as e:  # disk full, folder removed mid-suite, ...: say so, no traceback
        err.print(f"benchsuite: cannot write to the results folder {args.out}: {e}\n"
                  "records completed before this are kept; free space and rerun the same command to resume",
                  markup=False, soft_wrap=True)
        return 1
    if args.json:
        _print_json({"suite": suite.name, "out": str(args.out),
                     "runs": [{"workload": o.run.workload, "world_size": o.run.world_size, "scaling": o.run.scaling,
                               "run_key": o.run_key, "status": o.status, "record": o.record_path, "error": o.error,
                               "flags": (_ok_record(o) or {}).get("flags") or []}
                              for o in outcomes]})
    else:
        counts = {s: sum(o.status == s for o in outcomes) for s in ("ok", "failed", "skipped")}
        err.print(f"{counts['ok']} ok, {counts['failed']} failed, {counts['skipped']} skipped (already recorded)"
                  f" → {args.out}   next: benchsuite report {args.out}")
    return 1 if any(o.status == "failed" for o in outcomes) else 0


def _ok_record(o) -> dict | None:
    """The record an ok outcome wrote (None for failed and skipped runs)."""
    return json.loads(Path(o.record_path).read_text()) if o.status == "ok" else None


def _outcome_line(o) -> str:
    from rich.markup import escape as _escape

    from benchsuite.results.report import printable

    def escape(text) -> str:
        return _escape(printable(text))

    name = escape(f"{o.run.workload} · world {o.run.world_size} · {o.run.scaling}")
    if o.status == "failed":
        return f"[red]✗[/red] {name}: {escape(o.error['type'])}: {escape(o.error['message'][:300])}"
    if o.status == "skipped":
        return f"[dim]↷ {name}: already recorded ({o.run_key})[/dim]"
    rec = _ok_record(o)
    m = rec["metrics"]
    mfu = f"{m['mfu']:.1%}" if m.get("mfu") is not None else "n/a"
    tps = f"{m['tokens_per_s']:,.0f}" if m.get("tokens_per_s") is not None else "n/a"
    line = f"[green]✓[/green] {name}: {tps} tok/s, MFU {mfu}, {o.duration_s:.1f} s"
    if rec.get("flags"):  # impossible figures (results/sanity.py) are never shown as a plain ok
        from benchsuite.results.sanity import flag_summary

        line += f"\n  [yellow]⚠ flagged:[/yellow] {escape(flag_summary(rec['flags']))}"
    return line


def _load_df(path):
    from benchsuite.results.store import records_dataframe

    if not Path(path).exists():
        raise UsageError(f"{path}: no such results folder (run `benchsuite run SUITE.toml --out {path}` first)")
    return records_dataframe(path)


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
        err.print(f"no records in {args.dir}")
    return 0


def cmd_report(args) -> int:
    from benchsuite.results.report import report_rows, report_table, section_tables

    df = _load_df(args.dir)
    if args.json:
        _print_json(report_rows(df))
        return 0
    if df.empty:
        err.print(f"no records in {args.dir}")
        return 0
    out.print(report_table(df))
    for table in section_tables(df):
        out.print(table)
    return 0


def cmd_dashboard(args) -> int:
    from dashboard import build_site

    if not Path(args.dir).exists():
        raise UsageError(f"{args.dir}: no such results folder (run `benchsuite run SUITE.toml --out {args.dir}` first)")
    res = build_site(args.dir, args.out)
    if args.json:
        _print_json({"index": str(res.index), "records": res.records, "pages": res.pages})
        return 0
    if not res.records:
        err.print(f"no records in {args.dir}: the site says so")
    err.print(f"{res.records} runs, {len(res.pages)} pages, {res.bytes / 2**20:.1f} MiB → {args.out}")
    out.print(str(res.index), markup=False)
    return 0


def cmd_flops(args) -> int:
    from benchsuite.metrics.flops import flops_per_token, hardware_basis

    suite = load_suite(args.suite)
    rows = []
    for run in suite.runs:
        f = flops_per_token(run)
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
            out.print(f"{r['workload']:<24} w{r['world_size']:<3} params {r['params']:10.4g}  "
                      f"active {r['params_active']:10.4g}  model {r['model_flops_per_token']:10.4g} FLOP/tok  "
                      f"hardware {r['hardware_flops_per_token']:10.4g} FLOP/tok", markup=False)
    return 0


def cmd_memory(args) -> int:
    """Per-device model-state bytes of DDP and ZeRO 1/2/3 (ZeRO paper formulas), and activations."""
    from benchsuite.metrics import memory as mem

    if args.suite is None and args.params is None:
        raise UsageError("give a suite (its models' parameter counts) or --params N")
    if args.params is not None and not args.params > 0:
        raise UsageError(f"--params must be > 0, got {args.params:g}")
    if args.dp is not None and args.dp < 1:
        raise UsageError(f"--dp must be >= 1, got {args.dp}")
    if args.suite is None and args.dp is None:
        raise UsageError("--dp N (the data-parallel degree) is needed with --params")
    consts = mem.PAPER if args.precision == "mixed" else mem.FP32
    doc = {"precision": args.precision, "constants": consts.name, "K": consts.k,
           "formulas": {mem.STAGE_LABELS[s]: mem.zero_formula(s, consts) for s in range(4)},
           "source": "Rajbhandari et al. 2019 (ZeRO), per-device model states; GB = 1e9 bytes"}
    if args.suite is None:
        doc.update(params=args.params, dp=args.dp, stages=mem.stage_table(args.params, args.dp, consts))
        rows = [("--params", args.params, args.dp, doc["stages"], None)]
    else:
        from benchsuite.metrics.flops import param_counts

        suite = load_suite(args.suite)
        doc.update(suite=suite.name, runs=[])
        rows = []
        for run in suite.runs:
            psi = args.params or param_counts(run.model, run.moe).total
            dp = args.dp or run.data_parallel
            psi_rank = args.params or mem.params_per_rank(run.model, run.moe, run.parallel.tensor)
            stages = mem.stage_table(psi_rank, dp, consts)
            act = mem.activation_estimates(run)
            doc["runs"].append({"workload": run.workload, "world_size": run.world_size, "tensor": run.parallel.tensor,
                                "zero": run.parallel.zero, "params": psi, "params_per_rank": psi_rank, "dp": dp,
                                "stages": stages, "activation_bytes_per_micro_batch": act})
            rows.append((f"{run.workload} w{run.world_size}", psi_rank, dp, stages, act))
    if args.json:
        _print_json(doc)
        return 0
    out.print(f"model states per device, {consts.name}, K = {consts.k:g}  (GB = 1e9 bytes)", markup=False)
    for name, psi, dp, stages, act in rows:
        cells = "  ".join(f"{r['name']} {r['total'] / 1e9:10.4g} GB" for r in stages)
        out.print(f"{name:<24} Ψ {psi:,.0f}  N {dp:<4} {cells}", markup=False)
        if act:
            out.print(f"{'':<24} activations per micro-batch (Korthikanti et al. 2022): "
                      f"{act['none'] / 1e9:.4g} GB none, {act['selective'] / 1e9:.4g} GB selective, "
                      f"{act['full'] / 1e9:.4g} GB full recompute", markup=False)
    return 0


def cmd_slurm(args) -> int:
    from benchsuite.slurm import sbatch_script

    suite = load_suite(args.suite)
    if not any(r.nodes == args.nodes for r in suite.runs):
        raise UsageError(f"{args.suite}: no run has nodes = {args.nodes}; set [sweep] nodes to include it")
    try:
        script = sbatch_script(Path(args.suite).resolve(), suite.name, Path(args.out).resolve(), args.nodes,
                               args.gpus_per_node, args.partition, args.time, args.account)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if args.output == "-":
        sys.stdout.write(script)
    else:
        from benchsuite.atomic import atomic_file

        with atomic_file(args.output, "w", encoding="utf-8") as f:
            f.write(script)
        err.print(f"wrote {args.output}; submit with: sbatch {args.output}", markup=False)
    return 0


def cmd_carbon_estimate(args) -> int:
    from benchsuite.energy import carbon

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
        err.print(f"note: {res['intensity_note']}", markup=False)
    return 0


def cmd_carbon_project(args) -> int:
    from benchsuite.energy import carbon
    from benchsuite.results.store import load_records

    if not Path(args.records).exists():
        raise UsageError(f"{args.records}: no such record or results folder")
    records = [r for r in load_records(args.records) if r["status"] == "ok"]
    if not records:
        raise UsageError(f"{args.records}: no ok record to project from")
    intensity = None
    if args.intensity is not None or args.country:
        intensity = carbon.lookup(args.intensity, args.country, args.region)
    rows = []
    for rec in records:
        try:
            proj = carbon.project_from_record(rec, args.tokens, args.devices, args.pue, intensity)
        except ValueError as e:
            proj = {"error": str(e)}
        rows.append({"run_key": rec["run_key"], "suite": rec["suite"], "workload": rec["workload"],
                     "world_size": rec["config"]["world_size"], **proj})
    if args.json:
        _print_json(rows)
        return 0
    for r in rows:
        head = f"{r['suite']}/{r['workload']} (world {r['world_size']})"
        if "error" in r:
            out.print(f"{head}: cannot project: {r['error']}", markup=False)
        else:
            out.print(f"{head}: {r['hours']:,.1f} h on {r['devices']} devices, {r['energy_kwh']:.3g} kWh, "
                      f"{r['co2e_t']:.3g} t CO2e (PUE {r['pue']:g}, {r['intensity_g_per_kwh']:.0f} g/kWh, "
                      f"{r['intensity_source']})", markup=False)
    return 0


def cmd_export(args) -> int:
    from benchsuite.energy.carbon import write_codecarbon_csv
    from benchsuite.results.store import load_records

    if not Path(args.dir).exists():
        raise UsageError(f"{args.dir}: no such results folder")
    path = write_codecarbon_csv(load_records(args.dir), Path(args.output or Path(args.dir) / "emissions.csv"))
    err.print(f"wrote {path}", markup=False)
    return 0


def cmd_tokenize(args) -> int:
    """Text files → a .bin of byte-level tokens that train.data can name."""
    from benchsuite.data import tokenize_files

    try:
        doc = tokenize_files(args.files, args.output)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if args.json:
        _print_json(doc)
    else:
        out.print(f"wrote {doc['path']}: {doc['tokens']:,} tokens from {doc['files']} file(s), byte-level ids "
                  f"(model.vocab >= {doc['vocab_needed']}), sha256 {doc['sha256'][:12]}…; "
                  f'use it with train.data = "{doc["path"]}"', markup=False)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="benchsuite", description="What training a transformer really costs: "
                                "throughput, FLOPs/MFU, scaling, memory, energy and CO2e.")
    sub = p.add_subparsers(dest="verb", required=True)

    r = sub.add_parser("run", help="run a suite (one torchrun per run) and write one record per run")
    r.add_argument("suite", help="suite TOML file, e.g. workloads/smoke.toml")
    r.add_argument("--out", default="results", help="results folder (default: results)")
    r.add_argument("--resume", action=argparse.BooleanOptionalAction, default=True,
                   help="skip runs already recorded ok (default: on)")
    r.add_argument("--peak-tflops", type=float, default=None,
                   help="peak FLOP/s of one device (TFLOP/s) for MFU where the device is not in the table")
    r.add_argument("--nnodes", type=int, default=1, help="nodes in this job (multi-node: one launcher per node)")
    r.add_argument("--node-rank", type=int, default=0, help="this node's rank; node 0 writes the records")
    r.add_argument("--rdzv-endpoint", default=None, help="HOST:PORT of the c10d rendezvous (multi-node)")
    r.add_argument("--rdzv-id", default="benchsuite", help="job id shared by every node's launcher")
    r.add_argument("--json", action="store_true", help="print a JSON summary on stdout")
    r.set_defaults(fn=cmd_run)

    ls = sub.add_parser("list", help="list the records in a results folder")
    ls.add_argument("dir", nargs="?", default="results")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(fn=cmd_list)

    rp = sub.add_parser("report", help="table of results: throughput, MFU, step time, scaling")
    rp.add_argument("dir", nargs="?", default="results")
    rp.add_argument("--json", action="store_true")
    rp.set_defaults(fn=cmd_report)

    db = sub.add_parser("dashboard", help="build the static, offline Plotly site from a results folder")
    db.add_argument("dir", nargs="?", default="results")
    db.add_argument("-o", "--out", default="site", help="site folder (default: site); opens as OUT/index.html")
    db.add_argument("--json", action="store_true", help='print {"index", "records", "pages"} on stdout')
    db.set_defaults(fn=cmd_dashboard)

    sl = sub.add_parser("slurm", help="write an sbatch script that runs the suite on a Slurm allocation")
    sl.add_argument("suite")
    sl.add_argument("--nodes", type=int, required=True)
    sl.add_argument("--gpus-per-node", type=int, required=True)
    sl.add_argument("--partition")
    sl.add_argument("--time", help="wall-clock limit, e.g. 02:00:00")
    sl.add_argument("--account")
    sl.add_argument("--out", default="results", help="results folder, shared by all nodes")
    sl.add_argument("-o", "--output", default="-", help="script file (default: stdout)")
    sl.set_defaults(fn=cmd_slurm)

    c = sub.add_parser("carbon", help="carbon accounting: plain estimates and projections from records")
    csub = c.add_subparsers(dest="carbon_verb", required=True)
    ce = csub.add_parser("estimate", help="chips × hours × watts × PUE × grid intensity")
    ce.add_argument("--chips", type=float, required=True)
    ce.add_argument("--hours", type=float, required=True)
    ce.add_argument("--watts", type=float, required=True, help="average power per chip")
    ce.add_argument("--pue", type=float, default=1.0)
    where = ce.add_mutually_exclusive_group()
    where.add_argument("--intensity", type=float, help="grid intensity, g CO2e per kWh")
    where.add_argument("--country", help="ISO 3166 alpha-3 code, looked up in codecarbon's offline data")
    ce.add_argument("--region")
    ce.add_argument("--json", action="store_true")
    ce.set_defaults(fn=cmd_carbon_estimate)
    cp = csub.add_parser("project", help="hours, kWh and t CO2e of a full training run from measured rates")
    cp.add_argument("records", help="a record file or a results folder")
    cp.add_argument("--tokens", type=float, required=True, help="tokens of the full training run")
    cp.add_argument("--devices", type=int, help="devices of the full run (default: the record's world size)")
    cp.add_argument("--pue", type=float, help="default: the record's")
    where = cp.add_mutually_exclusive_group()
    where.add_argument("--intensity", type=float, help="default: the record's")
    where.add_argument("--country")
    cp.add_argument("--region")
    cp.add_argument("--json", action="store_true")
    cp.set_defaults(fn=cmd_carbon_project)

    ex = sub.add_parser("export", help="export records, e.g. as codecarbon's emissions.csv")
    ex.add_argument("dir", nargs="?", default="results")
    ex.add_argument("--format", choices=["codecarbon"], default="codecarbon")
    ex.add_argument("-o", "--output", help="default: DIR/emissions.csv")
    ex.set_defaults(fn=cmd_export)

    tk = sub.add_parser("tokenize", help="text files → a .bin of byte-level tokens for train.data")
    tk.add_argument("files", nargs="+", help="UTF-8 text files; each is one document, followed by EOS")
    tk.add_argument("-o", "--output", required=True, help="the token file to write, e.g. data/train.bin")
    tk.add_argument("--json", action="store_true", help='print {"path", "tokens", "sha256", ...} on stdout')
    tk.set_defaults(fn=cmd_tokenize)

    f = sub.add_parser("flops", help="parameters and FLOPs per token of every run of a suite")
    f.add_argument("suite")
    f.add_argument("--json", action="store_true")
    f.set_defaults(fn=cmd_flops)

    mm = sub.add_parser("memory", help="per-device model-state bytes of DDP and ZeRO stages 1/2/3")
    mm.add_argument("suite", nargs="?", default=None, help="suite TOML: use its models' parameter counts")
    mm.add_argument("--params", type=float, default=None, help="parameter count Ψ (e.g. 7.5e9)")
    mm.add_argument("--dp", type=int, default=None,
                    help="data-parallel degree N (default with a suite: each run's own)")
    mm.add_argument("--precision", choices=("mixed", "fp32"), default="mixed",
                    help="mixed: 2+2+K with K = 12 (the paper); fp32: 4+4+8")
    mm.add_argument("--json", action="store_true")
    mm.set_defaults(fn=cmd_memory)
    return p


def _terminate_like_ctrl_c(signum, frame):
    """SIGTERM (Slurm's scancel, a job's time limit) stops the suite as Ctrl-C does: the run in
    progress is recorded as interrupted and its processes are reaped."""
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate_like_ctrl_c)
    try:
        return args.fn(args)
    except ConfigError as e:
        err.print(str(e), markup=False)
        return 2
    except UsageError as e:
        err.print(f"benchsuite: {e}", markup=False)
        return 2
    except KeyboardInterrupt:
        err.print("interrupted: completed records are kept; rerun the same command to resume")
        return 130


if __name__ == "__main__":
    sys.exit(main())
