"""Compute time of one micro-batch on one device, and of the optimizer step.

The weight matmuls run at the system's achieved matmul rate (its FP8 rate under --precision fp8) and the
attention core (Q·Kᵀ, the weighted sum of V, and the fused backward's recomputed Q·Kᵀ) at its achieved
attention rate: FLOPs from metrics.flops.flop_parts, what recompute adds counted apart. A device does 1/tp
of each matmul (tensor parallelism) and 1/pp of the layers (pipeline stages, split evenly); the routed
experts' grouped GEMMs are predict/moe.py's term, not counted here. The busiest pipeline stage sets the
pace: the last one also runs the LM head (stage_excess).
"""

from __future__ import annotations

from dataclasses import dataclass

from benchsuite.metrics.flops import FlopParts, flop_parts, param_counts
from benchsuite.metrics.memory import other_ranks_experts, params_per_rank, rank_params
from benchsuite.predict.moe import matmul_rate, routed_expert_flops_per_token
from benchsuite.predict.system import System
from benchsuite.predict.workload import Implementation, Workload

# AdamW's bytes of memory traffic per parameter (fused: reads parameter, gradient, m and v, 4 bytes each;
# writes parameter, m and v): the step is bound by memory bandwidth, not FLOPs.
OPTIMIZER_BYTES_PER_PARAM = 28
BACKWARD_SHARE = 2 / 3  # backward does twice the forward's FLOPs (input and weight gradients)


@dataclass(frozen=True)
class MicrobatchCompute:
    """Seconds of one micro-batch on one device (forward + backward), by what runs."""

    matmul_s: float
    attention_s: float
    recompute_s: float

    @property
    def total_s(self) -> float:
        return self.matmul_s + self.attention_s + self.recompute_s

    @property
    def backward_s(self) -> float:
        """The backward pass's share (with the recompute it runs)."""
        return BACKWARD_SHARE * (self.matmul_s + self.attention_s) + self.recompute_s


def token_flops(w: Workload) -> FlopParts:
    whole_block = w.implementation is Implementation.MEGATRON
    return flop_parts(w.model, w.moe, micro_batch=w.micro_batch, recompute=w.recompute.value,
                      whole_block_recompute=whole_block)


def microbatch_compute(w: Workload, system: System) -> MicrobatchCompute:
    f = token_flops(w)
    tokens = w.micro_batch * w.model.seq_len / (w.layout.tp * w.layout.pp)  # one device's share of the work
    mm, att = matmul_rate(w, system), system.device.attention_tflops * 1e12
    fused = f.fused_attention_backward if w.implementation is Implementation.BENCHSUITE else 0.0
    return MicrobatchCompute(matmul_s=tokens * (f.executed_matmul - routed_expert_flops_per_token(w)) / mm,
                             attention_s=tokens * (f.attention + fused) / att,
                             recompute_s=tokens * (f.recompute_matmul / mm + f.recompute_attention / att))


def params_per_device(w: Workload) -> float:
    """Parameters one device holds before ZeRO sharding: its tensor-parallel share, its pipeline stage's
    share of the layers, its expert-parallel share of the experts. A benchsuite run: the Ψ its record's
    memory and communication figures count (metrics.memory.rank_params; in a pipeline the rank holding
    the most); Megatron's: the layers' share with the embedding and LM head averaged in."""
    lay = w.layout
    if w.implementation is Implementation.BENCHSUITE:
        return rank_params(w.model, w.moe, lay)
    return (params_per_rank(w.model, w.moe, lay.tp) - other_ranks_experts(w.model, w.moe, lay.ep, lay.etp)) / lay.pp


def expert_params_per_device(w: Workload) -> float:
    """The expert parameters one device holds (its expert-parallel share, 1/etp of each expert's FFN, its
    stage's layers): gradients that only the ranks holding the same expert shards reduce."""
    if w.moe is None:
        return 0.0
    pc = param_counts(w.model, w.moe)
    return pc.moe_layers * w.moe.experts / w.layout.ep * pc.expert / w.layout.etp / w.layout.pp


def optimizer_s(w: Workload, system: System) -> float:
    """AdamW over the parameters this device updates (its ZeRO shard from stage 1), at memory bandwidth."""
    psi = params_per_device(w) / (w.layout.dp if w.layout.zero >= 1 else 1)
    return OPTIMIZER_BYTES_PER_PARAM * psi / (system.device.memory_gbps * 1e9)



def stage_excess(w: Workload) -> float:
    """The share by which the busiest pipeline rank's work exceeds the mean rank's: a rank runs the blocks of
    its stages (layout.ParallelDims.stage_layers: parallel.stage_layers, or even, or the ends one block
    lighter) and the rank of the last stage also the LM head (Megatron-LM and torch.distributed.pipelining
    both place it there); every pipeline rank waits for the busiest. Blocks weigh the mean block's FLOPs;
    0 without a pipeline."""
    lay = w.layout
    if lay.pp <= 1:
        return 0.0
    total, head = token_flops(w).hardware, 6 * param_counts(w.model, w.moe).lm_head
    block = (total - head) / w.model.layers
    last = lay.num_stages - 1
    work = [sum(block * len(lay.stage_layers(s, w.model.layers)) + (head if s == last else 0.0)
                for s in lay.stage_ids(rank)) for rank in range(lay.pp)]
    return max(work) / (total / lay.pp) - 1
