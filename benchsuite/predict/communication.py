"""Communication time: each collective costs latency + the bytes one rank sends / the link's bandwidth.

Bytes follow metrics.comm's ring convention (all-reduce 2(n−1)/n·M, the others (n−1)/n·M), the link is
the system's intra-node or inter-node one by whether the group spans nodes (ranks are laid out pp × dp ×
tp, tp fastest, as layout.ParallelDims builds its mesh). Which collectives run comes from metrics.comm:
tensor_parallel_collectives (per micro-batch, Megatron's all-reduces or, with sequence parallelism, its
reduce-scatter/all-gather pairs) and data_parallel_collectives (per step, DDP and ZeRO 1-3).

Who issues a collective matters on a host that does not run ahead of its device (a CPU): DTensor (tensor
parallelism) and FSDP2 (the data-parallel wrappers on its machinery, DataParallel.fsdp of the layout:
ZeRO-2/3, and replicate_with_fsdp beside tensor or pipeline parallelism) spend Python host time on each
one, the system's `framework_us`; DDP's reducer, the expert all-to-alls and the pipeline's sends call
c10d directly.

Overlap model, stated: tensor-parallel (but Megatron's sequence-parallel re-gather, which overlaps the
input-gradient GEMM) and pipeline point-to-point transfers sit on the critical path (each waits for the
compute before it and the compute after waits for it); the expert all-to-all too, but for the system's
`ep_overlap` share of it (0 in the shipped files: neither the harness nor the Megatron-Core of the
published MoE rows overlaps it). Data-parallel communication overlaps compute by the system's `dp_overlap`: DDP and ZeRO-1 all-reduce gradient buckets
while the last micro-batch's backward runs; FSDP2 (ZeRO-2/3) prefetches each micro-batch's gathers and
reduce-scatters beside its forward and backward. Only the part longer than that compute is exposed.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from benchsuite.metrics.comm import (Collective, context_parallel_bytes, data_parallel_collectives, ring_bytes,
                                     tensor_parallel_collectives)
from benchsuite.predict.compute import expert_params_per_device
from benchsuite.predict.moe import rows_per_device
from benchsuite.predict.system import Link, System
from benchsuite.predict.workload import Implementation, Recompute, Workload


@dataclass(frozen=True)
class CommTime:
    """Seconds and bytes sent by one rank for one group of collectives."""

    seconds: float
    bytes_sent: float
    calls: int
    crosses_nodes: bool
    framework_s: float = 0.0  # of `seconds`, the issuing framework's host time (System.node.framework_us)

    def plus(self, other: CommTime) -> CommTime:
        """Both groups of collectives, one after the other."""
        return CommTime(self.seconds + other.seconds, self.bytes_sent + other.bytes_sent, self.calls + other.calls,
                        self.crosses_nodes or other.crosses_nodes, self.framework_s + other.framework_s)


def time_of(calls: list[Collective], group: int, link: Link, crosses_nodes: bool,
            framework_us: float = 0.0) -> CommTime:
    """framework_us: the issuing framework's host time per call (System.node.framework_us or 0)."""
    if group <= 1:
        return CommTime(0.0, 0.0, 0, crosses_nodes)
    sent = sum(ring_bytes(c.kind, c.payload, group) * c.calls for c in calls)
    n = sum(c.calls for c in calls)
    exposed = [c for c in calls if not c.overlapped]
    per_call = (link.latency_us + framework_us) * 1e-6
    seconds = sum(c.calls * (per_call + ring_bytes(c.kind, c.payload, group) / (link.gbps * 1e9)) for c in exposed)
    return CommTime(seconds, sent, n, crosses_nodes, framework_us * 1e-6 * sum(c.calls for c in exposed))


def ranks_per_node(w: Workload, system: System) -> int:
    """The ranks one node holds: the run's own placement (its world over its nodes, as the harness launches
    it, even past the system's devices per node: CPU ranks share cores), else the system's node filled."""
    return system.node.devices_per_node if w.nodes is None else -(-w.layout.world // w.nodes)


def _spans(group: int, stride: int, w: Workload, system: System) -> bool:
    """Whether a group of `group` ranks `stride` apart spans more than one node."""
    return group > 1 and group * stride > ranks_per_node(w, system)


def _stage_model(w: Workload):
    """One pipeline stage's layers (the tensor-parallel and expert collectives run per layer)."""
    return msgspec.structs.replace(w.model, layers=max(1, w.model.layers // w.layout.pp))


def tensor_parallel(w: Workload, system: System) -> CommTime:
    """Per micro-batch, on the tensor-parallel group."""
    calls = tensor_parallel_collectives(_stage_model(w), w.moe, micro_batch=w.micro_batch,
                                        recompute="full" if w.recompute is Recompute.FULL else "none",
                                        sequence_parallel=w.layout.sequence_parallel, act_bytes=w.compute_bytes,
                                        grad_bytes=w.grad_bytes, megatron=w.implementation is Implementation.MEGATRON)
    crosses = _spans(w.layout.tp, 1, w, system)
    dtensor = system.node.framework_us if w.implementation is Implementation.BENCHSUITE else 0.0
    return time_of(calls, w.layout.tp, system.link(crosses), crosses, dtensor)


def expert_parallel(w: Workload, system: System) -> CommTime:
    """Per micro-batch: each MoE layer's dispatch and combine all-to-alls, forward and backward (and the
    forward's again under full recompute), of the rows the device dispatches (rows_per_device: its chunk of
    the expert rows its routed tokens fill, E·C/N per token with capacity, k dropless, split over the ranks of
    a fold) × hidden, fp32 here (the rows are cut from the fp32 residual stream, the experts cast inside:
    metrics.comm's formulas) and Megatron's compute dtype: the rows of metrics.comm.expert_all_to_all_bytes,
    not the small exchanges beside them.

    Placement: the group is EP ranks ETP apart (the folded expert layout, layout.py, as Megatron's MoE
    Parallel Folding places it; consecutive with ETP 1). Inside a node every byte
    crosses NVLink (or the host's link); across nodes a rank's (EP − n)/EP of its payload leaves the node
    at the inter-node bandwidth while (n − 1)/EP stays inside, n = the group's ranks per node, both at once:
    time = latency + max(inside / intra bandwidth, outside / inter bandwidth)."""
    if w.moe is None or w.layout.ep <= 1:
        return CommTime(0.0, 0.0, 0, False)
    from benchsuite.metrics.flops import _moe_layer_count

    ep = w.layout.ep
    payload = rows_per_device(w) * w.model.hidden * w.grad_bytes
    calls = (4 + (2 if w.recompute is Recompute.FULL else 0)) * _moe_layer_count(_stage_model(w), w.moe)
    crosses = _spans(ep, w.layout.etp, w, system)
    sent = ring_bytes("all_to_all", payload, ep) * calls
    if not crosses:
        return time_of([Collective("all_to_all", payload, calls)], ep, system.intra_node, False)
    local = max(1, min(ep, ranks_per_node(w, system) // w.layout.etp))
    inside = payload * (local - 1) / ep / (system.intra_node.gbps * 1e9)
    outside = payload * (ep - local) / ep / (system.inter_node.gbps * 1e9)
    return CommTime(calls * (system.inter_node.latency_us * 1e-6 + max(inside, outside)), sent, calls, True)


def expert_tensor_parallel(w: Workload, system: System) -> CommTime:
    """Per micro-batch, on the expert-tensor-parallel group (ETP consecutive ranks, layout.py): per MoE layer the
    rows the device received all-gathered before the experts and the partial outputs reduce-scattered after,
    their conjugates in backward (and the forward's again under full recompute), each ETP × the device's
    expert rows (rows_per_device) × hidden, in expert_parallel's dtype: the bytes
    metrics.comm.expert_tensor_bytes counts but for the per-expert counts beside them, on the critical path."""
    etp = w.layout.etp
    if w.moe is None or etp <= 1:
        return CommTime(0.0, 0.0, 0, False)
    from benchsuite.metrics.flops import _moe_layer_count

    payload = etp * rows_per_device(w) * w.model.hidden * w.grad_bytes
    calls = (2 + (1 if w.recompute is Recompute.FULL else 0)) * _moe_layer_count(_stage_model(w), w.moe)
    crosses = _spans(etp, 1, w, system)
    return time_of([Collective("all_gather", payload, calls), Collective("reduce_scatter", payload, calls)], etp,
                   system.link(crosses), crosses)


def context_parallel(w: Workload, system: System) -> CommTime:
    """Per micro-batch, on the context-parallel group (cp consecutive data-parallel ranks, tp apart): per layer
    the keys and values all-gathered in forward and their gradients reduce-scattered in backward, per MoE
    layer its input gathered and its output's gradient, the bytes metrics.comm.context_parallel_bytes counts
    (the record's formula), all on the critical path."""
    cp = w.layout.cp
    if cp <= 1:
        return CommTime(0.0, 0.0, 0, False)
    from benchsuite.metrics.flops import _moe_layer_count

    stage = _stage_model(w)
    sent = sum(context_parallel_bytes(model=stage, moe=w.moe, context=cp, tensor=w.layout.tp,
                                      micro_batch=w.micro_batch, kv_bytes=w.compute_bytes).values())
    calls = 2 * stage.layers + 2 * _moe_layer_count(stage, w.moe)
    crosses = _spans(cp, w.layout.tp, w, system)
    link = system.link(crosses)
    return CommTime(calls * link.latency_us * 1e-6 + sent / (link.gbps * 1e9), sent, calls, crosses)


def data_parallel(w: Workload, system: System, psi: float) -> CommTime:
    """Per step, for psi parameters per device: the replicated ones on the data-parallel group; with expert
    parallelism the device's experts only on the ranks that hold the same experts (edp = dp·tp / ep)."""
    benchsuite = w.implementation is Implementation.BENCHSUITE
    grad = 4 if benchsuite else w.compute_bytes  # fp32 gradients here; Megatron reduces bf16 ones
    gather = 4 if benchsuite else w.compute_bytes  # FSDP2 here gathers the fp32 parameters; Megatron bf16 ones
    experts = expert_params_per_device(w)
    units = max(1, w.model.layers // w.layout.pp) + (1 if w.model.tie_embeddings else 2)  # fully_shard units
    dense = data_parallel_collectives(psi - experts, stage=w.layout.zero, grad_accum=w.microbatches,
                                      grad_bytes=grad, gather_bytes=gather, zero1_broadcast=benchsuite, units=units)
    crosses = _spans(w.layout.dp, w.layout.tp, w, system)
    fsdp = benchsuite and w.layout.data_parallel.fsdp
    out = time_of(dense, w.layout.dp, system.link(crosses), crosses, system.node.framework_us if fsdp else 0.0)
    replicas = w.layout.edp
    if experts and replicas > 1:
        out = out.plus(time_of(data_parallel_collectives(experts, stage=0, grad_accum=1, grad_bytes=grad,
                                                         gather_bytes=gather), replicas, system.link(crosses), crosses))
    return out


def pipeline_p2p(w: Workload, system: System) -> CommTime:
    """Per step: each micro-batch crosses each of the P·V − 1 stage boundaries once forward (its
    activation) and once backward (its gradient), b·s·h values each, fp32 here (every tensor rank sends
    the whole tensor); Megatron-LM sends 1/tp of it (the scatter/gather optimisation, Narayanan et al.
    2021, §4.1). Bytes: the whole pipeline's, as metrics.pipeline.p2p_bytes_per_step counts them. Time:
    the sends of the busiest rank, all on the critical path: 2·M·V, less the M forward sends the last
    stage and the M backward sends the first stage do not make when they are the same rank's."""
    if w.layout.pp <= 1:
        return CommTime(0.0, 0.0, 0, False)
    bsh = w.micro_batch * w.model.seq_len * w.model.hidden
    benchsuite = w.implementation is Implementation.BENCHSUITE
    payload = bsh * w.grad_bytes if benchsuite else bsh * w.compute_bytes / w.layout.tp
    m, p, v = w.microbatches, w.layout.pp, w.layout.virtual_stages
    busiest = 2 * m * v - (m if p == 2 and v == 1 else 0)  # P = 2, V = 1: each rank sends one way only
    crosses = w.layout.dp * w.layout.tp >= ranks_per_node(w, system)
    link = system.link(crosses)
    sent = 2 * (p * v - 1) * m * payload * (w.layout.tp if benchsuite else 1)
    return CommTime(busiest * (link.latency_us * 1e-6 + payload / (link.gbps * 1e9)), sent, busiest, crosses)
