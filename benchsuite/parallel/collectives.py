"""Rows moved between the ranks of a group, each move with its conjugate as backward: one mechanism for the
expert fold and expert tensor parallelism (parallel/expert.py) and context parallelism's K/V and MoE gathers
(parallel/context.py).

Rows in per-rank segments (segment i: sizes[i] rows along a dim, sizes uneven allowed) move over a rank group
in three ways (Move), each the backward of another: a rank's own segment of rows all hold (OWN), every segment
gathered (GATHER), and the ranks' partial tensors summed with each keeping its segment (SUM_SCATTER).
RankGroup's methods name the four pairs that run: take (OWN, its backward GATHER), gather (GATHER, OWN),
gather_partial (GATHER, SUM_SCATTER) and sum_scatter (SUM_SCATTER, GATHER). A move into or out of a region
where every rank computes the group's mean loss (context parallelism's MoE layers) scales its backward by the
group's size (take's and gather's grad_over and grad_times).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F


def chunk_of(n: int, parts: int, index: int) -> tuple[int, int, int]:
    """(chunk size ceil(n/parts), start, stop) of chunk `index` of n rows split into `parts`."""
    size = -(-n // parts)
    start = min(n, index * size)
    return size, start, min(n, start + size)


def chunk_sizes(n: int, parts: int) -> list[int]:
    """The rows of each of the `parts` chunks of n rows (chunk_of: ceil(n/parts) each, the last shorter or empty)."""
    return [stop - start for _, start, stop in (chunk_of(n, parts, i) for i in range(parts))]


class Move(enum.Enum):
    """How rows held in per-rank segments (segment i: sizes[i] rows along a dim) move over a rank group."""

    OWN = "own"  # every rank holds all segments: keep this rank's
    GATHER = "gather"  # each rank holds its segment: all-gather them, in rank order
    SUM_SCATTER = "sum_scatter"  # each rank holds a partial tensor of all segments: sum, keep this rank's


def move_rows(x: torch.Tensor, move: Move, sizes: list[int], dim: int, ranks: RankGroup) -> torch.Tensor:
    """x moved as `move` says; with uneven sizes the collectives pad each segment to the largest (every rank
    one shape), with even ones they send the rows as they are."""
    rows, width = x.movedim(dim, 0), max(sizes)
    even = min(sizes) == width
    start = sum(sizes[:ranks.rank])
    if move is Move.OWN:
        return rows[start:start + sizes[ranks.rank]].movedim(0, dim).contiguous()
    pad = (0, 0) * (rows.dim() - 1)
    if move is Move.GATHER:
        sent = (rows if even else F.pad(rows, pad + (0, width - rows.shape[0]))).contiguous()
        whole = sent.new_empty((ranks.size * width, *sent.shape[1:]))
        dist.all_gather_single(whole, sent, group=ranks.group)
        out = whole if even else torch.cat([whole[i * width:i * width + n] for i, n in enumerate(sizes)])
    else:
        sent = (rows if even else torch.cat([F.pad(seg, pad + (0, width - seg.shape[0]))
                                             for seg in rows.split(sizes)])).contiguous()
        mine = sent.new_empty((width, *sent.shape[1:]))
        dist.reduce_scatter_single(mine, sent, group=ranks.group)
        out = mine[:sizes[ranks.rank]]
    return out.movedim(0, dim).clone(memory_format=torch.contiguous_format)  # a fresh tensor, not a view


class _MoveRows(torch.autograd.Function):
    """One Move forward, its conjugate backward, times grad_times over grad_over (RankGroup's methods name the
    pairs)."""

    @staticmethod
    def forward(ctx, x, sizes, dim, ranks, forward_move, backward_move, grad_times=1, grad_over=1):
        ctx.sizes, ctx.dim, ctx.ranks, ctx.backward_move = sizes, dim, ranks, backward_move
        ctx.grad_times, ctx.grad_over = grad_times, grad_over
        return move_rows(x, forward_move, sizes, dim, ranks)

    @staticmethod
    def backward(ctx, grad):
        moved = move_rows(grad, ctx.backward_move, ctx.sizes, ctx.dim, ctx.ranks)
        if ctx.grad_times != 1:
            moved = moved * ctx.grad_times
        if ctx.grad_over != 1:
            moved = moved / ctx.grad_over
        return moved, None, None, None, None, None, None, None


@dataclass(frozen=True)
class RankGroup:
    """A process group and this rank's place in it: the ranks that route the same tokens and share the routed
    work (parallel/expert.py: folding), an expert-tensor-parallel group, or a context-parallel group
    (parallel/context.py's SequenceShard)."""

    group: object
    rank: int
    size: int

    @classmethod
    def of(cls, group) -> RankGroup | None:
        """The group and this rank's place in it; None for no group or a group of one rank (nothing to share)."""
        if group is None or dist.get_world_size(group) == 1:
            return None
        return cls(group, dist.get_rank(group), dist.get_world_size(group))

    def take(self, x: torch.Tensor, dim: int, grad_over: int = 1) -> torch.Tensor:
        """This rank's chunk (chunk_sizes) of x along dim, which every rank holds whole (the conjugate gathers
        the gradient, divided by grad_over)."""
        return _MoveRows.apply(x, chunk_sizes(x.shape[dim], self.size), dim, self, Move.OWN, Move.GATHER, 1,
                               grad_over)

    def gather(self, part: torch.Tensor, n: int, dim: int, grad_times: int = 1) -> torch.Tensor:
        """Every rank's chunk of n rows along dim, in rank order (the conjugate keeps its own gradient chunk,
        times grad_times)."""
        return _MoveRows.apply(part, chunk_sizes(n, self.size), dim, self, Move.GATHER, Move.OWN, grad_times)

    def gather_partial(self, part: torch.Tensor, sizes: list[int], dim: int) -> torch.Tensor:
        """Every rank's rows (sizes[i] of rank i) along dim, for a computation each rank does in part (its
        FFN columns, its queries): the conjugate sums the ranks' gradients of this rank's rows."""
        return _MoveRows.apply(part, sizes, dim, self, Move.GATHER, Move.SUM_SCATTER)

    def sum_scatter(self, partial: torch.Tensor, sizes: list[int], dim: int) -> torch.Tensor:
        """The ranks' partial results summed, this rank's rows kept (the conjugate gathers the gradient)."""
        return _MoveRows.apply(partial, sizes, dim, self, Move.SUM_SCATTER, Move.GATHER)
