"""Dense vs sparse: tokens/s, MFU, J/token and gCO2e per Mtok side by side at each world size,
and a Pareto view: validation loss vs J/token where validation loss was recorded, else
throughput per device vs J/token."""

from __future__ import annotations

from dashboard.data import SiteData, latest_ok_per_size
from dashboard.pages import Page, series_colors
from dashboard.render import Figure, Section, esc, f_num, f_pct, f_sig, layout, missing, num, ptext, short

METRICS = [
    # (column, figure title, axis title, format for hover, tickformat)
    ("tokens_per_s", "Throughput", "tokens / s", f_num, None),
    ("mfu", "MFU", "model FLOPs utilisation", f_pct, ".0%"),
    ("j_per_token", "Energy per token", "J / token", f_sig, None),
    ("gco2e_per_mtok", "Carbon per million tokens", "g CO2e / Mtok", f_sig, None),
]


def bar_figure(df, column, title, axis, fmt, tickformat, colors) -> Figure | None:
    df = df[df[column].map(lambda v: num(v) is not None)]
    if df.empty:
        return None
    sizes = sorted({int(n) for n in df["world_size"]})
    data = []
    for series, g in df.groupby("series", sort=True):
        g = g.sort_values("world_size")
        kind = g["kind_label"].iloc[0]
        ys = [short(num(v)) for v in g[column]]
        data.append({"type": "bar", "name": ptext(f"{series} ({kind})"), "x": [f"w{int(n)}" for n in g["world_size"]],
                     "y": ys, "marker": {"color": colors[series]},
                     "hovertemplate": "%{text}<extra></extra>",
                     "text": [f"{ptext(series)} · w{int(n)}<br>{esc(fmt(y))}" for n, y in zip(g["world_size"], ys)],
                     "textposition": "none"})
    yaxis = {"tickformat": tickformat} if tickformat else {}
    return Figure(f"fig-compare-{column}", data,
                  layout(title, "devices (world size)", axis, barmode="group", height=320,
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


def pareto_figure(df) -> tuple[Figure | None, str]:
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
    for kind, color, symbol in (("dense", "#1f77b4", "circle"), ("moe", "#ff7f0e", "diamond")):
        g = pts[pts["kind"] == kind] if kind == "moe" else pts[pts["kind"] != "moe"]
        if g.empty:
            continue
        xs = [short(num(v)) for v in g["j_per_token"]]
        ys = [short(yval(r)) for r in g.to_dict("records")]
        points += list(zip(xs, ys))
        data.append({"type": "scatter", "mode": "markers", "name": "MoE (sparse)" if kind == "moe" else "dense",
                     "x": xs, "y": ys, "marker": {"color": color, "symbol": symbol, "size": 10},
                     "hovertemplate": "%{text}<extra></extra>",
                     "text": [f"{ptext(lbl)}<br>{f_sig(x)} J/token<br>{ytitle.split(' (')[0]}: {f_sig(y)}"
                              for lbl, x, y in zip(g["run_label"], xs, ys)]})
    front = _front(points, minimize)
    data.append({"type": "scatter", "mode": "lines", "name": "Pareto front", "x": [p[0] for p in front],
                 "y": [p[1] for p in front], "line": {"color": "#555", "dash": "dot", "shape": "hv"},
                 "hoverinfo": "skip"})
    return Figure("fig-compare-pareto", data, layout(title, "J / token", ytitle, height=440)), ycol


def render(data: SiteData) -> Section:
    if data.ok.empty:
        return Section("compare", "Dense vs sparse", missing("Dense vs sparse", "no successful runs"))
    df = latest_ok_per_size(data.df)
    colors = series_colors(data.df)
    figs, parts = [], []
    for column, title, axis, fmt, tickformat in METRICS:
        fig = bar_figure(df, column, title, axis, fmt, tickformat, colors)
        if fig:
            figs.append(fig)
            parts.append(fig.div())
        else:
            parts.append(missing(title, "not measured for any successful run"))
    html = '<div class="row2">' + "".join(parts) + "</div>"
    kinds = set(df["kind"])
    if not ({"dense", "moe"} <= kinds):
        html += f'<p class="note">Only {esc(", ".join(sorted(map(str, kinds))))} runs in these results.</p>'
    pareto, why = pareto_figure(df)
    if pareto:
        figs.append(pareto)
        html += pareto.div("fig wide")
    else:
        html += missing("Pareto view", why)
    return Section("compare", "Dense vs sparse", html, figs)


PAGE = Page("compare", "Dense vs sparse", render)
