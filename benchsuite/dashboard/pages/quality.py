"""Dense vs sparse at equal quality: validation loss against what training spent to get there, and
what each run took to reach `train.target_loss` (benchsuite/metrics/quality.py).

- Curves (metrics.quality.curve): validation loss vs training tokens, vs training energy (J) and vs
  model FLOPs, three panels sharing the loss axis, one trace per run in each (legend groups tie a
  run's three traces together). Energy points exist only where the record has an energy figure;
  energy not read from an energy counter (its source estimated or sampled: what no view calls measured,
  record/kinds.py) says so in the panel title.
- To target (metrics.quality's to-target fields): tokens, seconds, kWh and g CO2e per run, as
  horizontal bars in four panels sharing the run axis. A run that did not reach the target gets no
  bar (never a zero bar) but a "not reached" label, and its reason in the table below; a figure
  the run could not measure (energy unavailable) is labelled "not measured" the same way.
"""

from __future__ import annotations

import msgspec
import numpy as np

from benchsuite.dashboard.data import SiteData, metrics_of, numbers, per_family
from benchsuite.results.frames import column_values, rows_of
from benchsuite.dashboard.page import Page
from benchsuite.dashboard.render import (DASH, Figure, PageSection, esc, f_num, f_sig, layout, missing, num, present, ptext,
                              short, table)
from benchsuite.dashboard.style import DASHES, router_name, series_styles, trace_styles
from benchsuite.energy.carbon import J_PER_KWH
from benchsuite.record.kinds import SOURCES, experts_choose, source_kind
from benchsuite.record.types import Quality

NO_EVAL = "no evaluation in these records: set train.eval_every and train.target_loss"
# (curve key, panel title, axis title, hover unit)
CURVES = [("tokens", "vs training tokens", "training tokens", "tokens"),
          ("energy_j", "vs training energy", "training energy (J)", "J"),
          ("model_flops", "vs model FLOPs", "model FLOPs", "FLOPs")]
# (panel title, value of a run) for the to-target panels
TARGETS = [("Tokens", lambda q: num(q.tokens)),
           ("Time (s)", lambda q: num(q.seconds)),
           ("Energy (kWh)", lambda q: None if num(q.energy_j) is None else num(q.energy_j) / J_PER_KWH),
           ("CO2e (g)", lambda q: num(q.co2e_g))]
ENERGY_PANELS = {2, 3}  # the to-target panels whose figure is energy (or CO2e from it)
# The sources of a figure that the page does not call measured (record/kinds.py), weakest first.
NOT_MEASURED = " or ".join(k.source for k in reversed(SOURCES.values()) if k.figure and not k.measured)


ROW = ["series", "kind_label", "run_label", "world_size", "router", "energy.source"]  # what a Run reads of its row


class Run:
    """One run's quality figures, with what the page needs to name and colour it. `q`: its latest record's
    metrics.quality with the run's medians over seeds in place of that record's to-target figures; `row`: its
    row of the results model's runs (ROW: the latest record's router and energy source among them)."""

    def __init__(self, row: dict, q: Quality):
        self.row, self.q = row, q
        self.series = row["series"]
        self.label = row["series"]
        self.kind = str(row["kind_label"])
        self.curve = [p for p in q.curve or [] if p.val_loss is not None]
        src = q.energy_source or row["energy.source"]
        self.energy_source = str(src) if present(src) else "unavailable"

    @property
    def energy_not_measured(self) -> bool:
        """Its energy has a figure, but not one a view calls measured (record/kinds.py: not an energy counter)."""
        kind = source_kind(self.energy_source)
        return kind.figure and not kind.measured

    @property
    def experts_choose_tokens(self) -> bool:
        """Its router's experts choose their tokens (record/kinds.ROUTERS), whatever the record's spelling."""
        return experts_choose(router_name(self.row["router"]))

    @property
    def target(self) -> float | None:
        return num(self.q.target_loss)

    @property
    def reached(self) -> bool | None:
        """True / False as the record says; records of an older harness without `reached` count as
        reached when they give a to-target figure."""
        if self.q.reached is not None:
            return self.q.reached
        if self.target is None:
            return None
        return True if num(self.q.tokens) is not None else None

    def why_not(self) -> str:
        """Why the run has no to-target figures (not reached, no target, no evaluation)."""
        reason = self.q.reason
        if present(reason) and str(reason):
            return str(reason)
        if self.target is None:
            return "no target: train.target_loss is not set"
        return "target not reached" if self.reached is False else "no to-target figure in the record"

    def energy_why(self) -> str:
        reason = self.q.energy_reason
        if present(reason) and str(reason):
            return str(reason)
        return f"energy {self.energy_source}"


def quality_runs(data: SiteData) -> tuple[list[Run], list[str]]:
    """Runs with a metrics.quality section (past MAX_SERIES sweeps, the median run of each model family
    and world size), and the labels of ok runs without one. A run's to-target figures are its medians
    over seeds (results/model.py, as the report shows them); its curve, its latest record's."""
    medians_of = [k for k in data.runs.columns if k.startswith("quality.") and k != "quality.reached"]
    ok = data.ok_runs_of(["rec", *ROW, *medians_of])  # (only the columns the page reads: the frame has ~400)
    if ok.empty:
        return [], []
    sections = [metrics_of(data.summary(i)).quality for i in ok["rec"].tolist()]
    has = [q is not None for q in sections]
    without = [str(label) for label, h in zip(ok["run_label"].tolist(), has) if not h]
    runs = []
    shown = ok.loc[has]
    figures = {k: numbers(shown[k]) for k in medians_of}  # (num of each: whether the run has the median)
    medians = column_values(shown, medians_of)
    for i, (row, q) in enumerate(zip(rows_of(shown, ROW), (q for q in sections if q is not None))):
        runs.append(Run(row, msgspec.structs.replace(q, **{k[len("quality."):]: medians[k][i] for k in medians_of
                                                           if figures[k][i] is not None})))
    if per_family(data.df):
        return _median_runs(runs), without
    per_series: dict[str, int] = {}
    for r in runs:
        per_series[r.series] = per_series.get(r.series, 0) + 1
    for r in runs:  # the workload alone where it names one run; with its world size where a sweep has several
        if per_series[r.series] > 1:
            r.label = str(r.row["run_label"])
    return runs, without


def _median_runs(runs: list[Run]) -> list[Run]:
    """One run per (family, world size): the one of median best validation loss, named for its group."""
    groups: dict[tuple, list[Run]] = {}
    for r in runs:
        groups.setdefault((r.kind, int(r.row["world_size"])), []).append(r)
    out = []
    for (kind, n), rs in sorted(groups.items()):
        rs = sorted(rs, key=lambda r: num(r.q.best_val_loss) or 0.0)
        r = rs[(len(rs) - 1) // 2]
        r.series, r.label = kind, f"{kind} · w{n} (median of {len(rs)})"
        out.append(r)
    return out


def _styles(runs: list[Run], data: SiteData) -> dict[int, dict]:
    styles = trace_styles(data.df, per_family(data.df))
    seen: dict[str, int] = {}
    out = {}
    for i, r in enumerate(runs):  # a dash per run within its family, so no two runs look alike
        fam = styles[r.series].family.name
        n = seen[fam] = seen.get(fam, -1) + 1
        out[i] = {"color": styles[r.series].color, "symbol": styles[r.series].symbol, "dash": DASHES[n % len(DASHES)]}
    return out


def _estimated_note(runs: list[Run]) -> str:
    est = [r for r in runs if r.energy_not_measured]
    if not est:
        return ""
    if len(est) == len(runs):
        sources = sorted({r.energy_source for r in est})
        return f" (energy {' / '.join(sources)}, not measured)"
    return f" ({len(est)} of {len(runs)} runs' energy {NOT_MEASURED})"


def curves_figure(runs: list[Run], data: SiteData) -> tuple[Figure | None, list[Run]]:
    """Loss vs tokens | energy | model FLOPs; returns the figure and the runs with no energy point."""
    if not any(r.curve for r in runs):
        return None, []
    traces, no_energy, with_energy = _curve_traces(runs, _styles(runs, data))
    est = _estimated_note(with_energy)
    annotations = [{"text": ptext(f"Loss {title}" + (est if key == "energy_j" else "")), "showarrow": False,
                    "xref": "x domain" if p == 0 else f"x{p + 1} domain", "yref": "y domain", "x": 0, "y": 1.0,
                    "xanchor": "left", "yanchor": "bottom", "font": {"size": 12}}
                   for p, (key, title, _, _) in enumerate(CURVES)]
    shapes = []
    targets = sorted({r.target for r in runs if r.target is not None and r.curve})
    for t in targets:
        for p in range(len(CURVES)):
            shapes.append({"type": "line", "xref": "x domain" if p == 0 else f"x{p + 1} domain", "x0": 0, "x1": 1,
                           "yref": "y", "y0": short(t), "y1": short(t),
                           "line": {"color": "#868e96", "dash": "dot", "width": 1}})
        annotations.append({"text": f"target {f_sig(t)}", "showarrow": False, "xref": "x3 domain", "x": 1,
                            "xanchor": "right", "yref": "y", "y": short(t), "yanchor": "bottom",
                            "font": {"size": 11, "color": "#868e96"}})
    y_log = _loss_range([y for t in traces for x, y in zip(t["x"], t["y"]) if x is not None and x > 0] + targets)
    lay = layout("Validation loss vs what training spent (dotted: target loss)", "", "validation loss",
                 height=440, grid={"rows": 1, "columns": len(CURVES), "pattern": "coupled", "xgap": 0.08},
                 annotations=annotations, shapes=shapes, margin={"t": 80}, **_curve_axes(y_log))
    return Figure("fig-quality-curves", traces, lay), no_energy


def _curve_traces(runs: list[Run], styles: dict[int, dict]) -> tuple[list[dict], list[Run], list[Run]]:
    """A trace per run and panel (a run's three share a legend entry), the runs with no energy point and
    those with one."""
    traces, no_energy, with_energy, in_legend = [], [], [], set()
    for p, (key, _, _, unit) in enumerate(CURVES):
        for i, r in enumerate(runs):
            pts = [(num(getattr(pt, key)), num(pt.val_loss), pt.step) for pt in r.curve]
            pts = [(x, y, s) for x, y, s in pts if x is not None]  # energy: only points that have a figure
            if key == "energy_j" and all(x == 0 for x, _, _ in pts):
                pts = []  # the step-0 point alone (0 J before training) is no energy figure
            if not pts:
                if key == "energy_j" and r.curve:
                    no_energy.append(r)
                continue
            if key == "energy_j":
                with_energy.append(r)
            src = f" ({r.energy_source})" if key == "energy_j" else ""
            traces.append({
                "type": "scatter", "mode": "lines+markers", "name": ptext(f"{r.label} ({r.kind})"),
                "legendgroup": f"run{i}", "showlegend": i not in in_legend,
                "xaxis": "x" if p == 0 else f"x{p + 1}", "yaxis": "y",
                "x": [short(x) for x, _, _ in pts], "y": [short(y) for _, y, _ in pts],
                "line": {"color": styles[i]["color"], "dash": styles[i]["dash"], "width": 2},
                "marker": {"size": 6, "symbol": styles[i]["symbol"]}, "hovertemplate": "%{text}<extra></extra>",
                "text": [f"{ptext(r.label)}<br>step {ptext(s)}: validation loss {f_sig(y)}<br>{f_sig(x)} {unit}{src}"
                         for x, y, s in pts]})
            in_legend.add(i)
    return traces, no_energy, with_energy


def _curve_axes(y_log: list | None) -> dict:
    """The panels' x axes, log by default: runs can differ tenfold in energy (and the loss falls fastest
    early). The step-0 evaluation (x = 0) is off a log axis, and the loss axis is fitted to what is on it
    (y_log); the buttons switch to linear x (step 0 included, loss axis fitted to everything) and back."""
    axes = {f"xaxis{'' if p == 0 else p + 1}": {"title": {"text": axis}, "exponentformat": "SI", "type": "log",
                                               "dtick": "D2"}
            for p, (_, _, axis, _) in enumerate(CURVES)}
    scale = []
    for label, kind in (("x: log", "log"), ("x: linear (with step 0)", "linear")):
        args = {f"xaxis{'' if p == 0 else p + 1}.{k}": v for p in range(len(CURVES))
                for k, v in (("type", kind), ("dtick", "D2" if kind == "log" else None))}
        args.update({"yaxis.range": y_log, "yaxis.autorange": False} if kind == "log" and y_log else
                    {"yaxis.autorange": True})
        scale.append({"label": label, "method": "relayout", "args": [args]})
    if y_log:
        axes["yaxis"] = {"range": y_log, "autorange": False}
    return {"updatemenus": [{"type": "buttons", "direction": "left", "buttons": scale, "showactive": True,
                             "x": 0.5, "xanchor": "left", "y": 1.2, "yanchor": "bottom", "pad": {"r": 0, "t": 0},
                             "font": {"size": 11}}], **axes}


def _loss_range(ys: list) -> list | None:
    ys = [y for y in ys if y is not None]
    if not ys:
        return None
    lo, hi = min(ys), max(ys)
    pad = 0.06 * (hi - lo) if hi > lo else 0.05 * abs(hi) or 0.1
    return [short(lo - pad), short(hi + pad)]


def _status(r: Run, value) -> str | None:
    """The label where a run has no bar in a panel, or None where it has one."""
    if value is not None:
        return None
    if r.reached is False:
        return "not reached"
    if r.reached is None:
        return "no target" if r.target is None else "no figure"
    return "not measured"


def target_figure(runs: list[Run], data: SiteData) -> Figure | None:
    runs = [r for r in runs if r.target is not None]
    if not runs:
        return None
    styles = _styles(runs, data)
    colors = [styles[i]["color"] for i in range(len(runs))]
    labels = [ptext(r.label) for r in runs]
    traces, annotations = [], []
    for p, (title, value) in enumerate(TARGETS):
        ys = [value(r.q) if r.reached is not False else None for r in runs]
        text = []
        for r, v in zip(runs, ys):
            est = " · " + r.energy_source if p in ENERGY_PANELS and r.energy_not_measured else ""
            text.append("" if v is None else f"{f_sig(v)}{est}")
            label = _status(r, v)
            if label:
                why = (r.why_not() if label != "not measured" else
                       r.energy_why() if p in ENERGY_PANELS else f"no {title} figure in the record")
                annotations.append({"text": label, "hovertext": ptext(why), "showarrow": False,
                                    "xref": "x domain" if p == 0 else f"x{p + 1} domain", "x": 0.02,
                                    "xanchor": "left", "yref": "y", "y": ptext(r.label),
                                    "font": {"size": 11, "style": "italic",
                                             "color": "#c92a2a" if label == "not reached" else "#868e96"}})
        traces.append({"type": "bar", "orientation": "h", "name": title, "showlegend": False,
                       "xaxis": "x" if p == 0 else f"x{p + 1}", "yaxis": "y",
                       "y": labels, "x": [short(v) for v in ys], "marker": {"color": colors},
                       "text": text, "textposition": "auto", "cliponaxis": False,
                       "hovertemplate": "%{y}<br>%{text}<extra>" + ptext(title) + "</extra>"})
    targets = sorted({r.target for r in runs})
    target_text = " / ".join(f_sig(t) for t in targets)
    annotations += [{"text": title, "showarrow": False, "xref": "x domain" if p == 0 else f"x{p + 1} domain",
                     "yref": "y domain", "x": 0, "y": 1.0, "xanchor": "left", "yanchor": "bottom",
                     "font": {"size": 12}} for p, (title, _) in enumerate(TARGETS)]
    axes = {f"xaxis{'' if p == 0 else p + 1}": {"exponentformat": "e" if p in ENERGY_PANELS else "SI",
                                               "rangemode": "tozero"} for p in range(len(TARGETS))}
    return Figure("fig-quality-target", traces,
                  layout(f"To validation loss {target_text} (interpolated between evaluations)", "", "",
                         height=max(260, 120 + 30 * len(runs)), margin={"t": 70},
                         grid={"rows": 1, "columns": len(TARGETS), "pattern": "coupled", "xgap": 0.06},
                         yaxis={"type": "category", "autorange": "reversed", "categoryorder": "array",
                                "categoryarray": labels},
                         annotations=annotations, **axes))


def target_table(runs: list[Run]) -> str:
    rows = []
    for r in runs:
        q = r.q
        if r.reached is True:
            result = f"reached at step ≈{f_sig(q.step)}" if num(q.step) is not None else "reached"
            if num(q.energy_j) is None or num(q.co2e_g) is None:
                result += f"; {r.energy_why()}"
        else:
            result = ("not reached: " if r.reached is False else "") + r.why_not()
        kwh = num(q.energy_j)
        rows.append([r.label, r.kind, f_sig(r.target), result,
                     f_num(q.tokens) if r.reached else DASH, f_sig(q.seconds) if r.reached else DASH,
                     f_sig(kwh / J_PER_KWH) if r.reached and kwh is not None else DASH,
                     f_sig(q.co2e_g) if r.reached else DASH, r.energy_source,
                     f_sig(q.best_val_loss)])
    return table(["Run", "Model", "Target loss", "Result", "Tokens", "Time (s)", "Energy (kWh)", "CO2e (g)",
                  "Energy source", "Best validation loss"], rows)


def _rgba(hex_color: str, alpha: float) -> str:
    h = hex_color.lstrip("#")
    return f"rgba({int(h[0:2], 16)},{int(h[2:4], 16)},{int(h[4:6], 16)},{alpha})"


def seed_curves(data: SiteData) -> tuple[str, list[Figure]]:
    """Where a workload ran several seeds (results/verdicts.py groups them): each seed's loss curve
    faint, the median over seeds bold, its 95 % interval (t on logs) as a band; and each sparse
    workload's tokens to target over the dense one, ranked only where the interval excludes 1."""
    from benchsuite.results.stats import log_t_interval
    from benchsuite.results.verdicts import all_pair_figures, pair_ratio

    groups = [g for g in data.seed_groups if len(g.seeds) > 1 and g.quality]
    if not groups:
        return "", []
    series = dict(zip(data.runs["identity"], data.runs["series"]))
    styles = series_styles(data.df)
    traces = []
    for g in groups:
        style = styles.get(series.get(g.identity))
        color = style.color if style else "#495057"
        by_step: dict[int, list[tuple[float, float]]] = {}
        for rec in g.summaries():
            quality = metrics_of(rec).quality
            curve = (quality.curve or []) if quality is not None else []
            pts = [(num(p.tokens), num(p.val_loss), p.step) for p in curve]
            pts = [(x, y, s) for x, y, s in pts if x and y is not None]  # step 0 (x = 0) is off the log axis
            for x, y, s in pts:
                by_step.setdefault(s, []).append((x, y))
            traces.append({"type": "scatter", "mode": "lines", "showlegend": False, "legendgroup": g.label,
                           "x": [short(x) for x, _, _ in pts], "y": [short(y) for _, y, _ in pts],
                           "line": {"color": _rgba(color, 0.3), "width": 1}, "hoverinfo": "skip"})
        steps = sorted(s for s, v in by_step.items() if len(v) == len(g.records))
        xs = [float(np.median([x for x, _ in by_step[s]])) for s in steps]
        bands = [log_t_interval([y for _, y in by_step[s]]) for s in steps]
        traces.append({"type": "scatter", "mode": "lines", "fill": "toself", "fillcolor": _rgba(color, 0.15),
                       "line": {"width": 0}, "showlegend": False, "legendgroup": g.label, "hoverinfo": "skip",
                       "x": [short(x) for x in xs + xs[::-1]],
                       "y": [short(b.hi) for b in bands] + [short(b.lo) for b in bands[::-1]]})
        traces.append({"type": "scatter", "mode": "lines+markers", "name": ptext(f"{g.label} (median of {len(g.seeds)} seeds)"),
                       "legendgroup": g.label, "x": [short(x) for x in xs], "y": [short(b.point) for b in bands],
                       "line": {"color": color, "width": 3}, "marker": {"size": 5},
                       "hovertemplate": "%{y} at %{x} tokens<extra>" + ptext(g.label) + "</extra>"})
    fig = Figure("fig-quality-seeds", traces,
                 layout("Validation loss over seeds: faint per seed, bold the median, band its 95 % interval",
                        "training tokens", "validation loss", height=420, xaxis={"type": "log", "dtick": "D2"}))
    verdicts = [pair_ratio(f) for f in all_pair_figures(groups) if f.figure == "tokens"]
    notes = "".join(f'<p class="note">{esc(p.sparse)} ÷ {esc(p.dense)}, tokens to target: '
                    f"{esc(f_sig(p.ratio.point))}" + (f" ({esc(f_sig(p.ratio.lo))}–{esc(f_sig(p.ratio.hi))})"
                                                    if p.ratio.lo is not None else "")
                    + f": {esc(p.text)}.</p>" for p in verdicts)
    return fig.div("fig wide") + notes, [fig]


def render(data: SiteData) -> PageSection:
    slug, title = "quality", "Dense vs sparse at equal quality"
    if not data.any_ok:
        return PageSection(slug, title, missing("Validation loss", "no successful runs"))
    runs, without = quality_runs(data)
    if not runs:
        return PageSection(slug, title, missing("Validation loss", NO_EVAL))
    figs, html = [], ""
    curves, no_energy = curves_figure(runs, data)
    if curves:
        figs.append(curves)
        html += curves.div("fig wide")
        if no_energy:
            shown = ", ".join(f"{esc(r.label)} ({esc(r.energy_source)})" for r in no_energy)
            html += (f'<p class="note">Energy not measured for: {shown}; those runs are left out of the energy '
                     "panel.</p>")
    else:
        html += missing("Validation loss curves", "no evaluation points in these records: set train.eval_every")
    fig = target_figure(runs, data)
    html += "<h3>To the target loss</h3>"
    if fig:
        figs.append(fig)
        html += fig.div("fig wide")
    else:
        html += missing("To the target loss", "no target: set train.target_loss")
    html += target_table(runs)
    seed_html, seed_figs = seed_curves(data)
    html, figs = html + seed_html, figs + seed_figs
    notes = []
    counting = next((r.q.counting for r in runs if present(r.q.counting)), None)
    if counting:
        notes.append(f"How these are counted: {esc(counting)}.")
    est = [r.label for r in runs if r.energy_not_measured]
    if est:
        notes.append(f"Energy {NOT_MEASURED}, not measured, for: " + esc(", ".join(est)) + ".")
    if any(r.experts_choose_tokens for r in runs):
        notes.append("Expert choice routes over the whole batch, so in a causal decoder a token's experts depend on "
                     "later tokens: its validation loss can use that leak, and its figures are its cost, not a "
                     "comparable quality.")
    if without:
        notes.append(f"No evaluation in {len(without)} other run(s) (set train.eval_every and train.target_loss): "
                     + esc(", ".join(without[:12])) + (" …" if len(without) > 12 else "") + ".")
    html += "".join(f'<p class="note">{n}</p>' for n in notes)
    return PageSection(slug, title, html, figs)


PAGE = Page("quality", "Dense vs sparse at equal quality", render)
