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
A tied LM head is the token embedding's parameter, which FSDP2 holds in one group: embeddings, final
norm and head are then one group, gathered from the embedding's forward to the head's.

Precision (`PrecisionPolicy`, in the record as metrics.precision_policy): the same in every stage
and on every device, so a stage comparison changes the stage alone. Parameters, gradients and
their reduction are fp32 (FSDP2 gets no MixedPrecisionPolicy: it gathers the fp32 parameters
DDP holds); bf16 compute is the worker's autocast around the forward, which casts each matmul's
operands and leaves the residual stream (embedding output, residual adds) in fp32. A bf16
param_dtype would gather half the bytes, but its bf16 embedding output would carry the residual
stream in bf16 through the blocks, a precision change hidden in a stage change.

Tensor parallel × data parallel: torch's DDP refuses DTensor parameters ("got mixed torch.Tensor
and DTensor" while broadcasting module states, torch 2.13), so with tensor > 1 the data-parallel
wrapper is ``torch.distributed._composable.replicate_with_fsdp.replicate`` over the "dp" mesh
dimension: FSDP2's machinery with a replicate-only mesh, i.e. DDP semantics (full parameters per
dp rank, gradients all-reduced and averaged over dp) that understands 2-D DTensors.

Expert parallelism (torchtitan's layout), and expert tensor parallelism beside or without it: under ZeRO-2/3
each MoE layer's expert shard is wrapped first, fully_shard on its own expert-data-parallel mesh of edp > 1
ranks (the ranks holding the same expert shards, layout.ParallelDims.edp = dp·tp / (ep·etp)). Its gradient,
already summed over the expert-parallel and expert-tensor groups by the all-to-all's and the gather's
backward, is summed over that mesh and divided by the stage's distinct batches (set_gradient_divide_factor:
the data-parallel degree, over the context-parallel one), so it is the gradient of the mean loss, as the
dense parameters' is; the
block's fully_shard on the dp mesh then leaves the wrapped experts alone. The wrappers that replicate
(DDP, replicate_with_fsdp), and ZeRO-2/3 where each expert shard has one holder (edp = 1: nothing to
shard), leave the expert shards out (DDP's ignore list, the ignored_params of replicate and fully_shard)
and parallel/expert.py's sync_expert_grads reduces them after the step's last backward.

ZeRO-2/3 × tensor parallel and × pipeline: fully_shard over the "dp" mesh dimension takes the tensor-parallel
DTensor parameters as they are and shards them further over dp (FSDP2's 2-D layout, as torchtitan's); a
pipeline shards each of its stages, whose last microbatch's backward the pipeline stage lets reduce.

Which wrapper a layout gets is the layout's answer (layout.ParallelDims.data_parallel); this module
applies it.
"""

from __future__ import annotations

import sys
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from benchsuite.config import TrainConfig
from benchsuite.layout import DP, EDP, DataParallel, ParallelDims
from benchsuite.record.types import PrecisionPolicy

WRAPPER_NAMES = {  # Applied.data: the data-parallel wrapper, by name, in the record
    DataParallel.DDP: "DistributedDataParallel",
    DataParallel.ZERO1: "ZeroRedundancyOptimizer(AdamW) + DistributedDataParallel",
    DataParallel.FSDP_STAGE2: "FSDP2 fully_shard(reshard_after_forward=False)",
    DataParallel.FSDP_STAGE3: "FSDP2 fully_shard(reshard_after_forward=True)",
    DataParallel.REPLICATE: "replicate_with_fsdp over dp (DDP semantics for DTensor params)",
}


def precision_policy(precision: str) -> PrecisionPolicy:
    """What apply_data_parallel and the worker's autocast give a run of compute `precision`, any stage."""
    return PrecisionPolicy(params="fp32", forward_params="fp32", compute=precision, gradients="fp32",
                           residual="fp32")


def adamw_kwargs(train: TrainConfig) -> dict:
    """Fused on every device (torch has the kernel on CPU and CUDA alike), so the CPU tests run the
    optimizer path a GPU runs."""
    return {"lr": train.lr, "betas": (0.9, 0.95), "weight_decay": 0.1, "fused": True}


def dtensor_param_groups(params) -> list[dict]:
    """DTensor and plain parameters in separate groups. AdamW runs one fused kernel per group, and
    that kernel refuses a mix of the two ("got mixed torch.Tensor and DTensor"), which tensor
    parallel without data parallel gives: its sharded Linears are DTensors, the position embedding,
    norms and MoE layers stay plain. Groups keep the order of `params` within each kind. Without
    torch.distributed.tensor imported no parameter is a DTensor, and a run of one rank does not pay
    the import (about a quarter of a torch import)."""
    params = list(params)
    if "torch.distributed.tensor" not in sys.modules:
        return [{"params": params}] if params else []
    from torch.distributed.tensor import DTensor

    kinds = ([p for p in params if isinstance(p, DTensor)], [p for p in params if not isinstance(p, DTensor)])
    return [{"params": group} for group in kinds if group]


def make_adamw(params, train: TrainConfig) -> torch.optim.Optimizer:
    """Fused AdamW, one parameter group per tensor kind (dtensor_param_groups). FSDP2's sharded
    DTensor parameters go in as they are: the optimizer then only ever sees (and allocates state
    for) the local shards."""
    return torch.optim.AdamW(dtensor_param_groups(params), **adamw_kwargs(train))


def fsdp_groups(model: nn.Module) -> list:
    """The modules (or lists of modules) FSDP2 wraps before the root, in forward order; a tied LM head
    shares its group with the token embedding (module docstring)."""
    emb = [m for m in (getattr(model, "tok_emb", None), getattr(model, "pos_emb", None)) if m is not None]
    tail = [m for m in (getattr(model, "ln_f", None), getattr(model, "head", None)) if m is not None]
    blocks = list(getattr(model, "blocks", []))
    if emb and tail and model.head.weight is model.tok_emb.weight:
        return [emb + tail, *blocks]
    return ([emb] if emb else []) + blocks + ([tail] if tail else [])


def apply_fsdp(model: nn.Module, mesh, reshard_after_forward: bool, ignored: set | None = None) -> nn.Module:
    """fully_shard every group of fsdp_groups(model), then the root (fp32 throughout: see PrecisionPolicy);
    `ignored` parameters (expert shards held whole) left out."""
    from torch.distributed.fsdp import fully_shard

    kw = {"mesh": mesh, "reshard_after_forward": reshard_after_forward, "ignored_params": ignored}
    for group in fsdp_groups(model):
        fully_shard(group, **kw)
    fully_shard(model, **kw)
    return model


def apply_replicate(model: nn.Module, mesh, ignored: set | None = None) -> nn.Module:
    """DDP semantics for DTensor (tensor-parallel) parameters: replicate over the dp mesh; `ignored`
    parameters (expert shards) left out."""
    from torch.distributed._composable.replicate_with_fsdp import replicate

    for group in fsdp_groups(model):
        replicate(group, mesh=mesh, ignored_params=ignored)
    replicate(model, mesh=mesh, ignored_params=ignored)
    return model


def expert_shards(model: nn.Module) -> set:
    """The expert-parallel shards' parameters (none without expert parallelism)."""
    from benchsuite.parallel.expert import expert_parameters

    return set(expert_parameters(model))


def wrap_experts(model: nn.Module, dims: ParallelDims) -> None:
    """Each expert shard sharded on the expert-data-parallel mesh, gradients divided by dp (module docstring)."""
    from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method

    from benchsuite.parallel.expert import ExpertParallelExperts

    for experts in [m for m in model.modules() if isinstance(m, ExpertParallelExperts)]:
        fully_shard(experts, mesh=dims.ep_mesh[EDP],
                    reshard_after_forward=dims.data_parallel is DataParallel.FSDP_STAGE3)
        experts.set_gradient_divide_factor(float(dims.dp_batches))
        experts.set_force_sum_reduction_for_comms(True)  # sum, then divide: gloo has no pre-multiplied sum
        register_fsdp_forward_method(experts, "forward_sorted")  # the dropless path's entry


def wrap_data_parallel(model: nn.Module, dims: ParallelDims, device: torch.device) -> nn.Module:
    """`model` wrapped as dims.data_parallel says (the optimizer comes from build_optimizer)."""
    wrapper = dims.data_parallel
    if wrapper is DataParallel.NONE:
        return model
    if dims.experts_sharded:
        wrap_experts(model, dims)
    left_out = expert_shards(model) if dims.experts_split and not dims.experts_sharded else None
    if wrapper is DataParallel.REPLICATE:
        return apply_replicate(model, dims.mesh[DP], left_out)
    if wrapper in (DataParallel.DDP, DataParallel.ZERO1):
        return DDP(model, device_ids=[device.index] if device.type == "cuda" else None,
                   process_group=dims.group(DP), gradient_as_bucket_view=True)
    return apply_fsdp(model, dims.mesh[DP], reshard_after_forward=wrapper is DataParallel.FSDP_STAGE3,
                      ignored=left_out)


def single_rank_name(dims: ParallelDims) -> str:
    """Applied.data of a layout with one data-parallel rank (no pipeline)."""
    if dims.tp_enabled:
        return "none (tensor parallel only)"
    if dims.zero == 0:
        return "single process"
    return f"single process (ZeRO-{dims.zero} needs more than one data-parallel rank; nothing to shard)"


def apply_data_parallel(model: nn.Module, *, dims: ParallelDims, device: torch.device) -> tuple[nn.Module, str]:
    """(model, implementation name) for the data-parallel wrapper of dims (no pipeline)."""
    name = single_rank_name(dims) if dims.data_parallel is DataParallel.NONE else WRAPPER_NAMES[dims.data_parallel]
    return wrap_data_parallel(model, dims, device), name


def build_optimizer(model: nn.Module, *, train: TrainConfig, dims: ParallelDims) -> torch.optim.Optimizer:
    """AdamW over the wrapped model's parameters; ZeRO-1 partitions its state over the data-parallel
    ranks (ZeroRedundancyOptimizer), every other wrapper shards (FSDP2) or replicates it with the model."""
    if dims.data_parallel is DataParallel.ZERO1:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW,
                                       process_group=dims.group(DP), **adamw_kwargs(train))
    return make_adamw(model.parameters(), train)
