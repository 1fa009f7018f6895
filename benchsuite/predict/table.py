"""A prediction as `benchsuite predict` shows it: one JSON object, or text lines (unescaped: the CLI
passes every line through `printable`)."""

from __future__ import annotations

from benchsuite.energy.carbon import J_PER_KWH
from benchsuite.predict.compare import DenseVsMoE
from benchsuite.predict.step import Prediction
from benchsuite.terminal import grouped

GB = 1e9


def prediction_doc(name: str, p: Prediction) -> dict:
    w, lay, mem, e = p.workload, p.workload.layout, p.memory, p.energy
    return {
        "run": name, "system": p.system,
        "layout": {"nodes": w.nodes, "tensor": lay.tp, "pipeline": lay.pp, "data": lay.dp, "expert": lay.ep,
                   "zero": lay.zero, "schedule": lay.schedule.value, "virtual_stages": lay.virtual_stages,
                   "sequence_parallel": lay.sequence_parallel, "micro_batch": w.micro_batch,
                   "microbatches": w.microbatches, "recompute": w.recompute.value},
        "precision": "fp8 (prediction only)" if w.fp8 else "as run", "expert_load": p.expert_load,
        "warnings": list(p.warnings),
        "step_time_s": p.step_s, "tokens_per_step": p.tokens_per_step, "tokens_per_s": p.tokens_per_s,
        "mfu": p.mfu, "hfu": p.hfu,
        "components": [{"name": c.name, "seconds": c.seconds, "share": c.seconds / p.step_s, "detail": c.detail}
                       for c in p.components],
        "bytes": {"tensor_parallel_per_microbatch": p.tp_bytes_per_microbatch,
                  "expert_parallel_per_microbatch": p.ep_bytes_per_microbatch,
                  "data_parallel_per_step": p.dp_bytes_per_step, "pipeline_p2p_per_step": p.p2p_bytes_per_step},
        "memory": {"model_state_bytes": mem.model_state_bytes, "model_state_formula": mem.model_state_formula,
                   "activation_bytes": mem.activation_bytes, "activation_formula": mem.activation_formula,
                   "total_bytes": mem.total_bytes, "capacity_bytes": mem.capacity_bytes, "fits": mem.fits},
        "energy": {"device_w": e.device_w, "utilisation": e.utilisation, "step_j": e.step_j,
                   "j_per_token": e.j_per_token, "run_tokens": e.run_tokens, "run_s": e.run_s,
                   "run_energy_j": e.run_energy_j, "run_facility_j": e.run_facility_j, "pue": e.pue,
                   "intensity_g_per_kwh": e.intensity_g_per_kwh, "intensity_source": e.intensity_source,
                   "run_co2e_g": e.run_co2e_g},
    }


def prediction_lines(name: str, p: Prediction) -> list[str]:
    w, lay, mem, e = p.workload, p.workload.layout, p.memory, p.energy
    fits = {None: "", True: " (fits)", False: f" — does not fit in {(mem.capacity_bytes or 0) / GB:.4g} GB"}[mem.fits]
    lines = [f"{name}: TP {lay.tp} × PP {lay.pp} × DP {lay.dp}" + (f" × EP {lay.ep}" if lay.ep > 1 else "")
             + f", ZeRO {lay.zero}, recompute {w.recompute.value}"
             + (", sequence parallel" if lay.sequence_parallel else ""),
             f"  step {p.step_s:.4g} s  {p.tokens_per_s:,.0f} tok/s  MFU {p.mfu:.3f}  HFU {p.hfu:.3f}"
             + ("  (FP8, prediction only; MFU over the bf16 peak)" if w.fp8 else "")]
    lines += [f"  ⚠ {text}" for text in p.warnings]
    if p.expert_load is not None:
        lines.append(f"  busiest expert's load: {p.expert_load}")
    lines += [f"    {c.name:<18} {c.seconds:10.4g} s  {100 * c.seconds / p.step_s:5.1f} %  {c.detail}"
              for c in p.components if c.seconds > 0]
    lines += [f"  memory per device {mem.total_bytes / GB:.4g} GB{fits}: model states {mem.model_state_bytes / GB:.4g} "
              f"GB ({mem.model_state_formula}), activations {mem.activation_bytes / GB:.4g} GB ({mem.activation_formula})",
              f"  energy {e.device_w:.0f} W per device at {e.utilisation:.2f} busy, {e.j_per_token:.4g} J/token; "
              f"{e.run_tokens:.3g} tokens: {grouped(e.run_s / 3600, 1)} h, {e.run_energy_j / J_PER_KWH:,.4g} kWh of "
              f"device energy, × PUE {e.pue:g} = {e.run_facility_j / J_PER_KWH:,.4g} kWh, "
              f"{e.run_co2e_g / 1000:,.4g} kg CO2e at {e.intensity_g_per_kwh:g} g/kWh ({e.intensity_source})"]
    return lines


def comparison_lines(pairs: list[DenseVsMoE]) -> list[str]:
    """Each MoE run ÷ its dense partner, with each ratio's range and what dominates it."""
    if not pairs:
        return []
    lines = ["Dense vs MoE (each MoE run ÷ its dense partner, to the same tokens; range: the widest of the inputs' "
             "stated ranges, and that input)"]
    for c in pairs:
        lines.append(f"  {c.moe} ÷ {c.dense}, {c.tokens:.3g} tokens:")
        for what, r in (("time", c.time), ("energy", c.energy), ("CO2e", c.co2e)):
            why = (f"{r.low:.3f}–{r.high:.3f}, dominated by {r.dominant}" if r.dominant
                   else "no input's range moves it")
            lines.append(f"    {what:<7} {r.value:6.3f}×  ({why})")
    return lines
