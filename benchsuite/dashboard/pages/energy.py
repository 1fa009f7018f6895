"""Energy and carbon: GPU / CPU / DRAM energy per run, stacked, with each figure's source
visible (measured solid; metered but not measured hatched, paler; estimated crossed, palest: the
classes of record/kinds.py), and the PUE and grid intensity (with its source) each CO2e figure used."""

from __future__ import annotations

from statistics import median

from benchsuite.dashboard.data import SiteData, per_family, plain
from benchsuite.dashboard.page import Page
from benchsuite.dashboard.render import Figure, PageSection, esc, f_sig, layout, log_axis, missing, ptext, short, table
from benchsuite.record.columns import view_columns
from benchsuite.record.kinds import SOURCES, SourceKind

PARTS = [("gpu", "GPU", "#2f9e44"), ("cpu", "CPU", "#1971c2"), ("dram", "DRAM", "#f08c00")]
# The sources a bar can have, most to least trustworthy (record/kinds.SOURCES' order).
DRAWN = [s for s, kind in SOURCES.items() if kind.figure]
SOLID = [s for s in DRAWN if SOURCES[s].measured]
OTHER = ("\\", 0.5)  # a part whose source the record does not state
CARBON = ("pue", "intensity_g_per_kwh", "intensity_source", "kwh", "co2e_g")  # what the carbon table reads
view_columns(*(f"carbon.{c}" for c in CARBON), "energy.source",
             *(f"energy.{p}_j" for p, _, _ in PARTS), *(f"energy.sources.{p}" for p, _, _ in PARTS))


def look(kind: SourceKind) -> tuple[str, float]:
    """How a source is drawn, (pattern shape, opacity): solid where a view calls it measured, hatched where a
    meter read it otherwise, crossed and pale for an estimate."""
    if kind.measured:
        return "", 1.0
    return ("/", 0.8) if kind.metered else ("x", 0.5)


def _source(part_source, source) -> str:
    """A part's source as the record states it (energy.sources.<part>), else the energy's, else unknown."""
    return str(part_source or source or "unknown")


def stacked_figure(data: SiteData) -> tuple[Figure | None, list[str]]:
    """Traces per (part, source) so the legend tells measured from estimated; runs whose energy
    section is missing (or holds no figure) are returned by label, not drawn as zero. A bar per run,
    or past MAX_SERIES series one per (model family, world size): the median of its runs. (Read from the
    results model's energy columns: no record decoded.)"""
    by_family = per_family(data.df)
    values: dict[tuple, dict[str, list[float]]] = {}  # (part, source) → bar label → values
    labels, unmeasured = [], []
    df = data.df
    joules = [plain(df[f"energy.{p}_j"]) for p, _, _ in PARTS]
    sources = [plain(df[f"energy.sources.{p}"]) for p, _, _ in PARTS]
    for i, (run_label, kind_label, world_size, source) in enumerate(
            zip(df["run_label"].tolist(), df["kind_label"].tolist(), df["world_size"].tolist(),
                plain(df["energy.source"]))):
        if all(j[i] is None for j in joules):
            unmeasured.append(run_label)
            continue
        label = ptext(f"{kind_label} · w{world_size}" if by_family else run_label)
        if label not in labels:
            labels.append(label)
        for (part, _, _), j, part_sources in zip(PARTS, joules, sources):
            if j[i] is not None:
                values.setdefault((part, _source(part_sources[i], source)), {}).setdefault(label, []).append(j[i])
    if not values:
        return None, unmeasured
    if by_family:
        labels.sort()
    names = {part: (name, color) for part, name, color in PARTS}
    order = DRAWN + sorted({s for _, s in values if s not in DRAWN})
    traces = []
    for part, src in sorted(values, key=lambda k: ([p for p, _, _ in PARTS].index(k[0]), order.index(k[1]))):
        name, color = names[part]
        shape, opacity = look(SOURCES[src]) if src in DRAWN else OTHER
        bars = values[(part, src)]
        xs = [x for x in labels if x in bars]
        ys = [short(median(bars[x])) for x in xs]
        counts = [f" (median of {len(bars[x])} runs)" if by_family else "" for x in xs]
        traces.append({
            "type": "bar", "name": ptext(f"{name} · {src}"), "x": xs, "y": ys,
            "text": [f"{x}<br>{name}: {f_sig(y)} J ({ptext(src)}){c}" for x, y, c in zip(xs, ys, counts)],
            "marker": {"color": color, "opacity": opacity, "pattern": {"shape": shape, "solidity": 0.35},
                       "line": {"color": color, "width": 1}},
            "hovertemplate": "%{text}<extra></extra>", "textposition": "none"})
    totals = [sum(y for t in traces for x, y in zip(t["x"], t["y"]) if x == label) for label in labels]
    log = log_axis(totals)
    what = "median per model family and world size" if by_family else "per run"
    fig = Figure("fig-energy-stacked", traces,
                 layout(f"Energy {what}: GPU + CPU + DRAM (solid: {' or '.join(SOLID)}; hatched/pale: "
                        f"{' or '.join(s for s in DRAWN if s not in SOLID)})",
                        "", "energy (J)" + (", log scale" if log else ""), barmode="stack", height=420,
                        xaxis={"type": "category", "categoryorder": "array", "categoryarray": labels,
                               "tickangle": -30}, yaxis=log))
    return fig, unmeasured


def carbon_table(data: SiteData) -> str:
    """One line per (PUE, intensity, source) used, with the runs and totals under it."""
    groups: dict[tuple, list[tuple]] = {}  # (PUE, intensity, source) → each record's (kWh, CO2e)
    no_carbon = 0
    df = data.df
    # (a record with a carbon section has a PUE: the section's one field that is never null)
    for pue, intensity, source, kwh, co2e in zip(*(plain(df[f"carbon.{c}"]) for c in CARBON)):
        if pue is None:
            no_carbon += 1
            continue
        groups.setdefault((pue, intensity, str(source or "—")), []).append((kwh, co2e))
    if not groups:
        return missing("Carbon", "no record has a carbon section")
    rows = []
    for (pue, intensity, source), cs in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        kwh = [k for k, _ in cs if k is not None]
        co2 = [c for _, c in cs if c is not None]
        rows.append([f_sig(pue), f_sig(intensity), source, len(cs),
                     f_sig(sum(kwh)) if kwh else "not measured", f_sig(sum(co2)) if co2 else "not measured"])
    html = table(["PUE", "Grid intensity (g CO2e/kWh)", "Intensity source", "Runs", "Energy (kWh)", "CO2e (g)"],
                 rows)
    html += ('<p class="note">CO2e = energy (kWh) × PUE × grid intensity. '
             + (f"{no_carbon} run(s) have no carbon figure (not measured or failed)." if no_carbon else "")
             + "</p>")
    return html


def render(data: SiteData) -> PageSection:
    if data.df.empty:
        return PageSection("energy", "Energy and carbon", missing("Energy", "no records"))
    fig, unmeasured = stacked_figure(data)
    figs = [fig] if fig else []
    html = fig.div("fig wide") if fig else missing("Energy per run", "not measured for any run")
    legend = " ".join(f'<span class="src src-{esc(s)}">{esc(s)}</span>' for s in DRAWN)
    html += f'<p class="note">Energy sources, most to least direct: {legend}; unavailable parts are left out.'
    if unmeasured and fig:
        shown = ", ".join(esc(x) for x in unmeasured[:12]) + (" …" if len(unmeasured) > 12 else "")
        html += f" Energy not measured for {len(unmeasured)} run(s): {shown}."
    html += "</p><h3>Carbon: PUE and grid intensity used</h3>" + carbon_table(data)
    return PageSection("energy", "Energy and carbon", html, figs)


PAGE = Page("energy", "Energy and carbon", render)
