import numpy as np
import pytest

from benchsuite.metrics.timing import summarize
from benchsuite.record.values import format_step_ms


def test_summary_matches_numpy_and_ci_brackets_the_median():
    rng = np.random.default_rng(0)
    xs = list(rng.lognormal(0, 0.2, size=41))
    s = summarize(xs)
    assert s["median"] == pytest.approx(np.median(xs))
    assert s["p10"] == pytest.approx(np.percentile(xs, 10))
    assert s["p90"] == pytest.approx(np.percentile(xs, 90))
    lo, hi = s["ci95"]
    assert lo <= s["median"] <= hi and lo > min(xs) and hi < max(xs)
    assert summarize(xs) == s  # seeded bootstrap: a record is reproducible


def test_ci_is_numpys_percentile_bootstrap_of_the_median():
    """The same definition computed here with numpy: seed 0, 2000 resamples of n with replacement,
    the 2.5th and 97.5th percentiles of their medians."""
    xs = [0.1 + 0.001 * ((7 * i) % 13) for i in range(30)]
    x = np.asarray(xs)
    medians = np.median(x[np.random.default_rng(0).integers(0, x.size, size=(2000, x.size))], axis=1)
    assert summarize(xs)["ci95"] == pytest.approx(list(np.percentile(medians, [2.5, 97.5])), rel=0, abs=0)


def test_summary_of_no_steps_is_refused_and_of_one_step_is_that_step():
    with pytest.raises(ValueError, match="no step times"):
        summarize([])
    assert summarize([0.25]) == {"median": 0.25, "p10": 0.25, "p90": 0.25, "ci95": [0.25, 0.25], "n": 1,
                                 "cv": None}  # one step: no spread to state


def test_cv_is_the_sample_standard_deviation_over_the_mean_and_old_records_get_it_from_their_steps():
    from benchsuite.results.migrate import upgrade_v3_step_time_cv

    xs = [1.0, 2.0, 3.0, 6.0]  # mean 3, sample variance (4 + 1 + 0 + 9) / 3
    assert summarize(xs)["cv"] == pytest.approx((14 / 3) ** 0.5 / 3)
    v3 = {"metrics": {"step_time_s": {"median": 2.5}}, "steps": [{"step": i, "time_s": x} for i, x in enumerate(xs)]}
    assert upgrade_v3_step_time_cv(v3)["metrics"]["step_time_s"]["cv"] == summarize(xs)["cv"]
    failed = {"metrics": None, "steps": []}
    assert upgrade_v3_step_time_cv(failed) == {"metrics": None, "steps": []}


@pytest.mark.parametrize("args, text", [((0.42, 0.4074, 0.4368), "420.0 (407.4–436.8)"), ((0.42,), "420.0"),
                                        ((0.42, None, 0.5), "420.0"), ((None,), None)])
def test_step_time_is_formatted_once_in_milliseconds(args, text):
    assert format_step_ms(*args) == text


def test_energy_windows_and_pipeline_spans_sync_through_the_one_helper(monkeypatch, tmp_path):
    import torch

    from benchsuite.energy import meters
    from benchsuite.parallel import pipeline

    synced = []
    monkeypatch.setattr(meters, "synchronize", synced.append)
    mon = meters.NodeEnergyMonitor.create(["cuda:1", "cpu", "cuda:2"], rapl_root=tmp_path / "none")
    mon.begin("w")
    mon.end("w")
    assert synced == [torch.device("cuda", 1), torch.device("cuda", 2)] * 2  # both edges, each CUDA device

    class Event:
        def elapsed_time(self, other):
            return 250.0  # ms

    synced.clear()
    monkeypatch.setattr(pipeline, "synchronize", synced.append)
    clock = pipeline.SpanClock(torch.device("cpu"))
    clock.events = [(Event(), Event())]
    assert clock.take() == 0.25 and synced == [torch.device("cuda")]
