"""Reading values out of records: nested lookup and what counts as a figure, shared by the store,
the sanity guard, the report and the dashboard.

Records hold null for what was not measured; pandas turns those into NaN or NA once they sit in
a DataFrame. Both views ask the same two questions of a value: is it a real figure, and what
float is it.
"""

from __future__ import annotations

import math
import statistics
import sys
from typing import Any


def present(v: Any) -> bool:
    """A real figure: not None, not NaN/inf, not pandas' NA."""
    if v is None or isinstance(v, bool):
        return v is not None
    if isinstance(v, (int, float)):
        return math.isfinite(v)
    if isinstance(v, str):  # (most text: not worth asking pandas)
        return True
    pandas = sys.modules.get("pandas")  # a value of pandas' own (NA, NaT) comes only with pandas loaded
    if pandas is None:
        return True
    try:
        return not pandas.isna(v)
    except (TypeError, ValueError):
        return True


def num(v: Any) -> float | None:
    """A finite float or None (for figure data, sort keys and arithmetic on record values)."""
    if isinstance(v, bool) or not present(v):
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def dig(d: Any, *keys: str) -> Any:
    """d[k1][k2]... or None where a level is missing (records from older versions lack sections)."""
    for k in keys:
        if not isinstance(d, dict):
            return None
        d = d.get(k)
    return d


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b, or None when a is unknown or b is unknown or 0 (a figure per unit of nothing is no figure)."""
    return None if a is None or not b else a / b


def format_step_ms(median: float | None, lo: float | None = None, hi: float | None = None) -> str | None:
    """A step time in milliseconds with its CI in brackets, compact: 420.0 (407.4–436.8); the median
    alone without a CI; None without a median. Seconds in, for the report and the dashboard."""
    if median is None:
        return None
    if lo is None or hi is None:
        return f"{median * 1e3:.1f}"
    return f"{median * 1e3:.1f} ({lo * 1e3:.1f}–{hi * 1e3:.1f})"


def coefficient_of_variation(xs: list[float]) -> float | None:
    """Sample standard deviation over mean of the step times: how steady the measured steps were (None
    for fewer than two, a mean of 0, or times whose squares leave float range)."""
    if len(xs) < 2:
        return None
    try:
        cv = statistics.stdev(xs) / statistics.fmean(xs)
    except (ZeroDivisionError, OverflowError, ValueError):
        return None
    return cv if math.isfinite(cv) else None
