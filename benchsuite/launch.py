"""Suite orchestration: one torchrun per run, resume, failure isolation, timeouts.

A run that raises, is killed, segfaults or hangs past `train.timeout_s` becomes a failed
record naming the rank and the reason; every process of the run is reaped; the suite goes on.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from benchsuite import prctl
from benchsuite.config import ConfigError, RunConfig, Suite
from benchsuite.environment import THREADS_SOURCE_VAR, hardware_identity, software_versions
from benchsuite.results.schema import failed_record, utc_now
from benchsuite.results.store import ok_run_keys, record_filename, write_record


@dataclass(frozen=True)
class Rendezvous:
    """Where this launcher sits in a multi-node job (one launcher per node, c10d rendezvous)."""

    nnodes: int = 1
    node_rank: int = 0
    endpoint: str | None = None  # host:port of the c10d store, reachable from every node
    rdzv_id: str = "benchsuite"

    @property
    def multi_node(self) -> bool:
        return self.nnodes > 1


@dataclass
class RunOutcome:
    run: RunConfig
    run_key: str
    status: str  # ok | failed | skipped | not_on_this_node
    record_path: str | None = None
    error: dict | None = None
    duration_s: float = 0.0


def torchrun_command(run: RunConfig, key: str, workdir: Path, rdzv: Rendezvous) -> list[str]:
    """The worker gets one positional argument, its work folder (run.json inside): torchrun's own
    parser would otherwise claim any --option that abbreviates one of its flags."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(run.nproc_per_node),
           "--max-restarts", "0"]
    if run.nodes == 1:
        cmd += ["--standalone", "--nnodes", "1"]
    else:
        cmd += ["--nnodes", str(run.nodes), "--rdzv-backend", "c10d", "--rdzv-endpoint", rdzv.endpoint,
                "--rdzv-id", f"{rdzv.rdzv_id}-{key}"]
    return cmd + ["-m", "benchsuite.worker", str(workdir)]


@dataclass(frozen=True)
class Threads:
    """CPU threads each rank of a run gets, and why (recorded as env.threads_per_rank / threads_source)."""

    per_rank: int
    source: str  # "sweep rule" | "OMP_NUM_THREADS from the user"


def host_cores() -> int:
    """Cores this process may run on (a Slurm or container CPU set, not the whole machine)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def thread_plan(runs: list[RunConfig], cores: int | None = None, environ=os.environ) -> dict[str, Threads]:
    """Threads per rank for each sweep (by sweep_id): the same at every world size of a sweep, so
    that scaling efficiency compares N ranks with N times one rank's resources, not one rank on
    the whole host with ranks on a share of it: cores ÷ the sweep's largest ranks per node (at
    least 1). A user's OMP_NUM_THREADS wins everywhere; it must be a positive integer."""
    user = environ.get("OMP_NUM_THREADS")
    if user is not None:
        if not user.strip().isdigit() or int(user) < 1:
            raise ConfigError("environment", [("OMP_NUM_THREADS", f"must be a positive integer, got {user!r}; "
                                                                  "unset it to use the sweep rule")])
        return {run.sweep_id: Threads(int(user), "OMP_NUM_THREADS from the user") for run in runs}
    cores = cores or host_cores()
    largest: dict[str, int] = {}
    for run in runs:
        largest[run.sweep_id] = max(largest.get(run.sweep_id, 1), run.nproc_per_node)
    return {sweep: Threads(max(1, cores // n), "sweep rule") for sweep, n in largest.items()}


def worker_env(run: RunConfig, threads: Threads) -> dict:
    """The ranks' environment: the sweep's thread count (torchrun would otherwise pin every
    multi-rank run to one thread per rank), applied by the worker and recorded."""
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = str(threads.per_rank)
    env[THREADS_SOURCE_VAR] = threads.source
    return env


def _kill_run(proc: subprocess.Popen, workdir: Path) -> None:
    """SIGTERM torchrun's group (it stops its ranks), then SIGKILL everything left, ranks included."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    _reap_ranks(workdir)


def _reap_ranks(workdir: Path) -> None:
    for pid_file in workdir.glob("pid.*"):
        with contextlib.suppress(ValueError, OSError):
            pid = int(pid_file.read_text())
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)


WORKDIR_PREFIX = "benchsuite-"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def remove_stale_workdirs() -> list[Path]:
    """Remove the work folders of launchers that died without cleaning up (SIGKILL, OOM, power loss).

    Each folder names its launcher in launcher.pid; a folder whose launcher is gone is stale.
    Folders of live launchers, of other users, or without a pid file are left alone.
    """
    removed = []
    for d in Path(tempfile.gettempdir()).glob(f"{WORKDIR_PREFIX}*"):
        with contextlib.suppress(ValueError, OSError):
            if not _pid_alive(int((d / "launcher.pid").read_text())):
                shutil.rmtree(d)
                removed.append(d)
    return removed


_FAILURE = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank.*?exitcode\s*:\s*(-?\d+)", re.S)


def _signal_name(code: int) -> str:
    return signal.Signals(code).name if code in signal.valid_signals() else f"signal {code}"


def diagnose(returncode: int, workdir: Path, log_text: str) -> dict:
    """The failed record's error. A rank killed by a signal writes nothing and its peers then fail
    on broken collectives, so a signal death is the root cause: the one torchrun names as its
    first observed failure, else any but SIGTERM (torchrun's own way of stopping the survivors).
    Otherwise the earliest exception a rank wrote; otherwise torchrun's own summary."""
    errors = {}
    for f in workdir.glob("error.*.json"):
        with contextlib.suppress(OSError, json.JSONDecodeError):
            e = json.loads(f.read_text())
            errors[e["rank"]] = e
    deaths = [(int(r), int(c)) for r, c in _FAILURE.findall(log_text.split("Failures:", 1)[-1])]
    root = _FAILURE.search(log_text.split("Root Cause", 1)[1]) if "Root Cause" in log_text else None
    root = (int(root.group(1)), int(root.group(2))) if root else None
    killed = [d for d in deaths if d[1] < 0 and d[0] not in errors]
    killed.sort(key=lambda d: (d != root, -d[1] == signal.SIGTERM, d[0]))
    if killed and (-killed[0][1] != signal.SIGTERM or not errors):
        rank, code = killed[0]
        sig = _signal_name(-code)
        hint = {"SIGKILL": " (killed: out of memory or an external kill)",
                "SIGSEGV": " (segmentation fault)"}.get(sig, "")
        return {"type": "WorkerKilled", "message": f"rank {rank} died from {sig}{hint}", "rank": rank}
    if errors:
        first = min(errors.values(), key=lambda e: e["time"])
        return {"type": first["type"], "message": first["message"], "rank": first["rank"],
                "traceback": first.get("traceback")}
    if deaths:
        rank, code = root or min(deaths)
        return {"type": "WorkerExited", "message": f"rank {rank} exited with code {code}", "rank": rank}
    tail = log_text.strip().splitlines()[-5:]
    return {"type": "LaunchFailed", "message": f"torchrun exited with code {returncode}: " + " | ".join(tail),
            "rank": None}


def launch_run(run: RunConfig, key: str, out_dir: Path, hardware: dict, rdzv: Rendezvous,
               peak_tflops: float | None = None, threads: Threads | None = None) -> RunOutcome:
    """One torchrun for one run; returns when its record (ok or failed) is on disk. threads: the
    sweep's (thread_plan); by default the plan of this run alone."""
    threads = threads or thread_plan([run])[run.sweep_id]
    started_at, t0 = utc_now(), time.perf_counter()
    stem = Path(record_filename({"suite": run.suite, "workload": run.workload, "config": run.to_dict(),
                                 "run_key": key})).stem
    log_dir = out_dir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{stem}.node{rdzv.node_rank}.log"
    final = out_dir / f"{stem}.json"
    before = _fingerprint(final)
    with tempfile.TemporaryDirectory(prefix=f"{WORKDIR_PREFIX}{key}-") as tmp:
        workdir = Path(tmp)
        (workdir / "launcher.pid").write_text(str(os.getpid()))
        (workdir / "run.json").write_text(json.dumps({"run": run.to_dict(), "run_key": key, "out": str(out_dir),
                                                      "peak_tflops": peak_tflops}))
        cmd = torchrun_command(run, key, workdir, rdzv)
        with open(log_path, "w") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True, env=worker_env(run, threads),
                                    preexec_fn=prctl.die_with_this_process(signal.SIGTERM))
            try:
                returncode = proc.wait(timeout=run.train.timeout_s)
                error = None
            except subprocess.TimeoutExpired:
                _kill_run(proc, workdir)
                returncode = proc.returncode
                error = {"type": "Timeout", "rank": None,
                         "message": f"run exceeded train.timeout_s = {run.train.timeout_s:g} s and was killed"}
            except KeyboardInterrupt:
                _kill_run(proc, workdir)
                error = {"type": "Interrupted", "rank": None, "message": "stopped by Ctrl-C"}
                _write_failed(run, key, out_dir, hardware, error, started_at, t0, rdzv)
                raise
            _reap_ranks(workdir)
        if error is None and returncode != 0:
            error = diagnose(returncode, workdir, log_path.read_text(errors="replace"))
    duration = time.perf_counter() - t0
    if error is None and rdzv.node_rank == 0 and not final.exists():
        error = {"type": "NoRecord", "rank": 0, "message": f"workers exited cleanly but wrote no record; see {log_path}"}
    if error is not None:
        error["log"] = str(log_path)
        if rdzv.node_rank == 0 and _fingerprint(final) != before and _keep_written_record(final, out_dir, key, error):
            return RunOutcome(run, key, "ok", str(final), None, duration)
        _write_failed(run, key, out_dir, hardware, error, started_at, t0, rdzv)
        return RunOutcome(run, key, "failed", str(final), error, duration)
    return RunOutcome(run, key, "ok", str(final), None, duration)


def _fingerprint(path: Path) -> tuple | None:
    """Which file is at path now (an atomic rewrite changes the inode); no clocks involved."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def _keep_written_record(final: Path, out_dir: Path, key: str, error: dict) -> bool:
    """Rank 0 wrote this run's ok record, then a rank failed (a crash or hang in process-group
    teardown): the measurement is complete, so it is kept, flagged with what happened after it."""
    try:
        rec = json.loads(final.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if rec.get("status") != "ok" or rec.get("run_key") != key:
        return False
    where = f" on rank {error['rank']}" if error.get("rank") is not None else ""
    rec["flags"] = [*(rec.get("flags") or []), {
        "field": "status", "value": error["type"],
        "reason": f"the workers failed after this record was written ({error['type']}{where}: "
                  f"{error['message'][:300]}; log {error['log']}); the measured figures are complete"}]
    write_record(out_dir, rec)
    return True


def _write_failed(run, key, out_dir, hardware, error, started_at, t0, rdzv) -> None:
    if rdzv.node_rank != 0:
        return
    env = {"hardware": hardware, "world_size": run.world_size, "nodes": run.nodes, **software_versions()}
    write_record(out_dir, failed_record(key, run.to_dict(), env, error, started_at, time.perf_counter() - t0))


def run_suite(suite: Suite, out_dir: str | Path, resume: bool = True, peak_tflops: float | None = None,
              rdzv: Rendezvous = Rendezvous(),
              on_event: Callable[[str, int, int, RunOutcome | RunConfig], None] | None = None) -> list[RunOutcome]:
    """Run every run of the suite in order. on_event(kind, index, total, payload) reports
    'start' (payload: the RunConfig) and 'done' (payload: the RunOutcome)."""
    threads = thread_plan(suite.runs)  # a bad OMP_NUM_THREADS is refused before anything starts
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    prctl.become_subreaper()  # ranks whose torchrun died are re-parented here and reaped
    remove_stale_workdirs()
    hardware = hardware_identity()
    done = ok_run_keys(out_dir) if resume else set()
    outcomes = []
    for i, run in enumerate(suite.runs):
        key = run.run_key(hardware)
        if key in done:
            outcome = RunOutcome(run, key, "skipped")
        elif run.nodes != rdzv.nnodes:
            outcome = RunOutcome(run, key, "not_on_this_node")
        else:
            if on_event:
                on_event("start", i, len(suite.runs), run)
            outcome = launch_run(run, key, out_dir, hardware, rdzv, peak_tflops, threads=threads[run.sweep_id])
        outcomes.append(outcome)
        if on_event:
            on_event("done", i, len(suite.runs), outcome)
    return outcomes
