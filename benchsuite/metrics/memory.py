"""Memory: analytic model-state bytes (ZeRO), an activation estimate, and measured model state.

Model states (Rajbhandari et al. 2019, "ZeRO: Memory Optimizations Toward Training Trillion
Parameter Models", §3.1 and §5): with Ψ parameters, N data-parallel ranks, mixed-precision Adam
keeps 2Ψ bytes of fp16/bf16 parameters, 2Ψ of gradients and KΨ of optimizer state (fp32 master
parameters, momentum and variance: K = 12). Per device:

    DDP      (2 + 2 + K)Ψ
    stage 1  4Ψ + KΨ/N            optimizer state partitioned
    stage 2  2Ψ + (2 + K)Ψ/N      + gradients partitioned
    stage 3  (2 + 2 + K)Ψ/N       + parameters partitioned

The paper's example, Ψ = 7.5 B and N = 64: 120 GB, 31.4 GB, 16.6 GB, 1.9 GB (GB = 1e9 bytes).

fp32 training has no separate master copy: parameters 4Ψ, gradients 4Ψ, Adam m and v 8Ψ, i.e.
the same formula with constants (param 4, grad 4, K 8): DDP (4 + 4 + 8)Ψ = 16Ψ, stage 1
8Ψ + 8Ψ/N, stage 2 4Ψ + (4 + 8)Ψ/N, stage 3 (4 + 4 + 8)Ψ/N. `zero_model_state` takes the
constants; `PAPER` and `FP32` hold the two sets.

What benchsuite's implementation (parallel/zero.py) allocates is `implementation_model_state`, by the
data-parallel wrapper the layout runs (layout.ParallelDims.data_parallel), and that is the `analytic`
figure a record holds beside the measured one, and the model states `benchsuite predict` gives a
benchsuite run. It equals the paper's formula with the constants of the precision, except where torch
allocates differently:

- DDP and ZeRO-1 train fp32 parameters (autocast does bf16 compute), so their states follow
  the fp32 constants whatever the precision: a bf16 run's stage 1 is 8Ψ + 8Ψ/N, not 4Ψ + 12Ψ/N.
  torch's ZeroRedundancyOptimizer partitions whole tensors, so a rank's optimizer share is
  close to, not exactly, KΨ/N. DDP uses gradient_as_bucket_view, so gradients and all-reduce
  buckets are one allocation (without it DDP holds the gradients twice).
- FSDP2 (stages 2 and 3) keeps each rank's fp32 parameter shard for the whole run; in stage 2
  the gathered parameters (fp32, or bf16 under a MixedPrecisionPolicy) live beside it from
  forward to backward. Stage 2 is therefore pΨ + (4 + 4 + 8)Ψ/N with p = 4 (fp32) or 2 (bf16):
  the extra 4Ψ/N over the paper's fp32 figure is the shard FSDP2 does not free while gathered
  (with bf16 it is the fp32 master, the 4 of the paper's K = 12). Gradients are reduced and kept
  in fp32 (reduce_dtype), 4Ψ/N instead of the paper's 2Ψ/N. Stage 3 holds (4 + 4 + 8)Ψ/N.
  Gathered parameters of one group at a time (stage 3) are transient buffers, which the paper
  does not count as model state either.
- Tensor parallel: Ψ is the parameters one tensor rank holds (`params_per_rank`). Data
  parallelism over tensor-parallel ranks, and over pipeline stages, uses replicate_with_fsdp (torch's
  DDP refuses DTensor parameters), FSDP2's machinery on a replicate-only mesh: like stage 2 it keeps
  a gathered copy of the parameters from forward to backward beside the stored (here full) ones,
  (4+4+4+8)Ψ. In a pipeline Ψ is that of the rank holding the most (`params_per_pipeline_rank`).
  ZeRO-2/3 beside tensor or pipeline parallelism shard that Ψ (per tensor rank, per pipeline rank)
  over the N data-parallel ranks with FSDP2: the stage's formula above.
- Expert parallelism: Ψ counts the rank's own E/ep experts of each MoE layer, with expert tensor
  parallelism 1/etp of each (its FFN columns: `rank_params`); DDP
  leaves the expert shards out and their gradients are reduced by hand, so the states are DDP's; so
  does replicate_with_fsdp (its dense Ψd = Ψ − Ψe keep (4+4+4+8)Ψd, the experts (4+4+8)Ψe). Under
  ZeRO-2/3 the rank's experts Ψe are sharded over their own expert-data-parallel group of N_e = dp·tp/(ep·etp)
  ranks, Ψd over the N data-parallel ranks: each term over its group (`layout_model_state`), e.g.
  ZeRO-3 (4+4+8)Ψd/N + (4+4+8)Ψe/N_e.

Measured (`ModelStateProbe`): during one instrumented training step, the bytes of the tensors a
rank holds, DTensors counted by their local shard, aliases counted once:
params at the end of forward (the parameter shards kept at rest plus any gathered parameters
still registered on the modules, which is the peak for stage 2), gradients after the last
backward, optimizer state after the optimizer step.

Activations (`activation_bytes`): Korthikanti et al. 2022, "Reducing Activation Recomputation
in Large Transformer Models", §4: per layer, 16-bit activations with 1-byte dropout masks,
    no recompute         s·b·h·(34 + 5·a·s/h)
    tensor parallel t    s·b·h·(10 + 24/t + 5·a·s/(h·t))          (no sequence parallelism)
    selective recompute  s·b·h·(10 + 24/t)                         (attention core recomputed)
    full recompute       2·s·b·h                                   (each layer's input only)
and with sequence parallelism (the norms' and dropouts' activations split over the t ranks too, §4.2.2):
    no recompute         s·b·h/t·(34 + 5·a·s/h)
    selective recompute  s·b·h·34/t
    full recompute       2·s·b·h/t
plus the output layer, 4·s·b·h/t·(1 + v/h) (final norm, head input, fp32 logits for the loss).
Fused SDPA attention (flash / memory-efficient kernels) never stores the s×s matrices, so for
this model the selective figure is the closer one; the model has no dropout either, so the
estimates are upper bounds of the paper's setting, not a prediction of measured memory.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec
import torch

from benchsuite.config import ModelConfig
from benchsuite.layout import DataParallel, ParallelDims, Schedule
from benchsuite.metrics.flops import _moe_layer_count, attention_matmul, one_norm_params, param_counts
from benchsuite.models.transformer import is_moe_layer

GB = 1e9


@dataclass(frozen=True)
class StateConstants:
    """Bytes per parameter of each model state (the constants of the ZeRO formulas)."""

    param: float
    grad: float
    k: float  # optimizer state (fp32 master, if separate, + Adam m and v)
    name: str


PAPER = StateConstants(param=2, grad=2, k=12, name="mixed precision (fp16/bf16 params and grads, fp32 Adam)")
FP32 = StateConstants(param=4, grad=4, k=8, name="fp32 (params, grads, Adam m and v)")

STAGE_LABELS = {0: "DDP", 1: "ZeRO-1", 2: "ZeRO-2", 3: "ZeRO-3"}
WRAPPER_LABELS = {DataParallel.NONE: "no data parallelism", DataParallel.DDP: "DDP", DataParallel.ZERO1: "ZeRO-1",
                  DataParallel.FSDP_STAGE2: "ZeRO-2", DataParallel.FSDP_STAGE3: "ZeRO-3",
                  DataParallel.REPLICATE: "DDP via replicate_with_fsdp"}


def _n(x: float) -> str:
    return f"{x:g}"


def zero_formula(stage: int, c: StateConstants = PAPER) -> str:
    p, g, k = _n(c.param), _n(c.grad), "K" if c is PAPER else _n(c.k)
    return {0: f"({p}+{g}+{k})Ψ", 1: f"{_n(c.param + c.grad)}Ψ + {k}Ψ/N", 2: f"{p}Ψ + ({g}+{k})Ψ/N",
            3: f"({p}+{g}+{k})Ψ/N"}[stage]


def zero_model_state(psi: float, n: int, stage: int, c: StateConstants = PAPER) -> dict:
    """Per-device model-state bytes of ZeRO `stage` (0 = DDP) for Ψ = psi parameters over n ranks."""
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"ZeRO stage must be 0, 1, 2 or 3, got {stage!r}")
    if n < 1:
        raise ValueError(f"data-parallel degree must be >= 1, got {n!r}")
    params = c.param * psi / (n if stage >= 3 else 1)
    grads = c.grad * psi / (n if stage >= 2 else 1)
    optimizer = c.k * psi / (n if stage >= 1 else 1)
    return {"params": params, "grads": grads, "optimizer": optimizer, "total": params + grads + optimizer,
            "formula": zero_formula(stage, c), "K": c.k}


def implementation_model_state(psi: float, n: int, wrapper: DataParallel, forward_params: str = "fp32") -> dict:
    """What parallel/zero.py allocates per rank under the data-parallel `wrapper` over n ranks (see the
    module docstring for each term). forward_params: the dtype FSDP2 gathers parameters in
    (PrecisionPolicy.forward_params; "bf16" would be a MixedPrecisionPolicy); DDP and ZeRO-1 keep fp32
    states. replicate_with_fsdp keeps a gathered copy of the (replicated) parameters from forward to
    backward: (4+4+4+8)Ψ."""
    if wrapper is DataParallel.REPLICATE:
        return {"params": 8 * psi, "grads": 4 * psi, "optimizer": 8 * psi, "total": 20 * psi,
                "formula": "(4+4+4+8)Ψ", "K": 8}
    if wrapper in (DataParallel.NONE, DataParallel.DDP, DataParallel.ZERO1):
        stage = 1 if wrapper is DataParallel.ZERO1 else 0
        out = zero_model_state(psi, n, stage, FP32)
        out["formula"] = {0: "(4+4+8)Ψ", 1: "(4+4)Ψ + 8Ψ/N"}[stage]
        return out
    gathered = 2 if forward_params == "bf16" else 4
    shard, grads, adam = 4 * psi / n, 4 * psi / n, 8 * psi / n
    stage2 = wrapper is DataParallel.FSDP_STAGE2
    params = (gathered * psi + shard) if stage2 else shard
    formula = f"{gathered}Ψ + (4+4+8)Ψ/N" if stage2 else "(4+4+8)Ψ/N"
    return {"params": params, "grads": grads, "optimizer": adam, "total": params + grads + adam,
            "formula": formula, "K": 8}


def layout_model_state(model, moe, dims: ParallelDims, forward_params: str = "fp32") -> dict:
    """implementation_model_state for a layout: with expert parallelism under ZeRO-2/3 the rank's own
    experts Ψe are sharded over their expert-data-parallel group of N_e = dp·tp/(ep·etp) ranks and the other
    Ψ − Ψe over the N data-parallel ranks (parallel/zero.py), each term of the formula over its group; the
    two states add up. Under replicate_with_fsdp, and ZeRO-2/3 with N_e = 1, the experts are left out of
    the wrapper: (4+4+8)Ψe beside the dense states. Otherwise one group of N ranks holds all Ψ."""
    psi, experts = rank_param_split(model, moe, dims)
    if not (dims.data_parallel.fsdp and experts):
        return implementation_model_state(psi, dims.dp, dims.data_parallel, forward_params)
    dense = implementation_model_state(psi - experts, dims.dp, dims.data_parallel, forward_params)
    own_wrapper = dims.data_parallel if dims.experts_sharded else DataParallel.DDP  # left out: held whole
    own = implementation_model_state(experts, dims.edp, own_wrapper, forward_params)
    out = {k: dense[k] + own[k] for k in ("params", "grads", "optimizer", "total")}
    dense_f = dense["formula"].replace("Ψ", "Ψd")
    own_f = own["formula"].replace("Ψ", "Ψe").replace("/N", "/N_e")
    out["formula"] = f"{dense_f} + {own_f} (Ψe: the rank's experts, N_e = {dims.edp}; Ψd the rest, N = {dims.dp})"
    out["K"] = dense["K"]
    return out


def stage_table(psi: float, n: int, c: StateConstants = PAPER) -> list[dict]:
    """All four stages (the `benchsuite memory` table)."""
    rows = []
    for stage in range(4):
        r = zero_model_state(psi, n, stage, c)
        rows.append({"stage": stage, "name": STAGE_LABELS[stage], **r, "total_gb": r["total"] / GB})
    return rows


# ------------------------------------------------------------------ per-rank parameter count

def params_per_rank(cfg, moe=None, tp: int = 1) -> int:
    """Ψ one rank holds before data-parallel sharding: with tensor parallelism the column/row-
    parallel matrices, the column-parallel biases, the token embedding and the LM head (once when
    tied) are split over tp ranks; position embedding, norms, row-parallel biases and MoE layers
    (replicated under TP) are not. Exact for models/transformer.py."""
    pc = param_counts(cfg, moe)
    if tp == 1:
        return pc.total
    h, f = cfg.hidden, cfg.ffn
    mats = 3 if cfg.activation == "swiglu" else 2
    dense_layers = cfg.layers - _moe_layer_count(cfg, moe)
    sharded = (cfg.layers * attention_matmul(cfg) + dense_layers * mats * h * f + cfg.vocab * h
               + (0 if cfg.tie_embeddings else pc.lm_head))
    if cfg.bias:  # q/k/v and up (and gate) biases are column-parallel
        sharded += cfg.layers * (cfg.heads + 2 * cfg.n_kv_heads) * cfg.dim_head + dense_layers * (mats - 1) * f
    return (pc.total - sharded) + sharded // tp


def block_params(cfg, moe, layer: int, tp: int = 1, ep: int = 1, etp: int = 1) -> int:
    """Ψ of block `layer` on one rank: its tensor-parallel share (params_per_rank's split) and, for an MoE
    block, its own E/ep experts, 1/etp of each (the MoE layer is replicated under TP, its experts spread over
    ep and their FFN columns over etp)."""
    one = msgspec.structs.replace(cfg, layers=1, tie_embeddings=False)
    layer_moe = msgspec.structs.replace(moe, every=1) if is_moe_layer(layer, moe) else None
    ends = end_params(one, tp)
    return (params_per_rank(one, layer_moe, tp) - other_ranks_experts(one, layer_moe, ep, etp)) - ends[0] - ends[1]


def own_experts(cfg, moe, layer: int, ep: int, etp: int = 1) -> int:
    """The routed-expert parameters of block `layer` one rank holds (E/ep experts, 1/etp of each: its FFN
    columns; 0 in a dense block)."""
    if not is_moe_layer(layer, moe):
        return 0
    one = param_counts(msgspec.structs.replace(cfg, layers=1), msgspec.structs.replace(moe, every=1))
    return moe.experts // ep * one.expert // etp


def end_params(cfg, tp: int = 1) -> tuple[int, int]:
    """(Ψ of the first stage's embeddings, Ψ of the last stage's final norm and LM head) on one tensor rank;
    a tied LM head is the last stage's own copy of the token embedding (parallel/pipeline.py)."""
    pc = param_counts(cfg)
    token = cfg.vocab * cfg.hidden
    return pc.embedding - token + token // tp, one_norm_params(cfg) + pc.lm_head // tp


def pipeline_rank_params(cfg, dims: ParallelDims, moe=None) -> list[tuple[int, int]]:
    """(Ψ, of which routed experts) of each pipeline rank: the blocks of its stages (dims.stage_layers,
    stage s on rank s mod P), rank 0 also the embeddings and rank P − 1 the final norm and the LM head,
    each its tensor-parallel share and its own E/ep experts. Exact for models/transformer.py."""
    first, last = end_params(cfg, dims.tp)
    out = []
    for rank in range(dims.pp):
        total = experts = 0
        for stage in dims.stage_ids(rank):
            for layer in dims.stage_layers(stage, cfg.layers):
                total += block_params(cfg, moe, layer, dims.tp, dims.ep, dims.etp)
                experts += own_experts(cfg, moe, layer, dims.ep, dims.etp)
            total += (first if stage == 0 else 0) + (last if stage == dims.num_stages - 1 else 0)
        out.append((total, experts if dims.experts_split else 0))
    return out


def params_per_pipeline_rank(cfg, pp: int, virtual: int = 1, tp: int = 1) -> int:
    """Ψ of the pipeline rank of a dense model that holds the most parameters (pipeline_rank_params)."""
    dims = ParallelDims.from_degrees(tp=tp, pp=pp, virtual_stages=virtual,
                                     schedule=Schedule.INTERLEAVED if virtual > 1 else Schedule.ONE_F_ONE_B)
    return max(total for total, _ in pipeline_rank_params(cfg, dims, None))


def other_ranks_experts(cfg, moe, ep: int, etp: int = 1) -> int:
    """The routed-expert parameters the other ranks of an expert-parallel group of ep, and of each one's
    expert-tensor group of etp, hold: each rank keeps E/ep experts of every MoE layer, 1/etp of each
    (parallel/expert.py)."""
    if moe is None or ep * etp == 1:
        return 0
    pc = param_counts(cfg, moe)
    return pc.moe_layers * (moe.experts * pc.expert - moe.experts // ep * pc.expert // etp)


def rank_param_split(model, moe, dims: ParallelDims) -> tuple[int, int]:
    """(Ψ one rank holds before data-parallel sharding, of which its own routed experts: 0 without expert
    parallelism, where experts are data-parallel like any weight). In a pipeline the rank holding the most."""
    if dims.pp_enabled:
        return max(pipeline_rank_params(model, dims, moe))
    total = params_per_rank(model, moe, dims.tp) - other_ranks_experts(model, moe, dims.ep, dims.etp)
    if not dims.experts_split:
        return total, 0
    return total, sum(own_experts(model, moe, layer, dims.ep, dims.etp) for layer in range(model.layers))


def rank_params(model, moe, dims: ParallelDims) -> int:
    """Ψ one rank holds before data-parallel sharding, for its layout: its tensor-parallel share
    (params_per_rank) less the experts its expert-parallel (and expert-tensor) peers hold; in a pipeline the
    share of the rank holding the most (pipeline_rank_params)."""
    return rank_param_split(model, moe, dims)[0]


# ------------------------------------------------------------------ activations

def activation_bytes(seq_len: int, micro_batch: int, hidden: int, heads: int, layers: int, vocab: int,
                     tp: int = 1, recompute: str = "none", sequence_parallel: bool = False,
                     value_bytes: int = 2, dropout: bool = True, context: int = 1) -> dict:
    """Korthikanti et al. 2022 estimate of activation bytes per micro-batch (module docstring).
    recompute: "none" | "selective" | "full"; sequence_parallel: Megatron's sequence parallelism (§4.2.2).
    value_bytes and dropout: the paper's 16-bit values with 1-byte dropout masks by default; the model
    here, without dropout, in fp32 is value_bytes=4, dropout=False. The paper's terms per layer, in
    values: 4·s·b·h stored whole under tensor parallelism (the two norms' inputs and the QKV and FFN
    inputs; split by sequence parallelism), 12·s·b·h split over t (Q, K, V, the out-projection input,
    the FFN's two 4h-wide inputs), a·s²·b split over t (the softmax output), plus the dropout masks
    (s·b·h twice, a·s²·b) and the attention dropout's output (a·s²·b).

    context c (parallel/context.py): a rank holds b sequences' worth of tokens as shards of c·b sequences,
    so every term above is the same, and without recompute the attention also keeps the keys and values
    it gathered from the c − 1 other shards, 2·(c−1)·s·b·h/t values per layer (the paper's multi-head
    K and V; recompute re-gathers them inside the checkpointed attention)."""
    s, b, h, a, t, v = seq_len, micro_batch, hidden, heads, tp, vocab
    sp = sequence_parallel and t > 1
    paper = value_bytes == 2 and dropout
    masks = 1 if dropout else 0
    stream_c, split_c = 4 * value_bytes + 2 * masks, 12 * value_bytes  # 10 and 24 in the paper
    score_c = value_bytes + masks * (1 + value_bytes)  # 5 in the paper
    stream_t = t if sp else 1
    if recompute == "none":
        per_layer = s * b * h * (stream_c / stream_t + split_c / t) + a * s * s * b * score_c / t
        if paper:
            formula = ("s·b·h/t·(34 + 5·a·s/h)" if sp else "s·b·h·(34 + 5·a·s/h)" if t == 1
                       else "s·b·h·(10 + 24/t + 5·a·s/(h·t))")
        else:
            formula = f"s·b·h·({stream_c}{'/t' if sp else ''} + {split_c}/t) + {score_c}·a·s²·b/t"
    elif recompute == "selective":
        per_layer = s * b * h * (stream_c / stream_t + split_c / t)
        if paper:
            formula = "s·b·h·34/t" if sp else "s·b·h·34" if t == 1 else "s·b·h·(10 + 24/t)"
        else:
            formula = f"s·b·h·({stream_c}{'/t' if sp else ''} + {split_c}/t)"
    elif recompute == "full":
        per_layer = value_bytes * s * b * h / stream_t
        formula = f"{value_bytes}·s·b·h{'/t' if sp else ''}"
    else:
        raise ValueError(f"recompute must be none, selective or full, got {recompute!r}")
    if recompute == "none" and context > 1:
        per_layer += value_bytes * 2 * (context - 1) * s * b * h / t
        formula += f" + {value_bytes}·2·(c−1)·s·b·h/t"
    output = 4 * s * b * h / t * (1 + v / h)
    source = "Korthikanti et al. 2022 (16-bit activations, with dropout masks)" if paper else \
        f"Korthikanti et al. 2022's terms with {value_bytes}-byte values{'' if dropout else ', no dropout'}"
    return {"recompute": recompute, "tp": t, "sequence_parallel": sp, "per_layer_bytes": per_layer,
            "layers": layers, "output_layer_bytes": output, "total_bytes": layers * per_layer + output,
            "formula": f"L·{formula} + 4·s·b·h/t·(1 + v/h)", "source": source}


def activation_estimates(m: ModelConfig, *, micro_batch: int, recompute: str, tp: int,
                         context: int = 1) -> dict:
    """The three recompute variants for a micro-batch per rank; `configured` names the run's own."""
    kw = dict(seq_len=m.seq_len, micro_batch=micro_batch, hidden=m.hidden, heads=m.heads,
              layers=m.layers, vocab=m.vocab, tp=tp, context=context)
    out = {r: activation_bytes(recompute=r, **kw)["total_bytes"] for r in ("none", "selective", "full")}
    out["configured"] = recompute
    out["formula"] = activation_bytes(**kw)["formula"]
    out["source"] = "Korthikanti et al. 2022; per micro-batch per rank; fused attention stores no s×s matrices"
    return out


# ------------------------------------------------------------------ measured model state

def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard; any other tensor as it is."""
    return t.to_local() if hasattr(t, "to_local") and hasattr(t, "placements") else t


def unique_bytes(tensors) -> int:
    """Bytes of the given tensors (DTensor → local shard), each (address, size) counted once."""
    seen, total = set(), 0
    for t in tensors:
        if t is None:
            continue
        t = local_tensor(t)
        nbytes = t.numel() * t.element_size()
        key = (t.data_ptr(), nbytes, t.device)
        if nbytes == 0 or key in seen:
            continue
        seen.add(key)
        total += nbytes
    return total


def optimizer_state_tensors(optimizer) -> list[torch.Tensor]:
    """Every tensor of the optimizer's state held on this rank (ZeroRedundancyOptimizer: its local optimizer)."""
    opt = getattr(optimizer, "optim", optimizer)
    out = []
    for state in opt.state.values():
        out.extend(v for v in state.values() if isinstance(v, torch.Tensor))
    return out


class ModelStateProbe:
    """Measures one training step's model-state bytes on this rank.

    Create it between steps (parameters at rest), run one step that calls after_backward() and
    after_step(), then read result(). A forward hook on the root module (on each stage of a pipeline)
    records the parameters held at the end of forward."""

    def __init__(self, model: torch.nn.Module, optimizer):
        self.model, self.optimizer = model, optimizer
        self.at_rest = list(model.parameters())
        self._rest_ids = {id(p) for p in self.at_rest}
        self.params = self.grads = self.optimizer_bytes = None
        self.gathered = 0
        # a pipeline's stages (a ModuleList, never called itself): each stage's forward, the last one's wins
        roots = list(model) if isinstance(model, torch.nn.ModuleList) else [model]
        self._handles = [root.register_forward_hook(self._on_forward) for root in roots]

    def _on_forward(self, module, args, output):
        extra = [p for p in self.model.parameters() if id(p) not in self._rest_ids]
        self.gathered = unique_bytes(extra)
        self.params = unique_bytes(list(self.at_rest) + extra)

    def after_backward(self) -> None:
        self.grads = unique_bytes(p.grad for p in self.model.parameters())

    def after_step(self) -> None:
        self.optimizer_bytes = unique_bytes(optimizer_state_tensors(self.optimizer))

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()

    def result(self) -> dict:
        parts = {"params": self.params, "grads": self.grads, "optimizer": self.optimizer_bytes}
        total = sum(v for v in parts.values() if v is not None) if all(v is not None for v in parts.values()) \
            else None
        return {**parts, "total": total, "gathered_params": self.gathered}


def constants_for(precision: str) -> StateConstants:
    """The ZeRO paper's constants for a resolved compute precision: bf16 → mixed (K = 12), fp32 → fp32 (4+4+8)."""
    return PAPER if precision == "bf16" else FP32


def analytic_model_state(model, moe, dims: ParallelDims, *, compute: str, forward_params: str) -> dict:
    """The analytic part of metrics.memory.model_state_bytes for one run (model, moe: its config
    sections; dims: its layout): what parallel/zero.py allocates under the layout's data-parallel
    wrapper (`analytic`), beside the paper's formula with the constants of the precision (`paper`).
    compute: the resolved compute precision; forward_params: the dtype FSDP2 gathers parameters in
    (PrecisionPolicy.forward_params)."""
    stage, n, wrapper = dims.zero_applied, dims.dp, dims.data_parallel
    psi = rank_params(model, moe, dims)
    analytic = layout_model_state(model, moe, dims, forward_params)
    paper_c = constants_for(compute)
    paper = zero_model_state(psi, n, stage, paper_c)
    label = WRAPPER_LABELS[wrapper]
    if dims.tp_enabled:
        label += f", TP {dims.tp} (Ψ per tensor rank)"
    if dims.pp_enabled:
        label += f", PP {dims.pp} (Ψ of the pipeline rank holding the most)"
    if dims.experts_split:
        width = f" x ETP {dims.etp}" if dims.etp_enabled else ""
        label += f", EP {dims.ep}{width} folded over dp x tp (Ψ with the rank's own experts)"
    return {
        "analytic": {k: analytic[k] for k in ("params", "grads", "optimizer", "total")},
        "formula": f"{label} ({compute}): {analytic['formula']}",
        "paper": {"total": paper["total"], "formula": paper["formula"], "K": paper["K"],
                  "constants": paper_c.name},
        "K": analytic["K"], "psi": psi, "N": n, "stage": stage, "tensor": dims.tp,
    }


def model_state_record(measured_per_rank: list[dict], *, model, moe, dims: ParallelDims, applied) -> dict:
    """metrics.memory.model_state_bytes: measured (the largest rank) beside the analytic formula.
    applied: what parallelize applied (parallel.Applied: its precision policy sets the constants)."""
    valid = [m for m in measured_per_rank if m and m.get("total") is not None]
    measured = max(valid, key=lambda m: m["total"]) if valid else None
    out = {"measured": ({k: measured[k] for k in ("params", "grads", "optimizer", "total")} if measured else None),
           "measured_per_rank_total": [m.get("total") if m else None for m in measured_per_rank],
           "method": "local tensor bytes (DTensor: local shard) during one warm-up step: params at the end of "
                     "forward, grads after backward, optimizer state after the step; largest rank"}
    out.update(analytic_model_state(model, moe, dims, compute=applied.precision.compute,
                                    forward_params=applied.precision.forward_params))
    out["ratio"] = (measured["total"] / out["analytic"]["total"]) if measured else None
    return out
