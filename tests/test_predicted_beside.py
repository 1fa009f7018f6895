"""Measured beside predicted (results/predicted.py): each run's step time against benchsuite.predict's on a
system file, in report and on run pages; a run far slower flagged with the component most likely to blame."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from benchsuite.cli import main
from benchsuite.predict import load_system
from benchsuite.results import predicted
from benchsuite.results.model import results_of
from benchsuite.results.store import load_records
from helpers.records import make_record, records_of

FIXTURES = Path(__file__).parent / "fixtures" / "results"
H100 = Path(__file__).parents[1] / "workloads" / "systems" / "h100-8x.toml"


@pytest.fixture(scope="module")
def rows():
    return {b.label: b for b in predicted.beside(results_of(load_records(FIXTURES)), load_system(H100))}


def test_a_run_far_slower_than_predicted_is_flagged_with_a_suspect(rows):
    dense = rows["dense · w1"]
    assert dense.ratio == pytest.approx(dense.measured_step_s / dense.predicted_step_s)
    assert dense.predicted_step_s == pytest.approx(sum(dense.components.values()))
    assert dense.ratio > predicted.FAR and dense.flagged and dense.suspect.startswith("compute:")
    switch = rows["switch · w1"]  # records 18 % of its step in the all-to-all, where none is predicted
    assert switch.flagged and switch.suspect.startswith("expert all-to-all: measured 18% of the step vs 0%")


def test_runs_on_other_hardware_or_a_users_loop_are_not_compared(rows):
    cpu = rows["dense-tiny · w1"]
    assert cpu.predicted_step_s is None and not cpu.flagged
    assert cpu.reason == "measured on 1× AMD EPYC, 2 threads per rank; the system file describes NVIDIA H100 80GB HBM3"
    doc = make_record()
    doc["config"]["kind"] = "user"
    (rec,) = records_of([doc])
    assert "benchsuite.measure() loop" in predicted._not_comparable(rec, "1× x", load_system(H100))


def test_a_prediction_at_or_above_the_measurement_is_not_flagged():
    slow = load_system(H100).calibrated(0.01, 0.01, "a test: rates low enough that every prediction is slower")
    for b in predicted.beside(results_of(load_records(FIXTURES)), slow):
        assert not b.flagged and b.suspect is None and (b.ratio is None or b.ratio < predicted.FAR)


def _prediction(step=1.0, bubble=0.0, **seconds):
    parts = {"tensor_parallel": 0.0, "expert_parallel": 0.0, "data_parallel": 0.0, "pipeline_p2p": 0.0, **seconds}
    return SimpleNamespace(step_s=step, bubble_fraction=bubble, seconds=lambda name: parts.get(name, 0.0))


@pytest.mark.parametrize("metrics, prediction, suspect", [
    ({"pipeline": {"bubble_measured": 0.55}}, _prediction(bubble=0.2), "pipeline bubble: measured 0.55"),
    ({"pipeline": {"bubble_measured": 0.25}}, _prediction(bubble=0.2, tensor_parallel=0.3), "tensor parallel:"),
    ({"moe": {"all_to_all_share": 0.40}}, _prediction(expert_parallel=0.1), "expert all-to-all: measured 40%"),
    ({}, _prediction(data_parallel=0.05, pipeline_p2p=0.01), "data parallel: the largest predicted collective (5%"),
    ({}, _prediction(), "compute: no communication is predicted"),
])
def test_the_suspect_is_what_the_record_measured_beyond_its_prediction_else_the_largest_collective(
        metrics, prediction, suspect):
    (rec,) = records_of([{**make_record(), "metrics": metrics}])
    assert predicted._suspect(rec, prediction).startswith(suspect)


def test_report_json_and_the_run_page_show_measured_beside_predicted(tmp_path, capsys, rows):
    assert main(["report", str(FIXTURES), "--json", "--predict", str(H100)]) == 0
    doc = json.loads(capsys.readouterr().out)
    by_label = {p["label"]: p for p in doc["predicted"]}
    assert by_label["dense · w1"] == rows["dense · w1"].to_dict()
    from benchsuite.dashboard import build_site

    res = build_site(FIXTURES, tmp_path, system=load_system(H100))
    page = next(p for p in res.pages if "runs/" in p and "dense · w1" in (tmp_path / p).read_text())
    text = (tmp_path / page).read_text()
    assert "Measured beside predicted" in text and f"{rows['dense · w1'].ratio:.2f}× ⚠" in text


def test_a_missing_system_file_is_a_usage_error(capsys):
    assert main(["report", str(FIXTURES), "--predict", "/nonexistent/system.toml"]) == 2
    assert "file not found; pass a system file such as" in capsys.readouterr().err
