"""Seed intervals, dense/sparse ratios and the claims table, on hand-built records."""

import math

import numpy as np
import pytest
from scipy import stats

from benchsuite.results.model import results_of
from benchsuite.results.store import loaded
from benchsuite.results.stats import ConfidenceInterval, log_t_interval, welch_ratio
from benchsuite.results.verdicts import verdicts as verdicts_of
from benchsuite.results.verdicts import CLAIMS, Consistency, Ranking, judge, verdicts_doc


def verdicts(recs):
    """The verdicts of the results model of these hand-built records (completed to the record's types)."""
    return verdicts_of(results_of(loaded([complete(r) for r in recs])))


def complete(rec: dict) -> dict:
    """A hand-built record over a minimal valid one (helpers.records.make_record): every declared field
    present, the hand-built sections merged in."""
    from helpers.records import make_record

    full = make_record(run_key=rec["run_key"], workload=rec["workload"], status=rec["status"])
    full.update({k: v for k, v in rec.items() if k not in ("config", "metrics", "env")})
    for section in ("config", "metrics", "env"):
        merged = dict(full.get(section) or {})
        for key, value in (rec.get(section) or {}).items():
            merged[key] = {**merged[key], **value} if isinstance(value, dict) and isinstance(merged.get(key), dict) \
                else value
        full[section] = merged
    full["flags"] = []
    return full


def record(workload, seed, tokens, *, router=None, reached=True, step_s=0.1, suite="s", energy_j=None, flops=1e6):
    kind = "dense" if router is None else "moe"
    q = {"target_loss": 3.0, "reached": reached, "final_val_loss": 2.7 + seed / 100}
    if reached:
        q.update(step=tokens / 1000, tokens=tokens, seconds=tokens / 10_000, model_flops=tokens * flops,
                 energy_j=energy_j if energy_j is not None else tokens / 100, co2e_g=tokens / 1e4)
    return {"suite": suite, "workload": workload, "status": "ok", "run_key": f"{workload}{seed}",
            "config": {"kind": kind, "world_size": 1, "nodes": 1, "scaling": "weak", "train": {"seed": seed},
                       "moe": None if router is None else {"router": router, "experts": 4}},
            "metrics": {"quality": q, "tokens_per_step": 1000, "step_time_s": {"median": step_s},
                        "tokens_per_s": 1000 / step_s, "flops": {"model_per_token": flops},
                        "params": {"total": 2e5}, "energy": {"j_per_token": 0.01, "gco2e_per_mtok": 1.0},
                        "mfu": None},
            "env": {"devices": [{"name": "cpu"}]}, "energy": {"source": "measured"},
            "steps": [{"step": i, "time_s": step_s * (1 + 0.01 * (i % 5))} for i in range(20)]}


def listed(doc: dict) -> dict:
    """A verdicts document with its iterators made lists."""
    return {k: v if isinstance(v, (str, list)) else list(v) for k, v in doc.items()}


def seeds(workload, tokens, **kw):
    return [record(workload, i, t, **kw) for i, t in enumerate(tokens)]


def test_the_interval_over_seeds_is_the_t_interval_of_the_logs():
    interval = log_t_interval([100, 200, 400])
    # logs ln100, ln200, ln400: mean ln200, sd ln2; t(0.975, 2) = 4.303
    half = stats.t.ppf(0.975, 2) * math.log(2) / math.sqrt(3)  # 4.303
    assert interval.point == 200 and interval.n == 3
    assert interval.lo == pytest.approx(200 * math.exp(-half)) and interval.hi == pytest.approx(200 * math.exp(half))
    one = log_t_interval([150])
    assert (one.point, one.lo, one.hi) == (150, None, None) and "one seed" in one.reason


def test_a_workloads_to_target_interval_comes_from_its_seed_records():
    v = verdicts(seeds("dense", [100_000, 200_000, 400_000]))
    (w,) = v.workloads
    half = stats.t.ppf(0.975, 2) * math.log(2) / math.sqrt(3)  # 4.303
    assert w.seeds == [0, 1, 2] and w.reached == 3
    assert w.figures["tokens"].point == 200_000
    assert w.figures["tokens"].lo == pytest.approx(200_000 * math.exp(-half))
    assert w.figures["energy_j"].hi == pytest.approx(2000 * math.exp(half))
    assert w.per_step["tokens_per_s"] == log_t_interval([10_000.0] * 3)  # every seed at 10,000 tok/s


def test_seeds_that_did_not_reach_the_target_are_counted_not_dropped():
    failed = {**record("dense", 3, 0), "status": "failed", "metrics": {}, "steps": []}
    recs = seeds("dense", [100_000, 200_000]) + [record("dense", 2, 0, reached=False), failed]
    (w,) = verdicts(recs).workloads
    assert (w.reached, w.not_reached, w.n, w.failed) == (2, [2], 3, [3])
    assert w.figures["tokens"].n == 2  # the interval is over the two that reached, and says so by its n
    assert w.figures["final_val_loss"].n == 3


def test_a_ratio_interval_is_welchs_t_on_the_logs():
    r = welch_ratio([50, 100, 200], [100, 200, 400])
    # equal log sds (ln2): se = ln2·sqrt(2/3), Welch df = 4, t = 2.776
    half = 2.776 * math.log(2) * math.sqrt(2 / 3)
    assert r.point == 0.5
    assert (r.lo, r.hi) == (pytest.approx(0.5 * math.exp(-half), rel=1e-3), pytest.approx(0.5 * math.exp(half),
                                                                                          rel=1e-3))


@pytest.mark.parametrize("a, b", [([50, 90, 200], [100, 230]), ([1.0, 1.1, 1.3, 0.9], [2.0, 2.6, 2.1]),
                                  ([3.0, 3.3], [1.0, 1.5, 1.2, 1.1, 0.95])])
def test_the_over_seeds_ratio_equals_scipys_welch_interval_to_the_last_digit(a, b):
    """Unequal spreads and sizes: Welch–Satterthwaite's degrees of freedom are fractional, never rounded."""
    ci = stats.ttest_ind(np.log(a), np.log(b), equal_var=False).confidence_interval(0.95)
    r = welch_ratio(a, b)
    assert (r.lo, r.hi) == (math.exp(ci.low), math.exp(ci.high))
    one = stats.ttest_1samp(np.log(a), 0).confidence_interval(0.95)
    assert (log_t_interval(a).lo, log_t_interval(a).hi) == (math.exp(one.low), math.exp(one.high))


def test_a_pair_whose_interval_holds_1_is_not_ranked_and_one_that_excludes_it_is():
    noisy = seeds("dense", [100_000, 200_000, 400_000]) + seeds("switch", [50_000, 100_000, 200_000], router="switch")
    (tokens,) = [p for p in verdicts(noisy).pairs if p.figure == "tokens"]
    assert tokens.ratio.point == 0.5 and tokens.ratio.contains(1.0)
    assert tokens.ranking is Ranking.NOT_SIGNIFICANT and tokens.text == "no significant difference at 3 seeds"
    tight = seeds("dense", [100_000, 110_000, 121_000]) + seeds("switch", [50_000, 55_000, 60_500], router="switch")
    (tokens,) = [p for p in verdicts(tight).pairs if p.figure == "tokens"]
    assert tokens.ratio.hi < 1 and tokens.ranking is Ranking.LESS and tokens.text == "switch · w1 lower"


def test_a_sparse_run_is_paired_with_the_dense_run_of_its_backbone_else_with_every_dense_one():
    """In one suite and layout: switch-a (built on dense-a's model) against dense-a alone, not dense-b;
    switch-c, whose model no dense run has, against both dense runs."""
    def on(model: dict, recs: list[dict]) -> list[dict]:
        return [{**r, "config": {**r["config"], "model": model}} for r in recs]

    a, b, c = (dict(layers=2, hidden=64), dict(layers=4, hidden=64), dict(layers=2, hidden=128))
    recs = (on(a, seeds("dense-a", [100_000, 110_000])) + on(b, seeds("dense-b", [100_000, 110_000]))
            + on(a, seeds("switch-a", [50_000, 55_000], router="switch"))
            + on(c, seeds("switch-c", [50_000, 55_000], router="switch")))
    pairs = {(p.sparse.split(" · ")[0], p.dense.split(" · ")[0]) for p in verdicts(recs).pairs}
    assert pairs == {("switch-a", "dense-a"), ("switch-c", "dense-a"), ("switch-c", "dense-b")}


def test_a_claim_whose_workloads_are_missing_is_not_testable_and_names_them():
    recs = seeds("dense", [100_000, 110_000, 121_000]) + seeds("sw", [50_000, 55_000, 60_500], router="switch")
    checks = {c.claim.key: c for c in verdicts(recs).claims}
    ec = checks["ec-steps"]
    assert ec.consistency is Consistency.NOT_TESTABLE and ec.measured is None
    assert "expert_choice" in ec.reason and "gshard" in ec.reason and "missing workload" in ec.reason
    assert "gshard" in checks["sparse-energy-gshard"].reason and "dense" not in checks["sparse-energy-gshard"].reason
    speedup = checks["switch-speedup"]  # dense / switch seconds: 2× with a tight interval, inside (1, 7]
    assert speedup.measured.point == pytest.approx(2.0) and speedup.consistency is Consistency.CONSISTENT
    energy = checks["sparse-energy"]  # 0.5× the energy, interval well above 0.1
    assert energy.measured.point == pytest.approx(0.5) and energy.consistency is Consistency.NOT_CONSISTENT


def test_the_step_time_claim_reads_gshard_over_expert_choice():
    recs = seeds("g", [100_000] * 3, router="gshard", step_s=0.12) + seeds("ec", [40_000] * 3,
                                                                         router="expert_choice", step_s=0.1)
    checks = {c.claim.key: c for c in verdicts(recs).claims}
    step = checks["gshard-step"]
    assert step.measured.point == pytest.approx(1.2) and step.consistency is Consistency.CONSISTENT
    steps = checks["ec-steps"]  # 40,000 / 100,000 tokens: 0.4× the steps, no spread
    assert steps.measured.point == pytest.approx(0.4) and steps.consistency is Consistency.CONSISTENT


def test_a_claim_at_equal_flops_is_not_testable_when_the_flops_differ():
    recs = seeds("dense", [100_000] * 3) + seeds("sw", [50_000] * 3, router="switch", flops=2e6)
    (check,) = [c for c in verdicts(recs).claims if c.claim.key == "switch-speedup"]
    assert check.consistency is Consistency.NOT_TESTABLE and "differ by 100%" in check.reason


@pytest.mark.parametrize("lo, hi, expected", [(0.2, 0.4, Consistency.CONSISTENT), (0.6, 0.9, Consistency.NOT_CONSISTENT),
                                              (0.3, 0.7, Consistency.INCONCLUSIVE)])
def test_a_claim_holds_only_when_the_whole_interval_is_in_its_region(lo, hi, expected):
    assert judge(ConfidenceInterval(0.5, lo, hi, 3), CLAIMS[0].region) is expected


def test_the_verdicts_document_is_plain_json():
    import json

    doc = listed(verdicts_doc(verdicts(seeds("dense", [1e5, 2e5, 4e5]) + seeds("s", [5e4, 1e5, 2e5],
                                                                       router="switch"))))
    json.dumps(doc, allow_nan=False)
    assert doc["pairs"][0]["ranking"] in {r.value for r in Ranking}
    assert {c["consistency"] for c in doc["claims"]} <= {c.value for c in Consistency}


def _site(recs):
    from benchsuite.dashboard.data import load

    recs = [complete(r) for r in recs]
    for r in recs:
        seed = r["config"]["train"]["seed"]
        r["metrics"]["quality"]["curve"] = [{"step": s, "tokens": s * 1000, "val_loss": 6 - s / 40 + seed / 10}
                                            for s in (0, 20, 40, 60)]
        r.update(started_at="2026-01-01T00:00:00Z", duration_s=1.0, energy={}, carbon={})
    return load(recs)


def test_the_quality_page_draws_each_seed_faintly_and_the_median_bold_with_its_band():
    from benchsuite.dashboard.pages import quality

    data = _site(seeds("dense", [1e5, 2e5, 4e5]) + seeds("sw", [5e4, 1e5, 2e5], router="switch"))
    html, (fig,) = quality.seed_curves(data)
    dense = [t for t in fig.data if t.get("legendgroup") == "dense · w1"]
    faint, band, median = dense[:3], dense[3], dense[4]
    assert all(t["line"]["width"] == 1 and t["line"]["color"].endswith(",0.3)") for t in faint)
    assert median["line"]["width"] == 3 and median["name"] == "dense · w1 (median of 3 seeds)"
    assert median["x"] == [20_000, 40_000, 60_000] and median["y"] == [pytest.approx(6 - s / 40 + 0.1) for s in (20, 40, 60)]
    at20 = log_t_interval([6 - 0.5 + k / 10 for k in range(3)])
    assert band["y"][0] == pytest.approx(at20.hi, rel=1e-4) and band["y"][-1] == pytest.approx(at20.lo, rel=1e-4)
    assert "no significant difference at 3 seeds" in html  # tokens 0.5× but the interval holds 1


def test_the_pairs_over_seeds_are_the_first_pairs_with_an_interval_the_one_seed_ones_not_computed(monkeypatch):
    """The claims page shows the pairs of two or more seeds a side: the same pairs, in the same order, as the whole
    list filtered, without computing a ratio of one seed."""
    from benchsuite.results import verdicts as module

    recs = (seeds("dense", [1e5, 1.1e5, 1.2e5]) + seeds("sw", [5e4, 5.5e4, 6e4], router="switch")
            + seeds("gs", [6e4, 6.6e4], router="gshard") + seeds("one", [7e4], router="switch"))
    v = verdicts(recs)
    over_seeds = [p for p in v.pairs if p.ratio.n >= 2]
    assert len(over_seeds) == 18 and len(v.pairs) == 27  # sw, gs and one against dense, 9 figures each
    computed, real = [], module.pair_ratio
    monkeypatch.setattr(module, "pair_ratio", lambda f: computed.append(f.sparse.workload) or real(f))
    fresh = verdicts(recs)
    assert fresh.pairs_over_seeds(200) == over_seeds and fresh.pairs_over_seeds(5) == over_seeds[:5]
    assert "one" not in computed


def test_the_claims_page_names_what_is_missing_and_ranks_nothing_it_cannot():
    import plotly.graph_objects as go

    from benchsuite.dashboard.pages import claims, summary_pages

    assert "claims" in [p.slug for p in summary_pages()]
    section = claims.render(_site(seeds("dense", [1e5, 1.1e5, 1.21e5]) + seeds("sw", [5e4, 5.5e4, 6.05e4],
                                                                                router="switch")))
    assert "not testable here: missing workload: a moe workload with router = &#x27;expert_choice&#x27;" in section.html
    assert "sw · w1 lower" in section.html and "consistent" in section.html
    go.Figure(section.figures[0].spec())  # a valid Plotly figure


def test_estimated_energy_is_shown_never_ranked_or_held_against_a_claim():
    """On a CPU host energy is a fixed power × time: its J/token ratio is the step-time ratio again."""
    recs = seeds("dense", [1e5, 1.1e5, 1.21e5]) + seeds("sw", [5e4, 5.5e4, 6.05e4], router="switch")
    for r in recs:
        r["energy"] = {"source": "estimated"}
    v = verdicts(recs)
    by_figure = {p.figure: p for p in v.pairs}
    for figure in ("j_per_token", "energy_j", "co2e_g"):
        assert by_figure[figure].ranking is Ranking.UNAVAILABLE and "estimated energy" in by_figure[figure].text
        assert by_figure[figure].ratio.point is not None  # shown, with its interval
    assert by_figure["tokens"].ranking is Ranking.LESS  # what is not energy is still ranked
    (claim,) = [c for c in v.claims if c.claim.key == "sparse-energy"]
    assert claim.consistency is Consistency.NOT_TESTABLE and "estimated energy" in claim.reason


def test_a_cell_of_several_lines_keeps_its_line_breaks_in_the_report(tmp_path, capsys):
    """One line per dense run of the layout in the ratio and verdict cells, not one line with \\x0a in it."""
    from rich.console import Console

    from benchsuite.results.report import interval_table

    recs = (seeds("dense-a", [5000, 5200, 5100]) + seeds("dense-b", [6000, 6100, 5900])
            + seeds("switch", [3000, 3100, 2900], router="switch"))
    console = Console(record=True, width=300)
    console.print(interval_table(verdicts(recs)))
    text = console.export_text()
    assert "\\x0a" not in text
    assert any("÷ dense-a" in line and "÷ dense-b" not in line for line in text.splitlines())


def test_without_a_target_there_are_no_to_target_rows_and_no_seed_is_said_to_miss_it():
    recs = seeds("dense", [100_000, 200_000, 300_000])
    for r in recs:
        r["metrics"]["quality"] = {"target_loss": None, "reached": None, "final_val_loss": 2.7}
    (w,) = verdicts(recs).workloads
    assert list(w.figures) == ["final_val_loss"] and w.not_reached == [] and w.reached == 0


def test_the_claims_table_draws_its_first_checks_and_counts_the_rest():
    """A check per suite that holds a claim's workloads (thousands on a team's folder): the table draws fit.rows
    of the testable ones, the whole table's first rows, and counts the rest."""
    from rich.console import Console

    from benchsuite.results.report import Fit, claims_table

    recs = [r for suite in ("s1", "s2", "s3") for r in
            seeds("dense", [100_000, 110_000, 121_000], suite=suite)
            + seeds("switch", [50_000, 55_000, 60_500], router="switch", suite=suite)]
    for r in recs:
        r["run_key"] += r["suite"]
        r["config"]["suite"] = r["suite"]  # (a run is its config: one suite's, not another's)
    v = verdicts(recs)
    testable = [c for c in v.claims if c.consistency is not Consistency.NOT_TESTABLE]
    assert len({c.suite for c in testable}) == 3 and len(testable) >= 3

    def rows(table) -> list[tuple]:
        return list(zip(*(column.cells for column in table.columns)))

    whole, cut = claims_table(v), claims_table(v, Fit(rows=2))
    console = Console(record=True, width=400)
    console.print(cut)
    assert f"… {len(testable) - 2:,} more checks of claims not shown" in console.export_text()
    assert len(rows(whole)) == len(testable) and rows(cut) == rows(whole)[:2] and "more checks" not in whole.caption


def test_claims_these_runs_cannot_test_are_one_line_each_claim_once(capsys):
    from rich.console import Console

    from benchsuite.results.report import claims_table

    v = verdicts(seeds("dense", [100_000, 200_000, 300_000]))
    console = Console(record=True, width=200)
    console.print(claims_table(v))
    text = console.export_text()
    assert "none of the" in text and "published claims is testable" in text
    caption = " ".join(text.split())
    for c in {c.claim.text for c in v.claims}:
        assert caption.count(" ".join(c.split())) == 1  # each claim named once, not a row each


def _group(kind: str, jpt: list[float], share: float) -> "SeedGroup":
    """A run of three seeds with these J/token and tok/s, whose energy the meters bound to ±share."""
    from benchsuite.results.verdicts import SeedGroup
    from helpers.records import make_record, records_of

    records = records_of([{**make_record(), "metrics": {"energy": {
        "j_per_token": v, "j_per_token_bound": {"low": v * (1 - share), "high": v * (1 + share)}}}} for v in jpt])
    return SeedGroup("s", kind, kind, None if kind == "dense" else "switch", kind, kind, (1, 1, "weak", "cpu", None),
                     False, {i: {"j_per_token": v, "tokens_per_s": 1000.0} for i, v in enumerate(jpt)}, records)


def test_a_sparse_dense_energy_ratio_inside_the_meters_bounds_is_not_resolvable():
    """1 % apart with tight seeds (a significant t-interval) but ±3 % meters: not resolvable; ±0.2 % meters and
    10 % apart: ranked."""
    from benchsuite.results.verdicts import Ranking, pair_figures, pair_ratio

    dense = [1.0, 1.0005, 0.9995]
    close = {p.figure: p for p in map(pair_ratio, pair_figures(_group("moe", [v * 0.99 for v in dense], 0.03),
                                                               _group("dense", dense, 0.03)))}
    assert close["j_per_token"].ranking is Ranking.UNRESOLVABLE
    assert "cannot tell these runs apart" in close["j_per_token"].text
    assert close["tokens_per_s"].ranking is not Ranking.UNRESOLVABLE  # the bound is the energy meters' alone
    far = {p.figure: p for p in map(pair_ratio, pair_figures(_group("moe", [v * 0.9 for v in dense], 0.002),
                                                             _group("dense", dense, 0.002)))}
    assert far["j_per_token"].ranking is Ranking.LESS


def _bounded(recs: list[dict], scale: float, share: float | None) -> list[dict]:
    """recs with J/token scaled per seed and bounded by the meters to ±share (None: no bound)."""
    for i, r in enumerate(recs):
        v = 0.01 * scale * (1, 1.0005, 0.9995)[i % 3]
        bound = None if share is None else {"low": v * (1 - share), "high": v * (1 + share)}
        r["metrics"]["energy"] = {"j_per_token": v, "gco2e_per_mtok": 1.0, "j_per_token_bound": bound}
    return recs


@pytest.mark.heavy  # over a second in this process: the full pass runs it, the fast tier does not
def test_the_verdicts_read_the_models_columns_decode_no_record_and_equal_those_read_from_the_records(
        tmp_path, monkeypatch):
    """The verdicts of a folder read through its index decode no record (they read the results model's columns:
    targets, the meters' bounds, router, parameters, FLOPs; the claims' hardware alone from each blob), and equal
    the verdicts of the same runs read from their decoded records (compare.relative_bound per record)."""
    import dataclasses
    import shutil

    from benchsuite.record import write_record
    from benchsuite.results import index, rows, store
    from benchsuite.results.verdicts import seed_groups
    from benchsuite.results.verdicts import verdicts_of as verdicts_of_groups
    from helpers import REPO

    monkeypatch.setattr(store, "MIN_FILES", 0)  # every folder indexed, whatever its size
    monkeypatch.setattr(index, "RACY_NS", -1)  # files written this second trusted by the index
    fixture = tmp_path / "fixture"
    shutil.copytree(REPO / "tests/fixtures/results", fixture, ignore=shutil.ignore_patterns(index.INDEX_DIR))
    built = tmp_path / "built"
    built.mkdir()
    dense = [1e5, 1.1e5, 0.9e5]
    for suite, scale, share in (("close", 0.99, 0.03), ("far", 0.9, 0.002), ("unbounded", 0.9, None)):
        for r in (_bounded(seeds("dense", dense, suite=suite), 1.0, share)
                  + _bounded(seeds("switch", [t * 0.8 for t in dense], router="switch", suite=suite), scale, share)):
            r["run_key"] += suite
            r["config"]["suite"] = suite  # (a run is its config: one suite's, not another's)
            write_record(built, complete(r))
    for folder in (fixture, built):
        store.load_records(folder)  # the index written
        results = results_of(store.load_records(folder))
        decoded, real = [], rows.record_of_blob
        monkeypatch.setattr(rows, "record_of_blob", lambda blob: decoded.append(blob) or real(blob))
        from_columns = verdicts_of(results)
        columns_doc = listed(verdicts_doc(from_columns))  # (every part computed: each is made when read)
        assert decoded == [], folder.name
        by_records = [dataclasses.replace(g, records=list(g.records), run_facts=None, _values={})
                      for g in seed_groups(results)]
        assert len(decoded) == (results.df["status"] == "ok").sum()  # (the reference decodes every ok record)
        assert listed(verdicts_doc(verdicts_of_groups(by_records))) == columns_doc, folder.name
        monkeypatch.setattr(rows, "record_of_blob", real)
    energy = {p.suite: p.ranking for p in from_columns.pairs if p.figure == "j_per_token"}
    assert energy == {"close": Ranking.UNRESOLVABLE, "far": Ranking.LESS, "unbounded": Ranking.LESS}
    here = {c.conditions.split("; paper:")[0].rsplit(", ", 1)[-1] for c in from_columns.claims if c.suite}
    assert here == {"1× cpu"}  # the claims' hardware, read from the blobs
