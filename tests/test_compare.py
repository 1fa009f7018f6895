"""benchsuite compare: ratios and bootstrap CIs on hand-built records, verdicts, exit codes."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from benchsuite.results.store import read_record
from benchsuite.cli import main
from benchsuite.results.compare import (DEFAULT_RESAMPLES, Verdict, compare_folders, identity_key)

FIXTURES = Path(__file__).parent / "fixtures" / "results"
DENSE = "make_dvs-dense-w1.json"
SWITCH = "make_dvs-switch-w1.json"
TIMES_A = [0.50, 0.52, 0.49, 0.51, 0.55, 0.48, 0.50, 0.53, 0.47, 0.52]


def _record(name: str, times: list[float] | None = None, **changes) -> dict:
    """A fixture record with its step times set by hand; its MFU, J/token and gCO2e/Mtok stay those of
    the recorded median step time, so the compared figures follow the new step times."""
    rec = read_record(FIXTURES / name)  # upgraded through the chain to the current version
    if times is not None:
        rec["steps"] = [dict(rec["steps"][0], step=i, time_s=t) for i, t in enumerate(times)]
    for dotted, value in changes.items():
        *parents, leaf = dotted.split("__")
        d = rec
        for p in parents:
            d = d[p]
        d[leaf] = value
    return rec


def _folder(tmp_path: Path, name: str, *records: dict) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    for i, rec in enumerate(records):
        (folder / f"r{i}.json").write_text(json.dumps(rec))
    return folder


def _tokens_per_step(rec: dict) -> int:
    return rec["metrics"]["tokens_per_step"] if "tokens_per_step" in rec["metrics"] else rec["steps"][0]["tokens"]


def test_ratio_and_ci_equal_an_independent_numpy_bootstrap(tmp_path):
    times_b = [t * 0.8 + 0.01 * (i % 3) for i, t in enumerate(TIMES_A)]
    a = _folder(tmp_path, "a", _record(DENSE, TIMES_A))
    b = _folder(tmp_path, "b", _record(DENSE, times_b))
    c = compare_folders(a, b, seed=7)
    tps = {m.metric: m for m in c.runs[0].metrics}["tokens_per_s"]

    # By hand: tokens/s = tokens per step / median step time; steps of A and B resampled apart.
    ta, tb, n = np.array(TIMES_A), np.array(times_b), DEFAULT_RESAMPLES
    med_a = np.median(ta[np.random.default_rng([7, 0]).integers(0, ta.size, (n, ta.size))], axis=1)
    med_b = np.median(tb[np.random.default_rng([7, 1]).integers(0, tb.size, (n, tb.size))], axis=1)
    tokens = _tokens_per_step(_record(DENSE))
    assert tps.a == pytest.approx(tokens / np.median(ta))
    assert tps.ratio == pytest.approx(np.median(ta) / np.median(tb))
    assert tps.ci95 == pytest.approx(tuple(np.percentile(med_a / med_b, [2.5, 97.5])))
    # MFU ∝ 1/median, J/token ∝ median: the same resamples give the reciprocal interval.
    jpt = {m.metric: m for m in c.runs[0].metrics}["j_per_token"]
    assert jpt.ratio == pytest.approx(np.median(tb) / np.median(ta))
    assert jpt.ci95 == pytest.approx(tuple(np.percentile(med_b / med_a, [2.5, 97.5])))


def test_repeats_resample_records_then_steps(tmp_path):
    slow = [t * 1.2 for t in TIMES_A]
    a = _folder(tmp_path, "a", _record(DENSE, TIMES_A), _record(DENSE, slow))
    b = _folder(tmp_path, "b", _record(DENSE, TIMES_A))
    c = compare_folders(a, b, seed=3, resamples=500)
    assert (c.runs[0].repeats_a, c.runs[0].repeats_b) == (2, 1)
    tps = {m.metric: m for m in c.runs[0].metrics}["tokens_per_s"]

    rng = np.random.default_rng([3, 0])
    chosen = rng.integers(0, 2, (500, 2)).ravel()  # 500 draws of 2 records, then each drawn record's steps:
    meds = np.empty(chosen.size)                  # the draws of record 0 first, in order, then record 1's
    for j, t in enumerate((TIMES_A, slow)):
        drawn = np.flatnonzero(chosen == j)
        meds[drawn] = np.median(np.array(t)[rng.integers(0, 10, (drawn.size, 10))], axis=1)
    tokens = _tokens_per_step(_record(DENSE))
    side_a = np.median((tokens / meds).reshape(500, 2), axis=1)
    tb = np.array(TIMES_A)
    side_b = tokens / np.median(tb[np.random.default_rng([3, 1]).integers(0, 10, (500, 10))], axis=1)
    assert tps.a == pytest.approx(np.median([tokens / np.median(TIMES_A), tokens / np.median(slow)]))
    assert tps.ci95 == pytest.approx(tuple(np.percentile(side_b / side_a, [2.5, 97.5])))


def test_twice_as_fast_is_better_identical_is_no_change(tmp_path):
    a = _folder(tmp_path, "a", _record(DENSE, TIMES_A))
    fast = _folder(tmp_path, "fast", _record(DENSE, [t / 2 for t in TIMES_A]))
    same = _folder(tmp_path, "same", _record(DENSE, TIMES_A))
    verdicts = {m.metric: m.verdict for m in compare_folders(a, fast).runs[0].metrics}
    assert verdicts == {"tokens_per_s": Verdict.BETTER, "mfu": Verdict.BETTER, "j_per_token": Verdict.BETTER,
                        "gco2e_per_mtok": Verdict.BETTER}
    run = compare_folders(a, same).runs[0]
    assert {m.verdict for m in run.metrics} == {Verdict.SAME}
    assert [m.ratio for m in run.metrics] == pytest.approx([1.0] * 4)


def test_a_small_significant_change_below_the_threshold_is_no_change(tmp_path):
    steady = [0.5 + 0.001 * (i % 5) for i in range(20)]  # ±0.4 %: a 3 % change stands out
    a = _folder(tmp_path, "a", _record(DENSE, steady))
    b = _folder(tmp_path, "b", _record(DENSE, [t * 0.97 for t in steady]))  # 3 % faster, every step
    tps = {m.metric: m for m in compare_folders(a, b).runs[0].metrics}["tokens_per_s"]
    assert tps.ci95[0] > 1  # the CI excludes 1 ...
    assert tps.verdict is Verdict.SAME  # ... but 3 % is under the 5 % threshold
    tps = {m.metric: m for m in compare_folders(a, b, threshold=0.02).runs[0].metrics}["tokens_per_s"]
    assert tps.verdict is Verdict.BETTER


def test_regression_exits_1_only_with_fail_on_regression(tmp_path, capsys):
    a = _folder(tmp_path, "a", _record(DENSE, TIMES_A))
    b = _folder(tmp_path, "b", _record(DENSE, [t * 1.5 for t in TIMES_A]))
    assert main(["compare", str(a), str(b)]) == 0
    assert "worse" in capsys.readouterr().out
    assert main(["compare", str(a), str(b), "--fail-on-regression"]) == 1
    assert main(["compare", str(b), str(a), "--fail-on-regression"]) == 0  # A slower than B: better, no regression


def test_unmatched_runs_are_listed_and_hardware_shown(tmp_path, capsys):
    a = _folder(tmp_path, "a", _record(DENSE, TIMES_A), _record(SWITCH, TIMES_A))
    other_gpu = _record(DENSE, TIMES_A)
    for dev in other_gpu["env"]["devices"]:
        dev["name"] = "NVIDIA H200"
    lr = _record(DENSE, TIMES_A, config__train__lr=1e-3)  # another config: another run
    b = _folder(tmp_path, "b", other_gpu, lr)
    assert main(["compare", str(a), str(b), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["run"] for r in doc["runs"]] == ["dense-vs-sparse/dense w1 n1 weak"]
    assert (doc["runs"][0]["hardware_a"], doc["runs"][0]["hardware_b"]) == ("1× NVIDIA H100 80GB HBM3",
                                                                            "1× NVIDIA H200")
    assert [u["run"] for u in doc["only_a"]] == ["dense-vs-sparse/switch w1 n1 weak"]
    assert [u["run"] for u in doc["only_b"]] == ["dense-vs-sparse/dense w1 n1 weak"]  # the lr = 1e-3 run ...
    assert doc["only_b"][0]["identity"] == identity_key(lr["config"]) != doc["runs"][0]["identity"]  # ... told apart
    assert doc["runs"][0]["metrics"][0]["verdict"] == "no significant change"


def test_identity_ignores_what_does_not_define_the_workload():
    rec = _record(DENSE)
    moved = _record(DENSE, config__description="another text", config__train__timeout_s=5.0,
                    config__carbon__pue=1.5)
    assert identity_key(rec["config"]) == identity_key(moved["config"])
    assert identity_key(rec["config"]) != identity_key(_record(DENSE, config__train__micro_batch=4)["config"])


def test_missing_figure_is_unavailable_not_a_ratio(tmp_path):
    # A recorded no MFU and no TFLOP/s (schema 2: nothing to re-derive an MFU from on load)
    a = _folder(tmp_path, "a", _record(DENSE, TIMES_A, schema_version=2, metrics__mfu=None,
                                       metrics__tflops_per_device=None))
    b = _folder(tmp_path, "b", _record(DENSE, TIMES_A))
    mfu = {m.metric: m for m in compare_folders(a, b).runs[0].metrics}["mfu"]
    assert (mfu.verdict, mfu.ratio, mfu.reason) == (Verdict.UNAVAILABLE, None, "MFU not recorded in A")


@pytest.mark.parametrize("which", ["missing", "empty", "file"])
def test_bad_folder_exits_2_naming_it(tmp_path, capsys, which):
    good = _folder(tmp_path, "good", _record(DENSE, TIMES_A))
    bad = tmp_path / "bad"
    if which == "empty":
        bad.mkdir()
    elif which == "file":
        shutil.copy(FIXTURES / DENSE, bad)
    assert main(["compare", str(good), str(bad)]) == 2
    assert str(bad) in capsys.readouterr().err


def test_record_strings_never_drive_the_terminal(tmp_path, capsys):
    hostile = "\x1b]0;pwned\x07[red]x[/red]"
    a = _folder(tmp_path, "a", _record(DENSE, TIMES_A, workload=hostile), _record(SWITCH, TIMES_A, workload=hostile))
    b = _folder(tmp_path, "b", _record(DENSE, TIMES_A, workload=hostile))
    assert main(["compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\\x1b]0;pwned\\x07[red]x[/red]" in out.replace("\n", "")


@pytest.mark.parametrize("threshold", ["-0.1", "1.5"])
def test_a_threshold_outside_0_to_1_is_refused(tmp_path, capsys, threshold):
    a = _folder(tmp_path, "a", _record(DENSE, TIMES_A))
    assert main(["compare", str(a), str(a), "--threshold", threshold]) == 2
    assert "--threshold" in capsys.readouterr().err


def test_the_repeats_of_a_run_written_to_one_folder_are_compared_as_its_repeats(tmp_path):
    from benchsuite.record import write_record

    a, b = tmp_path / "a", _folder(tmp_path, "b", _record(DENSE, TIMES_A))
    a.mkdir()
    for i, scale in enumerate((1.0, 1.25, 2.0)):  # run --repeat 3: one run key, repeats 0, 1, 2
        write_record(a, {**_record(DENSE, [t * scale for t in TIMES_A]), "repeat": i})
    c = compare_folders(a, b, seed=1, resamples=200)
    (run,) = c.runs
    tps = {m.metric: m for m in run.metrics}["tokens_per_s"]
    assert (run.repeats_a, run.repeats_b) == (3, 1)
    assert tps.a == pytest.approx(_tokens_per_step(_record(DENSE)) / (1.25 * np.median(TIMES_A)))  # the median repeat
