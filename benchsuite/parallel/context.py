"""Context parallelism: the sequence split over c ranks, attention over the shards by an all-gather of K/V.

The all-gather variant (Llama 3's context parallelism; Megatron's "all-gather" CP): a context-parallel group
of c ranks trains on c·b sequences (each rank's b, layout.py), each rank holding two of the 2c equal chunks
of every sequence, chunks j and 2c − 1 − j (shard_positions: the load balancing of Megatron and torchtitan,
so each rank has as much causal attention work), so a rank still holds b·T tokens. Everything but attention
is position-wise and runs on the shard as it is. Attention all-gathers the keys and values of the group
along the sequence (its backward reduce-scatters their gradients to the shards' owners) and runs the rank's
queries against all of them under a causal mask by global position: a query at position p sees the keys at
0..p. The rotary tables and a learned position table are read at the shard's positions; the gathered K/V
are what a rank holds in full. The gathers are parallel/collectives.py's RankGroup moves (SequenceShard is
one), and the shard's positions, orders and causal mask are built once per local length and device
(SequenceShard.layout), not on every layer's call.

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

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from benchsuite.models.transformer import AttentionCore, Rope
from benchsuite.parallel.collectives import RankGroup


@dataclass(frozen=True)
class ShardLayout:
    """Where a shard's tokens sit in the sequence, for one local length: built once (SequenceShard.layout)."""

    positions: torch.Tensor  # [T/c]: the global positions of the rank's tokens (shard_positions)
    natural_order: torch.Tensor  # [T]: puts the shards' tokens, gathered in rank order, in sequence order
    rank_order: torch.Tensor  # [T]: its inverse, sequence order back to the shards' rank order
    causal_mask: torch.Tensor  # [T/c, T] bool: a key (in rank order) at or before the query's position


@dataclass(frozen=True)
class SequenceShard(RankGroup):
    """This rank's place in its context-parallel group: shard `rank` of `size` over `group`; its K/V and MoE
    gathers run on RankGroup's moves (parallel/collectives.py)."""

    _layouts: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def layout(self, local_len: int, device: torch.device) -> ShardLayout:
        """The shard's positions, orders and causal mask for local_len tokens a sequence on `device`, built on
        first use and kept for every later call (a boolean mask and integer indices: no dtype to key on)."""
        key = (local_len, torch.device(device))
        if key not in self._layouts:
            with torch.inference_mode(False):  # a cached tensor must serve later training steps too
                self._layouts[key] = self._build_layout(local_len, key[1])
        return self._layouts[key]

    def _build_layout(self, local_len: int, device: torch.device) -> ShardLayout:
        seq_len = local_len * self.size
        positions = shard_positions(self.rank, self.size, seq_len, device)
        keys = torch.cat([shard_positions(r, self.size, seq_len, device) for r in range(self.size)])
        natural_order = torch.argsort(keys)
        return ShardLayout(positions, natural_order, torch.argsort(natural_order), keys <= positions.unsqueeze(1))


def shard_positions(rank: int, size: int, seq_len: int, device: torch.device | None = None) -> torch.Tensor:
    """The positions shard `rank` of `size` holds of a sequence of seq_len: chunks rank and 2·size − 1 − rank
    of its 2·size equal chunks, so every shard has as much causal attention work (module docstring)."""
    chunk = seq_len // (2 * size)
    first, second = rank * chunk, (2 * size - 1 - rank) * chunk
    return torch.cat([torch.arange(first, first + chunk, device=device),
                      torch.arange(second, second + chunk, device=device)])


class ContextParallelCore(nn.Module):
    """softmax(Q·Kᵀ/√D)·V of the rank's queries against the group's keys and values: q [B, heads, T/c, D],
    k and v [B, G, T/c, D] -> [B, heads, T/c, D], causal over global positions."""

    def __init__(self, core: AttentionCore, shard: SequenceShard):
        super().__init__()
        self.grouped, self.shard = core.grouped, shard

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        local = q.shape[2]
        sizes = [local] * self.shard.size  # every rank's queries use every shard: gradients summed back
        k, v = self.shard.gather_partial(k, sizes, 2), self.shard.gather_partial(v, sizes, 2)  # keys in rank order
        mask = self.shard.layout(local, q.device).causal_mask
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=self.grouped)


class ShardRotary(nn.Module):
    """The rotary tables at the shard's positions (the model asks for its local length)."""

    def __init__(self, tables: nn.Module, shard: SequenceShard):
        super().__init__()
        self.tables, self.shard = tables, shard

    def forward(self, seq_len: int) -> Rope:
        full = self.tables(seq_len * self.shard.size)
        at = self.shard.layout(seq_len, full.cos.device).positions
        return Rope(full.cos[at], full.sin[at])


def _shift_positions(shard: SequenceShard):
    """A forward pre-hook on the learned position table: the ids 0..T/c-1 the model asks for become the
    shard's positions."""
    def hook(module, args):
        (ids,) = args
        return (shard.layout(ids.shape[0], ids.device).positions[ids],)
    return hook


def _gather_moe_input(shard: SequenceShard):
    """The layer's input gathered and put in sequence order: routing and capacity take tokens in order."""
    def hook(module, args):
        (x,) = args
        whole = shard.gather(x, x.shape[1] * shard.size, 1, grad_times=shard.size)  # backward: c × its own slice
        return (whole.index_select(1, shard.layout(x.shape[1], x.device).natural_order),)
    return hook


def _slice_moe_output(shard: SequenceShard):
    def hook(module, args, output):
        y, aux, stats = output
        in_rank_order = y.index_select(1, shard.layout(y.shape[1] // shard.size, y.device).rank_order)
        return shard.take(in_rank_order, 1, grad_over=shard.size), aux, stats  # backward: gathered, over c
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
