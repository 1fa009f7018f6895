"""One page per run: the sanity guard's flags (a warning box), headline figures, step-time series,
loss curve (with validation loss and the target loss), per-rank step time (stragglers), MoE expert
load per layer and expert (tokens computed, else routed) with its imbalance per step and the expert
implementation, model-state memory measured vs analytic, energy per device, carbon, environment and
the resolved config. Every section a record lacks says so ("not measured") instead of drawing nothing
or zero."""

from __future__ import annotations

import json

from benchsuite.record.sanity import MAX_DROPPED_FRAC
from benchsuite.record.values import dig
from benchsuite.results.scaling import BASELINE
from benchsuite.dashboard.data import load_table
from benchsuite.dashboard.render import (Figure, Section, esc, f_bytes, f_count, f_duration, f_ms, f_num, f_pct, f_si, f_sig,
                              kv_table, layout, missing, num, present, ptext, series, short, table)

SMALL = {"height": 300}
# The columns of the site DataFrame a run page reads (data.SiteData.df): only these become each page's row
# (a row of all ~200 columns costs more than the page at 10,000 records).
ROW_COLUMNS = ["rec", "page", "identity", "suite", "status", "kind", "kind_label", "run_label", "seed", "repeat", "tokens_per_s",
               "mfu", "step_time_median_s", "step_time_ci95_lo_s", "step_time_ci95_hi_s", "scaling_efficiency",
               "scaling_baseline", "scaling_efficiency_reason", "j_per_token", "gco2e_per_mtok", "avg_w_per_device",
               "flags"]


def _steps(rec) -> list[dict]:
    return [s for s in rec.get("steps") or [] if isinstance(s, dict)]


def step_figure(rec) -> Figure | None:
    pts = [(s.get("step", i), num(s.get("time_s"))) for i, s in enumerate(_steps(rec))]
    pts = [(x, y) for x, y in pts if y is not None]
    if not pts:
        return None
    ys = [short(y * 1e3, 4) for _, y in pts]
    med = num(dig(rec, "metrics", "step_time_s", "median"))
    shapes = [] if med is None else [{"type": "line", "xref": "paper", "x0": 0, "x1": 1, "y0": short(med * 1e3),
                                      "y1": short(med * 1e3), "line": {"color": "#888", "dash": "dot", "width": 1}}]
    return Figure("fig-run-steps", [{"type": "scatter", "mode": "lines+markers", "name": "step time",
                                     **series([x for x, _ in pts], ys), "marker": {"size": 5}}],
                  layout("Step time per measured step (dotted: median)", "step", "ms", shapes=shapes, **SMALL))


def loss_figure(rec) -> Figure | None:
    steps = _steps(rec)
    data = []
    for key, name, style in (("loss", "training loss", {"mode": "lines"}),
                             ("val_loss", "validation loss", {"mode": "lines+markers", "marker": {"size": 8}})):
        pts = [(s.get("step", i), num(s.get(key))) for i, s in enumerate(steps)]
        pts = [(x, short(y)) for x, y in pts if y is not None]
        if pts:
            data.append({"type": "scatter", "name": name, **series([x for x, _ in pts], [y for _, y in pts]),
                         **style})
    if not data:
        return None
    target = num(dig(rec, "metrics", "quality", "target_loss"))
    if target is None:
        return Figure("fig-run-loss", data, layout("Loss", "step", "loss", **SMALL))
    line = {"type": "line", "xref": "paper", "x0": 0, "x1": 1, "y0": short(target), "y1": short(target),
            "line": {"color": "#868e96", "dash": "dot", "width": 1}}
    return Figure("fig-run-loss", data, layout(f"Loss (dotted: target validation loss {f_sig(target)})", "step",
                                               "loss", shapes=[line], **SMALL))


def rank_figure(rec) -> Figure | None:
    per_rank = dig(rec, "metrics", "per_rank") or {}
    meds = per_rank.get("step_time_median_s") if isinstance(per_rank, dict) else None
    if not isinstance(meds, list) or not any(num(v) is not None for v in meds):
        return None
    ys = [None if num(v) is None else short(num(v) * 1e3, 4) for v in meds]
    worst = max(range(len(ys)), key=lambda i: ys[i] if ys[i] is not None else -1)
    ratio = num(per_rank.get("straggler_ratio"))
    # the worker's straggler ratio: the slowest rank's median step time / the median over ranks
    title = "Median step time per rank" + (f" (slowest / median = {ratio:.2f})" if ratio is not None else "")
    return Figure("fig-run-ranks", [{"type": "bar", "name": "median step time", "x": list(range(len(ys))), "y": ys,
                                     "marker": {"color": ["#d62728" if i == worst and len(ys) > 1 else "#4c6ef5"
                                                          for i in range(len(ys))]}}],
                  layout(title, "rank", "ms", xaxis={"type": "category"}, **SMALL))


def load_colors(top: float) -> list:
    """Under-used blue, balanced white at exactly 1 on a 0–top axis, overloaded red."""
    return [[0, "#1971c2"], [1 / top, "#f8f9fa"], [1, "#e03131"]]


def expert_figure(rec) -> Figure | None:
    """A heatmap, one row per MoE layer: each expert's tokens ÷ its layer's mean (1 = balanced); the
    tokens the experts computed where recorded, else those routed to them (data.LOAD_KEYS)."""
    table = load_table(rec)
    if table is None:
        return None
    rows, counts = table
    rel = [[short(v / (sum(row) / len(row)), 4) if sum(row) > 0 else None for v in row] for row in rows]
    top = max([2.0, *(v for row in rel for v in row if v is not None)])
    return Figure("fig-run-experts", [{
        "type": "heatmap", "name": f"tokens {counts}", "x": list(range(max(map(len, rows)))),
        "y": list(range(len(rows))), "z": [[None if v == 0 else v for v in row] for row in rel],  # idle: empty
        "customdata": [[short(v) for v in row] for row in rows],
        "hovertemplate": f"MoE layer %{{y}}, expert %{{x}}: %{{customdata:,}} tokens {counts}, "
                         "%{z:.2f} × the layer mean<extra></extra>",
        # 0 to the busiest, white at exactly 1: an expert at half its share is as blue as one at twice is red
        "zmin": 0, "zmax": top, "colorscale": load_colors(top), "colorbar": {"title": {"text": "÷ mean"}}}],
        layout(f"MoE expert load, last step: tokens {counts} (÷ the layer's mean; white = balanced, "
               f"empty = idle)", "expert",
               "MoE layer", xaxis={"type": "category"}, yaxis={"type": "category", "autorange": "reversed"},
               **SMALL))


def imbalance_figure(rec) -> Figure | None:
    """metrics.moe.imbalance_by_step as a line: each measured step's max ÷ mean tokens routed per expert
    (mean over MoE layers; 1 = even), so a router that drifts out of balance shows."""
    by_step = dig(rec, "metrics", "moe", "imbalance_by_step")
    pts = [(i, num(v)) for i, v in enumerate(by_step)] if isinstance(by_step, list) else []
    pts = [(x, short(y, 4)) for x, y in pts if y is not None]
    if not pts:
        return None
    even = {"type": "line", "xref": "paper", "x0": 0, "x1": 1, "y0": 1, "y1": 1,
            "line": {"color": "#888", "dash": "dot", "width": 1}}
    return Figure("fig-run-imbalance", [{"type": "scatter", "mode": "lines+markers", "name": "max ÷ mean",
                                         **series([x for x, _ in pts], [y for _, y in pts]), "marker": {"size": 5}}],
                  layout("MoE load imbalance per step: max ÷ mean tokens routed per expert (dotted: even)", "step",
                         "max ÷ mean", shapes=[even], **SMALL))


def memory_figure(rec) -> Figure | None:
    ms = dig(rec, "metrics", "memory", "model_state_bytes")
    if not isinstance(ms, dict):
        return None
    parts = [p for p in ("measured", "analytic") if isinstance(ms.get(p), dict)]
    if not parts:
        return None
    keys = []
    for p in parts:
        keys += [k for k in ms[p] if k not in keys and num(ms[p][k]) is not None]
    if not keys:
        return None
    top = max(num(ms[p].get(k)) or 0 for p in parts for k in keys)
    unit, scale = next(((u, s) for u, s in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)) if top >= s), ("B", 1))
    data = [{"type": "bar", "name": p, "x": [ptext(k) for k in keys],
             "y": [short(num(ms[p].get(k)) / scale) if num(ms[p].get(k)) is not None else None for k in keys],
             "marker": {"color": "#1971c2" if p == "measured" else "#adb5bd"}} for p in parts]
    return Figure("fig-run-memory", data, layout("Model-state memory per device: measured vs analytic", "",
                                                 unit, barmode="group", **SMALL))


def _flops_per_s(tflops) -> str:
    """Model or hardware FLOP/s per device from the record's TFLOP/s: 312 TFLOP/s, 45.2 GFLOP/s on a CPU."""
    v = num(tflops)
    return f_si(None if v is None else v * 1e12, "FLOP/s")


def _headline(row, rec) -> str:
    m = rec.get("metrics") or {}
    fl = m.get("flops") or {}
    efficiency = ("baseline" if row.get("scaling_baseline") == BASELINE else f_pct(row.get("scaling_efficiency"))) \
        if present(row.get("scaling_efficiency")) else row.get("scaling_efficiency_reason")
    ceiling = _flops_per_s(m.get("matmul_ceiling_tflops"))
    if num(m.get("matmul_ceiling_tflops")) is not None and present(m.get("matmul_ceiling_source")):
        ceiling += f" · {m['matmul_ceiling_source']}"
    rows = [("tokens / s", f_num(row.get("tokens_per_s"))),
            ("MFU (model FLOPs, no recompute)", f_pct(row.get("mfu"))),
            ("HFU (hardware FLOPs, recompute included)", f_pct(m.get("hfu"))),
            ("step time, ms (median, 95% CI)", f_ms(row.get("step_time_median_s"), row.get("step_time_ci95_lo_s"),
                                                   row.get("step_time_ci95_hi_s"))),
            ("model FLOP/s per device", _flops_per_s(m.get("tflops_per_device"))),
            ("hardware FLOP/s per device", _flops_per_s(m.get("hardware_tflops_per_device"))),
            ("parameters (total / active per token)",
             f"{f_count(dig(m, 'params', 'total'))} / {f_count(dig(m, 'params', 'active'))}"),
            ("model FLOPs / token", f_si(fl.get("model_per_token"), "FLOP")),
            ("hardware FLOPs / token", f_si(fl.get("hardware_per_token"), "FLOP")),
            ("counted FLOPs / token", f_si(fl.get("counted_per_token"), "FLOP")),
            ("scaling efficiency (the run's median over seeds and repeats)", efficiency),
            ("scaling baseline", row.get("scaling_baseline")),
            ("matmul ceiling", ceiling),
            ("model FLOP/s vs ceiling", f_pct(m.get("mfu_vs_ceiling")) if present(m.get("mfu_vs_ceiling"))
             else m.get("mfu_vs_ceiling_reason")),
            ("energy / token", f_si(row.get("j_per_token"), "J")),
            ("CO2e / million tokens", f_si(row.get("gco2e_per_mtok"), "g")),
            ("average power per device (GPU)", f_si(row.get("avg_w_per_device"), "W"))]
    if m.get("reasons"):  # what a user's own loop could not tell (benchsuite.measure)
        rows.append(("not known", "; ".join(m["reasons"])))
    return kv_table(rows)


def _architecture(model) -> str | None:
    """'llama3-8b: 2 layers, hidden 64, 4 heads (2 K/V) of 16, swiglu, rmsnorm, rope': the block that ran."""
    if not isinstance(model, dict):
        return None
    heads, kv = model.get("heads"), model.get("kv_heads") or model.get("heads")
    head_dim = model.get("head_dim") or (model["hidden"] // heads if model.get("hidden") and heads else None)
    return (f"{model.get('preset') or 'custom'}: {model.get('layers')} layers, hidden {model.get('hidden')}, "
            f"{heads} heads ({kv} K/V) of {head_dim}, {model.get('activation')}, {model.get('norm') or 'layernorm'}, "
            f"{model.get('position') or 'learned'} positions")


PARALLEL_WORDS = (("tensor", "tensor"), ("pipeline", "pipeline"), ("expert", "expert"), ("zero", "ZeRO stage"))


def _parallel(parallel) -> str | None:
    """'tensor 2 · expert 4 · ZeRO stage 1': the layout in words (degrees of 1 and ZeRO 0 left out), or
    'none (data parallel only)'."""
    if not isinstance(parallel, dict):
        return None
    parts = [f"{word} {num(parallel.get(k)):g}" for k, word in PARALLEL_WORDS
             if (num(parallel.get(k)) or 0) > (0 if k == "zero" else 1)]
    return " · ".join(parts) or "none (data parallel only)"


def _identity(row, rec) -> str:
    cfg = rec.get("config") or {}
    return kv_table([("suite", rec.get("suite")), ("workload", rec.get("workload")),
                     ("seed", row.get("seed")), ("repeat", row.get("repeat")),
                     ("description", cfg.get("description")), ("kind", row.get("kind_label")),
                     ("model", _architecture(cfg.get("model"))),
                     ("world size", cfg.get("world_size")), ("nodes", cfg.get("nodes")),
                     ("scaling", cfg.get("scaling")), ("parallelism", _parallel(cfg.get("parallel"))),
                     ("status", rec.get("status")), ("started", rec.get("started_at")),
                     ("duration", f_duration(rec.get("duration_s"))), ("run key", rec.get("run_key"))])


def _flags(row, rec) -> str:
    """The sanity guard's flags (record/sanity.py): figures no real run can produce, in a warning box.
    The row's: the record's plus those computed across records (superlinear scaling efficiency)."""
    flags = row.get("flags") if isinstance(row.get("flags"), list) else rec.get("flags")
    flags = [f for f in flags or [] if isinstance(f, dict)]
    if not flags:
        return ""
    rows = [[f.get("field"), f_sig(f.get("value")) if num(f.get("value")) is not None else f.get("value"),
             f.get("reason")] for f in flags[:50]]
    more = f'<p class="note">… and {len(flags) - 50} more (see the record).</p>' if len(flags) > 50 else ""
    return (f'<div class="flags" role="alert"><strong>⚠ Flagged: {len(flags)} figure(s) no real run can produce'
            f"</strong><p>The run finished, but treat these figures (and what is derived from them) as wrong until "
            f"explained.</p>{table(['field', 'value', 'reason'], rows)}{more}</div>")


def _error(rec) -> str:
    e = rec.get("error")
    if not isinstance(e, dict):
        return ""
    rank = f" on rank {e['rank']}" if present(e.get("rank")) else ""
    return (f'<div class="error"><strong>failed{esc(rank)}: {esc(e.get("type") or "error")}</strong>'
            f"<pre>{esc(e.get('message') or '')}</pre></div>")


def _moe_settings(cfg: dict) -> list[tuple[str, str]]:
    """What the run's MoE layers were: router, experts and k, capacity, routing and balancing."""
    moe = cfg.get("moe")
    if not isinstance(moe, dict):
        return []
    k = moe.get("top_k") if moe.get("router") == "token_choice" else {"switch": 1, "gshard": 2}.get(moe.get("router"))
    cf = num(moe.get("capacity_factor"))
    return [("router", f"{moe.get('router')}" + (f", top-{k}" if k else "")),
            ("experts (shared)", f"{moe.get('experts')} ({moe.get('shared_experts') or 0} shared), every "
                                 f"{moe.get('every')} block(s)"),
            ("capacity factor", "0: dropless" if cf == 0 else f_sig(cf)),
            ("routing", f"{moe.get('routing') or 'learned'}, balanced by {moe.get('balance') or 'aux_loss'}")]


def _dropped(frac) -> str:
    """The share of token assignments dropped, marked when the sanity guard flags it (record/sanity.py)."""
    v = num(frac)
    if v is None or v <= MAX_DROPPED_FRAC:
        return f_pct(v)
    return f"{f_pct(v)} ⚠ above {MAX_DROPPED_FRAC:.0%}: the run's speed is not the model's"


def _moe_figures(moe: dict) -> list[tuple[str, str]]:
    """metrics.moe in words and units, one row each."""
    return [("tokens dropped (over capacity)", _dropped(moe.get("dropped_frac"))),
            ("padding (empty capacity slots)", f_pct(moe.get("padding_frac"))),
            ("busiest expert ÷ mean (mean over layers)", f_sig(moe.get("load_max_over_mean"))),
            ("imbalance per step, mean / worst", f"{f_sig(moe.get('imbalance_mean'))} / "
                                                 f"{f_sig(moe.get('imbalance_max'))}"),
            ("tokens per expert, busiest / mean", f"{f_count(moe.get('tokens_per_expert_max'))} / "
                                                  f"{f_count(moe.get('tokens_per_expert_mean'))}"),
            ("auxiliary (balancing) loss", _loss(moe.get("aux_loss"))), ("router z-loss", _loss(moe.get("z_loss"))),
            ("all-to-all share of step time", f_pct(moe.get("all_to_all_share"))),
            ("expert implementation", moe.get("expert_impl")), ("how measured", moe.get("source"))]


def _moe(rec) -> str:
    """The MoE settings of the run's config, then the routing figures of metrics.moe."""
    moe = dig(rec, "metrics", "moe")
    settings = _moe_settings(rec.get("config") or {})
    if not isinstance(moe, dict) and not settings:
        return ""
    return kv_table(settings + (_moe_figures(moe) if isinstance(moe, dict) else []))


def _memory_table(rec) -> str:
    per_rank = dig(rec, "metrics", "memory", "per_rank")
    if not isinstance(per_rank, list) or not per_rank:
        return missing("Peak memory per rank")
    rows = [[i, f_bytes(dig(r, "peak_allocated_bytes")), f_bytes(dig(r, "peak_reserved_bytes")),
             f_bytes(dig(r, "peak_rss_bytes")), dig(r, "source")] for i, r in enumerate(per_rank)]
    return table(["rank", "peak allocated", "peak reserved", "peak host RSS", "source"], rows, drop_silent=True)


def _memory_notes(rec) -> str:
    ms = dig(rec, "metrics", "memory", "model_state_bytes")
    if not isinstance(ms, dict):
        return ""
    return kv_table([("ZeRO formula", ms.get("formula")), ("optimizer bytes per parameter (K)", f_sig(ms.get("K"))),
                     ("ranks sharing the state (N)", f_sig(ms.get("N"))), ("how measured", ms.get("method"))])


def _comm(rec) -> str:
    c = dig(rec, "metrics", "comm")
    if not isinstance(c, dict):
        return ""
    by_kind = c.get("bytes_per_step_by_kind") if isinstance(c.get("bytes_per_step_by_kind"), dict) else {}
    rows = [("bytes per step (per rank)", f_bytes(c.get("total_bytes_per_step"))),
            ("paper formula", c.get("paper_formula")), ("paper bytes per step", f_bytes(c.get("paper_bytes_per_step"))),
            ("measured ÷ paper", f_sig(c.get("ratio")))]
    rows += [(f"{str(k).replace('_', ' ')} per step", f_bytes(v)) for k, v in by_kind.items()]
    return "<h3>Communication</h3>" + kv_table(rows)


def _pipeline(rec) -> str:
    """metrics.pipeline: the measured bubble beside (P-1)/(V*M), and point-to-point bytes beside their formula."""
    p = dig(rec, "metrics", "pipeline")
    if not isinstance(p, dict):
        return ""
    rows = [("stages × virtual stages", f"{f_num(p.get('stages'))} × {f_num(p.get('virtual_stages'))}"),
            ("schedule", p.get("schedule")), ("microbatches", f_num(p.get("microbatches"))),
            ("bubble measured", f_pct(p.get("bubble_measured"))),
            ("bubble formula (P−1)/(V·M)", f_pct(p.get("bubble_formula"))),
            ("bubble per rank", ", ".join(f_pct(b) for b in p.get("bubble_per_rank") or [])),
            ("how measured", p.get("bubble_source")),
            ("point-to-point bytes per step", f_bytes(p.get("p2p_bytes_per_step"))),
            ("point-to-point formula", f_bytes(p.get("p2p_bytes_formula"))),
            ("activation memory per stage", f_bytes(p.get("activation_bytes_per_stage"))
             if num(p.get("activation_bytes_per_stage")) is not None else p.get("activation_reason"))]
    return "<h3>Pipeline</h3>" + kv_table(rows)


def _energy_part(joules, source) -> str | None:
    """'8.27 kJ · measured'; None (collapsed with the others) where the part was not measured."""
    return None if num(joules) is None else f"{f_si(joules, 'J')} · {source or 'source not recorded'}"


def _bound(b, unit: str = "J", low: str = "low_j", high: str = "high_j") -> str | None:
    """'8.10 kJ – 8.44 kJ (±2.1 %)', '⚠' and why when flagged (energy/bounds.py); None where there is none."""
    if not isinstance(b, dict) or num(b.get(low)) is None:
        return None
    top = "unbounded" if num(b.get(high)) is None else f_si(b[high], unit)
    share = f" (±{b['share']:.1%})" if num(b.get("share")) is not None else ""
    return f"{f_si(b[low], unit)} – {top}{share}" + (f" ⚠ {b['reason']}" if b.get("exceeds") and b.get("reason") else "")


def _bound_parts(b) -> str | None:
    """The parts of a bound, each with its half-width: 'sensor accuracy 42.4 J, counter edges 2 J, …'."""
    if not isinstance(b, dict) or not b.get("parts"):
        return None
    return ", ".join(f"{p.get('part')} {f_si(p['j'], 'J') if num(p.get('j')) is not None else '(not in the bound)'}"
                     for p in b["parts"] if isinstance(p, dict))


def _energy(rec) -> str:
    e = rec.get("energy")
    if not isinstance(e, dict):
        return missing("Energy", "not measured for this run")
    srcs = e.get("sources") or {}
    bounds = e.get("bounds") or {}
    html = kv_table([("GPU energy", _energy_part(e.get("gpu_j"), srcs.get("gpu", e.get("source")))),
                     ("CPU energy", _energy_part(e.get("cpu_j"), srcs.get("cpu", e.get("source")))),
                     ("DRAM energy", _energy_part(e.get("dram_j"), srcs.get("dram", e.get("source")))),
                     ("total energy", _energy_part(e.get("total_j"), e.get("source"))),
                     ("total, as the meters bound it", _bound(bounds.get("total"))),
                     ("parts of that bound", _bound_parts(bounds.get("total"))),
                     ("total includes", ", ".join(map(str, e.get("total_includes") or []))),
                     ("measured window", f_duration(e.get("window_s"))), ("idle power", f_si(e.get("idle_w"), "W")),
                     ("energy above idle", f_si(e.get("above_idle_j"), "J"))], empty="not measured")
    devs = [d for d in e.get("per_device") or [] if isinstance(d, dict)]
    if devs:
        html += table(["device", "name", "host", "ranks", "energy", "source", "bound", "average power"],
                      [[d.get("uuid"), d.get("name"), d.get("host"), ", ".join(map(str, d.get("ranks") or [])),
                        f_si(d.get("energy_j"), "J"), d.get("source"), _bound(d.get("bound")),
                        f_si(d.get("avg_w"), "W")] for d in devs[:64]],
                      drop_silent=True)
    nodes = [n for n in e.get("per_node") or [] if isinstance(n, dict)]
    if nodes:
        html += table(["node", "ranks", "CPU energy", "CPU source", "DRAM energy", "DRAM source"],
                      [[n.get("host"), ", ".join(map(str, n.get("ranks") or [])),
                        f_si(dig(n, "cpu", "energy_j"), "J"), dig(n, "cpu", "source"),
                        f_si(dig(n, "dram", "energy_j"), "J"), dig(n, "dram", "source")] for n in nodes[:64]],
                      drop_silent=True)
    reasons = [r for r in e.get("reasons") or [] if r]
    for n in nodes[:64]:
        reasons += [f"{part} on {n.get('host')}: {dig(n, part, 'reason')}" for part in ("cpu", "dram")
                    if present(dig(n, part, "reason"))]
    if reasons:
        html += "<ul class=reasons>" + "".join(f"<li>{esc(r)}</li>" for r in reasons[:20]) + "</ul>"
    return html


def _carbon(rec) -> str:
    c = rec.get("carbon")
    if not isinstance(c, dict):
        return missing("Carbon", "not measured for this run")
    kwh = num(c.get("kwh"))
    intensity = num(c.get("intensity_g_per_kwh"))
    market, embodied, water = (c.get(k) if isinstance(c.get(k), dict) else {} for k in ("market", "embodied", "water"))
    html = kv_table([("energy (the run's)", f_si(None if kwh is None else kwh * 1e3, "Wh")),
                     ("PUE", f_sig(c.get("pue"))),
                     ("grid intensity", None if intensity is None else f"{f_sig(intensity)} g CO2e/kWh"),
                     ("intensity source", c.get("intensity_source")), ("intensity note", c.get("intensity_note")),
                     ("CO2e (the run's, location-based)", f_si(c.get("co2e_g"), "g")),
                     ("CO2e, as the meters bound it", _bound(c.get("co2e_g_bound"), "g", "low", "high")),
                     ("market-based CO2e (Scope 2, not added)", None if num(market.get("co2e_g")) is None else
                      f"{f_si(market['co2e_g'], 'g')} at {f_sig(market.get('intensity_g_per_kwh'))} g/kWh"),
                     ("embodied CO2e (Scope 3, not added)", None if num(embodied.get("co2e_g")) is None else
                      f"{f_si(embodied['co2e_g'], 'g')} · {embodied.get('source')}"),
                     ("water on site", f_si(water.get("onsite_l"), "L")),
                     ("water off site", f_si(water.get("offsite_l"), "L"))])
    reasons = [f"{name}: {part['reason']}" for name, part in (("market-based", market), ("embodied", embodied),
                                                              ("water", water)) if part.get("reason")]
    if reasons:
        html += "<ul class=reasons>" + "".join(f"<li>{esc(r)}</li>" for r in reasons) + "</ul>"
    return html


def _loss(v) -> str | None:
    return None if num(v) is None else f"{num(v):.4g}"


def _quality(rec) -> str:
    """metrics.quality: the time, tokens, FLOPs and energy to train.target_loss, and the validation losses."""
    q = dig(rec, "metrics", "quality")
    if not isinstance(q, dict):
        return ""
    reached = q.get("reached")
    return "<h3>Time to target loss</h3>" + kv_table([
        ("target loss", _loss(q.get("target_loss"))),
        ("reached", ("yes" if reached else "no") if isinstance(reached, bool) else None),
        ("at step", f_num(q.get("step"))), ("tokens to target", f_count(q.get("tokens"))),
        ("training time to target", f_duration(q.get("seconds"))),
        ("model FLOPs to target", f_si(q.get("model_flops"), "FLOP")),
        ("energy to target", f_si(q.get("energy_j"), "J")), ("CO2e to target", f_si(q.get("co2e_g"), "g")),
        ("initial validation loss", _loss(q.get("initial_val_loss"))),
        ("final validation loss", _loss(q.get("final_val_loss"))),
        ("best validation loss", _loss(q.get("best_val_loss"))), ("best at step", f_num(q.get("best_step"))),
        ("evaluation time", f_duration(q.get("eval_seconds"))),
        ("evaluation energy", f_si(q.get("eval_energy_j"), "J")),
        *([("why not reached", q.get("reason"))] if reached is False else []),
        ("how counted", q.get("counting"))], empty="not measured")


ENV_LABELS = {"ram_total_gb": "RAM (GB)", "cpu_model": "CPU model", "cpu_count": "CPU cores", "gpu_count": "GPUs",
              "os": "OS", "git_commit": "git commit", "nccl": "NCCL", "cuda": "CUDA", "world_size": "world size"}


def _env(rec) -> str:
    env = rec.get("env") or {}
    if not isinstance(env, dict) or not env:
        return missing("Environment", "not recorded")
    shown_apart = ("devices", "threads_per_rank", "threads_source")
    # the same for every run of a sweep (launch.thread_plan), so scaling compares like with like
    threads = env.get("threads_per_rank")
    rows = [("CPU threads per rank", f"{threads} · {env.get('threads_source') or 'source not recorded'}"
             if present(threads) else None)]
    for k, v in env.items():
        if k in shown_apart or isinstance(v, dict) or (isinstance(v, list) and any(isinstance(x, (dict, list))
                                                                                   for x in v)):
            continue
        value = ", ".join(map(str, v)) if isinstance(v, list) else f_sig(v) if isinstance(v, float) else v
        rows.append((ENV_LABELS.get(k, k.replace("_", " ")), value))
    html = kv_table(rows)  # what was not recorded: one line
    devs = [d for d in env.get("devices") or [] if isinstance(d, dict)]
    if devs:
        html += table(["rank", "host", "type", "name", "uuid"],
                      [[d.get("rank"), d.get("host"), d.get("type"), d.get("name"), d.get("uuid")] for d in devs[:64]],
                      drop_silent=True)
        if len(devs) > 64:
            html += f'<p class="note">… and {len(devs) - 64} more devices (see the record).</p>'
    return html


def _predicted(b) -> str:
    """Measured beside predicted (results/predicted.py), with the component most likely to blame when the
    run is far slower; '' when the site was built without a system file."""
    if b is None:
        return ""
    if b.predicted_step_s is None:
        return "<h3>Measured beside predicted</h3>" + kv_table([("not compared", b.reason)])
    rows = [("measured step", f_duration(b.measured_step_s)), ("predicted step", f_duration(b.predicted_step_s)),
            ("measured ÷ predicted", None if b.ratio is None else f"{b.ratio:.2f}×" + (" ⚠" if b.flagged else "")),
            ("most likely responsible", b.suspect)]
    rows += [(f"predicted {name.replace('_', ' ').replace('.', ': ')}", f_duration(s))
             for name, s in b.components.items() if s > 0]
    return "<h3>Measured beside predicted</h3>" + kv_table(rows)


def render(row: dict, rec: dict, predicted=None) -> Section:
    figs = []
    moe_why = "not applicable: dense model" if row.get("kind") != "moe" else "not measured"
    blocks = {}
    for key, build, title, why in (
            ("steps", step_figure, "Step time", "no per-step times recorded"),
            ("loss", loss_figure, "Loss curve", "no loss recorded"),
            ("ranks", rank_figure, "Per-rank step time", "not measured"),
            ("experts", expert_figure, "MoE expert load", moe_why),
            ("imbalance", imbalance_figure, "MoE load imbalance per step", moe_why),
            ("memory", memory_figure, "Model-state memory: measured vs analytic", "not measured")):
        fig = build(rec)
        if fig:
            figs.append(fig)
            blocks[key] = fig.div()
        else:
            blocks[key] = missing(title, why if rec.get("status") == "ok" else "run failed")
    if "fig-run-loss" in {f.id for f in figs} and not any(num(s.get("val_loss")) is not None for s in _steps(rec)):
        note = '<p class="note">Validation loss: not measured (no eval steps).</p>'
        blocks["loss"] = f'<div>{blocks["loss"]}{note}</div>'
    html = (_error(rec) + _flags(row, rec) +
            f'<div class="row2"><div><h3>Run</h3>{_identity(row, rec)}</div>'
            f'<div><h3>Headline figures</h3>{_headline(row, rec)}{_predicted(predicted)}</div></div>'
            f'<h2>Time and loss</h2><div class="row2">{blocks["steps"]}{blocks["loss"]}</div>'
            f'<h2>Ranks and experts</h2><div class="row2">{blocks["ranks"]}<div>{blocks["experts"]}{blocks["imbalance"]}{_moe(rec)}'
            f'</div></div>'
            f'<h2>Memory and communication</h2><div class="row2"><div>{blocks["memory"]}{_memory_notes(rec)}</div>'
            f'<div>{_memory_table(rec)}{_comm(rec)}{_pipeline(rec)}</div></div>'
            f'<h2>Energy and carbon</h2><div class="row2"><div>{_energy(rec)}</div><div>{_carbon(rec)}'
            f'{_quality(rec)}</div></div>'
            f'<h2>Environment</h2>{_env(rec)}'
            f'<details><summary>Resolved config</summary><pre>'
            f'{esc(json.dumps(rec.get("config"), indent=1, sort_keys=True, default=str))}</pre></details>')
    return Section("run", str(row.get("run_label")), html, figs)
