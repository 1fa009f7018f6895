"""The papers' claims beside these runs (benchsuite/results/verdicts.py): each claim's measured
counterpart with its 95 % interval over seeds, the published figure, n, what differs (scale,
hardware, tokens) and a verdict only where the interval carries one; then every sparse workload's
to-target ratio to the dense one of its suite, ranked only where its interval excludes 1."""

from __future__ import annotations

from benchsuite.results.stats import ConfidenceInterval
from benchsuite.results.verdicts import Consistency
from benchsuite.dashboard.data import SiteData
from benchsuite.dashboard.page import Page
from benchsuite.dashboard.render import DASH, Figure, PageSection, esc, f_sig, layout, missing, ptext, short, table

COLORS = {Consistency.CONSISTENT: "#2b8a3e", Consistency.NOT_CONSISTENT: "#c92a2a",
          Consistency.INCONCLUSIVE: "#868e96"}
LOG_FLOOR = 1e-3  # where a claimed region "< x" starts on the log axis


def interval_text(i: ConfidenceInterval | None) -> str:
    if i is None or i.point is None:
        return DASH if i is None or not i.reason else i.reason
    if i.lo is None:
        return f"{f_sig(i.point)} (no interval: {i.reason})"
    return f"{f_sig(i.point)} ({f_sig(i.lo)}–{f_sig(i.hi)})"


def claims_figure(checks) -> Figure | None:
    """Measured ratio with its interval (error bars) over the claimed region (a grey band), log x."""
    shown = [c for c in checks if c.measured is not None and c.measured.point is not None]
    if not shown:
        return None
    labels = [ptext(f"{c.claim.key} ({c.suite})") for c in shown]
    band_x, band_y = [], []
    for c, label in zip(shown, labels):
        band_x += [short(max(c.claim.region[0], LOG_FLOOR)), short(c.claim.region[1]), None]
        band_y += [label, label, None]
    points = {"type": "scatter", "mode": "markers", "name": "measured (95 % interval)", "y": labels,
              "x": [short(c.measured.point) for c in shown],
              "marker": {"size": 10, "color": [COLORS.get(c.consistency, "#495057") for c in shown]},
              "error_x": {"type": "data", "symmetric": False,
                          "array": [short(c.measured.hi - c.measured.point) if c.measured.hi else None for c in shown],
                          "arrayminus": [short(c.measured.point - c.measured.lo) if c.measured.lo else None
                                         for c in shown]},
              "hovertemplate": "%{text}<extra></extra>",
              "text": [ptext(f"{c.claim.text}<br>{interval_text(c.measured)} · {c.consistency.value}") for c in shown]}
    band = {"type": "scatter", "mode": "lines", "name": "published claim", "x": band_x, "y": band_y,
            "line": {"color": "rgba(134,142,150,0.35)", "width": 14}, "hoverinfo": "skip"}
    return Figure("fig-claims", [band, points],
                  layout("Measured ratio beside the published claim (grey: the claimed range)", "ratio (log)", "",
                         height=max(240, 110 + 44 * len(shown)), xaxis={"type": "log"},
                         yaxis={"type": "category", "autorange": "reversed"}))


def claims_table(checks) -> str:
    rows = [[c.claim.text, c.claim.source, c.claim.published, interval_text(c.measured),
             c.measured.n if c.measured else DASH, c.consistency.value + (f": {c.reason}" if c.reason else ""),
             (f"suite {c.suite}; " if c.suite else "") + c.conditions] for c in checks]
    return table(["Claim", "Source", "Published", "Measured (95% interval)", "Seeds (n)", "Verdict", "Conditions"],
                 rows)


MAX_PAIR_ROWS = 200  # the index stays small at 10,000 runs; `benchsuite report --json` has every pair


def pairs_table(v, shown: list) -> str:
    """The pairs with an interval (`shown`: Verdicts.pairs_over_seeds), and how many more there are."""
    rows = [[p.suite, p.sparse, p.dense, p.figure, interval_text(p.ratio), p.text] for p in shown]
    html = table(["Suite", "Sparse workload", "Dense workload", "Figure", "Sparse ÷ dense (95% interval)", "Verdict"],
                 rows)
    left = len(v.pair_figures) - len(shown)
    if left:
        html += (f'<p class="note">{left} more pair(s) without an interval (one seed) or past the first '
                 f'{MAX_PAIR_ROWS}: `benchsuite report --json` lists every one.</p>')
    return html


def render(data: SiteData) -> PageSection:
    slug, title = "claims", "Published claims beside these runs"
    v = data.verdicts
    if not v.groups:
        return PageSection(slug, title, missing("Claims", "no run with a quality section: set train.eval_every and "
                                                      "train.target_loss, and sweep train.seed"))
    fig = claims_figure(v.claims)
    claims = len({c.claim.text for c in v.claims})  # counted as the report counts them: each claim once
    html = (fig.div("fig wide") if fig else "") + (
        f'<p class="note">{claims} published claim{"s" if claims != 1 else ""}, checked {len(v.claims)} '
        f'time{"s" if len(v.claims) != 1 else ""}: a row per claim and suite that can test it.</p>'
        if v.claims else "") + claims_table(v.claims)
    html += f'<p class="note">{esc(v.method)}. {esc(v.energy_spread)}.</p>'
    shown = v.pairs_over_seeds(MAX_PAIR_ROWS)  # (two or more seeds on the smaller side: an interval)
    html += "<h3>Sparse ÷ dense over seeds</h3>" + (pairs_table(v, shown) if shown else missing(
        "Sparse ÷ dense", "no dense and sparse workload of one suite with two or more seeds each (sweep train.seed)"))
    return PageSection(slug, title, html, [fig] if fig else [])


PAGE = Page("claims", "Published claims beside these runs", render)
