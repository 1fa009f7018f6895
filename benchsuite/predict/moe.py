"""What an MoE layer adds to a step beyond its FLOPs: each term per micro-batch on one device, for the
MoE layers of its pipeline stage (L_moe / P of them).

Notation: N the tokens the device routes (Workload.routed_tokens), E experts, k per token, s the expert
rows each token fills (k dropless; E·C/N with capacity, padding included: models.moe.capacity); t the ranks
that route the same N tokens and split the routed work (the harness's fold with experts split, tensor ×
context ranks: parallel/expert.py; 1 otherwise), so S = its chunk of the N·s rows, E·ceil(C/t) slots or
ceil(N·k/t) rows, per device (balanced); g = E / EP the experts a device holds; h hidden; a the activation
bytes; B the device's memory bandwidth; R its matmul rate.

    router       = L·(3·P·N·E·4) / B                     top-k over fp32 scores: memory-bound. P = 4 passes
                                                         forward (logits, softmax read + write, top-k), +1 for
                                                         the aux loss or the aux-free bias, +1 for the z-loss;
                                                         backward twice the forward (the router GEMM is a
                                                         matmul: compute.matmul has it)
    permutation  = L·(2·2·Q·N·s·h·a) / B                 Q copies of every row: permute and unpermute (Q = 2),
                                                         and with EP and g > 1 the sort by local expert after
                                                         the all-to-all and back (Q = 4, Megatron's alltoall
                                                         dispatcher); read + write; backward as forward; every
                                                         rank of a fold builds the whole N·s (the slots are
                                                         split after)
    experts      = L·6·S·p_e / (R·η(T)),  η(T) = T / (T + T½)
                                                         grouped GEMMs of T = S·EP·ETP/E rows per expert (an
                                                         expert-tensor group gathers its ETP ranks' rows into
                                                         GEMMs 1/ETP as wide: the FLOPs per device stay
                                                         S·p_e, the rows per GEMM grow ETP-fold); T½ the
                                                         rows at which one runs at half the matmul rate: the
                                                         system's experts.gemm_half_tokens, else the roofline
                                                         of reading the expert's weights once per GEMM,
                                                         T½ = R·w/(2·B) (w bytes per weight)
    imbalance    = (ρ − 1)·(experts + all-to-all)        the busiest device sets the step: dropless routing with
                                                         EP, ρ = 1 + (r − 1)/√g for a busiest expert r × the
                                                         mean (a device sums g experts' loads, their spread
                                                         falling as 1/√g); 1 with capacity (the padded slots
                                                         run anyway), expert choice (balanced by
                                                         construction) or forced routing
    shared and fine-grained experts: shared ones are dense matmuls (compute.matmul); fine-grained ones
    (more experts, smaller expert_hidden) lower T and so η.

r: the run's recorded metrics.moe.load_max_over_mean where a record gives it (Workload.expert_load), else
the system file's experts.load_max_over_mean, an assumption every prediction states.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from benchsuite.metrics.comm import expert_rows_per_rank
from benchsuite.metrics.flops import param_counts
from benchsuite.models.moe import expected_slots_per_token
from benchsuite.predict.system import System
from benchsuite.predict.workload import Implementation, Workload
from benchsuite.record.kinds import ROUTERS

FP32 = 4
ROUTER_PASSES = 4  # forward: the logits written, softmax read and written, top-k read


@dataclass(frozen=True)
class ExpertLoad:
    """The busiest expert's load (× the mean) a prediction assumed, and where it comes from."""

    max_over_mean: float
    source: str
    device_factor: float  # ρ: the busiest device's load ÷ the mean device's


@dataclass(frozen=True)
class MoETime:
    """Seconds per micro-batch on one device, by term (module docstring), and what set them."""

    router_s: float
    permute_s: float
    experts_s: float
    rows_per_expert: float  # T
    efficiency: float  # η(T)
    half_tokens: float  # T½
    load: ExpertLoad

    def imbalance_s(self, all_to_all_s: float) -> float:
        return (self.load.device_factor - 1) * (self.experts_s + all_to_all_s)


def stage_moe_layers(w: Workload) -> float:
    """MoE layers of one pipeline stage (split evenly)."""
    return param_counts(w.model, w.moe).moe_layers / w.layout.pp


def sharing_ranks(w: Workload) -> int:
    """t: the ranks that route the same tokens and split the routed work among them, the harness's fold
    (parallel/expert.py: with the experts split, tensor × context ranks); 1 where each rank computes every row
    it routes (experts replicated, or Megatron routing its own sequence shard)."""
    if w.implementation is Implementation.MEGATRON or not w.layout.experts_split:
        return 1
    return w.layout.tp * w.layout.cp


def routed_rows(w: Workload) -> int:
    """N·s: the expert rows a device's routed tokens fill per MoE layer (padding included), before any split."""
    return expert_rows_per_rank(w.routed_tokens, w.moe, 1)


def rows_per_device(w: Workload) -> int:
    """S: the expert rows one device dispatches per MoE layer (padding included), its chunk of the routed rows
    split over the sharing_ranks as the harness splits them (metrics.comm.expert_rows_per_rank, the record
    formulas' rows): what it sends to the all-to-all and computes."""
    return expert_rows_per_rank(w.routed_tokens, w.moe, sharing_ranks(w))


def routed_expert_flops_per_token(w: Workload) -> float:
    """Training FLOPs per token of the routed experts' GEMMs, padding included (the part of
    FlopParts.executed_matmul the grouped GEMMs run)."""
    if w.moe is None:
        return 0.0
    pc = param_counts(w.model, w.moe)
    return 6 * pc.moe_layers * expected_slots_per_token(w.moe, w.micro_batch * w.model.seq_len) * pc.expert


def matmul_rate(w: Workload, system: System) -> float:
    """FLOP/s of the weight matmuls: the FP8 rate under --precision fp8."""
    return (system.device.fp8_matmul_tflops if w.fp8 else system.device.matmul_tflops) * 1e12


def half_tokens(w: Workload, system: System) -> float:
    """T½ (module docstring): the system file's, else the weight-read roofline R·w/(2·B)."""
    if system.experts.gemm_half_tokens is not None:
        return system.experts.gemm_half_tokens
    weight_bytes = 1 if w.fp8 else w.compute_bytes
    return matmul_rate(w, system) * weight_bytes / (2 * system.device.memory_gbps * 1e9)


def expert_load(w: Workload, system: System) -> ExpertLoad:
    """r and ρ (module docstring)."""
    moe, ep = w.moe, w.layout.ep
    if not ROUTERS[moe.router].token_choice:
        return ExpertLoad(1.0, "expert choice: balanced by construction", 1.0)
    if moe.routing == "forced":
        return ExpertLoad(1.0, "forced routing: tokens spread evenly", 1.0)
    if not moe.dropless:
        return ExpertLoad(1.0, f"capacity factor {moe.capacity_factor:g}: every expert computes its padded "
                               f"slots, the excess is dropped", 1.0)
    if w.expert_load is not None:
        r, source = w.expert_load, f"recorded ({w.expert_load_source or 'the run'})"
    else:
        r, source = system.experts.load_max_over_mean, "assumed (system file's experts.load_max_over_mean)"
    g = moe.experts / ep
    rho = 1.0 if ep <= 1 else 1 + (r - 1) / math.sqrt(g)
    return ExpertLoad(r, source, rho)


def moe_time(w: Workload, system: System) -> MoETime | None:
    """The MoE terms of one micro-batch on one device (None without MoE)."""
    if w.moe is None:
        return None
    moe, bw = w.moe, system.device.memory_gbps * 1e9
    layers = stage_moe_layers(w)
    n, rows = w.routed_tokens, rows_per_device(w)
    passes = ROUTER_PASSES + 1 + (1 if moe.z_loss_coef > 0 else 0)  # aux loss or aux-free bias, z-loss
    router = layers * 3 * passes * n * moe.experts * FP32 / bw
    local = moe.experts / w.layout.ep
    copies = 4 if w.layout.ep > 1 and local > 1 and w.implementation is Implementation.MEGATRON else 2
    permute = layers * 2 * 2 * copies * routed_rows(w) * w.model.hidden * w.compute_bytes / bw
    per_expert = rows * w.layout.ep * w.layout.etp / moe.experts
    half = half_tokens(w, system)
    eta = per_expert / (per_expert + half)
    flops = layers * 6 * rows * param_counts(w.model, moe).expert
    return MoETime(router_s=router, permute_s=permute, experts_s=flops / (matmul_rate(w, system) * eta),
                   rows_per_expert=per_expert, efficiency=eta, half_tokens=half, load=expert_load(w, system))
