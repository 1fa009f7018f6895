"""Dense vs sparse: tokens/s, MFU, J/token and gCO2e per Mtok side by side at each world size,
and a Pareto view: validation loss vs J/token where validation loss was recorded, else
throughput per device vs J/token, a colour and marker per model family (dashboard/style.py).
Bars are one per series, or past MAX_SERIES series one per family (median, with the range)."""

from __future__ import annotations

from statistics import median

from dashboard.data import SiteData, latest_ok_per_size, per_family
from dashboard.pages import Page
from dashboard.render import (Figure, Section, esc, f_num, f_pct, f_sig, layout, log_axis, missing, num, ptext,
                              short)
from dashboard.style import trace_styles

METRICS = [
    # (column, figure title, axis title, format for hover, tickformat)
    ("tokens_per_s", "Throughput", "tokens / s", f_num, None),
    ("mfu", "MFU", "model FLOPs utilisation", f_pct, ".0%"),
    ("j_per_token", "Energy per token", "J / token", f_sig, None),
    ("gco2e_per_mtok", "Carbon per million tokens", "g CO2e / Mtok", f_sig, None),
]


def _spread(values: list[float]) -> dict | None:
    """Error bars from the median to the lowest and highest value, where a bar is a median of several."""
    return None if len(values) < 2 else {"lo": min(values), "hi": max(values)}


def bar_figure(df, column, title, axis, fmt, tickformat, styles, by_family: bool) -> Figure | None:
    """One bar per world size and trace: a series, or (by_family) a family's median over its sweeps."""
    df = df[df[column].map(lambda v: num(v) is not None)]
    if df.empty:
        return None
    sizes = sorted({int(n) for n in df["world_size"]})
    key = "kind_label" if by_family else "series"
    data = []
    for name, g in df.groupby(key, sort=True):
        per_size = {int(n): [num(v) for v in s[column]] for n, s in g.groupby("world_size")}
        xs = sorted(per_size)
        ys = [short(median(per_size[n])) for n in xs]
        spreads = [_spread(per_size[n]) for n in xs]
        style = styles[name]
        what = f"median of {len(g)} runs" if by_family else g["kind_label"].iloc[0]
        trace = {"type": "bar", "name": ptext(f"{name} ({what})"), "x": [f"w{n}" for n in xs], "y": ys,
                 "marker": {"color": style.color, "pattern": {"shape": style.pattern}},
                 "hovertemplate": "%{text}<extra></extra>", "textposition": "none",
                 "text": [f"{ptext(name)} · w{n}<br>{esc(fmt(y))}" +
                          (f"<br>range {esc(fmt(sp['lo']))} – {esc(fmt(sp['hi']))}" if sp else "")
                          for n, y, sp in zip(xs, ys, spreads)]}
        if any(spreads):
            trace["error_y"] = {"type": "data", "symmetric": False, "color": "#495057",
                                "array": [short(sp["hi"] - y) if sp else 0 for y, sp in zip(ys, spreads)],
                                "arrayminus": [short(y - sp["lo"]) if sp else 0 for y, sp in zip(ys, spreads)]}
        data.append(trace)
    yaxis = {"tickformat": tickformat} if tickformat else log_axis([y for t in data for y in t["y"]])
    return Figure(f"fig-compare-{column}", data,
                  layout(title, "devices (world size)", axis, barmode="group", height=240 + 24 * len(data),
                         xaxis={"type": "category", "categoryorder": "array",
                                "categoryarray": [f"w{n}" for n in sizes]}, yaxis=yaxis))


def _front(points, minimize_y: bool):
    """Non-dominated points: lower x and (lower or higher) y are better."""
    best, front = None, []
    for x, y in sorted(points, key=lambda p: (p[0], p[1] if minimize_y else -p[1])):
        if best is None or (y < best if minimize_y else y > best):
            front.append((x, y))
            best = y
    return front


def pareto_figure(df, families) -> tuple[Figure | None, str]:
    """Quality vs energy when validation loss exists, else throughput per device vs energy."""
    has = lambda c: df[c].map(lambda v: num(v) is not None)  # noqa: E731
    quality = df[has("val_loss_final") & has("j_per_token")]
    if not quality.empty:
        pts, ycol, ytitle, minimize = quality, "val_loss_final", "final validation loss (lower is better)", True
        title = "Pareto: validation loss vs energy per token (lower-left is better)"
        yval = lambda r: num(r["val_loss_final"])  # noqa: E731
    else:
        pts = df[has("tokens_per_s") & has("j_per_token")]
        if pts.empty:
            return None, "no run has both energy per token and a throughput or validation loss"
        ycol, ytitle, minimize = "tokens_per_s", "tokens / s per device (higher is better)", False
        title = "Pareto: throughput per device vs energy per token (upper-left is better; validation loss " \
                "not measured)"
        yval = lambda r: num(r["tokens_per_s"]) / max(num(r["world_size"]) or 1, 1)  # noqa: E731
    data, points = [], []
    for name, style in families.items():  # dense first, then each router in a fixed order
        g = pts[pts["kind_label"] == name]
        if g.empty:
            continue
        xs = [short(num(v)) for v in g["j_per_token"]]
        ys = [short(yval(r)) for r in g.to_dict("records")]
        points += list(zip(xs, ys))
        data.append({"type": "scatter", "mode": "markers", "name": ptext(name), "x": xs, "y": ys,
                     "marker": {"color": style.color, "symbol": style.symbol, "size": 9, "opacity": 0.85},
                     "text": [ptext(lbl) for lbl in g["run_label"]],
                     "hovertemplate": f"%{{text}}<br>%{{x:.4g}} J/token<br>{ytitle.split(' (')[0]}: %{{y:.4g}}"
                                      "<extra></extra>"})
    front = _front(points, minimize)
    data.append({"type": "scatter", "mode": "lines", "name": "Pareto front", "x": [p[0] for p in front],
                 "y": [p[1] for p in front], "line": {"color": "#555", "dash": "dot", "shape": "hv"},
                 "hoverinfo": "skip"})
    return Figure("fig-compare-pareto", data, layout(title, "J / token", ytitle, height=440,
                                                     xaxis=log_axis([x for x, _ in points]))), ycol


def render(data: SiteData) -> Section:
    if data.ok.empty:
        return Section("compare", "Dense vs sparse", missing("Dense vs sparse", "no successful runs"))
    df = latest_ok_per_size(data.df)
    by_family = per_family(data.df)
    styles = trace_styles(data.df, by_family)
    figs, parts = [], []
    for column, title, axis, fmt, tickformat in METRICS:
        fig = bar_figure(df, column, title, axis, fmt, tickformat, styles, by_family)
        if fig:
            figs.append(fig)
            parts.append(fig.div())
        else:
            parts.append(missing(title, "not measured for any successful run"))
    html = '<div class="row2">' + "".join(parts) + "</div>"
    kinds = set(df["kind"])
    if not ({"dense", "moe"} <= kinds):
        html += f'<p class="note">Only {esc(", ".join(sorted(map(str, kinds))))} runs in these results.</p>'
    pareto, why = pareto_figure(df, trace_styles(data.df, by_family=True))
    if pareto:
        figs.append(pareto)
        html += pareto.div("fig wide")
    else:
        html += missing("Pareto view", why)
    return Section("compare", "Dense vs sparse", html, figs)


PAGE = Page("compare", "Dense vs sparse", render)
