"""The terminal report: one row per run, the figures a reader compares first."""

from __future__ import annotations

import pandas as pd
from rich.markup import escape
from rich.table import Table

from benchsuite.results.values import num, present
from benchsuite.terminal import printable  # every string of a record reaches the terminal through it

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
    ("status", "status", "{}"),
]
FLAG_MARK = "⚠"
MEMORY_MEASURED = "metrics.memory.model_state_bytes.measured.total"
MEMORY_ANALYTIC = "metrics.memory.model_state_bytes.analytic.total"


def _fmt(fmt: str, v) -> str:
    return fmt.format(v) if present(v) else "—"


def _step_cell(row) -> str:
    med, lo, hi = row.get("step_time_median_s"), row.get("step_time_ci95_lo_s"), row.get("step_time_ci95_hi_s")
    if not present(med):
        return "—"
    return f"{med * 1e3:.1f} ({lo * 1e3:.1f}–{hi * 1e3:.1f})"


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


CELLS = {"step ms (95% CI)": _step_cell, "efficiency": _efficiency_cell, "baseline": _baseline_cell,
         "state MiB meas/model": _memory_cell, "to target": _target_cell}


def report_rows(df: pd.DataFrame) -> list[dict]:
    """The report as plain dicts (for --json): the same columns, unformatted, nulls as None."""
    if df.empty:
        return []
    cols = [c for _, c, _ in COLUMNS if c] + ["run_key", "scaling_efficiency", "scaling_baseline_run_keys",
                                              "scaling_baseline", "scaling_efficiency_reason",
                                              "step_time_median_s", "step_time_ci95_lo_s",
                                              "step_time_ci95_hi_s", "error_type", "error_message",
                                              MEMORY_MEASURED, MEMORY_ANALYTIC, "flagged", "flags", *QUALITY]
    cols = [c for c in cols if c in df]
    return [{k: (v if present(v) else None) for k, v in r.items()} for r in df[cols].to_dict("records")]


def report_table(df: pd.DataFrame) -> Table:
    table = Table(title="benchsuite results", header_style="bold")
    for header, _, _ in COLUMNS:
        table.add_column(header, justify="right" if header not in ("suite", "workload", "scaling", "status")
                         else "left")
    for _, row in df.iterrows():
        cells = []
        for header, col, fmt in COLUMNS:
            cells.append(CELLS[header](row) if col is None else _fmt(fmt, row.get(col)))
        flagged = row["status"] == "ok" and bool(row.get("flagged"))
        if row["status"] == "failed":
            cells[-1] = f"failed: {row.get('error_type')}"
        elif flagged:  # impossible figures (results/sanity.py): never shown as a plain ok
            cells[-1] = f"ok {FLAG_MARK} flagged"
        table.add_row(*[escape(printable(c)) for c in cells],
                      style="red" if row["status"] == "failed" else ("yellow" if flagged else None))
    flagged_rows = df[df["flagged"].fillna(False).astype(bool)] if "flagged" in df else df.iloc[:0]
    lines = [f"{FLAG_MARK} {escape(printable(r['workload']))} w{r['world_size']}: "
             f"{escape(printable(r.get('flag_summary')))}" for _, r in flagged_rows.iterrows()]
    no_base = df[(df["status"] == "ok") & df["scaling_efficiency_reason"].map(present)] \
        if "scaling_efficiency_reason" in df else df.iloc[:0]
    lines += [f"efficiency — {escape(printable(r['workload']))} w{r['world_size']}: "
              f"{escape(printable(r['scaling_efficiency_reason']))}" for _, r in no_base.iterrows()]
    if lines:
        table.caption = "\n".join(lines)
    return table


def _section_table(df: pd.DataFrame, title: str, columns: list[tuple[str, str, str]], when: str) -> Table | None:
    """A table of the runs that have column `when` (None when no run has it)."""
    if when not in df or df[when].isna().all():
        return None
    table = Table(title=title, header_style="bold")
    for header, _, _ in columns:
        table.add_column(header, justify="left" if header in ("workload", "router", "source", "intensity source") else "right")
    for _, row in df[df[when].notna()].iterrows():
        table.add_row(*[escape(printable(_fmt(fmt, row.get(col)))) for _, col, fmt in columns])
    return table


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


def section_tables(df: pd.DataFrame) -> list[Table]:
    """MoE routing, pipeline and energy/carbon tables, each only when some run has those figures."""
    tables = [_section_table(df, "MoE routing (last step)", MOE_COLUMNS, "metrics.moe.dropped_frac"),
              _section_table(df, "Pipeline bubble (measured vs formula)", PIPELINE_COLUMNS,
                             "metrics.pipeline.bubble_formula"),
              _section_table(df, "Energy and carbon (measured window)", ENERGY_COLUMNS, "energy.source")]
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
