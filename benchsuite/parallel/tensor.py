"""Megatron-LM tensor parallelism (Shoeybi et al. 2019) for the plain model of models/transformer.py.

Built on ``torch.distributed.tensor.parallel`` (DTensor), which runs on gloo and NCCL alike:

==========================  ===============================================  ===================
module                      style                                            Megatron name
==========================  ===============================================  ===================
tok_emb (nn.Embedding)      RowwiseParallel: weight Shard(0) over the vocab  VocabParallelEmbedding
                            out-of-range ids masked, partial sums all-reduced
pos_emb, norms              replicated (plain tensors, identical on every rank)
attn.qkv                    ColwiseParallel: whole key/value groups per rank ColumnParallelLinear
attn.q_norm / k_norm        SequenceParallel over the heads dimension:
(qk_norm = "per_head")      weight Replicate, gradient summed over ranks
attn.out                    RowwiseParallel                                  RowParallelLinear
ffn.up / ffn.gate           ColwiseParallel                                  ColumnParallelLinear
ffn.down                    RowwiseParallel                                  RowParallelLinear
head (LM head)              ColwiseParallel, output kept Shard(-1)           ColumnParallelLinear
loss                        loss_parallel(): vocab-parallel cross-entropy    VocabParallelCrossEntropy
==========================  ===============================================  ===================

The conjugate operators f and g of the Megatron paper are the DTensor layout changes at the
edges of each column/row pair: a ColwiseParallel input declared Replicate is f (identity in
forward; its gradient arrives Partial and is all-reduced in backward), and a RowwiseParallel
output turned from Partial to Replicate is g (all-reduce in forward, identity in backward).
So each transformer layer does two all-reduces in forward and two in backward, as in the paper.

Attention.qkv's output rows are laid out per key/value head g as [q heads of g, k_g, v_g] (per head
[q_h, k_h, v_h] without grouped-query attention), so the contiguous column shard a rank gets holds
whole groups of heads, and Attention.forward infers the local head count from the shape: the model
code is untouched. Biases (model.bias) are sharded with their column-parallel weights and kept whole
on the row-parallel ones (DTensor adds them once to the reduced sum). Qwen3's per-head query/key
norm acts on each rank's own heads with one weight [D] shared by all heads: as a replicated DTensor
its gradient, a partial sum over the local heads, is all-reduced like the norms' in Megatron's
sequence parallel. OLMoE's "full" query/key norm spans every head, across ranks: not supported
(config.py refuses it). A tied LM head shares the token embedding's vocab shard (both Shard(0) over
the vocabulary). The LM head's logits stay sharded over the vocabulary and the worker computes the
loss under ``loss_parallel()``: full-vocabulary logits never exist on one rank. Blocks whose FFN is
an MoE layer keep that layer replicated on every tensor-parallel rank (correct, but not sharded;
expert parallelism is the way to split experts).
"""

from __future__ import annotations

from torch import nn

IMPLEMENTATION = ("torch.distributed.tensor.parallel (DTensor): column/row-parallel Linear, "
                  "vocab-parallel embedding, loss_parallel cross-entropy")


def tensor_parallel_plan(model: nn.Module) -> dict:
    """{module path: ParallelStyle} for parallelize_module."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

    from benchsuite.models.ffn import MLP

    plan = {
        "tok_emb": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()),
        "head": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False),
    }
    for i, block in enumerate(model.blocks):
        plan[f"blocks.{i}.attn.qkv"] = ColwiseParallel()
        plan[f"blocks.{i}.attn.out"] = RowwiseParallel()
        if model.cfg.qk_norm == "per_head":  # on q and k as [B, T, local heads, D]
            plan[f"blocks.{i}.attn.q_norm"] = SequenceParallel(sequence_dim=2, use_local_output=True)
            plan[f"blocks.{i}.attn.k_norm"] = SequenceParallel(sequence_dim=2, use_local_output=True)
        if isinstance(block.ffn, MLP):
            plan[f"blocks.{i}.ffn.up"] = ColwiseParallel()
            if block.ffn.gate is not None:
                plan[f"blocks.{i}.ffn.gate"] = ColwiseParallel()
            plan[f"blocks.{i}.ffn.down"] = RowwiseParallel()
    return plan


def check_divisible(model: nn.Module, tp: int) -> None:
    """What tensor parallel cannot split: a size tp does not divide, or a norm over every head. The
    config validator rejects these before launch; this guards direct callers."""
    cfg = model.cfg
    for name, size in (("heads", cfg.heads), ("kv_heads", cfg.n_kv_heads), ("ffn_hidden", cfg.ffn),
                       ("vocab", cfg.vocab)):
        if size % tp:
            raise ValueError(f"tensor parallel degree {tp} must divide model.{name} ({size})")
    if cfg.qk_norm == "full":
        raise ValueError("model.qk_norm = \"full\" normalises over every head, across tensor-parallel ranks: "
                         "not supported")


def apply_tensor_parallel(model: nn.Module, tp_mesh) -> str:
    """Shard `model` in place over the 1-D device mesh `tp_mesh`; returns the implementation name.

    Afterwards model(idx) returns (logits, aux, routing) with logits a DTensor sharded on the vocabulary
    dimension: compute the loss under torch.distributed.tensor.parallel.loss_parallel()."""
    from torch.distributed.tensor.parallel import parallelize_module

    check_divisible(model, tp_mesh.size())
    parallelize_module(model, tp_mesh, tensor_parallel_plan(model))
    if model.cfg.tie_embeddings:  # each style distributed its own copy of the one weight: share one again
        model.head.weight = model.tok_emb.weight
    keep_grad_sharded_like_param(model.tok_emb.weight)
    return IMPLEMENTATION


def _to_param_layout(mesh, placements, grad):
    return grad if tuple(grad.placements) == tuple(placements) else grad.redistribute(mesh, placements)


def keep_grad_sharded_like_param(param) -> None:
    """DTensor's embedding backward (torch 2.13) returns the vocab-parallel embedding's gradient
    Replicate: every rank would keep the full [V, H] gradient of a weight it holds V/t rows of.
    A gradient hook slices it to the parameter's own Shard(0) layout before it is accumulated
    (a local slice, no communication), so .grad and the optimizer state are V/t rows as in
    Megatron; only the transient backward buffer is full-size."""
    from functools import partial

    param.register_hook(partial(_to_param_layout, param.device_mesh, param.placements))
