"""Injected faults with real processes (gloo, tiny models): a segfaulting rank, the launcher
interrupted and SIGKILLed mid-suite then resumed, a full disk while a record is written, sensors
failing mid-window, damaged records in the results folder, two suites writing one folder at once.

After each: the records completed before are intact and load, no partial file is visible, the
failed run has a clear status, and no process of the run is left behind.
(test_harness.py covers a raising, a SIGKILLed and a hanging rank; test_store.py a writer killed
mid-write; test_energy_meters.py the counter and RAPL failing at window end.)
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from benchsuite import cli
from benchsuite.config import load_suite
from benchsuite.record import SCHEMA_VERSION
from benchsuite.record import write_record
from helpers import REPO, processes_matching, run_cli
from helpers.escaping import assert_site_escapes, assert_terminal_safe
from helpers.launcher import CLI, rank_started, run_keys, strict_load, wait_for, workdirs
from helpers.meters import FIXED, UUIDS, FakeGpus, make_zone, torch_uuids
from helpers.records import make_record


def no_orphans(key: str, timeout: float = 15.0) -> None:
    """Every process of the run (torchrun and its ranks) is gone within timeout."""
    wait_for(lambda: not processes_matching(f"benchsuite-{key}"), timeout,
             f"the processes of run {key} to exit: {processes_matching(f'benchsuite-{key}')}")


# ----------------------------------------------------------------------------- the launcher


def start_launcher(suite, out, fault: str, *args: str) -> subprocess.Popen:
    """A real `benchsuite run` in the background with BENCHSUITE_INJECT_FAULT=fault (e.g. hang:1)."""
    return subprocess.Popen(CLI + ["run", str(suite), "--out", str(out), *args], cwd=REPO, text=True,
                            env={**os.environ, "BENCHSUITE_INJECT_FAULT": fault},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


@pytest.mark.procs
def test_launcher_interrupted_then_killed_mid_suite_then_resumed(tmp_path, tiny_suite, reap):
    """Ctrl-C (SIGINT) mid-run: exit 130, the finished run kept, the interrupted one recorded failed,
    no orphans. Then SIGKILL of the launcher mid-run: nothing can be written, but the ranks die with it
    and the records on disk are untouched. Then a plain rerun skips the done run and completes the rest."""
    suite = tiny_suite(name="chain", world_sizes=(1, 2), timeout=120)
    out = tmp_path / "out"
    k1, k2 = run_keys(suite)
    reap += [k1, k2]
    hang = {**os.environ, "BENCHSUITE_INJECT_FAULT": "hang:1"}  # only world 2 has a rank 1

    old = workdirs(k2)
    launcher = start_launcher(suite, out, "hang:1")
    wait_for(lambda: rank_started(k2, 1, old), 120, "the second run's rank 1")
    launcher.send_signal(signal.SIGINT)
    _, err = launcher.communicate(timeout=60)
    assert launcher.returncode == 130, err
    assert "Traceback" not in err and "interrupted" in err
    recs = {key: one.record for key, one in strict_load(out).items()}
    assert recs[k1].status == "ok" and recs[k1].metrics.tokens_per_s > 0
    assert recs[k2].status == "failed" and recs[k2].error.type == "Interrupted"
    no_orphans(k2)
    before = {p.name: p.read_bytes() for p in out.glob("*.json")}

    old = workdirs(k2)
    launcher = subprocess.Popen(CLI + ["run", str(suite), "--out", str(out)], env=hang, cwd=REPO,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(lambda: rank_started(k2, 1, old), 120, "the second run's rank 1, resumed")
    stale = workdirs(k2) - old  # taken before the kill: a launcher of a test beside this one may reap it after
    assert len(stale) == 1
    launcher.kill()
    launcher.wait(timeout=30)
    no_orphans(k2)  # torchrun dies with its launcher, and the ranks with torchrun
    assert {p.name: p.read_bytes() for p in out.glob("*.json")} == before

    res = run_cli("run", str(suite), "--out", str(out), "--json", timeout=240)
    assert res.returncode == 0, res.stderr
    assert not any(d.exists() for d in stale), "the next run removes the dead launcher's work folder"
    assert [r["status"] for r in json.loads(res.stdout)["runs"]] == ["skipped_recorded", "ok"]
    recs = strict_load(out)
    assert recs[k1].record.status == recs[k2].record.status == "ok"
    assert (out / recs[k1].path.name).read_bytes() == before[recs[k1].path.name]
    assert len(recs) == 2


@pytest.mark.procs
def test_only_work_folders_of_dead_launchers_are_removed(tmp_path, monkeypatch):
    from benchsuite.launch import remove_stale_workdirs

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = subprocess.Popen(["true"])
    dead.wait()
    folders = {name: tmp_path / f"benchsuite-{name}" for name in ("dead", "live", "nopid", "garbage")}
    for d in folders.values():
        d.mkdir()
    (folders["dead"] / "launcher.pid").write_text(str(dead.pid))
    (folders["live"] / "launcher.pid").write_text(str(os.getpid()))
    (folders["garbage"] / "launcher.pid").write_text("not a pid")
    assert remove_stale_workdirs() == [folders["dead"]]
    assert sorted(d.name for d in tmp_path.iterdir()) == ["benchsuite-garbage", "benchsuite-live", "benchsuite-nopid"]


def launch_hung_at_rank_1(suite, tmp_path, reap) -> tuple[str, Path, subprocess.Popen]:
    """A real `benchsuite run` of a one-run suite whose rank 1 hangs, returned once rank 1 has started."""
    out = tmp_path / "out"
    (key,) = run_keys(suite)
    reap.append(key)
    old = workdirs(key)
    launcher = start_launcher(suite, out, "hang:1")
    wait_for(lambda: rank_started(key, 1, old), 120, "rank 1")
    return key, out, launcher


@pytest.mark.procs
def test_sigterm_to_the_launcher_stops_the_suite_like_ctrl_c(tmp_path, tiny_suite, reap):
    """scancel and job time limits send SIGTERM: the run in progress is recorded interrupted, no orphans."""
    suite = tiny_suite(name="term", world_sizes=(2,), timeout=120)
    key, out, launcher = launch_hung_at_rank_1(suite, tmp_path, reap)
    launcher.send_signal(signal.SIGTERM)
    _, err = launcher.communicate(timeout=60)
    assert launcher.returncode == 130, err
    assert strict_load(out)[key].record.error.type == "Interrupted"
    no_orphans(key)


@pytest.mark.procs
def test_an_interrupt_never_destroys_a_measurement_neither_this_runs_nor_an_earlier_one(tmp_path, tiny_suite,
                                                                                        reap):
    """Ctrl-C after rank 0 wrote the ok record (a rank then hangs in teardown): the record stays ok, its
    figures intact, flagged with the interruption. Then a --no-resume rerun interrupted mid-measurement:
    the earlier ok record is kept byte for byte and stays the run's result for resume and report."""
    suite = tiny_suite(name="keep", world_sizes=(1,), timeout=120)
    out = tmp_path / "out"
    (key,) = run_keys(suite)
    reap.append(key)
    launcher = start_launcher(suite, out, "hang_at_exit:0")
    record = wait_for(lambda: next(iter(out.glob("*.json")), None), 120, "the run's ok record")
    launcher.send_signal(signal.SIGINT)
    _, err = launcher.communicate(timeout=60)
    assert launcher.returncode == 130, err
    rec = strict_load(out)[key].record
    assert rec.status == "ok" and rec.error is None and len(rec.steps) == 3
    assert rec.metrics.tokens_per_s > 0
    (flag,) = [f for f in rec.flags if f.field == "status"]
    assert flag.value == "Interrupted" and "stopped by SIGINT (Ctrl-C)" in flag.reason
    no_orphans(key)

    kept = record.read_bytes()
    old = workdirs(key)
    launcher = start_launcher(suite, out, "hang:0", "--no-resume")
    wait_for(lambda: rank_started(key, 0, old), 120, "the rerun's rank 0")
    launcher.send_signal(signal.SIGINT)
    _, err = launcher.communicate(timeout=60)
    assert launcher.returncode == 130, err
    assert "interrupted (stopped by SIGINT (Ctrl-C)); the earlier ok record is kept" in err
    assert [p.name for p in out.glob("*.json")] == [record.name] and record.read_bytes() == kept
    no_orphans(key)
    res = run_cli("run", str(suite), "--out", str(out), "--json", timeout=120)
    assert res.returncode == 0 and [r["status"] for r in json.loads(res.stdout)["runs"]] == ["skipped_recorded"]
    report = run_cli("report", str(out), "--json", timeout=60)
    assert [(r["run_key"], r["status"]) for r in json.loads(report.stdout)["runs"]] == [(key, "ok")]


@pytest.mark.procs
def test_ctrl_c_pressed_again_and_again_during_shutdown_still_records_the_run_and_leaves_no_process(
        tmp_path, tiny_suite, reap):
    """Impatient users press Ctrl-C repeatedly: the later presses are only acknowledged, the run's
    processes are still stopped and the interrupted run is still recorded."""
    suite = tiny_suite(name="again", world_sizes=(2,), timeout=120)
    key, out, launcher = launch_hung_at_rank_1(suite, tmp_path, reap)
    deadline = time.monotonic() + 60
    while launcher.poll() is None and time.monotonic() < deadline:
        launcher.send_signal(signal.SIGINT)
        time.sleep(0.02)
    _, err = launcher.communicate(timeout=30)
    one = strict_load(out).get(key)
    assert one and one.record.status == "failed" and one.record.error.type == "Interrupted", err
    assert launcher.returncode == 130, err
    assert "Traceback" not in err and "benchsuite: stopping" in err
    no_orphans(key)


@pytest.mark.procs
def test_a_symlink_planted_in_the_logs_folder_is_never_written_through(tmp_path, tiny_suite):
    """A link planted at the log's name (pointing at a user's file outside) must not let the run
    truncate or write that file."""
    suite = tiny_suite(name="links", world_sizes=(1,))
    out, outside = tmp_path / "out", tmp_path / "precious.txt"
    outside.write_text("a user's file\n")
    from benchsuite.launch import log_stem
    from benchsuite.record import record_filename

    (run,) = load_suite(suite).runs
    (key,) = run_keys(suite)
    name = record_filename({"suite": run.suite, "workload": run.workload, "config": run.to_dict(), "run_key": key})
    log = out / "logs" / f"{log_stem(out / name, key, repeat=0, node_rank=0)}.log"
    log.parent.mkdir(parents=True)
    log.symlink_to(outside)
    res = run_cli("run", str(suite), "--out", str(out), "--json", timeout=120)
    assert res.returncode == 0, res.stderr
    assert outside.read_text() == "a user's file\n"
    assert log.is_file() and not log.is_symlink()  # the link was replaced by the run's own log


HOSTILE_SUITE = """
[suite]
name = "{name}"
description = "\\"><svg onload=alert(2)> [bold]markup[/bold]"

[defaults]
model = {{ layers = 1, hidden = 32, heads = 2, vocab = 128, seq_len = 16 }}
train = {{ micro_batch = 2, steps = 3, warmup_steps = 2, timeout_s = 120 }}

[[workload]]
name = "{workload}"
description = "<b onmouseover=alert(3)>desc</b>"

[sweep]
world_size = [{world}]
"""
XSS_SUITE = '<script>alert(\\"suite\\")</script> [red]x[/red] ]0;pwned'  # visible: a name holds no control character
XSS_WORKLOAD = "<img src=x onerror=alert(1)>"


@pytest.mark.procs
def test_two_suites_write_one_folder_at_once_one_segfaulting(tmp_path, reap):
    """Two `benchsuite run` at once into one folder (one of them has a rank die from SIGSEGV): every
    record lands whole and loads; the crash is a clear failed record; the report and the dashboard
    built from this folder show the hostile names the suites were given as text, never as markup."""
    a = tmp_path / "a.toml"
    a.write_text(HOSTILE_SUITE.format(name=XSS_SUITE, workload=XSS_WORKLOAD, world=1))
    b = tmp_path / "b.toml"
    b.write_text(HOSTILE_SUITE.format(name="other", workload="seg", world=2))
    out = tmp_path / "out"
    (ka,), (kb,) = run_keys(a), run_keys(b)
    reap += [ka, kb]
    procs = [subprocess.Popen(CLI + ["run", str(s), "--out", str(out), "--json"], cwd=REPO, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env={**os.environ, **({"BENCHSUITE_INJECT_FAULT": "segv:1"} if s == b else {})})
             for s in (a, b)]
    results = [p.communicate(timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [0, 1], results
    assert [json.loads(o)["runs"][0]["status"] for o, _ in results] == ["ok", "failed"]
    recs = {key: one.record for key, one in strict_load(out).items()}
    assert set(recs) == {ka, kb}
    assert recs[ka].status == "ok" and recs[ka].suite == json.loads(f'"{XSS_SUITE}"')
    err = recs[kb].error
    assert recs[kb].status == "failed" and err.type == "WorkerKilled" and err.rank == 1
    assert "rank 1 died from SIGSEGV (segmentation fault)" in err.message
    no_orphans(ka)
    no_orphans(kb)

    report = run_cli("report", str(out), env={"COLUMNS": "400"}, timeout=60)
    assert report.returncode == 0, report.stderr
    assert_terminal_safe(report.stdout)
    assert "[red]x[/red]" in report.stdout  # rich markup in a name is shown, not applied
    # (a workload's description replaces the suite's in its runs' records)
    assert_site_escapes(out, tmp_path / "site", [json.loads(f'"{XSS_SUITE}"'), XSS_WORKLOAD,
                                                 "<b onmouseover=alert(3)>desc</b>"])


# ----------------------------------------------------------------------------- a full disk

DISK_FULL = """
import json, resource, signal, sys
from benchsuite.record import write_record
out, rec = sys.argv[1], json.load(open(sys.argv[2]))
write_record(out, rec)                       # the previous, complete record
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # so a write past the limit fails with EFBIG instead
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
rec["steps"] = [{"step": i, "time_s": 0.5, "loss": 1.0, "tokens": 8} for i in range(2000)]
try:
    write_record(out, rec)                   # same run key: it would replace the previous file
except OSError as e:
    print(json.dumps({"errno": e.errno, "message": str(e)}))
    sys.exit(3)
"""


def _record(run_key="k1", status="ok", steps=3):
    return make_record(run_key, status=status, steps=steps)


@pytest.mark.procs
def test_disk_full_while_writing_a_record_keeps_the_previous_one_and_says_why(tmp_path):
    out, src = tmp_path / "out", tmp_path / "rec.json"
    src.write_text(json.dumps(_record()))
    res = subprocess.run([sys.executable, "-c", DISK_FULL, str(out), str(src)], capture_output=True, text=True,
                         cwd=REPO, timeout=60)
    assert res.returncode == 3, res.stderr
    failure = json.loads(res.stdout)
    assert failure["errno"] == errno.EFBIG
    assert "cannot write record" in failure["message"] and str(out) in failure["message"]
    (one,) = strict_load(out).values()
    assert len(one.record.steps) == 3  # the previous record, whole
    assert [p.name for p in out.iterdir()] == [one.path.name]  # no temp file left behind


def test_disk_full_mid_suite_is_a_clear_error_not_a_traceback(tmp_path, tiny_suite, monkeypatch, capsys):
    """The launcher cannot even record a failure when the disk is full: the CLI names the path and the fix
    (exit 2, as every verb whose output cannot be written) and keeps what is on disk; nothing is raised at
    the user."""
    from benchsuite import launch

    suite = tiny_suite(name="full", world_sizes=(1, 2))
    out = tmp_path / "out"
    calls = []

    def fake_launch(run, key, out_dir, hardware, rdzv, peak_tflops=None, threads=None, on_progress=None, repeat=0,
                    constants=None):
        calls.append(key)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, f"cannot write record {out_dir}/x.json: No space left on device")
        rec = {**_record(key), "config": {**run.to_dict()}, "suite": run.suite, "workload": run.workload}
        return launch.RunOutcome(run, key, launch.RunStatus.OK, str(write_record(out_dir, rec)), None, 0.1)

    monkeypatch.setattr(launch, "launch_run", fake_launch)
    assert cli.main(["run", str(suite), "--out", str(out)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "No space left on device" in err and "rerun the same command to resume" in err
    assert "free space on that file system" in err and "Traceback" not in err
    assert list(strict_load(out)) == calls[:1]


# ----------------------------------------------------------------------------- damaged results


@pytest.mark.procs
def test_report_and_list_work_over_corrupt_truncated_and_future_records_and_name_them(tmp_path):
    write_record(tmp_path, _record("good"))
    (tmp_path / "truncated.json").write_text(json.dumps(_record("t"))[:60])
    (tmp_path / "future.json").write_text(json.dumps({**_record("f"), "schema_version": SCHEMA_VERSION + 1}))
    (tmp_path / "binary.json").write_bytes(b"\xff\xfe\x00garbage")
    (tmp_path / "no-fields.json").write_text('{"run_key": "x"}')
    res = run_cli("report", str(tmp_path), timeout=60)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    for name in ("truncated.json", "future.json", "binary.json", "no-fields.json"):
        assert name in res.stderr, name
    assert "newer than this benchsuite reads" in res.stderr
    assert "good" not in res.stderr and "ok" in res.stdout
    rows = json.loads(run_cli("report", str(tmp_path), "--json", timeout=60).stdout)["runs"]
    assert [r["run_key"] for r in rows] == ["good"]


# ----------------------------------------------------------------------------- sensors mid-window


def test_nvml_counter_failing_at_window_start_is_unavailable_or_sampled_with_the_reason():
    from benchsuite.energy import nvml

    gpus = FakeGpus()
    with torch_uuids({0: UUIDS["h0"]}):
        plain = nvml.NvmlGpuMeter(0, lib=gpus.lib)
        sampled = nvml.NvmlGpuMeter(0, lib=gpus.lib, sample_power=True, interval_s=0.005)
    gpus.fail_counter = True
    plain.begin("w")
    sampled.begin("w")
    gpus.fail_counter = False  # the driver came back: the window still has no start reading
    time.sleep(0.03)
    fig = plain.end("w")
    assert fig.source == "unavailable" and fig.energy_j is None and "counter failed at window start" in fig.reason
    fig = sampled.end("w")
    assert fig.source == "sampled" and fig.energy_j > 0 and "counter failed at window start" in fig.reason


def test_nvml_counter_reset_mid_window_is_never_a_negative_figure():
    """A GPU reset or driver reload restarts the total-energy counter: end < start must not become
    negative joules; the window falls back to the power samples, else is unavailable with the reason."""
    from benchsuite.energy import nvml

    gpus = FakeGpus()
    with torch_uuids({0: UUIDS["h0"]}):
        plain = nvml.NvmlGpuMeter(0, lib=gpus.lib)
        sampled = nvml.NvmlGpuMeter(0, lib=gpus.lib, sample_power=True, interval_s=0.005)
    plain.begin("w")
    sampled.begin("w")
    time.sleep(0.03)
    gpus.counter_mj["h0"] = 5  # reset
    fig = plain.end("w")
    assert fig.energy_j is None and fig.source == "unavailable" and "went backwards" in fig.reason
    fig = sampled.end("w")
    assert fig.source == "sampled" and fig.energy_j > 0 and "went backwards" in fig.reason


def test_power_sampler_failing_mid_window_keeps_the_counter_figure():
    from benchsuite.energy import nvml

    gpus = FakeGpus()
    with torch_uuids({0: UUIDS["h0"]}):
        meter = nvml.NvmlGpuMeter(0, lib=gpus.lib, sample_power=True, interval_s=0.005)
    meter.begin("w")
    gpus.lib.nvmlDeviceGetFieldValues.side_effect = pynvml_error()
    time.sleep(0.03)
    fig = meter.end("w")
    # each edge reads until the counter moves (the double adds a step per read): two 1 J steps in the window
    assert fig.source == "measured" and fig.energy_j == pytest.approx(2.0)
    assert fig.sampled_energy_j is None and "power sampl" in fig.reason


def pynvml_error():
    import pynvml

    return pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)


class _FailsAtStart:
    """A GPU meter whose window start raises (driver gone), and whose end then knows no such window."""
    uuid, name, cuda_index = "GPU-flaky", "flaky", 0

    def begin(self, name):
        raise RuntimeError("driver fell over at window start")

    def end(self, name):
        raise KeyError(name)


def test_gpu_meter_raising_at_window_start_names_that_failure():
    from benchsuite.energy.common import EmptyCpuSensor
    from benchsuite.energy.meters import NodeEnergyMonitor

    mon = NodeEnergyMonitor([_FailsAtStart()], EmptyCpuSensor("none"), min_window_s=0.0)
    mon.begin("w")
    r = mon.end("w")
    fig = r.gpus[0].figure
    assert fig.energy_j is None and fig.source == "unavailable"
    assert "driver fell over at window start" in fig.reason


def test_rapl_vanishing_at_window_start_degrades_to_the_estimate(tmp_path):
    from benchsuite.energy import rapl
    from benchsuite.energy.estimate import EstimateSensor
    from benchsuite.energy.meters import FirstAvailable, NodeEnergyMonitor

    root = tmp_path / "powercap"
    make_zone(root / "intel-rapl:0", "package-0", 0)
    make_zone(root / "intel-rapl:0" / "intel-rapl:0:0", "dram", 0)
    mon = NodeEnergyMonitor([], FirstAvailable([rapl.RaplSensor(root), EstimateSensor(FIXED)]), min_window_s=0.0)
    (root / "intel-rapl:0" / "energy_uj").unlink()
    mon.begin("w")
    r = mon.end("w")
    assert r.cpu.source == "estimated" and r.cpu.energy_j > 0
    assert "failed at window start" in r.cpu.reason
