import numpy as np
import pytest

from benchsuite.metrics.timing import summarize


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
