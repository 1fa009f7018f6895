"""The terminal report: one row per run, the figures a reader compares first.

The repeats of a run (`run --repeat N`: records of one run key) make one row (combine_repeats):
each figure is the median over the repeats, and the row says how many there are and the range
(min–max) of their tokens/s. A range, not an interval: N is a handful, too few for an interval
to mean more than the data's own extent.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

import pandas as pd
from rich.cells import cell_len
from rich.markup import escape
from rich.table import Table

from benchsuite.record.sanity import sanity_flags, scaling_flag
from benchsuite.record.values import format_step_ms, num, present
from benchsuite.terminal import printable  # every string of a record reaches the terminal through it

REPEATS = "repeats (tok/s min–max)"
COLUMNS = [
    # (header, column, format)
    ("suite", "suite", "{}"),
    ("workload", "workload", "{}"),
    ("world", "world_size", "{}"),
    ("nodes", "nodes", "{}"),
    ("scaling", "scaling", "{}"),
    ("tok/s", "tokens_per_s", "{:,.0f}"),
    ("MFU", "mfu", "{:.1%}"),  # model FLOPs, no recompute (metrics/flops.py)
    ("HFU", "metrics.hfu", "{:.1%}"),  # hardware FLOPs: what ran, recompute included
    ("step ms (95% CI)", None, None),
    ("efficiency", None, None),  # against the baseline named in the next column (metrics/scaling.py)
    ("baseline", None, None),
    ("state MiB meas/model", None, None),  # model-state bytes per rank: measured / analytic (metrics/memory.py)
    ("to target", None, None),  # tokens, seconds, energy to reach train.target_loss (metrics/quality.py)
    (REPEATS, None, None),  # shown when some run was repeated (combine_repeats)
    ("status", "status", "{}"),  # last: a failed or flagged row rewrites it
]
FLAG_MARK = "⚠"
MEMORY_MEASURED = "metrics.memory.model_state_bytes.measured.total"
MEMORY_ANALYTIC = "metrics.memory.model_state_bytes.analytic.total"


def _fmt(fmt: str, v) -> str:
    return fmt.format(v) if present(v) else "—"


def _step_cell(row) -> str:
    cells = (num(row.get(k)) for k in ("step_time_median_s", "step_time_ci95_lo_s", "step_time_ci95_hi_s"))
    return format_step_ms(*cells) or "—"


def _memory_cell(row) -> str:
    measured, analytic = row.get(MEMORY_MEASURED), row.get(MEMORY_ANALYTIC)
    if not present(measured):
        return "—"
    return f"{measured / 2**20:.2f} / " + (f"{analytic / 2**20:.2f}" if present(analytic) else "—")


QUALITY = ["quality.target_loss", "quality.reached", "quality.step", "quality.tokens", "quality.seconds",
           "quality.model_flops", "quality.energy_j", "quality.co2e_g", "quality.reason",
           "quality.best_val_loss", "quality.final_val_loss"]


def _target_cell(row) -> str:
    """'1.2e+06 tok, 35 s, 0.4 kJ' when train.target_loss was reached, 'not reached (best 2.71)' when not."""
    reached, tokens = row.get("quality.reached"), num(row.get("quality.tokens"))
    if not present(reached) and tokens is None:
        return "—"
    if present(reached) and not reached:
        best = num(row.get("quality.best_val_loss"))
        return "not reached" + (f" (best {best:.3g})" if best is not None else "")
    seconds, energy = num(row.get("quality.seconds")), num(row.get("quality.energy_j"))
    return ", ".join([f"{tokens:.2g} tok" if tokens is not None else "tok n/a",
                      f"{seconds:.3g} s" if seconds is not None else "time n/a",
                      f"{energy / 1e3:.2g} kJ" if energy is not None else "energy n/a"])


def _efficiency_cell(row) -> str:
    """'94%', or '180% ⚠' when the sanity guard flagged it (superlinear)."""
    eff = row.get("scaling_efficiency")
    if not present(eff):
        return "—"
    flagged = any(isinstance(f, dict) and f.get("field") == "scaling_efficiency" for f in row.get("flags") or [])
    return f"{eff:.0%}" + (f" {FLAG_MARK}" if flagged else "")


def _baseline_cell(row) -> str:
    """The 1-device run(s) efficiency is computed against: a run key (shortened), 'median of N'
    for repeats, 'none' when no run qualifies (the reason is in the caption)."""
    keys = row.get("scaling_baseline_run_keys")
    if isinstance(keys, list) and keys:
        return str(keys[0])[:8] if len(keys) == 1 else f"median of {len(keys)}"
    return "none" if row.get("status") == "ok" else "—"


def _repeats_cell(row) -> str:
    """'3 (11,900–12,400)': the repeats and the range of their tokens/s; '1' for a run measured once."""
    n, lo, hi = int(row["repeats"]), row.get("tokens_per_s_min"), row.get("tokens_per_s_max")
    return f"{n} ({lo:,.0f}–{hi:,.0f})" if n > 1 and present(lo) else str(n)


# A repeat group's columns that identify it or point at one record: the latest repeat's, never a median.
KEPT = ("world_size", "nodes", "tensor", "zero", "expert", "repeat", "error_rank", "rec")


def combine_repeats(df: pd.DataFrame) -> pd.DataFrame:
    """One row per run and status from a records DataFrame (store.dataframe_of): the repeats of a run
    (its records share the run key) as the median of each numeric figure, `repeats` (how many) and
    `tokens_per_s_min` / `tokens_per_s_max` (their range). Text, identity and the detail page come from
    the latest repeat. The flags are the combined figures' (_combined_flags), and `flags_in_repeats`
    says how many repeats carried a flag on each field (None for a run measured once). A frame already
    combined is returned as is."""
    if df.empty or "repeats" in df:
        return df
    group = df["run_key"].astype(str) + "\0" + df["status"].astype(str)
    by = df.groupby(group, sort=False)
    latest = ~group.duplicated(keep="last")  # rows are in started_at order within a run
    out = df[latest].copy()
    out["repeats"] = by["run_key"].transform("size")[latest]
    out["tokens_per_s_min"] = by["tokens_per_s"].transform("min")[latest]
    out["tokens_per_s_max"] = by["tokens_per_s"].transform("max")[latest]
    out["flags_in_repeats"] = None
    repeated = out.index[out["repeats"] > 1]
    if len(repeated):
        figures = [c for c in df.select_dtypes("number").columns if c not in KEPT]
        out = out.astype({c: float for c in figures})
        out.loc[repeated, figures] = by[figures].transform("median").loc[repeated]
        for idx in repeated:
            flags, counts = _combined_flags(out.loc[idx], list(df["flags"].iloc[by.indices[group[idx]]]),
                                            set(figures))
            out.at[idx, "flags"], out.at[idx, "flagged"], out.at[idx, "flags_in_repeats"] = flags, bool(flags), counts
            out.at[idx, "flag_summary"] = _repeats_flag_summary(out.loc[idx], flags, counts) or None
    return out.reset_index(drop=True)


def _combined_flags(row, repeat_flags: list, figures: set[str]) -> tuple[list[dict], dict[str, int]]:
    """A repeated run's flags, and how many repeats carried a flag on each field. A flag on a figure the
    row holds the median of is judged again on that median, by the rule that flags one record; any other
    (a step's loss, one device's energy, a figure no repeat has) is kept from every repeat that had it."""
    repeat_flags = [[f for f in flags if isinstance(f, dict) and "field" in f] if isinstance(flags, list) else []
                    for flags in repeat_flags]
    counts = Counter(field for flags in repeat_flags for field in dict.fromkeys(f["field"] for f in flags))
    on_median = {c for c in figures if present(row.get(c))}
    judged = [f for f in _figure_flags(row) if f["field"] in on_median]
    return judged + [f for f in _union(repeat_flags) if f["field"] not in on_median], dict(counts)


def _figure_flags(row) -> list[dict]:
    """What the sanity guard flags in a row's figures: the record rules (record/sanity.sanity_flags) on
    the row's metrics and energy put back in a record's shape, and the scaling efficiency rule."""
    world_size = int(row["world_size"])
    as_record = {"status": row["status"], "config": {"world_size": world_size},
                 "metrics": _section(row, "metrics"), "energy": _section(row, "energy")}
    eff = num(row.get("scaling_efficiency"))
    scaling = None if eff is None else scaling_flag(eff, row["scaling"], world_size, row.get("scaling_baseline"))
    return sanity_flags(as_record) + ([scaling] if scaling else [])


def _section(row, section: str) -> dict:
    """The nested dict a record section had, from the row's dotted columns (store.flatten) that hold a value."""
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


def _repeats_flag_summary(row, flags: list[dict], counts: dict[str, int]) -> str:
    """The combined row's flags for a terminal or a tooltip, each with how many repeats carried it, and the
    fields some repeat flagged that the median is not flagged on."""
    n, on_row = int(row["repeats"]), {f["field"] for f in flags}
    parts = [f"{f['field']}: {f['reason']} ({counts.get(f['field'], 0)} of {n} repeats flagged)" for f in flags]
    parts += [f"{field}: flagged in {k} of {n} repeats, not on their median" for field, k in counts.items()
              if field not in on_row]
    return "; ".join(parts)


def _union(flag_lists) -> list[dict]:
    """Every flag of the repeats, each once."""
    out = []
    for flags in flag_lists:
        out += [f for f in flags if f not in out]
    return out


CELLS = {"step ms (95% CI)": _step_cell, "efficiency": _efficiency_cell, "baseline": _baseline_cell,
         "state MiB meas/model": _memory_cell, "to target": _target_cell, REPEATS: _repeats_cell}


def report_rows(df: pd.DataFrame) -> list[dict]:
    """The report as plain dicts (for --json): the same rows and columns, unformatted, nulls as None."""
    if df.empty:
        return []
    df = combine_repeats(df)
    cols = [c for _, c, _ in COLUMNS if c] + ["run_key", "repeats", "tokens_per_s_min", "tokens_per_s_max",
                                              "scaling_efficiency", "scaling_baseline_run_keys",
                                              "scaling_baseline", "scaling_efficiency_reason",
                                              "step_time_median_s", "step_time_ci95_lo_s",
                                              "step_time_ci95_hi_s", "error_type", "error_message",
                                              MEMORY_MEASURED, MEMORY_ANALYTIC, "flagged", "flags", "flag_summary",
                                              "flags_in_repeats", *QUALITY]
    cols = [c for c in cols if c in df]
    return [{k: (v if present(v) else None) for k, v in r.items()} for r in df[cols].to_dict("records")]


TEXT_HEADERS = ("suite", "workload", "scaling", "status", "router", "source", "intensity source", "schedule",
                "baseline", "to target")  # left-aligned; may wrap at spaces. Every other column is a number
# The main table's columns, most important first: the ones kept when the console is narrow.
PRIORITY = ("workload", "world", "tok/s", "MFU", "step ms (95% CI)", "efficiency", "status", REPEATS, "suite",
            "scaling", "nodes", "HFU", "baseline", "state MiB meas/model", "to target")


def column_name(header: str) -> str:
    """What `report --columns` calls a column: its header up to any parenthesis, lower case, words joined by _."""
    return "_".join(re.findall(r"[a-z0-9]+", header.split(" (")[0].lower()))


class ColumnError(ValueError):
    """--columns named a column no table has."""


@dataclass(frozen=True)
class Fit:
    """How the tables are laid out: the columns the reader picked, else those that fit the console width."""
    width: int | None = None  # None: every column
    columns: tuple[str, ...] | None = None  # column_name()s; None: choose by width

    def check(self) -> None:
        """Unknown names → ColumnError naming them and listing the valid ones."""
        if self.columns is None:
            return
        valid = sorted({column_name(h) for h, _, _ in COLUMNS + MOE_COLUMNS + ENERGY_COLUMNS + PIPELINE_COLUMNS})
        unknown = [c for c in self.columns if c not in valid]
        if unknown or not self.columns:
            raise ColumnError(f"--columns: unknown column(s) {', '.join(unknown) or '(none given)'}; "
                              f"valid: {', '.join(valid)}")


def _min_width(header: str, cells: list[str]) -> int:
    """The narrowest a column may be drawn: numbers whole on one line; text down to its longest word."""
    if header in TEXT_HEADERS:
        return max(cell_len(w) for c in [header, *cells] for w in (c.split() or [""]))
    return max(cell_len(c) for c in [header, *cells])


def _choose(headers: list[str], columns: list[list[str]], priority: list[str], fit: Fit) -> list[int]:
    """Indices of the columns to draw, in table order: those picked, or the most important that fit
    fit.width (a column costs its width, 2 of padding and 1 of border)."""
    if fit.columns is not None:
        return [i for name in fit.columns for i, h in enumerate(headers) if column_name(h) == name]
    if fit.width is None:
        return list(range(len(headers)))
    used, kept = 1, set()
    for header in priority:
        i = headers.index(header)
        cost = _min_width(header, columns[i]) + 3
        if used + cost <= fit.width or not kept:
            used, kept = used + cost, kept | {i}
    return sorted(kept)


def _fitted_table(title: str, headers: list[str], rows: list[list[str]], priority: list[str], fit: Fit,
                  styles: list[str | None] | None = None) -> tuple[Table, list[str]]:
    """The table of the chosen columns, and the headers left out. Number columns never wrap and are at
    least as wide as their widest figure, so the console never cuts one."""
    columns = [[r[i] for r in rows] for i in range(len(headers))]
    chosen = _choose(headers, columns, priority, fit)
    table = Table(title=title, header_style="bold")
    for i in chosen:
        text = headers[i] in TEXT_HEADERS
        table.add_column(headers[i], justify="left" if text else "right", no_wrap=not text,
                         min_width=None if text else _min_width(headers[i], columns[i]))
    for n, row in enumerate(rows):
        table.add_row(*[escape(printable(row[i])) for i in chosen], style=styles[n] if styles else None)
    left_out = [h for i, h in enumerate(headers) if i not in chosen] if fit.columns is None else []
    return table, left_out


def _left_out_line(left_out: list[str]) -> list[str]:
    if not left_out:
        return []
    names = ", ".join(column_name(h) for h in left_out)
    return [f"left out to fit the width: {names} (`benchsuite report --columns NAME,...` shows them)"]


def report_table(df: pd.DataFrame, fit: Fit = Fit()) -> Table:
    """The main table, one row per run (its repeats combined)."""
    df = combine_repeats(df)
    columns = [c for c in COLUMNS if c[0] != REPEATS or (not df.empty and df["repeats"].max() > 1)]
    rows, styles = [], []
    for _, row in df.iterrows():
        cells = [CELLS[header](row) if col is None else _fmt(fmt, row.get(col)) for header, col, fmt in columns]
        flagged = row["status"] == "ok" and bool(row.get("flagged"))
        if row["status"] == "failed":
            cells[-1] = f"failed: {row.get('error_type')}"
        elif flagged:  # impossible figures (record/sanity.py): never shown as a plain ok
            cells[-1] = f"ok {FLAG_MARK} flagged"
        rows.append(cells)
        styles.append("red" if row["status"] == "failed" else ("yellow" if flagged else None))
    headers = [h for h, _, _ in columns]
    table, left_out = _fitted_table("benchsuite results", headers, rows, [h for h in PRIORITY if h in headers],
                                    fit, styles)
    noted = df[df["flag_summary"].map(present)] if "flag_summary" in df else df.iloc[:0]
    # a flagged row, or a repeated run some repeat of which was flagged (its median is not: the note says so)
    lines = [f"{FLAG_MARK if r.get('flagged') else 'repeats —'} {escape(printable(r['workload']))} "
             f"w{r['world_size']}: {escape(printable(r['flag_summary']))}" for _, r in noted.iterrows()]
    no_base = df[(df["status"] == "ok") & df["scaling_efficiency_reason"].map(present)] \
        if "scaling_efficiency_reason" in df else df.iloc[:0]
    lines += [f"efficiency — {escape(printable(r['workload']))} w{r['world_size']}: "
              f"{escape(printable(r['scaling_efficiency_reason']))}" for _, r in no_base.iterrows()]
    lines += [escape(line) for line in _left_out_line(left_out)]
    if lines:
        table.caption = "\n".join(lines)
    return table


def _section_table(df: pd.DataFrame, title: str, columns: list[tuple[str, str, str]], when: str,
                   fit: Fit) -> Table | None:
    """A table of the runs that have column `when` (None when no run has it, or --columns picks none of
    its columns); its columns are most important first."""
    if when not in df or df[when].isna().all():
        return None
    df = combine_repeats(df)
    rows = [[_fmt(fmt, row.get(col)) for _, col, fmt in columns] for _, row in df[df[when].notna()].iterrows()]
    headers = [h for h, _, _ in columns]
    table, left_out = _fitted_table(title, headers, rows, headers, fit)
    if not table.columns:
        return None
    if left_out:
        table.caption = "\n".join(escape(line) for line in _left_out_line(left_out))
    return table


def section_rows(df: pd.DataFrame, columns: list[tuple[str, str, str]], when: str) -> list[dict]:
    """A section table's rows for --json: keyed by record field, typed values, nulls as None."""
    if when not in df:
        return []
    df = combine_repeats(df)
    cols = ["run_key"] + [c for _, c, _ in columns if c != "run_key"]
    part = df[df[when].notna()].reindex(columns=cols)
    return [{k: (v.item() if hasattr(v, "item") else v) if present(v) else None for k, v in r.items()}
            for r in part.to_dict("records")]


MOE_COLUMNS = [("workload", "workload", "{}"), ("router", "router", "{}"), ("world", "world_size", "{}"),
               ("tok/s", "tokens_per_s", "{:,.0f}"), ("dropped", "metrics.moe.dropped_frac", "{:.1%}"),
               ("padding", "metrics.moe.padding_frac", "{:.1%}"),
               ("load max/mean", "metrics.moe.load_max_over_mean", "{:.2f}"),
               ("aux loss", "metrics.moe.aux_loss", "{:.4f}"), ("z loss", "metrics.moe.z_loss", "{:.4f}"),
               ("all-to-all share", "metrics.moe.all_to_all_share", "{:.0%}"),
               ("model FLOP/tok", "metrics.flops.model_per_token", "{:.4g}"),
               ("hardware FLOP/tok", "metrics.flops.hardware_per_token", "{:.4g}")]

ENERGY_COLUMNS = [("workload", "workload", "{}"), ("world", "world_size", "{}"),
                  ("total J", "energy.total_j", "{:,.1f}"), ("source", "energy.source", "{}"),
                  ("J/token", "metrics.energy.j_per_token", "{:.3g}"),
                  ("GPU J/token", "metrics.energy.gpu_j_per_token", "{:.3g}"),
                  ("J/PFLOP", "metrics.energy.j_per_pflop", "{:.3g}"),
                  ("avg W/GPU", "metrics.energy.avg_w_per_device", "{:.0f}"),
                  ("gCO2e/Mtok", "metrics.energy.gco2e_per_mtok", "{:.3g}"),
                  ("g/kWh", "carbon.intensity_g_per_kwh", "{:.0f}"), ("PUE", "carbon.pue", "{:g}"),
                  ("intensity source", "carbon.intensity_source", "{}")]


PIPELINE_COLUMNS = [("workload", "workload", "{}"), ("world", "world_size", "{}"),
                    ("schedule", "metrics.pipeline.schedule", "{}"), ("P", "metrics.pipeline.stages", "{:.0f}"),
                    ("V", "metrics.pipeline.virtual_stages", "{:.0f}"),
                    ("M", "metrics.pipeline.microbatches", "{:.0f}"),
                    ("bubble measured", "metrics.pipeline.bubble_measured", "{:.3f}"),
                    ("bubble (P-1)/(V·M)", "metrics.pipeline.bubble_formula", "{:.3f}"),
                    ("p2p B/step", "metrics.pipeline.p2p_bytes_per_step", "{:,.0f}"),
                    ("p2p formula", "metrics.pipeline.p2p_bytes_formula", "{:,.0f}")]


ENERGY_WHEN = "energy.source"  # a run has the energy/carbon table's row when it has an energy source


def section_tables(df: pd.DataFrame, fit: Fit = Fit()) -> list[Table]:
    """MoE routing, pipeline and energy/carbon tables, each only when some run has those figures."""
    tables = [_section_table(df, "MoE routing (last step)", MOE_COLUMNS, "metrics.moe.dropped_frac", fit),
              _section_table(df, "Pipeline bubble (measured vs formula)", PIPELINE_COLUMNS,
                             "metrics.pipeline.bubble_formula", fit),
              _section_table(df, "Energy and carbon (measured window)", ENERGY_COLUMNS, ENERGY_WHEN, fit)]
    return [t for t in tables if t is not None]


def _interval_cell(i, fmt: str = "{:.3g}") -> str:
    """'2.1e+05 (1.6e+05–2.8e+05)', the point alone with its reason when there is no interval."""
    if i is None or i.point is None:
        return "—" if i is None or not i.reason else i.reason
    if i.lo is None:
        return f"{fmt.format(i.point)} (no interval)"
    return f"{fmt.format(i.point)} ({fmt.format(i.lo)}–{fmt.format(i.hi)})"


def interval_table(v) -> Table | None:
    """One row per (workload, figure): median over seeds with its 95 % interval, and the ratio to the
    dense workload of the suite with its interval, ranked only where that interval excludes 1."""
    from benchsuite.results.verdicts import FINAL_LOSS, PER_STEP, TO_TARGET

    if not v.workloads:
        return None
    labels = {name: label for name, _, label in (*TO_TARGET, FINAL_LOSS)} | {"tokens_per_s": "tok/s (per step)",
                                                                               "j_per_token": "J/token (per step)"}
    table = Table(title="To target over seeds (median, 95 % interval)", header_style="bold",
                  caption=escape(printable(f"{v.method}. {v.energy_spread}.")))
    for header in ("workload", "seeds", "figure", "median (95% interval)", "÷ dense (95% interval)", "verdict"):
        table.add_column(header, justify="left" if header in ("workload", "figure", "verdict") else "right")
    for w in v.workloads:
        reached = f"{w.reached}/{w.n} reached" + (f", {len(w.failed)} failed" if w.failed else "")
        ratios = {p.figure: p for p in v.pairs if p.suite == w.suite and p.sparse == w.label}
        figures = {**w.figures, **{m: w.per_step[m] for m in PER_STEP}}
        for i, (name, interval) in enumerate(figures.items()):
            pair = ratios.get(name)
            cells = [f"{w.suite}/{w.label}" if i == 0 else "", reached if i == 0 else "", labels[name],
                     _interval_cell(interval), _interval_cell(pair.ratio, "{:.2f}") if pair else "",
                     pair.text if pair else ""]
            table.add_row(*[escape(printable(c)) for c in cells])
        table.add_section()
    return table


def claims_table(v) -> Table | None:
    """The papers' claims beside the measured counterpart; a verdict only where the interval carries one."""
    if not v.workloads:
        return None
    table = Table(title="Claims: published figure vs these runs", header_style="bold")
    for header in ("claim", "source", "published", "measured (95% interval)", "n", "verdict", "conditions"):
        table.add_column(header, justify="right" if header == "n" else "left")
    for c in v.claims:
        measured = _interval_cell(c.measured, "{:.2f}") if c.measured else "—"
        verdict = c.consistency.value + (f": {c.reason}" if c.reason else "")
        cells = [c.claim.text, c.claim.source, c.claim.published, measured,
                 str(c.measured.n) if c.measured else "—", verdict,
                 (f"suite {c.suite}; " if c.suite else "") + c.conditions]
        table.add_row(*[escape(printable(x)) for x in cells])
    return table


def verdict_tables(v) -> list[Table]:
    """The tables over seeds (results/verdicts.py), each only when some run has a quality section."""
    return [t for t in (interval_table(v), claims_table(v)) if t is not None]
