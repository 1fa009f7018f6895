"""Memory per device: model states (metrics.memory's ZeRO forms) plus the activations the schedule keeps.

Model states: a benchsuite run's are metrics.memory's layout_model_state (the function behind
its record's analytic figure) under the data-parallel wrapper its layout runs; Megatron-LM's the ZeRO
paper's mixed-precision forms.

Activations: Korthikanti et al. 2022's per-layer bytes (metrics.memory.activation_bytes, with selective
recompute and sequence parallelism) for one micro-batch, times the micro-batches a stage holds at once:
one without a pipeline; GPipe all M (every forward before any backward); 1F1B min(P, M) on the first
stage, whose P in flight cover its L/P layers (Korthikanti §4.2.3: the first stage holds L layers' worth);
interleaved 1F1B that times (1 + (P − 1)/(P·V)) (Narayanan et al. 2021). The output layer counts on a
stage that holds the LM head (the only one without a pipeline).
"""

from __future__ import annotations

from dataclasses import dataclass

from benchsuite.layout import Schedule
from benchsuite.metrics import memory as mem
from benchsuite.predict.workload import Implementation, Workload

GB = 1e9


@dataclass(frozen=True)
class MemoryPrediction:
    model_state_bytes: float
    model_state_formula: str
    activation_bytes: float
    activation_formula: str
    inflight_microbatches: float
    capacity_bytes: float | None

    @property
    def total_bytes(self) -> float:
        return self.model_state_bytes + self.activation_bytes

    @property
    def fits(self) -> bool | None:
        return None if self.capacity_bytes is None else self.total_bytes <= self.capacity_bytes


def inflight(w: Workload) -> float:
    p, m, v = w.layout.pp, w.microbatches, w.layout.virtual_stages
    if p == 1:
        return 1.0
    if w.layout.schedule is Schedule.GPIPE:
        return float(m)
    held = float(min(p, m))
    return held * (1 + (p - 1) / (p * v)) if w.layout.schedule is Schedule.INTERLEAVED else held


def model_state(w: Workload, psi: float) -> tuple[float, str]:
    """Bytes and formula of one device's model states for psi parameters (before ZeRO sharding)."""
    lay = w.layout
    if w.implementation is Implementation.MEGATRON:
        out = mem.zero_model_state(psi, lay.dp, lay.zero_applied, mem.PAPER)
    else:
        # the record's own formula for the layout (experts and dense weights each over their group); FSDP2 gets
        # no MixedPrecisionPolicy here (parallel/zero.py): it gathers the fp32 parameters
        out = mem.layout_model_state(w.model, w.moe, lay, "fp32")
    return out["total"], out["formula"]


def predict_memory(w: Workload, psi: float, capacity_gb: float | None) -> MemoryPrediction:
    m = w.model
    act = mem.activation_bytes(m.seq_len, w.micro_batch, m.hidden, m.heads, max(1, m.layers // w.layout.pp), m.vocab,
                               tp=w.layout.tp, recompute=w.recompute.value,
                               sequence_parallel=w.layout.sequence_parallel, context=w.layout.cp)
    held = inflight(w)
    layers_bytes = act["per_layer_bytes"] * act["layers"] * held
    activations = layers_bytes + (act["output_layer_bytes"] if w.layout.pp == 1 else 0.0)
    state, formula = model_state(w, psi)
    return MemoryPrediction(model_state_bytes=state, model_state_formula=formula, activation_bytes=activations,
                            activation_formula=f"{act['formula']} × {held:g} micro-batch(es) in flight",
                            inflight_microbatches=held,
                            capacity_bytes=None if capacity_gb is None else capacity_gb * GB)
