"""Scaling efficiency across runs (results/model.py: one row per run identity).

weak   = throughput(N) / (N × throughput(1))
strong = time(1) / (N × time(N))

A run's figure is its median (over each seed's repeats, then over its seeds). Its baseline is the
successful 1-device run of the same sweep with the same resolved config (world size and nodes aside:
strong scaling's per-rank batch is derived from them, not stored; the seed aside: a run is all its
seeds), the same hardware (the ranks' device names) and the same threads per rank. A baseline run is
shown as the baseline (efficiency 1 by definition), never as a ratio of one of its repeats to itself.
Without a baseline, efficiency is null and `scaling_efficiency_reason` says which condition no 1-device
run met. Efficiency above record.sanity.SCALING_EFFICIENCY_MAX is flagged on the run.
"""

from __future__ import annotations

import math
import statistics
from typing import TYPE_CHECKING

from benchsuite.record.sanity import flag_summary, scaling_flag
from benchsuite.record.names import digest
from benchsuite.record.types import Record
from benchsuite.results.frames import rows_of
from benchsuite.results.identity import SEED, TEXT_ONLY, hardware_of, without
from benchsuite.record.values import num, present

if TYPE_CHECKING:  # the DataFrame functions get pandas from their caller; a rank never loads it
    import pandas as pd

# What a baseline must share with a run, in the order a missing baseline is explained.
IDENTITY = (("scaling.config", "the same config"), ("scaling.hardware", "the same hardware"),
            ("scaling.threads_per_rank", "the same threads per rank"))
VARIES_IN_A_SWEEP = (("world_size",), ("nodes",))
BASELINE = "this run (the baseline)"


def scaling_identity(rec: Record, config: dict | None = None) -> dict:
    """The columns a baseline must match (rows.py adds them to every row): a hash of the resolved config less
    what varies within a sweep (and the seed and text: results/identity.py), the ranks' devices, the threads per
    rank. config: the record's config as JSON values, where the caller has them."""
    hardware = hardware_of(rec)
    cfg = rec.config if config is None else config
    return {"scaling.config": digest(without(cfg, (*VARIES_IN_A_SWEEP, *TEXT_ONLY, SEED))),
            "scaling.hardware": hardware["devices"], "scaling.threads_per_rank": hardware["threads_per_rank"]}


def _same(a, b) -> bool:
    """Equal figures, or both unknown (records that predate a field still compare with each other)."""
    return (not present(a) and not present(b)) or (present(a) and present(b) and a == b)


def find_baseline(ones: list[dict], row) -> tuple[list[dict], str | None]:
    """The qualifying 1-device runs for row (ones: the successful 1-device rows of row's sweep, as dicts: a
    sweep's handful, where a DataFrame's filtering would cost a millisecond a sweep), or none and why."""
    base = [r for r in ones if num(r.get(_figure(row))) is not None and num(r[_figure(row)]) > 0]
    if not base:
        return base, "no successful 1-device run in this sweep"
    for column, what in IDENTITY:
        if ones and column not in ones[0]:
            continue
        base = [r for r in base if _same(r.get(column), row.get(column))]
        if not base:
            return base, f"no 1-device run of this sweep with {what}"
    return base, None


def _baseline(ones: list[dict], row) -> tuple[str | None, float | None, list[str], str | None]:
    """Row's baseline among the 1-device runs of its sweep: (why there is none, its figure, its
    identities, how it is named)."""
    base, why = find_baseline(ones, row)
    if why:
        return why, None, [], None
    return (None, statistics.median(r[_figure(row)] for r in base), sorted(r["identity"] for r in base),
            "; ".join(sorted(str(r["label"]) for r in base)))


def _baseline_key(row) -> tuple:
    """What decides row's baseline: rows alike in it share one (found once, so a folder of N records
    takes time linear in N)."""
    return (_key(row["sweep_id"]), _figure(row), *(_key(row.get(c)) for c, _ in IDENTITY))


def _key(v):
    return v if present(v) else None


def _figure(row) -> str:
    """What a run is compared by: weak keeps the per-rank work, strong the global work."""
    return "step_time_median_s" if row["scaling"] == "strong" else "tokens_per_s"


def efficiency(row, theirs: float) -> float:
    """row's scaling efficiency against its baseline's figure."""
    n, mine = row["world_size"], num(row[_figure(row)])
    return theirs / (n * mine) if row["scaling"] == "strong" else mine / (n * theirs)


def _add_flag(df: pd.DataFrame, idx, flag: dict) -> None:
    flags = [*(df.at[idx, "flags"] if isinstance(df.at[idx, "flags"], list) else []), flag]
    df.at[idx, "flags"] = flags
    df.at[idx, "flagged"] = True
    df.at[idx, "flag_summary"] = flag_summary(flags)


def add_scaling_efficiency(df: pd.DataFrame) -> pd.DataFrame:
    """Adds `scaling_efficiency`, `scaling_baseline_identities` (list), `scaling_baseline` (its label, or
    BASELINE on the baseline itself) and `scaling_efficiency_reason` (why null) to a runs DataFrame (one
    row per identity, with `identity` and `label`); flags superlinear rows."""
    df = df.copy(deep=False)  # (copy on write: the caller's frame is left as it was, and no column is copied)
    for column in ("scaling_efficiency", "scaling_baseline_identities", "scaling_baseline",
                   "scaling_efficiency_reason"):
        df[column] = None
    for column, default in (("flags", None), ("flagged", False), ("flag_summary", None)):
        if column not in df:
            df[column] = default
    df["flags"] = df["flags"].astype(object)
    if df.empty or "sweep_id" not in df:
        return df
    # the columns a baseline is found by (a run frame has hundreds: rows of them cost time per run)
    narrow = df[[c for c in ("status", "world_size", "sweep_id", "scaling", "identity", "label", "tokens_per_s",
                             "step_time_median_s", *(c for c, _ in IDENTITY)) if c in df]]
    ones = narrow[(narrow["status"] == "ok") & (narrow["world_size"] == 1)]
    by_sweep: dict = {}  # sweep id -> its rows in `ones`, as dicts
    for one in rows_of(ones):
        by_sweep.setdefault(_key(one["sweep_id"]), []).append(one)
    baselines: dict[tuple, tuple] = {}  # _baseline_key -> _baseline
    n = len(df)
    found = {"scaling_efficiency": [math.nan] * n, "scaling_baseline_identities": [None] * n,
             "scaling_baseline": [None] * n, "scaling_efficiency_reason": [None] * n}
    flagged = []  # (position, flag): few, added one by one after the columns are written whole
    for pos, row in enumerate(rows_of(narrow)):
        if row["status"] != "ok":
            found["scaling_efficiency_reason"][pos] = "the run failed"
            continue
        key = _baseline_key(row)
        if key not in baselines:
            baselines[key] = _baseline(by_sweep.get(_key(row["sweep_id"]), []), row)
        reason, theirs, keys, note = baselines[key]
        mine = num(row[_figure(row)])
        if mine is None or mine <= 0:
            reason = f"this run has no {_figure(row)}"
        if reason:
            found["scaling_efficiency_reason"][pos] = reason
            continue
        found["scaling_baseline_identities"][pos] = keys
        if keys == [row["identity"]]:  # the baseline itself: 1 by definition, shown as the baseline
            found["scaling_efficiency"][pos], found["scaling_baseline"][pos] = 1.0, BASELINE
            continue
        eff = float(efficiency(row, theirs))
        found["scaling_efficiency"][pos], found["scaling_baseline"][pos] = eff, note
        flag = scaling_flag(eff, row["scaling"], int(row["world_size"]), note)
        if flag:
            flagged.append((pos, flag))
    import pandas as pd  # here, not at the top: a rank imports this module and never loads pandas

    for column, values in found.items():  # whole columns: a cell at a time costs ~30 µs each
        df[column] = pd.Series(values, index=df.index, dtype=float if column == "scaling_efficiency" else object)
    for pos, flag in flagged:
        _add_flag(df, df.index[pos], flag)
    return df
