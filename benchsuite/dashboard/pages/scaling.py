"""Scaling: throughput vs devices against ideal linear scaling, and weak/strong scaling
efficiency vs devices, one curve per sweep (the `scaling_efficiency` column), or past MAX_SERIES
sweeps one per model family and scaling mode (the median of its sweeps at each world size). Each
point names its baseline; superlinear points (flagged by the sanity guard) are marked, and why a
point has no efficiency is said under the figures."""

from __future__ import annotations

from benchsuite.results.scaling import BASELINE
from benchsuite.dashboard.data import SiteData, numbers, per_family
from benchsuite.dashboard.page import Page
from benchsuite.dashboard.render import Figure, PageSection, esc, f_num, f_pct, layout, missing, num, present, ptext, short
from benchsuite.dashboard.style import trace_styles


# What the page reads of a run (the runs frame has ~400 columns: grouped whole, each is copied per group).
COLUMNS = ["series", "kind_label", "scaling", "world_size", "tokens_per_s", "scaling_efficiency", "scaling_baseline",
           "scaling_efficiency_reason", "flags"]


def _hover(label, n, value, what):
    return f"{ptext(label)}<br>{n} devices<br>{what}"


def throughput_figure(curves) -> Figure:
    data = []
    for series, style, g in curves:
        color = style.color
        xs = [int(n) for n in g["world_size"]]
        ys = [short(num(v)) for v in g["tokens_per_s"]]
        base_n, base_y = xs[0], ys[0]  # the 1-device run where the sweep has one, else its smallest
        data.append({"type": "scatter", "mode": "lines+markers", "name": ptext(series), "x": xs, "y": ys,
                     "legendgroup": ptext(series), "line": {"color": color, "width": 2, "dash": style.dash},
                     "marker": {"symbol": style.symbol, "size": 8},
                     "hovertemplate": "%{text}<extra></extra>",
                     "text": [_hover(series, n, y, f"{f_num(y)} tok/s") for n, y in zip(xs, ys)]})
        ideal = [short(base_y * n / base_n) for n in xs]
        data.append({"type": "scatter", "mode": "lines", "name": ptext(f"{series} · ideal"), "x": xs, "y": ideal,
                     "legendgroup": ptext(series), "showlegend": False,
                     "line": {"color": color, "dash": "dot", "width": 1},
                     "hovertemplate": "%{text}<extra></extra>",
                     "text": [_hover(series, n, y, f"ideal {f_num(y)} tok/s (linear from {base_n})")
                              for n, y in zip(xs, ideal)]})
    sizes = sorted({x for t in data for x in t["x"]})
    return Figure("fig-scaling-throughput", data,
                  layout("Throughput vs devices (dotted: ideal linear scaling)", "devices (world size)",
                         "tokens / s", xaxis={"tickvals": sizes}, yaxis={"rangemode": "tozero"}))


def efficiency_figure(curves) -> Figure | None:
    data = []
    for series, style, g in curves:
        g = g[g["scaling_efficiency"].map(lambda v: num(v) is not None)]
        if g.empty:
            continue
        scaling = str(g["scaling"].iloc[0])
        xs = [int(n) for n in g["world_size"]]
        ys = [short(num(v)) for v in g["scaling_efficiency"]]
        flagged = [_efficiency_flag(f) for f in g["flags"]] if "flags" in g else [None] * len(xs)
        bases = g["scaling_baseline"] if "scaling_baseline" in g else ["median of the family's sweeps"] * len(xs)
        text = [_hover(series, n, y, f"{scaling} efficiency {f_pct(y)}<br>baseline: {ptext(b)}"
                       + (f"<br>⚠ {ptext(f)}" if f else ""))
                for n, y, b, f in zip(xs, ys, bases, flagged)]
        data.append({"type": "scatter", "mode": "lines+markers", "name": ptext(f"{series} ({scaling})"),
                     "x": xs, "y": ys, "line": {"color": style.color,
                                                "dash": "dash" if scaling == "strong" else "solid"},
                     "marker": {"symbol": ["x" if f else style.symbol for f in flagged],
                                "size": [12 if f else 8 for f in flagged]},
                     "hovertemplate": "%{text}<extra></extra>", "text": text})
    if not data:
        return None
    sizes = sorted({x for t in data for x in t["x"]})
    return Figure("fig-scaling-efficiency", data,
                  layout("Scaling efficiency vs devices (solid: weak, dashed: strong)", "devices (world size)",
                         "efficiency", xaxis={"tickvals": sizes},
                         yaxis={"tickformat": ".0%", "rangemode": "tozero"},
                         shapes=[{"type": "line", "xref": "paper", "x0": 0, "x1": 1, "y0": 1, "y1": 1,
                                  "line": {"color": "#888", "dash": "dot", "width": 1}}]))


def _efficiency_flag(flags) -> str | None:
    """The sanity guard's reason when it flagged this efficiency (record/sanity.py), else None."""
    return next((f.get("reason") for f in flags or [] if isinstance(f, dict) and f.get("field") == "scaling_efficiency"),
                None)


def _notes(curves) -> list[str]:
    """Under the figures: each series' baseline, and why a run has no efficiency (per-series curves and
    single runs; a family's median curve has no single baseline)."""
    notes = []
    for series, _, g in curves:
        if "scaling_baseline" not in g:
            continue
        bases = sorted({str(b) for b in g["scaling_baseline"] if present(b) and b != BASELINE})
        if bases:
            notes.append(f"{esc(series)}: baseline {'; '.join(esc(b) for b in bases)}.")
        for n, reason in zip(g["world_size"], g["scaling_efficiency_reason"]):
            if present(reason):
                notes.append(f"{esc(series)} · {int(n)} devices: no efficiency ({esc(reason)}).")
        for n, flags in zip(g["world_size"], g["flags"]):
            if _efficiency_flag(flags):
                notes.append(f"⚠ {esc(series)} · {int(n)} devices: {esc(_efficiency_flag(flags))}.")
    return notes


def render(data: SiteData) -> PageSection:
    if not data.any_ok:
        return PageSection("scaling", "Scaling", missing("Scaling", "no successful runs"))
    df = data.ok_runs_of(COLUMNS)
    df = df[[v is not None for v in numbers(df["tokens_per_s"])]]
    by_family = per_family(data.df)
    styles = trace_styles(data.df, by_family)
    curves, single, no_base = [], [], []
    for series, g in df.groupby(["kind_label", "scaling"] if by_family else "series", sort=True):
        style = styles[series[0] if by_family else series]
        if by_family:  # one curve per family and scaling: the median of its sweeps at each world size
            series = f"{series[0]} · {series[1]} (median)"
            g = g.groupby("world_size", as_index=False).agg(
                {"tokens_per_s": "median", "scaling_efficiency": "median", "scaling": "first"})
        g = g.sort_values("world_size")
        if g["world_size"].nunique() < 2:
            single.append((series, style, g))
            continue
        curves.append((series, style, g))
        if not (g["world_size"] == 1).any():
            no_base.append(series)
    if not curves:
        return PageSection("scaling", "Scaling", missing("Scaling", "no sweep has successful runs at two or more "
                                                    "world sizes"))
    figs = [throughput_figure(curves)]
    eff = efficiency_figure(curves)
    html = '<div class="row2">' + figs[0].div()
    if eff:
        figs.append(eff)
        html += eff.div()
    else:
        html += missing("Scaling efficiency", "no sweep has a successful 1-device run to compare against")
    html += "</div>"
    notes = _notes(curves + single)
    if no_base:
        notes.append("No 1-device run (efficiency not computed; ideal line drawn from the smallest run): "
                     + ", ".join(esc(s) for s in no_base) + ".")
    if single:
        notes.append("One world size only (no curve): " + ", ".join(esc(s) for s, _, _ in single) + ".")
    html += "".join(f'<p class="note">{n}</p>' for n in notes)
    return PageSection("scaling", "Scaling", html, figs)


PAGE = Page("scaling", "Scaling", render)
