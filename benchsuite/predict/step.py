"""One prediction: a step's time by component, memory per device, energy and the training run's cost.

    step = M · (compute + MoE + TP + EP)    every micro-batch on the critical path (MoE: predict/moe.py; EP:
                                            the all-to-alls and expert tensor parallelism's gathers)
         + busiest stage                    M · ε · compute: the last stage also runs the LM head
         + bubble                           (P − 1)/(V·M) of that (GPipe and 1F1B V = 1; Narayanan et al. 2021)
         + pipeline point-to-point
         + exposed data-parallel / ZeRO     (communication.py's overlap model)
         + optimizer step                   (AdamW at memory bandwidth)
         + FP8 casts                        (--precision fp8, prediction only; fp8.py)
         + host floor                       ops · op_floor_us: a GPU's host runs ahead, so only what the
                                            floor exceeds the rest by; a CPU runs its host time in line

M is the micro-batches per step (the pipeline's, or grad_accum). Each term is a Component with its
seconds, so a measurement far from its prediction can be traced to the term that moved.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from benchsuite.config import CarbonConfig, RunConfig
from benchsuite.metrics.flops import param_counts
from benchsuite.parallel.pipeline import bubble_formula
from benchsuite.predict import communication as comm
from benchsuite.predict.compute import (MicrobatchCompute, microbatch_compute, optimizer_s, params_per_device,
                                        stage_excess, token_flops)
from benchsuite.predict.energy import EnergyPrediction, predict_energy
from benchsuite.predict.fp8 import fp8_casts_s
from benchsuite.predict.memory import MemoryPrediction, predict_memory
from benchsuite.predict.moe import MoETime, matmul_rate, moe_time, stage_moe_layers
from benchsuite.predict.system import System
from benchsuite.predict.workload import Recompute, Workload, from_run

CHINCHILLA_TOKENS_PER_PARAM = 20  # Hoffmann et al. 2022: compute-optimal training tokens per parameter
# The aten operators one device runs, counted on this harness's model with a TorchDispatchMode (CPU, one
# step, forward and backward): 92 per GPT-2-style block (177 with RoPE, RMSNorm and SwiGLU), an MoE block
# 153-248 (expert choice to gshard; dropless top-2 225) in place of 92: about 130 more; full recompute runs a
# block's forward (about a third) again; 40 per step (embedding, LM head, loss) and the fused optimizer's few.
OPS_PER_BLOCK, OPS_PER_MOE_LAYER, OPS_PER_RECOMPUTED_BLOCK, OPS_PER_STEP = 92, 130, 30, 50
HOST_BOUND_SHARE = 0.5  # warn when the operators' floor reaches this share of the step's device time


@dataclass(frozen=True)
class Component:
    name: str
    seconds: float
    detail: str


@dataclass(frozen=True)
class Prediction:
    workload: Workload
    system: str
    components: tuple[Component, ...]
    tokens_per_step: int
    model_flops_per_token: float
    hardware_flops_per_token: float
    peak_flops: float
    bubble_fraction: float
    tp_bytes_per_microbatch: float
    dp_bytes_per_step: float
    ep_bytes_per_microbatch: float
    p2p_bytes_per_step: float
    memory: MemoryPrediction
    energy: EnergyPrediction
    expert_load: str | None = None  # the busiest expert's load the MoE terms assumed, and its source
    warnings: tuple[str, ...] = ()

    @property
    def step_s(self) -> float:
        return sum(c.seconds for c in self.components)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.step_s

    @property
    def mfu(self) -> float:
        return self.model_flops_per_token * self.tokens_per_s / self.workload.layout.world / self.peak_flops

    @property
    def hfu(self) -> float:
        return self.hardware_flops_per_token * self.tokens_per_s / self.workload.layout.world / self.peak_flops

    def seconds(self, name: str) -> float:
        return next(c.seconds for c in self.components if c.name == name)

    def detail(self, name: str) -> str:
        return next(c.detail for c in self.components if c.name == name)


def predict(w: Workload, system: System, *, carbon: CarbonConfig, run_tokens: float | None = None) -> Prediction:
    """The prediction of one workload on one system; run_tokens: the whole training run's tokens (default
    20 per parameter, Chinchilla)."""
    lay, m = w.layout, w.microbatches
    c = microbatch_compute(w, system)
    tp, ep, cp = comm.tensor_parallel(w, system), comm.expert_parallel(w, system), comm.context_parallel(w, system)
    etp = comm.expert_tensor_parallel(w, system)
    mt = moe_time(w, system)
    ep_s = expert_parallel_s(system, ep, etp)
    imbalance_s = 0.0 if mt is None else mt.imbalance_s(ep_s)
    moe_s = 0.0 if mt is None else mt.router_s + mt.permute_s + mt.experts_s + imbalance_s
    work = c.total_s + moe_s  # one micro-batch's device work on a mean stage
    excess = stage_excess(w)
    per_micro = work * (1 + excess) + tp.seconds + ep_s + cp.seconds
    bubble = bubble_formula(lay.pp, lay.virtual_stages, m) if lay.pp > 1 else 0.0
    psi = params_per_device(w)
    dp = comm.data_parallel(w, system, psi)
    p2p = comm.pipeline_p2p(w, system)
    casts = fp8_casts_s(w, system, psi)
    adamw_s = optimizer_s(w, system)
    components = compute_components(w, system, c) + moe_components(m, mt, imbalance_s)
    components += [
        Component("tensor_parallel", m * tp.seconds,
                  f"{tp.calls} collectives per micro-batch, {tp.bytes_sent / 1e6:.4g} MB sent, {_where(tp)}"
                  + (" (sequence parallel: reduce-scatter + all-gather)" if lay.sequence_parallel else "")
                  + (f"; {m * tp.framework_s:.4g} s of it DTensor's host time" if tp.framework_s else "")),
        expert_parallel_component(w, system, ep, etp),
        Component("context_parallel", m * cp.seconds,
                  f"{cp.calls} key/value gathers and gradient reduce-scatters per micro-batch over {lay.cp} ranks, "
                  f"{cp.bytes_sent / 1e6:.4g} MB sent, {_where(cp)}"),
        Component("pipeline_stages", m * work * excess,
                  f"the busiest pipeline rank (its stages' blocks, the LM head on the last) does {excess:.3g} "
                  f"more than the mean"),
        Component("pipeline_bubble", bubble * m * per_micro,
                  f"{bubble:.3g} of the micro-batches' time ({lay.schedule.value}, P {lay.pp}, "
                  f"V {lay.virtual_stages}, M {m})"),
        Component("pipeline_p2p", p2p.seconds, f"{p2p.calls} sends, {p2p.bytes_sent / 1e6:.4g} MB, {_where(p2p)}"),
        data_parallel_component(w, system, c, dp),
        Component("optimizer", adamw_s, "AdamW at memory bandwidth"),
        Component("fp8_casts", casts, "bf16 → FP8 casts of the matmuls' inputs, output gradients and weights at "
                                      "memory bandwidth (prediction only)"),
    ]
    floor, warnings = host_floor_component(w, system, sum(part.seconds for part in components))
    components.append(floor)
    components = tuple(components)
    f = token_flops(w)
    run_tokens = run_tokens or CHINCHILLA_TOKENS_PER_PARAM * param_counts(w.model, w.moe).total
    energy = predict_energy(step_s=sum(part.seconds for part in components),
                            compute_s=m * work * (1 + excess) + adamw_s + casts, devices=lay.world,
                            tokens_per_step=w.tokens_per_step, idle_w=system.device.idle_w,
                            max_w=system.device.max_w, run_tokens=run_tokens, carbon=carbon)
    return Prediction(workload=w, system=system.name, components=components, tokens_per_step=w.tokens_per_step,
                      model_flops_per_token=f.model, hardware_flops_per_token=f.hardware,
                      peak_flops=system.device.peak_tflops * 1e12, bubble_fraction=bubble,
                      tp_bytes_per_microbatch=tp.bytes_sent, dp_bytes_per_step=dp.bytes_sent,
                      ep_bytes_per_microbatch=ep.bytes_sent + etp.bytes_sent, p2p_bytes_per_step=p2p.bytes_sent,
                      memory=predict_memory(w, psi, system.device.memory_gb), energy=energy,
                      expert_load=None if mt is None else f"{mt.load.max_over_mean:.3g} ({mt.load.source})",
                      warnings=tuple(warnings))


def expert_parallel_s(system: System, ep: comm.CommTime, etp: comm.CommTime) -> float:
    """One micro-batch's exposed expert traffic: the all-to-alls less what overlaps, the expert-tensor
    collectives whole."""
    return ep.seconds * (1 - system.node.ep_overlap) + etp.seconds


def expert_parallel_component(w: Workload, system: System, ep: comm.CommTime, etp: comm.CommTime) -> Component:
    """The expert-parallel all-to-alls and the expert-tensor gathers and reduce-scatters of w's micro-batches."""
    return Component("expert_parallel", w.microbatches * expert_parallel_s(system, ep, etp),
                     f"{ep.calls} all-to-alls per micro-batch, {ep.bytes_sent / 1e6:.4g} MB sent, {_where(ep)}, "
                     f"{1 - system.node.ep_overlap:g} of it exposed"
                     + (f"; {etp.calls} expert-tensor all-gathers and reduce-scatters over {w.layout.etp} ranks, "
                        f"{etp.bytes_sent / 1e6:.4g} MB sent, {_where(etp)}, all exposed" if etp.calls else ""))


def compute_components(w: Workload, system: System, c: MicrobatchCompute) -> list[Component]:
    """The dense compute of w's micro-batches: weight matmuls, the attention core, recompute."""
    m, rate = w.microbatches, matmul_rate(w, system) / 1e12
    return [
        Component("compute.matmul", m * c.matmul_s,
                  f"weight matmuls at {rate:g} TFLOP/s" + (" (FP8, prediction only)" if w.fp8 else "")),
        Component("compute.attention", m * c.attention_s,
                  f"attention core at {system.device.attention_tflops:g} TFLOP/s"),
        Component("compute.recompute", m * c.recompute_s, f"recompute = {w.recompute.value}"),
    ]


def data_parallel_component(w: Workload, system: System, c: MicrobatchCompute, dp: comm.CommTime) -> Component:
    """The data-parallel collectives less what the backward (ZeRO 0-1) or every micro-batch (ZeRO 2-3) hides."""
    hidden_by = c.backward_s if w.layout.zero < 2 else w.microbatches * c.total_s
    return Component("data_parallel", max(0.0, dp.seconds - system.node.dp_overlap * hidden_by),
                     f"{dp.seconds:.4g} s of ZeRO-{w.layout.zero} collectives ({dp.bytes_sent / 1e6:.4g} MB sent, "
                     f"{_where(dp)}" + (f"; {dp.framework_s:.4g} s of it FSDP2's host time" if dp.framework_s else "")
                     + f"), {system.node.dp_overlap:g} of {hidden_by:.4g} s compute overlapping")


def _where(t: comm.CommTime) -> str:
    return "across nodes" if t.crosses_nodes else "inside a node"


def moe_components(m: int, mt: MoETime | None, imbalance_s: float) -> list[Component]:
    """The MoE layers' terms for m micro-batches (none for a dense model)."""
    if mt is None:
        return []
    return [
        Component("moe.router", m * mt.router_s, "top-k over fp32 scores at memory bandwidth"),
        Component("moe.permutation", m * mt.permute_s, "rows copied to and from expert order at memory bandwidth"),
        Component("moe.experts", m * mt.experts_s,
                  f"grouped GEMMs, {mt.rows_per_expert:,.0f} rows per expert: {mt.efficiency:.2f} of the matmul "
                  f"rate (half at {mt.half_tokens:,.0f})"),
        Component("moe.imbalance", m * imbalance_s,
                  f"busiest device {mt.load.device_factor:.3g}× the mean (busiest expert "
                  f"{mt.load.max_over_mean:.3g}× the mean, {mt.load.source})"),
    ]


def host_floor_component(w: Workload, system: System, device_s: float) -> tuple[Component, list[str]]:
    """The operators' host time: in line with the compute on a CPU, else only what exceeds the device's time;
    with a warning where it binds the step."""
    floor_s, ops = host_floor(w, system)
    in_line = system.device.kind == "cpu"
    component = Component("host_floor", floor_s if in_line else max(0.0, floor_s - device_s),
                          f"{ops:,.0f} operators × {system.node.op_floor_us:g} µs"
                          + (" in line with the compute (a CPU)" if in_line else
                             f" = {floor_s:.4g} s; only what exceeds the device's {device_s:.4g} s counts"))
    warnings = []
    if floor_s > 0 and floor_s >= HOST_BOUND_SHARE * device_s:
        warnings.append(f"model too small for {system.name}'s rates: its {ops:,.0f} operators' launch and host time "
                        f"({floor_s:.4g} s at {system.node.op_floor_us:g} µs each) is {floor_s / device_s:.3g}× the "
                        f"device time the rates predict ({device_s:.4g} s); the step is bound by the host, not "
                        f"the device")
    return component, warnings


def host_floor(w: Workload, system: System) -> tuple[float, float]:
    """Seconds and count of the operators one device launches in a step (OPS_* above × the system's
    op_floor_us)."""
    lay, m = w.layout, w.microbatches
    blocks = w.model.layers / lay.pp
    moe_layers = 0 if w.moe is None else stage_moe_layers(w)
    full = OPS_PER_RECOMPUTED_BLOCK if w.recompute is Recompute.FULL else 0
    ops = m * (blocks * (OPS_PER_BLOCK + full) + moe_layers * OPS_PER_MOE_LAYER) + OPS_PER_STEP
    return ops * system.node.op_floor_us * 1e-6, ops


def predict_run(run: RunConfig, system: System, run_tokens: float | None = None, *, fp8: bool = False,
                expert_load: float | None = None, expert_load_source: str | None = None) -> Prediction:
    """A suite's run, as the harness runs it, on `system` (for report and dashboard: measured beside
    predicted). fp8: its weight matmuls in FP8 (prediction only); expert_load: the busiest expert ÷ the mean
    a record measured (record_expert_load), else the system file's assumption."""
    w = dataclasses.replace(from_run(run, system.device.kind), fp8=fp8, expert_load=expert_load,
                            expert_load_source=expert_load_source)
    return predict(w, system, carbon=run.carbon, run_tokens=run_tokens)


def record_expert_load(rec) -> float | None:
    """The busiest expert ÷ the mean a record measured (metrics.moe: all ranks' tokens, imbalance_mean,
    else each rank's load_max_over_mean), None where it has none."""
    moe = rec.metrics.moe if rec.metrics else None
    if moe is None:
        return None
    value = moe.imbalance_mean if moe.imbalance_mean is not None else moe.load_max_over_mean
    return None if value is None else float(value)
