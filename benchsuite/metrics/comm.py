"""Communication accounting: bytes each rank sends in collectives during one training step.

`CommCounter` is a TorchDispatchMode that sees every collective as it is dispatched: the c10d
ops behind torch.distributed's functions (``c10d.allreduce_`` from DDP's bucketed reducer,
``c10d._allgather_base_`` / ``c10d._reduce_scatter_base_`` from FSDP2, ``c10d.broadcast_`` from
ZeroRedundancyOptimizer, ``c10d.alltoall_base_`` from expert parallelism) and the functional
collectives DTensor uses (``_c10d_functional.all_reduce`` and friends, tensor parallelism).
As torch's own CommDebugMode does, it returns NotImplemented for DTensor arguments so DTensor
first lowers an op to the collectives it needs, which the mode then sees on plain tensors.

For each call: payload M = the full tensor of the collective (all-reduce and broadcast: the
buffer; all-gather: the gathered output; reduce-scatter: the unreduced input; all-to-all: the
input), and the bytes one rank sends with a ring (bandwidth-optimal) algorithm over a group of
n ranks: all-reduce 2(n−1)/n·M, all-gather, reduce-scatter, all-to-all and broadcast (n−1)/n·M.
The latter, summed per kind, is `bytes_per_step_by_kind`.

Reference volumes (paper_bytes_per_step, same ring convention, so a ratio of 1 means "what the
paper says"): ZeRO (Rajbhandari et al. 2019, §7): data parallelism all-reduces the gradients,
2Ψ elements per step (reduce-scatter + all-gather); stages 1 and 2 move the same 2Ψ; stage 3
about 3Ψ (parameters all-gathered in forward and again in backward, gradients reduce-scattered).
torch's ZeroRedundancyOptimizer all-reduces full gradients (DDP) and then broadcasts each rank's
updated parameters, Ψ more: about 1.5× the paper's stage-1 figure, which the ratio shows.
Megatron (Shoeybi et al. 2019, §3): per layer two all-reduces of the b·s·h activations in forward
and two in backward, plus one each for the vocab-parallel embedding (forward) and the LM head's
input (backward): (4L + 2) all-reduces of b·s·h elements per micro-batch, beside the vocab-parallel
cross-entropy's three of b·s. MoE layers (replicated under tensor parallelism) contribute only their
attention's two; full recompute repeats each layer's forward all-reduces in backward. With
`parallel.sequence_parallel` the expected collectives take Korthikanti et al. 2022's all-gather /
reduce-scatter form as parallel/tensor.py runs it (tensor_parallel_collectives says which). FSDP2 (stages 2, 3) communicates for every micro-batch;
DDP all-reduces once per optimizer step: the worker skips accumulation micro-batches (no_sync).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from benchsuite.layout import ParallelDims
from benchsuite.metrics.flops import _moe_layer_count
from benchsuite.metrics.memory import rank_params
from benchsuite.models.moe import capacity

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "other")

_OP_KINDS = {
    "all_reduce": ["c10d::allreduce_", "c10d::allreduce_coalesced_", "_c10d_functional::all_reduce",
                   "_c10d_functional::all_reduce_", "_c10d_functional::all_reduce_coalesced",
                   "_c10d_functional::all_reduce_coalesced_"],
    "all_gather": ["c10d::allgather_", "c10d::_allgather_base_", "c10d::allgather_coalesced_",
                   "c10d::allgather_into_tensor_coalesced_", "_c10d_functional::all_gather_into_tensor",
                   "_c10d_functional::all_gather_into_tensor_out",
                   "_c10d_functional::all_gather_into_tensor_coalesced"],
    "reduce_scatter": ["c10d::reduce_scatter_", "c10d::_reduce_scatter_base_",
                       "c10d::reduce_scatter_tensor_coalesced_", "_c10d_functional::reduce_scatter_tensor",
                       "_c10d_functional::reduce_scatter_tensor_coalesced"],
    "all_to_all": ["c10d::alltoall_", "c10d::alltoall_base_", "_c10d_functional::all_to_all_single",
                   "_c10d_functional_autograd::all_to_all_single"],
    "broadcast": ["c10d::broadcast_", "_c10d_functional::broadcast", "_c10d_functional::broadcast_"],
    "other": ["c10d::reduce_", "c10d::gather_", "c10d::scatter_"],
}
OP_KIND = {name: kind for kind, names in _OP_KINDS.items() for name in names}


def _tensors(x) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for item in x for t in _tensors(item)]
    return []


def _nbytes(ts) -> int:
    return sum(t.numel() * t.element_size() for t in ts)


def _group_size(args, kwargs) -> int | None:
    """The size of the process group a collective runs on: c10d ops carry the ProcessGroup as a
    boxed ScriptObject, functional collectives carry the group's name."""
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _resolve_process_group

    for a in list(args) + list(kwargs.values()):
        if isinstance(a, torch.ScriptObject):
            try:
                return int(dist.ProcessGroup.unbox(a).size())
            except Exception:  # noqa: BLE001 - another boxed object (a ReduceOp): try the next argument
                continue
        if isinstance(a, dist.ProcessGroup):
            return int(a.size())
        if isinstance(a, str):
            try:
                return int(_resolve_process_group(a).size())
            except Exception:  # noqa: BLE001 - a reduce-op name, not a group
                continue
    return dist.get_world_size() if dist.is_initialized() else None


def ring_bytes(kind: str, payload: int, n: int) -> float:
    """Bytes one rank sends for a collective of `payload` bytes over n ranks (ring algorithm)."""
    if n <= 1:
        return 0.0
    factor = 2 * (n - 1) / n if kind == "all_reduce" else (n - 1) / n
    return factor * payload


def _uneven_all_to_all_sent(func, args, payload: int) -> float | None:
    """Bytes an uneven c10d all-to-all (dropless expert parallelism) sends: its input less the rows
    it keeps on its own rank. None for any other call (equal splits: the ring figure is exact)."""
    import torch.distributed as dist

    if func._schema.name != "c10d::alltoall_base_" or not args[4]:
        return None
    splits, group = args[4], args[2]  # input_split_sizes: rows to each rank of the group
    own = splits[(dist.ProcessGroup.unbox(group) if isinstance(group, torch.ScriptObject) else group).rank()]
    return payload * (1 - own / sum(splits)) if sum(splits) else 0.0


class CommCounter(TorchDispatchMode):
    """Counts collectives dispatched while active: calls, payload bytes and ring bytes by kind."""

    def __init__(self):
        super().__init__()
        self.calls: dict[str, int] = defaultdict(int)
        self.payload: dict[str, int] = defaultdict(int)
        self.sent: dict[str, float] = defaultdict(float)
        self.groups: dict[str, set] = defaultdict(set)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if isinstance(func, torch._ops.HigherOrderOperator):
            return func(*args, **kwargs)
        if any(getattr(t, "__name__", "") == "DTensor" for t in types):
            return NotImplemented  # let DTensor lower the op to collectives on plain tensors first
        out = func(*args, **kwargs)
        kind = OP_KIND.get(func._schema.name) if hasattr(func, "_schema") else None
        if kind is not None:
            sides = [_tensors(a) for a in args] + [_tensors(out)]
            payload = max((_nbytes(ts) for ts in sides if ts), default=0)
            if kind == "all_to_all":
                payload = _nbytes(_tensors(args[1] if func._schema.name.startswith("c10d::") else args[0]))
            n = _group_size(args, kwargs) or 1
            self.calls[kind] += 1
            self.payload[kind] += payload
            uneven = _uneven_all_to_all_sent(func, args, payload)
            self.sent[kind] += ring_bytes(kind, payload, n) if uneven is None else uneven
            self.groups[kind].add(n)
        return out

    def result(self) -> dict:
        return {"bytes_by_kind": {k: self.sent[k] for k in KINDS if self.calls.get(k)},
                "payload_bytes_by_kind": {k: self.payload[k] for k in KINDS if self.calls.get(k)},
                "calls_by_kind": {k: self.calls[k] for k in KINDS if self.calls.get(k)},
                "group_sizes_by_kind": {k: sorted(self.groups[k]) for k in KINDS if self.calls.get(k)},
                "total_bytes": sum(self.sent.values())}


@dataclass(frozen=True)
class Collective:
    """Calls of one collective kind with one payload (the full tensor, this module's convention)."""

    kind: str  # one of KINDS
    payload: float  # bytes
    calls: int
    overlapped: bool = False  # runs beside compute that does not wait for it (off the critical path)


FP32 = 4  # bytes: the parameters and their gradients, and the loss's reductions, stay fp32
DDP_FIRST_BUCKET, DDP_BUCKET = 2 ** 20, 25 * 2 ** 20  # torch DDP's bucket sizes (bucket_cap_mb = 25)


def tensor_parallel_collectives(model, moe, *, micro_batch: int, recompute: str, sequence_parallel: bool,
                                act_bytes: int, grad_bytes: int, megatron: bool = False) -> list[Collective]:
    """The collectives of one micro-batch on a tensor-parallel group.

    Without sequence parallelism (Shoeybi et al. 2019, §3): one all-reduce of the b·s·h activations after
    each attention and dense MLP in forward (MoE layers stay replicated), one before each column-parallel
    linear in backward, one for the vocab-parallel embedding (forward) and one for the LM head's input
    (backward): 4L + 2 (SwiGLU's gate and up projections each take their input's gradient here, one more
    per dense block; Megatron fuses them); full recompute repeats the forward ones. With sequence parallelism (Korthikanti et al. 2022, §4.2.2), per
    block: an all-gather of the stream into each column-parallel linear (attention's QKV, the MLP's up
    projection and, as parallel/tensor.py runs SwiGLU, its gate: Megatron fuses gate and up into one) and
    a reduce-scatter of each row-parallel output in forward (again under full recompute); in backward a
    reduce-scatter of each column input's gradient, an all-gather of its stored sequence shard again, and
    an all-gather of each row output's gradient (Megatron launches the re-gather asynchronously beside the
    input-gradient GEMM: `overlapped`; here it runs inside a checkpoint's recompute, on the critical path). The LM head gathers its input (and scatters the gradient;
    Megatron also gathers again). The embedding's partial sums are all-reduced and sliced here (Megatron
    reduce-scatters them); their gradient is gathered. The norms (replicated weights on sequence shards)
    all-reduce their weight gradients: here each backward, in Megatron once per step outside this list.
    Both forms: the vocab-parallel cross-entropy's three all-reduces of b·s values (max, target logit, sum
    of exponentials), and with per-head query/key norms their weight gradients.

    act_bytes: the dtype size of the row-parallel matmuls' outputs (the compute dtype) and so of their
    gradients; grad_bytes: the residual stream's (the embedding's output, the norms' outputs, the column
    inputs' gradients: fp32 here under autocast). megatron: Megatron-LM's forms where they differ."""
    bs = micro_batch * model.seq_len
    bsh = bs * model.hidden
    layers, dense = model.layers, model.layers - _moe_layer_count(model, moe)
    again = 2 if recompute == "full" else 1  # full recompute runs each block's forward again in backward
    calls: list[tuple[str, float, int]] = [("all_reduce", bs * FP32, 3)]
    if model.qk_norm == "per_head":
        calls.append(("all_reduce", model.dim_head * FP32, 2 * layers))
    columns = layers + dense * (2 if model.activation == "swiglu" and not megatron else 1)
    rows = layers + dense
    if not sequence_parallel:
        calls += [("all_reduce", bsh * act_bytes, rows * again), ("all_reduce", bsh * grad_bytes, 1 + columns + 1)]
    else:
        regather = columns + (1 if megatron else 0)
        calls += [("all_gather", bsh * grad_bytes, columns * again + 1 + 1 + (0 if megatron else regather)),
                  ("reduce_scatter", bsh * act_bytes, rows * again),
                  ("reduce_scatter", bsh * grad_bytes, columns + 1),
                  ("all_gather", bsh * act_bytes, rows),
                  ("reduce_scatter" if megatron else "all_reduce", bsh * grad_bytes, 1)]
        if not megatron:
            norm_params = 2 if model.norm == "layernorm" else 1
            calls.append(("all_reduce", model.hidden * FP32, (2 * layers + 1) * norm_params))
    merged: dict[tuple[str, float], int] = {}
    for kind, payload, n in calls:
        merged[kind, payload] = merged.get((kind, payload), 0) + n
    out = [Collective(kind, payload, n) for (kind, payload), n in merged.items() if n]
    if sequence_parallel and megatron:  # its weight-gradient GEMM's all-gather overlaps the input-gradient GEMM
        out.append(Collective("all_gather", bsh * grad_bytes, regather, overlapped=True))
    return out


def data_parallel_collectives(psi: float, *, stage: int, grad_accum: int, grad_bytes: int, gather_bytes: int,
                              zero1_broadcast: bool = False, units: int = 1) -> list[Collective]:
    """The collectives of one step on a data-parallel group of Ψ = psi parameters per rank (Rajbhandari
    et al. 2019, §7): DDP and stage 1 all-reduce the gradients once per step (accumulation micro-batches
    skip the sync) in DDP's buckets (the first 1 MiB, then 25 MiB each); stages 2 and 3 (FSDP2)
    reduce-scatter the gradients and all-gather the parameters (stage 3 again in backward) for every
    micro-batch, one call per fully_shard unit (`units`; bytes split evenly over them). zero1_broadcast:
    torch's ZeroRedundancyOptimizer then broadcasts each rank's updated parameters (fp32), Ψ more than the
    paper's stage 1."""
    if stage in (0, 1):
        grads = psi * grad_bytes
        buckets = 1 + max(0, -int(-(grads - DDP_FIRST_BUCKET) // DDP_BUCKET))
        extra = [Collective("broadcast", psi * FP32, 1)] if stage == 1 and zero1_broadcast else []
        return [Collective("all_reduce", grads / buckets, buckets), *extra]
    gathers = 1 if stage == 2 else 2
    return [Collective("all_gather", psi * gather_bytes / units, units * gathers * grad_accum),
            Collective("reduce_scatter", psi * grad_bytes / units, units * grad_accum)]


def tensor_parallel_formula(calls: list[Collective], bs: int, hidden: int, sequence_parallel: bool) -> str:
    """The tensor-parallel collectives in words: how many of each kind, each payload in units of b·s·h."""
    def size(payload: float) -> str:
        if payload % (bs * hidden) == 0:
            return f"b·s·h·{payload // (bs * hidden):g}B"
        return f"b·s·{payload // bs:g}B" if payload % bs == 0 else f"{payload:g}B"

    words = " + ".join(f"{c.calls} {c.kind.replace('_', '-')} of {size(c.payload)}" for c in calls)
    form = ("sequence parallel: per block all-gathers into the column-parallel linears (again in backward) and "
            "reduce-scatters out of the row-parallel ones, the norms' gradients all-reduced"
            if sequence_parallel else "4L+2 all-reduces (Megatron)")
    return f"{words}, ring over t ({form}; the cross-entropy's 3 of b·s·4B)"


def paper_bytes(*, model, moe, train, dims: ParallelDims, micro_batch: int, precision) -> tuple[float | None, str]:
    """(bytes per rank per step, formula) by the ZeRO and Megatron volumes, ring convention.
    model, moe, train: the run's config sections; dims: its layout (with sequence parallelism the
    tensor-parallel collectives take the all-gather / reduce-scatter form); micro_batch: sequences per
    rank per micro-step; precision: the parallel.zero.PrecisionPolicy (compute: the activations' dtype;
    forward_params: the parameters FSDP2 gathers). A pipeline's data-parallel ranks reduce their own
    stages' gradients (Ψ of the rank holding the most) and its ranks all-reduce the loss (one fp32
    value); its point-to-point bytes are metrics.pipeline's."""
    if dims.experts_split:
        return None, f"expert{'' if dims.ep_enabled else ' tensor'} parallelism: no paper volume modelled"
    if dims.pp_enabled and dims.tp_enabled:
        return None, "pipeline with tensor parallelism: no paper volume modelled"
    n, t = dims.dp, dims.tp
    psi = rank_params(model, moe, dims)
    stage = dims.zero_applied
    total, parts = 0.0, []
    accum = train.grad_accum
    if dims.dp_enabled:
        # DDP all-reduces fp32 gradients (autocast keeps fp32 params), once per step (the worker skips the
        # sync on accumulation micro-batches with no_sync); FSDP2 gathers in param_dtype and reduces in fp32,
        # for every micro-batch.
        gathered = 2 if precision.forward_params == "bf16" else 4
        calls = data_parallel_collectives(psi, stage=stage, grad_accum=accum, grad_bytes=4, gather_bytes=gathered)
        total += sum(ring_bytes(c.kind, c.payload, n) * c.calls for c in calls)
        if stage in (0, 1):
            parts.append("2Ψ·4B·(N−1)/N" + (" (Ψ: the largest pipeline rank's)" if dims.pp_enabled else ""))
        else:
            gathers = 1 if stage == 2 else 2
            parts.append(f"({gathers}·{gathered}B + 4B)Ψ·(N−1)/N" + (" (≈3Ψ)" if stage == 3 else " (2Ψ)")
                         + (" per micro-batch" if accum > 1 else ""))
    if dims.tp_enabled:
        # the row-parallel matmuls' outputs in the compute dtype (full recompute repeats them); the residual
        # stream, and so its gradients, in fp32: autocast keeps it there.
        act = 2 if precision.compute == "bf16" else 4
        calls = tensor_parallel_collectives(model, moe, micro_batch=micro_batch, recompute=train.recompute,
                                            sequence_parallel=dims.sequence_parallel, act_bytes=act, grad_bytes=FP32)
        total += sum(ring_bytes(c.kind, c.payload, t) * c.calls for c in calls) * accum
        parts.append(tensor_parallel_formula(calls, micro_batch * model.seq_len, model.hidden, dims.sequence_parallel)
                     + (" per micro-batch" if accum > 1 else ""))
    if dims.cp_enabled:
        kv = 2 if precision.compute == "bf16" else 4
        by_kind = context_parallel_bytes(model=model, moe=moe, context=dims.cp, tensor=t, micro_batch=micro_batch,
                                         kv_bytes=kv)
        total += sum(by_kind.values()) * accum
        parts.append(f"context: 2·2(c−1)·b·T·(G/t)·D·{kv}B per layer (K/V all-gather, reduce-scatter)"
                     + (" + 2(c−1)·b·T·H·4B per MoE layer" if moe is not None else "")
                     + (" per micro-batch" if accum > 1 else ""))
    if dims.pp_enabled:
        total += ring_bytes("all_reduce", FP32, dims.pp)
        parts.append("the loss's all-reduce of 4B over the P stages")
    if not parts:
        return 0.0, "single process: no collectives"
    return total, " + ".join(parts)


def expert_rows_per_rank(tokens: int, moe, sharing: int) -> int:
    """The expert rows a rank dispatches per MoE layer, padding included: its chunk of the rows N = `tokens`
    routed tokens fill, cut as parallel/expert.py cuts the routed work over the `sharing` ranks t that route the
    same tokens (parallel/collectives.py's chunk_of: ceil(n/t) rows, the last chunk shorter): the capacity slots
    E·ceil(C/t) (every rank's chunk padded to that size), or dropless ceil(N·k/t) sorted rows (the largest
    chunk). One definition for the record formulas below and the predictor's rows (predict/moe.py); t = 1:
    all the routed rows."""
    if moe.dropless:
        return -(-tokens * moe.k // sharing)
    return moe.experts * -(-capacity(moe, tokens) // sharing)


def _rank_rows(*, model, moe, parallel, micro_batch: int) -> int:
    """expert_rows_per_rank of a run's sections: N the tokens routed together (a microbatch's, with context
    parallelism the group's context × microbatch sequences), t = tensor × context (the fold's ranks)."""
    tokens = micro_batch // parallel.n_microbatches * parallel.context * model.seq_len
    return expert_rows_per_rank(tokens, moe, parallel.tensor * parallel.context)


def expert_fold_gather_bytes(*, model, moe, parallel, micro_batch: int) -> int:
    """Bytes one rank sends per step in the all-gathers of experts folded over the t ranks that route the
    same tokens (parallel/expert.py; t = tensor × context): per MoE layer and microbatch one in forward and
    one in backward, each gathering the t chunks of the routed work, a rank sending its chunk (its rows:
    expert_rows_per_rank) of H fp32 values to t − 1 peers. 2·(t−1)·rows·H·4·L_moe·M with L_moe the model's
    MoE layers, for a layout without a pipeline (in one, a rank gathers for the MoE layers of its own stages
    only); 0 without both expert parallelism and t > 1."""
    t, m = parallel.tensor * parallel.context, parallel.n_microbatches
    if moe is None or parallel.expert == 1 or t == 1:
        return 0
    rows = _rank_rows(model=model, moe=moe, parallel=parallel, micro_batch=micro_batch)
    return 2 * (t - 1) * rows * model.hidden * FP32 * _moe_layer_count(model, moe) * m


def _bytes_beside_rows(moe, rows: int, expert_impl: str) -> int:
    """Bytes sent beside a rank's expert rows in forward: dropless the per-expert counts (E int64), with
    grouped_mm the capacity slots' filled mask (one byte a slot), else none."""
    if moe.dropless:
        return moe.experts * 8
    return rows if expert_impl == "grouped_mm" else 0


def expert_tensor_bytes(*, model, moe, parallel, micro_batch: int, expert_impl: str = "padded_bmm") -> dict[str, int]:
    """Bytes one rank sends per step in expert tensor parallelism's collectives (parallel/expert.py), by kind,
    over its etp = parallel.expert_tensor ranks: per MoE layer and microbatch the rows it received from the
    all-to-all are all-gathered before the experts and the partial outputs reduce-scattered after, and in
    backward the conjugates (a reduce-scatter and an all-gather), a rank sending (etp−1) × its rows of H fp32
    values in each. Its rows: expert_rows_per_rank (dropless the balanced share, exact under forced routing
    without a fold; the gathers pad every rank's rows to the largest, so routed loads send more). Beside them
    in forward, all-gathered too: dropless the per-expert counts, with grouped_mm the capacity slots' filled
    mask (_bytes_beside_rows). 2·(etp−1)·rows·H·4·L_moe·M of each kind for a layout without a pipeline (in
    one, a rank gathers for the MoE layers of its own stages only); {} with etp 1."""
    etp = parallel.expert_tensor
    if moe is None or etp == 1:
        return {}
    rows = _rank_rows(model=model, moe=moe, parallel=parallel, micro_batch=micro_batch)
    calls = _moe_layer_count(model, moe) * parallel.n_microbatches
    moved = 2 * (etp - 1) * rows * model.hidden * FP32 * calls
    beside = (etp - 1) * _bytes_beside_rows(moe, rows, expert_impl) * calls
    return {"all_gather": moved + beside, "reduce_scatter": moved}


@dataclass(frozen=True)
class ExpertAllToAllBytes:
    """Bytes one rank sends per step in expert parallelism's all-to-alls, in two parts: the token rows, and the
    small exchanges beside them (which a prediction leaves out)."""

    rows: float  # dispatch and combine, forward and backward
    beside: float  # forward only: dropless the per-expert counts, grouped_mm's filled-slot mask

    @property
    def total(self) -> float:
        """What metrics.comm counts as bytes_per_step_by_kind.all_to_all."""
        return self.rows + self.beside


def expert_all_to_all_bytes(*, model, moe, parallel, micro_batch: int,
                            expert_impl: str = "padded_bmm") -> ExpertAllToAllBytes:
    """Bytes one rank sends per step in expert parallelism's all-to-alls (parallel/expert.py) over its
    ep = parallel.expert ranks, as metrics.comm counts them (ring: a rank keeps 1/ep of each exchange): per MoE
    layer and microbatch the dispatch and the combine in forward and their reverses in backward, four
    exchanges of the rows the rank dispatches (expert_rows_per_rank) of H fp32 values, 4·(ep−1)/ep·rows·H·4;
    beside them in forward (ep−1)/ep of _bytes_beside_rows. Times L_moe·M for a layout without a pipeline (in
    one, a rank exchanges for the MoE layers of its own stages only) and without full recompute (which runs
    the forward's exchanges again). Dropless rows are the balanced share: exact when a rank sends every peer as
    many (forced routing without a fold); routed loads vary them step by step (all_to_all_bytes_by_step).
    Zero with expert 1."""
    ep = parallel.expert
    if moe is None or ep == 1:
        return ExpertAllToAllBytes(0.0, 0.0)
    rows = _rank_rows(model=model, moe=moe, parallel=parallel, micro_batch=micro_batch)
    calls = _moe_layer_count(model, moe) * parallel.n_microbatches
    return ExpertAllToAllBytes(rows=(ep - 1) * 4 * rows * model.hidden * FP32 * calls / ep,
                               beside=(ep - 1) * _bytes_beside_rows(moe, rows, expert_impl) * calls / ep)


def context_parallel_bytes(*, model, moe, context: int, tensor: int, micro_batch: int,
                           kv_bytes: int) -> dict[str, int]:
    """Bytes one rank sends per micro-step in context parallelism's collectives (parallel/context.py), by kind,
    over c = context ranks, each holding b = micro_batch sequences' worth of tokens (c·b sequences'
    shards of T/c): per layer the keys and values all-gathered in forward and their gradients
    reduce-scattered in backward, a rank sending its shard to c − 1 peers, 2·(c−1)·b·T·(G/t)·D values of
    kv_bytes each way (G key/value heads over t tensor ranks, D the head width); per MoE layer its input
    all-gathered in forward and its output's gradient in backward, 2·(c−1)·b·T·H fp32 values. {} without
    context parallelism."""
    from benchsuite.metrics.flops import _moe_layer_count

    c = context
    if c == 1:
        return {}
    kv = 2 * (c - 1) * micro_batch * model.seq_len * model.n_kv_heads // tensor * model.dim_head
    moe_rows = 2 * (c - 1) * micro_batch * model.seq_len * model.hidden * _moe_layer_count(model, moe)
    return {"all_gather": model.layers * kv * kv_bytes + moe_rows * FP32,
            "reduce_scatter": model.layers * kv * kv_bytes}


def comm_record(per_rank: list[dict], *, model, moe, train, dims: ParallelDims, micro_batch: int, applied) -> dict:
    """metrics.comm: rank 0's bytes by kind, the largest rank's total, and the paper's volume
    (arguments as paper_bytes; applied: what parallelize applied, parallel.Applied)."""
    valid = [r for r in per_rank if r]
    if not valid:
        return {"bytes_per_step_by_kind": None, "total_bytes_per_step": None, "paper_bytes_per_step": None,
                "ratio": None}
    r0 = valid[0]
    total = max(r["total_bytes"] for r in valid)
    paper, formula = paper_bytes(model=model, moe=moe, train=train, dims=dims, micro_batch=micro_batch,
                                 precision=applied.precision)
    notes = []
    if applied.zero_stage == 1:
        notes.append("torch's ZeroRedundancyOptimizer all-reduces full gradients and then broadcasts the updated "
                     "parameters: about 1.5x the paper's stage-1 volume")
    return {"bytes_per_step_by_kind": r0["bytes_by_kind"], "payload_bytes_per_step_by_kind": r0["payload_bytes_by_kind"],
            "calls_per_step_by_kind": r0["calls_by_kind"], "total_bytes_per_step": total,
            "per_rank_total_bytes": [r["total_bytes"] for r in valid],
            "paper_bytes_per_step": paper, "paper_formula": formula,
            **variable_all_to_all_section(valid),
            "ratio": (total / paper) if paper else None, "note": "; ".join(notes) or None,
            "method": "TorchDispatchMode over c10d and functional collectives during one warm-up step; "
                      "bytes sent per rank with ring algorithms"}


ALL_TO_ALL_BY_STEP_SOURCE = ("bytes the dropless expert all-to-alls sent to other ranks (token rows, forward and "
                             "backward) in each measured step, counted from the exchanges' split sizes")


def variable_all_to_all_section(per_rank: list[dict]) -> dict:
    """metrics.comm.all_to_all_bytes_by_step: the dropless exchange's bytes per measured step (they
    follow the routing) over steps and ranks, beside the counted step's bytes_per_step_by_kind;
    null with a reason where there is no such exchange. The worker puts each rank's list under
    comm["all_to_all_bytes_by_step"] (a list, or None for fixed splits) when experts are parallel."""
    if any("all_to_all_bytes_by_step" not in r for r in per_rank):
        return {"all_to_all_bytes_by_step": None, "all_to_all_bytes_by_step_reason": "no expert parallelism"}
    lists = [r["all_to_all_bytes_by_step"] for r in per_rank]
    if None in lists:
        return {"all_to_all_bytes_by_step": None, "all_to_all_bytes_by_step_reason":
                "fixed capacity-slot splits: every step sends the same bytes (bytes_per_step_by_kind.all_to_all)"}
    flat = [b for steps in lists for b in steps]
    return {"all_to_all_bytes_by_step": {
        "mean": sum(flat) / len(flat), "min": min(flat), "max": max(flat),
        "per_rank_mean": [sum(steps) / len(steps) for steps in lists], "steps": len(lists[0]),
        "source": ALL_TO_ALL_BY_STEP_SOURCE}, "all_to_all_bytes_by_step_reason": None}
