"""One prediction: a step's time by component, memory per device, energy and the training run's cost.

    step = M · (compute + TP + EP)          every micro-batch on the critical path
         + bubble                           (P − 1)/(V·M) of that (GPipe and 1F1B V = 1; Narayanan et al. 2021)
         + pipeline point-to-point
         + exposed data-parallel / ZeRO     (communication.py's overlap model)
         + optimizer step                   (AdamW at memory bandwidth)

M is the micro-batches per step (the pipeline's, or grad_accum). Each term is a Component with its
seconds, so a measurement far from its prediction can be traced to the term that moved.
"""

from __future__ import annotations

from dataclasses import dataclass

from benchsuite.config import CarbonConfig, RunConfig
from benchsuite.metrics.flops import param_counts
from benchsuite.parallel.pipeline import bubble_formula
from benchsuite.predict import communication as comm
from benchsuite.predict.compute import microbatch_compute, optimizer_s, params_per_device, token_flops
from benchsuite.predict.energy import EnergyPrediction, predict_energy
from benchsuite.predict.memory import MemoryPrediction, predict_memory
from benchsuite.predict.system import System
from benchsuite.predict.workload import Workload, from_run

CHINCHILLA_TOKENS_PER_PARAM = 20  # Hoffmann et al. 2022: compute-optimal training tokens per parameter


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


def predict(w: Workload, system: System, *, carbon: CarbonConfig, run_tokens: float | None = None) -> Prediction:
    """The prediction of one workload on one system; run_tokens: the whole training run's tokens (default
    20 per parameter, Chinchilla)."""
    lay, m = w.layout, w.microbatches
    c = microbatch_compute(w, system)
    tp, ep = comm.tensor_parallel(w, system), comm.expert_parallel(w, system)
    per_micro = c.total_s + tp.seconds + ep.seconds
    bubble = bubble_formula(lay.pp, lay.virtual_stages, m) if lay.pp > 1 else 0.0
    psi = params_per_device(w)
    dp = comm.data_parallel(w, system, psi)
    hidden_by = c.backward_s if lay.zero < 2 else m * c.total_s
    dp_exposed = max(0.0, dp.seconds - system.node.dp_overlap * hidden_by)
    p2p = comm.pipeline_p2p(w, system)
    where = lambda t: "across nodes" if t.crosses_nodes else "inside a node"  # noqa: E731
    components = (
        Component("compute.matmul", m * c.matmul_s, f"weight matmuls at {system.device.matmul_tflops:g} TFLOP/s"),
        Component("compute.attention", m * c.attention_s,
                  f"attention core at {system.device.attention_tflops:g} TFLOP/s"),
        Component("compute.recompute", m * c.recompute_s, f"recompute = {w.recompute.value}"),
        Component("tensor_parallel", m * tp.seconds,
                  f"{tp.calls} collectives per micro-batch, {tp.bytes_sent / 1e6:.4g} MB sent, {where(tp)}"
                  + (" (sequence parallel: reduce-scatter + all-gather)" if lay.sequence_parallel else "")
                  + (f"; {m * tp.framework_s:.4g} s of it DTensor's host time" if tp.framework_s else "")),
        Component("expert_parallel", m * ep.seconds,
                  f"{ep.calls} all-to-alls per micro-batch, {ep.bytes_sent / 1e6:.4g} MB sent, {where(ep)}"),
        Component("pipeline_bubble", bubble * m * per_micro,
                  f"{bubble:.3g} of the micro-batches' time ({lay.schedule.value}, P {lay.pp}, "
                  f"V {lay.virtual_stages}, M {m})"),
        Component("pipeline_p2p", p2p.seconds, f"{p2p.calls} sends, {p2p.bytes_sent / 1e6:.4g} MB, {where(p2p)}"),
        Component("data_parallel", dp_exposed,
                  f"{dp.seconds:.4g} s of ZeRO-{lay.zero} collectives ({dp.bytes_sent / 1e6:.4g} MB sent, "
                  f"{where(dp)}"
                  + (f"; {dp.framework_s:.4g} s of it FSDP2's host time" if dp.framework_s else "")
                  + f"), {system.node.dp_overlap:g} of {hidden_by:.4g} s compute overlapping"),
        Component("optimizer", optimizer_s(w, system), "AdamW at memory bandwidth"),
    )
    f = token_flops(w)
    step_s = sum(x.seconds for x in components)
    pc = param_counts(w.model, w.moe)
    energy = predict_energy(step_s=step_s, compute_s=m * c.total_s + components[-1].seconds, devices=lay.world,
                            tokens_per_step=w.tokens_per_step, idle_w=system.device.idle_w,
                            max_w=system.device.max_w,
                            run_tokens=run_tokens or CHINCHILLA_TOKENS_PER_PARAM * pc.total, carbon=carbon)
    return Prediction(workload=w, system=system.name, components=components, tokens_per_step=w.tokens_per_step,
                      model_flops_per_token=f.model, hardware_flops_per_token=f.hardware,
                      peak_flops=system.device.peak_tflops * 1e12, bubble_fraction=bubble,
                      tp_bytes_per_microbatch=tp.bytes_sent, dp_bytes_per_step=dp.bytes_sent,
                      ep_bytes_per_microbatch=ep.bytes_sent, p2p_bytes_per_step=p2p.bytes_sent,
                      memory=predict_memory(w, psi, system.device.memory_gb), energy=energy)


def predict_run(run: RunConfig, system: System, run_tokens: float | None = None) -> Prediction:
    """A suite's run, as the harness runs it, on `system` (for report and dashboard: measured beside
    predicted)."""
    return predict(from_run(run, system.device.kind), system, carbon=run.carbon, run_tokens=run_tokens)
