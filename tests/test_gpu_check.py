"""benchmarks/gpu_check.py: the GPU check's whole path on CPU (tiny models, no compile), and its
harness-overhead comparison timing both loops through the same code."""

import importlib.util
import json
import statistics
import subprocess
import sys

import pytest

from helpers import REPO

from benchsuite.metrics.timing import StepTimer


def load_gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "benchmarks" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_harness_and_bare_loop_are_timed_by_the_same_step_timer(tmp_path, monkeypatch):
    """Both loops' step times are StepTimer intervals (CUDA events on a GPU), as many for each; a
    bare loop timed with its own host clock would add no StepTimer reading."""
    gpu_check = load_gpu_check()
    readings = []
    durations = StepTimer.durations_s
    monkeypatch.setattr(StepTimer, "durations_s", lambda self: readings.append(durations(self)) or readings[-1])
    overhead = gpu_check.bare_loop_vs_harness(gpu_check.suite_file(True, tmp_path), rounds=1)
    steps = gpu_check.TINY["train"]["steps"]
    # the last two readings are the loops' own; earlier ones are the harness's step log reading its timer so far
    harness, bare = readings[-2:]
    assert [harness, bare] == [overhead["harness_step_times_s"][0], overhead["bare_step_times_s"][0]]
    assert [len(harness), len(bare)] == [steps, steps]
    assert all(harness[:len(r)] == r for r in readings[:-2])
    assert overhead["overhead_ratio"] == statistics.median(harness) / statistics.median(bare)


@pytest.mark.procs
def test_gpu_check_dry_run_prints_the_table_and_writes_records(tmp_path):
    res = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--tiny", "--out", str(tmp_path)], cwd=REPO,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    records = json.loads((tmp_path / "gpu_check_records.json").read_text())
    names = {r["workload"] for r in records}
    assert names == {"dense-eager", "dense-compiled", "switch-compiled", "gshard-compiled", "expert-choice-compiled",
                     "switch-eager"}
    assert all(r["status"] == "ok" for r in records)
    table = (tmp_path / "gpu_check_table.txt").read_text()
    assert "harness overhead" in table and "expert-choice-compiled" in table and "GPU mJ/tok" in table
    overhead = json.loads((tmp_path / "gpu_check_overhead.json").read_text())
    (harness,), (bare,) = overhead["harness_step_times_s"], overhead["bare_step_times_s"]
    assert len(harness) == len(bare) == 3 and min(harness + bare) > 0
    # the table's figures, against values computed here from the records and step times it read
    rows = {line.split()[0]: line.split() for line in table.splitlines()[2:] if line.split()[0] in names}
    for r in records:
        assert rows[r["workload"]][1:3] == ["ok", f"{r['metrics']['tokens_per_s']:,.0f}"], rows[r["workload"]]
    ratio = statistics.median(harness) / statistics.median(bare)
    assert (f"benchsuite {statistics.median(harness) * 1e3:.2f} ms vs bare loop {statistics.median(bare) * 1e3:.2f} ms"
            f" per step → ratio {ratio:.4f}") in table


def test_tiny_suite_runs_the_workloads_the_table_compares(tmp_path):
    """--tiny runs the h200 workloads with an ANCHORS.md figure, once each (a run per rank launch:
    the others would take the same path again); the full check keeps workloads/h200.toml."""
    from benchsuite.config import load_suite
    gpu_check = load_gpu_check()
    tiny = load_suite(gpu_check.suite_file(True, tmp_path))
    assert sorted(r.workload for r in tiny.runs) == sorted(gpu_check.ANCHORS)
    assert all(not r.train.compile and r.model.hidden == gpu_check.TINY["model"]["hidden"] for r in tiny.runs)
    full = load_suite(gpu_check.suite_file(False, tmp_path))
    assert {r.workload for r in full.runs} > set(gpu_check.ANCHORS)


def test_table_row_of_a_router_without_an_mfu_target_shows_a_dash():
    gpu_check = load_gpu_check()
    rec = {"workload": "dropless-top2-compiled", "status": "ok", "config": {"moe": {"router": "token_choice"}},
           "metrics": {"tokens_per_s": 1234.0, "mfu": 0.4, "matmul_ceiling_tflops": 600.0}}
    overhead = {"harness_step_s": 0.01, "bare_step_s": 0.01, "overhead_ratio": 1.0, "rounds": 1}
    row = next(line.split() for line in gpu_check.table([rec], overhead).splitlines() if line.startswith("dropless"))
    assert row[1:5] == ["ok", "1,234", "—", "40.0%"] and row[6] == "—"   # no anchor, no target
