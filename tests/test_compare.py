"""benchsuite compare: the pooled-t interval over repeats (checked against scipy and by simulation),
verdicts, matching by identity (--ignore, seeds), nested folders, failed and missing runs as
regressions, estimated energy, exit codes."""

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from msgspec.structs import replace
from scipy import stats

from benchsuite.cli import main
from benchsuite.record import encode, to_dict, write_record
from benchsuite.record.types import Config, Record
from benchsuite.results.compare import (DEFAULT_THRESHOLD, ESTIMATED, METRICS, Verdict, compare_folders, compare_run,
                                        identity_key, verdict)
from benchsuite.results.decoding import read_record
from helpers.records import records_of

FIXTURES = Path(__file__).parent / "fixtures" / "results"
DENSE = "make_dvs-dense-w1.json"  # measured energy (NVML, RAPL)
SWITCH = "make_dvs-switch-w1.json"
TIMES_A = [0.50, 0.52, 0.49, 0.51, 0.55, 0.48, 0.50, 0.53, 0.47, 0.52]
SPREAD = [1.0, 1.02, 0.985, 1.01]  # run-to-run multipliers of a steady machine (±2 %)


def _record(name: str, times: list[float] | None = None, **changes) -> dict:
    """A fixture record's document with its step times set by hand and dotted fields (a__b) changed."""
    rec = to_dict(read_record(FIXTURES / name))  # upgraded through the chain to the current version
    if times is not None:
        rec["steps"] = [dict(rec["steps"][0], step=i, time_s=t) for i, t in enumerate(times)]
    for dotted, value in changes.items():
        *parents, leaf = dotted.split("__")
        d = rec
        for p in parents:
            d = d[p]
        d[leaf] = value
    return rec


def _scaled(name: str, speed: float, **changes) -> dict:
    """A fixture record of a run `speed` times as fast: tok/s and MFU × speed, J/token and gCO2e/Mtok ÷ speed."""
    rec = _record(name, **changes)
    m = rec["metrics"]
    m["tokens_per_s"] *= speed
    m["mfu"] = m["mfu"] * speed if m["mfu"] is not None else None
    if m["energy"] and m["energy"]["j_per_token"] is not None:
        m["energy"]["j_per_token"] /= speed
        m["energy"]["gco2e_per_mtok"] /= speed
    rec["steps"] = [dict(s, time_s=s["time_s"] / speed) for s in rec["steps"]]
    return rec


def _repeats(name: str, speed: float = 1.0, spread=SPREAD[:2], **changes) -> list[dict]:
    """The repeats of one run (repeat 0, 1, ...), each with its run-to-run multiplier."""
    return [{**_scaled(name, speed * s, **changes), "repeat": i} for i, s in enumerate(spread)]


def _folder(path: Path, *records: dict) -> Path:
    """A results folder of records, each checked by the record's types (encode) on the way."""
    path.mkdir(parents=True)
    for i, rec in enumerate(records):
        (path / f"r{i}.json").write_bytes(encode(rec))
    return path


def _failed(name: str, **changes) -> dict:
    rec = _record(name, **changes)
    return {**rec, "status": "failed", "metrics": None, "steps": [], "energy": None, "carbon": None,
            "error": {"type": "OutOfMemoryError", "message": "CUDA out of memory\nTried to allocate 2 GiB",
                      "rank": 0, "traceback": None, "log": None}}


def _compare(docs_a: list[dict], docs_b: list[dict], *args, **kwargs):
    """compare_run on documents built here, typed as the loader types a folder's files."""
    return compare_run(records_of(docs_a), records_of(docs_b), *args, **kwargs)


def _config(doc: dict) -> Config:
    """A document's config as the loader types it: what compare's identity is computed from."""
    return records_of([doc])[0].config


def _metric(run, name: str):
    return next(m for m in run.metrics if m.metric == name)


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(["compare", *argv])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


# ----------------------------------------------------------------------------- the interval


def test_interval_is_scipys_pooled_t_on_the_log_figures():
    recs_a = records_of(_repeats(DENSE, 1.0, [1.0, 1.07, 0.96]))
    recs_b = records_of(_repeats(DENSE, 1.25, [1.0, 0.93]))
    run = compare_run(recs_a, recs_b, DEFAULT_THRESHOLD)
    assert (run.repeats_a, run.repeats_b) == (3, 2)
    for metric in METRICS:
        a = np.array([metric.figure(r) for r in recs_a])
        b = np.array([metric.figure(r) for r in recs_b])
        ci = stats.ttest_ind(np.log(b), np.log(a), equal_var=True).confidence_interval(0.95)
        m = _metric(run, metric.name)
        assert m.ci95 == (math.exp(ci.low), math.exp(ci.high)), metric.name  # to the last digit
        assert (m.a, m.b, m.ratio) == (np.median(a), np.median(b), np.median(b) / np.median(a))
    assert _metric(run, "tokens_per_s").verdict is Verdict.BETTER  # 25 % faster with ±7 % spread
    assert _metric(run, "j_per_token").verdict is Verdict.BETTER  # lower is better


def test_one_repeat_a_side_gives_no_interval_and_says_how_to_get_one():
    run = _compare(_repeats(DENSE, 1.0, [1.0]), _repeats(DENSE, 2.0, [1.0]))
    tps = _metric(run, "tokens_per_s")
    assert (tps.ci95, tps.reason) == (None, "one repeat a side: no interval (run --repeat 2 or more)")
    assert tps.ratio == pytest.approx(2.0)  # the ratio is still shown ...
    assert (tps.verdict, tps.point_estimate) == (Verdict.BETTER, True)  # ... and judged by the threshold alone
    tps = _metric(_compare(_repeats(DENSE, 1.0, [1.0, 1.02]), _repeats(DENSE, 2.0, [1.0])), "tokens_per_s")
    assert tps.ci95 is not None and tps.verdict is Verdict.BETTER  # pooled: one side may have one repeat


# Simulation: a run measured with 5 % run-to-run spread (a log-normal multiplier per repeat) and 2 % step
# spread (20 steps a repeat; tok/s = tokens per step / median step time), compared with itself (nothing
# changed) or with a run 1.3× as fast. 500 pairs per repeat count and case (3,000 in all, ~5 s: one scipy
# t test a pair). The old bootstrap over records and steps covered 1.3 in 70 % of folders at 2 repeats and
# called 21 % of unchanged runs better or worse.
SIM_PAIRS = 500
SIM_TRUE_RATIO = 1.3


def _simulated_side(rng: np.random.Generator, base: Record, repeats: int, speed: float) -> list[Record]:
    run = rng.lognormal(0.0, 0.05, repeats)
    steps = base.steps[1].time_s / (speed * run[:, None]) * rng.lognormal(0.0, 0.02, (repeats, 20))
    tps = base.metrics.tokens_per_step / np.median(steps, axis=1)
    # Only tok/s: MFU and energy absent (n/a, no test): one t test per compared pair.
    return [replace(base, repeat=i, metrics=replace(base.metrics, tokens_per_s=float(t), mfu=None, energy=None))
            for i, t in enumerate(tps)]


@pytest.mark.heavy  # in this process, a second or more: the full pass runs it, the fast tier does not
def test_simulated_coverage_and_false_calls_at_2_3_and_5_repeats():
    rng = np.random.default_rng(20240601)
    base = read_record(FIXTURES / DENSE)
    tps_metric = METRICS[0]
    measured = {}
    for repeats in (2, 3, 5):
        covered = false_strict = false_default = 0
        for _ in range(SIM_PAIRS):
            faster = compare_run(_simulated_side(rng, base, repeats, 1.0),
                                 _simulated_side(rng, base, repeats, SIM_TRUE_RATIO), 0.0, "sim")
            lo, hi = faster.metrics[0].ci95
            covered += lo <= SIM_TRUE_RATIO <= hi
            same = compare_run(_simulated_side(rng, base, repeats, 1.0), _simulated_side(rng, base, repeats, 1.0),
                               0.0, "sim").metrics[0]
            false_strict += same.verdict in (Verdict.BETTER, Verdict.WORSE)  # threshold 0: the interval alone
            false_default += verdict(tps_metric, same.ratio, same.ci95, DEFAULT_THRESHOLD) is not Verdict.SAME
        measured[repeats] = (covered / SIM_PAIRS, false_strict / SIM_PAIRS, false_default / SIM_PAIRS)
    print("repeats: (coverage of 1.3, false calls at threshold 0, at 5 %)", measured)
    for repeats, (coverage, _, false_default) in measured.items():
        assert 0.93 <= coverage <= 0.97, (repeats, measured)
        assert false_default <= 0.06, (repeats, measured)
    assert sum(f for _, f, _ in measured.values()) / 3 <= 0.06, measured  # 1,500 unchanged pairs, threshold 0


# ----------------------------------------------------------------------------- verdicts


def test_twice_as_fast_is_better_identical_is_no_change():
    a = _repeats(DENSE)
    verdicts = {m.metric: m.verdict for m in _compare(a, _repeats(DENSE, 2.0)).metrics}
    assert verdicts == {"tokens_per_s": Verdict.BETTER, "mfu": Verdict.BETTER, "j_per_token": Verdict.BETTER,
                        "gco2e_per_mtok": Verdict.BETTER}
    verdicts = {m.metric: m.verdict for m in _compare(a, _repeats(DENSE, 0.5)).metrics}
    assert set(verdicts.values()) == {Verdict.WORSE}
    run = _compare(a, _repeats(DENSE))
    assert {m.verdict for m in run.metrics} == {Verdict.SAME}
    assert [m.ratio for m in run.metrics] == pytest.approx([1.0] * 4)


def test_a_small_significant_change_below_the_threshold_is_no_change():
    steady = [1.0, 1.001, 0.999]  # ±0.1 %: a 3 % change stands out
    a, b = _repeats(DENSE, 1.0, steady), _repeats(DENSE, 1.03, steady)
    tps = _metric(_compare(a, b), "tokens_per_s")
    assert tps.ci95[0] > 1  # the interval excludes 1 ...
    assert tps.verdict is Verdict.SAME  # ... but 3 % is under the 5 % threshold
    assert _metric(_compare(a, b, threshold=0.02), "tokens_per_s").verdict is Verdict.BETTER


def test_estimated_energy_is_shown_labelled_and_not_judged(tmp_path, capsys):
    est = {"energy__source": "estimated", "metrics__energy__energy_source": "estimated"}
    a = _repeats(DENSE, 1.0, **est)
    run = _compare(a, _repeats(DENSE, 2.0))  # B measured, A estimated: the ratio mixes an estimate
    for name in ("j_per_token", "gco2e_per_mtok"):
        m = _metric(run, name)
        assert (m.verdict, m.reason, m.estimated) == (Verdict.UNAVAILABLE, ESTIMATED, True)
        assert m.ratio == pytest.approx(0.5) and m.ci95 is not None  # shown, not judged
    assert _metric(run, "tokens_per_s").verdict is Verdict.BETTER and not _metric(run, "tokens_per_s").estimated
    folder_a = _folder(tmp_path / "a", *a)
    folder_b = _folder(tmp_path / "b", *_repeats(DENSE, 0.5, **est))  # twice as slow: J/token twice as high
    rc, out, _ = _cli(capsys, str(folder_a), str(folder_b), "--fail-on-regression")
    assert rc == 1  # tok/s and MFU are worse ...
    assert "J/token (estimated)" in out and "gCO2e/Mtok (estimated)" in out and "MFU (estimated)" not in out
    rc, out, _ = _cli(capsys, str(folder_a), str(folder_b), "--json")
    jpt = {m["metric"]: m for m in json.loads(out)["runs"][0]["metrics"]}["j_per_token"]
    assert (jpt["estimated"], jpt["verdict"], jpt["reason"]) == (True, "n/a", ESTIMATED)  # ... J/token is not judged


def test_missing_figure_is_unavailable_not_a_ratio():
    # A recorded no MFU and no TFLOP/s, and no step times: the other figures still compare
    no_mfu = {"metrics__mfu": None, "metrics__tflops_per_device": None, "steps": []}
    run = _compare(_repeats(DENSE, 1.0, **no_mfu), _repeats(DENSE))
    mfu = _metric(run, "mfu")
    assert (mfu.verdict, mfu.ratio, mfu.reason) == (Verdict.UNAVAILABLE, None, "MFU not recorded in A")
    assert _metric(run, "tokens_per_s").verdict is Verdict.SAME
    partial = [_repeats(DENSE)[0], _repeats(DENSE, 1.0, **no_mfu)[1]]
    mfu = _metric(_compare(_repeats(DENSE), partial), "mfu")
    assert (mfu.verdict, mfu.reason) == (Verdict.UNAVAILABLE, "MFU not recorded in 1 of 2 records of B")


# ----------------------------------------------------------------------------- folders and the gate


def test_regression_exits_1_only_with_fail_on_regression(tmp_path, capsys):
    a = _folder(tmp_path / "a", *_repeats(DENSE))
    b = _folder(tmp_path / "b", *_repeats(DENSE, 1 / 1.5))
    rc, out, err = _cli(capsys, str(a), str(b))
    assert rc == 0 and "worse" in out
    assert "regression: dense-vs-sparse/dense w1 n1 weak · seed 0: tok/s worse (B/A 0.667)" in err
    assert _cli(capsys, str(a), str(b), "--fail-on-regression")[0] == 1
    assert _cli(capsys, str(b), str(a), "--fail-on-regression")[0] == 0  # A slower than B: better, no regression


def test_a_slowdown_in_a_folder_inside_a_is_not_diluted_by_it(tmp_path, capsys):
    """results/ and results/pr123/: A's scan read B's records too (four repeats, two slow), and a 2×
    slowdown passed the gate."""
    results = _folder(tmp_path / "results", *_repeats(DENSE))
    pr = _folder(results / "pr123", *[{**r, "started_at": "2026-12-01T00:00:00+00:00"} for r in _repeats(DENSE, 0.5)])
    rc, _, err = _cli(capsys, str(results), str(pr), "--fail-on-regression")
    assert rc == 1 and f"A ({results}): left out B's folder {pr} inside it" in err
    rc, out, _ = _cli(capsys, str(results), str(pr), "--json")
    doc = json.loads(out)
    assert (doc["runs"][0]["repeats_a"], doc["runs"][0]["repeats_b"]) == (2, 2)
    assert doc["left_out_a"] == [str(pr)] and doc["left_out_b"] == []
    assert doc["runs"][0]["metrics"][0]["ratio"] == pytest.approx(0.5)
    doc = json.loads(_cli(capsys, str(pr), str(results), "--json")[1])  # the other way round: B holds A
    assert (doc["left_out_a"], doc["left_out_b"], doc["runs"][0]["repeats_b"]) == ([], [str(pr)], 2)
    rc, _, err = _cli(capsys, str(results), str(results / "." / "pr123" / ".."))
    assert rc == 2 and "the same folder" in err


def test_a_run_failed_in_b_is_a_regression_named_with_its_error(tmp_path, capsys):
    a = _folder(tmp_path / "a", *_repeats(DENSE), *_repeats(SWITCH))
    b = _folder(tmp_path / "b", *_repeats(DENSE), _failed(SWITCH))
    rc, _, err = _cli(capsys, str(a), str(b), "--fail-on-regression")
    assert rc == 1
    assert ("regression: dense-vs-sparse/switch w1 n1 weak · seed 0 failed in B: OutOfMemoryError: "
            "CUDA out of memory") in err
    assert _cli(capsys, str(a), str(b))[0] == 0  # named, but the gate is opt-in
    doc = json.loads(_cli(capsys, str(a), str(b), "--json")[1])
    assert [f["run"] for f in doc["failed_in_b"]] == ["dense-vs-sparse/switch w1 n1 weak · seed 0"]
    assert doc["regressions"] == ["dense-vs-sparse/switch w1 n1 weak · seed 0"] and doc["only_a"] == []
    assert [r["run"] for r in doc["runs"]] == ["dense-vs-sparse/dense w1 n1 weak · seed 0"]


def test_a_run_missing_in_b_is_a_regression(tmp_path, capsys):
    a = _folder(tmp_path / "a", *_repeats(DENSE), *_repeats(SWITCH))
    b = _folder(tmp_path / "b", *_repeats(DENSE))
    rc, out, err = _cli(capsys, str(a), str(b), "--fail-on-regression")
    assert rc == 1 and "regression: dense-vs-sparse/switch w1 n1 weak · seed 0 missing in B" in err
    assert f"only in A ({a}): dense-vs-sparse/switch w1 n1 weak · seed 0" in out
    assert "no run of B is of dense-vs-sparse/switch" in out
    assert _cli(capsys, str(b), str(a), "--fail-on-regression")[0] == 0  # a run only in B is no regression


def test_a_run_failed_only_in_a_is_listed_only_in_b(tmp_path, capsys):
    a = _folder(tmp_path / "a", *_repeats(DENSE), _failed(SWITCH))
    b = _folder(tmp_path / "b", *_repeats(DENSE), *_repeats(SWITCH))
    rc, out, _ = _cli(capsys, str(a), str(b), "--json", "--fail-on-regression")
    doc = json.loads(out)
    assert rc == 0 and doc["regressions"] == []
    (only_b,) = doc["only_b"]
    assert only_b["run"] == "dense-vs-sparse/switch w1 n1 weak · seed 0"
    assert only_b["closest"] == "only failed records in A (OutOfMemoryError: CUDA out of memory)"


def test_seeds_match_only_when_ignored_and_the_unmatched_line_names_the_key(tmp_path, capsys):
    a = _folder(tmp_path / "a", *_repeats(DENSE))  # seed 0
    b = _folder(tmp_path / "b", *_repeats(DENSE, 2.0, config__train__seed=1))
    rc, out, _ = _cli(capsys, str(a), str(b))
    assert rc == 2  # nothing compared
    assert ("only in A ({}): dense-vs-sparse/dense w1 n1 weak · seed 0 on 1× NVIDIA H100 80GB HBM3 (config {}); "
            "differs from B's dense-vs-sparse/dense w1 n1 weak · seed 1 only by train.seed (0 in A, 1 in B): "
            "--ignore train.seed compares across it").format(a, identity_key(_config(_record(DENSE)))) in out
    rc, out, _ = _cli(capsys, str(a), str(b), "--ignore", "train.seed", "--json")
    doc = json.loads(out)
    (run,) = doc["runs"]
    assert rc == 0 and doc["ignored"] == ["train.seed"] and doc["only_a"] == doc["only_b"] == []
    assert run["run"] == "dense-vs-sparse/dense w1 n1 weak · seeds 0 → 1"
    assert (run["seeds_a"], run["seeds_b"]) == ([0], [1])
    assert run["metrics"][0]["verdict"] == "better"


def test_ignored_seeds_are_pooled_as_units(tmp_path, capsys):
    seeds = [{**_scaled(DENSE, s, config__train__seed=i), "run_key": f"k{i}"} for i, s in enumerate([1.0, 1.03])]
    a = _folder(tmp_path / "a", *seeds)
    b = _folder(tmp_path / "b", *[{**r, "started_at": "2026-12-01T00:00:00+00:00"} for r in seeds])
    doc = json.loads(_cli(capsys, str(a), str(b), "--ignore", "train.seed,description", "--json")[1])
    (run,) = doc["runs"]
    assert (run["run"], run["repeats_a"], run["repeats_b"]) == ("dense-vs-sparse/dense w1 n1 weak · seeds 0, 1", 2, 2)
    assert (run["configurations_a"], run["pooled"]) == (1, [])  # seeds are named by the label, not as configurations
    doc = json.loads(_cli(capsys, str(a), str(b), "--json")[1])  # without: one run per seed, one record a side
    assert [r["run"] for r in doc["runs"]] == ["dense-vs-sparse/dense w1 n1 weak · seed 0",
                                               "dense-vs-sparse/dense w1 n1 weak · seed 1"]



def _cells(out: str, column: int) -> list[str]:
    """The text table's cells of one column, one per row (a row starts where its figure cell does), each
    cell's wrapped lines joined again."""
    rows: list[list[str]] = []
    for line in out.splitlines():
        parts = line.split("│")
        if len(parts) == 10:  # a line of the table's body: 8 cells
            if parts[4].strip():
                rows.append([])
            rows[-1].append(parts[column + 1].strip())
    return [" ".join(x for x in row if x) for row in rows]


def _layers(layers: int, speed: float = 1.0) -> list[dict]:
    """The repeats of the dense run built with `layers` layers: another configuration, with its own run key."""
    return [{**r, "run_key": f"layers{layers}"} for r in _repeats(DENSE, speed, config__model__layers=layers)]


def test_configurations_pooled_by_ignore_are_named_per_side_in_text_and_json(tmp_path, capsys):
    """--ignore model.layers once merged A's layers-1 and layers-2 runs into one run of four "repeats",
    its figure a blend, with nothing saying A mixed two configurations."""
    a = _folder(tmp_path / "a", *_layers(1), *_layers(2, 0.5))
    b = _folder(tmp_path / "b", *_layers(2), *_layers(3))
    rc, out, _ = _cli(capsys, str(a), str(b), "--ignore", "model.layers", "--json")
    (run,) = json.loads(out)["runs"]
    assert (run["configurations_a"], run["configurations_b"]) == (2, 2)
    assert (run["ignored_values_a"], run["ignored_values_b"]) == ({"model.layers": [1, 2]}, {"model.layers": [2, 3]})
    pooled = ["pools 2 configurations on side A: model.layers = 1, 2",
              "pools 2 configurations on side B: model.layers = 2, 3"]
    assert run["pooled"] == pooled
    rc, out, err = _cli(capsys, str(a), str(b), "--ignore", "model.layers", "--fail-on-regression")
    cell = _cells(out, 0)[0]  # the run's cell, in its first row
    assert rc == 0 and all(p in cell for p in pooled)
    one = _folder(tmp_path / "one", *_layers(1))  # one configuration on B's side: said, as what it holds
    doc = json.loads(_cli(capsys, str(a), str(one), "--ignore", "model.layers", "--json")[1])
    assert doc["runs"][0]["pooled"] == ["pools 2 configurations on side A: model.layers = 1, 2",
                                        "one configuration on side B: model.layers = 1"]
    assert (doc["runs"][0]["configurations_a"], doc["runs"][0]["configurations_b"]) == (2, 1)
    slow = _folder(tmp_path / "slow", *_layers(1, 0.25), *_layers(2, 0.125))  # a gate names what a row pools
    rc, _, err = _cli(capsys, str(a), str(slow), "--ignore", "model.layers", "--fail-on-regression")
    assert rc == 1 and ("regression: dense-vs-sparse/dense w1 n1 weak · seed 0 (pools 2 configurations on side "
                        "A: model.layers = 1, 2; pools 2 configurations on side B: model.layers = 1, 2): tok/s "
                        "worse") in err
    two = _folder(tmp_path / "two", *_layers(1))
    doc = json.loads(_cli(capsys, str(one), str(two), "--ignore", "model.layers", "--json")[1])  # nothing pooled
    assert (doc["runs"][0]["pooled"], doc["runs"][0]["ignored_values_a"], doc["runs"][0]["configurations_b"]) == \
        ([], {}, 1)


def test_a_2x_slowdown_with_one_repeat_a_side_fails_the_gate_on_its_point_estimate(tmp_path, capsys):
    """Once "one repeat a side: no interval" and exit 0: a gate must not pass what it cannot judge. With no
    interval the threshold judges the point ratio alone (as asv does without statistics), and says so."""
    a = _folder(tmp_path / "a", *_repeats(DENSE, 1.0, [1.0]))
    b = _folder(tmp_path / "b", *_repeats(DENSE, 0.5, [1.0]))
    rc, out, err = _cli(capsys, str(a), str(b), "--fail-on-regression")
    assert rc == 1
    assert "regression: dense-vs-sparse/dense w1 n1 weak · seed 0: tok/s worse (B/A 0.500), MFU worse" in err
    assert err.count("; point estimate: one repeat a side: no interval (run --repeat 2 or more)") == 1
    assert _cells(out, 7)[0] == "worse (point estimate: one repeat a side: no interval (run --repeat 2 or more))"
    doc = json.loads(_cli(capsys, str(a), str(b), "--json")[1])
    tps = doc["runs"][0]["metrics"][0]
    assert (tps["verdict"], tps["point_estimate"], tps["ci95"]) == ("worse", True, None)
    assert tps["reason"] == "one repeat a side: no interval (run --repeat 2 or more)"
    assert doc["regressions"] == ["dense-vs-sparse/dense w1 n1 weak · seed 0"]


def test_a_change_within_the_threshold_with_one_repeat_a_side_passes_saying_point_estimate(tmp_path, capsys):
    a = _folder(tmp_path / "a", *_repeats(DENSE, 1.0, [1.0]))
    b = _folder(tmp_path / "b", *_repeats(DENSE, 1 / 1.02, [1.0]))  # 2 % slower
    rc, out, err = _cli(capsys, str(a), str(b), "--fail-on-regression")
    assert rc == 0 and "regression" not in err
    assert _cells(out, 7)[0] == ("no significant change (point estimate: one repeat a side: no interval "
                                 "(run --repeat 2 or more))")
    tps = json.loads(_cli(capsys, str(a), str(b), "--json")[1])["runs"][0]["metrics"][0]
    assert (tps["verdict"], tps["point_estimate"], tps["ratio"]) == ("no significant change", True,
                                                                     pytest.approx(1 / 1.02))
    two = json.loads(_cli(capsys, str(a), str(_folder(tmp_path / "c", *_repeats(DENSE))), "--json")[1])
    assert two["runs"][0]["metrics"][0]["point_estimate"] is False  # an interval: judged by it

@pytest.mark.parametrize("keys", ["train.sed", "train.seed,bogus"])
def test_an_unknown_ignore_key_exits_2_naming_it(tmp_path, capsys, keys):
    a = _folder(tmp_path / "a", *_repeats(DENSE))
    b = _folder(tmp_path / "b", *_repeats(DENSE))
    rc, _, err = _cli(capsys, str(a), str(b), "--ignore", keys)
    assert rc == 2 and "--ignore" in err and repr(keys.split(",")[-1]) in err
    assert "train.seed'" not in err  # the valid one is not named as unknown


def test_hardware_is_shown_not_matched_and_other_configs_are_told_apart(tmp_path, capsys):
    a = _folder(tmp_path / "a", *_repeats(DENSE), *_repeats(SWITCH))
    other_gpu = _repeats(DENSE)
    for rec in other_gpu:
        for dev in rec["env"]["devices"]:
            dev["name"] = "NVIDIA H200"
    lr = _repeats(DENSE, config__train__lr=1e-3)  # another config: another run
    b = _folder(tmp_path / "b", *other_gpu, *[{**r, "run_key": "lr"} for r in lr])
    rc, out, _ = _cli(capsys, str(a), str(b), "--json")
    doc = json.loads(out)
    assert rc == 0 and [r["run"] for r in doc["runs"]] == ["dense-vs-sparse/dense w1 n1 weak · seed 0"]
    assert (doc["runs"][0]["hardware_a"], doc["runs"][0]["hardware_b"]) == ("1× NVIDIA H100 80GB HBM3",
                                                                            "1× NVIDIA H200")
    assert [u["run"] for u in doc["only_a"]] == ["dense-vs-sparse/switch w1 n1 weak · seed 0"]
    (lr_run,) = doc["only_b"]
    assert lr_run["identity"] == identity_key(_config(lr[0])) != doc["runs"][0]["identity"]  # told apart
    assert "only by train.lr (0.0003 in A, 0.001 in B)" in lr_run["closest"]
    assert doc["method"].startswith("95 % interval: Student's t on the repeats' log figures, pooled run-to-run spread")


def test_identity_ignores_what_does_not_define_the_workload():
    rec = _record(DENSE)
    moved = _record(DENSE, config__description="another text", config__train__timeout_s=5.0,
                    config__carbon__pue=1.5)
    assert identity_key(_config(rec)) == identity_key(_config(moved))
    assert identity_key(_config(rec)) != identity_key(_config(_record(DENSE, config__train__micro_batch=4)))
    assert identity_key(_config(rec)) != identity_key(_config(_record(DENSE, config__train__seed=1)))
    assert identity_key(_config(rec), [("train", "seed")]) == identity_key(
        _config(_record(DENSE, config__train__seed=1)), [("train", "seed")])


@pytest.mark.parametrize("which", ["missing", "empty", "file"])
def test_bad_folder_exits_2_naming_it(tmp_path, capsys, which):
    good = _folder(tmp_path / "good", *_repeats(DENSE))
    bad = tmp_path / "bad"
    if which == "empty":
        bad.mkdir()
    elif which == "file":
        shutil.copy(FIXTURES / DENSE, bad)
    rc, _, err = _cli(capsys, str(good), str(bad))
    assert rc == 2 and str(bad) in err


def test_record_strings_never_drive_the_terminal(tmp_path, capsys):
    hostile = "\x1b]0;pwned\x07[red]x[/red]"
    a = _folder(tmp_path / "a", *_repeats(DENSE, workload=hostile), *_repeats(SWITCH, workload=hostile))
    b = _folder(tmp_path / "b", *_repeats(DENSE, workload=hostile), _failed(SWITCH, workload=hostile))
    rc, out, err = _cli(capsys, str(a), str(b))
    assert rc == 0
    for stream in (out, err):
        assert "\x1b" not in stream and "\\x1b]0;pwned\\x07[red]x[/red]" in stream.replace("\n", "")


@pytest.mark.parametrize("threshold", ["-0.1", "1.5"])
def test_a_threshold_outside_0_to_1_is_refused(tmp_path, capsys, threshold):
    a = _folder(tmp_path / "a", *_repeats(DENSE))
    rc, _, err = _cli(capsys, str(a), str(a), "--threshold", threshold)
    assert rc == 2 and "--threshold" in err


def test_the_repeats_of_a_run_written_to_one_folder_are_compared_as_its_repeats(tmp_path):
    a, b = tmp_path / "a", _folder(tmp_path / "b", *_repeats(DENSE))
    a.mkdir()
    for i, speed in enumerate((1.0, 0.8, 0.5)):  # run --repeat 3: one run key, repeats 0, 1, 2
        write_record(a, {**_scaled(DENSE, speed), "repeat": i})
    (run,) = compare_folders(a, b).runs
    assert (run.repeats_a, run.repeats_b) == (3, 2)
    assert _metric(run, "tokens_per_s").a == pytest.approx(0.8 * _record(DENSE)["metrics"]["tokens_per_s"])


def _bounded(rec: dict, share: float) -> dict:
    """The record with its energy's relative bound set to ±share."""
    jpt = rec["metrics"]["energy"]["j_per_token"]
    rec["metrics"]["energy"]["j_per_token_bound"] = {"low": jpt * (1 - share), "high": jpt * (1 + share)}
    return rec


def test_an_energy_change_inside_the_meters_bound_is_not_resolvable_whatever_the_repeats_say():
    """Two runs 1 % apart in J/token with ±3 % meter bounds: the meters cannot tell them apart, even where
    the repeats are tight enough for a significant t-test; with ±0.2 % bounds a 10 % change is judged."""
    a = [_bounded(r, 0.03) for r in _repeats(DENSE, spread=[1.0, 1.0005, 0.9995])]
    b = [_bounded(r, 0.03) for r in _repeats(DENSE, speed=1 / 1.01, spread=[1.0, 1.0005, 0.9995])]
    m = next(x for x in _compare(a, b, threshold=0.0).metrics if x.metric == "j_per_token")
    assert m.verdict is Verdict.UNRESOLVABLE and m.ratio == pytest.approx(1.01, rel=1e-3)
    assert m.meter_bound[0] < 1 < m.meter_bound[1] and "cannot tell these runs apart" in m.reason
    a = [_bounded(r, 0.002) for r in _repeats(DENSE, spread=[1.0, 1.0005, 0.9995])]
    b = [_bounded(r, 0.002) for r in _repeats(DENSE, speed=1 / 1.1, spread=[1.0, 1.0005, 0.9995])]
    m = next(x for x in _compare(a, b).metrics if x.metric == "j_per_token")
    assert m.verdict is Verdict.WORSE and m.meter_bound[0] > 1


def test_two_folders_that_differ_only_by_threads_per_rank_name_the_difference(tmp_path, capsys):
    """The likeliest cause of a CPU run's 10× change is in the hardware column on both sides, not hidden
    behind the same CPU name."""
    name = "smoke__dense-tiny__w1n1-weak__ee7bbe62e331231c.json"
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    doc = to_dict(read_record(FIXTURES / name))
    for folder, threads in (("a", 2), ("b", 1)):
        doc["env"]["threads_per_rank"] = threads
        (tmp_path / folder / name).write_bytes(encode(doc))
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--json"]) == 0
    (run,) = json.loads(capsys.readouterr().out)["runs"]
    assert run["hardware_a"].endswith(", 2 threads per rank") and run["hardware_b"].endswith(", 1 thread per rank")


def test_one_folders_runs_at_two_thread_counts_are_two_runs_never_pooled(tmp_path, capsys):
    """A at 1 and 2 threads per rank, B at 1: the 1-thread runs compare with each other; A's 2-thread run is not
    pooled into that row (its tok/s would move the median) but listed as missing in B, with why."""
    name = "smoke__dense-tiny__w1n1-weak__ee7bbe62e331231c.json"
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    doc = to_dict(read_record(FIXTURES / name))
    tokens = doc["metrics"]["tokens_per_s"]
    for folder, threads, speed in (("a", 1, 1.0), ("a", 2, 9.0), ("b", 1, 1.0)):
        one = {**doc, "env": {**doc["env"], "threads_per_rank": threads},
               "metrics": {**doc["metrics"], "tokens_per_s": tokens * speed}}
        (tmp_path / folder / name.replace(".json", f"-t{threads}.json")).write_bytes(encode(one))
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--json", "--fail-on-regression"]) == 1
    out = json.loads(capsys.readouterr().out)
    (run,) = out["runs"]
    assert run["hardware_a"] == run["hardware_b"] and run["hardware_a"].endswith(", 1 thread per rank")
    tok = next(m for m in run["metrics"] if m["metric"] == "tokens_per_s")
    assert tok["a"] == tok["b"] == tokens
    (missing,) = out["only_a"]
    assert missing["hardware"].endswith(", 2 threads per rank")
    assert "B has this config at other threads per rank only (1× " in missing["closest"]
