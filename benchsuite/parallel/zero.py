"""Data parallelism: DDP (stage 0) and the ZeRO stages 1/2/3 (Rajbhandari et al. 2019).

What each stage is built from, and what a rank then holds (Ψ parameters, N data-parallel ranks;
see benchsuite/metrics/memory.py for the byte formulas and how they are checked):

- stage 0: ``DistributedDataParallel`` with ``gradient_as_bucket_view=True`` (the gradients *are*
  the all-reduce buckets, so DDP keeps one copy of them, not two). Full params, grads, Adam state.
- stage 1: DDP as above plus ``torch.distributed.optim.ZeroRedundancyOptimizer`` wrapping AdamW:
  each rank keeps the Adam state of its own partition of the parameters (whole tensors, assigned
  greedily by size) and, after its step, broadcasts the updated parameters it owns. Gradients
  are still all-reduced in full (DDP), so every rank holds full gradients too.
- stage 2: FSDP2 ``fully_shard(..., reshard_after_forward=False)``: parameters, gradients and Adam
  state are sharded at rest; parameters are all-gathered before forward and stay gathered until
  the backward has used them (no second all-gather), gradients are reduce-scattered.
- stage 3: FSDP2 ``fully_shard(..., reshard_after_forward=True)``: as stage 2, but each group's
  parameters are freed after its forward and gathered again for its backward.

FSDP2 groups: the token and position embeddings, every block, and the final norm with the LM
head are one group each, then the root (which then owns no parameter of its own). Wrapping the
embeddings and head separately, as torchtitan does, keeps the root from holding the large vocab
matrices gathered for the whole step (FSDP2 never reshards the root's own group after forward).

Precision: with bf16 on a GPU, FSDP2 gets ``MixedPrecisionPolicy(param_dtype=bf16,
reduce_dtype=fp32)``: the sharded parameters stay fp32 (the master copy Adam updates), the
gathered ones are bf16, gradients are reduced and kept in fp32. On CPU / fp32 no policy is set.
DDP and stage 1 train fp32 parameters under autocast (the worker's autocast), so their states
are fp32 whatever the compute precision.

Tensor parallel × data parallel: torch's DDP refuses DTensor parameters ("got mixed torch.Tensor
and DTensor" while broadcasting module states, torch 2.13), so with tensor > 1 the data-parallel
wrapper is ``torch.distributed._composable.replicate_with_fsdp.replicate`` over the "dp" mesh
dimension: FSDP2's machinery with a replicate-only mesh, i.e. DDP semantics (full parameters per
dp rank, gradients all-reduced and averaged over dp) that understands 2-D DTensors.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from benchsuite.config import RunConfig
from benchsuite.dist import DistContext, resolve_precision

STAGE_NAMES = {
    0: "DistributedDataParallel",
    1: "ZeroRedundancyOptimizer(AdamW) + DistributedDataParallel",
    2: "FSDP2 fully_shard(reshard_after_forward=False)",
    3: "FSDP2 fully_shard(reshard_after_forward=True)",
}


def adamw_kwargs(run: RunConfig, device: torch.device) -> dict:
    return {"lr": run.train.lr, "betas": (0.9, 0.95), "weight_decay": 0.1, "fused": device.type == "cuda"}


def make_adamw(params, run: RunConfig, device: torch.device) -> torch.optim.Optimizer:
    """AdamW, fused on CUDA (one kernel for all parameters). FSDP2's sharded DTensor
    parameters go in as they are: the optimizer then only ever sees (and allocates state for)
    the local shards."""
    return torch.optim.AdamW(params, **adamw_kwargs(run, device))


def fsdp_groups(model: nn.Module) -> list:
    """The modules (or lists of modules) FSDP2 wraps before the root, in forward order."""
    groups = []
    emb = [m for m in (getattr(model, "tok_emb", None), getattr(model, "pos_emb", None)) if m is not None]
    if emb:
        groups.append(emb)
    groups.extend(getattr(model, "blocks", []))
    tail = [m for m in (getattr(model, "ln_f", None), getattr(model, "head", None)) if m is not None]
    if tail:
        groups.append(tail)
    return groups


def mixed_precision_policy(precision: str, device: torch.device):
    """bf16 compute with fp32 reduction and fp32 master shards on GPU; None (pure fp32) otherwise."""
    if precision != "bf16" or device.type != "cuda":
        return None
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


def apply_fsdp(model: nn.Module, mesh, reshard_after_forward: bool, mp_policy=None) -> nn.Module:
    """fully_shard every group of fsdp_groups(model), then the root."""
    from torch.distributed.fsdp import fully_shard

    kw = {"mesh": mesh, "reshard_after_forward": reshard_after_forward}
    if mp_policy is not None:
        kw["mp_policy"] = mp_policy
    for group in fsdp_groups(model):
        fully_shard(group, **kw)
    fully_shard(model, **kw)
    return model


def apply_replicate(model: nn.Module, mesh) -> nn.Module:
    """DDP semantics for DTensor (tensor-parallel) parameters: replicate over the dp mesh."""
    from torch.distributed._composable.replicate_with_fsdp import replicate

    for group in fsdp_groups(model):
        replicate(group, mesh=mesh)
    replicate(model, mesh=mesh)
    return model


def apply_data_parallel(model: nn.Module, run: RunConfig, ctx: DistContext):
    """(model, optimizer, implementation name) for `parallel.zero` over the data-parallel ranks."""
    stage = run.parallel.zero
    if not ctx.dims.dp_enabled:
        name = "single process" if stage == 0 else f"single process (ZeRO-{stage} needs more than one " \
                                                    f"data-parallel rank; nothing to shard)"
        if ctx.dims.tp_enabled:
            name = "none (tensor parallel only)"
        return model, make_adamw(model.parameters(), run, ctx.device), name
    dp_mesh = ctx.mesh["dp"]
    if ctx.dims.tp_enabled:
        if stage:
            raise ValueError("ZeRO stages 1-3 with tensor > 1 are not supported (config.py rejects them)")
        model = apply_replicate(model, dp_mesh)
        return model, make_adamw(model.parameters(), run, ctx.device), \
            "replicate_with_fsdp over dp (DDP semantics for DTensor params)"
    if stage in (0, 1):
        model = DDP(model, device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None,
                    process_group=ctx.dp_group, gradient_as_bucket_view=True)
        if stage == 0:
            return model, make_adamw(model.parameters(), run, ctx.device), STAGE_NAMES[0]
        from torch.distributed.optim import ZeroRedundancyOptimizer

        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW,
                                      process_group=ctx.dp_group, **adamw_kwargs(run, ctx.device))
        return model, opt, STAGE_NAMES[1]
    mp = mixed_precision_policy(resolve_precision(run.train.precision, ctx.device), ctx.device)
    model = apply_fsdp(model, dp_mesh, reshard_after_forward=stage == 3, mp_policy=mp)
    name = STAGE_NAMES[stage] + (" + MixedPrecisionPolicy(bf16 params, fp32 reduce)" if mp else "")
    return model, make_adamw(model.parameters(), run, ctx.device), name
