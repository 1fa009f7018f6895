"""Context parallelism: the sequence split over c ranks, attention over the shards by an all-gather of K/V.

The all-gather variant (Llama 3's context parallelism; Megatron's "all-gather" CP): a context-parallel group
of c ranks trains on c·b sequences (each rank's b, layout.py), each rank holding two of the 2c equal chunks
of every sequence, chunks j and 2c − 1 − j (shard_positions: the load balancing of Megatron and torchtitan,
so each rank has as much causal attention work), so a rank still holds b·T tokens. Everything but attention
is position-wise and runs on the shard as it is. Attention all-gathers the keys and values of the group
along the sequence (its backward reduce-scatters their gradients to the shards' owners) and runs the rank's
queries against all of them under a causal mask by global position: a query at position p sees the keys at
0..p. The rotary tables and a learned position table are read at the shard's positions; the gathered K/V
are what a rank holds in full.

Gradients: each rank's loss is the mean over its own tokens, and the data-parallel wrapper averages over
the data-parallel ranks, context-parallel ones included (its group is every rank of a stage's dp), so the
step's gradient is that of the mean loss over all tokens: the gradients flowing between the shards (through
the K/V gather) are sums of the ranks' own losses, as data parallelism expects.

MoE layers route the group's whole sequence, as one rank would: their input is all-gathered over the
context-parallel group and put in sequence order (a capacity takes tokens in order), their output put back
in the shards' order and sliced (_gather_moe_input / _slice_moe_output), the layer's work
shared among the ranks that hold the same tokens (expert parallelism folded over them, parallel/expert.py).
Inside, each rank computes the group's mean loss: the gather's backward keeps c × the rank's own slice and
the slice's backward all-gathers the shards' gradients and divides by c, which converts between the two.

Bytes per rank and layer (fp32 activations under autocast's fp32 residual; K and V in the compute dtype):
forward all-gather of K and V, (c−1)·2·b_c·(T/c)·G·D values (b_c = c·b sequences), and their backward
reduce-scatter as many (metrics/comm.py: context_parallel_bytes).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from benchsuite.models.transformer import AttentionCore, Rope


@dataclass(frozen=True)
class SequenceShard:
    """This rank's place in its context-parallel group: shard `rank` of `size` over `group`."""

    group: object
    rank: int
    size: int

    def positions(self, local_len: int, device: torch.device | None = None) -> torch.Tensor:
        """The global positions of this rank's local_len tokens of each sequence (shard_positions)."""
        return shard_positions(self.rank, self.size, local_len * self.size, device)

    def natural_order(self, local_len: int, device: torch.device | None = None) -> torch.Tensor:
        """The index that puts the shards' tokens, gathered in rank order, back in sequence order."""
        gathered = torch.cat([shard_positions(r, self.size, local_len * self.size, device) for r in range(self.size)])
        return torch.argsort(gathered)


def shard_positions(rank: int, size: int, seq_len: int, device: torch.device | None = None) -> torch.Tensor:
    """The positions shard `rank` of `size` holds of a sequence of seq_len: chunks rank and 2·size − 1 − rank
    of its 2·size equal chunks, so every shard has as much causal attention work (module docstring)."""
    chunk = seq_len // (2 * size)
    first, second = rank * chunk, (2 * size - 1 - rank) * chunk
    return torch.cat([torch.arange(first, first + chunk, device=device),
                      torch.arange(second, second + chunk, device=device)])


def _all_gather_seq(x: torch.Tensor, shard: SequenceShard, dim: int) -> torch.Tensor:
    rows = x.movedim(dim, 0).contiguous()
    out = rows.new_empty((shard.size * rows.shape[0], *rows.shape[1:]))
    dist.all_gather_single(out, rows, group=shard.group)
    return out.movedim(0, dim).contiguous()


def _reduce_scatter_seq(x: torch.Tensor, shard: SequenceShard, dim: int) -> torch.Tensor:
    rows = x.movedim(dim, 0).contiguous()
    out = rows.new_empty((rows.shape[0] // shard.size, *rows.shape[1:]))
    dist.reduce_scatter_single(out, rows, group=shard.group)
    return out.movedim(0, dim).contiguous()


class _GatherKV(torch.autograd.Function):
    """All-gather along the sequence; backward: reduce-scatter (every rank's queries used every shard)."""

    @staticmethod
    def forward(ctx, x, shard, dim):
        ctx.shard, ctx.dim = shard, dim
        return _all_gather_seq(x, shard, dim)

    @staticmethod
    def backward(ctx, grad):
        return _reduce_scatter_seq(grad, ctx.shard, ctx.dim), None, None


class _GatherToMean(torch.autograd.Function):
    """All-gather along the sequence into a region where every rank computes the group's mean loss;
    backward: c × the rank's own slice (module docstring)."""

    @staticmethod
    def forward(ctx, x, shard, dim):
        ctx.shard, ctx.dim, ctx.local = shard, dim, x.shape[dim]
        return _all_gather_seq(x, shard, dim)

    @staticmethod
    def backward(ctx, grad):
        mine = grad.narrow(ctx.dim, ctx.shard.rank * ctx.local, ctx.local)
        return mine * ctx.shard.size, None, None


class _SliceFromMean(torch.autograd.Function):
    """The rank's slice of a tensor every rank of the group holds whole; backward: the shards' gradients
    all-gathered, divided by c (the mean loss inside the region)."""

    @staticmethod
    def forward(ctx, x, shard, dim):
        ctx.shard, ctx.dim = shard, dim
        local = x.shape[dim] // shard.size
        return x.narrow(dim, shard.rank * local, local).contiguous()

    @staticmethod
    def backward(ctx, grad):
        return _all_gather_seq(grad, ctx.shard, ctx.dim) / ctx.shard.size, None, None


class ContextParallelCore(nn.Module):
    """softmax(Q·Kᵀ/√D)·V of the rank's queries against the group's keys and values: q [B, heads, T/c, D],
    k and v [B, G, T/c, D] -> [B, heads, T/c, D], causal over global positions."""

    def __init__(self, core: AttentionCore, shard: SequenceShard):
        super().__init__()
        self.grouped, self.shard = core.grouped, shard

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        local = q.shape[2]
        k, v = _GatherKV.apply(k, self.shard, 2), _GatherKV.apply(v, self.shard, 2)  # keys in rank order
        rows = self.shard.positions(local, q.device)
        keys = torch.cat([shard_positions(r, self.shard.size, k.shape[2], q.device) for r in range(self.shard.size)])
        mask = keys <= rows.unsqueeze(1)  # [T/c, T]: a key at or before the query's position
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=self.grouped)


class ShardRotary(nn.Module):
    """The rotary tables at the shard's positions (the model asks for its local length)."""

    def __init__(self, tables: nn.Module, shard: SequenceShard):
        super().__init__()
        self.tables, self.shard = tables, shard

    def forward(self, seq_len: int) -> Rope:
        full = self.tables(seq_len * self.shard.size)
        at = self.shard.positions(seq_len, full.cos.device)
        return Rope(full.cos[at], full.sin[at])


def _shift_positions(shard: SequenceShard):
    """A forward pre-hook on the learned position table: the ids 0..T/c-1 the model asks for become the
    shard's positions."""
    def hook(module, args):
        (ids,) = args
        return (shard.positions(ids.shape[0], ids.device)[ids],)
    return hook


def _gather_moe_input(shard: SequenceShard):
    """The layer's input gathered and put in sequence order: routing and capacity take tokens in order."""
    def hook(module, args):
        (x,) = args
        return (_GatherToMean.apply(x, shard, 1).index_select(1, shard.natural_order(x.shape[1], x.device)),)
    return hook


def _slice_moe_output(shard: SequenceShard):
    def hook(module, args, output):
        y, aux, stats = output
        in_rank_order = torch.argsort(shard.natural_order(y.shape[1] // shard.size, y.device))
        return _SliceFromMean.apply(y.index_select(1, in_rank_order), shard, 1), aux, stats
    return hook


def apply_context_parallel(model: nn.Module, shard: SequenceShard) -> str:
    """Make `model` (its blocks still plain or tensor-parallel) run on the rank's sequence shard; returns
    the implementation name (module docstring)."""
    from benchsuite.models.moe import MoELayer

    for block in model.blocks:
        block.attn.core = ContextParallelCore(block.attn.core, shard)
        if isinstance(block.ffn, MoELayer):
            block.ffn.register_forward_pre_hook(_gather_moe_input(shard))
            block.ffn.register_forward_hook(_slice_moe_output(shard), prepend=True)  # before sequence parallel's
    if model.rope is not None:  # a pipeline's stages read the model's tables (parallel/pipeline.py)
        model.rope = ShardRotary(model.rope, shard)
    if model.pos_emb is not None:
        model.pos_emb.register_forward_pre_hook(_shift_positions(shard))
    return (f"context parallel over {shard.size} ranks: two mirrored chunks of each sequence per rank, K/V "
            f"all-gathered (reduce-scattered in backward), causal mask at the chunks' positions")
