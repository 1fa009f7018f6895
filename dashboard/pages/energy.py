"""Energy and carbon: GPU / CPU / DRAM energy per run, stacked, with each figure's source
visible (measured solid; sampled, estimated hatched and paler), and the PUE and grid
intensity (with its source) each CO2e figure used."""

from __future__ import annotations

from dashboard.data import SiteData
from dashboard.pages import Page
from dashboard.render import Figure, Section, esc, f_sig, layout, missing, num, ptext, short, table

PARTS = [("gpu", "GPU", "#2f9e44"), ("cpu", "CPU", "#1971c2"), ("dram", "DRAM", "#f08c00")]
# How each source is drawn: (pattern shape, opacity). Order = most to least trustworthy.
SOURCES = {"measured": ("", 1.0), "sampled": ("/", 0.8), "estimated": ("x", 0.5)}
OTHER = ("\\", 0.5)


def _source(rec_energy: dict, part: str) -> str:
    src = (rec_energy.get("sources") or {}).get(part) or rec_energy.get("source") or "unknown"
    return str(src)


def stacked_figure(data: SiteData) -> tuple[Figure | None, list[str]]:
    """Traces per (part, source) so the legend tells measured from estimated; runs whose energy
    section is missing (or holds no figure) are returned by label, not drawn as zero."""
    rows = []
    unmeasured = []
    for row in data.df.to_dict("records"):
        e = data.record(row).get("energy")
        if not isinstance(e, dict) or all(num(e.get(f"{p}_j")) is None for p, _, _ in PARTS):
            unmeasured.append(row["run_label"])
            continue
        rows.append((row, e))
    if not rows:
        return None, unmeasured
    labels = [ptext(r["run_label"]) for r, _ in rows]
    traces = {}
    for part, name, color in PARTS:
        for (row, e), label in zip(rows, labels):
            v = num(e.get(f"{part}_j"))
            if v is None:
                continue
            src = _source(e, part)
            t = traces.get((part, src))
            if t is None:
                shape, opacity = SOURCES.get(src, OTHER)
                t = traces[(part, src)] = {
                    "type": "bar", "name": ptext(f"{name} · {src}"), "x": [], "y": [], "text": [],
                    "marker": {"color": color, "opacity": opacity, "pattern": {"shape": shape, "solidity": 0.35},
                               "line": {"color": color, "width": 1}},
                    "hovertemplate": "%{text}<extra></extra>", "textposition": "none"}
            t["x"].append(label)
            t["y"].append(short(v))
            t["text"].append(f"{label}<br>{name}: {f_sig(v)} J ({ptext(src)})")
    order = list(SOURCES) + sorted({s for _, s in traces if s not in SOURCES})
    data_ = [traces[k] for k in sorted(traces, key=lambda k: ([p for p, _, _ in PARTS].index(k[0]),
                                                              order.index(k[1])))]
    fig = Figure("fig-energy-stacked", data_,
                 layout("Energy per run: GPU + CPU + DRAM (solid: measured; hatched/pale: sampled or estimated)",
                        "", "energy (J)", barmode="stack", height=420,
                        xaxis={"type": "category", "categoryorder": "array", "categoryarray": labels,
                               "tickangle": -30}))
    return fig, unmeasured


def carbon_table(data: SiteData) -> str:
    """One line per (PUE, intensity, source) used, with the runs and totals under it."""
    groups: dict[tuple, list] = {}
    no_carbon = 0
    for row in data.df.to_dict("records"):
        c = data.record(row).get("carbon")
        if not isinstance(c, dict):
            no_carbon += 1
            continue
        key = (num(c.get("pue")), num(c.get("intensity_g_per_kwh")), str(c.get("intensity_source") or "—"))
        groups.setdefault(key, []).append(c)
    if not groups:
        return missing("Carbon", "no record has a carbon section")
    rows = []
    for (pue, intensity, source), cs in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        kwh = [num(c.get("kwh")) for c in cs if num(c.get("kwh")) is not None]
        co2 = [num(c.get("co2e_g")) for c in cs if num(c.get("co2e_g")) is not None]
        rows.append([f_sig(pue), f_sig(intensity), source, len(cs),
                     f_sig(sum(kwh)) if kwh else "not measured", f_sig(sum(co2)) if co2 else "not measured"])
    html = table(["PUE", "intensity (g CO2e/kWh)", "intensity source", "runs", "energy (kWh)", "CO2e (g)"], rows)
    html += ('<p class="note">CO2e = energy (kWh) × PUE × grid intensity. '
             + (f"{no_carbon} run(s) have no carbon figure (not measured or failed)." if no_carbon else "")
             + "</p>")
    return html


def render(data: SiteData) -> Section:
    if data.df.empty:
        return Section("energy", "Energy and carbon", missing("Energy", "no records"))
    fig, unmeasured = stacked_figure(data)
    figs = [fig] if fig else []
    html = fig.div("fig wide") if fig else missing("Energy per run", "not measured for any run")
    legend = " ".join(f'<span class="src src-{esc(s)}">{esc(s)}</span>' for s in SOURCES)
    html += f'<p class="note">Energy sources, most to least direct: {legend}; unavailable parts are left out.'
    if unmeasured and fig:
        shown = ", ".join(esc(x) for x in unmeasured[:12]) + (" …" if len(unmeasured) > 12 else "")
        html += f" Energy not measured for {len(unmeasured)} run(s): {shown}."
    html += "</p><h3>Carbon: PUE and grid intensity used</h3>" + carbon_table(data)
    return Section("energy", "Energy and carbon", html, figs)


PAGE = Page("energy", "Energy and carbon", render)
