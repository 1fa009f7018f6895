"""Suite orchestration: one process group per run (and per repeat, `run --repeat N`): torchrun, or the
worker itself for a run of one rank (launch_command); resume, failure isolation, timeouts.

A run that raises, is killed, segfaults or hangs past `train.timeout_s` becomes a failed
record naming the rank and the reason; every process of the run is reaped; the suite goes on.
Ctrl-C / SIGTERM stops the suite after recording the run in progress, and never replaces an ok
record by a failed one. Each run is measured under its lock (runlock.py): one launcher per run; a
run whose lock cannot be taken is skipped, saying why. In a multi-node job node 0 decides each run
and the other nodes follow its decision, so none starts torchrun for a run node 0 skipped.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Callable

from benchsuite import prctl
from benchsuite.config import ConfigError, RunConfig, Suite
from benchsuite.environment import THREADS_SOURCE_VAR, hardware_identity, software_versions
from benchsuite.progress import ProgressLine
from benchsuite.record import (NewerRecordError, failed_record, record_filename, record_id, repeat_of, utc_now,
                               write_record)
from benchsuite.record.io import newer_version_at
from benchsuite.record.names import record_name
from benchsuite.results.decoding import read_record
from benchsuite.results.store import ok_record_ids
from benchsuite.runlock import Follower, Holder, Leader, LockUnavailable, claim, coordinate, pid_alive
from benchsuite.sinks import Sender


@dataclass(frozen=True)
class Rendezvous:
    """Where this launcher sits in a multi-node job (one launcher per node, c10d rendezvous)."""

    nnodes: int = 1
    node_rank: int = 0
    endpoint: str | None = None  # host:port of the c10d store, reachable from every node
    rdzv_id: str = "benchsuite"


class RunStatus(StrEnum):
    """What became of one run of the suite in this launcher."""

    OK = "ok"  # measured; its ok record is on disk
    FAILED = "failed"  # crashed, killed or timed out; recorded failed (or an earlier ok record kept)
    INTERRUPTED = "interrupted"  # Ctrl-C / SIGTERM stopped it; recorded failed (or an earlier ok record kept)
    SKIPPED_RECORDED = "skipped_recorded"  # resume: an ok record of this run key and repeat is already on disk
    SKIPPED_OTHER_NODES = "skipped_other_nodes"  # its `nodes` differs from --nnodes: left to another job
    SKIPPED_LOCKED = "skipped_locked"  # another launcher is measuring it (its lock is held)
    SKIPPED_LOCK_UNAVAILABLE = "skipped_lock_unavailable"  # its lock cannot be taken (RunOutcome.lock: why, the fix)
    SKIPPED_NO_DECISION = "skipped_no_decision"  # node > 0: node 0 gave no decision for it (error); the suite stops


@dataclass
class RunOutcome:
    run: RunConfig
    run_key: str
    status: RunStatus
    record_path: str | None = None
    error: dict | None = None
    duration_s: float = 0.0
    holder: Holder | None = None  # skipped_locked: the launcher measuring the run
    lock: LockUnavailable | None = None  # skipped_lock_unavailable: why its lock cannot be taken, and the fix
    kept_earlier: bool = False  # failed or interrupted: the earlier ok record of this run key stays its result
    interrupted: bool = False  # Ctrl-C / SIGTERM arrived during this run: the suite stops after it
    repeat: int = 0  # which measurement of the run (0 to N-1 of --repeat N)


@dataclass(frozen=True)
class Planned:
    """One measurement of the suite's plan: a run and which repeat of it."""

    run: RunConfig
    repeat: int = 0


def plan(runs: list[RunConfig], repeat: int = 1) -> list[Planned]:
    """Each run `repeat` times, interleaved: every run once, then every run again. Drift over the
    suite's time (temperature, clocks, background load) then spreads over every configuration
    instead of landing on the runs measured last."""
    if repeat < 1:
        raise ValueError(f"repeat must be >= 1, got {repeat}")
    return [Planned(run, r) for r in range(repeat) for run in runs]


def starts_worker_directly(run: RunConfig) -> bool:
    """A run of one rank on one node starts its worker directly, not under torchrun: torchrun's elastic
    agent (a torch import of its own) gives one process nothing it needs (the worker's defaults are
    rank 0 of 1 and it opens no process group), and the launcher keeps the same process group,
    timeout, signals and record."""
    return run.world_size == 1 and run.nodes == 1


def launch_command(run: RunConfig, key: str, workdir: Path, rdzv: Rendezvous) -> list[str]:
    """The worker gets one positional argument, its work folder (run.json inside): torchrun's own
    parser would otherwise claim any --option that abbreviates one of its flags."""
    worker = ["-m", "benchsuite.worker", str(workdir)]
    if starts_worker_directly(run):
        return [sys.executable, *worker]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(run.nproc_per_node),
           "--max-restarts", "0"]
    if run.nodes == 1:
        cmd += ["--standalone", "--nnodes", "1"]
    else:
        cmd += ["--nnodes", str(run.nodes), "--rdzv-backend", "c10d", "--rdzv-endpoint", rdzv.endpoint,
                "--rdzv-id", f"{rdzv.rdzv_id}-{key}"]
    return cmd + worker


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


def key_of(run: RunConfig, hardware: dict, threads: Threads) -> str:
    """The run key a run is measured and recorded under: its resolved config and the hardware it runs on,
    the threads per rank included, so a rerun at another thread count (OMP_NUM_THREADS, another host's
    cores) is another run, measured beside the first, never skipped as already recorded."""
    return run.run_key({**hardware, "threads_per_rank": threads.per_rank})


def worker_env(run: RunConfig, threads: Threads) -> dict:
    """The ranks' environment: the sweep's thread count (torchrun would otherwise pin every
    multi-rank run to one thread per rank), applied by the worker and recorded."""
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = str(threads.per_rank)
    env[THREADS_SOURCE_VAR] = threads.source
    return env


def _kill_run(proc: subprocess.Popen, workdir: Path) -> None:
    """SIGTERM the run's process group (torchrun and its ranks, or the one worker), then SIGKILL
    everything left, ranks included."""
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


def remove_stale_workdirs() -> list[Path]:
    """Remove the work folders of launchers that died without cleaning up (SIGKILL, OOM, power loss).

    Each folder names its launcher in launcher.pid; a folder whose launcher is gone is stale.
    Folders of live launchers, of other users, or without a pid file are left alone.
    """
    removed = []
    for d in Path(tempfile.gettempdir()).glob(f"{WORKDIR_PREFIX}*"):
        with contextlib.suppress(ValueError, OSError):
            if not pid_alive(int((d / "launcher.pid").read_text())):
                shutil.rmtree(d)
                removed.append(d)
    return removed


_FAILURE = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank.*?exitcode\s*:\s*(-?\d+)", re.S)


def _signal_name(code: int) -> str:
    return signal.Signals(code).name if code in signal.valid_signals() else f"signal {code}"


def diagnose(returncode: int, workdir: Path, log_text: str, direct: bool = False) -> dict:
    """The failed record's error. A rank killed by a signal writes nothing and its peers then fail
    on broken collectives, so a signal death is the root cause: the one torchrun names as its
    first observed failure, else any but SIGTERM (torchrun's own way of stopping the survivors).
    Otherwise the earliest exception a rank wrote; otherwise torchrun's own summary. direct: the
    process was the one rank's worker itself (starts_worker_directly), its exit status rank 0's."""
    errors = {}
    for f in workdir.glob("error.*.json"):
        with contextlib.suppress(OSError, json.JSONDecodeError):
            e = json.loads(f.read_text())
            errors[e["rank"]] = e
    if direct:
        deaths, root = [(0, returncode)], (0, returncode)
    else:
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


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT) or SIGTERM stopped the launcher while it waited on a run."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
TICK_S = 0.5  # how often the launcher reads a running run's log for progress lines
_STOP_MESSAGES = {signal.SIGINT: "stopped by SIGINT (Ctrl-C)", signal.SIGTERM: "stopped by SIGTERM"}


class _StopRequest:
    """SIGINT / SIGTERM during one run. The first signal, while the launcher waits on the run,
    raises Interrupted there: the run's processes are stopped and the run is recorded. Every
    later signal, and a first one that arrives while a record is being written, is only noted
    (and said on stderr), so a second Ctrl-C cannot cut that shutdown short and lose the record."""

    def __init__(self):
        self.signum: int | None = None
        self._waiting = False

    def handle(self, signum, frame) -> None:
        first = self.signum is None
        if first:
            self.signum = signum
        if first and self._waiting:
            raise Interrupted(signum)
        os.write(2, b"benchsuite: stopping: the run in progress is being stopped and recorded, then the suite ends\n")

    def wait(self, proc: subprocess.Popen, timeout: float, tick: Callable[[], None]) -> int:
        """proc.wait, interruptible by the first stop signal (also one that came before it);
        tick() every TICK_S while it waits."""
        self._waiting = True
        deadline = time.monotonic() + timeout
        try:
            if self.signum is not None:
                raise Interrupted(self.signum)
            while True:
                try:
                    return proc.wait(timeout=max(0.0, min(TICK_S, deadline - time.monotonic())))
                except subprocess.TimeoutExpired:
                    if time.monotonic() >= deadline:
                        raise
                tick()
        finally:
            self._waiting = False

    @property
    def message(self) -> str:
        return _STOP_MESSAGES.get(self.signum, f"stopped by {_signal_name(self.signum)}")


@contextlib.contextmanager
def _stop_signals():
    """A _StopRequest handles SIGINT and SIGTERM for the block (signals exist in the main thread only).
    Once a stop was requested its handler stays: the suite is ending, and a later signal must not
    break off the outcome and the messages still to be written."""
    stop = _StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    previous = {s: signal.signal(s, stop.handle) for s in STOP_SIGNALS}
    try:
        yield stop
    finally:
        if stop.signum is None:
            for s, handler in previous.items():
                signal.signal(s, handler)


def record_path(out_dir: Path, run: RunConfig, key: str, repeat: int = 0) -> Path:
    """Where this repeat of the run puts its record (the file name write_record gives it)."""
    return out_dir / record_filename({"suite": run.suite, "workload": run.workload, "config": run.to_dict(),
                                      "run_key": key, "repeat": repeat})


def log_stem(final: Path, key: str, repeat: int, node_rank: int) -> str:
    """'suite__dense__w2n1-weak-seed1-r0__KEY.node0': the record's name (final) with the repeat always
    said, so `ls DIR/logs` shows each log's workload, seed and repeat; the run key keeps it unique and
    the node tells the launchers of a multi-node job apart. The log is STEM.log, its JSON-lines twin STEM.jsonl."""
    run_part = final.stem.removesuffix(f"__{record_id(key, repeat)}")
    return f"{run_part}-r{repeat}__{key}.node{node_rank}"


def _open_log(log_dir: Path, name: str):
    """The run's log, opened for writing without ever following a symlink: a link planted at the
    log's name (or a logs folder that is itself a link) cannot redirect the write elsewhere; a
    planted link is removed (the link, never what it points to) and a fresh file created."""
    log_dir.mkdir(parents=True, exist_ok=True)
    try:
        dir_fd = os.open(log_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as e:
        raise OSError(e.errno, f"{log_dir}: not a plain folder ({e.strerror}); remove it so logs can be "
                               "written there") from None
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=dir_fd)
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666,
                     dir_fd=dir_fd)
    finally:
        os.close(dir_fd)
    return os.fdopen(fd, "w")


class LogTail:
    """The progress lines (progress.py) a growing log gained since the last read."""

    def __init__(self, path: Path):
        self._file = open(path, "rb")  # kept open while the run writes it
        self._partial = b""

    def new_lines(self) -> list[ProgressLine]:
        lines = (self._partial + self._file.read()).split(b"\n")
        self._partial = lines.pop()  # an unfinished line waits for its end
        parsed = (ProgressLine.parse(line.decode(errors="replace").rstrip("\r")) for line in lines)
        return [p for p in parsed if p is not None]

    def close(self) -> None:
        self._file.close()


def launch_run(run: RunConfig, key: str, out_dir: Path, hardware: dict, rdzv: Rendezvous,
               peak_tflops: float | None = None, threads: Threads | None = None,
               on_progress: Callable[[ProgressLine], None] | None = None, repeat: int = 0,
               constants: Path | None = None) -> RunOutcome:
    """One torchrun for one repeat of a run; returns when its record (ok or failed) is on disk, also
    after Ctrl-C / SIGTERM (then the outcome says interrupted and the suite stops). threads: the
    sweep's (thread_plan); by default the plan of this run alone. on_progress gets each progress
    line of the run's log while it runs. constants: the suite's folder of host constants
    (suite_constants.py); without it the ranks measure each one."""
    on_progress = on_progress or (lambda line: None)
    threads = threads or thread_plan([run])[run.sweep_id]
    started_at, t0 = utc_now(), time.perf_counter()
    final = record_path(out_dir, run, key, repeat)
    rid = record_id(key, repeat)
    stem = log_stem(final, key, repeat, rdzv.node_rank)
    log_name, json_log_name = f"{stem}.log", f"{stem}.jsonl"
    log_path = out_dir / "logs" / log_name
    _open_log(out_dir / "logs", json_log_name).close()  # created here, safely; the ranks append to it
    before = _fingerprint(final)
    with _stop_signals() as stop, tempfile.TemporaryDirectory(prefix=f"{WORKDIR_PREFIX}{rid}-") as tmp:
        workdir = Path(tmp)
        (workdir / "launcher.pid").write_text(str(os.getpid()))
        (workdir / "run.json").write_text(json.dumps({"run": run.to_dict(), "run_key": key, "repeat": repeat,
                                                      "out": str(out_dir), "peak_tflops": peak_tflops,
                                                      "log_json": str(out_dir / "logs" / json_log_name),
                                                      "suite_constants": str(constants) if constants else None,
                                                      "record_name": final.stem,
                                                      # the record's start and duration count from here: the
                                                      # monotonic clock is one clock for every process of a host
                                                      "launched_at": started_at, "launched_monotonic_s": t0}))
        error = _run_ranks(run, launch_command(run, rid, workdir, rdzv), workdir, out_dir / "logs", log_name,
                           threads, stop, on_progress)
        if error is None and rdzv.node_rank == 0 and not final.exists():
            error = {"type": "NoRecord", "rank": 0,
                     "message": f"workers exited cleanly but wrote no record; see {log_path}"}
        outcome = RunOutcome(run, key, RunStatus.OK, str(final), None)
        if error is not None:
            error["log"] = str(log_path)
            failed = _failed_record(run, key, hardware, error, started_at, t0, repeat)
            outcome = _settle_failure(run, key, final, failed, rdzv, written=_fingerprint(final) != before)
        outcome.duration_s = time.perf_counter() - t0
        outcome.repeat = repeat
        outcome.interrupted = stop.signum is not None
    return outcome


def _run_ranks(run: RunConfig, cmd: list[str], workdir: Path, logs: Path, log_name: str, threads: Threads,
               stop: _StopRequest, on_progress: Callable[[ProgressLine], None]) -> dict | None:
    """Start the run's processes (its own session, dying with this launcher), pass on each progress line of
    its log while it runs, and wait: the run's error (a timeout, an interruption, a crash diagnosed from its
    exit code and log), or None when it exited cleanly. No process of it is left running."""
    log_path = logs / log_name
    with _open_log(logs, log_name) as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=worker_env(run, threads),
                                preexec_fn=prctl.die_with_this_process(signal.SIGTERM))
        tail = LogTail(log_path)

        def report_progress() -> None:
            for line in tail.new_lines():
                on_progress(line)

        error = None
        try:
            returncode = stop.wait(proc, run.train.timeout_s, tick=report_progress)
        except subprocess.TimeoutExpired:
            _kill_run(proc, workdir)
            returncode = proc.returncode
            error = {"type": "Timeout", "rank": None,
                     "message": f"run exceeded train.timeout_s = {run.train.timeout_s:g} s and was killed"}
        except Interrupted:
            _kill_run(proc, workdir)
            returncode = proc.returncode
            error = {"type": "Interrupted", "rank": None, "message": stop.message}
        _reap_ranks(workdir)
        report_progress()  # the lines written since the last tick
        tail.close()
    if error is None and returncode != 0:
        error = diagnose(returncode, workdir, log_path.read_text(errors="replace"), starts_worker_directly(run))
    return error


def _settle_failure(run: RunConfig, key: str, final: Path, failed: dict, rdzv: Rendezvous,
                    written: bool) -> RunOutcome:
    """The run failed or was interrupted. An ok record of this run key on disk is never replaced by
    a failed one: written by this run (the figures are complete) it stays ok, flagged with what
    happened after it; written earlier (a --no-resume rerun) it stays the run's result and this
    attempt is not recorded (its log is kept). Otherwise the failed record is written."""
    error = failed["error"]
    status = RunStatus.INTERRUPTED if error["type"] == "Interrupted" else RunStatus.FAILED
    if rdzv.node_rank != 0:  # node 0 writes the records
        return RunOutcome(run, key, status, None, error)
    rec = _ok_record_on_disk(final, key, failed["repeat"])
    if rec is not None and written:
        _flag_written_record(rec, final.parent, error)
        return RunOutcome(run, key, RunStatus.OK, str(final), None)
    if rec is not None:
        return RunOutcome(run, key, status, str(final), error, kept_earlier=True)
    write_record(final.parent, failed)
    return RunOutcome(run, key, status, str(final), error)


def _fingerprint(path: Path) -> tuple | None:
    """Which file is at path now (an atomic rewrite changes the inode); no clocks involved."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def _ok_record_on_disk(final: Path, key: str, repeat: int) -> dict | None:
    """The ok record of this run key and repeat at final, if that is what is there (never reads a FIFO
    or device)."""
    if not final.is_file():
        return None
    try:
        rec = json.loads(final.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(rec, dict) or rec.get("status") != "ok" or rec.get("run_key") != key:
        return None
    if repeat_of(rec) != repeat:
        return None
    return rec


def _flag_written_record(rec: dict, out_dir: Path, error: dict) -> None:
    """Rank 0 wrote this run's ok record, then a rank failed (a crash or hang in process-group
    teardown) or the launcher was interrupted: the measurement is complete, so it is kept,
    flagged with what happened after it."""
    where = f" on rank {error['rank']}" if error.get("rank") is not None else ""
    rec["flags"] = [*(rec.get("flags") or []), {
        "field": "status", "value": error["type"],
        "reason": f"the run ended badly after this record was written ({error['type']}{where}: "
                  f"{error['message'][:300]}; log {error['log']}); the measured figures are complete"}]
    write_record(out_dir, rec)


def _failed_record(run: RunConfig, key: str, hardware: dict, error: dict, started_at: str, t0: float,
                   repeat: int) -> dict:
    env = {"hardware": hardware, "world_size": run.world_size, "nodes": run.nodes, **software_versions()}
    return failed_record(key, run.to_dict(), env, error, started_at, time.perf_counter() - t0, repeat)


def run_suite(suite: Suite, out_dir: str | Path, resume: bool = True, peak_tflops: float | None = None,
              rdzv: Rendezvous = Rendezvous(),
              on_event: Callable[[str, int, int, RunOutcome | RunConfig], None] | None = None,
              repeat: int = 1) -> list[RunOutcome]:
    """Measure every run of the suite `repeat` times in the order of plan() (each repeat its own
    record), until one is interrupted (Ctrl-C, SIGTERM). Resume skips each repeat recorded ok, so a
    larger `repeat` later measures only the repeats still missing. on_event(kind, index, total,
    payload), index into plan(suite.runs, repeat), reports 'start' (payload: the RunConfig),
    'progress' (payload: a ProgressLine of the run's log, while it runs) and 'done' (payload: the
    RunOutcome)."""
    on_event = on_event or (lambda kind, index, total, payload: None)
    planned = plan(suite.runs, repeat)
    threads = thread_plan(suite.runs)  # a bad OMP_NUM_THREADS is refused before anything starts
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    hardware = hardware_identity()
    for p in planned:  # a newer benchsuite's record is never measured over (NewerRecordError names it)
        path = record_path(out_dir, p.run, key_of(p.run, hardware, threads[p.run.sweep_id]), p.repeat)
        version = newer_version_at(path)
        if version is not None:
            raise NewerRecordError(version, path)
    prctl.become_subreaper()  # ranks whose torchrun died are re-parented here and reaped
    remove_stale_workdirs()
    done = ok_record_ids(out_dir) if resume else set()
    sender = Sender(suite.sinks, out_dir)
    outcomes = []
    with coordinate(out_dir, rdzv.rdzv_id, rdzv.endpoint, rdzv.nnodes, rdzv.node_rank) as nodes, \
            _suite_folder() as constants:
        for i, (run, rep) in enumerate((p.run, p.repeat) for p in planned):
            key = key_of(run, hardware, threads[run.sweep_id])
            rid = record_id(key, rep)

            def launch() -> RunOutcome:
                on_event("start", i, len(planned), run)
                return launch_run(run, key, out_dir, hardware, rdzv, peak_tflops, threads=threads[run.sweep_id],
                                  on_progress=lambda line: on_event("progress", i, len(planned), line), repeat=rep,
                                  constants=constants)

            if run.nodes != rdzv.nnodes:
                status = RunStatus.SKIPPED_RECORDED if rid in done else RunStatus.SKIPPED_OTHER_NODES
                outcome = RunOutcome(run, key, status, repeat=rep, record_path=str(record_path(out_dir, run, key, rep))
                                     if rid in done else None)
            elif isinstance(nodes, Follower):
                outcome = _follow_node0(nodes, i, run, key, rep, launch)
            else:
                outcome = _claim_and_launch(run, key, rep, out_dir, resume, rid in done, launch,
                                            tell=functools.partial(_tell, nodes, i, rid))
            outcomes.append(outcome)
            if outcome.status == RunStatus.OK and suite.sinks.chosen() and not isinstance(nodes, Follower):
                sender.send(read_record(Path(outcome.record_path)), record_name(run.label, run.train.seed, rep),
                            Path(outcome.record_path))
            on_event("done", i, len(planned), outcome)
            if outcome.interrupted or outcome.status == RunStatus.SKIPPED_NO_DECISION:
                break
    return outcomes


@contextlib.contextmanager
def _suite_folder():
    """The folder of the suite's host constants (suite_constants.py), for as long as the suite runs;
    named like a run's work folder, so a launcher that dies leaves nothing remove_stale_workdirs keeps."""
    with tempfile.TemporaryDirectory(prefix=f"{WORKDIR_PREFIX}suite-") as tmp:
        (Path(tmp) / "launcher.pid").write_text(str(os.getpid()))
        yield Path(tmp)


def _claim_and_launch(run: RunConfig, key: str, repeat: int, out_dir: Path, resume: bool, recorded: bool,
                      launch: Callable[[], RunOutcome], tell: Callable[[RunOutcome | None], None]) -> RunOutcome:
    """Node 0 (or the only node) decides the run's repeat and tells the other nodes (tell: the skip, or
    None before it starts). A repeat recorded ok is skipped; otherwise node 0 holds its lock for the
    whole run: a repeat another launcher is measuring, or whose lock cannot be taken, is skipped, and one
    another launcher finished since this suite began (its ok record is there now) is not measured again."""
    if recorded:
        outcome = RunOutcome(run, key, RunStatus.SKIPPED_RECORDED, repeat=repeat,
                             record_path=str(record_path(out_dir, run, key, repeat)))
        tell(outcome)
        return outcome
    rid = record_id(key, repeat)
    with claim(out_dir, rid) as got:
        final = record_path(out_dir, run, key, repeat)
        if isinstance(got, Holder):
            skip = RunOutcome(run, key, RunStatus.SKIPPED_LOCKED, holder=got, repeat=repeat)
        elif isinstance(got, LockUnavailable):
            skip = RunOutcome(run, key, RunStatus.SKIPPED_LOCK_UNAVAILABLE, lock=got, repeat=repeat)
        elif resume and rid in ok_record_ids(final):
            skip = RunOutcome(run, key, RunStatus.SKIPPED_RECORDED, str(final), repeat=repeat)
        else:
            skip = None
        tell(skip)
        return skip or launch()


def _tell(leader: Leader | None, index: int, rid: str, skip: RunOutcome | None) -> None:
    """Node 0 tells the other nodes its decision for the run at index (nothing to tell in a one-node job)."""
    if leader is None:
        return
    if skip is None:
        leader.tell(index, {"rid": rid, "status": "start"})
        return
    leader.tell(index, {"rid": rid, "status": skip.status.value, "record": skip.record_path,
                        "holder": dataclasses.asdict(skip.holder) if skip.holder else None,
                        "lock": dataclasses.asdict(skip.lock) if skip.lock else None})


def _follow_node0(follower: Follower, index: int, run: RunConfig, key: str, repeat: int,
                  launch: Callable[[], RunOutcome]) -> RunOutcome:
    """A node > 0 starts torchrun for a run only when node 0 did (it would otherwise wait for a
    rendezvous that never comes, until the timeout), and skips it as node 0 did. With no decision
    (node 0 ended or died, or runs another plan) it stops its suite."""
    decision = follower.hear(index)
    rid = record_id(key, repeat)
    if isinstance(decision, dict) and decision.get("rid") != rid:
        decision = (f"node 0 planned another run here ({decision.get('rid')}, this node {rid}): start every node "
                    "with the same suite and --repeat, on the same hardware")
    if isinstance(decision, str):
        return RunOutcome(run, key, RunStatus.SKIPPED_NO_DECISION, repeat=repeat,
                          error={"type": "NoDecision", "message": decision, "rank": None})
    if decision["status"] == "start":
        return launch()
    return RunOutcome(run, key, RunStatus(decision["status"]), decision.get("record"), repeat=repeat,
                      holder=Holder(**decision["holder"]) if decision.get("holder") else None,
                      lock=LockUnavailable(**decision["lock"]) if decision.get("lock") else None)
