"""benchmarks/gpu_check.py: the GPU check's whole path on CPU (tiny models, no compile), its suite
against workloads/h200.toml, its table's targets, its time budget, and its harness-overhead
comparison timing both loops through the same code."""

import importlib.util
import json
import re
import statistics
import subprocess
import sys
import time

import pytest

from helpers import REPO

from benchsuite.config import load_suite
from benchsuite.metrics.timing import StepTimer


def load_gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "benchmarks" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses resolve their annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def test_harness_and_bare_loop_are_timed_by_the_same_step_timer(tmp_path, monkeypatch):
    """Both loops' step times are StepTimer intervals (CUDA events on a GPU), as many for each; a
    bare loop timed with its own host clock would add no StepTimer reading."""
    gpu_check = load_gpu_check()
    readings = []
    durations = StepTimer.durations_s
    monkeypatch.setattr(StepTimer, "durations_s", lambda self: readings.append(durations(self)) or readings[-1])
    overhead = gpu_check.bare_loop_vs_harness(gpu_check.suite_file(True, tmp_path), rounds=1, steps=4)
    # the last two readings are the loops' own; earlier ones are the harness's step log reading its timer so far
    harness, bare = readings[-2:]
    assert [harness, bare] == [overhead["harness_step_times_s"][0], overhead["bare_step_times_s"][0]]
    assert [len(harness), len(bare)] == [4, 4]
    assert all(harness[:len(r)] == r for r in readings[:-2])
    assert overhead["overhead_ratio"] == statistics.median(harness) / statistics.median(bare)


def run_settings(r):
    return (r.workload, r.kind, r.world_size, r.model, r.train, r.moe, r.parallel)


def test_check_suite_is_h200_toml_s_runs_it_names_in_priority_order(tmp_path):
    """The full check runs exactly the CHECK workloads of workloads/h200.toml with h200.toml's settings
    (world sizes included), most wanted first; --tiny the same workloads and layouts, shrunk and uncompiled."""
    gpu_check = load_gpu_check()
    h200 = [r for r in load_suite(REPO / "workloads" / "h200.toml").runs if r.workload in gpu_check.CHECK]
    full = load_suite(gpu_check.suite_file(False, tmp_path)).runs
    assert sorted(map(run_settings, full), key=str) == sorted(map(run_settings, h200), key=str)
    order = [r.workload for r in full]
    assert order == sorted(order, key=gpu_check.CHECK.index) and set(order) == set(gpu_check.CHECK)
    tiny = load_suite(gpu_check.suite_file(True, tmp_path)).runs
    assert [(r.workload, r.kind, r.world_size, r.moe, r.parallel) for r in tiny] == \
           [(r.workload, r.kind, r.world_size, r.moe, r.parallel) for r in full]
    assert all(not r.train.compile and r.model.hidden == gpu_check.TINY["model"]["hidden"] for r in tiny)
    # what the targets name is all there: dense eager and compiled, the four routers compiled, ZeRO-3 bf16
    routers = {r.moe.router for r in full if r.moe and r.train.compile}
    assert routers == {"switch", "gshard", "expert_choice", "token_choice"}
    zero3 = [r for r in full if r.parallel.zero == 3]
    assert [r.world_size for r in zero3] == [1, 2] and {r.train.precision for r in zero3} == {"bf16"}


def record(workload, mfu=None, dropped=None, nvml=None, window_s=10.0, world=1, speed_valid=True):
    moe = {"dropped_frac": dropped} if dropped is not None else None
    per_device = [{"energy_j": 1000.0 * (1 + nvml), "sampled_energy_j": 1000.0}] if nvml is not None else []
    return {"workload": workload, "status": "ok", "config": {"world_size": world}, "error": None,
            "metrics": {"tokens_per_s": 1234.0, "mfu": mfu, "moe": moe, "matmul_ceiling_tflops": 700.0,
                        "speed_valid": speed_valid},
            "energy": {"per_device": per_device, "window_s": window_s}}


OVERHEAD = {"harness_step_s": 0.0102, "bare_step_s": 0.0100, "overhead_ratio": 1.02, "rounds": 2}
INFO = {"gpu": "NVIDIA H200", "driver": "580.1", "torch": "2.13.0", "cuda": "13.0", "date": "2026-12-01"}


def test_table_says_which_target_each_figure_misses_and_by_how_much():
    gpu_check = load_gpu_check()
    records = [record("dense-compiled", mfu=0.57, nvml=0.025), record("gshard-compiled", mfu=0.55, dropped=0.20),
               record("switch-compiled", mfu=0.51, dropped=0.10, nvml=0.05, window_s=3.0),
               record("dropless-top2-compiled", mfu=0.49, dropped=0.0), record("zero3-bf16", world=2, speed_valid=False)]
    text = gpu_check.table(records, OVERHEAD, {"summary": "7 passed in 40.0s", "returncode": 0}, INFO)
    missed = text.splitlines()[-1]
    assert missed == ("targets missed: dense-compiled: MFU 57.0% < 58% by 1.0 pp; "
                      "dense-compiled: NVML vs sampled +2.50% on 10.0 s, beyond ±2% by 0.50 pp; "
                      "dropless-top2-compiled: MFU 49.0% < 50% by 1.0 pp; "
                      "gshard-compiled: dropped 20.0% > 15% by 5.0 pp; "
                      "harness overhead 1.0200 > 1.01 by 1.00 pp")
    assert "NVML vs sampled not held to ±2% (window under 9 s): switch-compiled" in text
    assert "CUDA tests (pytest -m cuda): 7 passed in 40.0s" in text
    assert text.splitlines()[0] == "GPU: NVIDIA H200 · driver 580.1 · torch 2.13.0 · CUDA 13.0 · 2026-12-01"
    rows = {line.split()[0]: line.split() for line in text.splitlines()[3:] if line.split()[0] in gpu_check.CHECK}
    assert rows["dropless-top2-compiled"][1:7] == ["ok", "1,234", "—", "49.0%", "—", "50%"]
    assert "not run (time budget or the suite stopped first): switch-compiled" not in text
    assert "not run (time budget or the suite stopped first): expert-choice-compiled, dense-eager" in text
    assert "zero3-bf16 w2" in text and "its speed is not a figure" in text


def test_table_of_a_check_stopped_before_the_later_steps_says_what_did_not_run():
    gpu_check = load_gpu_check()
    text = gpu_check.table([], None, None, INFO)
    assert f"not run (time budget or the suite stopped first): {', '.join(gpu_check.CHECK)}" in text
    assert "harness overhead: not run (time budget)" in text
    assert "CUDA tests (pytest -m cuda): not run (time budget)" in text
    assert text.splitlines()[-1] == "targets missed: none of those measured"


@pytest.mark.parametrize("bad", ["0", "-5", "nan", "inf", "soon"])
def test_a_budget_that_is_not_a_positive_number_of_seconds_is_refused_naming_the_option(bad, capsys):
    gpu_check = load_gpu_check()
    with pytest.raises(SystemExit) as e:
        gpu_check.main(["--tiny", "--budget-s", bad])
    assert e.value.code == 2
    assert f"--budget-s: {bad!r} is not a number of seconds > 0 (e.g. --budget-s 420)" in capsys.readouterr().err


@pytest.mark.procs
def test_a_step_past_its_budget_is_stopped_with_its_processes(tmp_path):
    """run_logged SIGTERMs the step's whole process group at its time limit (pytest's spawned ranks
    included) and returns None; its output up to then is in the log."""
    gpu_check = load_gpu_check()
    lines = []
    child = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']);" \
            " print('started', flush=True); time.sleep(60)"
    t0 = time.monotonic()
    assert gpu_check.run_logged([sys.executable, "-c", child], lines.append, 1.5) is None
    assert time.monotonic() - t0 < 20 and "started" in lines and lines[-1].startswith("time budget: stopping")
    deadline = time.monotonic() + 10
    while "time.sleep(60)" in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout:
        assert time.monotonic() < deadline, "a process of the stopped step is still alive"
        time.sleep(0.2)
    assert gpu_check.run_logged([sys.executable, "-c", "print('x')"], lines.append, 0) is None  # no time: not started
    assert gpu_check.run_logged([sys.executable, "-c", "raise SystemExit(3)"], lines.append, 30) == 3


@pytest.mark.procs
def test_gpu_check_dry_run_writes_each_step_under_out_and_prints_the_table(tmp_path):
    gpu_check = load_gpu_check()
    res = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--tiny", "--out", str(tmp_path)], cwd=REPO,
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    records = json.loads((tmp_path / "gpu_check_records.json").read_text())
    assert sorted((r["workload"], r["config"]["world_size"]) for r in records) == \
           sorted([(w, 1) for w in gpu_check.CHECK] + [("zero3-bf16", 2)])
    assert all(r["status"] == "ok" for r in records)
    # what a device run returns: at most 8 files, none in a subfolder here
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["gpu_check.log", "versions.json", "gpu_check_records.json", "gpu_check_table.txt", "cuda_tests.xml",
         "gpu_check_overhead.json"])
    table = (tmp_path / "gpu_check_table.txt").read_text()
    overhead = json.loads((tmp_path / "gpu_check_overhead.json").read_text())
    info = json.loads((tmp_path / "versions.json").read_text())
    tests = {"summary": next(ln for ln in table.splitlines() if ln.startswith("CUDA tests")).split(": ", 1)[1]}
    assert table == gpu_check.table(records, overhead, tests, info) + "\n"
    assert re.fullmatch(r"\d+ skipped, \d+ deselected in .*", tests["summary"])  # no CUDA here: every one skips
    assert (tmp_path / "cuda_tests.xml").exists() and table in (tmp_path / "gpu_check.log").read_text()
    (harness,), (bare,) = overhead["harness_step_times_s"], overhead["bare_step_times_s"]
    assert len(harness) == len(bare) == gpu_check.TINY["train"]["steps"] and min(harness + bare) > 0
    rows = {line[:26].strip(): line[26:].split() for line in table.splitlines()[3:] if line.split()[0] in gpu_check.CHECK}
    for r in records:
        label = gpu_check.Row.of(r).workload
        assert rows[label][:2] == ["ok", f"{r['metrics']['tokens_per_s']:,.0f}"], rows[label]
    assert set(rows) == {gpu_check.Row.of(r).workload for r in records} and "zero3-bf16 w2" in rows


def test_the_table_states_the_gpu_bound_and_misses_unaligned_counter_edges():
    gpu_check = load_gpu_check()
    aligned, stale = record("dense-compiled", mfu=0.6), record("dense-eager", mfu=0.6)
    aligned["energy"]["per_device"] = [{"energy_j": 7000.0, "source": "measured", "detail": {"counter_edge_s": 0.001},
                                        "bound": {"share": 0.0075}}]
    stale["energy"]["per_device"] = [{"energy_j": 7000.0, "source": "measured", "detail": {}, "bound": {"share": 0.036}}]
    text = gpu_check.table([aligned, stale], OVERHEAD, None, INFO)
    rows = {line.split()[0]: line for line in text.splitlines() if line.split() and line.split()[0] in gpu_check.CHECK}
    assert rows["dense-compiled"].endswith("0.8%") and rows["dense-eager"].endswith("3.6%")
    missed = text.splitlines()[-1]
    assert "dense-eager: NVML counter edges not aligned to an update" in missed and "dense-compiled: NVML" not in missed
