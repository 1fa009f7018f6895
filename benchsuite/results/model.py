"""The results model: a folder's records grouped once into runs, with every figure every view shows.

    run identity (resolved config less seed and repeat, plus hardware: results/identity.py)
      └ seed
          └ repeat (one record each)

A run's figure is the median over each seed's repeats, then the median over its seeds; the headline
figures (INTERVALS) carry a 95 % interval over seeds (results/stats.py: Student's t on the logs). A seed
whose repeats spread more than NOISY_CV in tokens/s is flagged as a noisy measurement. Scaling
efficiency is the run's figure against its baseline run's (results/scaling.py). The report and its
--json, every dashboard page, `list`, load() and load_runs(), `compare`'s medians (stats.run_median),
`carbon project` and the verdicts over seeds read this model; nothing is aggregated a second way.
(export writes one codecarbon row per record: nothing there is aggregated.)
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import pandas as pd

from benchsuite.record.columns import view_columns
from benchsuite.record.names import record_name
from benchsuite.record.sanity import flag_summary, sanity_flags
from benchsuite.record.types import Record
from benchsuite.record.values import coefficient_of_variation, num, present
from benchsuite.results.identity import SEED, TEXT_ONLY, seeds_text, told_apart, without
from benchsuite.results.rows import QUALITY
from benchsuite.results.routing import ROUTING_COLUMN, RoutingPair, routing_pairs
from benchsuite.results.scaling import VARIES_IN_A_SWEEP, add_scaling_efficiency
from benchsuite.results.stats import ONE_SEED, ConfidenceInterval, log_t_interval
from benchsuite.results.store import Loaded, cyclic_gc_paused, dataframe_of, load_records

NOISY_CV = 0.10  # tokens/s of one seed's repeats: a coefficient of variation above this is a noisy measurement
# Energy per unit of work (metrics.energy) under short names, in both frames.
DERIVED = ("j_per_token", "gco2e_per_mtok", "avg_w_per_device", "j_per_pflop")
# The figures each run states with a 95 % interval over its seeds: columns `<name>_lo`, `<name>_hi`.
INTERVALS = ("tokens_per_s", "mfu", "step_time_median_s", "j_per_token", "gco2e_per_mtok")
# What `per_seed` keeps of each seed (its medians over its repeats): the figures stated over seeds (INTERVALS,
# the to-target ones), and the spread of its repeats. (Every figure's per-seed median is made, for the runs'
# medians over seeds, and let go: at 100,000 records ~200 columns of them are most of the model's memory.)
PER_SEED = (*INTERVALS, *(f"quality.{key}" for key in QUALITY), "repeats", "tokens_per_s_min", "tokens_per_s_max",
            "repeat_cv", "noisy", "reached")
SERIES_KEY = ("scaling.config", "scaling.hardware")  # a sweep on one machine: a curve of the scaling figures
# Columns that identify a run or point at one record: the latest record's, never a median.
KEPT = ("world_size", "nodes", "tensor", "zero", "expert", "repeat", "seed", "error_rank", "rec",
        "scaling.threads_per_rank")


class RecordList(Sequence):
    """The typed records of loaded records, by position: each decoded when first asked for (a reader of the
    model's frames alone decodes none)."""

    def __init__(self, loaded: list[Loaded]):
        self._loaded = loaded

    def __len__(self) -> int:
        return len(self._loaded)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [one.record for one in self._loaded[i]]
        return self._loaded[i].record


@dataclass
class Results:
    """A results folder as every view reads it.

    loaded: the records as loaded (records: their typed records, decoded when asked for); df: one row per
    record (the record's row, rows.py, plus its names, and its run's efficiency and run-level flags); runs:
    one row per run identity (medians, intervals, flags, efficiency); per_seed: one row per (identity, seed)
    (medians over that seed's repeats)."""

    loaded: list[Loaded]
    df: pd.DataFrame
    runs: pd.DataFrame
    per_seed: pd.DataFrame
    source: str = ""

    @cached_property
    def records(self) -> RecordList:
        return RecordList(self.loaded)

    @property
    def ok_runs(self) -> pd.DataFrame:
        return self.ok_runs_of(list(self.runs.columns))

    def ok_runs_of(self, columns: list[str]) -> pd.DataFrame:
        """The ok runs, these of their columns (those not in the frame left out): a reader takes what it reads
        (the runs frame is ~400 columns wide: every column of 100,000 runs copied is some 500 MB)."""
        columns = [c for c in columns if c in self.runs]
        return self.runs.loc[self.runs["status"] == "ok", columns] if not self.runs.empty else self.runs[columns]

    def run_records(self, identity: str) -> list[Record]:
        """The ok records of one run, in start order."""
        return [self.records[i] for i in self._ok_records.get(identity, [])]

    @cached_property
    def _ok_records(self) -> dict[str, list[int]]:
        """identity → its ok records' indices in `records`, in start order (one pass, not one per run)."""
        ok = self.df[self.df["status"] == "ok"].sort_values("started_at", kind="stable")
        out: dict[str, list[int]] = {}
        for identity, rec in zip(ok["identity"], ok["rec"]):
            out.setdefault(identity, []).append(int(rec))
        return out

    @cached_property
    def routing_pairs(self) -> list[RoutingPair]:
        """The MoE runs that differ only by moe.routing, learned beside forced (results/routing.py)."""
        return routing_pairs(self)


def results_at(path: str | Path) -> Results:
    """Every record under path (a results folder or one record file), as the results model."""
    return results_of(load_records(path), source=str(path))


def results_of(loaded: list[Loaded], source: str = "") -> Results:
    """Records already loaded (load_records, or store.loaded for documents built in memory), grouped into
    runs."""
    records = RecordList(loaded)
    with cyclic_gc_paused(), warnings.catch_warnings():
        # pandas keeps each text column in a block of its own: any frame of the record's ~100 text fields
        # counts as "fragmented" on the first column added; the columns are added a few at a time anyway
        warnings.simplefilter("ignore", pd.errors.PerformanceWarning)
        df = dataframe_of(loaded)
        if df.empty:
            return Results(loaded, df, pd.DataFrame(), pd.DataFrame(), source)
        df = _with_names(_with(df, {name: pd.to_numeric(df[f"metrics.energy.{name}"], errors="coerce").astype(float)
                                    for name in DERIVED}), records)
        per_seed = _per_seed(df)
        runs = add_scaling_efficiency(_runs(df, per_seed))
        per_seed = per_seed[[c for c in PER_SEED if c in per_seed]]
        _add_run_flags(runs, per_seed)
        df = _with_run_columns(df, runs)
    return Results(loaded, df, runs, per_seed, source)


# -- identity and names -------------------------------------------------------------------------


def _with(df: pd.DataFrame, columns: dict) -> pd.DataFrame:
    """df with new columns added at once (one by one, a frame of 300 columns fragments)."""
    return pd.concat([df.drop(columns=[c for c in columns if c in df]), pd.DataFrame(columns, index=df.index)],
                     axis=1)


def named(loaded: list[Loaded], columns: list[str]) -> pd.DataFrame:
    """The records as the results model names them (`record_name`, `label`, `series`), with these columns of
    their rows alone: a reader that shows no figure (load_steps) builds no model of every column."""
    with cyclic_gc_paused():  # (tens of thousands of labels made beside the records: see store.cyclic_gc_paused)
        df = dataframe_of(loaded, [*NAMED_BY, *columns])
        return df if df.empty else _with_names(df, RecordList(loaded))


# The row's columns a record's name is made of (_with_names, _series_labels).
NAMED_BY = ("run_key", "suite", "workload", "scaling", *SERIES_KEY, ROUTING_COLUMN, "world_size", "nodes", "identity",
            "scaling.threads_per_rank", "seed", "repeat")


def _with_names(df: pd.DataFrame, records: RecordList) -> pd.DataFrame:
    """The series a run belongs to, and the labels that name a run ('dense · w2') and a record
    ('dense · w2 · seed 1 · repeat 0'); identity and seed are the row's (rows.py)."""
    df = _with(df, {"series_key": ["\0".join(str(v) for v in key) for key in zip(*(df[c] for c in SERIES_KEY))]})
    series = df["series_key"].map(_series_labels(df, records))
    labels = pd.Series([f"{s} · w{w}" + (f" · {n} nodes" if n > 1 else "")
                        for s, w, n in zip(series, df["world_size"], df["nodes"])], index=df.index)
    runs_named = pd.DataFrame({"label": labels, "identity": df["identity"]}).drop_duplicates()
    shared = set(runs_named.loc[runs_named["label"].duplicated(keep=False), "label"])
    in_sweep = series.copy()  # the run's name beside its world size and nodes (the report's workload column)
    if shared:  # one size of one sweep run with other threads per rank: another run, named by them
        mine = labels.isin(shared)
        threads = [_threads(t) for t in df.loc[mine, "scaling.threads_per_rank"]]
        labels[mine] = [f"{lbl} · {t}" for lbl, t in zip(labels[mine], threads)]
        in_sweep[mine] = [f"{s} · {t}" for s, t in zip(in_sweep[mine], threads)]
    names = pd.Series([record_name(lbl, s, r) for lbl, s, r in zip(labels, df["seed"], df["repeat"])],
                      index=df.index)
    twice = names.duplicated(keep=False)  # one seed's repeat measured twice (another run key, or a rerun)
    names[twice] = [f"{n} · {key}" for n, key in zip(names[twice], df.loc[twice, "run_key"])]
    return _with(df, {"series": series, "label": labels, "record_name": names, "name_in_sweep": in_sweep})


def _series_labels(df: pd.DataFrame, records: RecordList) -> dict[str, str]:
    """One short, unique name per series (a sweep on one machine): the workload; where two series would
    share a name, what tells them apart, in this order: the suite, the scaling, the hardware, the routing,
    else the config keys whose values differ, with their values (identity.told_apart)."""
    keys = df.drop_duplicates("series_key").set_index("series_key")
    labels = {k: str(w) for k, w in keys["workload"].items()}
    widen = (("suite", lambda r, lbl: f"{r['suite']}/{lbl}"), ("scaling", lambda r, lbl: f"{lbl} · {r['scaling']}"),
             ("scaling.hardware", lambda r, lbl: f"{lbl} · {r['scaling.hardware']}"),
             (ROUTING_COLUMN, lambda r, lbl: f"{lbl} · {r[ROUTING_COLUMN]} routing"))
    for column, name in widen:
        by_label: dict[str, list[str]] = {}
        for k, lbl in labels.items():
            by_label.setdefault(lbl, []).append(k)
        for lbl, ks in by_label.items():
            if len(ks) > 1 and column in keys and len({str(keys.at[k, column]) for k in ks}) > 1:
                labels.update({k: name(keys.loc[k], lbl) for k in ks})
    shared = {lbl for lbl, n in Counter(labels.values()).items() if n > 1}  # only these need their configs
    configs = {k: without(records[int(keys.at[k, "rec"])].config, (*VARIES_IN_A_SWEEP, *TEXT_ONLY, SEED))
               for k, lbl in labels.items() if lbl in shared}
    return told_apart(labels, configs)


def _threads(v) -> str:
    if num(v) is None:
        return "threads unknown"
    return f"{int(num(v))} thread" + ("s" if int(num(v)) != 1 else "")


# -- medians over repeats, then over seeds ------------------------------------------------------


def _figures(df: pd.DataFrame) -> list[str]:
    return [c for c in df.select_dtypes("number").columns if c not in KEPT]


def _per_seed(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (identity, seed) of the ok records: each figure's median over the seed's repeats,
    `repeats`, the tokens/s range and coefficient of variation, `noisy`, and `reached` (every repeat
    reached train.target_loss)."""
    has_quality = "quality.reached" in df
    # (only the columns read: a copy of the whole frame's ok rows is some 400 columns wide)
    ok = df.loc[df["status"] == "ok", ["identity", "seed", *(["quality.reached"] if has_quality else []),
                                       *_figures(df)]]
    if ok.empty:
        return pd.DataFrame()
    by = ok.groupby(["identity", "seed"], sort=False)
    tps = by["tokens_per_s"]
    seeds = by.size().index
    # a seed's repeats gathered in one pass over plain values (a Python function per pandas group costs ~0.1 ms)
    rates: dict = {}
    reached_all: dict = {}
    for key, rate, reached in zip(zip(ok["identity"], ok["seed"]), ok["tokens_per_s"],
                                  ok["quality.reached"] if has_quality else [None] * len(ok)):
        if num(rate) is not None:
            rates.setdefault(key, []).append(rate)
        reached_all[key] = reached_all.get(key, True) and reached is True
    cv = pd.Series([coefficient_of_variation(rates.get(k, [])) for k in seeds], index=seeds, dtype=float)
    reached = pd.Series([reached_all[k] for k in seeds], index=seeds, dtype=bool) if has_quality else False
    return _with(by[_figures(ok)].median(), {"repeats": by.size(), "tokens_per_s_min": tps.min(),
                                             "tokens_per_s_max": tps.max(), "repeat_cv": cv,
                                             "noisy": cv > NOISY_CV, "reached": reached})


def _runs(df: pd.DataFrame, per_seed: pd.DataFrame) -> pd.DataFrame:
    """One row per identity: its latest ok record's identity and text (its latest record's when none is
    ok), each figure as the median over seeds of per_seed, and the run's seeds, repeats, failures and
    intervals."""
    order = pd.DataFrame({"ok": df["status"] == "ok", "started_at": df["started_at"], "identity": df["identity"]})
    latest = order.sort_values(["ok", "started_at"], kind="stable").drop_duplicates("identity", keep="last").index
    # the runs in the order the views list them, found on the narrow columns, then the whole rows taken once
    # (each step over the whole frame, ~400 columns, costs time per column)
    latest = df.loc[latest, list(RUN_ORDER)].sort_values(list(RUN_ORDER), kind="stable").index
    figures = [c for c in _figures(df) if c in per_seed] if not per_seed.empty else []
    # (a run's figures are its medians: the records' own are taken only for the runs with no ok record)
    runs = df.loc[latest, [c for c in df.columns if c not in set(figures)]].set_index("identity")
    not_ok = df.loc[df["status"] != "ok", ["identity", "seed"]]  # (narrow: df is wide)
    failed = not_ok.groupby("identity").size()
    new = {"failed": failed.reindex(runs.index).fillna(0).astype(int), "repeats": 0,
           "seeds": [[] for _ in range(len(runs))], "tokens_per_s_min": np.nan, "tokens_per_s_max": np.nan,
           "repeat_cv": np.nan, "flags_in_repeats": None, "interval_reason": None,
           **{f"{name}_{end}": np.nan for name in INTERVALS for end in ("lo", "hi")}}
    if not per_seed.empty:
        medians = per_seed[figures].groupby(level="identity").median().reindex(index=runs.index).to_numpy(float)
        # a run with no ok record keeps its latest record's figures (whole columns at once: .loc on a subset of
        # rows writes each of the ~160 columns on its own)
        ok = set(per_seed.index.get_level_values("identity"))
        none_ok = np.array([i not in ok for i in runs.index], dtype=bool)
        if none_ok.any():
            medians[none_ok] = df.loc[latest[none_ok], figures].to_numpy(float)
        runs = runs.assign(**{c: medians[:, i] for i, c in enumerate(figures)})
        runs = runs[[c for c in df.columns if c != "identity"]]  # (the record's column order)
        by_id = per_seed.groupby(level="identity")
        new |= {"repeats": by_id["repeats"].sum().reindex(runs.index, fill_value=0),
                "tokens_per_s_min": by_id["tokens_per_s_min"].min().reindex(runs.index),
                "tokens_per_s_max": by_id["tokens_per_s_max"].max().reindex(runs.index),
                "repeat_cv": by_id["repeat_cv"].max().reindex(runs.index)}
        seeds: dict = {}  # identity -> its seeds (the index's pairs read once: a group at a time costs ~0.2 ms)
        for identity, seed in per_seed.index:
            seeds.setdefault(identity, []).append(int(seed))
        new["seeds"] = [sorted(seeds.get(i, [])) for i in runs.index]
    new["seed"] = [seeds_text(s) if s else str(s0) for s, s0 in zip(new["seeds"], runs["seed"])]
    failed_seeds = not_ok.groupby("identity")["seed"].agg(set).to_dict()
    new["failed_seeds"] = [sorted(failed_seeds.get(i, set()) - set(s)) for i, s in zip(runs.index, new["seeds"])]
    runs = _with(runs, new | _meter_bounds(df, runs.index))
    if not per_seed.empty:
        _add_intervals(runs, per_seed)
    runs = runs.reset_index()
    _combine_flags(runs, df)
    return runs


RUN_ORDER = ("suite", "series", "world_size", "nodes")  # the order the views list runs in


BOUND_SHARE, BOUND_EXCEEDS = view_columns("energy.bounds.total.share", "energy.bounds.total.exceeds")


def _meter_bounds(df: pd.DataFrame, identities: pd.Index) -> dict[str, pd.Series]:
    """`energy_bound_share`: the widest relative bound the meters put on a run's total energy over its ok
    records (energy/bounds.py; NaN where none has one), and `energy_bound_exceeds`: whether any is flagged."""
    if BOUND_SHARE not in df:
        return {"energy_bound_share": np.nan, "energy_bound_exceeds": False}
    ok = df.loc[df["status"] == "ok", ["identity", BOUND_SHARE, BOUND_EXCEEDS]]
    share = pd.to_numeric(ok[BOUND_SHARE], errors="coerce").groupby(ok["identity"]).max()  # numbers: a C loop
    exceeds = ok[BOUND_EXCEEDS].map(lambda v: v is True).groupby(ok["identity"]).any()
    return {"energy_bound_share": share.reindex(identities).astype(float),
            "energy_bound_exceeds": exceeds.reindex(identities).fillna(False).astype(bool)}


def _add_intervals(runs: pd.DataFrame, per_seed: pd.DataFrame) -> None:
    """`<figure>_lo`, `<figure>_hi` for INTERVALS over each run's seeds, and `interval_reason` (why tokens/s
    has none: one seed). Only the runs of two or more seeds have an interval to compute."""
    figures = per_seed[list(INTERVALS)]
    seeds = figures.groupby(level="identity").size()
    runs.loc[seeds.index[seeds == 1], "interval_reason"] = ONE_SEED
    several = figures[figures.index.get_level_values("identity").isin(seeds.index[seeds > 1])]
    for identity, g in several.groupby(level="identity"):
        for name in INTERVALS:
            interval = seed_interval(g[name])
            runs.at[identity, f"{name}_lo"] = interval.lo if interval.lo is not None else np.nan
            runs.at[identity, f"{name}_hi"] = interval.hi if interval.hi is not None else np.nan
            if name == "tokens_per_s":
                runs.at[identity, "interval_reason"] = interval.reason


def seed_interval(values: pd.Series) -> ConfidenceInterval:
    """A figure over seeds (one per-seed median each, the seeds that recorded it)."""
    return log_t_interval([v for v in (num(x) for x in values) if v is not None])


# -- flags --------------------------------------------------------------------------------------


def _combine_flags(runs: pd.DataFrame, df: pd.DataFrame) -> None:
    """A run of several records: its flags judged again on its medians (a flag on a figure it holds the
    median of), the rest kept from every record that had it, and `flags_in_repeats`: how many records
    carried a flag on each field. A run of one record keeps that record's flags."""
    ok = df.loc[df["status"] == "ok", ["identity", "flags"]]
    several = ok[ok["identity"].duplicated(keep=False)]  # (the runs of one record, most of a large folder, left out)
    groups = several.groupby("identity").indices if not several.empty else {}
    figures = set(_figures(df))
    for idx in runs.index[runs["identity"].isin(groups.keys())]:
        row = runs.loc[idx]
        rows = groups[row["identity"]]
        stored = list(several["flags"].iloc[rows])  # each record's flags, as its row holds them
        flags, counts = _combined_flags(row, stored, figures)
        runs.at[idx, "flags"], runs.at[idx, "flags_in_repeats"] = flags, counts
        runs.at[idx, "flagged"] = bool(flags)
        runs.at[idx, "flag_summary"] = _repeats_flag_summary(int(row["repeats"]), flags, counts) or None


def _combined_flags(row, repeat_flags: list, figures: set[str]) -> tuple[list[dict], dict[str, int]]:
    repeat_flags = [[f for f in flags if isinstance(f, dict) and "field" in f] if isinstance(flags, list) else []
                    for flags in repeat_flags]
    counts = Counter(field for flags in repeat_flags for field in dict.fromkeys(f["field"] for f in flags))
    on_median = {c for c in figures if present(row.get(c))}
    judged = [f for f in _figure_flags(row) if f["field"] in on_median]
    union = []
    for flags in repeat_flags:
        union += [f for f in flags if f not in union and f["field"] not in on_median]
    return judged + union, dict(counts)


def _figure_flags(row) -> list[dict]:
    """The record rules (record/sanity.sanity_flags) on the run's median metrics, energy and carbon, put back in a
    record's shape."""
    as_record = {"status": row["status"], "config": {"world_size": int(row["world_size"])},
                 "metrics": _section(row, "metrics"), "energy": _section(row, "energy"),
                 "carbon": _section(row, "carbon")}
    return sanity_flags(as_record)


def _section(row, section: str) -> dict:
    """The nested dict a record section had, from the row's dotted columns that hold a value."""
    out: dict = {}
    for column, value in row.items():
        if not (isinstance(column, str) and column.startswith(f"{section}.") and present(value)):
            continue
        *parents, leaf = column.split(".")[1:]
        part = out
        for key in parents:
            part = part.setdefault(key, {})
            if not isinstance(part, dict):
                break
        else:
            part.setdefault(leaf, value)
    return out


def _repeats_flag_summary(n: int, flags: list[dict], counts: dict[str, int]) -> str:
    on_row = {f["field"] for f in flags}
    parts = [f"{f['field']}: {f['reason']}" + (f" ({counts[f['field']]} of {n} records flagged)"
                                               if f["field"] in counts else "") for f in flags]
    parts += [f"{field}: flagged in {k} of {n} records, not on their median" for field, k in counts.items()
              if field not in on_row]
    return "; ".join(parts)


def noisy_flag(identity_seeds: pd.DataFrame) -> dict | None:
    """The flag of a run some seed of which has repeats that spread more than NOISY_CV in tokens/s."""
    noisy = identity_seeds[identity_seeds["noisy"]]
    if noisy.empty:
        return None
    parts = [f"seed {int(seed)}: {int(r['repeats'])} repeats at {r['tokens_per_s_min']:,.0f}–"
             f"{r['tokens_per_s_max']:,.0f} tok/s (CV {r['repeat_cv']:.0%})" for (_, seed), r in noisy.iterrows()]
    return {"field": "repeats", "value": float(noisy["repeat_cv"].max()),
            "seeds": sorted(int(seed) for _, seed in noisy.index),  # a record of another seed is not noisy
            "reason": f"noisy measurement: {'; '.join(parts)}, above {NOISY_CV:.0%} between repeats; the median "
                      f"may not be the machine's speed: rerun on a quiet machine, or with more steps"}


def _add_run_flags(runs: pd.DataFrame, per_seed: pd.DataFrame) -> None:
    """The flags of a run as a whole: a noisy measurement (results/model.noisy_flag) and a superlinear
    scaling efficiency (results/scaling.py adds it)."""
    if per_seed.empty:
        return
    noisy = per_seed.loc[per_seed["noisy"], ["noisy", "repeats", "tokens_per_s_min", "tokens_per_s_max",
                                             "repeat_cv"]]
    by_id = noisy.groupby(level="identity")
    for idx, identity in runs["identity"].items():
        if identity not in by_id.groups:
            continue
        flag = noisy_flag(by_id.get_group(identity))
        if flag:
            flags = [*(runs.at[idx, "flags"] if isinstance(runs.at[idx, "flags"], list) else []), flag]
            runs.at[idx, "flags"], runs.at[idx, "flagged"] = flags, True
            runs.at[idx, "flag_summary"] = flag_summary(flags)


RUN_COLUMNS = ("scaling_efficiency", "scaling_baseline", "scaling_baseline_identities", "scaling_efficiency_reason",
               "repeat_cv")


def _with_run_columns(df: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """Each record row gets its run's efficiency (the run's, never one repeat's over a median) and its
    run's run-level flags (noisy, scaling), so a record is never shown without what holds for its run."""
    by_id = runs.set_index("identity")
    df = _with(df, {column: df["identity"].map(by_id[column]) for column in RUN_COLUMNS})
    run_flags = {i: [f for f in (flags if isinstance(flags, list) else [])
                     if f.get("field") in ("repeats", "scaling_efficiency")] for i, flags in by_id["flags"].items()}
    for idx, identity in df["identity"].items():
        extra = [f for f in run_flags.get(identity, []) if f not in (df.at[idx, "flags"] or [])
                 and df.at[idx, "seed"] in f.get("seeds", [df.at[idx, "seed"]])]
        if extra and df.at[idx, "status"] == "ok":
            flags = [*(df.at[idx, "flags"] or []), *extra]
            df.at[idx, "flags"], df.at[idx, "flagged"] = flags, True
            df.at[idx, "flag_summary"] = flag_summary(flags)
    return df
