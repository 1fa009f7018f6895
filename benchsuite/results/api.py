"""The results API: a results folder as tidy, typed pandas DataFrames with a fixed column list.

    import benchsuite
    records = benchsuite.load("results")      # one row per record (a seed's repeat of a run)
    runs = benchsuite.load_runs("results")    # one row per run: medians, intervals over seeds, efficiency
    steps = benchsuite.load_steps("results")  # one row per (record, measured step)

All three read the results model (results/model.py), the figures `benchsuite report` and the
dashboard show. The columns and their dtypes below are a contract (listed in docs/reference/results-api.md): a figure
a run did not measure is NaN (never 0), whatever records the folder holds, and an empty folder
gives the same columns with no rows.

On a large folder, read only part of it (records the folder's index knows are left out before they
are decoded; the figures across records, a run's seeds, scaling efficiency, are those of the part read):

    benchsuite.load("results", suite="nightly")                      # one suite (or a list of suites)
    benchsuite.load_runs("results", workload=["dense", "switch"])    # these workloads
    benchsuite.load_steps("results", since="2026-11-01")             # records started on or after (UTC)
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from benchsuite.record.columns import field_column, field_columns
from benchsuite.results.model import INTERVALS, Results, named, results_of
from benchsuite.results.rows import STEPS
from benchsuite.results.store import Loaded, Selection, load_records, row_columns


@dataclass(frozen=True)
class Column:
    """A column of load(): a record field (its dtype from the record's types, record/columns.py) or, with
    `dtype` given, a figure the DataFrame computes (scaling efficiency, flags, the file)."""
    name: str
    source: str  # the results model's column it comes from: a record field's dotted path, or a computed one
    dtype: str | None = None
    categories: tuple[str, ...] = ()

    def typed(self) -> tuple[str, tuple[str, ...]]:
        if self.dtype is not None:
            return self.dtype, self.categories
        f = field_column(self.source)
        return f.dtype, f.categories


WHAT_RAN = (  # what a record and a run both say of themselves (a run: from its latest record)
    Column("suite", "suite"),
    Column("workload", "workload"),
    Column("status", "status"),  # a run: ok when some record is; failed when every one failed
    Column("kind", "config.kind"),
    Column("router", "config.moe.router"),
    Column("world_size", "config.world_size"),
    Column("nodes", "config.nodes"),
    Column("scaling", "config.scaling"),
)

COLUMNS = (
    Column("run_key", "run_key"),
    Column("identity", "identity", "string"),  # the run (results/identity.py): what its seeds and repeats share
    Column("name", "record_name", "string"),  # "dense · w2 · seed 1 · repeat 0"
    Column("seed", "config.train.seed"),
    Column("repeat", "repeat"),
    *WHAT_RAN,
    Column("tensor", "config.parallel.tensor"),
    Column("zero", "config.parallel.zero"),
    Column("expert", "config.parallel.expert"),
    Column("started_at", "started_at"),
    Column("duration_s", "duration_s"),
    Column("tokens_per_s", "metrics.tokens_per_s"),
    Column("tokens_per_s_per_device", "metrics.tokens_per_s_per_device"),
    Column("mfu", "metrics.mfu"),
    Column("step_time_median_s", "metrics.step_time_s.median"),
    Column("step_time_ci95_lo_s", "step_time_ci95_lo_s", "float64"),
    Column("step_time_ci95_hi_s", "step_time_ci95_hi_s", "float64"),
    Column("scaling_efficiency", "scaling_efficiency", "float64"),  # the run's (load_runs), on each of its records
    Column("scaling_baseline", "scaling_baseline", "string"),
    Column("tflops_per_device", "metrics.tflops_per_device"),
    Column("model_flops_per_token", "metrics.flops.model_per_token"),
    Column("params_active", "metrics.params.active"),
    Column("peak_memory_bytes", "metrics.memory.peak_allocated_bytes"),
    Column("energy_j", "energy.total_j"),
    Column("gpu_energy_j", "energy.gpu_j"),
    Column("energy_source", "energy.source"),
    Column("j_per_token", "metrics.energy.j_per_token"),
    Column("gpu_j_per_token", "metrics.energy.gpu_j_per_token"),
    Column("gco2e_per_mtok", "metrics.energy.gco2e_per_mtok"),
    Column("co2e_g", "carbon.co2e_g"),
    Column("intensity_g_per_kwh", "carbon.intensity_g_per_kwh"),
    # the meters' bound (energy/bounds.py) and the carbon beside the location-based figure (energy/footprint.py)
    Column("energy_low_j", "energy.bounds.total.low_j"),
    Column("energy_high_j", "energy.bounds.total.high_j"),
    Column("energy_bound_share", "energy.bounds.total.share"),
    Column("energy_bound_exceeds", "energy.bounds.total.exceeds"),
    Column("j_per_token_low", "metrics.energy.j_per_token_bound.low"),
    Column("j_per_token_high", "metrics.energy.j_per_token_bound.high"),
    Column("co2e_low_g", "carbon.co2e_g_bound.low"),
    Column("co2e_high_g", "carbon.co2e_g_bound.high"),
    Column("market_co2e_g", "carbon.market.co2e_g"),
    Column("embodied_co2e_g", "carbon.embodied.co2e_g"),
    Column("water_onsite_l", "carbon.water.onsite_l"),
    Column("water_offsite_l", "carbon.water.offsite_l"),
    Column("flagged", "flagged", "bool"),
    Column("error_type", "error.type"),
    Column("path", "path", "string"),
    # every scalar field of the resolved config and the environment, by its dotted path
    *(Column(path, path) for path in field_columns() if path.startswith(("config.", "env."))),
)

RUN_COLUMNS = (  # one row per run: each figure its median over each seed's repeats, then over its seeds
    Column("identity", "identity", "string"),
    Column("label", "label", "string"),  # "dense · w2"
    *WHAT_RAN,
    Column("seeds", "seed", "string"),  # "0, 1, 2"
    Column("repeats", "repeats", "Int64"),  # ok records: seeds × repeats
    Column("failed", "failed", "Int64"),  # failed records
    Column("tokens_per_s_min", "tokens_per_s_min", "float64"),
    Column("tokens_per_s_max", "tokens_per_s_max", "float64"),
    Column("repeat_cv", "repeat_cv", "float64"),  # the largest over seeds; above NOISY_CV: flagged noisy
    # the figures stated with a 95 % interval over seeds (results/model.INTERVALS): median, lo, hi
    *(Column(f"{name}{end}", f"{name}{end}", "float64") for name in INTERVALS for end in ("", "_lo", "_hi")),
    Column("interval_reason", "interval_reason", "string"),
    Column("hfu", "metrics.hfu"),
    Column("tokens_per_s_per_device", "metrics.tokens_per_s_per_device"),
    Column("tflops_per_device", "metrics.tflops_per_device"),
    Column("energy_j", "energy.total_j"),
    Column("co2e_g", "carbon.co2e_g"),
    Column("energy_bound_share", "energy_bound_share", "float64"),  # the widest over the run's ok records
    Column("energy_bound_exceeds", "energy_bound_exceeds", "bool"),
    Column("scaling_efficiency", "scaling_efficiency", "float64"),
    Column("scaling_baseline", "scaling_baseline", "string"),
    Column("scaling_efficiency_reason", "scaling_efficiency_reason", "string"),
    Column("flagged", "flagged", "bool"),
    Column("flag_summary", "flag_summary", "string"),
)
STEP_COLUMNS = (  # a step's fields (record Step) beside the identity of its record, categorical: each record's
    # text held once, not once per step (at 100,000 records of 50 steps, ~20 MB a column rather than ~130 MB)
    Column("run_key", "run_key", "category"),
    Column("name", "record_name", "category"),
    Column("suite", "suite", "category"),
    Column("workload", "workload", "category"),
    Column("path", "path", "category"),  # tells repeats of one run apart, and joins with load()
    Column("step", "step", "Int64"),
    Column("time_s", "time_s", "float64"),
    Column("loss", "loss", "float64"),
    Column("tokens", "tokens", "Int64"),
    Column("val_loss", "val_loss", "float64"),
)


def _typed(values: pd.Series, col: Column) -> pd.Series:
    """values as the column's dtype; None, NaN and missing all become the dtype's missing value, never 0."""
    dtype, categories = col.typed()
    if dtype == "float64":
        return pd.to_numeric(values, errors="coerce").astype("float64")
    if dtype == "Int64":
        return pd.to_numeric(values, errors="coerce").astype("Int64")
    if dtype == "category":  # the values the types allow, or (none given) those the column holds
        return pd.Series(pd.Categorical(values, categories=categories), index=values.index) if categories \
            else values.astype("category")
    if dtype.startswith("datetime64"):
        # a time the column cannot hold (before 1677 or after 2262: nanoseconds in int64) is NaT, not an error
        t = pd.to_datetime(values, utc=True, format="ISO8601", errors="coerce")
        held = (t >= pd.Timestamp.min.tz_localize("UTC")) & (t <= pd.Timestamp.max.tz_localize("UTC"))
        return t.where(held).astype(dtype)
    if dtype == "bool":
        return values.fillna(False).astype(bool)
    return values.astype(dtype)


def _frame(raw: pd.DataFrame, columns: tuple[Column, ...]) -> pd.DataFrame:
    # (a column of nulls made only where one is missing: load_steps' frame has 5 million rows at 100,000 records)
    missing = pd.Series([None] * len(raw), index=raw.index, dtype=object) if any(
        c.source not in raw for c in columns) else None
    # (copy=False: a column already of its dtype is the raw frame's own, not a second copy beside it)
    return pd.DataFrame({c.name: _typed(raw[c.source] if c.source in raw else missing, c) for c in columns},
                        copy=False)


Names = str | Iterable[str] | None  # one name, or any of several
Since = str | dt.date | None  # ISO 8601 text ("2026-11-30", "2026-11-30T12:00+01:00"), a date or a datetime


def _loaded(path: str | Path, suite: Names, workload: Names, since: Since) -> list[Loaded]:
    """The records under path that the filters keep: `suite` and `workload` each a name or a list of names,
    `since` the earliest start (a time without an offset is UTC)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such results folder or record")
    return load_records(path, only=Selection.of(suite=suite, workload=workload, since=since))


def _results(path: str | Path, suite: Names, workload: Names, since: Since) -> Results:
    """The results model of the records under path that the filters keep (_loaded)."""
    return results_of(_loaded(path, suite, workload, since), source=str(path))


def load(path: str | Path, *, suite: Names = None, workload: Names = None, since: Since = None) -> pd.DataFrame:
    """Every record under path (a results folder or one record file): one row each, COLUMNS typed. suite,
    workload, since: only the records of these suites, of these workloads, started at or after this time."""
    return _frame(_results(path, suite, workload, since).df, COLUMNS)


def load_runs(path: str | Path, *, suite: Names = None, workload: Names = None, since: Since = None) -> pd.DataFrame:
    """Every run under path: one row per run identity, RUN_COLUMNS typed; the figures `benchsuite report`
    shows. suite, workload, since: as load()'s, the runs made of the records they keep."""
    return _frame(_results(path, suite, workload, since).runs, RUN_COLUMNS)


def load_steps(path: str | Path, *, suite: Names = None, workload: Names = None, since: Since = None) -> pd.DataFrame:
    """One row per (record, measured step): step time, training loss, tokens and validation loss
    (NaN after the steps with no evaluation). suite, workload, since: as load()'s."""
    loaded = _loaded(path, suite, workload, since)
    if not loaded:  # nothing readable: the columns, no rows
        return _frame(pd.DataFrame(), STEP_COLUMNS)
    import pyarrow as pa
    import pyarrow.compute as pc

    steps = row_columns(loaded, [STEPS]).column(STEPS)  # a list per record, in load order: not decoded
    flat = pc.list_flatten(steps)
    columns = ["run_key", "record_name", "suite", "workload", "path"]  # by the record's position in `loaded`:
    records = pa.Table.from_pandas(named(loaded, [])[["rec", *columns]], preserve_index=False).sort_by("rec")
    parents = pc.list_parent_indices(steps).combine_chunks()  # each step's record
    own = {}
    for c in columns:  # each as its distinct values and, per step, its record's one's place among them
        distinct = records.column(c).combine_chunks().dictionary_encode()
        own[c] = pa.DictionaryArray.from_arrays(distinct.indices.take(parents), distinct.dictionary)
    table = pa.table({**own, **{f.name: pc.struct_field(flat, f.name) for f in steps.type.value_type}})
    del own, flat, steps
    # (at 100,000 records, 5 million rows: each column made in its contract's dtype, each let go as converted;
    # the record's columns, dictionaries, become categoricals)
    typed = {pa.string(): pd.StringDtype("pyarrow"), pa.int64(): pd.Int64Dtype()}
    return _frame(table.to_pandas(types_mapper=typed.get, self_destruct=True), STEP_COLUMNS)
