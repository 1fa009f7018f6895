"""One page per run: the sanity guard's flags (a warning box), headline figures, step-time series,
loss curve (with validation loss and the target loss), per-rank step time (stragglers), MoE expert
load per layer and expert (tokens computed, else routed) with its imbalance per step and the expert
implementation, model-state memory measured vs analytic, energy per device, carbon, environment and
the resolved config. Every section a record lacks says so ("not measured") instead of drawing nothing
or zero."""

from __future__ import annotations

import json

import msgspec

from benchsuite.record.columns import described
from benchsuite.record.kinds import FlagKind, flags_by_kind
from benchsuite.record.sanity import MAX_DROPPED_FRAC
from benchsuite.record.types import (Embodied, EnergyBound, Env, Flops, MarketBased, MoEConfig, MoEMetrics, ModelConfig,
                                     ParallelConfig, Params, PartEnergy, Record, Water)
from benchsuite.results.scaling import BASELINE
from benchsuite.dashboard.data import load_table, metrics_of
from benchsuite.dashboard.render import (Figure, PageSection, esc, f_bytes, f_count, f_duration, f_ms, f_num, f_pct, f_si, f_sig,
                              kv_table, layout, missing, num, present, ptext, series, short, table)

SMALL = {"height": 300}
# The columns of the site DataFrame a run page reads (data.SiteData.df): only these become each page's row
# (a row of all ~200 columns costs more than the page at 10,000 records).
ROW_COLUMNS = ["rec", "page", "identity", "suite", "status", "kind", "kind_label", "run_label", "seed", "repeat",
               "started_at", "tokens_per_s", "mfu", "step_time_median_s", "step_time_ci95_lo_s",
               "step_time_ci95_hi_s", "scaling_efficiency", "scaling_baseline", "scaling_efficiency_reason",
               "j_per_token", "gco2e_per_mtok", "avg_w_per_device", "flags"]


def step_figure(rec: Record) -> Figure | None:
    pts = [(s.step, s.time_s) for s in rec.steps if s.time_s is not None]
    if not pts:
        return None
    ys = [short(y * 1e3, 4) for _, y in pts]
    step_time = metrics_of(rec).step_time_s
    med = step_time.median if step_time is not None else None
    shapes = [] if med is None else [{"type": "line", "xref": "paper", "x0": 0, "x1": 1, "y0": short(med * 1e3),
                                      "y1": short(med * 1e3), "line": {"color": "#888", "dash": "dot", "width": 1}}]
    return Figure("fig-run-steps", [{"type": "scatter", "mode": "lines+markers", "name": "step time",
                                     **series([x for x, _ in pts], ys), "marker": {"size": 5}}],
                  layout("Step time per measured step (dotted: median)", "step", "ms", shapes=shapes, **SMALL))


def loss_figure(rec: Record) -> Figure | None:
    data = []
    for pts, name, style in (([(s.step, s.loss) for s in rec.steps], "training loss", {"mode": "lines"}),
                             ([(s.step, s.val_loss) for s in rec.steps], "validation loss",
                              {"mode": "lines+markers", "marker": {"size": 8}})):
        pts = [(x, short(y)) for x, y in pts if y is not None]
        if pts:
            data.append({"type": "scatter", "name": name, **series([x for x, _ in pts], [y for _, y in pts]),
                         **style})
    if not data:
        return None
    quality = metrics_of(rec).quality
    target = quality.target_loss if quality is not None else None
    if target is None:
        return Figure("fig-run-loss", data, layout("Loss", "step", "loss", **SMALL))
    line = {"type": "line", "xref": "paper", "x0": 0, "x1": 1, "y0": short(target), "y1": short(target),
            "line": {"color": "#868e96", "dash": "dot", "width": 1}}
    return Figure("fig-run-loss", data, layout(f"Loss (dotted: target validation loss {f_sig(target)})", "step",
                                               "loss", shapes=[line], **SMALL))


def rank_figure(rec: Record) -> Figure | None:
    per_rank = metrics_of(rec).per_rank
    meds = per_rank.step_time_median_s if per_rank is not None else None
    if not meds:
        return None
    ys = [short(v * 1e3, 4) for v in meds]
    worst = max(range(len(ys)), key=lambda i: ys[i])
    ratio = per_rank.straggler_ratio
    # the worker's straggler ratio: the slowest rank's median step time / the median over ranks
    title = "Median step time per rank" + (f" (slowest / median = {ratio:.2f})" if ratio is not None else "")
    return Figure("fig-run-ranks", [{"type": "bar", "name": "median step time", "x": list(range(len(ys))), "y": ys,
                                     "marker": {"color": ["#d62728" if i == worst and len(ys) > 1 else "#4c6ef5"
                                                          for i in range(len(ys))]}}],
                  layout(title, "rank", "ms", xaxis={"type": "category"}, **SMALL))


def load_colors(top: float) -> list:
    """Under-used blue, balanced white at exactly 1 on a 0–top axis, overloaded red."""
    return [[0, "#1971c2"], [1 / top, "#f8f9fa"], [1, "#e03131"]]


def expert_figure(rec: Record) -> Figure | None:
    """A heatmap, one row per MoE layer: each expert's tokens ÷ its layer's mean (1 = balanced); the
    tokens the experts computed where recorded, else those routed to them (data.load_table)."""
    moe = metrics_of(rec).moe
    table = load_table(moe) if moe is not None else None
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


def imbalance_figure(rec: Record) -> Figure | None:
    """metrics.moe.imbalance_by_step as a line: each measured step's max ÷ mean tokens routed per expert
    (mean over MoE layers; 1 = even), so a router that drifts out of balance shows."""
    moe = metrics_of(rec).moe
    pts = [(i, short(v, 4)) for i, v in enumerate(moe.imbalance_by_step or [])] if moe is not None else []
    if not pts:
        return None
    even = {"type": "line", "xref": "paper", "x0": 0, "x1": 1, "y0": 1, "y1": 1,
            "line": {"color": "#888", "dash": "dot", "width": 1}}
    return Figure("fig-run-imbalance", [{"type": "scatter", "mode": "lines+markers", "name": "max ÷ mean",
                                         **series([x for x, _ in pts], [y for _, y in pts]), "marker": {"size": 5}}],
                  layout("MoE load imbalance per step: max ÷ mean tokens routed per expert (dotted: even)", "step",
                         "max ÷ mean", shapes=[even], **SMALL))


def memory_figure(rec: Record) -> Figure | None:
    memory = metrics_of(rec).memory
    ms = memory.model_state_bytes if memory is not None else None
    if ms is None:
        return None
    # each part's figures by name (params, grads, optimizer, total), in the record's order
    parts = {name: msgspec.structs.asdict(p) for name, p in (("measured", ms.measured), ("analytic", ms.analytic))
             if p is not None}
    keys = []
    for values in parts.values():
        keys += [k for k, v in values.items() if k not in keys and v is not None]
    if not keys:
        return None
    top = max(parts[p][k] or 0 for p in parts for k in keys)
    unit, scale = next(((u, s) for u, s in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)) if top >= s), ("B", 1))
    data = [{"type": "bar", "name": p, "x": [ptext(k) for k in keys],
             "y": [short(values[k] / scale) if values[k] is not None else None for k in keys],
             "marker": {"color": "#1971c2" if p == "measured" else "#adb5bd"}} for p, values in parts.items()]
    return Figure("fig-run-memory", data, layout("Model-state memory per device: measured vs analytic", "",
                                                 unit, barmode="group", **SMALL))


def _flops_per_s(tflops) -> str:
    """Model or hardware FLOP/s per device from the record's TFLOP/s: 312 TFLOP/s, 45.2 GFLOP/s on a CPU."""
    v = num(tflops)
    return f_si(None if v is None else v * 1e12, "FLOP/s")


def _headline(row, rec: Record) -> str:
    m = metrics_of(rec)
    fl, params = m.flops or Flops(), m.params or Params()
    efficiency = ("baseline" if row.get("scaling_baseline") == BASELINE else f_pct(row.get("scaling_efficiency"))) \
        if present(row.get("scaling_efficiency")) else row.get("scaling_efficiency_reason")
    ceiling = _flops_per_s(m.matmul_ceiling_tflops)
    if m.matmul_ceiling_tflops is not None and present(m.matmul_ceiling_source):
        ceiling += f" · {m.matmul_ceiling_source}"
    rows = [("tokens / s", f_num(row.get("tokens_per_s"))),
            ("MFU (model FLOPs, no recompute)", f_pct(row.get("mfu"))),
            ("HFU (hardware FLOPs, recompute included)", f_pct(m.hfu)),
            ("step time, ms (median, 95% CI)", f_ms(row.get("step_time_median_s"), row.get("step_time_ci95_lo_s"),
                                                   row.get("step_time_ci95_hi_s"))),
            ("model FLOP/s per device", _flops_per_s(m.tflops_per_device)),
            ("hardware FLOP/s per device", _flops_per_s(m.hardware_tflops_per_device)),
            ("parameters (total / active per token)", f"{f_count(params.total)} / {f_count(params.active)}"),
            ("model FLOPs / token", f_si(fl.model_per_token, "FLOP")),
            ("hardware FLOPs / token", f_si(fl.hardware_per_token, "FLOP")),
            ("counted FLOPs / token", f_si(fl.counted_per_token, "FLOP")),
            ("scaling efficiency (the run's median over seeds and repeats)", efficiency),
            ("scaling baseline", row.get("scaling_baseline")),
            ("matmul ceiling", ceiling),
            ("model FLOP/s vs ceiling", f_pct(m.mfu_vs_ceiling) if present(m.mfu_vs_ceiling)
             else m.mfu_vs_ceiling_reason),
            ("energy / token", f_si(row.get("j_per_token"), "J")),
            ("CO2e / million tokens", f_si(row.get("gco2e_per_mtok"), "g")),
            ("average power per device (GPU)", f_si(row.get("avg_w_per_device"), "W"))]
    if m.reasons:  # what a user's own loop could not tell (benchsuite.measure)
        rows.append(("not known", "; ".join(m.reasons)))
    return kv_table(rows)


def _architecture(model: ModelConfig | None) -> str | None:
    """'llama3-8b: 2 layers, hidden 64, 4 heads (2 K/V) of 16, swiglu, rmsnorm, rope': the block that ran."""
    if model is None:
        return None
    heads, kv = model.heads, model.kv_heads or model.heads
    head_dim = model.head_dim or (model.hidden // heads if model.hidden and heads else None)
    return (f"{model.preset or 'custom'}: {model.layers} layers, hidden {model.hidden}, "
            f"{heads} heads ({kv} K/V) of {head_dim}, {model.activation}, {model.norm or 'layernorm'}, "
            f"{model.position or 'learned'} positions")


def _parallel(parallel: ParallelConfig | None) -> str | None:
    """'tensor 2 · expert 4 · ZeRO stage 1': the layout in words (degrees of 1 and ZeRO 0 left out), or
    'none (data parallel only)'."""
    if parallel is None:
        return None
    degrees = (("tensor", parallel.tensor, 1), ("pipeline", parallel.pipeline, 1), ("context", parallel.context, 1),
               ("expert", parallel.expert, 1), ("expert-tensor", parallel.expert_tensor, 1),
               ("ZeRO stage", parallel.zero, 0))  # (word, degree, the degree that says nothing)
    parts = [f"{word} {num(v):g}" for word, v, plain in degrees if (num(v) or 0) > plain]
    return " · ".join(parts) or "none (data parallel only)"


def _identity(row, rec: Record) -> str:
    cfg = rec.config
    return kv_table([("suite", rec.suite), ("workload", rec.workload),
                     ("seed", row.get("seed")), ("repeat", row.get("repeat")),
                     ("description", cfg.description), ("kind", row.get("kind_label")),
                     ("model", _architecture(cfg.model)),
                     ("world size", cfg.world_size), ("nodes", cfg.nodes),
                     ("scaling", cfg.scaling), ("parallelism", _parallel(cfg.parallel)),
                     ("status", rec.status), ("started", row.get("started_at")),  # as the record's JSON has it
                     ("duration", f_duration(rec.duration_s)), ("run key", rec.run_key)])


def _flags(row) -> str:
    """The row's flags (the record's, the sanity guard's, plus those computed across records: superlinear
    scaling efficiency, noisy repeats), a box per kind, each headed and advised as its kind says
    (record/kinds.FLAG_KINDS), in report and dashboard alike."""
    return "".join(_flag_box(kind, flags) for kind, flags in flags_by_kind(row.get("flags")).items())


def _flag_box(kind: FlagKind, flags: list[dict]) -> str:
    rows = [[f.get("field"), f"{kind.value_label} {f_pct(f.get('value'))}" if kind.value_label else
             f_sig(f.get("value")) if num(f.get("value")) is not None else f.get("value"), f.get("reason")]
            for f in flags[:50]]
    more = f'<p class="note">… and {len(flags) - 50} more (see the record).</p>' if len(flags) > 50 else ""
    return (f'<div class="flags flags-{kind.name}" role="alert"><strong>{kind.mark} Flagged: {len(flags)} '
            f"{esc(kind.heading)}</strong><p>{esc(kind.advice)}</p>"
            f"{table(['field', 'value', 'reason'], rows)}{more}</div>")


def _error(rec: Record) -> str:
    e = rec.error
    if e is None:
        return ""
    rank = f" on rank {e.rank}" if present(e.rank) else ""
    return (f'<div class="error"><strong>failed{esc(rank)}: {esc(e.type or "error")}</strong>'
            f"<pre>{esc(e.message or '')}</pre></div>")


def _moe_settings(moe: MoEConfig | None) -> list[tuple[str, str]]:
    """What the run's MoE layers were: router, experts and k, capacity, routing and balancing."""
    if moe is None:
        return []
    k = moe.top_k if moe.router == "token_choice" else {"switch": 1, "gshard": 2}.get(moe.router)
    cf = num(moe.capacity_factor)
    return [("router", f"{moe.router}" + (f", top-{k}" if k else "")),
            ("experts (shared)", f"{moe.experts} ({moe.shared_experts or 0} shared), every {moe.every} block(s)"),
            ("capacity factor", "0: dropless" if cf == 0 else f_sig(cf)),
            ("routing", f"{moe.routing or 'learned'}, balanced by {moe.balance or 'aux_loss'}")]


def _dropped(frac) -> str:
    """The share of token assignments dropped, marked when the sanity guard flags it (record/sanity.py)."""
    v = num(frac)
    if v is None or v <= MAX_DROPPED_FRAC:
        return f_pct(v)
    return f"{f_pct(v)} ⚠ above {MAX_DROPPED_FRAC:.0%}: the run's speed is not the model's"


def _moe_figures(moe: MoEMetrics) -> list[tuple[str, str]]:
    """metrics.moe in words and units, one row each."""
    return [("tokens dropped (over capacity)", _dropped(moe.dropped_frac)),
            ("padding (empty capacity slots)", f_pct(moe.padding_frac)),
            (described("metrics.moe.load_max_over_mean"), f_sig(moe.load_max_over_mean)),
            (described("metrics.moe.imbalance_mean"), f_sig(moe.imbalance_mean)),
            (described("metrics.moe.imbalance_max"), f_sig(moe.imbalance_max)),
            (described("metrics.moe.tokens_per_expert_max"), f_count(moe.tokens_per_expert_max)),
            (described("metrics.moe.tokens_per_expert_mean"), f_count(moe.tokens_per_expert_mean)),
            ("auxiliary (balancing) loss", _loss(moe.aux_loss)), ("router z-loss", _loss(moe.z_loss)),
            ("all-to-all share of step time", f_pct(moe.all_to_all_share)),
            ("expert implementation", moe.expert_impl), ("how measured", moe.source)]


def _moe(rec: Record) -> str:
    """The MoE settings of the run's config, then the routing figures of metrics.moe."""
    moe = metrics_of(rec).moe
    settings = _moe_settings(rec.config.moe)
    if moe is None and not settings:
        return ""
    return kv_table(settings + (_moe_figures(moe) if moe is not None else []))


def _memory_table(rec: Record) -> str:
    memory = metrics_of(rec).memory
    per_rank = memory.per_rank if memory is not None else None
    if not per_rank:
        return missing("Peak memory per rank")
    rows = [[i, f_bytes(r.peak_allocated_bytes), f_bytes(r.peak_reserved_bytes), f_bytes(r.peak_rss_bytes), r.source]
            for i, r in enumerate(per_rank)]
    return table(["rank", "peak allocated", "peak reserved", "peak host RSS", "source"], rows, drop_silent=True)


def _memory_notes(rec: Record) -> str:
    memory = metrics_of(rec).memory
    ms = memory.model_state_bytes if memory is not None else None
    if ms is None:
        return ""
    return kv_table([("ZeRO formula", ms.formula), ("optimizer bytes per parameter (K)", f_sig(ms.K)),
                     ("ranks sharing the state (N)", f_sig(ms.N)), ("how measured", ms.method)])


def _comm(rec: Record) -> str:
    c = metrics_of(rec).comm
    if c is None:
        return ""
    rows = [("bytes per step (per rank)", f_bytes(c.total_bytes_per_step)),
            ("paper formula", c.paper_formula), ("paper bytes per step", f_bytes(c.paper_bytes_per_step)),
            ("measured ÷ paper", f_sig(c.ratio))]
    rows += [(f"{k.replace('_', ' ')} per step", f_bytes(v)) for k, v in (c.bytes_per_step_by_kind or {}).items()]
    return "<h3>Communication</h3>" + kv_table(rows)


def _pipeline(rec: Record) -> str:
    """metrics.pipeline: the measured bubble beside (P-1)/(V*M), and point-to-point bytes beside their formula."""
    p = metrics_of(rec).pipeline
    if p is None:
        return ""
    rows = [("stages × virtual stages", f"{f_num(p.stages)} × {f_num(p.virtual_stages)}"),
            ("schedule", p.schedule), ("microbatches", f_num(p.microbatches)),
            ("bubble measured", f_pct(p.bubble_measured)),
            ("bubble formula (P−1)/(V·M)", f_pct(p.bubble_formula)),
            ("bubble per rank", ", ".join(f_pct(b) for b in p.bubble_per_rank or [])),
            ("how measured", p.bubble_source),
            ("point-to-point bytes per step", f_bytes(p.p2p_bytes_per_step)),
            ("point-to-point formula", f_bytes(p.p2p_bytes_formula)),
            ("activation memory per stage", f_bytes(p.activation_bytes_per_stage)
             if p.activation_bytes_per_stage is not None else p.activation_reason)]
    return "<h3>Pipeline</h3>" + kv_table(rows)


def _energy_part(joules, source) -> str | None:
    """'8.27 kJ · measured'; None (collapsed with the others) where the part was not measured."""
    return None if num(joules) is None else f"{f_si(joules, 'J')} · {source or 'source not recorded'}"


def _bound(low: float | None, high: float | None, unit: str, share: float | None = None,
           warning: str | None = None) -> str | None:
    """'8.10 kJ – 8.44 kJ (±2.1 %)', '⚠' and why when flagged (energy/bounds.py); None where there is none."""
    if low is None:
        return None
    top = "unbounded" if high is None else f_si(high, unit)
    return (f"{f_si(low, unit)} – {top}" + (f" (±{share:.1%})" if share is not None else "")
            + (f" ⚠ {warning}" if warning else ""))


def _energy_bound(b: EnergyBound | None) -> str | None:
    """An energy's bound, with why where it is flagged (it exceeds what the meters can tell)."""
    return None if b is None else _bound(b.low_j, b.high_j, "J", b.share, b.reason if b.exceeds else None)


def _bound_parts(b: EnergyBound | None) -> str | None:
    """The parts of a bound, each with its half-width: 'sensor accuracy 42.4 J, counter edges 2 J, …'."""
    if b is None or not b.parts:
        return None
    return ", ".join(f"{p.part} {f_si(p.j, 'J') if p.j is not None else '(not in the bound)'}" for p in b.parts)


def _energy(rec: Record) -> str:
    e = rec.energy
    if e is None:
        return missing("Energy", "not measured for this run")
    srcs = e.sources  # a part's source; the whole figure's where the record has none by part
    gpu, cpu, dram = (srcs.gpu, srcs.cpu, srcs.dram) if srcs is not None else (e.source, e.source, e.source)
    total = e.bounds.total if e.bounds is not None else None
    html = kv_table([("GPU energy", _energy_part(e.gpu_j, gpu)), ("CPU energy", _energy_part(e.cpu_j, cpu)),
                     ("DRAM energy", _energy_part(e.dram_j, dram)),
                     ("total energy", _energy_part(e.total_j, e.source)),
                     ("total, as the meters bound it", _energy_bound(total)),
                     ("parts of that bound", _bound_parts(total)),
                     ("total includes", ", ".join(e.total_includes or [])),
                     ("measured window", f_duration(e.window_s)), ("idle power", f_si(e.idle_w, "W")),
                     ("energy above idle", f_si(e.above_idle_j, "J"))], empty="not measured")
    devs = e.per_device or []
    if devs:
        html += table(["device", "name", "host", "ranks", "energy", "source", "bound", "average power"],
                      [[d.uuid, d.name, d.host, ", ".join(map(str, d.ranks or [])), f_si(d.energy_j, "J"), d.source,
                        _energy_bound(d.bound), f_si(d.avg_w, "W")] for d in devs[:64]],
                      drop_silent=True)
    nodes = (e.per_node or [])[:64]
    if nodes:
        parts = [(n, n.cpu or PartEnergy(), n.dram or PartEnergy()) for n in nodes]
        html += table(["node", "ranks", "CPU energy", "CPU source", "DRAM energy", "DRAM source"],
                      [[n.host, ", ".join(map(str, n.ranks or [])), f_si(cpu.energy_j, "J"), cpu.source,
                        f_si(dram.energy_j, "J"), dram.source] for n, cpu, dram in parts],
                      drop_silent=True)
    reasons = [r for r in e.reasons or [] if r]
    for n in nodes:
        reasons += [f"{part} on {n.host}: {p.reason}" for part, p in (("cpu", n.cpu), ("dram", n.dram))
                    if p is not None and present(p.reason)]
    if reasons:
        html += "<ul class=reasons>" + "".join(f"<li>{esc(r)}</li>" for r in reasons[:20]) + "</ul>"
    return html


def _carbon(rec: Record) -> str:
    c = rec.carbon
    if c is None:
        return missing("Carbon", "not measured for this run")
    market, embodied, water = c.market or MarketBased(), c.embodied or Embodied(), c.water or Water()
    bound = c.co2e_g_bound
    html = kv_table([("energy (the run's)", f_si(None if c.kwh is None else c.kwh * 1e3, "Wh")),
                     ("PUE", f_sig(c.pue)),
                     ("grid intensity", None if c.intensity_g_per_kwh is None
                      else f"{f_sig(c.intensity_g_per_kwh)} g CO2e/kWh"),
                     ("intensity source", c.intensity_source), ("intensity note", c.intensity_note),
                     ("CO2e (the run's, location-based)", f_si(c.co2e_g, "g")),
                     ("CO2e, as the meters bound it", None if bound is None else _bound(bound.low, bound.high, "g")),
                     ("market-based CO2e (Scope 2, not added)", None if market.co2e_g is None else
                      f"{f_si(market.co2e_g, 'g')} at {f_sig(market.intensity_g_per_kwh)} g/kWh"),
                     ("embodied CO2e (Scope 3, not added)", None if embodied.co2e_g is None else
                      f"{f_si(embodied.co2e_g, 'g')} · {embodied.source}"),
                     ("water on site", f_si(water.onsite_l, "L")),
                     ("water off site", f_si(water.offsite_l, "L"))])
    reasons = [f"{name}: {part.reason}" for name, part in (("market-based", market), ("embodied", embodied),
                                                           ("water", water)) if part.reason]
    if reasons:
        html += "<ul class=reasons>" + "".join(f"<li>{esc(r)}</li>" for r in reasons) + "</ul>"
    return html


def _loss(v) -> str | None:
    return None if num(v) is None else f"{num(v):.4g}"


def _quality(rec: Record) -> str:
    """metrics.quality: the time, tokens, FLOPs and energy to train.target_loss, and the validation losses."""
    q = metrics_of(rec).quality
    if q is None:
        return ""
    return "<h3>Time to target loss</h3>" + kv_table([
        ("target loss", _loss(q.target_loss)),
        ("reached", None if q.reached is None else "yes" if q.reached else "no"),
        ("at step", f_num(q.step)), ("tokens to target", f_count(q.tokens)),
        ("training time to target", f_duration(q.seconds)),
        ("model FLOPs to target", f_si(q.model_flops, "FLOP")),
        ("energy to target", f_si(q.energy_j, "J")), ("CO2e to target", f_si(q.co2e_g, "g")),
        ("initial validation loss", _loss(q.initial_val_loss)),
        ("final validation loss", _loss(q.final_val_loss)),
        ("best validation loss", _loss(q.best_val_loss)), ("best at step", f_num(q.best_step)),
        ("evaluation time", f_duration(q.eval_seconds)),
        ("evaluation energy", f_si(q.eval_energy_j, "J")),
        *([("why not reached", q.reason)] if q.reached is False else []),
        ("how counted", q.counting)], empty="not measured")


ENV_LABELS = {"ram_total_gb": "RAM (GB)", "cpu_model": "CPU model", "cpu_count": "CPU cores", "gpu_count": "GPUs",
              "os": "OS", "git_commit": "git commit", "nccl": "NCCL", "cuda": "CUDA", "world_size": "world size"}
SHOWN_APART = ("devices", "threads_per_rank", "threads_source")  # env fields with a row or table of their own


def _env(env: Env) -> str:
    fields = msgspec.structs.asdict(env)
    if all(v is None for v in fields.values()):
        return missing("Environment", "not recorded")
    # the same for every run of a sweep (launch.thread_plan), so scaling compares like with like
    threads = env.threads_per_rank
    rows = [("CPU threads per rank", f"{threads} · {env.threads_source or 'source not recorded'}"
             if present(threads) else None)]
    for k, v in fields.items():
        if k not in SHOWN_APART and not isinstance(v, msgspec.Struct):  # a section (hardware identity): not a row
            value = ", ".join(map(str, v)) if isinstance(v, list) else f_sig(v) if isinstance(v, float) else v
            rows.append((ENV_LABELS.get(k, k.replace("_", " ")), value))
    html = kv_table(rows)  # what was not recorded: one line
    devs = env.devices or []
    if devs:
        html += table(["rank", "host", "type", "name", "uuid"],
                      [[d.rank, d.host, d.type, d.name, d.uuid] for d in devs[:64]], drop_silent=True)
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


def render(row: dict, rec: Record, predicted=None) -> PageSection:
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
            blocks[key] = missing(title, why if rec.status == "ok" else "run failed")
    if "fig-run-loss" in {f.id for f in figs} and all(s.val_loss is None for s in rec.steps):
        note = '<p class="note">Validation loss: not measured (no eval steps).</p>'
        blocks["loss"] = f'<div>{blocks["loss"]}{note}</div>'
    html = (_error(rec) + _flags(row) +
            f'<div class="row2"><div><h3>Run</h3>{_identity(row, rec)}</div>'
            f'<div><h3>Headline figures</h3>{_headline(row, rec)}{_predicted(predicted)}</div></div>'
            f'<h2>Time and loss</h2><div class="row2">{blocks["steps"]}{blocks["loss"]}</div>'
            f'<h2>Ranks and experts</h2><div class="row2">{blocks["ranks"]}<div>{blocks["experts"]}{blocks["imbalance"]}{_moe(rec)}'
            f'</div></div>'
            f'<h2>Memory and communication</h2><div class="row2"><div>{blocks["memory"]}{_memory_notes(rec)}</div>'
            f'<div>{_memory_table(rec)}{_comm(rec)}{_pipeline(rec)}</div></div>'
            f'<h2>Energy and carbon</h2><div class="row2"><div>{_energy(rec)}</div><div>{_carbon(rec)}'
            f'{_quality(rec)}</div></div>'
            f'<h2>Environment</h2>{_env(rec.env)}'
            f'<details><summary>Resolved config</summary><pre>'
            f'{esc(json.dumps(msgspec.to_builtins(rec.config), indent=1, sort_keys=True))}</pre></details>')
    return PageSection("run", str(row.get("run_label")), html, figs)
