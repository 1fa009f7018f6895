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
(the config refuses it). A tied LM head shares the token embedding's vocab shard (both Shard(0) over
the vocabulary). The LM head's logits stay sharded over the vocabulary and the worker computes the
loss under ``loss_parallel()``: full-vocabulary logits never exist on one rank. Blocks whose FFN is
an MoE layer keep that layer replicated on every tensor-parallel rank (correct, but not sharded;
expert parallelism is the way to split experts).

Sequence parallelism (``sequence_parallel=True``; Korthikanti et al. 2022, §4.2.2; the plan torchtitan
applies with DTensor's SequenceParallel): between the tensor-parallel regions the residual stream is
split along the sequence, so each rank holds and normalises T/t positions:

==========================  ===============================================  ===================
blocks.0 input              Replicate -> Shard(1): each rank keeps its T/t   (the embedding's
                            positions (a local slice, no communication)      reduce-scatter)
ln1, ln2, ln_f              SequenceParallel: Shard(1), weight Replicate,    LayerNorm in the
                            its gradient summed over ranks                   sequence region
attn.qkv, ffn.up, ffn.gate  ColwiseParallel(input Shard(1)): all-gather      g: all-gather
attn.out, ffn.down          RowwiseParallel(output Shard(1)): reduce-scatter ḡ: reduce-scatter
head                        ColwiseParallel(input Shard(1))                  all-gather
==========================  ===============================================  ===================

An MoE layer under sequence parallelism routes the whole sequence, as without it: its input is all-gathered
from the sequence shards (PrepareModuleInputOutput: Shard(1) -> Replicate, whose backward keeps the rank's
own slice of the replicated gradient) and its output sliced back to the rank's shard (Replicate ->
Shard(1), whose backward all-gathers the shards' gradients). So routing, capacity and the auxiliary loss
are those of the single-process layer on the same tokens, and the layer's plain (replicated) weights get
the same full gradient on every rank; experts folded over the tensor-parallel ranks then split the routed
work among them (parallel/expert.py). Megatron routes each sequence shard on its own instead, which saves
the all-gather of the layer's input ([b, s, h] per MoE layer, forward and backward) but changes the
routing with t.

Megatron stores a column-parallel linear's input as the rank's sequence shard and all-gathers it
again in the backward pass; a DTensor linear would store the gathered input. So each of those
linears runs under a non-reentrant checkpoint together with its all-gather: the checkpoint stores
the shard, and its recompute stops once the linear's input is rebuilt (a matmul saves its inputs
before it runs), so only the all-gather is repeated, never the GEMM. Two differences from Megatron
remain: the embedding's partial sums are all-reduced and then sliced (the learned position table
is added to the whole sequence first), and SwiGLU's gate and up projections gather each (Megatron
fuses them into one GEMM).
"""

from __future__ import annotations

from torch import nn

from benchsuite.models.ffn import MLP

IMPLEMENTATION = ("torch.distributed.tensor.parallel (DTensor): column/row-parallel Linear, "
                  "vocab-parallel embedding, loss_parallel cross-entropy")


def column_inputs(model: nn.Module) -> list[str]:
    """The column-parallel linears that read the residual stream (their input is all-gathered under
    sequence parallelism): each block's attn.qkv and its dense FFN's up and gate."""
    paths = []
    for i, block in enumerate(model.blocks):
        paths.append(f"blocks.{i}.attn.qkv")
        if isinstance(block.ffn, MLP):
            paths += [f"blocks.{i}.ffn.up"] + ([f"blocks.{i}.ffn.gate"] if block.ffn.gate is not None else [])
    return paths


def tensor_parallel_plan(model: nn.Module, sequence_parallel: bool = False) -> dict:
    """{module path: ParallelStyle} for parallelize_module (the module docstring's tables)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, PrepareModuleInputOutput,
                                                   RowwiseParallel, SequenceParallel)

    stream = Shard(1) if sequence_parallel else Replicate()  # the residual stream between the regions
    plan = {
        "tok_emb": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()),
        "head": ColwiseParallel(input_layouts=stream, output_layouts=Shard(-1), use_local_output=False),
    }
    plan.update({path: ColwiseParallel(input_layouts=stream) for path in column_inputs(model)})
    if sequence_parallel:
        plan["blocks.0"] = PrepareModuleInput(input_layouts=(Replicate(), None), desired_input_layouts=(Shard(1), None),
                                              use_local_output=True)
        plan["ln_f"] = SequenceParallel()
        for i, block in enumerate(model.blocks):
            if not isinstance(block.ffn, MLP):  # an MoE layer routes the whole sequence (module docstring)
                plan[f"blocks.{i}.ffn"] = PrepareModuleInputOutput(
                    input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),), use_local_input=True,
                    output_layouts=(Replicate(), None, None), desired_output_layouts=(Shard(1), None, None),
                    use_local_output=True)
    for i, block in enumerate(model.blocks):
        plan[f"blocks.{i}.attn.out"] = RowwiseParallel(output_layouts=stream)
        if sequence_parallel:
            plan[f"blocks.{i}.ln1"] = SequenceParallel()
            plan[f"blocks.{i}.ln2"] = SequenceParallel()
        if model.cfg.qk_norm == "per_head":  # on q and k as [B, T, local heads, D]
            plan[f"blocks.{i}.attn.q_norm"] = SequenceParallel(sequence_dim=2, use_local_output=True)
            plan[f"blocks.{i}.attn.k_norm"] = SequenceParallel(sequence_dim=2, use_local_output=True)
        if isinstance(block.ffn, MLP):
            plan[f"blocks.{i}.ffn.down"] = RowwiseParallel(output_layouts=stream)
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


def apply_tensor_parallel(model: nn.Module, tp_mesh, sequence_parallel: bool = False) -> str:
    """Shard `model` in place over the 1-D device mesh `tp_mesh`; returns the implementation name.

    Afterwards model(idx) returns (logits, aux, routing) with logits a DTensor sharded on the vocabulary
    dimension: compute the loss under torch.distributed.tensor.parallel.loss_parallel()."""
    from torch.distributed.tensor.parallel import parallelize_module

    check_divisible(model, tp_mesh.size())
    parallelize_module(model, tp_mesh, tensor_parallel_plan(model, sequence_parallel))
    if model.cfg.tie_embeddings:  # each style distributed its own copy of the one weight: share one again
        model.head.weight = model.tok_emb.weight
    keep_grad_sharded_like_param(model.tok_emb.weight)
    if not sequence_parallel:
        return IMPLEMENTATION
    store_sequence_shards(model)
    return IMPLEMENTATION + "; sequence parallel (SequenceParallel norms, all-gather / reduce-scatter)"


def store_sequence_shards(model: nn.Module) -> None:
    """Each column-parallel linear that all-gathers the sequence, with its all-gather, under a
    non-reentrant checkpoint: the shard is stored and only the all-gather is repeated in backward
    (module docstring)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    for path in column_inputs(model):
        parent, _, name = path.rpartition(".")
        owner = model.get_submodule(parent)
        setattr(owner, name, checkpoint_wrapper(getattr(owner, name), preserve_rng_state=False))


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
