"""`benchsuite run SUITE.toml`: one torchrun per run of the suite, one record per run, progress on stderr."""

from __future__ import annotations

import argparse
import signal
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from benchsuite.commands.common import (COUNT, INDEX, JSON, POSITIVE, REPEAT, UsageError, check_repeat, endpoint, err,
                                        make_folder, path_arg, print_json)
from benchsuite.config import RANKS_PER_CORE, check_ranks_per_node, usable_cores
from benchsuite.config.preflight import load_suite
from benchsuite.record.names import record_name
from benchsuite.record.types import Record
from benchsuite.terminal import printable


def add_parser(sub) -> None:
    r = sub.add_parser("run", parents=[JSON, REPEAT],
                       help="run a suite (one torchrun per run) and write one record per run")
    r.add_argument("suite", type=path_arg, help="suite TOML file, e.g. workloads/smoke.toml")
    r.add_argument("--out", type=path_arg, default="results", help="results folder (default: results)")
    r.add_argument("--resume", action=argparse.BooleanOptionalAction, default=True,
                   help="skip runs already recorded ok (default: on)")
    r.add_argument("--peak-tflops", type=POSITIVE, default=None,
                   help="peak FLOP/s of one device (TFLOP/s) for MFU where the device is not in the table")
    r.add_argument("--nnodes", type=COUNT, default=1, help="nodes in this job (multi-node: one launcher per node)")
    r.add_argument("--node-rank", type=INDEX, default=0, help="this node's rank; node 0 writes the records")
    r.add_argument("--rdzv-endpoint", type=endpoint, default=None, help="HOST:PORT of the c10d rendezvous (multi-node)")
    r.add_argument("--rdzv-id", default="benchsuite", help="job id shared by every node's launcher")
    r.add_argument("--max-ranks-per-node", type=int, default=None, metavar="N",
                   help=f"most ranks one node may start (default: {RANKS_PER_CORE} × the usable CPU cores)")
    r.set_defaults(fn=run)


def run(args) -> int:
    if args.node_rank >= args.nnodes:
        raise UsageError(f"--node-rank {args.node_rank} must be < --nnodes {args.nnodes} (ranks count from 0)")
    suite = load_suite(args.suite)  # before the heavy imports: a bad file is refused at once
    check_repeat(suite, args.repeat)
    _check_ranks_per_node(suite, args)

    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from benchsuite.launch import Rendezvous, plan, run_suite
    from benchsuite.record import NewerRecordError

    if args.nnodes > 1 and not args.rdzv_endpoint:
        raise UsageError("--nnodes > 1 needs --rdzv-endpoint HOST:PORT (the first node's address)")
    rdzv = Rendezvous(nnodes=args.nnodes, node_rank=args.node_rank, endpoint=args.rdzv_endpoint,
                      rdzv_id=args.rdzv_id)
    runs_here = [r for r in suite.runs if r.nodes == rdzv.nnodes]
    if not runs_here:
        raise UsageError(f"{args.suite}: no run of this suite has nodes = {rdzv.nnodes}")
    make_folder("--out", args.out, "results folder")
    progress = Progress(TextColumn("{task.description}", markup=False), BarColumn(),
                        TextColumn("{task.fields[suite]}", markup=False), TimeElapsedColumn(), console=err,
                        transient=True, disable=args.json)
    planned = plan(suite.runs, args.repeat)
    try:
        with progress:
            outcomes = run_suite(suite, args.out, resume=args.resume, peak_tflops=args.peak_tflops, rdzv=rdzv,
                                 on_event=_progress_events(progress, suite.name, planned, args.json),
                                 repeat=args.repeat)
    except NewerRecordError as e:  # a newer benchsuite's record where this suite would write one
        raise UsageError(str(e)) from None
    except OSError as e:  # disk full, folder removed mid-suite, ...: the path and the fix, exit 2, no traceback
        from benchsuite.atomic import OutputError

        failure = e if isinstance(e, OutputError) else OutputError(e.filename or args.out, e)
        err.print(f"benchsuite: {printable(failure)}\nrecords completed before this are kept; rerun the same "
                  f"command to resume", markup=False, soft_wrap=True)
        if args.json:
            print_json({"error": "output", "path": str(failure.filename), "message": str(failure)})
        return 2
    interrupted = any(o.interrupted for o in outcomes)
    if interrupted:  # the suite is over: more Ctrl-C presses must not cut short its last words or exit code
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)
    return _finish(args, suite.name, outcomes, len(planned), interrupted)


def _progress_events(progress, suite_name: str, planned: list, as_json: bool):
    """What run_suite calls on each event: a run starts (the bar says the ranks are starting), a progress line
    of its log (the bar's text on a terminal; a plain stderr line otherwise, --json too), a run ends (its
    outcome line, the suite's runs done and ETA)."""
    from benchsuite.progress import STARTING

    eta = SuiteEta(len(planned))
    task = progress.add_task(printable(suite_name), total=len(planned), suite=eta.line())

    def on_event(kind, i, total, payload):
        label = printable(run_name(planned[i].run, planned[i].repeat))
        if kind == "start":  # the ranks take seconds to start and warm up: the bar says so meanwhile
            progress.update(task, description=f"{label} · {STARTING}", suite=eta.line())
            if not err.is_terminal or as_json:
                err.print(f"suite {printable(suite_name)}: {eta.line()}", markup=False)
            return
        if kind == "progress":
            if err.is_terminal and not as_json:
                progress.update(task, description=f"{label} · {printable(payload.text)}")
            else:
                err.print(f"{label}: {printable(payload.text)}", markup=False)
            return
        eta.finished(payload)
        progress.update(task, advance=1, suite=eta.line())
        if not as_json:
            progress.console.print(_outcome_line(payload))

    return on_event


def _finish(args, suite_name: str, outcomes: list, planned: int, interrupted: bool) -> int:
    """The suite's last words (its --json document or summary line) and its exit code."""
    from benchsuite.launch import RunStatus

    if args.json:
        print_json({"suite": suite_name, "out": str(args.out), "interrupted": interrupted,
                    "runs": [{"workload": o.run.workload, "world_size": o.run.world_size, "scaling": o.run.scaling,
                              "run_key": o.run_key, "repeat": o.repeat, "status": o.status.value,
                              "record": o.record_path, "error": o.error,
                              "holder": str(o.holder) if o.holder else None,
                              "lock": str(o.lock) if o.lock else None,
                              "kept_earlier_record": o.kept_earlier,
                              "flags": msgspec.to_builtins(rec.flags) if (rec := _ok_record(o)) else []}
                             for o in outcomes]})
    else:
        err.print(_summary_line(outcomes, planned)
                  + f" → {printable(args.out)}   next: benchsuite report {printable(args.out)}",
                  markup=False)
    if interrupted:
        err.print("interrupted: completed records are kept; rerun the same command to resume")
        return 130
    # runs that no launcher measures until someone acts (a skipped_locked run another launcher measures)
    unmeasured = (RunStatus.FAILED, RunStatus.INTERRUPTED, RunStatus.SKIPPED_LOCK_UNAVAILABLE,
                  RunStatus.SKIPPED_NO_DECISION)
    return 1 if any(o.status in unmeasured for o in outcomes) else 0


@dataclass
class SuiteEta:
    """The suite's runs done and left, and an ETA: the mean duration of the runs measured so far (a
    skipped run takes no time and says nothing of the others) times the runs left."""

    total: int
    done: int = 0
    measured_s: list[float] = field(default_factory=list)

    def finished(self, outcome) -> None:
        self.done += 1
        if outcome.duration_s > 0:  # launched (ok, failed or interrupted), not skipped
            self.measured_s.append(outcome.duration_s)

    def line(self) -> str:
        """'1/4 runs done, 3 left, ETA 0:38' (no ETA before a run was measured)."""
        left = self.total - self.done
        text = f"{self.done}/{self.total} runs done, {left} left"
        if not left or not self.measured_s:
            return text
        return f"{text}, ETA {_clock(sum(self.measured_s) / len(self.measured_s) * left)}"


def _clock(seconds: float) -> str:
    """'0:38', '12:05', '1:02:09'."""
    m, s = divmod(round(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


SUMMARY_WORDS = {  # RunStatus value → how the summary line counts it
    "ok": "ok", "failed": "failed", "interrupted": "interrupted", "skipped_recorded": "skipped (already recorded)",
    "skipped_other_nodes": "left to a job with another --nnodes",
    "skipped_locked": "being measured by another launcher",
    "skipped_lock_unavailable": "skipped (lock unavailable)",
    "skipped_no_decision": "skipped (no decision from node 0)",
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
    from benchsuite.environment import gpu_names

    gpus = len(gpu_names())
    shared = sorted({r.nproc_per_node for r in runs if gpus and r.nproc_per_node > gpus})
    if shared:
        err.print(f"note: runs with {', '.join(map(str, shared))} ranks per node share this node's {gpus} GPU(s): "
                  "they use gloo (NCCL needs one GPU per rank), correctness runs whose records are not speed "
                  "figures", markup=False)


def run_name(run, repeat: int) -> str:
    """'dense · w2 · weak · seed 1 · repeat 0': a measurement named by its run (RunConfig.label), seed and
    repeat."""
    return record_name(run.label, run.train.seed, repeat)


def _ok_record(o) -> Record | None:
    """The record an ok outcome wrote, read as every reader reads one (None for the other statuses)."""
    from benchsuite.results.decoding import read_record

    return read_record(Path(o.record_path)) if o.status == "ok" else None


def _outcome_line(o) -> str:
    """One line per run for every RunStatus (a status without a line here is a KeyError, caught by the tests)."""
    from rich.markup import escape as _escape

    def escape(text) -> str:
        return _escape(printable(text))

    name = escape(run_name(o.run, o.repeat))
    kept = f"; the earlier ok record is kept as the run's result ({escape(o.record_path)})" if o.kept_earlier else ""
    lines = {
        "failed": lambda: f"[red]✗[/red] {name}: {escape(o.error['type'])}: {escape(o.error['message'][:300])}{kept}",
        "interrupted": lambda: f"[yellow]■[/yellow] {name}: interrupted ({escape(o.error['message'])})"
                               + (kept or ("; recorded failed" if o.record_path else "")),
        "skipped_recorded": lambda: f"[dim]↷ {name}: already recorded in {escape(o.record_path)} (run key "
                                    f"{o.run_key}: the same config, hardware and threads per rank)[/dim]",
        "skipped_other_nodes": lambda: f"[dim]↷ {name}: nodes = {o.run.nodes}, left to a job started with "
                                       f"--nnodes {o.run.nodes}[/dim]",
        "skipped_locked": lambda: f"[dim]↷ {name}: being measured by {escape(o.holder)}; its record appears in "
                                  "the results folder when it finishes[/dim]",
        "skipped_lock_unavailable": lambda: f"[yellow]↷[/yellow] {name}: skipped, lock unavailable: "
                                            f"{escape(o.lock)}; then rerun the same command",
        "skipped_no_decision": lambda: f"[yellow]↷[/yellow] {name}: skipped, no decision from node 0: "
                                       f"{escape(o.error['message'])}; this node stops here",
        "ok": lambda: _ok_line(o, name, escape),
    }
    return lines[o.status.value]()


def _ok_line(o, name: str, escape) -> str:
    rec = _ok_record(o)
    m = rec.metrics
    mfu = f"{m.mfu:.1%}" if m.mfu is not None else "n/a"
    tps = f"{m.tokens_per_s:,.0f}" if m.tokens_per_s is not None else "n/a"
    line = f"[green]✓[/green] {name}: {tps} tok/s, MFU {mfu}, {o.duration_s:.1f} s"
    if rec.flags:  # impossible figures (record/sanity.py) are never shown as a plain ok
        from benchsuite.record.sanity import flag_summary

        line += f"\n  [yellow]⚠ flagged:[/yellow] {escape(flag_summary(msgspec.to_builtins(rec.flags)))}"
    return line
