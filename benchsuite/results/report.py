"""The terminal report: one row per run (results/model.py: a run identity, all its seeds and repeats).

Each figure is the run's median (over each seed's repeats, then over its seeds), with the 95 %
interval over seeds where the run has two or more; the row names its seeds and says how many
records it has and the range of their tokens/s. The same figures reach `report --json`, the
dashboard, load_runs() and compare from the same model.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rich.cells import cell_len
from rich.markup import escape
from rich.table import Table

from benchsuite.record.columns import described, view_columns
from benchsuite.record.kinds import FLAG_KINDS, FlagKind, flags_by_kind
from benchsuite.record.values import format_step_ms, num, present
from benchsuite.results.frames import rows_of
from benchsuite.results.scaling import BASELINE
from benchsuite.results.verdicts import (FINAL_LOSS, PER_STEP, TO_TARGET, Consistency, Verdicts, pair_ratio,
                                         summarize)
from benchsuite.terminal import printable  # every string of a record reaches the terminal through it

if TYPE_CHECKING:
    import pandas as pd

    from benchsuite.results.model import Results

TOKENS = "tok/s (95% interval)"
REPEATS = "repeats (tok/s min–max)"
COLUMNS = [
    # (header, column, format)
    ("suite", "suite", "{}"),
    ("workload", "name_in_sweep", "{}"),  # the workload, with what tells its run from the others where needed
    ("world", "world_size", "{}"),
    ("nodes", "nodes", "{}"),
    ("scaling", "scaling", "{}"),
    ("seed", "seed", "{}"),  # the run's seeds: its interval is over them
    (TOKENS, None, None),
    ("MFU", "mfu", "{:.1%}"),  # model FLOPs, no recompute (metrics/flops.py)
    ("HFU", "metrics.hfu", "{:.1%}"),  # hardware FLOPs: what ran, recompute included
    ("step ms (95% interval)", None, None),
    ("efficiency", None, None),  # against the baseline named in the next column (results/scaling.py)
    ("baseline", None, None),
    ("state MiB meas/model", None, None),  # model-state bytes per rank: measured / analytic (metrics/memory.py)
    ("to target", None, None),  # tokens, seconds, energy to reach train.target_loss (metrics/quality.py)
    (REPEATS, None, None),  # the run's records (seeds × repeats) and the range of their tok/s
    ("status", "status", "{}"),  # last: a failed or flagged row rewrites it
]
MEMORY_MEASURED, MEMORY_ANALYTIC = view_columns("metrics.memory.model_state_bytes.measured.total",
                                                "metrics.memory.model_state_bytes.analytic.total")


def _fmt(fmt: str, v) -> str:
    return fmt.format(v) if present(v) else "—"


def _step_cell(row) -> str:
    cells = (num(row.get(k)) for k in ("step_time_median_s", "step_time_median_s_lo", "step_time_median_s_hi"))
    return format_step_ms(*cells) or "—"


def _tokens_cell(row) -> str:
    """'12,000 (11,400–12,700)': the median over seeds and its 95 % interval; the median alone with one seed."""
    median, lo, hi = (num(row.get(k)) for k in ("tokens_per_s", "tokens_per_s_lo", "tokens_per_s_hi"))
    if median is None:
        return "—"
    return f"{median:,.0f}" + (f" ({lo:,.0f}–{hi:,.0f})" if lo is not None and hi is not None else "")


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
    """'94%', '180% ⚠' when the sanity guard flagged it (superlinear), 'baseline' for the baseline itself."""
    eff = row.get("scaling_efficiency")
    if not present(eff):
        return "—"
    if row.get("scaling_baseline") == BASELINE:
        return "baseline"
    flagged = any(isinstance(f, dict) and f.get("field") == "scaling_efficiency" for f in row.get("flags") or [])
    return f"{eff:.0%}" + (f" {FLAG_KINDS['impossible'].mark}" if flagged else "")


def _baseline_cell(row) -> str:
    """The 1-device run efficiency is computed against (its label), 'this run' for the baseline itself,
    'none' when no run qualifies (the reason is in the caption)."""
    base = row.get("scaling_baseline")
    if present(base):
        return "this run" if base == BASELINE else str(base)
    return "none" if row.get("status") == "ok" else "—"


def _repeats_cell(row) -> str:
    """'4 (11,900–12,400)': the run's ok records (seeds × repeats) and the range of their tokens/s."""
    n, lo, hi = int(row["repeats"]), row.get("tokens_per_s_min"), row.get("tokens_per_s_max")
    return f"{n} ({lo:,.0f}–{hi:,.0f})" if n > 1 and present(lo) else str(n)


def _flag_kinds(row) -> list[FlagKind]:
    """The kinds of a run's flags, each once, impossible figures first (record/kinds.flags_by_kind)."""
    return list(flags_by_kind(row.get("flags")))


def _status_cell(row) -> str:
    if row["status"] != "ok":
        return f"failed: {row.get('error_type')}"
    failed = int(row.get("failed") or 0)
    marks = [f"{k.mark} {'flagged' if k.name == 'impossible' else k.name}" for k in _flag_kinds(row)]
    return "ok" + "".join(f" {m}" for m in marks) + (f", {failed} failed" if failed else "")


CELLS = {TOKENS: _tokens_cell, "step ms (95% interval)": _step_cell, "efficiency": _efficiency_cell,
         "baseline": _baseline_cell, "state MiB meas/model": _memory_cell, "to target": _target_cell,
         REPEATS: _repeats_cell, "status": _status_cell}
# A run in --json: its identity, figures, intervals over seeds, flags and efficiency, then its seeds.
# run_key: its latest record's (a run of several seeds has several: `run_keys`).
JSON_COLUMNS = ["identity", "label", "run_key", "suite", "workload", "kind", "router", "world_size", "nodes", "scaling", "seeds",
                "status", "repeats", "failed", "failed_seeds", "tokens_per_s", "tokens_per_s_lo", "tokens_per_s_hi",
                "tokens_per_s_min", "tokens_per_s_max", "repeat_cv", "mfu", "mfu_lo", "mfu_hi", "metrics.hfu",
                "step_time_median_s", "step_time_median_s_lo", "step_time_median_s_hi", "j_per_token",
                "j_per_token_lo", "j_per_token_hi", "energy_bound_share", "energy_bound_exceeds",
                "metrics.energy.j_per_token_bound.low", "metrics.energy.j_per_token_bound.high", "gco2e_per_mtok",
                "gco2e_per_mtok_lo", "gco2e_per_mtok_hi", "carbon.co2e_g", "carbon.co2e_g_bound.low",
                "carbon.co2e_g_bound.high", "carbon.market.co2e_g", "carbon.embodied.co2e_g", "carbon.water.onsite_l",
                "carbon.water.offsite_l",
                "interval_reason", "scaling_efficiency", "scaling_baseline", "scaling_baseline_identities",
                "scaling_efficiency_reason", "error_type", "error_message", MEMORY_MEASURED, MEMORY_ANALYTIC,
                "flagged", "flags", "flag_summary", "flags_in_repeats", *QUALITY]
SEED_COLUMNS = ["repeats", "tokens_per_s", "tokens_per_s_min", "tokens_per_s_max", "repeat_cv", "noisy", "mfu",
                "step_time_median_s", "j_per_token"]


def plain(v):
    """A frame's value as JSON: numpy scalars as Python ones, missing as None."""
    if isinstance(v, (list, dict)):
        return v
    return (v.item() if hasattr(v, "item") else v) if present(v) else None


def report_rows(results: Results) -> Iterator[dict]:
    """The report as plain dicts (for --json), one per run, made as they are read: unformatted, nulls as None,
    with `per_seed` (each seed's medians over its repeats) and `records` (the name of each record)."""
    runs = results.runs
    if runs.empty:
        return
    per_seed = results.per_seed.reindex(columns=SEED_COLUMNS)
    values = {c: per_seed[c].tolist() for c in SEED_COLUMNS}  # (a seed's dict made as its run is written)
    seeds = [int(s) for s in per_seed.index.get_level_values("seed")]
    seeds_at: dict[str, list[int]] = {}  # identity -> its seeds' rows (each run's found once, not a lookup each)
    for at, identity in enumerate(per_seed.index.get_level_values("identity")):
        seeds_at.setdefault(identity, []).append(at)
    names: dict[str, list[str]] = {}  # identity -> its records' names, and run keys
    keys: dict[str, set[str]] = {}
    for identity, name, key in zip(results.df["identity"], results.df["record_name"], results.df["run_key"]):
        names.setdefault(identity, []).append(name)
        keys.setdefault(identity, set()).add(key)
    for row in plain_rows(runs, JSON_COLUMNS):
        identity = row["identity"]
        row["per_seed"] = [{"seed": seeds[at], **{c: plain(values[c][at]) for c in SEED_COLUMNS}}
                           for at in seeds_at.get(identity, [])] if row["status"] == "ok" else []
        row["records"], row["run_keys"] = sorted(names[identity]), sorted(keys[identity])
        yield row


def plain_rows(frame: pd.DataFrame, columns: list[str]) -> Iterator[dict]:
    """frame's rows as dicts of plain values (these columns, None where one is absent), made JSON_BATCH rows at a
    time as they are read (for --json: a dict of each of 100,000 runs at once holds hundreds of MB)."""
    for start in range(0, len(frame), JSON_BATCH):
        for r in rows_of(frame.iloc[start:start + JSON_BATCH], columns):
            yield {k: plain(v) for k, v in r.items()}


JSON_BATCH = 2000


TEXT_HEADERS = ("suite", "workload", "scaling", "status", "router", "source", "intensity source", "schedule",
                "baseline", "to target", "seed", "run")  # left-aligned; may wrap at spaces. Every other: a number
# The main table's columns, most important first: the ones kept when the console is narrow.
PRIORITY = ("workload", "world", "seed", TOKENS, REPEATS, "MFU", "efficiency", "status", "step ms (95% interval)",
            "suite", "scaling", "nodes", "HFU", "baseline", "state MiB meas/model", "to target")


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
    rows: int | None = None  # the most rows a table draws (a team's history holds thousands); None: every row

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


def _shown(df: pd.DataFrame, fit: Fit) -> tuple[pd.DataFrame, list[str]]:
    """The rows a table draws (the first fit.rows), and the line that sums up the rest: how many, how many of
    them failed or are flagged, and how to see them (rich lays out a 10,000-row table in minutes)."""
    if fit.rows is None or len(df) <= fit.rows:
        return df, []
    rest = df.iloc[fit.rows:]
    failed = int((rest["status"] != "ok").sum()) if "status" in rest else 0
    flagged = int(rest["flagged"].fillna(False).astype(bool).sum()) if "flagged" in rest else 0
    return df.iloc[:fit.rows], [_rest_line(len(rest), "rows", f" ({failed:,} failed, {flagged:,} flagged among them)")]


def _rest_line(rest: int, what: str, detail: str = "") -> str:
    """What a table cut at fit.rows leaves out, and how to see it."""
    return f"… {rest:,} more {what} not shown{detail}: `benchsuite report --all` draws every one, `--json` gives them all"


def report_table(results: Results, fit: Fit = Fit()) -> Table:
    """The main table, one row per run (the first fit.rows of them, the rest summed up under it)."""
    df, more = _shown(results.runs, fit)
    rows, styles = [], []
    for _, row in df.iterrows():
        rows.append([CELLS[header](row) if col is None or header == "status" else _fmt(fmt, row.get(col))
                     for header, col, fmt in COLUMNS])
        flagged = row["status"] == "ok" and bool(row.get("flagged"))
        styles.append("red" if row["status"] != "ok" else ("yellow" if flagged else None))
    headers = [h for h, _, _ in COLUMNS]
    table, left_out = _fitted_table("benchsuite results", headers, rows, list(PRIORITY), fit, styles)
    noted = df[df["flag_summary"].map(present)] if "flag_summary" in df else df.iloc[:0]
    # a flagged row, or a run some record of which was flagged (its median is not: the note says so)
    lines = [f"{''.join(k.mark for k in _flag_kinds(r)) if r.get('flagged') else 'records —'} "
             f"{escape(printable(r['label']))}: {escape(printable(r['flag_summary']))}" for _, r in noted.iterrows()]
    no_base = df[(df["status"] == "ok") & df["scaling_efficiency_reason"].map(present)] \
        if "scaling_efficiency_reason" in df else df.iloc[:0]
    lines += [f"efficiency — {escape(printable(r['label']))}: "
              f"{escape(printable(r['scaling_efficiency_reason']))}" for _, r in no_base.iterrows()]
    lines += [escape(line) for line in _left_out_line(left_out) + more]
    if lines:
        table.caption = "\n".join(lines)
    return table


def _section_table(df: pd.DataFrame, title: str, columns: list[tuple[str, str, str]], when: str,
                   fit: Fit, note: str = "") -> Table | None:
    """A table of the runs that have column `when` (None when no run has it, or --columns picks none of
    its columns), with `note` under it; its columns are most important first, and its first names the run:
    kept beside any picked column, so a row always says whose figures it holds."""
    if when not in df or df[when].isna().all():
        return None
    wanted = list(dict.fromkeys([c for _, c, _ in columns if c in df] + [c for c in ("status", "flagged") if c in df]))
    shown, more = _shown(df.loc[df[when].notna(), wanted], fit)  # (the columns read: runs are ~400 wide)
    rows = [[_fmt(fmt, row.get(col)) for _, col, fmt in columns] for _, row in shown.iterrows()]
    headers = [h for h, _, _ in columns]
    key = column_name(headers[0])
    picked = fit.columns is not None and any(c in fit.columns for c in map(column_name, headers[1:]))
    if fit.columns is not None and not picked:
        return None
    if picked and key not in fit.columns:
        fit = Fit(fit.width, (key, *fit.columns))
    table, left_out = _fitted_table(title, headers, rows, headers, fit)
    lines = ([note] if note else []) + (_left_out_line(left_out) if left_out else []) + more
    if lines:
        table.caption = "\n".join(escape(line) for line in lines)
    return table


def section_rows(results: Results, columns: list[tuple[str, str, str]], when: str) -> Iterator[dict]:
    """A section table's rows for --json: one per run, keyed by record field, typed values, nulls as None (made
    as they are written: plain_rows)."""
    df = results.runs
    if when not in df:
        return iter(())
    cols = list(dict.fromkeys(["identity", "label", "run_key", "seed", "world_size"] + [c for _, c, _ in columns]))
    return plain_rows(df.loc[df[when].notna(), [c for c in cols if c in df]], cols)


MOE_COLUMNS = [("run", "label", "{}"), ("router", "router", "{}"),
               ("tok/s", "tokens_per_s", "{:,.0f}"), ("dropped", "metrics.moe.dropped_frac", "{:.1%}"),
               ("padding", "metrics.moe.padding_frac", "{:.1%}"),
               ("busiest ÷ mean", "metrics.moe.load_max_over_mean", "{:.2f}"),
               ("aux loss", "metrics.moe.aux_loss", "{:.4f}"), ("z loss", "metrics.moe.z_loss", "{:.4f}"),
               ("all-to-all share", "metrics.moe.all_to_all_share", "{:.0%}"),
               ("model FLOP/tok", "metrics.flops.model_per_token", "{:.4g}"),
               ("hardware FLOP/tok", "metrics.flops.hardware_per_token", "{:.4g}")]

ENERGY_COLUMNS = [("run", "label", "{}"), ("seed", "seed", "{}"),
                  ("total J", "energy.total_j", "{:,.1f}"), ("source", "energy.source", "{}"),
                  ("J/token", "metrics.energy.j_per_token", "{:.3g}"),
                  ("meters ±", "energy.bounds.total.share", "{:.1%}"),
                  ("GPU J/token", "metrics.energy.gpu_j_per_token", "{:.3g}"),
                  ("J/PFLOP", "metrics.energy.j_per_pflop", "{:.3g}"),
                  ("avg W/GPU", "metrics.energy.avg_w_per_device", "{:.0f}"),
                  ("gCO2e/Mtok", "metrics.energy.gco2e_per_mtok", "{:.3g}"),
                  ("g/kWh", "carbon.intensity_g_per_kwh", "{:.0f}"), ("PUE", "carbon.pue", "{:g}"),
                  ("intensity source", "carbon.intensity_source", "{}")]


# Beside the location-based CO2e, never added to it (energy/footprint.py): shown when a run has one of them.
CARBON_PART_COLUMNS = [("run", "label", "{}"), ("seed", "seed", "{}"),
                       ("location gCO2e", "carbon.co2e_g", "{:.3g}"),
                       ("low", "carbon.co2e_g_bound.low", "{:.3g}"), ("high", "carbon.co2e_g_bound.high", "{:.3g}"),
                       ("market gCO2e", "carbon.market.co2e_g", "{:.3g}"),
                       ("embodied gCO2e", "carbon.embodied.co2e_g", "{:.3g}"),
                       ("embodied source", "carbon.embodied.source", "{}"),
                       ("water on-site L", "carbon.water.onsite_l", "{:.3g}"),
                       ("water off-site L", "carbon.water.offsite_l", "{:.3g}")]
CARBON_PARTS_WHEN = "carbon.co2e_g"


PIPELINE_COLUMNS = [("run", "label", "{}"),
                    ("schedule", "metrics.pipeline.schedule", "{}"), ("P", "metrics.pipeline.stages", "{:.0f}"),
                    ("V", "metrics.pipeline.virtual_stages", "{:.0f}"),
                    ("M", "metrics.pipeline.microbatches", "{:.0f}"),
                    ("bubble measured", "metrics.pipeline.bubble_measured", "{:.3f}"),
                    ("bubble (P-1)/(V·M)", "metrics.pipeline.bubble_formula", "{:.3f}"),
                    ("p2p B/step", "metrics.pipeline.p2p_bytes_per_step", "{:,.0f}"),
                    ("p2p formula", "metrics.pipeline.p2p_bytes_formula", "{:,.0f}")]


ENERGY_WHEN = "energy.source"  # a run has the energy/carbon table's row when it has an energy source
view_columns(*JSON_COLUMNS, *SEED_COLUMNS, CARBON_PARTS_WHEN, ENERGY_WHEN,
             *(column for table in (COLUMNS, MOE_COLUMNS, ENERGY_COLUMNS, CARBON_PART_COLUMNS, PIPELINE_COLUMNS)
               for _, column, _ in table if column))


def routing_table(results: Results) -> Table | None:
    """Learned vs forced routing, one row per pair (results/routing.py): forced ÷ learned tok/s is how much
    the trained router's imbalance costs."""
    pairs = results.routing_pairs
    if not pairs:
        return None
    table = Table(title="Learned vs forced routing (medians; forced ÷ learned with its 95 % interval)",
                  header_style="bold")
    for header in ("run (learned)", "tok/s learned", "tok/s forced", "forced ÷ learned", "MFU learned",
                   "MFU forced", "J/token learned", "J/token forced"):
        table.add_column(header, justify="left" if header.startswith("run") else "right")
    for p in pairs:
        cells = [p.label, _fmt("{:,.0f}", p.learned["tokens_per_s"]), _fmt("{:,.0f}", p.forced["tokens_per_s"]),
                 _interval_cell(p.speedup, "{:.2f}"), _fmt("{:.2%}", p.learned["mfu"]), _fmt("{:.2%}", p.forced["mfu"]),
                 _fmt("{:.3g}", p.learned["j_per_token"]), _fmt("{:.3g}", p.forced["j_per_token"])]
        table.add_row(*[escape(printable(c)) for c in cells])
    return table


def section_tables(results: Results, fit: Fit = Fit()) -> list[Table]:
    """MoE routing, learned vs forced routing, pipeline and energy/carbon tables, each only when some run has
    those figures."""
    df = results.runs
    tables = [_section_table(df, "MoE routing (last step)", MOE_COLUMNS, "metrics.moe.dropped_frac", fit,
                             f"busiest ÷ mean: {described('metrics.moe.load_max_over_mean')}"),
              routing_table(results),
              _section_table(df, "Pipeline bubble (measured vs formula)", PIPELINE_COLUMNS,
                             "metrics.pipeline.bubble_formula", fit),
              _section_table(df, "Energy and carbon (measured window)", ENERGY_COLUMNS, ENERGY_WHEN, fit),
              _section_table(df, "Carbon beside the location-based figure (never added to it)", CARBON_PART_COLUMNS,
                             CARBON_PARTS_WHEN, fit)]
    return [t for t in tables if t is not None]


def _interval_cell(i, fmt: str = "{:.3g}") -> str:
    """'2.1e+05 (1.6e+05–2.8e+05)', the point alone with its reason when there is no interval."""
    if i is None or i.point is None:
        return "—" if i is None or not i.reason else i.reason
    if i.lo is None:
        return f"{fmt.format(i.point)} (no interval)"
    return f"{fmt.format(i.point)} ({fmt.format(i.lo)}–{fmt.format(i.hi)})"


# How the answer names each sparse ÷ dense figure (results/verdicts.py), the per-step figures first.
ANSWER_FIGURES = {"tokens_per_s": "tok/s", "j_per_token": "energy per token", "tokens": "tokens to target",
                  "seconds": "time to target", "energy_j": "energy to target", "co2e_g": "CO2e to target",
                  "steps": "steps to target", "model_flops": "model FLOPs to target",
                  "final_val_loss": "final validation loss"}


def _answer_lines(pairs) -> list[str]:
    """One pair of runs in words: each figure whose ratio has an interval on its own line ('tok/s 1.17×
    (1.05–1.30): switch · w1 higher'); the ratios without one, and the figures not compared, one line
    per shared reason."""
    lines, unjudged, missing = [], {}, {}
    for p in sorted(pairs, key=lambda p: list(ANSWER_FIGURES).index(p.figure) if p.figure in ANSWER_FIGURES else 99):
        name, r = ANSWER_FIGURES.get(p.figure, p.figure.replace("_", " ")), p.ratio
        if r.point is None:
            missing.setdefault(r.reason or "not recorded", []).append(name)
        elif r.lo is None:
            unjudged.setdefault(r.reason or "no interval", []).append(f"{name} {r.point:.2f}×")
        else:
            lines.append(f"{name} {r.point:.2f}× ({r.lo:.2f}–{r.hi:.2f}): {p.text}")
    lines += [f"{', '.join(figures)} — {why}" for why, figures in unjudged.items()]
    lines += [f"not compared: {', '.join(figures)} ({why})" for why, figures in missing.items()]
    return lines


def _rest_caption(table: Table, rest: int, what: str) -> None:
    """Under a table cut at fit.rows: how many more, and how to see them (after any caption it has)."""
    if rest > 0:
        line = escape(_rest_line(rest, what))
        table.caption = f"{table.caption}\n{line}" if table.caption else line


def answer_table(v: Verdicts, fit: Fit = Fit()) -> Table | None:
    """The dense-vs-sparse answer, first in the report: each sparse run ÷ the dense run of its suite on the
    same devices and scaling (results/verdicts.py pairs), in words (the first fit.rows pairs of runs). None
    without a sparse run."""
    if not any(g.kind == "moe" for g in v.groups):
        return None
    table = Table(title="Dense vs sparse: each sparse run ÷ the dense run of its suite on the same devices "
                        "(medians over seeds; 95 % interval, Welch's t on the logs)", header_style="bold")
    table.add_column("sparse run ÷ dense run")
    table.add_column("sparse ÷ dense (× the dense run's figure)")
    by_run: dict[tuple, list] = {}  # (the pairs' figures: only the ratios of the pairs drawn are computed)
    for f in v.pair_figures:
        by_run.setdefault((f.sparse.suite, f.sparse.label, f.dense.label), []).append(f)
    if not by_run:
        table.show_header = False
        table.add_row(escape("no suite has a dense and a sparse run on the same devices and scaling: nothing to "
                             "compare (add a dense workload to the suite)"), "")
    for (_, sparse, dense), figures in list(by_run.items())[:fit.rows]:
        table.add_row(_lines(f"{sparse}\n÷ {dense}"), _lines("\n".join(_answer_lines(map(pair_ratio, figures)))))
        table.add_section()
    compared = {(suite, sparse) for suite, sparse, _ in by_run}
    alone = [g.label for g in v.groups if g.kind == "moe" and (g.suite, g.label) not in compared]
    if alone and by_run:
        named = ", ".join(alone[:fit.rows]) + (f" and {len(alone) - fit.rows:,} more" if fit.rows and
                                                 len(alone) > fit.rows else "")
        table.caption = escape(printable(f"no dense run of their suite on the same devices and scaling: {named}"))
    _rest_caption(table, len(by_run) - (fit.rows or len(by_run)), "pairs of runs")
    return table


def _lines(text: str) -> str:
    """A cell of several lines, each made safe for the terminal (printable would show the breaks as \\x0a)."""
    return "\n".join(escape(printable(line)) for line in text.split("\n"))


def interval_table(v: Verdicts, fit: Fit = Fit()) -> Table | None:
    """One row per (run of two or more seeds, figure): median over seeds with its 95 % interval, and the
    ratio to the dense run of the suite with its interval, ranked only where that interval excludes 1
    (`report --json` has every run's, one seed or more)."""
    several = [g for g in v.groups if len(g.seeds) > 1]  # one seed: no interval; the main table has its figures
    if not several:
        return None
    shown = [summarize(g) for g in several[:fit.rows]]  # (the runs drawn alone summed up: the rest counted)
    labels = {name: label for name, _, label in (*TO_TARGET, FINAL_LOSS)} | {"tokens_per_s": "tok/s (per step)",
                                                                               "j_per_token": "J/token (per step)"}
    table = Table(title="Over seeds (median, 95 % interval)", header_style="bold",
                  caption=escape(printable(f"{v.method}. {v.energy_spread}.")))
    for header in ("run", "seeds", "figure", "median (95% interval)", "÷ dense run (95% interval)", "verdict"):
        table.add_column(header, justify="left" if header in ("run", "seeds", "figure", "verdict") else "right")
    by_sparse: dict[tuple, dict] = {}  # (suite, sparse run) -> figure -> its pairs, one per dense run
    drawn = {(w.suite, w.label) for w in shown}
    for f in v.pair_figures:
        if (f.sparse.suite, f.sparse.label) in drawn:
            by_sparse.setdefault((f.sparse.suite, f.sparse.label), {}).setdefault(f.figure, []).append(pair_ratio(f))
    for w in shown:
        reached = (f"{w.n}: {', '.join(map(str, w.seeds))}" + (f"; {w.reached} reached" if w.figures else "")
                   + (f", {len(w.failed)} failed" if w.failed else ""))
        ratios = by_sparse.get((w.suite, w.label), {})
        figures = {**w.figures, **{m: w.per_step[m] for m in PER_STEP}}
        for i, (name, interval) in enumerate(figures.items()):
            pairs = ratios.get(name, [])  # one line per dense run of the layout, named
            cells = [w.label if i == 0 else "", reached if i == 0 else "", labels[name], _interval_cell(interval),
                     "\n".join(f"{_interval_cell(p.ratio, '{:.2f}')} ÷ {p.dense}" for p in pairs),
                     "\n".join(p.text for p in pairs)]
            table.add_row(*[_lines(c) for c in cells])
        table.add_section()
    _rest_caption(table, len(several) - len(shown), "runs of several seeds")
    return table


def claims_table(v: Verdicts, fit: Fit = Fit()) -> Table | None:
    """The papers' claims beside the measured counterpart (a check per suite that holds both workloads: the first
    fit.rows drawn); a verdict only where the interval carries one."""
    if not any(len(g.seeds) > 1 or g.quality for g in v.groups):  # (a run that evaluated has figures over seeds)
        return None
    testable = [c for c in v.claims if c.consistency is not Consistency.NOT_TESTABLE]
    reasons: dict[str, list[str]] = {}  # claim text -> why each of its checks cannot be made (a claim of two routers)
    for c in v.claims:
        if c not in testable:
            reasons.setdefault(c.claim.text, []).append(c.reason)
    untestable = [f"{text} ({'; or '.join(dict.fromkeys(why))})" for text, why in reasons.items()]
    table = Table(title="Claims: published figure vs these runs", header_style="bold")
    if untestable:  # one line for the claims these runs cannot test, each once (`report --json` has every check)
        table.caption = escape(printable(f"{Consistency.NOT_TESTABLE.value}: " + "; ".join(untestable)))
    if not testable:
        table.show_header = False
        table.add_column("claims")
        table.add_row(escape(printable(f"none of the {len(untestable)} published claims is testable with these "
                                       f"runs (each names what it needs below)")))
        return table
    for header in ("claim", "source", "published", "measured (95% interval)", "n", "verdict", "conditions"):
        table.add_column(header, justify="right" if header == "n" else "left")
    for c in testable[:fit.rows]:
        measured = _interval_cell(c.measured, "{:.2f}") if c.measured else "—"
        verdict = c.consistency.value + (f": {c.reason}" if c.reason else "")
        cells = [c.claim.text, c.claim.source, c.claim.published, measured,
                 str(c.measured.n) if c.measured else "—", verdict,
                 (f"suite {c.suite}; " if c.suite else "") + c.conditions]
        table.add_row(*[escape(printable(x)) for x in cells])
    _rest_caption(table, len(testable) - len(testable[:fit.rows]), "checks of claims")
    return table


def verdict_tables(v: Verdicts, fit: Fit = Fit()) -> list[Table]:
    """The tables over seeds (results/verdicts.py), each cut at fit.rows rows."""
    return [t for t in (interval_table(v, fit), claims_table(v, fit)) if t is not None]
