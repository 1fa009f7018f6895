"""The results API: a results folder as tidy, typed pandas DataFrames with a fixed column list.

    import benchsuite
    runs = benchsuite.load("results")         # one row per record
    steps = benchsuite.load_steps("results")  # one row per (record, measured step)

The columns and their dtypes below are a contract (listed in the README): a figure a run did not
measure is NaN (never 0), whatever records the folder holds, and an empty folder gives the same
columns with no rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from benchsuite.results.store import load_records, records_dataframe


@dataclass(frozen=True)
class Column:
    name: str
    dtype: str  # a pandas dtype name; "category" columns take the values in `categories`
    source: str  # the records_dataframe column it comes from
    categories: tuple[str, ...] = ()


COLUMNS = (
    Column("run_key", "string", "run_key"),
    Column("repeat", "Int64", "repeat"),
    Column("suite", "string", "suite"),
    Column("workload", "string", "workload"),
    Column("status", "category", "status", ("ok", "failed")),
    Column("kind", "category", "kind", ("dense", "moe")),
    Column("router", "string", "router"),
    Column("world_size", "Int64", "world_size"),
    Column("nodes", "Int64", "nodes"),
    Column("scaling", "category", "scaling", ("weak", "strong")),
    Column("tensor", "Int64", "tensor"),
    Column("zero", "Int64", "zero"),
    Column("expert", "Int64", "expert"),
    Column("started_at", "datetime64[ns, UTC]", "started_at"),
    Column("duration_s", "float64", "duration_s"),
    Column("tokens_per_s", "float64", "tokens_per_s"),
    Column("mfu", "float64", "mfu"),
    Column("step_time_median_s", "float64", "step_time_median_s"),
    Column("step_time_ci95_lo_s", "float64", "step_time_ci95_lo_s"),
    Column("step_time_ci95_hi_s", "float64", "step_time_ci95_hi_s"),
    Column("scaling_efficiency", "float64", "scaling_efficiency"),
    Column("tflops_per_device", "float64", "metrics.tflops_per_device"),
    Column("model_flops_per_token", "float64", "metrics.flops.model_per_token"),
    Column("params_active", "float64", "metrics.params.active"),
    Column("peak_memory_bytes", "float64", "metrics.memory.peak_allocated_bytes"),
    Column("energy_j", "float64", "energy.total_j"),
    Column("gpu_energy_j", "float64", "energy.gpu_j"),
    Column("energy_source", "category", "energy.source", ("measured", "sampled", "estimated", "unavailable")),
    Column("j_per_token", "float64", "metrics.energy.j_per_token"),
    Column("gpu_j_per_token", "float64", "metrics.energy.gpu_j_per_token"),
    Column("gco2e_per_mtok", "float64", "metrics.energy.gco2e_per_mtok"),
    Column("co2e_g", "float64", "carbon.co2e_g"),
    Column("intensity_g_per_kwh", "float64", "carbon.intensity_g_per_kwh"),
    Column("flagged", "bool", "flagged"),
    Column("error_type", "string", "error_type"),
    Column("path", "string", "path"),
)

STEP_COLUMNS = (
    Column("run_key", "string", "run_key"),
    Column("suite", "string", "suite"),
    Column("workload", "string", "workload"),
    Column("path", "string", "path"),  # tells repeats of one run apart, and joins with load()
    Column("step", "Int64", "step"),
    Column("time_s", "float64", "time_s"),
    Column("loss", "float64", "loss"),
    Column("tokens", "Int64", "tokens"),
    Column("val_loss", "float64", "val_loss"),
)


def _typed(values: pd.Series, col: Column) -> pd.Series:
    """values as col.dtype; None, NaN and missing all become the dtype's missing value, never 0."""
    if col.dtype == "float64":
        return pd.to_numeric(values, errors="coerce").astype("float64")
    if col.dtype == "Int64":
        return pd.to_numeric(values, errors="coerce").astype("Int64")
    if col.dtype == "category":
        return pd.Series(pd.Categorical(values, categories=col.categories), index=values.index)
    if col.dtype.startswith("datetime64"):
        return pd.to_datetime(values, utc=True, format="ISO8601").astype(col.dtype)
    if col.dtype == "bool":
        return values.fillna(False).astype(bool)
    return values.astype(col.dtype)


def _frame(raw: pd.DataFrame, columns: tuple[Column, ...]) -> pd.DataFrame:
    missing = pd.Series([None] * len(raw), index=raw.index, dtype=object)
    return pd.DataFrame({c.name: _typed(raw[c.source] if c.source in raw else missing, c) for c in columns})


def _folder(path: str | Path) -> Path:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such results folder or record")
    return path


def load(path: str | Path) -> pd.DataFrame:
    """Every record under path (a results folder or one record file): one row each, COLUMNS typed."""
    return _frame(records_dataframe(_folder(path)), COLUMNS)


def load_steps(path: str | Path) -> pd.DataFrame:
    """One row per (record, measured step): step time, training loss, tokens and validation loss
    (NaN after the steps with no evaluation)."""
    rows = [{"run_key": rec["run_key"], "suite": rec["suite"], "workload": rec["workload"], "path": rec["_path"],
             **step} for rec in load_records(_folder(path)) for step in rec.get("steps") or []]
    return _frame(pd.DataFrame(rows), STEP_COLUMNS)
