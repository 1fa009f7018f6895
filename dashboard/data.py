"""What every page reads: the raw records and one DataFrame row per record.

The DataFrame is the one `benchsuite report` sees (results.store.dataframe_of: flatten() of each
record plus scaling efficiency), with a few columns the pages share: stable labels, the
energy-per-work figures under short names, the final validation loss, and the path of each
run's detail page. Lists (steps, per-device energy, expert load) stay in the raw records;
row `rec` indexes `SiteData.records`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from benchsuite.results.report import combine_repeats
from benchsuite.record.sanity import with_flags
from benchsuite.record.names import slug
from benchsuite.results.store import dataframe_of, load_records
from benchsuite.record.values import dig
from dashboard.render import num, present
from dashboard.style import Families, family

# More series than a legend can tell apart: summary figures then draw one trace per model family.
MAX_SERIES = 12

# Energy per unit of work (metrics.energy, metrics/energy.py), under these short names on every page.
DERIVED = ("j_per_token", "gco2e_per_mtok", "avg_w_per_device", "j_per_pflop")


@dataclass
class SiteData:
    records: list[dict]
    df: pd.DataFrame
    source: str = ""

    def record(self, row) -> dict:
        return self.records[int(row["rec"])]

    @property
    def ok(self) -> pd.DataFrame:
        return self.df[self.df["status"] == "ok"] if not self.df.empty else self.df


def page_slug(run_key: str) -> str:
    """A file name from a run key (hex in practice; anything in a hand-edited record)."""
    return slug(str(run_key), 64)


def _final_val_loss(rec: dict):
    vals = [s.get("val_loss") for s in rec.get("steps") or [] if isinstance(s, dict)]
    vals = [v for v in vals if num(v) is not None]
    return vals[-1] if vals else None


def _series_labels(df: pd.DataFrame) -> dict[str, str]:
    """One short, unique name per sweep: the workload; with the suite and scaling only where needed."""
    keys = df[["sweep", "suite", "workload", "scaling"]].drop_duplicates("sweep")
    labels = {}
    for _, k in keys.iterrows():
        labels[k["sweep"]] = str(k["workload"])
    for attempt in ("suite", "scaling", "sweep"):
        counts = pd.Series(list(labels.values())).value_counts()
        if counts.max() <= 1:
            break
        for _, k in keys.iterrows():
            if counts[labels[k["sweep"]]] > 1:
                labels[k["sweep"]] = {"suite": f"{k['suite']}/{k['workload']}",
                                      "scaling": f"{labels[k['sweep']]} · {k['scaling']}",
                                      "sweep": str(k["sweep"])}[attempt]
    return labels


def expert_load(rec: dict, key: str = "expert_load") -> list[list[float]] | None:
    """A [MoE layer][expert] table of metrics.moe, summed over ranks: expert_load (tokens routed to
    each expert in the last step, before capacity) or tokens_per_expert (the tokens each expert
    computed, after capacity). None unless every layer is a list of numbers."""
    load = dig(rec, "metrics", "moe", key)
    if not isinstance(load, list) or not load or not all(isinstance(layer, list) and layer for layer in load):
        return None
    rows = [[num(v) for v in layer] for layer in load]
    return None if any(v is None for row in rows for v in row) else rows


# The per-expert counts a load view reads, first found wins: what the experts computed (records from
# schema 3 on), else what the router sent them (older records; it counts dropped tokens too).
LOAD_KEYS = (("tokens_per_expert", "computed"), ("expert_load", "routed, before capacity"))


def load_table(rec: dict) -> tuple[list[list[float]], str] | None:
    """The [MoE layer][expert] table a load view reads (the first of LOAD_KEYS recorded) and what it
    counts; None where neither is recorded."""
    for key, counts in LOAD_KEYS:
        rows = expert_load(rec, key)
        if rows is not None:
            return rows, counts
    return None


def tokens_per_expert(rec: dict) -> tuple[list[float], str] | None:
    """Tokens of each expert in the last step, summed over MoE layers and ranks, and what they count
    (LOAD_KEYS). None where no table is recorded or its layers' expert counts differ."""
    table = load_table(rec)
    if table is None or len({len(row) for row in table[0]}) != 1:
        return None
    return [sum(col) for col in zip(*table[0])], table[1]


def dataframe(records: list[dict]) -> pd.DataFrame:
    """The store's DataFrame of `records` with the labels and shared columns the pages read."""
    df = dataframe_of(records)
    if df.empty:
        return df
    df["val_loss_final"] = [_final_val_loss(records[i]) for i in df["rec"]]
    for name in DERIVED:
        df[name] = df.get(f"metrics.energy.{name}")
    moe = [dig(records[i], "config", "moe") for i in df["rec"]]
    df["family"] = [family(k, r, dig(m, "capacity_factor"), dig(m, "shared_experts"))
                    for k, r, m in zip(df["kind"], df["router"], moe)]
    df["sweep"] = [s if present(s) else f"{a}/{b}/{c}" for s, a, b, c in
                   zip(df["sweep_id"], df["suite"], df["workload"], df["scaling"])]
    families = Families(df["family"])
    df["kind_label"] = [families[f].name for f in df["family"]]
    labels = _series_labels(df)
    df["series"] = df["sweep"].map(labels)
    run_labels, seen = [], {}
    for s, w, n in zip(df["series"], df["world_size"], df["nodes"]):
        base = f"{s} · w{w}" + (f" · {n} nodes" if num(n) and num(n) > 1 else "")
        seen[base] = seen.get(base, 0) + 1
        run_labels.append(base if seen[base] == 1 else f"{base} #{seen[base]}")
    df["run_label"] = run_labels
    pages, used = [], set()
    for key in df["run_key"]:
        slug = base = page_slug(key)
        n = 1
        while slug in used:
            n += 1
            slug = f"{base}-{n}"
        used.add(slug)
        pages.append(f"runs/{slug}.html")
    df["page"] = pages
    return df


def load(results: str | Path | list[dict]) -> SiteData:
    """From a results folder (or a list of records already loaded)."""
    if isinstance(results, (str, Path)):
        records, source = load_records(results), str(results)
    else:  # flagged as load_records flags them (a copy: the caller's dicts stay as they were)
        records, source = [with_flags(dict(r)) for r in results], ""
    return SiteData(records=records, df=dataframe(records), source=source)


def latest_ok_per_size(df: pd.DataFrame) -> pd.DataFrame:
    """One ok run per (sweep, world size): the latest, where a sweep was run again; a run's repeats
    as one row of their medians (results.report.combine_repeats)."""
    ok = combine_repeats(df[df["status"] == "ok"])
    return ok.sort_values("started_at").drop_duplicates(["sweep", "world_size"], keep="last") \
        .sort_values(["series", "world_size"])



def per_family(df: pd.DataFrame) -> bool:
    """Whether summary figures draw one trace per model family (each point the median of its sweeps)
    instead of one per series: when there are more series than a legend can tell apart, so that
    10,000 runs give a figure of a few traces, not thousands."""
    return df["series"].nunique() > MAX_SERIES
