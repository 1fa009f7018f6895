"""Expert parallelism: each rank of an expert-parallel group of size P holds E/P experts.

Every rank routes its own tokens with the full, replicated router, exactly like the
single-process MoELayer on those rank-local tokens: capacity C is computed from the
local token count, so drops and padding are per rank. The [E, C, H] slot buffer is
then exchanged with one all_to_all_single: rank r sends experts [j*E/P, (j+1)*E/P)
to rank j. Splits are equal and static (every rank has the same local batch shape,
hence the same C), so no size exchange and no host sync are needed. A second
all_to_all returns the outputs to the rank that owns the tokens, which combines them.

Dropless layers (capacity_factor = 0) send no slots but their rows sorted by expert, as
many per expert as were routed there: the splits vary per rank and step. forward_sorted
exchanges the per-expert counts first, then the rows with uneven splits (the sizes read
on the host once per layer call, see there), and the outputs come back the same way.

Routing happens before the exchange, on each rank's own tokens with the replicated router, so
forced routing (moe.routing) gives every expert exactly its share of each rank's tokens, and
aux-free balancing's expert bias (a buffer of the replicated MoELayer) stays the same on every
rank through models/moe.py's update_expert_bias, which sums the load over the data-parallel
ranks, expert-parallel ones included.

Gradients. Non-expert parameters (router included) stay replicated: the DDP wrapper
averages them over all data-parallel ranks. Expert parameters are left out of DDP:
ignore_expert_params_in_ddp sets `model._ddp_params_and_buffers_to_ignore` through
DDP's own helper (apply_expert_parallel calls it; call it again if a wrapper renames
parameters). After backward, an expert shard's gradient is the sum over the P ranks
of its EP group of d(local loss)/dw. sync_expert_grads turns that into the gradient
of the mean loss over all D data-parallel ranks: sum over the replicas of the same
shard (the expert-data-parallel group, present when D > P), then divide by D. Call
it after the last backward of a step, before the optimizer. Under ZeRO-2/3 the experts get
their own fully_shard on the expert-data-parallel mesh instead (parallel/zero.py), which does the same
sum and division; replicate_with_fsdp leaves them out, as DDP does.

Folding over tensor parallelism (layout.py): with tensor > 1 the ranks of a tensor-parallel group route
the same tokens (the residual stream is replicated) and may sit in one expert-parallel group (with
context parallelism, the context x tensor ranks of a gathered sequence: parallel/context.py). Each then
dispatches only its 1/t share of the routed work, Megatron's scatter to and gather from the sequence-
parallel region applied to the slots: the capacity slots c in its chunk of ceil(C/t) (padded to that size,
so every rank's exchange has one shape), or its chunk of the A sorted rows (dropless). After the return
exchange the t shares are all-gathered over the tensor-parallel group, so each rank combines every slot
as the single-process layer does. The gather's backward keeps the rank's own chunk of the (replicated)
gradient, the scatter's all-gathers the chunks' input gradients: every expert row runs once, forward and
backward, and the router, the combine and the layer's input gradient stay replicated. The all-gather
moves (t−1)/t of the [E, C, H] slots (or [A, H] rows) per rank in forward and in backward.

Expert tensor parallelism (layout.py's etp; Megatron-Core's expert_tensor_parallel_size): each rank holds
its E/P experts' FFN columns 1/etp, w_up and w_gate split by columns, w_down by rows (Megatron's
column- and row-parallel expert linears). After the dispatch all-to-all the etp ranks of an expert-tensor
group all-gather the rows they received (each received different rows, from its own expert-parallel
group), every rank runs all of them through its columns, and a reduce-scatter sums the partial outputs and
returns each rank its own rows before the return all-to-all: Megatron's gather_from_sequence_parallel_region
and reduce_scatter_to_sequence_parallel_region around its experts. Backward is the conjugate pair: the
gather's backward reduce-scatters, the reduce-scatter's all-gathers. Dropless rows differ in number per
rank: every rank's rows per local expert travel with the all-to-all's counts (one host read still), the
gather pads each rank's rows to the largest and the gathered rows are regrouped by local expert. Per MoE
layer and microbatch a rank sends (etp−1) × its received rows in each of the four collectives
(metrics/comm.py: expert_tensor_bytes).

The fold and expert tensor parallelism move rows with parallel/collectives.py's RankGroup: take (the fold's
scatter), gather (its gather), gather_partial and sum_scatter (expert tensor parallelism's pair).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from benchsuite.device import synchronize
from benchsuite.parallel.collectives import Move, RankGroup, chunk_of, move_rows
from benchsuite.models.moe import Experts, moe_layers


class AllToAllMeter:
    """One MoE layer's all-to-all figures: seconds (only while `timing`: the device is
    synchronised before and after each collective, so the time includes waiting for slower
    ranks) and the bytes the variable-split exchanges sent to other ranks, per training step.

    Only the variable-split (dropless) exchange counts bytes: its sizes change every step. A
    fixed-split exchange sends the same capacity-slot buffer every step (metrics/comm.py's
    counted step has it), and a counter inside its autograd Function would break a compiled
    block's graph, which the dropless path breaks anyway at its host read of the sizes."""

    def __init__(self, timing: bool):
        self.timing = timing
        self.seconds = 0.0
        self.step_bytes = 0  # sent so far in the current step
        self.bytes_by_step: list[int] = []  # one entry per end_step

    def run(self, fn, device: torch.device) -> None:
        if not self.timing:
            fn()
            return
        synchronize(device)
        start = time.perf_counter()
        fn()
        synchronize(device)
        self.seconds += time.perf_counter() - start

    def end_step(self) -> None:
        self.bytes_by_step.append(self.step_bytes)
        self.step_bytes = 0


@dataclass(frozen=True)
class Exchange:
    """Where an all-to-all runs: the expert-parallel group, this rank's place in it, its meter;
    count_bytes off for exchanges that are no training step's (evaluation)."""

    group: object
    rank: int
    meter: AllToAllMeter
    count_bytes: bool = True
    alone: bool = False  # one rank, the experts split by expert tensor parallelism alone: nothing to send


def _all_to_all(x: torch.Tensor, ex: Exchange, send: list[int] | None = None,
                recv: list[int] | None = None) -> torch.Tensor:
    """Rows of x go out in rank order, send[j] of them to rank j; the result holds recv[i] rows
    from rank i, in rank order. send = recv = None: equal splits of dim 0 (x [P, ...])."""
    x = x.contiguous()
    if ex.alone:
        return x.clone()
    out = torch.empty_like(x) if recv is None else x.new_empty((sum(recv), *x.shape[1:]))
    ex.meter.run(lambda: dist.all_to_all_single(out, x, recv, send, group=ex.group), x.device)
    if send is not None and ex.count_bytes:
        row_bytes = math.prod(x.shape[1:]) * x.element_size()
        ex.meter.step_bytes += (sum(send) - send[ex.rank]) * row_bytes  # rows kept on this rank cross no link
    return out


class _AllToAll(torch.autograd.Function):
    """all-to-all (equal splits, or send/recv row counts); its backward is the reverse exchange:
    the gradient rows go back with the splits swapped (for equal splits, the same exchange)."""

    @staticmethod
    def forward(ctx, x, ex, send, recv):
        ctx.ex, ctx.send, ctx.recv = ex, send, recv
        return _all_to_all(x, ex, send, recv)

    @staticmethod
    def backward(ctx, grad):
        return _all_to_all(grad, ctx.ex, ctx.recv, ctx.send), None, None, None


def _transpose_segments(rows: torch.Tensor, sizes: list[int], outer: int, inner: int) -> torch.Tensor:
    """rows in outer x inner segments (segment (a, b) has sizes[a * inner + b] rows, in a-major
    order) -> the same segments in b-major order. Autograd's split/cat: no host read."""
    parts = rows.split(sizes)
    return torch.cat([parts[a * inner + b] for b in range(inner) for a in range(outer)])


class ExpertParallelExperts(Experts):
    """The rank's contiguous shard of E/P experts, fed by all-to-all, with expert tensor parallelism its
    1/etp of their FFN columns. Parameter names and layout match Experts (w_up [E/P, H, F/etp], w_down
    [E/P, F/etp, H], ...), so names stay `...experts.w_up`."""

    def __init__(self, full: Experts, group, timing: bool = False, split: RankGroup | None = None,
                 width_split: RankGroup | None = None):
        nn.Module.__init__(self)  # not Experts.__init__: its random init would be thrown away and move the RNG
        self.world = dist.get_world_size(group)
        experts, ffn = full.w_up.shape[0], full.w_up.shape[2]
        if experts % self.world:
            raise ValueError(f"expert-parallel size {self.world} must divide experts ({experts})")
        parts = width_split.size if width_split is not None else 1
        if ffn % parts:
            raise ValueError(f"expert-tensor-parallel size {parts} must divide the experts' FFN width ({ffn})")
        self.local = experts // self.world
        rank = dist.get_rank(group)
        start = rank * self.local
        width, column_rank = ffn // parts, width_split.rank if width_split is not None else 0
        cols = slice(column_rank * width, (column_rank + 1) * width)
        for name, p in full.named_parameters():
            shard = p.detach()[start:start + self.local]
            shard = shard[:, cols] if name == "w_down" else shard[:, :, cols]  # row- / column-parallel
            setattr(self, name, nn.Parameter(shard.clone()))
        if full.w_gate is None:
            self.w_gate = None
        self.meter = AllToAllMeter(timing)
        self.exchange = Exchange(group, rank, self.meter, alone=self.world == 1 and width_split is not None)
        self.split = split  # the ranks sharing their routed work (folding), or None
        self.width_split = width_split  # the expert-tensor-parallel ranks, or None

    def forward(self, xs: torch.Tensor, valid: torch.Tensor, impl: str) -> torch.Tensor:
        """xs [E, C, H] slots of this rank's tokens for all experts -> [E, C, H] outputs."""
        if self.split is None:
            return self._exchange_slots(xs, valid, impl)
        c = xs.shape[1]
        size, start, stop = chunk_of(c, self.split.size, self.split.rank)
        pad = size - (stop - start)  # every rank's exchange has one shape
        mine = F.pad(self.split.take(xs, 1), (0, 0, 0, pad))
        ys = self._exchange_slots(mine, F.pad(valid[:, start:stop], (0, pad)), impl)
        return self.split.gather(ys[:, :stop - start], c, 1)

    def _exchange_slots(self, xs: torch.Tensor, valid: torch.Tensor, impl: str) -> torch.Tensor:
        e, c, h = xs.shape
        p, le = self.world, self.local
        recv = _AllToAll.apply(xs, self.exchange, None, None).view(p, le, c, h)  # [P src, E/P, C, H]
        local = recv.transpose(0, 1).reshape(le, p * c, h)  # [E/P, P*C, H]
        local_valid = None
        if impl == "grouped_mm":  # only this path needs to know which received slots are filled
            got = _all_to_all(valid.view(p, le, c).to(torch.uint8), self.exchange)
            local_valid = got.transpose(0, 1).reshape(le, p * c)
        ys = self._slot_experts(local, local_valid, impl)  # [E/P, P*C, H]
        back = ys.view(le, p, c, h).transpose(0, 1).reshape(e, c, h)  # [P dst, E/P, C, H] as rows
        return _AllToAll.apply(back, self.exchange, None, None)  # a fresh tensor: FSDP2 hooks the output

    def _slot_experts(self, local: torch.Tensor, valid: torch.Tensor | None, impl: str) -> torch.Tensor:
        """The shard's experts on its received slots local [E/P, M, H] (valid [E/P, M] uint8, grouped_mm only);
        with expert tensor parallelism on the group's gathered slots, each rank's partial output summed back
        to the slots' owner (module docstring)."""
        ranks, (le, m, _) = self.width_split, local.shape
        sizes = [m] * (ranks.size if ranks is not None else 1)
        if ranks is not None:
            local = ranks.gather_partial(local, sizes, 1)
            valid = move_rows(valid, Move.GATHER, sizes, 1, ranks) if valid is not None else None
        filled = valid.bool() if valid is not None else local.new_ones(local.shape[:2], dtype=torch.bool)
        ys = super().forward(local, filled, impl)
        return ranks.sum_scatter(ys, sizes, 1) if ranks is not None else ys

    def forward_sorted(self, x: torch.Tensor, counts: torch.Tensor, impl: str) -> torch.Tensor:
        """x [A, H] this rank's rows sorted by expert, counts [E] int64 -> [A, H] (dropless); folded over
        tensor parallelism, the rank's chunk of the rows only (module docstring)."""
        if self.split is None:
            return self._exchange_sorted(x, counts, impl)
        a = x.shape[0]
        _, start, stop = chunk_of(a, self.split.size, self.split.rank)
        ends = counts.cumsum(0)
        mine = ends.clamp(start, stop) - (ends - counts).clamp(start, stop)  # [E] rows of each expert in the chunk
        return self.split.gather(self._exchange_sorted(self.split.take(x, 0), mine, impl), a, 0)

    def _exchange_sorted(self, x: torch.Tensor, counts: torch.Tensor, impl: str) -> torch.Tensor:
        """The exchange of rows sorted by expert:

        1. A small equal-split all-to-all of counts: from rank i, got[i, l] rows for local expert l
           (with expert tensor parallelism all-gathered over the expert-tensor group: every rank's).
        2. The host read: the uneven exchange's split sizes must be Python ints (all_to_all_single
           takes int lists, NCCL posts each send and receive with its size, and the receive buffer
           is allocated before it), so one .tolist() of [counts, got] is the forward's one
           unavoidable device sync. The backward reuses these lists: no sync there.
        3. all_to_all_single with uneven splits: rank j gets this rank's rows of its experts.
        4. Regroup the received rows (by source, then local expert) by local expert, sources in
           rank order, and run the shard's experts on them (_sorted_experts).
        5. Undo the regrouping and send every row back (the reverse exchange, splits swapped).
        """
        p, le, ranks = self.world, self.local, self.width_split
        got = _all_to_all(counts.view(p, le), self.exchange)  # [P src, E/P]
        if ranks is not None:  # [etp·P, E/P]: every expert-tensor rank's, rank-major
            got = move_rows(got, Move.GATHER, [p] * ranks.size, 0, ranks)
        sizes = torch.cat([counts, got.reshape(-1)]).tolist()  # the host read (2.)
        received = sizes[p * le:]  # rows per (expert-tensor rank, source, local expert)
        mine = ranks.rank if ranks is not None else 0
        from_src = received[mine * p * le:(mine + 1) * p * le]  # this rank's, source-major
        send = [sum(sizes[j * le:(j + 1) * le]) for j in range(p)]
        recv = [sum(from_src[i * le:(i + 1) * le]) for i in range(p)]
        ex = self.exchange if self.training else replace(self.exchange, count_bytes=False)
        rows = _AllToAll.apply(x, ex, send, recv)  # [R, H] by source, then local expert
        by_expert = _transpose_segments(rows, from_src, p, le)  # by local expert, then source
        by_expert_sizes = [from_src[i * le + l] for l in range(le) for i in range(p)]
        local_sizes = [sum(by_expert_sizes[l * p:(l + 1) * p]) for l in range(le)]  # rows per local expert
        ys = self._sorted_experts(by_expert, local_sizes, received, got, impl)
        back = _transpose_segments(ys, by_expert_sizes, le, p)  # by source again
        return _AllToAll.apply(back, ex, recv, send)

    def _sorted_experts(self, rows: torch.Tensor, local_sizes: list[int], received: list[int], got: torch.Tensor,
                        impl: str) -> torch.Tensor:
        """The shard's experts on its received rows [R, H], sorted by local expert (local_sizes rows each); with
        expert tensor parallelism on the group's gathered rows, regrouped by local expert, each rank's partial
        output summed back to the rows' owner (module docstring). received: rows per (expert-tensor rank,
        source, local expert); got: the same on the device, for the grouped GEMM's group ends."""
        ranks, p, le = self.width_split, self.world, self.local
        if ranks is None:
            return super().forward_sorted(rows, got.sum(0), impl, local_sizes)  # sizes known: no second read
        per_rank = [[sum(received[(a * p + i) * le + l] for i in range(p)) for l in range(le)]
                    for a in range(ranks.size)]  # rows per (expert-tensor rank, local expert)
        totals = [sum(r) for r in per_rank]
        gathered = ranks.gather_partial(rows, totals, 0)  # by expert-tensor rank, then local expert
        by_rank = [n for r in per_rank for n in r]
        by_expert = _transpose_segments(gathered, by_rank, ranks.size, le)
        expert_sizes = [sum(r[l] for r in per_rank) for l in range(le)]
        ys = super().forward_sorted(by_expert, got.sum(0), impl, expert_sizes)
        back = _transpose_segments(ys, [r[l] for l in range(le) for r in per_rank], le, ranks.size)
        return ranks.sum_scatter(back, totals, 0)


def apply_expert_parallel(model: nn.Module, ep_group=None, timing: bool = False, sharing_group=None,
                          etp_group=None) -> list[str]:
    """Shard the experts of every MoELayer over ep_group (default: the world) and return
    the expert parameter names, already registered with DDP as ignored. Every rank must
    have built the model with the same seed: the shards are slices of the same global init.
    sharing_group: the ranks that route the same tokens (RankGroup; None: this rank alone);
    etp_group: the expert-tensor-parallel ranks that split each expert's FFN width (None: whole)."""
    group = ep_group if ep_group is not None else dist.group.WORLD
    split, width_split = RankGroup.of(sharing_group), RankGroup.of(etp_group)
    for layer in moe_layers(model):
        layer.experts = ExpertParallelExperts(layer.experts, group, timing, split, width_split)
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
    """Make expert gradients those of the mean loss over data_parallel_size batches (what DDP
    gives the other parameters; with context parallelism a context-parallel group's ranks share one
    batch: layout.ParallelDims.dp_batches): sum over the shard's replicas, then divide. With one owner
    per shard pass expert_dp_group=None."""
    for p in expert_parameters(model):
        if p.grad is None:
            continue
        if expert_dp_group is not None and dist.get_world_size(expert_dp_group) > 1:
            dist.all_reduce(p.grad, group=expert_dp_group)
        p.grad.div_(data_parallel_size)


def _meters(model: nn.Module) -> list[AllToAllMeter]:
    return [m.meter for m in model.modules() if isinstance(m, ExpertParallelExperts)]


def set_all_to_all_timing(model: nn.Module, enabled: bool) -> None:
    """Switch the synchronised all-to-all timers on or off (off while steps are measured)."""
    for meter in _meters(model):
        meter.timing = enabled


def all_to_all_seconds(model: nn.Module, reset: bool = False) -> float:
    """Seconds measured in all-to-all (forward and backward) over all MoE layers (timing=True)."""
    total = 0.0
    for meter in _meters(model):
        total += meter.seconds
        if reset:
            meter.seconds = 0.0
    return total


def end_all_to_all_step(model: nn.Module) -> None:
    """Close a training step's byte count (a grad hook: once per step, after the last backward)."""
    for meter in _meters(model):
        meter.end_step()


def all_to_all_bytes_by_step(model: nn.Module, last: int) -> list[int] | None:
    """Bytes the variable-split exchanges of all MoE layers sent to other ranks, forward and
    backward, in each of the `last` closed training steps. None without a dropless layer: fixed
    splits send the same capacity slots every step (metrics/comm.py's counted step)."""
    if not any(layer.moe.dropless for layer in moe_layers(model)):
        return None
    per_step = [sum(step) for step in zip(*(meter.bytes_by_step for meter in _meters(model)))]
    return per_step[-last:]
