"""Pipeline parallelism (Narayanan et al. 2021, "PTD-P") with ``torch.distributed.pipelining``.

The plain GPT is split by layer index into P·V stages, as torchtitan's ``pipeline_module_split``
does: stage s holds blocks [s·L/(P·V), (s+1)·L/(P·V)); the token and position embeddings go to the
first stage, the final norm and the LM head (and so the loss) to the last. Stage s runs on
pipeline rank s mod P ("loop" placement: with V > 1 virtual stages a rank holds stages
r, r + P, ..., the interleaved layout of the paper). The model file knows nothing about ranks: a
stage is a :class:`StageModule` that takes the owned modules of the full model (tensor parallel,
when on, has already sharded them) and drops the rest. Stages need not hold as many blocks each:
layout.ParallelDims.stage_layers gives them (parallel.first_stage_layers / last_stage_layers, or the
first and last stages lighter when P·V does not divide L). A tied LM head gets its own copy of the
token embedding on the last stage, its gradient summed with the first stage's after each step
(tied_embedding_hook). Under sequence parallelism the stages send the tensor ranks' sequence shards.

MoE blocks run on any stage: each stage adds its layers' auxiliary losses to the microbatch's backward
through its output (AuxLossIntoGradient) and to the reported loss, and keeps the routing statistics of
its last microbatch for the worker, which gathers them over the pipeline.

Each stage module is then wrapped for data parallelism as the layout says (ParallelDims.data_parallel:
``replicate`` over the "dp" mesh dimension, DDP semantics that the pipeline stage knows how to defer to
the last microbatch) and handed to a ``PipelineStage``; the schedule (``Schedule1F1B``,
``ScheduleInterleaved1F1B`` or ``ScheduleGPipe``, the layout's) splits the rank's batch into M
microbatches, runs forward and backward, computes the loss on the last stage and scales the gradients
by 1/M, so they are those of the whole batch's mean loss. The mesh is pp × dp × tp (benchsuite/layout.py).

Measured figures (metrics.pipeline in the record, :func:`pipeline_section`):

- bubble: on each rank, the wall time W from the start of its schedule step to the pipeline's
  flush (the end of the last chunk of any rank: a loss all-reduce over the pipeline that no rank
  leaves before every rank has finished its schedule) minus the time B spent inside its stages'
  forward and backward chunks is idle (waiting for a neighbour, or for the flush), and (W − B) / B
  is the bubble over the ideal compute time, the ratio the formula (P − 1) / (V·M) of Narayanan et
  al. gives (their t_pb / t_id). Without the flush a rank whose schedule ends early (the last rank
  in 1F1B, which does no work while the backward drains to the first) would not count that wait.
  Per rank the median over the measured steps; the record has the mean over ranks. Point-to-point
  transfer time, the loss and its all-reduce and the schedule's own work per microbatch are counted
  as idle, so the measured figure is the formula plus that overhead, which grows with M: with small
  microbatches it can outweigh the bubble's fall (and a CPU shared by several ranks per core adds
  the time a rank waits for a core).
- point-to-point bytes: the tensors the stages' send ops carry, summed over the ranks of one
  pipeline (world / dp). Formula: between the P·V − 1 stage boundaries each of the M microbatches
  (b = B/M sequences of T tokens, H hidden) crosses once forward (activation) and once backward
  (its gradient), 4 bytes per value (the residual stream stays fp32, also under bf16 autocast),
  and each of the tp ranks of a stage sends the full activation: 2·(P·V − 1)·M·b·T·H·4·tp; under
  sequence parallelism each sends its T/tp positions, 2·(P·V − 1)·M·b·T·H·4 in all.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from benchsuite.config import ModelConfig, ParallelConfig, RunConfig, TrainConfig
from benchsuite.device import synchronize
from benchsuite.layout import PP, DataParallel, ParallelDims, Schedule
from benchsuite.models.transformer import embed
from benchsuite.parallel.zero import WRAPPER_NAMES, wrap_data_parallel

ACTIVATION_BYTES = 4  # fp32 residual stream between stages


class StageModule(nn.Module):
    """One stage of the GPT: the owned blocks, the embeddings on the first stage, the final norm and
    LM head on the last, and on every stage the rotary tables (buffers, no parameters) when positions
    are rotary. Takes the modules of `model` (no copy); `layer_ids` are the blocks' indices in the
    full model. forward: token ids (first stage) or activations -> activations or logits."""

    def __init__(self, model: nn.Module, layer_ids: list[int], first: bool, last: bool, sequence_shards: int = 1):
        super().__init__()
        self.cfg = model.cfg
        self.layer_ids = list(layer_ids)
        self.tok_emb = model.tok_emb if first else None
        self.pos_emb = model.pos_emb if first else None
        self.rope = model.rope
        self.blocks = nn.ModuleList(model.blocks[i] for i in layer_ids)
        self.ln_f = model.ln_f if last else None
        self.head = model.head if last else None
        if last and not first and model.cfg.tie_embeddings:  # the last stage's own copy (tied_embedding_hook)
            self.head.weight = nn.Parameter(model.tok_emb.weight.detach().clone())
        # the tensor ranks an incoming activation's sequence is split over (sequence parallelism; token ids: 1)
        self.sequence_shards = 1 if first else sequence_shards
        self.aux_losses: list[torch.Tensor] = []  # this step's auxiliary loss per microbatch (detached)
        self.routing: tuple = ()  # RoutingStats of the stage's MoE layers, last microbatch

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tok_emb is not None:
            x = embed(self.tok_emb, self.pos_emb, x)  # token ids in: the whole sequence
        rope = self.rope(x.shape[1] * self.sequence_shards) if self.rope is not None else None
        aux_total, routing = None, []
        for block in self.blocks:
            x, aux, stats = block(x, rope)
            if aux is not None:
                aux_total = aux if aux_total is None else aux_total + aux
            if stats is not None:
                routing.append(stats)
        if aux_total is not None:  # the stage's MoE auxiliary loss joins the backward through x
            x = AuxLossIntoGradient.apply(x, aux_total)
            self.aux_losses.append(aux_total.detach())
        self.routing = tuple(routing)
        return self.head(self.ln_f(x)) if self.head is not None else x

    def full_name(self, name: str) -> str:
        """A parameter's name in the full model ("blocks.0.x" of stage 2 may be "blocks.4.x")."""
        parts = name.split(".")
        if parts[0] == "blocks":
            parts[1] = str(self.layer_ids[int(parts[1])])
        return ".".join(parts)


def tied_embedding_hook(stages: list[StageModule], dims: ParallelDims):
    """A tied embedding over a pipeline (Megatron's embedding group): the first stage holds the token
    embedding, the last its own copy as the LM head's weight, equal at the start; after each step's last
    backward (and the data-parallel reduction) the two gradients are summed over the group of the first
    and the last pipeline rank with the same data- and tensor-parallel coordinates, so both hold the tied
    weight's gradient and the optimizer keeps them equal. Every rank builds every group (new_group is
    collective); returns the hook of this rank (None when it holds neither end)."""
    p, dp, tp = dims.pp, dims.dp, dims.tp
    mine = None
    for d in range(dp):
        for t in range(tp):
            ranks = [d * tp + t, ((p - 1) * dp + d) * tp + t]  # rank = (pp·dp + dp_rank)·tp + tp_rank
            group = dist.new_group(ranks)
            if dist.get_rank() in ranks:
                mine = group
    ends = [s.tok_emb if s.tok_emb is not None else s.head for s in stages
            if s.tok_emb is not None or s.head is not None]
    if not ends:
        return None

    def sync() -> None:  # reads .weight now: a data-parallel wrapper registers parameters of its own
        for module in ends:
            grad = module.weight.grad
            dist.all_reduce(grad.to_local() if hasattr(grad, "to_local") else grad, group=mine)
    return sync


class AuxLossIntoGradient(torch.autograd.Function):
    """Identity on the activation x; its backward also starts the backward of `aux`, the stage's summed
    MoE auxiliary loss, with gradient 1 (Megatron's MoEAuxLossAutoScaler). The loss lives on the last
    stage only, so each stage adds its own auxiliary loss to the microbatch's backward here; the
    schedule's 1/M scaling of the gradients then makes the step's gradient that of the mean over the
    microbatches of (cross-entropy + every stage's auxiliary loss), as one process accumulating them."""

    @staticmethod
    def forward(ctx, x, aux):
        ctx.aux_shape = aux.shape
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad, grad.new_ones(ctx.aux_shape, dtype=torch.float32)


def next_token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The worker's loss on a microbatch's logits (vocab-parallel under tensor parallelism, inside
    loss_parallel(), where the result is a replicated DTensor scalar made plain)."""
    loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
    return loss.full_tensor() if hasattr(loss, "full_tensor") else loss


class SpanClock:
    """Seconds spent inside spans: perf_counter on CPU, CUDA events on GPU (read once per step,
    so the step itself is not synchronised)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.seconds = 0.0
        self.events: list = []

    @contextlib.contextmanager
    def span(self):
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
            self.events.append((start, end))
        else:
            t0 = time.perf_counter()
            yield
            self.seconds += time.perf_counter() - t0

    def take(self) -> float:
        """The seconds since the last take."""
        if self.events:
            synchronize(torch.device("cuda"))  # the current device, where the events were recorded
            self.seconds += sum(s.elapsed_time(e) for s, e in self.events) / 1e3
            self.events.clear()
        out, self.seconds = self.seconds, 0.0
        return out


def _tensor_bytes(ops) -> int:
    return sum(op.tensor.numel() * op.tensor.element_size() for op in ops)


def _timed_stage_class():
    from torch.distributed.pipelining import PipelineStage

    class TimedStage(PipelineStage):
        """A PipelineStage that adds its compute time to a SpanClock and counts the bytes it sends."""

        def __init__(self, *args, clock: SpanClock, **kwargs):
            super().__init__(*args, **kwargs)
            self.clock, self.sent_bytes = clock, 0

        def forward_one_chunk(self, *args, **kwargs):
            with self.clock.span():
                return super().forward_one_chunk(*args, **kwargs)

        def backward_one_chunk(self, *args, **kwargs):
            with self.clock.span():
                return super().backward_one_chunk(*args, **kwargs)

        def get_fwd_send_ops(self, *args, **kwargs):
            ops = super().get_fwd_send_ops(*args, **kwargs)
            self.sent_bytes += _tensor_bytes(ops)
            return ops

        def get_bwd_send_ops(self, *args, **kwargs):
            ops = super().get_bwd_send_ops(*args, **kwargs)
            self.sent_bytes += _tensor_bytes(ops)
            return ops

    return TimedStage


@dataclass(frozen=True)
class StepSample:
    """One schedule step on one rank."""

    wall_s: float  # the schedule's step, from its start to the pipeline's flush
    busy_s: float  # inside this rank's forward and backward chunks
    sent_bytes: int  # in this rank's point-to-point sends


@dataclass
class PipelineRun:
    """This rank's stages and schedule; forward_backward replaces the worker's forward/backward loop."""

    schedule: object
    stages: list
    pp_group: object
    pp: int
    device: torch.device
    busy: SpanClock  # the stages' chunks
    wall: SpanClock  # the schedule's steps, each up to the pipeline's flush
    tied_sync: object | None = None  # a tied embedding's gradient sum over the end stages (tied_embedding_hook)
    keep_outputs: bool = False  # keep the last stage's merged logits in last_outputs (tests)
    last_outputs: torch.Tensor | None = None
    samples: list[StepSample] = field(default_factory=list)

    @property
    def has_first(self) -> bool:
        return any(s.is_first for s in self.stages)

    @property
    def has_last(self) -> bool:
        return any(s.is_last for s in self.stages)

    def forward_backward(self, batches) -> torch.Tensor:
        """One schedule step over the rank's batch (grad_accum is 1 under a pipeline); returns the mean
        of the microbatch losses, the same on every rank of the pipeline (all-reduced from the last)."""
        (inputs, targets), = batches
        losses: list = []
        sent_before = sum(s.sent_bytes for s in self.stages)
        with self.wall.span():
            out = self.schedule.step(*([inputs] if self.has_first else []),
                                     target=targets if self.has_last else None,
                                     losses=losses if self.has_last else None, return_outputs=self.keep_outputs)
            loss = torch.stack(losses).mean().detach() if self.has_last else torch.zeros((), device=self.device)
            loss = loss + self.take_aux_loss()
            # The flush: a sum (the loss and each rank's auxiliary losses) no rank leaves before every rank
            # of the pipeline has finished its schedule, so a rank whose own schedule ends early waits here.
            dist.all_reduce(loss, group=self.pp_group)
        self.last_outputs = out if self.keep_outputs else None
        self.samples.append(StepSample(self.wall.take(), self.busy.take(),
                                       sum(s.sent_bytes for s in self.stages) - sent_before))
        return loss

    def modules(self) -> list[StageModule]:
        """This rank's stage modules, in stage order (unwrapped from their data-parallel wrapper: the same
        objects, FSDP2's wrappers are the modules themselves)."""
        return [s.submod for s in self.stages]

    def take_aux_loss(self) -> torch.Tensor:
        """The mean over this step's microbatches of this rank's stages' auxiliary losses (0 without any),
        cleared for the next step."""
        total = torch.zeros((), device=self.device)
        for stage in self.modules():
            if stage.aux_losses:
                total = total + torch.stack(stage.aux_losses).mean()
                stage.aux_losses.clear()
        return total

    def routing(self) -> tuple:
        """The RoutingStats of this rank's MoE layers in the last microbatch, in layer order."""
        return tuple(stats for stage in self.modules() for stats in stage.routing)

    def moe_layer_ids(self) -> list[int]:
        """The model-wide block index of each MoE layer this rank holds, in the order of routing()."""
        from benchsuite.models.moe import MoELayer

        return [i for stage in self.modules() for i, block in zip(stage.layer_ids, stage.blocks)
                if isinstance(block.ffn, MoELayer)]  # a checkpoint wrapper forwards .ffn

    def figures(self) -> dict:
        """This rank's per-step samples as plain lists (gathered to rank 0 for pipeline_section)."""
        return {"stages": [s.stage_index for s in self.stages], "wall_s": [x.wall_s for x in self.samples],
                "busy_s": [x.busy_s for x in self.samples], "sent_bytes": [x.sent_bytes for x in self.samples]}


SCHEDULE_NAMES = {Schedule.ONE_F_ONE_B: "Schedule1F1B", Schedule.INTERLEAVED: "ScheduleInterleaved1F1B",
                  Schedule.GPIPE: "ScheduleGPipe"}


def make_schedule(schedule: Schedule, stages: list, microbatches: int, loss_fn):
    from torch.distributed import pipelining

    cls = getattr(pipelining, SCHEDULE_NAMES[schedule])
    return cls(stages if schedule is Schedule.INTERLEAVED else stages[0], n_microbatches=microbatches,
               loss_fn=loss_fn)


def wrap_stage(module: nn.Module, dims: ParallelDims, device: torch.device) -> tuple[nn.Module, str]:
    """(stage, implementation name): the stage wrapped as dims.data_parallel says, which for a pipeline
    is ``replicate`` over the dp mesh dimension (DDP semantics on FSDP2's machinery): the pipeline stage
    defers its gradient all-reduce to the last microbatch's backward. (torch's DDP under a pipeline fails
    when rebuilding its buckets after accumulating microbatches, torch 2.13.)"""
    if dims.data_parallel is DataParallel.NONE:
        return module, "none (pipeline only)" if not dims.tp_enabled else "none (pipeline and tensor parallel)"
    if dims.data_parallel is DataParallel.REPLICATE:
        return wrap_data_parallel(module, dims, device), "replicate_with_fsdp over dp, per stage"
    return wrap_data_parallel(module, dims, device), f"{WRAPPER_NAMES[dims.data_parallel]} over dp, per stage"


def example_io(first: bool, last: bool, plan: PipelinePlan, cfg, tp: int, logits_dtype: torch.dtype,
               sequence_shards: int = 1):
    """(input, output) meta tensors of one stage for one microbatch: the static shapes PipelineStage
    takes instead of inferring them with a trial forward and backward in the first step (that trial
    runs ``autograd.grad``, which FlopCounterMode's module hooks do not support). Token ids enter the
    first stage, fp32 activations [b, T, H] (and their gradients, hence requires_grad) cross every
    boundary, [b, T/t, H] under sequence parallelism (sequence_shards t: each tensor rank sends its
    shard), the last stage's logits are this rank's vocab shard. b and T: the plan's rows and their length."""
    b, t = plan.microbatch_size, plan.seq_len
    act = torch.empty(b, t // sequence_shards, cfg.hidden, device="meta", requires_grad=True)
    ids = torch.empty(b, t, dtype=torch.long, device="meta")
    logits = torch.empty(b, t, cfg.vocab // tp, dtype=logits_dtype, device="meta", requires_grad=True)
    return (ids if first else act), (logits if last else act)


@dataclass(frozen=True)
class PipelinePlan:
    """A pipelined run's batch split: M microbatches per step of `microbatch_size` rows each, every row
    `seq_len` tokens long (with context parallelism c: c times the rows, each a 1/c shard of its sequence;
    parallel/context.py). The stages and the schedule are the layout's: ParallelDims."""

    microbatches: int
    microbatch_size: int
    seq_len: int

    @classmethod
    def from_run(cls, run: RunConfig) -> PipelinePlan:
        n, c = run.parallel.n_microbatches, run.parallel.context
        return cls(n, run.micro_batch_per_rank * c // n, run.model.seq_len // c)


def apply_pipeline(model: nn.Module, *, dims: ParallelDims, plan: PipelinePlan, device: torch.device,
                   logits_dtype: torch.dtype = torch.float32,
                   loss_fn=next_token_loss) -> tuple[nn.ModuleList, PipelineRun, dict]:
    """Split `model` into this rank's stages, wrap each for data parallelism and build the schedule
    (parallel/__init__.py calls it after tensor parallel and recompute).

    Returns (the rank's stage modules, as one ModuleList for the optimizer and the probes; the run;
    the names of what was applied, the Applied fields "pipeline" and "data")."""
    pp, num_stages, pp_group = dims.pp, dims.num_stages, dims.group(PP)
    busy = SpanClock(device)
    timed_stage = _timed_stage_class()
    modules, stages, data = [], [], ""
    ids = dims.stage_ids(dims.mesh.get_local_rank(PP))
    shards = dims.tp if dims.sequence_parallel else 1
    parts = [StageModule(model, dims.stage_layers(s, model.cfg.layers), s == 0, s == num_stages - 1, shards)
             for s in ids]
    tied = tied_embedding_hook(parts, dims) if model.cfg.tie_embeddings else None
    for s, part in zip(ids, parts):
        first, last = s == 0, s == num_stages - 1
        part, data = wrap_stage(part, dims, device)
        modules.append(part)
        inputs, outputs = example_io(first, last, plan, model.cfg, dims.tp, logits_dtype, shards)
        stages.append(timed_stage(part, s, num_stages, device, input_args=inputs, output_args=outputs,
                                  group=pp_group, clock=busy))
    run = PipelineRun(make_schedule(dims.schedule, stages, plan.microbatches, loss_fn), stages, pp_group, pp,
                      device, busy, SpanClock(device), tied_sync=tied)
    names = {"pipeline": f"torch.distributed.pipelining {SCHEDULE_NAMES[dims.schedule]}: {pp} ranks x "
                         f"{dims.virtual_stages} stage(s), {plan.microbatches} microbatches", "data": data}
    return nn.ModuleList(modules), run, names


# ------------------------------------------------------------------ record figures

def bubble_formula(pp: int, virtual: int, microbatches: int) -> float:
    """(P − 1) / (V·M): pipeline bubble time over ideal compute time (Narayanan et al. 2021, §2.2)."""
    return (pp - 1) / (virtual * microbatches)


def p2p_bytes_formula(*, parallel: ParallelConfig, model: ModelConfig, micro_batch: int) -> int:
    """Bytes all stages of one pipeline send per step: 2·(P·V − 1)·M·b·T·H·4·tp, b = B/M, B = micro_batch
    (sequences per rank per step; see the module docstring); under sequence parallelism each tensor rank
    sends its T/tp positions: 2·(P·V − 1)·M·b·T·H·4."""
    p = parallel
    b = micro_batch // p.n_microbatches
    senders = 1 if p.sequence_parallel and p.tensor > 1 else p.tensor
    return (2 * (p.pipeline * p.virtual_stages - 1) * p.n_microbatches * b * model.seq_len * model.hidden
            * ACTIVATION_BYTES * senders)


def rank_bubble(fig: dict, steps: int) -> float | None:
    """Median over the last `steps` (measured) steps of (wall − busy) / busy on one rank."""
    pairs = [(w, b) for w, b in zip(fig["wall_s"][-steps:], fig["busy_s"][-steps:]) if b > 0]
    return statistics.median((w - b) / b for w, b in pairs) if pairs else None


def pipeline_section(figs: list[dict], *, parallel: ParallelConfig, model: ModelConfig, train: TrainConfig,
                     micro_batch: int, data_parallel: int) -> dict:
    """metrics.pipeline: the bubble measured beside (P−1)/(V·M), point-to-point bytes beside the formula.
    figs: each rank's PipelineRun.figures(); micro_batch: sequences per rank per step; data_parallel: the
    pipelines (world / (pp·tp)), whose ranks' sent bytes are summed together."""
    p, steps = parallel, train.steps
    per_rank = [rank_bubble(f, steps) for f in figs]
    known = [b for b in per_rank if b is not None]
    sent = sum(statistics.median(f["sent_bytes"][-steps:]) for f in figs) / data_parallel
    return {
        "stages": p.pipeline, "virtual_stages": p.virtual_stages, "microbatches": p.n_microbatches,
        "schedule": p.schedule,
        "bubble_measured": statistics.fmean(known) if known else None,
        "bubble_per_rank": per_rank,
        "bubble_formula": bubble_formula(p.pipeline, p.virtual_stages, p.n_microbatches),
        "bubble_source": "per rank: (time from its schedule's start to the pipeline's flush - time in its "
                         "forward/backward chunks) / that time, median over measured steps; mean over ranks. "
                         "Formula (P-1)/(V*M), Narayanan et al. 2021",
        "p2p_bytes_per_step": sent,
        "p2p_bytes_formula": p2p_bytes_formula(parallel=parallel, model=model, micro_batch=micro_batch),
        "p2p_source": "bytes in the stages' send ops, summed over one pipeline's ranks (world / dp); formula "
                      "2*(P*V-1)*M*b*T*H*4*tp (sequence parallel: without the tp)",
        "activation_bytes_per_stage": None,
        "activation_reason": "not measured: the allocator peak mixes activations with weights and optimizer state",
    }
