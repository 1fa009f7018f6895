"""What a prediction is of: one run's model, parallel layout and implementation, as typed values.

A suite's RunConfig becomes a Workload (`from_run`) with the harness's own conventions and the layout the
harness runs (layout.ParallelDims.from_run); a published measurement (Megatron-LM's) is a Workload with
Megatron's, its layout built from its degrees (validation in tests/test_predict_published.py).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from benchsuite.config import ModelConfig, MoEConfig, RunConfig
from benchsuite.layout import ParallelDims


class Recompute(enum.Enum):
    NONE = "none"
    SELECTIVE = "selective"  # the attention core re-run in backward (Korthikanti et al. 2022, §5)
    FULL = "full"  # every block's forward re-run in backward


class Implementation(enum.Enum):
    """Whose training step runs: where the two differ in what a step executes and holds.

    BENCHSUITE: torch's non-reentrant checkpoint stops before the dense FFN down-projection; fused (SDPA)
    attention recomputes Q·Kᵀ in backward; fp32 parameters, gradients and residual stream under bf16
    autocast (metrics.memory.implementation_model_state); ZeroRedundancyOptimizer broadcasts parameters.
    MEGATRON: Megatron-LM's reentrant checkpoint re-runs the whole block; bf16 activations and gradients
    on the wire; the ZeRO paper's mixed-precision model states (2 + 2 + 12 bytes per parameter)."""

    BENCHSUITE = "benchsuite"
    MEGATRON = "megatron"


@dataclass(frozen=True)
class Workload:
    model: ModelConfig
    moe: MoEConfig | None
    layout: ParallelDims
    micro_batch: int  # sequences in one micro-batch of one data-parallel rank
    microbatches: int  # micro-batches per step and rank: the pipeline's M, or grad_accum without one
    recompute: Recompute
    compute_bytes: int  # 2 (bf16) or 4 (fp32): activations on the wire
    implementation: Implementation = Implementation.BENCHSUITE
    nodes: int | None = None  # the nodes the ranks spread over, evenly; None: packed devices_per_node to a node
    fp8: bool = False  # weight matmuls in FP8 (prediction only: the harness trains in fp32 or bf16)
    expert_load: float | None = None  # busiest expert ÷ mean, from a record; None: the system file's assumption
    expert_load_source: str | None = None  # where expert_load comes from (a record's file)

    @property
    def routed_tokens(self) -> int:
        """Tokens one device routes per micro-batch and MoE layer: here the whole micro-batch, with context
        parallelism the context-parallel group's (the layer gathers them: RunConfig.routed_micro_batch), every
        tensor-parallel rank routing them all (predict/moe.py: sharing_ranks splits the routed work); with
        Megatron's sequence parallelism its shard b·s/tp, as MoE Parallel Folding runs the experts at expert
        tensor parallelism 1 (Liu et al. 2025)."""
        tokens = self.micro_batch * self.model.seq_len
        if self.implementation is Implementation.BENCHSUITE:
            return tokens * self.layout.cp
        return tokens // self.layout.tp if self.layout.sequence_parallel else tokens

    @property
    def tokens_per_step(self) -> int:
        """Tokens of one optimizer step over the whole job."""
        return self.micro_batch * self.model.seq_len * self.microbatches * self.layout.dp

    @property
    def grad_bytes(self) -> int:
        """The dtype of backward activations and gradients on the wire (fp32 residual stream here)."""
        return 4 if self.implementation is Implementation.BENCHSUITE else self.compute_bytes


def from_run(run: RunConfig, device_kind: str) -> Workload:
    """A suite's run as the harness runs it; precision "auto" resolved as the worker resolves it on a
    device of `device_kind` ("gpu": bf16, "cpu": fp32)."""
    p = run.parallel
    precision = run.train.precision if run.train.precision != "auto" else ("bf16" if device_kind == "gpu" else "fp32")
    per_rank = run.micro_batch_per_rank
    if p.pipeline > 1:
        micro_batch, microbatches = per_rank // p.n_microbatches, p.n_microbatches
    else:
        micro_batch, microbatches = per_rank, run.train.grad_accum
    return Workload(model=run.model, moe=run.moe, layout=ParallelDims.from_run(run), micro_batch=micro_batch,
                    microbatches=microbatches, recompute=Recompute(run.train.recompute),
                    compute_bytes=2 if precision == "bf16" else 4, nodes=run.nodes)
