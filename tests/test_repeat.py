"""`run --repeat N`: the plan's order, how repeats are keyed (file, resume), old records as repeat 0, and
the repeats of a run combined wherever results are summarised (report, verdicts, dashboard)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from rich.console import Console

from benchsuite import cli
from benchsuite.config import load_suite
from benchsuite.launch import Planned, plan
from benchsuite.results.migrate import upgrade_v2_repeat
from benchsuite.results.model import results_at, results_of
from benchsuite.results.report import REPEATS, Fit, report_rows, report_table
from benchsuite.record import RecordError, to_dict, validate
from benchsuite.record import record_filename, record_id, write_record
from benchsuite.results.store import load_records, ok_record_ids
from test_scaling import rec
from test_verdicts import record as quality_record
from test_verdicts import verdicts

FIXTURES = Path(__file__).parent / "fixtures" / "results"


def repeats(key: str, world: int, tokens: list[float], status: str = "ok", hidden: int = 64) -> list[dict]:
    """The repeats of one run: one run key, repeat 0..N-1, started in that order (`hidden` tells one run's
    config from another's)."""
    out = []
    for i, t in enumerate(tokens):
        r = rec(key, world, tokens_per_s=t, step=1000 / t, status=status, hidden=hidden)
        r["repeat"], r["started_at"] = i, f"2026-01-01T00:01:{i:02d}+00:00"
        out.append(r)
    return out


def test_the_plan_runs_every_run_once_then_again(tiny_suite):
    runs = load_suite(tiny_suite(world_sizes=(1, 2))).runs
    assert plan(runs) == [Planned(runs[0], 0), Planned(runs[1], 0)]
    assert [(runs.index(p.run), p.repeat) for p in plan(runs, 3)] == [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2)]
    with pytest.raises(ValueError, match="repeat must be >= 1"):
        plan(runs, 0)


def test_repeat_0_keeps_the_name_records_had_and_later_repeats_get_their_own(tmp_path):
    r0, r1, r2 = repeats("abcd", 1, [100.0, 110.0, 120.0])
    old = {k: v for k, v in r0.items() if k != "repeat"}  # written before repeats
    assert record_filename(r0) == record_filename(old) == "s__w__w1n1-weak-seed0__abcd.json"
    assert record_filename(r2) == "s__w__w1n1-weak-seed0__abcd-r2.json" and record_id("abcd", 2) == "abcd-r2"
    for r in (old, r2):
        write_record(tmp_path, r)
    assert ok_record_ids(tmp_path) == {"abcd", "abcd-r2"}  # resume: repeat 1 is the one missing


def test_old_records_load_as_repeat_0_and_the_upgrade_says_so(tmp_path):
    raw = [json.loads(p.read_text()) for p in FIXTURES.glob("*.json")]
    assert raw and all("repeat" not in r for r in raw)  # recorded before --repeat
    fixtures = load_records(FIXTURES)
    assert {r.record.repeat for r in fixtures} == {0}  # the loader's upgrade chain gave them repeat 0
    results = results_of(fixtures)
    assert set(results.df["repeat"]) == {0}
    assert len(results.runs) == len(results.df)  # distinct runs: nothing is combined
    up = upgrade_v2_repeat(to_dict(fixtures[0].record))
    assert up["repeat"] == 0
    validate(up)
    for bad in (-1, "1", None, 1.5):
        with pytest.raises(RecordError, match="repeat: expected `int`"):
            validate({**up, "repeat": bad})
    # an old record and a new repeat of the same run are two repeats of it
    old, new = repeats("abcd", 1, [100.0, 140.0])
    del old["repeat"]
    for r in (old, new):
        write_record(tmp_path, r)
    (row,) = report_rows(results_at(tmp_path))
    assert (row["repeats"], row["tokens_per_s"]) == (2, 120.0)


def test_the_report_shows_one_row_per_run_with_the_median_and_range_of_its_repeats(tmp_path):
    failed = {**rec("wide", 2, status="failed"), "repeat": 1, "started_at": "2026-01-01T00:02:00+00:00"}
    recs = repeats("base", 1, [90.0, 130.0, 100.0]) + repeats("wide", 2, [150.0]) + [failed]
    flag = {"field": "metrics.mfu", "value": 2.0, "reason": "MFU above 1"}
    recs[1]["flags"] = [flag]  # one repeat's impossible figure flags the run's row
    for r in recs:
        write_record(tmp_path, r)
    results = results_at(tmp_path)
    assert len(results.df) == 5
    rows = {r["run_keys"][0]: r for r in report_rows(results)}
    assert len(rows) == 2  # a run's failed repeat is counted in its row, not a row of its own
    base, wide = rows["base"], rows["wide"]
    assert (base["repeats"], base["tokens_per_s"], base["tokens_per_s_min"], base["tokens_per_s_max"]) \
        == (3, 100.0, 90.0, 130.0)
    assert base["step_time_median_s"] == pytest.approx(10.0)  # the median of 1000/90, 1000/130, 1000/100
    assert (wide["repeats"], wide["failed"], wide["status"]) == (1, 1, "ok")
    # the flag of one repeat's figure no median holds is kept; 90–130 tok/s between repeats is noisy
    assert base["flagged"] is True and base["flags"][0] == flag and base["flags"][1]["field"] == "repeats"
    assert wide["flagged"] is False
    # efficiency against the baseline run's median, named by the run
    assert wide["scaling_efficiency"] == pytest.approx(150 / (2 * 100))
    assert wide["scaling_baseline_identities"] == [base["identity"]] and wide["scaling_baseline"] == base["label"]
    console = Console(width=300, record=True)
    console.print(report_table(results))
    lines = [line for line in console.export_text().splitlines() if "│ s " in line]
    assert len(lines) == 2 and "│                  100 │" in lines[0]
    assert [line.split("│")[-3].strip() for line in lines] == ["3 (90–130)", "1"]
    assert lines[1].split("│")[-2].strip() == "ok, 1 failed"


def _flagged_runs(tmp_path) -> pd.DataFrame:
    """Repeated 2-device runs, each against its own 1-device baseline (100 tok/s): 'once' at 100 % (one
    repeat at 105 %), 'twice' at 130 % on its median; 'mfu' over 1 in one repeat only, 'steps' with a NaN
    loss in one repeat (a flag of a step, not of a combined figure)."""
    cases = (("once", [210.0, 198.0, 200.0]), ("twice", [262.0, 260.0, 250.0]), ("mfu", [180.0] * 3),
             ("steps", [170.0] * 3))
    recs = []
    for hidden, (key, tokens) in enumerate(cases, start=64):
        recs += repeats(f"base-{key}", 1, [100.0] * 3, hidden=hidden) + repeats(key, 2, tokens, hidden=hidden)
    for r, mfu in zip(recs[15:18], (1.5, 0.4, 0.5)):
        r["metrics"]["mfu"] = mfu
    recs[21]["flags"] = [LOSS_FLAG]
    for r in recs:
        write_record(tmp_path, r)
    return results_at(tmp_path)


LOSS_FLAG = {"field": "steps[1].loss", "value": "nan", "reason": "the loss is not a finite number"}


def test_a_repeated_runs_flags_are_judged_on_its_median_and_count_the_repeats_that_had_them(tmp_path):
    results = _flagged_runs(tmp_path)
    # a run-level flag (superlinear efficiency) is on each of its records; a record's own, on that record
    assert results.df.groupby("run_key")["flagged"].sum().to_dict() == {
        "base-mfu": 0, "base-once": 0, "base-steps": 0, "base-twice": 0, "mfu": 1, "once": 0, "steps": 1, "twice": 3}
    rows = {r["run_keys"][0]: r for r in report_rows(results)}
    once, twice, mfu, steps = rows["once"], rows["twice"], rows["mfu"], rows["steps"]
    # efficiency is the run's, on its median: no repeat is divided by a median
    assert once["scaling_efficiency"] == pytest.approx(1.0) and once["flagged"] is False and once["flags"] == []
    assert once["flags_in_repeats"] == {} and once["flag_summary"] is None
    # superlinear on the median: flagged by the one rule, on the median's value
    (flag,) = twice["flags"]
    assert twice["flagged"] is True and (flag["field"], flag["value"]) == ("scaling_efficiency", pytest.approx(1.3))
    assert "efficiency 130% at 2 devices" in flag["reason"] and twice["flags_in_repeats"] == {}
    # a record rule (MFU above 1) judged on the median MFU (0.5)
    assert (mfu["mfu"], mfu["flagged"], mfu["flags_in_repeats"]) == (0.5, False, {"metrics.mfu": 1})
    assert mfu["flag_summary"] == "metrics.mfu: flagged in 1 of 3 records, not on their median"
    # a step's flag is no figure of the row: kept from the repeat that had it, with the count
    assert steps["flagged"] is True and steps["flags"] == [LOSS_FLAG]
    assert steps["flags_in_repeats"] == {"steps[1].loss": 1}
    assert steps["flag_summary"] == "steps[1].loss: the loss is not a finite number (1 of 3 records flagged)"
    assert rows["base-once"]["flags_in_repeats"] == {} and rows["base-once"]["flag_summary"] is None


def test_the_table_shows_the_flags_the_json_report_has(tmp_path):
    results = _flagged_runs(tmp_path)
    rows = {r["run_keys"][0]: r for r in report_rows(results)}
    console = Console(width=500, record=True)
    console.print(report_table(results))
    text = console.export_text()
    (head,) = [line for line in text.splitlines() if "┃ suite" in line]
    headers = [h.strip() for h in head.split("┃")]
    cells = [dict(zip(headers, [c.strip() for c in line.split("│")])) for line in text.splitlines() if "│ s " in line]
    by_tokens = {f"{row['tokens_per_s']:,.0f}": key for key, row in rows.items() if row["world_size"] == 2}
    table = {by_tokens[c["tok/s (95% interval)"]]: c for c in cells if c["world"] == "2"}
    assert (table["twice"]["efficiency"], table["once"]["efficiency"]) == ("130% ⚠", "100%")  # ⚠: on the median
    for key, cell in table.items():
        assert cell["status"] == ("ok ⚠ flagged" if rows[key]["flagged"] else "ok"), key
    for key in ("twice", "mfu", "steps"):  # every note of the JSON report is in the caption
        mark = "⚠" if rows[key]["flagged"] else "records —"
        assert f"{mark} {rows[key]['label']}: {rows[key]['flag_summary']}" in " ".join(text.split()), key


def test_at_100_columns_the_table_keeps_the_seed_and_repeats_columns():
    headers = [c.header for c in report_table(results_at(FIXTURES), Fit(width=100)).columns]
    assert {"workload", "world", "seed", "tok/s (95% interval)", REPEATS} <= set(headers)


def test_the_repeats_of_a_seed_are_one_seed_in_the_per_step_interval():
    recs = []
    for seed, tokens in enumerate((100_000, 200_000)):
        for repeat in range(3):
            r = quality_record("dense", seed, tokens)
            r["repeat"] = repeat
            recs.append(r)
    (w,) = verdicts(recs).workloads
    assert w.seeds == [0, 1] and w.figures["tokens"].n == 2
    assert w.per_step["tokens_per_s"].n == 2  # six records, two seeds


def test_the_dashboard_draws_a_run_once_from_the_median_of_its_repeats():
    from benchsuite.dashboard.data import load

    data = load(repeats("base", 1, [90.0, 130.0, 100.0]))
    (row,) = data.ok_runs.to_dict("records")
    assert (row["tokens_per_s"], row["repeats"]) == (100.0, 3)
    assert data.record(row).repeat == 2 and row["page"] == data.df["page"].iloc[2]  # links the latest
    assert len(data.df) == 3  # every repeat keeps its own run page


@pytest.mark.procs
def test_resume_after_partial_repeats_measures_exactly_the_missing_ones(tiny_suite, tmp_path, capsys):
    suite, out = str(tiny_suite()), str(tmp_path / "out")
    assert cli.main(["run", suite, "--out", out, "--json"]) == 0
    assert [(r["status"], r["repeat"]) for r in json.loads(capsys.readouterr().out)["runs"]] == [("ok", 0)]
    assert cli.main(["run", suite, "--out", out, "--repeat", "3", "--json"]) == 0
    runs = json.loads(capsys.readouterr().out)["runs"]
    assert [(r["status"], r["repeat"]) for r in runs] == [("skipped_recorded", 0), ("ok", 1), ("ok", 2)]
    loaded = sorted(load_records(out), key=lambda one: one.record.repeat)
    recs = [one.record for one in loaded]
    assert [r.repeat for r in recs] == [0, 1, 2] and len({r.run_key for r in recs}) == 1
    assert [one.path.name.split("__")[-1] for one in loaded] == [
        f"{recs[0].run_key}.json", f"{recs[0].run_key}-r1.json", f"{recs[0].run_key}-r2.json"]
    assert cli.main(["report", out, "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["runs"]
    tokens = sorted(r.metrics.tokens_per_s for r in recs)
    assert (row["repeats"], row["tokens_per_s"], row["tokens_per_s_min"], row["tokens_per_s_max"]) \
        == (3, tokens[1], tokens[0], tokens[2])
