"""Turn a plain model into the parallel one a run asks for.

Order, as in torchtitan's parallelize functions: tensor parallel first (it rewrites the
Linear weights every later step sees), then context parallel (attention over sequence shards), then
expert parallel (it replaces the expert
weights by the local shard), then activation checkpointing (wraps the parallel blocks),
then compile (traces the checkpointed blocks, one region per block), and data
parallelism last (DDP or FSDP hook the final parameters and must see the compiled
modules' parameters, not replaced ones).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch
from torch import nn

from benchsuite.config import MoEConfig, TrainConfig
from benchsuite.device import resolve_precision
from benchsuite.layout import CP, CP_TP, EDP, EP, ETP, TP, ParallelDims
from benchsuite.parallel.zero import apply_data_parallel, build_optimizer, precision_policy
from benchsuite.record.types import PrecisionPolicy


@dataclass(frozen=True)
class Applied:
    """What parallelize actually applied: the typed facts the metrics read (the stage that ran, the
    precision policy, the experts' GEMM path) and the names of the wrappers, for the record."""

    zero_stage: int  # the ZeRO stage that ran (0 with a single data-parallel rank)
    precision: PrecisionPolicy  # dtypes of the step (metrics.precision_policy)
    data: str  # the data-parallel wrapper
    expert_impl: str | None = None  # the experts' GEMM path, "padded_bmm" | "grouped_mm" (MoE only)
    tensor: str | None = None
    context: str | None = None
    expert: str | None = None
    recompute: str | None = None
    compile: str | None = None
    pipeline: str | None = None
    dense_layout: str | None = None  # the dense layers' pp x dp x tp (ParallelDims.layouts)
    expert_layout: str | None = None  # the experts' folded pp x edp x ep (x etp), with expert (tensor) parallelism

    def implementation(self) -> dict:
        """metrics.implementation: each applied wrapper by name, in the order it was applied, then the
        layouts the dense layers and the experts ran on."""
        names = {"tensor": self.tensor, "context": self.context, "expert": self.expert, "recompute": self.recompute,
                 "compile": self.compile, "pipeline": self.pipeline, "data": self.data,
                 "dense_layout": self.dense_layout, "expert_layout": self.expert_layout}
        return {k: v for k, v in names.items() if v is not None}


@dataclass
class Parallelized:
    model: nn.Module
    optimizer: torch.optim.Optimizer
    applied: Applied | None = None  # what parallelize applied (None: a model wrapped by hand)
    loss_parallel: bool = False  # logits are vocab-sharded DTensors (tensor parallel)
    grad_hooks: list = field(default_factory=list)  # called after the last backward, before optimizer.step
    pipeline: object | None = None  # pipeline.PipelineRun with parallel.pipeline > 1: it runs forward/backward

    def grad_sync(self, enabled: bool):
        """DDP skips its all-reduce on accumulation micro-batches (no_sync); other wrappers sync each time."""
        if enabled or not hasattr(self.model, "no_sync"):
            return contextlib.nullcontext()
        return self.model.no_sync()

    def loss_context(self):
        if not self.loss_parallel:
            return contextlib.nullcontext()
        from torch.distributed.tensor.parallel import loss_parallel

        return loss_parallel()


def apply_activation_checkpointing(model: nn.Module, preserve_rng_state: bool, recompute: str = "full") -> str:
    """Activation recompute; returns its name. "full": each block's activations are rebuilt in the
    backward pass. "selective" (Korthikanti et al. 2022, §5): only each block's attention core, whose
    activations grow with seq_len² while its FLOPs are few; every GEMM keeps its stored input. The RNG
    state is restored for the recompute only when the forward draws random numbers (GShard's random
    second-expert policy, inside a block, never in the attention core): otherwise the save/restore is
    wasted work."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    if recompute == "selective":
        for block in model.blocks:
            block.attn.core = checkpoint_wrapper(block.attn.core, preserve_rng_state=False)
        return "checkpoint_wrapper per attention core (selective)"
    for i, block in enumerate(model.blocks):
        model.blocks[i] = checkpoint_wrapper(block, preserve_rng_state=preserve_rng_state)
    return "checkpoint_wrapper per block"


def apply_compile(model: nn.Module) -> None:
    """Regional compile: one compiled graph per block, reused across identical blocks."""
    for block in model.blocks:
        block.compile()


def choose_expert_impl(model: nn.Module, *, precision: str, device: torch.device) -> str:
    """The experts' GEMM path for this device and compute precision (resolved), fixed once before
    anything traces the model (MoELayer.forward never decides it); returns its name."""
    from benchsuite.models.moe import select_expert_impl, set_expert_impl

    impl = select_expert_impl(device, torch.bfloat16 if precision == "bf16" else torch.float32)
    set_expert_impl(model, impl)
    return impl


def parallelize(model: nn.Module, *, dims: ParallelDims, train: TrainConfig, moe: MoEConfig | None,
                device: torch.device, pipeline=None) -> Parallelized:
    """The parallel model, its optimizer and what was applied, all as the layout `dims` says (it carries
    the meshes with world > 1); pipeline: the pipeline.PipelinePlan of a run with dims.pp_enabled."""
    precision = resolve_precision(train.precision, device)
    applied: dict = {"zero_stage": dims.zero_applied, "precision": precision_policy(precision), **dims.layouts()}
    hooks: list = []
    if moe is not None:
        applied["expert_impl"] = choose_expert_impl(model, precision=precision, device=device)
    if dims.tp_enabled:
        from benchsuite.parallel.tensor import apply_tensor_parallel

        applied["tensor"] = apply_tensor_parallel(model, dims.mesh[TP], sequence_parallel=dims.sequence_parallel)
    if dims.cp_enabled:
        from benchsuite.parallel.context import SequenceShard, apply_context_parallel

        group = dims.group(CP)
        shard = SequenceShard(group, dims.cp_mesh.get_local_rank(CP), dims.cp)
        applied["context"] = apply_context_parallel(model, shard)
    if dims.experts_split:
        from benchsuite.parallel import expert

        expert.apply_expert_parallel(model, dims.group(EP), sharing_group=dims.group(CP_TP),
                                     etp_group=dims.group(ETP))
        applied["expert"] = expert_name(dims, moe)
    if train.recompute != "none":
        random_routing = moe is not None and moe.second_expert_policy == "random"
        applied["recompute"] = apply_activation_checkpointing(model, random_routing, train.recompute)
    if train.compile:
        apply_compile(model)
        applied["compile"] = "torch.compile per block"
    if dims.experts_split:
        expert.ignore_expert_params_in_ddp(model)  # names as the data-parallel wrapper will see them
    pipe = None
    if dims.pp_enabled:  # split into stages, each wrapped for data parallelism (parallel/pipeline.py)
        from benchsuite.parallel.pipeline import apply_pipeline

        model, pipe, names = apply_pipeline(model, dims=dims, plan=pipeline, device=device,
                                            logits_dtype=torch.bfloat16 if precision == "bf16" else torch.float32)
        applied.update(names)
        if pipe.tied_sync is not None:
            hooks.append(pipe.tied_sync)
    else:
        model, applied["data"] = apply_data_parallel(model, dims=dims, device=device)
    if dims.experts_split:
        hooks += expert_grad_hooks(model, dims)
    return Parallelized(model, build_optimizer(model, train=train, dims=dims), Applied(**applied),
                        dims.tp_enabled, hooks, pipe)


def expert_name(dims: ParallelDims, moe: MoEConfig) -> str:
    """Applied.expert: how the routed experts' work moves between ranks."""
    splits = "variable splits, per-expert counts first" if moe.dropless else "padded capacity slots"
    sharing = dims.tp * dims.cp  # the ranks that route the same tokens
    folded = f"; each of {sharing} ranks routing the same tokens dispatches 1/{sharing} of the slots, " \
        f"all-gathered after" if sharing > 1 else ""
    exchange = f"all_to_all_single over {dims.ep} ranks, {splits}" if dims.ep_enabled else \
        "every expert on each rank's expert-tensor group (expert 1): no all-to-all"
    width = f"; each expert's FFN columns split over {dims.etp} ranks, its rows all-gathered before and its " \
        f"partial outputs reduce-scattered after" if dims.etp_enabled else ""
    return f"{exchange}{folded}{width}"


def expert_grad_hooks(model: nn.Module, dims: ParallelDims) -> list:
    """After the last backward of a step: the expert shards' gradient reduction where no FSDP2 wrapper
    of their own does it (replicated experts: parallel/zero.py), then the close of the step's all-to-all
    byte count."""
    from benchsuite.parallel import expert

    hooks = []
    if not dims.experts_sharded:
        replicas = dims.group(EDP) if dims.edp > 1 else None
        hooks.append(lambda: expert.sync_expert_grads(model, dims.dp_batches, replicas))
    hooks.append(lambda: expert.end_all_to_all_step(model))
    return hooks
