"""The parallel layout of a run, the one answer to every question about it (as torchtitan's ParallelDims).

The harness (parallel/), the record's figures (metrics/) and the predictor (predict/) all ask it: the
degrees, which dimensions are on, the ZeRO stage that runs, how data parallelism is wrapped, the pipeline's
stages, and the device meshes over the ranks (build_meshes, the only part that needs torch).

How data parallelism is wrapped (`DataParallel`, the harness's choice):

- one data-parallel rank: nothing to wrap (a ZeRO stage asked for shards nothing);
- ZeRO stages 2 and 3: FSDP2's fully_shard over the "dp" mesh dimension without and with resharding
  after forward, beside tensor parallelism too (2-D: it shards the tensor-parallel DTensors further) and
  per stage under a pipeline;
- otherwise, tensor or pipeline parallelism beside it: replicate_with_fsdp over "dp", DDP semantics on
  FSDP2's machinery (torch's DDP refuses DTensor parameters, and fails under a pipeline's microbatches);
  a pipeline wraps each of its stages;
- otherwise ZeRO stage 0 is DDP, stage 1 DDP with ZeroRedundancyOptimizer.

ZeRO stage 1 shards plain data parallelism only: beside tensor, pipeline or expert parallelism it is
refused (ZeroRedundancyOptimizer partitions plain tensors, and would broadcast one rank's expert shard over
ranks that hold other experts); stages 2 and 3 run with each (FSDP2 shards the experts over their own
expert-data-parallel group).

The experts' layout is folded over the dense one (Liu et al. 2025, "MoE Parallel Folding"; torchtitan's
ParallelDims): attention and the dense layers run on pp × dp × tp, the routed experts on pp × edp × ep × etp.
Ranks are numbered as Megatron-Core's expert RankGenerator numbers them (order tp-cp-ep-dp-pp with cp 1,
expert-TP fastest): within a pipeline stage the dp·tp ranks are split into groups of etp consecutive ranks (expert
tensor parallelism: each expert's FFN width split over them), ep such groups etp apart form an
expert-parallel group, and edp = dp·tp / (ep·etp) of those hold the same expert shards. The two layouts
share only the pipeline stages (Megatron's one requirement: the same pp groups); an expert group need not
match a tensor-parallel one. With etp = 1 (each expert whole on one rank) expert parallelism borrows
tensor-parallel ranks first (ep = tp: the experts of a tensor-parallel group are spread over its ranks) and
data-parallel ranks after; with etp = tp (Megatron's default) the expert-tensor group is the tensor one.

Context parallelism (parallel/context.py) splits the data-parallel ranks further: cp consecutive ones
share a batch of cp·b sequences, each holding a 1/cp shard of every sequence, so the data-parallel wrapper
(over all dp ranks) averages their gradients as it does any data-parallel rank's, and a stage has
dp_batches = dp / cp distinct batches. The context mesh (dp / cp) x cp x tp gives the context-parallel
group and the cp·tp ranks that hold the same tokens once an MoE layer has gathered the sequence.

A pipeline's stages hold stage_layers(s) blocks (config.rules.stage_layer_counts): the first and last
stages `parallel.first_stage_layers` and `last_stage_layers` when given (Megatron's
--decoder-first/last-pipeline-num-layers) and the other stages the rest in equal parts; by default L/(P·V)
each, the remainder going to the middle stages first, so the first and last stages (which also hold the
embedding and the LM head) are the lighter ones.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace

from benchsuite.config import RunConfig
from benchsuite.config.rules import stage_layer_counts

# The mesh axes, named once. The main mesh is pp x dp x tp (pp only with pipeline > 1), ranks laid out
# pp-major and tp-minor; the expert mesh is pp x edp x ep (x etp with etp > 1) over the same ranks, etp-minor
# (module docstring: folding).
PP, DP, TP = "pp", "dp", "tp"
EDP, EP, ETP = "edp", "ep", "etp"
CP, CP_BATCH, CP_TP = "cp", "cp_batch", "cp_tp"  # the context mesh: pp x (dp / cp) x cp x tp


class Schedule(enum.Enum):
    ONE_F_ONE_B = "1f1b"
    INTERLEAVED = "interleaved"
    GPIPE = "gpipe"


class DataParallel(enum.Enum):
    """How the data-parallel ranks are wrapped (module docstring)."""

    NONE = "none"  # a single data-parallel rank
    DDP = "ddp"  # DistributedDataParallel (ZeRO stage 0)
    ZERO1 = "zero1"  # DDP + ZeroRedundancyOptimizer
    FSDP_STAGE2 = "fsdp_stage2"  # FSDP2 fully_shard(reshard_after_forward=False)
    FSDP_STAGE3 = "fsdp_stage3"  # FSDP2 fully_shard(reshard_after_forward=True)
    REPLICATE = "replicate"  # replicate_with_fsdp: DDP semantics on FSDP2's machinery

    @property
    def fsdp(self) -> bool:
        """Whether FSDP2's machinery issues the collectives (Python host time on each one)."""
        return self in (DataParallel.FSDP_STAGE2, DataParallel.FSDP_STAGE3, DataParallel.REPLICATE)


ZERO_WRAPPERS = (DataParallel.DDP, DataParallel.ZERO1, DataParallel.FSDP_STAGE2, DataParallel.FSDP_STAGE3)


@dataclass(frozen=True)
class ParallelDims:
    """The parallel layout, validated once, and the device meshes over it (build_meshes); code
    branches on the *_enabled flags and data_parallel, and takes process groups from here."""

    world: int
    tp: int = 1
    ep: int = 1
    zero: int = 0
    pp: int = 1
    virtual_stages: int = 1  # pipeline stages per rank (V)
    schedule: Schedule = Schedule.ONE_F_ONE_B
    sequence_parallel: bool = False  # Megatron's sequence parallelism beside tensor parallelism
    layers_per_stage: tuple[int, ...] | None = None  # blocks per stage (None: config.rules.stage_layer_counts')
    cp: int = 1  # context parallelism: the data-parallel ranks that share a batch, each a sequence shard
    etp: int = 1  # expert tensor parallelism: the ranks that split each expert's FFN width
    mesh: object | None = field(default=None, compare=False, repr=False)  # DeviceMesh (PP,) DP, TP
    ep_mesh: object | None = field(default=None, compare=False, repr=False)  # DeviceMesh (PP,) EDP, EP (, ETP)
    cp_mesh: object | None = field(default=None, compare=False, repr=False)  # DeviceMesh CP_BATCH, CP, TP
    cp_tp_mesh: object | None = field(default=None, compare=False, repr=False)  # its (CP, TP) flattened

    def __post_init__(self):
        if self.world % (self.tp * self.pp) or (self.dp * self.tp) % (self.ep * self.etp):
            raise ValueError(f"world {self.world} does not factor into pp {self.pp} x dp x tp {self.tp} "
                             f"with ep {self.ep}{f' x etp {self.etp}' if self.etp_enabled else ''} dividing dp x tp")
        if self.zero not in (0, 1, 2, 3):
            raise ValueError(f"ZeRO stage must be 0, 1, 2 or 3, got {self.zero!r}")
        if self.zero == 1 and (self.tp_enabled or self.pp_enabled):
            raise ValueError(f"ZeRO stage 1 (ZeroRedundancyOptimizer) shards plain data parallelism only: not "
                             f"with tensor {self.tp} or pipeline {self.pp} > 1; stages 2 and 3 (FSDP2) run")
        if self.zero == 1 and self.experts_split:
            raise ValueError(f"ZeRO stage 1 with expert {self.ep} x expert-tensor {self.etp} > 1 would broadcast "
                             f"one rank's expert shard over ranks holding other shards: use stage 0, 2 or 3")
        if self.dp % self.cp:
            raise ValueError(f"context {self.cp} must divide the data-parallel ranks ({self.dp})")
        if self.layers_per_stage is not None and len(self.layers_per_stage) != self.num_stages:
            raise ValueError(f"{len(self.layers_per_stage)} stage layer counts for {self.num_stages} stages")

    @classmethod
    def from_run(cls, run: RunConfig) -> ParallelDims:
        p = run.parallel
        stage = stage_layer_counts(run.model.layers, p.pipeline * p.virtual_stages, p.first_stage_layers,
                                   p.last_stage_layers) if p.pipeline > 1 else None
        return cls(world=run.world_size, tp=p.tensor, ep=p.expert, zero=p.zero, pp=p.pipeline,
                   virtual_stages=p.virtual_stages, schedule=Schedule(p.schedule),
                   sequence_parallel=p.sequence_parallel, layers_per_stage=stage, cp=p.context,
                   etp=p.expert_tensor)

    @classmethod
    def from_degrees(cls, *, tp: int = 1, pp: int = 1, dp: int = 1, ep: int = 1, zero: int = 0,
                     virtual_stages: int = 1, schedule: Schedule = Schedule.ONE_F_ONE_B,
                     sequence_parallel: bool = False, layers_per_stage: tuple[int, ...] | None = None,
                     etp: int = 1) -> ParallelDims:
        """A layout of tp x pp x dp devices (a published one the predictor reproduces)."""
        return cls(world=tp * pp * dp, tp=tp, ep=ep, zero=zero, pp=pp, virtual_stages=virtual_stages,
                   schedule=schedule, sequence_parallel=sequence_parallel, layers_per_stage=layers_per_stage,
                   etp=etp)

    @property
    def dp(self) -> int:
        return self.world // (self.tp * self.pp)

    @property
    def dp_batches(self) -> int:
        """The distinct batches of a stage: its data-parallel ranks over the context-parallel ones."""
        return self.dp // self.cp

    @property
    def cp_enabled(self) -> bool:
        return self.cp > 1

    @property
    def edp(self) -> int:
        """Expert-data-parallel degree: the ranks of a pipeline stage that hold the same expert shards."""
        return self.dp * self.tp // (self.ep * self.etp)

    @property
    def pp_enabled(self) -> bool:
        return self.pp > 1

    @property
    def tp_enabled(self) -> bool:
        return self.tp > 1

    @property
    def ep_enabled(self) -> bool:
        return self.ep > 1

    @property
    def etp_enabled(self) -> bool:
        return self.etp > 1

    @property
    def experts_split(self) -> bool:
        """Whether the routed experts run on their own layout, a shard of them on each rank (expert or
        expert-tensor parallelism); otherwise they are data-parallel like any weight."""
        return self.ep_enabled or self.etp_enabled

    @property
    def dp_enabled(self) -> bool:
        return self.dp > 1

    @property
    def zero_applied(self) -> int:
        """The ZeRO stage that runs: 0 (nothing to shard) with a single data-parallel rank."""
        return self.zero if self.dp_enabled else 0

    @property
    def data_parallel(self) -> DataParallel:
        """How the harness wraps the data-parallel ranks (module docstring)."""
        if not self.dp_enabled:
            return DataParallel.NONE
        if (self.tp_enabled or self.pp_enabled) and self.zero < 2:  # stage 1 is refused there
            return DataParallel.REPLICATE
        return ZERO_WRAPPERS[self.zero]

    @property
    def experts_sharded(self) -> bool:
        """Whether FSDP2 shards the expert shards over their expert-data-parallel group (ZeRO-2/3 with
        expert or expert-tensor parallelism, edp > 1); otherwise the data-parallel wrapper leaves them out
        and they are reduced after the step's last backward (parallel/zero.py)."""
        return (self.experts_split and self.edp > 1
                and self.data_parallel in (DataParallel.FSDP_STAGE2, DataParallel.FSDP_STAGE3))

    @property
    def num_stages(self) -> int:
        """Pipeline stages over all ranks: P·V."""
        return self.pp * self.virtual_stages

    def stage_ids(self, pp_rank: int) -> list[int]:
        """The stages a pipeline rank runs ("loop" placement: stage s on rank s mod P)."""
        return [pp_rank + k * self.pp for k in range(self.virtual_stages)]

    def stage_layers(self, stage: int, layers: int) -> list[int]:
        """The block indices of pipeline stage `stage` (module docstring)."""
        counts = self.layers_per_stage or stage_layer_counts(layers, self.num_stages)
        start = sum(counts[:stage])
        return list(range(start, start + counts[stage]))

    def layouts(self) -> dict[str, str]:
        """With expert or expert-tensor parallelism, the two layouts in words for the record
        (metrics.implementation): the dense layers' and the experts' folded one (none otherwise: the config's
        degrees say it all)."""
        if not self.experts_split:
            return {}
        return {"dense_layout": f"pp {self.pp} x dp {self.dp} x tp {self.tp}",
                "expert_layout": f"pp {self.pp} x edp {self.edp} x ep {self.ep}"
                                 + (f" x etp {self.etp}" if self.etp_enabled else "")
                                 + f" (expert-tp {self.etp}, folded over dp x tp)"}

    def build_meshes(self, device_type: str) -> ParallelDims:
        """These dims with their device meshes (every rank calls it, after init_process_group)."""
        from torch.distributed.device_mesh import init_device_mesh

        lead = (self.pp,) if self.pp_enabled else ()
        names = (PP,) if self.pp_enabled else ()
        mesh = init_device_mesh(device_type, (*lead, self.dp, self.tp), mesh_dim_names=(*names, DP, TP))
        inner = ((self.etp,), (ETP,)) if self.etp_enabled else ((), ())
        ep_mesh = init_device_mesh(device_type, (*lead, self.edp, self.ep, *inner[0]),
                                   mesh_dim_names=(*names, EDP, EP, *inner[1])) if self.experts_split else None
        cp_mesh = cp_tp_mesh = None
        if self.cp_enabled:
            cp_mesh = init_device_mesh(device_type, (*lead, self.dp_batches, self.cp, self.tp),
                                       mesh_dim_names=(*names, CP_BATCH, CP, TP))
            cp_tp_mesh = cp_mesh[(CP, TP)]._flatten(CP_TP)
        return replace(self, mesh=mesh, ep_mesh=ep_mesh, cp_mesh=cp_mesh, cp_tp_mesh=cp_tp_mesh)

    def group(self, axis: str):
        """The process group of one mesh axis; None without meshes (a world of one) or for an axis
        the layout does not have. CP_TP: the ranks that route the same tokens (tensor-parallel, times
        context-parallel with context parallelism)."""
        if axis == CP_TP and not self.cp_enabled:
            axis = TP  # the ranks that hold the same tokens: the tensor-parallel ones
        mesh = {EDP: self.ep_mesh, EP: self.ep_mesh, ETP: self.ep_mesh, CP: self.cp_mesh,
                CP_TP: self.cp_tp_mesh}.get(axis, self.mesh)
        if mesh is None or axis not in mesh.mesh_dim_names:
            return None
        return mesh[axis].get_group()

