"""One figure everywhere: `report --json`, load_runs()/load(), the dashboard's data and compare read one
results model (benchsuite/results/model.py) and give the same medians, intervals over seeds,
efficiencies and flags, to the last digit, on a folder of 2 workloads × 2 seeds × 2 repeats with a
1-device baseline and a 2-device run."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest
from scipy import stats

import benchsuite
from benchsuite import cli
from benchsuite.record import SCHEMA_VERSION, write_record
from benchsuite.results.scaling import BASELINE
from helpers.records import typed

# (workload, router, world, seed) -> tok/s of repeat 0 and repeat 1; dense seed 0 is the noisy pair
TOKENS = {("dense", None, 1, 0): (380.0, 967.0), ("dense", None, 1, 1): (700.0, 720.0),
          ("switch", "switch", 1, 0): (1000.0, 1040.0), ("switch", "switch", 1, 1): (900.0, 950.0),
          ("dense", None, 2, 0): (1300.0, 1320.0), ("dense", None, 2, 1): (1250.0, 1270.0)}
TOKENS_PER_STEP = 1000
FIGURES = ("tokens_per_s", "mfu", "step_time_median_s", "j_per_token", "gco2e_per_mtok")


def record(workload: str, router: str | None, world: int, seed: int, repeat: int, tokens_per_s: float) -> dict:
    step = TOKENS_PER_STEP / tokens_per_s
    cfg = {"suite": "m", "workload": workload, "kind": "moe" if router else "dense", "world_size": world,
           "nodes": 1, "scaling": "weak", "sweep_id": f"m/{workload}/weak", "train": {"seed": seed, "steps": 8},
           "moe": {"router": router, "experts": 4} if router else None}
    j_per_token = 0.02 * step  # a fixed power: energy per token follows the step time
    return typed({
        "schema_version": SCHEMA_VERSION, "run_key": f"{workload}-w{world}-s{seed}", "repeat": repeat,
        "suite": "m", "workload": workload, "status": "ok", "error": None,
        "started_at": f"2026-01-01T00:{repeat:02d}:{seed * 10 + world:02d}+00:00", "duration_s": 5.0,
        "config": cfg, "env": {"devices": [{"type": "cpu", "name": "Test CPU", "rank": r} for r in range(world)],
                               "threads_per_rank": 1, "threads_source": "sweep rule"},
        "metrics": {"tokens_per_s": tokens_per_s, "tokens_per_s_per_device": tokens_per_s / world,
                    "tokens_per_step": TOKENS_PER_STEP, "mfu": tokens_per_s / 4e4,
                    "step_time_s": {"median": step, "p10": step, "p90": step, "ci95": [step, step]},
                    "energy": {"j_per_token": j_per_token, "gco2e_per_mtok": j_per_token * 100}},
        "energy": {"source": "measured", "total_j": j_per_token * TOKENS_PER_STEP * 8},
        "carbon": None, "steps": [{"step": i, "time_s": step, "tokens": TOKENS_PER_STEP} for i in range(8)],
    })


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    out = tmp_path_factory.mktemp("results")
    for (workload, router, world, seed), tokens in TOKENS.items():
        for repeat, tps in enumerate(tokens):
            write_record(out, record(workload, router, world, seed, repeat, tps))
    return out


def seed_medians(workload: str, world: int, figure=lambda tps: tps) -> list[float]:
    return [float(np.median([figure(t) for t in tokens])) for (w, _, n, _), tokens in TOKENS.items()
            if (w, n) == (workload, world)]


def report_json(folder, capsys) -> dict:
    assert cli.main(["report", str(folder), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.heavy  # in this process, a second or more: the full pass runs it, the fast tier does not
def test_every_view_gives_the_same_medians_intervals_efficiencies_and_flags(folder, capsys, tmp_path):
    from benchsuite.dashboard.data import load as site_load

    report = {r["label"]: r for r in report_json(folder, capsys)["runs"]}
    runs = benchsuite.load_runs(folder).set_index("label")
    records = benchsuite.load(folder)
    site = site_load(folder).runs.set_index("label")
    assert set(report) == set(runs.index) == set(site.index) == {"dense · w1", "dense · w2", "switch · w1"}
    for label, row in report.items():
        for name in FIGURES:
            for column in (name, f"{name}_lo", f"{name}_hi"):
                values = {row[column], runs.at[label, column], site.at[label, column]}
                assert len({"nan" if v is None or (isinstance(v, float) and math.isnan(v)) else v
                            for v in values}) == 1, (label, column, values)
        for column in ("scaling_efficiency", "flagged", "scaling_baseline"):
            assert row[column] == runs.at[label, column] == site.at[label, column], (label, column)
        mine = records[records["identity"] == row["identity"]]  # each record shows its run's efficiency
        assert (mine["scaling_efficiency"] == row["scaling_efficiency"]).all()
        assert sorted(mine["name"]) == row["records"]

    # the figures themselves: the median over seeds of each seed's median over its repeats, with Student's
    # t on the logs of the seeds' medians (scipy), for tok/s and every figure derived from the step time
    dense = report["dense · w1"]
    per_seed = seed_medians("dense", 1)  # 673.5 and 710
    assert dense["tokens_per_s"] == float(np.median(per_seed))
    ci = stats.ttest_1samp(np.log(per_seed), 0).confidence_interval(0.95)
    assert (dense["tokens_per_s_lo"], dense["tokens_per_s_hi"]) == (math.exp(ci.low), math.exp(ci.high))
    assert [s["tokens_per_s"] for s in dense["per_seed"]] == per_seed and dense["seeds"] == [0, 1]

    # efficiency: the 2-device run's median against the 1-device run's; the baseline shown as the baseline
    w2 = report["dense · w2"]
    assert w2["scaling_efficiency"] == float(np.median(seed_medians("dense", 2))) / (2 * dense["tokens_per_s"])
    assert w2["scaling_baseline"] == "dense · w1"
    assert (dense["scaling_efficiency"], dense["scaling_baseline"]) == (1.0, BASELINE)

    # seed 0 measured 380 and 967 tok/s: a noisy measurement, flagged on the run and each record of seed 0
    # (a seed-1 record's note once read "seed 0: 2 repeats at …")
    assert dense["flagged"] and [f["field"] for f in dense["flags"]] == ["repeats"]
    assert "seed 0: 2 repeats at 380–967 tok/s" in dense["flags"][0]["reason"]
    mine = records[records["identity"] == dense["identity"]]
    assert mine.loc[mine["seed"] == 0, "flagged"].all() and not mine.loc[mine["seed"] == 1, "flagged"].any()
    assert not report["switch · w1"]["flagged"] and not w2["flagged"]

    # compare across seeds (--ignore train.seed) states each side as the report states the run
    other = tmp_path / "b"
    shutil.copytree(folder, other)
    assert cli.main(["compare", str(folder), str(other), "--ignore", "train.seed", "--json"]) == 0
    compared = {r["identity"]: r for r in json.loads(capsys.readouterr().out)["runs"]}
    assert len(compared) == 3
    for row in report.values():
        (match,) = [c for c in compared.values() if c["run"].startswith(f"m/{row['workload']} w{row['world_size']} ")]
        by_metric = {m["metric"]: m for m in match["metrics"]}
        for name in ("tokens_per_s", "mfu", "j_per_token", "gco2e_per_mtok"):
            assert by_metric[name]["a"] == row[name] == by_metric[name]["b"], (row["label"], name)


@pytest.mark.heavy  # in this process, a second or more: the full pass runs it, the fast tier does not
def test_the_dense_vs_sparse_bars_carry_the_reports_medians_and_intervals(folder, capsys):
    from benchsuite.dashboard.data import load as site_load
    from benchsuite.dashboard.pages import summary_pages

    report = {r["label"]: r for r in report_json(folder, capsys)["runs"]}
    figures = {f.id: f for p in summary_pages() for f in p.render(site_load(folder)).figures}
    for name in ("tokens_per_s", "j_per_token"):
        for trace in figures[f"fig-compare-{name}"].data:
            for x, y, plus, minus in zip(trace["x"], trace["y"], trace["error_y"]["array"],
                                         trace["error_y"]["arrayminus"]):
                label = f"{trace['name'].split(' (')[0]} · {x}"
                row = report[label]
                assert y == pytest.approx(row[name], rel=1e-6)
                assert y + plus == pytest.approx(row[f"{name}_hi"], rel=1e-6)
                assert y - minus == pytest.approx(row[f"{name}_lo"], rel=1e-6)


def test_the_sparse_over_dense_ratio_is_welchs_interval_over_the_seeds_medians(folder, capsys):
    (pair,) = [p for p in report_json(folder, capsys)["verdicts"]["pairs"] if p["figure"] == "tokens_per_s"]
    sparse, dense = seed_medians("switch", 1), seed_medians("dense", 1)
    ci = stats.ttest_ind(np.log(sparse), np.log(dense), equal_var=False).confidence_interval(0.95)
    assert (pair["ratio"]["lo"], pair["ratio"]["hi"]) == (math.exp(ci.low), math.exp(ci.high))
    assert pair["ratio"]["point"] == np.median(sparse) / np.median(dense)
    assert math.exp(ci.low) > 1 and pair["ranking"] == "sparse more than dense" and pair["text"] == "switch · w1 higher"
    (energy,) = [p for p in report_json(folder, capsys)["verdicts"]["pairs"] if p["figure"] == "j_per_token"]
    jpt = lambda tps: 0.02 * (TOKENS_PER_STEP / tps)  # noqa: E731  (as record() computes it)
    ci = stats.ttest_ind(np.log(seed_medians("switch", 1, jpt)), np.log(seed_medians("dense", 1, jpt)),
                         equal_var=False).confidence_interval(0.95)
    assert (energy["ratio"]["lo"], energy["ratio"]["hi"]) == (math.exp(ci.low), math.exp(ci.high))


def test_seeds_and_repeats_are_named_wherever_a_record_is(folder, capsys):
    assert cli.main(["list", str(folder), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert {(r["seed"], r["repeat"]) for r in listed} == {(0, 0), (0, 1), (1, 0), (1, 1)}
    assert "dense · w1 · seed 1 · repeat 0" in {r["record_name"] for r in listed}
    assert cli.main(["report", str(folder), "--columns", "workload,world,seed,repeats"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any("dense" in line and "0, 1" in line and "4 (380–967)" in line for line in lines)
    records = benchsuite.load(folder)
    assert {"config.train.seed", "env.threads_per_rank", "seed", "name"} <= set(records.columns)
    assert (records["seed"] == records["config.train.seed"]).all()


def test_carbon_project_gives_one_projection_per_run(folder, capsys):
    assert cli.main(["carbon", "project", str(folder), "--tokens", "1e9", "--intensity", "100", "--json"]) == 0
    rows = {r["label"]: r for r in json.loads(capsys.readouterr().out)}
    assert set(rows) == {"dense · w1", "dense · w2", "switch · w1"}
    dense = rows["dense · w1"]
    per_seed = seed_medians("dense", 1, lambda tps: 0.02 * (TOKENS_PER_STEP / tps))  # J/token of each repeat
    assert dense["j_per_token"] == pytest.approx(float(np.median(per_seed)))
    assert dense["records"] == 4 and dense["seeds"] == [0, 1]
    assert dense["co2e_g_range"][0] < dense["co2e_g"] < dense["co2e_g_range"][1]
