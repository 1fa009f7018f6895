"""One page per run: the sanity guard's flags (a warning box), headline figures, step-time series,
loss curve (with validation loss and the target loss), per-rank step time (stragglers), MoE expert
load per layer and expert (tokens computed, else routed) with its imbalance per step and the expert
implementation, model-state memory measured vs analytic, energy per device, carbon, environment and
the resolved config. Every section a record lacks says so ("not measured") instead of drawing nothing
or zero."""

from __future__ import annotations

import json

from benchsuite.record.values import dig
from benchsuite.results.scaling import BASELINE
from dashboard.data import load_table
from dashboard.render import (Figure, Section, esc, f_bytes, f_ms, f_num, f_pct, f_sig, kv_table, layout,
                              missing, num, present, ptext, series, short, table)

SMALL = {"height": 300}


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


def _headline(row, rec) -> str:
    m = rec.get("metrics") or {}
    fl = m.get("flops") or {}
    rows = [("tokens / s", f_num(row.get("tokens_per_s"))),
            ("MFU (model FLOPs, no recompute)", f_pct(row.get("mfu"))),
            ("HFU (hardware FLOPs, recompute included)", f_pct(m.get("hfu"))),
            ("step time, ms (median, 95% CI)", f_ms(row.get("step_time_median_s"), row.get("step_time_ci95_lo_s"),
                                                   row.get("step_time_ci95_hi_s"))),
            ("TFLOP/s per device (model / hardware)",
             f"{f_sig(m.get('tflops_per_device'))} / {f_sig(m.get('hardware_tflops_per_device'))}"),
            ("parameters (total / active per token)",
             f"{f_sig(dig(m, 'params', 'total'))} / {f_sig(dig(m, 'params', 'active'))}"),
            ("model FLOPs / token", f_sig(fl.get("model_per_token"))),
            ("hardware FLOPs / token", f_sig(fl.get("hardware_per_token"))),
            ("counted FLOPs / token", f_sig(fl.get("counted_per_token"))),
            ("scaling efficiency (the run's: its median over seeds and repeats)",
             ("baseline" if row.get("scaling_baseline") == BASELINE else f_pct(row.get("scaling_efficiency")))
             if present(row.get("scaling_efficiency"))
             else f"— ({row.get('scaling_efficiency_reason') or 'not computed'})"),
            ("scaling baseline", row.get("scaling_baseline")),
            ("matmul ceiling, TFLOP/s", f_sig(m.get("matmul_ceiling_tflops"))
             + (f" · {m['matmul_ceiling_source']}" if present(m.get("matmul_ceiling_source")) else "")),
            ("model FLOP/s vs ceiling", f_pct(m.get("mfu_vs_ceiling")) if present(m.get("mfu_vs_ceiling"))
             else f"— ({m.get('mfu_vs_ceiling_reason') or 'not measured'})"),
            ("J / token", f_sig(row.get("j_per_token"))), ("g CO2e / Mtok", f_sig(row.get("gco2e_per_mtok"))),
            ("avg W per device (GPU)", f_sig(row.get("avg_w_per_device")))]
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


def _identity(row, rec) -> str:
    cfg = rec.get("config") or {}
    return kv_table([("suite", rec.get("suite")), ("workload", rec.get("workload")),
                     ("seed", row.get("seed")), ("repeat", row.get("repeat")),
                     ("description", cfg.get("description")), ("kind", row.get("kind_label")),
                     ("model", _architecture(cfg.get("model"))),
                     ("world size", cfg.get("world_size")), ("nodes", cfg.get("nodes")),
                     ("scaling", cfg.get("scaling")), ("parallel", json.dumps(cfg.get("parallel"))),
                     ("status", rec.get("status")), ("started", rec.get("started_at")),
                     ("duration (s)", f_sig(rec.get("duration_s"))), ("run key", rec.get("run_key"))])


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


MOE_LABELS = {"expert_impl": "expert implementation", "load_max_over_mean": "load max / mean (mean over layers)"}


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


def _moe(rec) -> str:
    """The MoE settings of the run's config, then the routing figures of metrics.moe (strings as they are)."""
    moe = dig(rec, "metrics", "moe")
    settings = _moe_settings(rec.get("config") or {})
    if not isinstance(moe, dict) and not settings:
        return ""
    rows = settings + [(MOE_LABELS.get(k, k.replace("_", " ")), f_sig(v) if num(v) is not None else v)
                       for k, v in (moe if isinstance(moe, dict) else {}).items() if not isinstance(v, (list, dict))]
    return kv_table(rows)


def _memory_table(rec) -> str:
    per_rank = dig(rec, "metrics", "memory", "per_rank")
    if not isinstance(per_rank, list) or not per_rank:
        return missing("Peak memory per rank")
    rows = [[i, f_bytes(dig(r, "peak_allocated_bytes")), f_bytes(dig(r, "peak_reserved_bytes")),
             f_bytes(dig(r, "peak_rss_bytes")), dig(r, "source")] for i, r in enumerate(per_rank)]
    return table(["rank", "peak allocated", "peak reserved", "peak host RSS", "source"], rows)


def _memory_notes(rec) -> str:
    ms = dig(rec, "metrics", "memory", "model_state_bytes")
    if not isinstance(ms, dict):
        return ""
    rows = [(k, ms.get(k)) for k in ("formula", "K", "N", "method") if present(ms.get(k))]
    return kv_table(rows) if rows else ""


def _comm(rec) -> str:
    c = dig(rec, "metrics", "comm")
    if not isinstance(c, dict):
        return ""
    by_kind = c.get("bytes_per_step_by_kind") if isinstance(c.get("bytes_per_step_by_kind"), dict) else {}
    rows = [("bytes per step (per rank)", f_bytes(c.get("total_bytes_per_step"))),
            ("paper formula", c.get("paper_formula")), ("paper bytes per step", f_bytes(c.get("paper_bytes_per_step"))),
            ("measured / paper", f_sig(c.get("ratio")))]
    rows += [(f"{k} per step", f_bytes(v)) for k, v in by_kind.items()]
    return "<h3>Communication</h3>" + kv_table(rows)


def _pipeline(rec) -> str:
    """metrics.pipeline: the measured bubble beside (P-1)/(V*M), and point-to-point bytes beside their formula."""
    p = dig(rec, "metrics", "pipeline")
    if not isinstance(p, dict):
        return ""
    rows = [("Stages × virtual stages", f"{p.get('stages')} × {p.get('virtual_stages')}"),
            ("Schedule, microbatches", f"{p.get('schedule')}, {p.get('microbatches')}"),
            ("Bubble measured", f_sig(p.get("bubble_measured"))), ("Bubble formula (P−1)/(V·M)", f_sig(p.get("bubble_formula"))),
            ("Bubble per rank", ", ".join(f_sig(b) for b in p.get("bubble_per_rank") or [])),
            ("How measured", p.get("bubble_source")),
            ("Point-to-point bytes per step", f_bytes(p.get("p2p_bytes_per_step"))),
            ("Point-to-point formula", f_bytes(p.get("p2p_bytes_formula"))),
            ("Activation memory per stage", f_bytes(p.get("activation_bytes_per_stage"))
             if num(p.get("activation_bytes_per_stage")) is not None else p.get("activation_reason"))]
    return "<h3>Pipeline</h3>" + kv_table(rows)


QUALITY_LABELS = {"target_loss": "Target loss", "reached": "Reached", "step": "Step", "tokens": "Tokens",
                  "seconds": "Training time (s)", "model_flops": "Model FLOPs", "energy_j": "Energy (J)",
                  "co2e_g": "CO2e (g)", "initial_val_loss": "Initial validation loss",
                  "final_val_loss": "Final validation loss", "best_val_loss": "Best validation loss",
                  "best_step": "Best step", "eval_seconds": "Evaluation time (s)",
                  "eval_energy_j": "Evaluation energy (J)"}


def _energy(rec) -> str:
    e = rec.get("energy")
    if not isinstance(e, dict):
        return missing("Energy", "not measured for this run")
    srcs = e.get("sources") or {}
    html = kv_table([("GPU (J)", f"{f_sig(e.get('gpu_j'))} · {srcs.get('gpu', e.get('source', '—'))}"),
                     ("CPU (J)", f"{f_sig(e.get('cpu_j'))} · {srcs.get('cpu', e.get('source', '—'))}"),
                     ("DRAM (J)", f"{f_sig(e.get('dram_j'))} · {srcs.get('dram', e.get('source', '—'))}"),
                     ("total (J)", f"{f_sig(e.get('total_j'))} · {e.get('source', '—')}"),
                     ("includes", ", ".join(map(str, e.get("total_includes") or [])) or None),
                     ("window (s)", f_sig(e.get("window_s"))), ("idle (W)", f_sig(e.get("idle_w"))),
                     ("above idle (J)", f_sig(e.get("above_idle_j")))])
    devs = [d for d in e.get("per_device") or [] if isinstance(d, dict)]
    if devs:
        html += table(["device", "name", "host", "ranks", "energy (J)", "source", "avg W"],
                      [[d.get("uuid"), d.get("name"), d.get("host"), ", ".join(map(str, d.get("ranks") or [])),
                        f_sig(d.get("energy_j")), d.get("source"), f_sig(d.get("avg_w"))] for d in devs[:64]])
    nodes = [n for n in e.get("per_node") or [] if isinstance(n, dict)]
    if nodes:
        html += table(["node", "ranks", "CPU (J)", "CPU source", "DRAM (J)", "DRAM source"],
                      [[n.get("host"), ", ".join(map(str, n.get("ranks") or [])),
                        f_sig(dig(n, "cpu", "energy_j")), dig(n, "cpu", "source"),
                        f_sig(dig(n, "dram", "energy_j")), dig(n, "dram", "source")] for n in nodes[:64]])
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
    return kv_table([("energy (kWh)", f_sig(c.get("kwh"))), ("PUE", f_sig(c.get("pue"))),
                     ("grid intensity (g CO2e/kWh)", f_sig(c.get("intensity_g_per_kwh"))),
                     ("intensity source", c.get("intensity_source")), ("note", c.get("intensity_note")),
                     ("CO2e (g)", f_sig(c.get("co2e_g")))])


def _quality(rec) -> str:
    q = dig(rec, "metrics", "quality")
    if not isinstance(q, dict):
        return ""
    return "<h3>Time to target loss</h3>" + kv_table([(QUALITY_LABELS.get(k, k.replace("_", " ").capitalize()),
                                                       f_sig(v) if num(v) is not None else v)
                                                      for k, v in q.items() if not isinstance(v, (list, dict))])


ENV_LABELS = {"ram_total_gb": "RAM (GB)", "cpu_model": "CPU model", "cpu_count": "CPU cores", "gpu_count": "GPUs",
              "os": "OS", "git_commit": "git commit", "nccl": "NCCL", "cuda": "CUDA", "world_size": "world size"}


def _env(rec) -> str:
    env = rec.get("env") or {}
    if not isinstance(env, dict) or not env:
        return missing("Environment", "not recorded")
    shown_apart = ("devices", "threads_per_rank", "threads_source")
    rows, unrecorded = [], []
    for k, v in env.items():
        if k in shown_apart or isinstance(v, dict) or (isinstance(v, list) and any(isinstance(x, (dict, list))
                                                                                   for x in v)):
            continue
        label = ENV_LABELS.get(k, k.replace("_", " "))
        if not present(v) or v == []:
            unrecorded.append(label)  # one line for all of them, not a row of "—" each
        else:
            rows.append((label, ", ".join(map(str, v)) if isinstance(v, list) else f_sig(v) if isinstance(v, float)
                         else v))
    if unrecorded:
        rows.append(("not recorded", ", ".join(unrecorded)))
    # the same for every run of a sweep (launch.thread_plan), so scaling compares like with like
    threads = env.get("threads_per_rank") if present(env.get("threads_per_rank")) else "—"
    rows.insert(0, ("CPU threads per rank", f"{threads} · {env.get('threads_source') or 'not recorded'}"))
    html = kv_table(rows)
    devs = [d for d in env.get("devices") or [] if isinstance(d, dict)]
    if devs:
        html += table(["rank", "host", "type", "name", "uuid"],
                      [[d.get("rank"), d.get("host"), d.get("type"), d.get("name"), d.get("uuid")] for d in devs[:64]])
        if len(devs) > 64:
            html += f'<p class="note">… and {len(devs) - 64} more devices (see the record).</p>'
    return html


def render(row: dict, rec: dict) -> Section:
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
            f'<div><h3>Headline figures</h3>{_headline(row, rec)}</div></div>'
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
