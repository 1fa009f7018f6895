"""The intervals every view shows, from scipy's t tests on log values.

Figures here are positive and compared as ratios: on logs a ratio is a difference, and
exp(mean ± t·s/√n) of the logs is an interval for the centre of a log-normal spread (its
geometric mean). The point shown is the median (of one side) or the ratio of medians.

- log_t_interval: one figure over n units (seeds), Student's t on the logs (scipy.stats.ttest_1samp).
- welch_ratio: a ratio of two independent groups (the seeds of two workloads), Welch's t on the
  difference of mean logs with Welch–Satterthwaite's exact degrees of freedom (scipy.stats.ttest_ind,
  equal_var=False).
- pooled_ratio: B/A of one run measured twice (compare): Student's t with the pooled run-to-run spread
  (equal_var=True). One run on two machines has about the same spread between repeats, and at 2 repeats
  a side Welch's degrees of freedom make a 95 % interval cover about 98 % of the time; the pooled test
  covers 95 %, and still gives an interval when one side was measured once.
n = 1 (or 1 + 1 for a ratio) gives no interval, never a zero-width one.
"""

from __future__ import annotations

import math
import statistics
import warnings
from dataclasses import dataclass

import numpy as np

LEVEL = 0.95
ONE_SEED = "one seed: no interval (sweep train.seed)"


@dataclass(frozen=True)
class ConfidenceInterval:
    """A figure (a median, or a ratio of medians) and its 95 % interval; lo/hi null with the reason."""

    point: float | None
    lo: float | None
    hi: float | None
    n: int  # the units it is over (for a ratio: the smaller side's)
    reason: str | None = None

    def contains(self, x: float) -> bool | None:
        return None if self.lo is None else self.lo <= x <= self.hi


def no_interval(n: int, reason: str, point: float | None = None) -> ConfidenceInterval:
    return ConfidenceInterval(point, None, None, n, reason)


def run_median(by_seed: list[tuple[int, float]]) -> float:
    """A run's figure from (seed, value) pairs of its records: the median over seeds of each seed's median
    over its repeats (results/model.py computes its frames so; compare and `carbon project` call this)."""
    seeds: dict[int, list[float]] = {}
    for seed, value in by_seed:
        seeds.setdefault(seed, []).append(value)
    return float(np.median([np.median(v) for v in seeds.values()]))


def _exp_ci(ci) -> tuple[float, float]:
    return float(math.exp(ci.low)), float(math.exp(ci.high))


def _quiet(test, *args, **kw):
    """A t test where identical values (zero spread) give a zero-width interval, without scipy's
    precision warning."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        return test(*args, **kw).confidence_interval(LEVEL)


def _median(xs: list[float]) -> float:
    """np.median's answer (NaN where a value is NaN) for a few plain floats, without numpy's per-call cost: a
    report judges tens of thousands of runs and pairs, each over a handful of seeds."""
    return math.nan if any(math.isnan(x) for x in xs) else float(statistics.median(xs))


def log_t_interval(values: list[float], unit: str = "seed") -> ConfidenceInterval:
    """Median of values; exp of Student's t-interval on the mean of their logs."""
    xs = [float(v) for v in values]
    if not xs:
        return no_interval(0, "no value")
    point = _median(xs)
    if any(x <= 0 for x in xs):
        return no_interval(len(xs), "a value is not positive: no log interval", point)
    if len(xs) == 1:
        return no_interval(1, ONE_SEED if unit == "seed"
                           else f"one {unit}: no interval", point)
    from scipy import stats  # here: importing scipy.stats takes ~0.5 s, which a view without intervals need not pay

    xs = np.asarray(xs)
    lo, hi = _exp_ci(_quiet(stats.ttest_1samp, np.log(xs), 0.0))
    if not (math.isfinite(lo) and math.isfinite(hi)):  # identical values: scipy's interval is the mean
        lo = hi = float(np.exp(np.log(xs).mean()))
    return ConfidenceInterval(point, lo, hi, int(xs.size))


def _ratio(num_values, den_values, equal_var: bool, unit: str) -> ConfidenceInterval:
    a, b = [float(v) for v in num_values], [float(v) for v in den_values]
    n = min(len(a), len(b))
    if n == 0:
        return no_interval(0, "no value on " + ("both sides" if len(a) == len(b) else "one side"))
    if any(x <= 0 for x in (*a, *b)):
        return no_interval(n, "a value is not positive: no ratio")
    point = _median(a) / _median(b)
    too_few = (len(a) + len(b) < 3) if equal_var else (len(a) < 2 or len(b) < 2)
    if too_few:
        what = "on a side" if not equal_var else "a side"
        hint = " (sweep train.seed)" if unit == "seed" else " (run --repeat 2 or more)"
        return no_interval(n, f"one {unit} {what}: no interval{hint}", point)
    from scipy import stats  # (as in log_t_interval)

    la, lb = np.log(np.asarray(a)), np.log(np.asarray(b))
    lo, hi = _exp_ci(_quiet(stats.ttest_ind, la, lb, equal_var=equal_var))
    if not (math.isfinite(lo) and math.isfinite(hi)):  # no spread on either side
        lo = hi = float(math.exp(la.mean() - lb.mean()))
    return ConfidenceInterval(point, lo, hi, n)


def welch_ratio(num_values: list[float], den_values: list[float], unit: str = "seed") -> ConfidenceInterval:
    """num/den: the ratio of medians, and exp of Welch's t-interval on mean(log num) − mean(log den)."""
    return _ratio(num_values, den_values, equal_var=False, unit=unit)


def pooled_ratio(num_values: list[float], den_values: list[float], unit: str = "repeat") -> ConfidenceInterval:
    """num/den: the ratio of medians, and exp of Student's pooled t-interval on the difference of mean logs
    (needs 3 values in all, so one side may have one)."""
    return _ratio(num_values, den_values, equal_var=True, unit=unit)
