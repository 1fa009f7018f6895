"""The sanity guard (record/sanity.py): physically impossible figures are flagged in the record,
shown beside the status by `benchsuite report` (and --json), computed on load for older records,
and a diverging run (NaN loss) is recorded flagged as strict JSON instead of failing the write."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest

from benchsuite import cli
from benchsuite.record.sanity import finite_or_none, sanity_flags
from benchsuite.record import write_record
from benchsuite.results.model import results_at
from benchsuite.results.store import load_records
from helpers import run_cli, runs_rows
from helpers.records import make_record


def sane() -> dict:
    rec = make_record("sane", world_size=2, tokens_per_s=1000.0, step=0.5)
    rec["metrics"].update(mfu=0.4, mfu_vs_ceiling=0.6, peak_tflops=989.0, flops={"model_per_token": 1e9},
                          energy={"j_per_token": 0.01})
    rec["energy"] = {"total_j": 3000.0, "gpu_j": 2000.0, "cpu_j": 900.0, "dram_j": 100.0, "window_s": 10.0,
                     "per_device": [{"energy_j": 1000.0, "avg_w": 100.0}, {"energy_j": 1000.0, "avg_w": None}],
                     "per_node": [{"cpu": {"energy_j": 900.0, "avg_w": 90.0}, "dram": {"energy_j": 100.0}}]}
    for s in rec["steps"]:
        s["loss"] = 5.0
    return rec


def _set(rec, path, value):
    node = rec
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    return rec


IMPOSSIBLE = [
    (("metrics", "mfu"), 1.7, "metrics.mfu"),
    (("metrics", "mfu"), -0.2, "metrics.mfu"),
    (("metrics", "tokens_per_s"), -5.0, "metrics.tokens_per_s"),
    (("metrics", "energy", "j_per_token"), -0.3, "metrics.energy.j_per_token"),
    (("metrics", "mfu_vs_ceiling"), 1.2, "metrics.mfu_vs_ceiling"),
    (("metrics", "tokens_per_s"), 2e6, "metrics.tokens_per_s"),  # 2e6 x 1e9 / 2 = 1000 TFLOP/s > 989
    (("metrics", "step_time_s", "median"), 0.0, "metrics.step_time_s.median"),
    (("metrics", "step_time_s", "median"), -0.1, "metrics.step_time_s.median"),
    (("energy", "total_j"), -5.0, "energy.total_j"),
    (("energy", "per_device", 0, "energy_j"), -1.0, "energy.per_device[0].energy_j"),
    (("energy", "per_device", 0, "avg_w"), 2500.0, "energy.per_device[0].avg_w"),
    (("energy", "per_device", 1, "energy_j"), 4e4, "energy.per_device[1].avg_w"),  # 4 kW over the 10 s window
    (("energy", "per_node", 0, "cpu", "avg_w"), 1e7, "energy.per_node[0].cpu.avg_w"),  # a wrapped RAPL counter
    (("steps", 1, "loss"), math.nan, "steps[1].loss"),
    (("steps", 2, "loss"), math.inf, "steps[2].loss"),
    (("steps", 0, "time_s"), 0.0, "steps[0].time_s"),
]


def test_a_sane_record_has_no_flags_and_failed_records_are_not_judged():
    assert sanity_flags(sane()) == []
    assert sanity_flags(make_record("f", status="failed")) == []
    assert sanity_flags({"status": "ok", "metrics": "junk", "energy": [], "steps": None}) == []


@pytest.mark.parametrize("path, value, field", IMPOSSIBLE, ids=[f for _, _, f in IMPOSSIBLE])
def test_each_impossible_figure_is_flagged_with_field_value_and_reason(path, value, field):
    flags = sanity_flags(_set(sane(), path, value))
    assert [f["field"] for f in flags] == [field]
    (flag,) = flags
    assert flag["reason"] and json.dumps(flag, allow_nan=False)  # the flag itself is strict JSON
    if isinstance(value, float) and not math.isfinite(value):
        assert flag["value"] in ("nan", "inf")


def test_a_run_above_its_matmul_ceiling_blames_the_ceiling_not_the_step_time():
    (flag,) = sanity_flags(_set(sane(), ("metrics", "mfu_vs_ceiling"), 1.95))
    assert "the ceiling measurement is unreliable" in flag["reason"] and "not the run's step time" in flag["reason"]
    assert "the step time or the FLOP count is wrong" not in flag["reason"]


def test_finite_or_none_makes_a_record_strict_json():
    rec = _set(sane(), ("steps", 1, "loss"), math.nan)
    clean = finite_or_none(rec)
    assert clean["steps"][1]["loss"] is None and clean["steps"][0]["loss"] == 5.0
    json.dumps(clean, allow_nan=False)
    assert math.isnan(rec["steps"][1]["loss"])  # a copy: the input is untouched


def test_one_cleaner_for_records_and_dashboard_data():
    """numpy scalars (a float32 NaN is no Python float) are made plain and finite in a record too; the
    dashboard's clean is the same walk, with anything else turned into its text."""
    import numpy as np

    from benchsuite.dashboard.render import clean

    doc = {"a": np.float32("inf"), "b": (np.int64(3), 2.5, float("-inf")), 7: {"c": np.float64("nan")}}
    out = finite_or_none(doc)
    assert out == {"a": None, "b": [3, 2.5, None], "7": {"c": None}} and type(out["b"][0]) is int
    json.dumps(out, allow_nan=False)
    assert clean(doc) == out and clean({"when": Path("x")}) == {"when": "x"}
    assert finite_or_none({"when": Path("x")}) == {"when": Path("x")}  # a record keeps what it holds


def test_loader_flags_old_records_and_the_report_shows_them(tmp_path, capsys, monkeypatch):
    write_record(tmp_path, sane())
    old = _set(sane(), ("metrics", "mfu"), 3.0)
    old["run_key"] = old["workload"] = old["config"]["workload"] = "old"  # another run (same config: its repeat)
    (tmp_path / "old.json").write_text(json.dumps({**old, "schema_version": 3}))  # before the guard: no "flags"
    recs = {one.record.run_key: one.record for one in load_records(tmp_path)}
    assert recs["sane"].flags == [] and [f.field for f in recs["old"].flags] == ["metrics.mfu"]
    df = results_at(tmp_path).df.set_index("run_key")
    assert bool(df.loc["old", "flagged"]) and not bool(df.loc["sane", "flagged"])
    assert "metrics.mfu" in df.loc["old", "flag_summary"]

    monkeypatch.setenv("COLUMNS", "300")
    assert cli.main(["report", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "ok ⚠" in text and "MFU 3 exceeds 1" in " ".join(text.split())
    assert cli.main(["report", str(tmp_path), "--json"]) == 0
    rows = {r["run_keys"][0]: r for r in json.loads(capsys.readouterr().out)["runs"]}
    assert rows["old"]["flagged"] is True and rows["old"]["flags"][0]["field"] == "metrics.mfu"
    assert rows["sane"]["flagged"] is False and rows["sane"]["flags"] == []


def test_stored_flags_are_kept_and_malformed_ones_replaced(tmp_path):
    rec = _set(sane(), ("energy", "total_j"), -1.0)
    rec["flags"] = [{"field": "metrics.custom", "value": 1, "reason": "set by an older guard"}, "junk"]
    (tmp_path / "r1.json").write_text(json.dumps({**rec, "schema_version": 3}))  # version 3 read any flags
    (one,) = load_records(tmp_path)
    assert [f.field for f in one.record.flags] == ["metrics.custom", "energy.total_j"]
    rec2 = copy.deepcopy(sane())
    rec2["run_key"], rec2["flags"] = "k2", "not a list"
    (tmp_path / "r2.json").write_text(json.dumps({**rec2, "schema_version": 3}))
    assert {one.record.run_key: one.record.flags for one in load_records(tmp_path)}["k2"] == []


DIVERGING = """
[suite]
name = "diverge"

[defaults]
model = {{ layers = 1, hidden = 32, heads = 2, vocab = 128, seq_len = 16 }}
train = {{ micro_batch = 2, steps = 3, warmup_steps = 2, lr = 1e30, precision = "fp32", timeout_s = 120 }}

[[workload]]
name = "dense"
"""


@pytest.mark.procs
def test_a_diverging_run_with_an_impossible_peak_is_recorded_ok_and_flagged(tmp_path):
    """lr = 1e30 drives the loss to NaN/inf; --peak-tflops 1e-9 makes MFU absurd. The run still
    finishes: its record is strict JSON (the NaN loss stored as null), flagged, and the run's own
    output and the report both say so."""
    suite, out = tmp_path / "diverge.toml", tmp_path / "out"
    suite.write_text(DIVERGING.format())
    res = run_cli("run", str(suite), "--out", str(out), "--peak-tflops", "1e-9", env={"COLUMNS": "300"},
                  timeout=240)
    assert res.returncode == 0, res.stderr
    assert "⚠ flagged" in res.stderr
    (path,) = out.glob("*.json")
    json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"{c} in a record"))
    (one,) = load_records(out)
    rec = one.record
    assert rec.status == "ok"
    fields = {f.field.split("[")[0] for f in rec.flags}
    assert {"metrics.mfu", "metrics.tokens_per_s", "steps"} <= fields, rec.flags
    assert any(s.loss is None for s in rec.steps)
    report = run_cli("report", str(out), "--json", timeout=60)
    (row,) = json.loads(report.stdout)["runs"]
    assert row["flagged"] is True and row["status"] == "ok"


def test_the_dashboard_marks_a_flagged_run(tmp_path):
    from benchsuite.dashboard import build_site

    write_record(tmp_path / "r", sane())
    bad = _set(sane(), ("metrics", "mfu"), 2.0)
    bad["run_key"], bad["workload"] = "bad", "<b>w</b>"
    write_record(tmp_path / "r", bad)
    build_site(tmp_path / "r", tmp_path / "site")
    rows = runs_rows(tmp_path / "site")  # the runs table's rows; the page script marks the flagged one
    notes = {row[0]: row[3] for row in rows if row[1] == "ok"}
    assert sum(bool(n) for n in notes.values()) == 1
    assert "metrics.mfu: MFU 2 exceeds 1" in next(n for n in notes.values() if n)
