"""Dense vs sparse: tokens/s, MFU, J/token and gCO2e per Mtok side by side at each world size,
each bar a run's median with its 95 % interval over seeds as error bars (the report's figures,
results/model.py), a Pareto view: validation loss vs J/token where validation loss was recorded, else
throughput per device vs J/token, a colour and marker per model family (dashboard/style.py),
and the per-expert load of each MoE series (tokens per expert, how far the busiest and idlest
expert are from the mean, dropped share): what separates the capacity, dropless and
shared-expert routers. Bars and load rows are one per series, or past MAX_SERIES series one per
family (the median, with the range for bars; the run of median imbalance for load)."""

from __future__ import annotations

from dataclasses import dataclass
from statistics import median

import numpy as np

from benchsuite.dashboard.data import SiteData, metrics_of, numbers, per_family, tokens_per_expert
from benchsuite.dashboard.page import Page
from benchsuite.dashboard.render import (Figure, PageSection, esc, f_num, f_pct, f_sig, layout, log_axis, missing, num, ptext,
                              short, table)
from benchsuite.dashboard.style import trace_styles
from benchsuite.record.columns import described, view_columns
from benchsuite.results.frames import rows_of

METRICS = [
    # (column, figure title, axis title, format for hover, tickformat)
    ("tokens_per_s", "Throughput", "tokens / s", f_num, None),
    ("mfu", "MFU", "model FLOPs utilisation", f_pct, ".0%"),
    ("j_per_token", "Energy per token", "J / token", f_sig, None),
    ("gco2e_per_mtok", "Carbon per million tokens", "g CO2e / Mtok", f_sig, None),
]


def _spread(values: list[float]) -> dict | None:
    """A family's bar: error bars from its median to its lowest and highest run."""
    return None if len(values) < 2 else {"lo": min(values), "hi": max(values), "what": "range"}


def _interval(run, column: str) -> dict | None:
    """A run's bar: error bars of its 95 % interval over seeds (None with one seed)."""
    lo, hi = num(run.get(f"{column}_lo")), num(run.get(f"{column}_hi"))
    return None if lo is None or hi is None else {"lo": lo, "hi": hi,
                                                  "what": f"95 % interval over {len(run['seeds'])} seeds"}


def bar_figure(df, column, title, axis, fmt, tickformat, styles, by_family: bool) -> Figure | None:
    """One bar per world size and trace: a run of a series (its median over seeds, with its interval), or
    (by_family) a family's median over its runs (with their range). Full precision: a bar is the figure
    the report prints."""
    df = df[[v is not None for v in numbers(df[column])]]
    if df.empty:
        return None
    sizes = sorted({int(n) for n in df["world_size"]})
    key = "kind_label" if by_family else "series"
    data = []
    for name, g in df.groupby(key, sort=True):
        if by_family:
            per_size = {int(n): [num(v) for v in s[column]] for n, s in g.groupby("world_size")}
            xs = sorted(per_size)
            ys = [median(per_size[n]) for n in xs]
            spreads = [_spread(per_size[n]) for n in xs]
        else:  # one run per (series, world size): the model's median and interval, as the report shows
            runs = rows_of(g.sort_values("world_size"), ["world_size", "seeds", column, f"{column}_lo", f"{column}_hi"])
            xs, ys = [int(r["world_size"]) for r in runs], [num(r[column]) for r in runs]
            spreads = [_interval(r, column) for r in runs]
        style = styles[name]
        what = f"median of {len(g)} runs" if by_family else g["kind_label"].iloc[0]
        trace = {"type": "bar", "name": ptext(f"{name} ({what})"), "x": [f"w{n}" for n in xs], "y": ys,
                 "marker": {"color": style.color, "pattern": {"shape": style.pattern}},
                 "hovertemplate": "%{text}<extra></extra>", "textposition": "none",
                 "text": [f"{ptext(name)} · w{n}<br>{esc(fmt(y))}" +
                          (f"<br>{sp['what']} {esc(fmt(sp['lo']))} – {esc(fmt(sp['hi']))}" if sp else "")
                          for n, y, sp in zip(xs, ys, spreads)]}
        if any(spreads):
            trace["error_y"] = {"type": "data", "symmetric": False, "color": "#495057",
                                "array": [sp["hi"] - y if sp else 0 for y, sp in zip(ys, spreads)],
                                "arrayminus": [y - sp["lo"] if sp else 0 for y, sp in zip(ys, spreads)]}
        data.append(trace)
    # the axis holds the error bars too: an interval reaching 100× a bar's height makes the bar a flat line
    ends = [y + d * sign for t in data if "error_y" in t for y, d, sign in
            [*zip(t["y"], t["error_y"]["array"], [1] * len(t["y"])), *zip(t["y"], t["error_y"]["arrayminus"],
                                                                           [-1] * len(t["y"]))]]
    yaxis = {"tickformat": tickformat} if tickformat else log_axis([y for t in data for y in t["y"]] + ends)
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
    has = lambda c: np.array([v is not None for v in numbers(df[c])], dtype=bool)  # noqa: E731
    quality = df[has("quality.final_val_loss") & has("j_per_token")]
    if not quality.empty:
        pts, ycol = quality, "quality.final_val_loss"
        ytitle, minimize = "final validation loss (lower is better)", True
        title = "Pareto: validation loss vs energy per token (lower-left is better)"
    else:
        ycol = "metrics.tokens_per_s_per_device"  # the record's own figure, never divided here
        pts = df[has(ycol) & has("j_per_token")] if ycol in df else df.iloc[0:0]
        if pts.empty:
            return None, "no run has both energy per token and a throughput or validation loss"
        ytitle, minimize = "tokens / s per device (higher is better)", False
        title = "Pareto: throughput per device vs energy per token (upper-left is better; validation loss " \
                "not measured)"
    data, points = [], []
    for name, style in families.items():  # dense first, then each router in a fixed order
        g = pts[pts["kind_label"] == name]
        if g.empty:
            continue
        xs = [short(v) for v in numbers(g["j_per_token"])]
        ys = [short(v) for v in numbers(g[ycol])]
        points += list(zip(xs, ys))
        data.append({"type": "scatter", "mode": "markers", "name": ptext(name), "x": xs, "y": ys,
                     "marker": {"color": style.color, "symbol": style.symbol, "size": 9, "opacity": 0.85},
                     "text": [ptext(lbl) for lbl in g["run_label"].tolist()],
                     "hovertemplate": f"%{{text}}<br>%{{x:.4g}} J/token<br>{ytitle.split(' (')[0]}: %{{y:.4g}}"
                                      "<extra></extra>"})
    front = _front(points, minimize)
    data.append({"type": "scatter", "mode": "lines", "name": "Pareto front", "x": [p[0] for p in front],
                 "y": [p[1] for p in front], "line": {"color": "#555", "dash": "dot", "shape": "hv"},
                 "hoverinfo": "skip"})
    return Figure("fig-compare-pareto", data, layout(title, "J / token", ytitle, height=440,
                                                     xaxis=log_axis([x for x, _ in points]))), ycol


@dataclass(frozen=True)
class RoutingBalance:
    """One MoE run's routing balance: tokens per expert in its last step, summed over MoE layers
    and ranks (data.tokens_per_expert), its imbalance as the record states it, and its dropped share."""

    label: str
    family: str  # display name
    tokens: list[float]
    counts: str  # what the tokens count: computed by the experts, or routed to them
    busiest: float | None  # metrics.moe.load_max_over_mean: the one imbalance every view shows
    dropped: float | None
    impl: str | None

    @property
    def mean(self) -> float:
        return sum(self.tokens) / len(self.tokens)


# What the page reads of a run: the bars' figures with their intervals, the Pareto view's, the load table's.
COLUMNS = ["rec", "kind", "kind_label", "series", "label", "run_label", "world_size", "seeds", "quality.final_val_loss",
           "metrics.tokens_per_s_per_device", *(f"{c}{end}" for c, *_ in METRICS for end in ("", "_lo", "_hi"))]
view_columns(*COLUMNS)
SHOWN_EXPERTS = 16  # tokens of the first experts in the table; the run page draws every one


def expert_loads(data: SiteData, df, by_family: bool) -> list[RoutingBalance]:
    """Every MoE series' load (its run at the smallest world size), or past MAX_SERIES series the
    run of median busiest ÷ mean of each family."""
    loads = []
    moe = df.loc[df["kind"] == "moe", ["rec", "series", "kind_label", "world_size"]]
    moe = moe.sort_values(["series", "world_size"]).drop_duplicates("series")
    for row in rows_of(moe, ["rec", "series", "kind_label"]):
        section = metrics_of(data.summary(row["rec"])).moe
        per_expert = None if section is None else tokens_per_expert(section)
        if section is not None and per_expert:
            loads.append(RoutingBalance(str(row["series"]), str(row["kind_label"]), *per_expert,
                                    section.load_max_over_mean, section.dropped_frac,
                                    section.expert_impl or None))
    if not by_family:
        return loads
    groups: dict[str, list[RoutingBalance]] = {}
    for load in loads:
        groups.setdefault(load.family, []).append(load)
    out = []
    for name, group in sorted(groups.items()):
        group = sorted(group, key=lambda g: g.busiest or 0.0)
        mid = group[(len(group) - 1) // 2]
        out.append(RoutingBalance(f"{name} (median of {len(group)})", name, mid.tokens, mid.counts, mid.busiest,
                              mid.dropped, mid.impl))
    return out


def expert_load_table(loads: list[RoutingBalance]) -> str:
    """One row per MoE series: experts, tokens per expert (mean and each), the record's busiest ÷ mean (its
    definition in the note under the table, as the report states it)."""
    rows = []
    for g in loads:
        shown = ", ".join(f_num(t) for t in g.tokens[:SHOWN_EXPERTS])
        more = f", … ({len(g.tokens) - SHOWN_EXPERTS} more)" if len(g.tokens) > SHOWN_EXPERTS else ""
        rows.append([g.label, g.family, len(g.tokens), f_num(g.mean), f_sig(g.busiest),
                     sum(1 for t in g.tokens if t == 0), f_pct(g.dropped), g.impl, g.counts, shown + more])
    return (table(["Series", "Family", "Experts", "Tokens/expert (mean)", "Busiest ÷ mean", "Idle experts", "Dropped",
                   "Expert impl", "Tokens counted", "Tokens per expert (expert 0, 1, …)"], rows)
            + f'<p class="note">Busiest ÷ mean: {esc(described("metrics.moe.load_max_over_mean"))}.</p>')


def routing_table(data: SiteData) -> str:
    """Learned vs forced routing, one row per pair of the results model (results/routing.py)."""
    rows = []
    for p in data.results.routing_pairs:
        s = p.speedup
        ratio = f_sig(s.point) + (f" ({f_sig(s.lo)}–{f_sig(s.hi)})" if s.lo is not None else f" ({s.reason})")
        rows.append([p.label, f_num(p.learned["tokens_per_s"]), f_num(p.forced["tokens_per_s"]), ratio,
                     f_pct(p.learned["mfu"]), f_pct(p.forced["mfu"]), f_sig(p.learned["j_per_token"]),
                     f_sig(p.forced["j_per_token"])])
    if not rows:
        return ""
    return ("<h3>Learned vs forced routing (forced ÷ learned tok/s: what the router's imbalance costs)</h3>"
            + table(["Run (learned)", "Tok/s learned", "Tok/s forced", "Forced ÷ learned (95 % interval)",
                     "MFU learned", "MFU forced", "J/token learned", "J/token forced"], rows))


def render(data: SiteData) -> PageSection:
    if not data.any_ok:
        return PageSection("compare", "Dense vs sparse", missing("Dense vs sparse", "no successful runs"))
    runs = data.ok_runs_of(COLUMNS)  # (grouping all ~400 columns would copy each of them for every group)
    df = runs[runs["kind"] != "user"]
    loops = sorted(set(runs.loc[runs["kind"] == "user", "label"].astype(str)))
    if df.empty:
        return PageSection("compare", "Dense vs sparse", missing("Dense vs sparse", "no successful run of a model "
                                                                 "benchsuite built (only your own loops)"))
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
    kinds = set(df["kind"].unique())
    if loops:  # measure()'s loops: not a dense or MoE model of benchsuite's, so not among these bars
        html += (f'<p class="note">Your own training loops (benchsuite.measure), on the overview and their run '
                 f'pages, not among these bars: {esc(", ".join(loops))}.</p>')
    if not ({"dense", "moe"} <= kinds):
        html += f'<p class="note">Only {esc(", ".join(sorted(map(str, kinds))))} runs in these results.</p>'
    pareto, why = pareto_figure(df, trace_styles(data.df, by_family=True))
    if pareto:
        figs.append(pareto)
        html += pareto.div("fig wide")
    else:
        html += missing("Pareto view", why)
    html += "<h3>MoE per-expert load (last step, summed over MoE layers and ranks)</h3>"
    loads = expert_loads(data, df, by_family)
    if loads:
        html += expert_load_table(loads)
    elif (df["kind"] == "moe").any():
        html += missing("MoE per-expert load", "not measured (no metrics.moe.tokens_per_expert or expert_load)")
    else:
        html += missing("MoE per-expert load", "not applicable: no MoE runs")
    html += routing_table(data)
    return PageSection("compare", "Dense vs sparse", html, figs)


PAGE = Page("compare", "Dense vs sparse", render)
