"""What every page reads: the results model (results/model.py) of a folder, with what the pages share.

`df` has one row per record and `runs` one row per run (a run identity: all its seeds and repeats),
both from the model `benchsuite report` reads: the same medians, intervals over seeds, efficiencies
and flags. The pages add the model family of each row (its colour and marker), each record's page, and `run_label`: a record's name ("dense · w2 · seed 1 ·
repeat 0") in `df`, a run's ("dense · w2") in `runs`. Lists (steps, per-device energy, expert load)
are read from the typed records (record/types.py); row `rec` indexes `SiteData.records`. A summary page reads
columns, a column at a time (a 10,000-record folder is rebuilt after each new record), and of a record only the
sections no column holds (its summary: results/rows.Summary); only a run page that is written decodes its whole
record.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import pandas as pd

from benchsuite.record.columns import view_columns
from benchsuite.record.names import record_id, slug
from benchsuite.record.types import Metrics, MoEMetrics, Record
from benchsuite.record.values import num, present
from benchsuite.results.model import Results, results_at, results_of
from benchsuite.results.rows import Summary
from benchsuite.results.store import loaded
from benchsuite.results.verdicts import SeedGroup, Verdicts, seed_groups, verdicts_of
from benchsuite.dashboard.style import Families, family

# More series than a legend can tell apart: summary figures then draw one trace per model family.
MAX_SERIES = 12
MOE_COLUMNS = view_columns("config.moe.capacity_factor", "config.moe.shared_experts")  # what a family reads


@dataclass
class SiteData:
    results: Results
    df: pd.DataFrame  # one row per record
    runs: pd.DataFrame  # one row per run

    @property
    def records(self) -> list[Record]:
        return self.results.records

    @property
    def source(self) -> str:
        return self.results.source

    @cached_property
    def seed_groups(self) -> list[SeedGroup]:
        """The ok runs with their seeds (results/verdicts.py), grouped once for every page."""
        return seed_groups(self.results)

    @cached_property
    def verdicts(self) -> Verdicts:
        """Dense vs sparse over seeds and the claims (results/verdicts.py), computed once for every page."""
        return verdicts_of(self.seed_groups)

    def record(self, row) -> Record:
        """The record of a `df` row; of a `runs` row, the run's latest record."""
        return self.records[int(row["rec"])]

    def summary(self, rec) -> Summary | Record:
        """What the summary pages read of record `rec` (a row's `rec`) beyond the model's columns (rows.Summary)."""
        return self.results.loaded[int(rec)].summary()

    def record_bytes(self, row) -> bytes | memoryview:
        """The record of a row as its blob (store.Loaded.blob: a record read from its file and then from the index
        is one fingerprint)."""
        return self.results.loaded[int(row["rec"])].blob()

    @cached_property
    def any_ok(self) -> bool:
        return bool((self.df["status"] == "ok").any()) if not self.df.empty else False

    @property
    def ok_runs(self) -> pd.DataFrame:
        """The ok runs, by series and world size: one bar or point each, its figures the run's medians."""
        return self.ok_runs_of(list(self.runs.columns))

    def ok_runs_of(self, columns: list[str]) -> pd.DataFrame:
        """ok_runs with these columns only: a page takes what it reads (the runs frame has ~400 columns, and each
        step over all of them costs time per column)."""
        return self.runs.loc[self._ok_order, columns]

    @cached_property
    def _ok_order(self) -> pd.Index:
        if self.runs.empty:
            return self.runs.index
        order = ["series", "world_size", "nodes"]
        return self.runs.loc[self.runs["status"] == "ok", order].sort_values(order, kind="stable").index


def numbers(column: pd.Series) -> list[float | None]:
    """A column as `num` reads each of its values (a finite float, else None), at once for a numeric column."""
    if pd.api.types.is_bool_dtype(column.dtype) or not pd.api.types.is_numeric_dtype(column.dtype):
        return [num(v) for v in column.tolist()]  # (num reads no bool as a figure)
    values = column.to_numpy(dtype=float, na_value=np.nan)
    return [v if finite else None for v, finite in zip(values.tolist(), np.isfinite(values).tolist())]


def plain(column: pd.Series) -> list:
    """A column's values as Python values, None where null (NaN, NA)."""
    if column.dtype.kind == "f":  # (a float is its own figure: numbers, at once)
        return numbers(column)
    return [v if isinstance(v, str) or present(v) else None for v in column.tolist()]


def page_slug(run_key: str) -> str:
    """A file name from a run key (hex in practice; anything in a hand-edited record)."""
    return slug(str(run_key), 64)


def metrics_of(rec: Record) -> Metrics:
    """The record's metrics; a failed run has none: an empty section then, every figure None."""
    return rec.metrics or Metrics()


def load_table(moe: MoEMetrics) -> tuple[list[list[float]], str] | None:
    """The [MoE layer][expert] table a load view reads, summed over ranks, and what it counts: the tokens
    each expert computed in the last step (tokens_per_expert, after capacity: records from schema 3 on),
    else those the router sent it (expert_load, before capacity: older records; it counts dropped tokens
    too). None where neither is recorded with an expert in every layer."""
    for rows, counts in ((moe.tokens_per_expert, "computed"), (moe.expert_load, "routed, before capacity")):
        if rows and all(rows):
            return rows, counts
    return None


def tokens_per_expert(moe: MoEMetrics) -> tuple[list[float], str] | None:
    """Tokens of each expert in the last step, summed over MoE layers and ranks, and what they count
    (load_table). None where no table is recorded or its layers' expert counts differ."""
    table = load_table(moe)
    if table is None or len({len(row) for row in table[0]}) != 1:
        return None
    return [sum(col) for col in zip(*table[0])], table[1]


def _families(frame: pd.DataFrame) -> None:
    """Each row's model family and its display name, from the model's columns (config.moe's capacity factor and
    shared experts: no record decoded), the family computed once per distinct combination."""
    of: dict[tuple, str] = {}
    keys = []
    for key in zip(frame["kind"].tolist(), frame["router"].tolist(), *(plain(frame[c]) for c in MOE_COLUMNS)):
        if key not in of:
            of[key] = family(*key)
        keys.append(of[key])
    frame["family"] = keys
    families = Families(of.values())
    frame["kind_label"] = [families[f].name for f in keys]


def site_data(results: Results) -> SiteData:
    """The model's frames with the columns the pages share."""
    df, runs = results.df.copy(), results.runs.copy()
    if df.empty:
        return SiteData(results, df, runs)
    df["run_label"] = df["record_name"]
    runs["run_label"] = runs["label"]
    _families(df)
    # a run's family: its latest record's
    by_rec = dict(zip(df["rec"].tolist(), zip(df["family"].tolist(), df["kind_label"].tolist())))
    runs["family"], runs["kind_label"] = zip(*(by_rec[rec] for rec in runs["rec"].tolist()))
    pages, used = [], set()
    for key, repeat in zip(df["run_key"].tolist(), df["repeat"].tolist()):
        name = base = page_slug(record_id(key, int(repeat)))
        n = 1
        while name in used:
            n += 1
            name = f"{base}-{n}"
        used.add(name)
        pages.append(f"runs/{name}.html")
    df["page"] = pages
    runs["page"] = runs["rec"].map(dict(zip(df["rec"].tolist(), pages)))  # a run links its latest record's page
    return SiteData(results, df, runs)


def load(results: str | Path | list[dict]) -> SiteData:
    """From a results folder, or record documents built in memory (read as a folder's files are: copied,
    upgraded, flagged and typed; the caller's dicts stay as they were)."""
    if isinstance(results, (str, Path)):
        return site_data(results_at(results))
    return site_data(results_of(loaded(results)))


def per_family(df: pd.DataFrame) -> bool:
    """Whether summary figures draw one trace per model family (each point the median of its sweeps)
    instead of one per series: when there are more series than a legend can tell apart, so that
    10,000 runs give a figure of a few traces, not thousands."""
    return df["series"].nunique() > MAX_SERIES
