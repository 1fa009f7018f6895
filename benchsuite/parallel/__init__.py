"""Turn a plain model into the parallel one a run asks for.

Order, as in torchtitan's parallelize functions: tensor parallel first (it rewrites the
Linear weights every later step sees), then expert parallel (it replaces the expert
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

from benchsuite.config import RunConfig
from benchsuite.dist import DistContext, resolve_precision


@dataclass
class Parallelized:
    model: nn.Module
    optimizer: torch.optim.Optimizer
    impl: dict = field(default_factory=dict)  # what was applied, by name, for the record
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


def apply_activation_checkpointing(model: nn.Module, preserve_rng_state: bool) -> None:
    """Full recompute: each block's activations are rebuilt in the backward pass. The RNG state
    is restored for the recompute only when the forward draws random numbers (GShard's random
    second-expert policy): otherwise the save/restore is wasted work."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    for i, block in enumerate(model.blocks):
        model.blocks[i] = checkpoint_wrapper(block, preserve_rng_state=preserve_rng_state)


def apply_compile(model: nn.Module) -> None:
    """Regional compile: one compiled graph per block, reused across identical blocks."""
    for block in model.blocks:
        block.compile()


def choose_expert_impl(model: nn.Module, run: RunConfig, ctx: DistContext) -> None:
    """The experts' GEMM path for this device and compute precision, fixed once before anything
    traces the model (MoELayer.forward never decides it)."""
    from benchsuite.models.moe import select_expert_impl, set_expert_impl

    bf16 = resolve_precision(run.train.precision, ctx.device) == "bf16"
    set_expert_impl(model, select_expert_impl(ctx.device, torch.bfloat16 if bf16 else torch.float32))


def parallelize(model: nn.Module, run: RunConfig, ctx: DistContext) -> Parallelized:
    from benchsuite.parallel.zero import apply_data_parallel

    impl: dict = {}
    hooks: list = []
    loss_parallel = False
    if run.moe is not None:
        choose_expert_impl(model, run, ctx)
    if ctx.dims.tp_enabled:
        from benchsuite.parallel.tensor import apply_tensor_parallel

        impl["tensor"] = apply_tensor_parallel(model, ctx.mesh["tp"])
        loss_parallel = True
    if ctx.dims.ep_enabled:
        from benchsuite.parallel import expert

        expert.apply_expert_parallel(model, ctx.ep_mesh["ep"].get_group())
        splits = "variable splits, per-expert counts first" if run.moe.dropless else "padded capacity slots"
        impl["expert"] = f"all_to_all_single over {ctx.dims.ep} ranks, {splits}"
        replicas = ctx.ep_mesh["edp"].get_group() if ctx.dims.dp > ctx.dims.ep else None
        hooks.append(lambda: expert.sync_expert_grads(model, ctx.dims.dp, replicas))
        hooks.append(lambda: expert.end_all_to_all_step(model))
    if run.train.recompute == "full":
        random_routing = run.moe is not None and run.moe.second_expert_policy == "random"
        apply_activation_checkpointing(model, preserve_rng_state=random_routing)
        impl["recompute"] = "checkpoint_wrapper per block"
    if run.train.compile:
        apply_compile(model)
        impl["compile"] = "torch.compile per block"
    if ctx.dims.ep_enabled:
        expert.ignore_expert_params_in_ddp(model)  # names as the data-parallel wrapper will see them
    if ctx.dims.pp_enabled:  # split into stages, each wrapped for data parallelism (parallel/pipeline.py)
        from benchsuite.parallel.pipeline import apply_pipeline
        from benchsuite.parallel.zero import make_adamw

        stages, pipe, pipe_impl = apply_pipeline(model, run, ctx)
        return Parallelized(stages, make_adamw(stages.parameters(), run), {**impl, **pipe_impl},
                            loss_parallel, hooks, pipe)
    model, optimizer, impl["data"] = apply_data_parallel(model, run, ctx)
    return Parallelized(model, optimizer, impl, loss_parallel, hooks)
