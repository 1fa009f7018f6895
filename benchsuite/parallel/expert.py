"""Expert parallelism: each rank of an expert-parallel group of size P holds E/P experts.

Every rank routes its own tokens with the full, replicated router, exactly like the
single-process MoELayer on those rank-local tokens: capacity C is computed from the
local token count, so drops and padding are per rank. The [E, C, H] slot buffer is
then exchanged with one all_to_all_single: rank r sends experts [j*E/P, (j+1)*E/P)
to rank j. Splits are equal and static (every rank has the same local batch shape,
hence the same C), so no size exchange and no host sync are needed. A second
all_to_all returns the outputs to the rank that owns the tokens, which combines them.

Gradients. Non-expert parameters (router included) stay replicated: the DDP wrapper
averages them over all data-parallel ranks. Expert parameters are left out of DDP:
ignore_expert_params_in_ddp sets `model._ddp_params_and_buffers_to_ignore` through
DDP's own helper (apply_expert_parallel calls it; call it again if a wrapper renames
parameters). After backward, an expert shard's gradient is the sum over the P ranks
of its EP group of d(local loss)/dw. sync_expert_grads turns that into the gradient
of the mean loss over all D data-parallel ranks: sum over the replicas of the same
shard (the expert-data-parallel group, present when D > P), then divide by D. Call
it after the last backward of a step, before the optimizer.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch import nn

from benchsuite.models.moe import Experts, moe_layers


class CollectiveTimer:
    """Seconds spent in all-to-all. With `enabled`, the device is synchronised before and
    after each collective, so the time includes waiting for slower ranks."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.seconds = 0.0

    def run(self, fn, device: torch.device) -> None:
        if not self.enabled:
            fn()
            return
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        self.seconds += time.perf_counter() - start


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _all_to_all(x: torch.Tensor, group, timer: CollectiveTimer) -> torch.Tensor:
    """x [P, ...]: chunk j goes to rank j; chunk i of the result came from rank i."""
    x = x.contiguous()
    out = torch.empty_like(x)
    timer.run(lambda: dist.all_to_all_single(out, x, group=group), x.device)
    return out


class _AllToAll(torch.autograd.Function):
    """Equal-split all-to-all; its backward is the reverse exchange, which for equal
    splits is the same all-to-all applied to the gradient."""

    @staticmethod
    def forward(ctx, x, group, timer):
        ctx.group, ctx.timer = group, timer
        return _all_to_all(x, group, timer)

    @staticmethod
    def backward(ctx, grad):
        return _all_to_all(grad, ctx.group, ctx.timer), None, None


class ExpertParallelExperts(Experts):
    """The rank's contiguous shard of E/P experts, fed by all-to-all. Parameter names and
    layout match Experts (w_up [E/P, H, F], ...), so names stay `...experts.w_up`."""

    def __init__(self, full: Experts, group, timing: bool = False):
        nn.Module.__init__(self)  # not Experts.__init__: its random init would be thrown away and move the RNG
        self.group = group
        self.world = dist.get_world_size(group)
        experts = full.w_up.shape[0]
        if experts % self.world:
            raise ValueError(f"expert-parallel size {self.world} must divide experts ({experts})")
        self.local = experts // self.world
        start = dist.get_rank(group) * self.local
        for name, p in full.named_parameters():
            setattr(self, name, nn.Parameter(p.detach()[start:start + self.local].clone()))
        if full.w_gate is None:
            self.w_gate = None
        self.timer = CollectiveTimer(timing)

    def forward(self, xs: torch.Tensor, valid: torch.Tensor, impl: str) -> torch.Tensor:
        """xs [E, C, H] slots of this rank's tokens for all experts -> [E, C, H] outputs."""
        e, c, h = xs.shape
        p, le = self.world, self.local
        recv = _AllToAll.apply(xs.view(p, le, c, h), self.group, self.timer)  # [P src, E/P, C, H]
        local = recv.transpose(0, 1).reshape(le, p * c, h)  # [E/P, P*C, H]
        local_valid = valid.new_ones(le, p * c)
        if impl == "grouped_mm":  # only this path needs to know which received slots are filled
            got = _all_to_all(valid.view(p, le, c).to(torch.uint8), self.group, self.timer)
            local_valid = got.transpose(0, 1).reshape(le, p * c).bool()
        ys = super().forward(local, local_valid, impl)  # [E/P, P*C, H]
        back = ys.view(le, p, c, h).transpose(0, 1)  # [P dst, E/P, C, H]
        return _AllToAll.apply(back, self.group, self.timer).view(e, c, h)


def apply_expert_parallel(model: nn.Module, ep_group=None, timing: bool = False) -> list[str]:
    """Shard the experts of every MoELayer over ep_group (default: the world) and return
    the expert parameter names, already registered with DDP as ignored. Every rank must
    have built the model with the same seed: the shards are slices of the same global init."""
    group = ep_group if ep_group is not None else dist.group.WORLD
    for layer in moe_layers(model):
        layer.experts = ExpertParallelExperts(layer.experts, group, timing)
    return ignore_expert_params_in_ddp(model)


def ignore_expert_params_in_ddp(model: nn.Module) -> list[str]:
    """Tell DDP (by name, through its own helper) to leave the expert shards alone; returns
    the names. DDP matches names, and a wrapper added later (checkpoint_wrapper) renames
    parameters: call this again on the final module just before wrapping it in DDP."""
    names = [f"{prefix}.{name}" for prefix, m in model.named_modules() if isinstance(m, ExpertParallelExperts)
             for name, _ in m.named_parameters()]
    torch.nn.parallel.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, names)
    return names


def expert_parameters(model: nn.Module) -> list[nn.Parameter]:
    return [p for m in model.modules() if isinstance(m, ExpertParallelExperts) for p in m.parameters()]


def sync_expert_grads(model: nn.Module, data_parallel_size: int, expert_dp_group=None) -> None:
    """Make expert gradients those of the mean loss over data_parallel_size ranks (what DDP
    gives the other parameters): sum over the shard's replicas, then divide. With world == P
    there is one owner per shard, so pass expert_dp_group=None."""
    for p in expert_parameters(model):
        if p.grad is None:
            continue
        if expert_dp_group is not None and dist.get_world_size(expert_dp_group) > 1:
            dist.all_reduce(p.grad, group=expert_dp_group)
        p.grad.div_(data_parallel_size)


def new_expert_groups(ep_size: int):
    """(ep_group, expert_dp_group) for this rank; all ranks must call it. EP groups are
    contiguous blocks of ep_size ranks; the expert-DP group links the ranks holding the
    same shard (rank % ep_size equal). expert_dp_group is None when world == ep_size."""
    world, rank = dist.get_world_size(), dist.get_rank()
    if world % ep_size:
        raise ValueError(f"expert-parallel size {ep_size} must divide world size {world}")
    mine = {}
    for start in range(0, world, ep_size):
        g = dist.new_group(list(range(start, start + ep_size)))
        if start <= rank < start + ep_size:
            mine["ep"] = g
    mine["dp"] = None
    if world > ep_size:
        for j in range(ep_size):
            g = dist.new_group(list(range(j, world, ep_size)))
            if rank % ep_size == j:
                mine["dp"] = g
    return mine["ep"], mine["dp"]


def set_all_to_all_timing(model: nn.Module, enabled: bool) -> None:
    """Switch the synchronised all-to-all timers on or off (off while steps are measured)."""
    for m in model.modules():
        if isinstance(m, ExpertParallelExperts):
            m.timer.enabled = enabled


def all_to_all_seconds(model: nn.Module, reset: bool = False) -> float:
    """Seconds measured in all-to-all (forward and backward) over all MoE layers (timing=True)."""
    total = 0.0
    for m in model.modules():
        if isinstance(m, ExpertParallelExperts):
            total += m.timer.seconds
            if reset:
                m.timer.seconds = 0.0
    return total
