"""The parallel layout of a run, the one answer to every question about it (as torchtitan's ParallelDims).

The harness (parallel/), the record's figures (metrics/) and the predictor (predict/) all ask it: the
degrees, which dimensions are on, the ZeRO stage that runs, how data parallelism is wrapped, the pipeline's
stages, and the device meshes over the ranks (build_meshes, the only part that needs torch).

How data parallelism is wrapped (`DataParallel`, the harness's choice):

- one data-parallel rank: nothing to wrap (a ZeRO stage asked for shards nothing);
- tensor or pipeline parallelism beside it: replicate_with_fsdp over the "dp" mesh dimension, DDP
  semantics on FSDP2's machinery (torch's DDP refuses DTensor parameters, and fails under a pipeline's
  microbatches); a pipeline wraps each of its stages;
- otherwise ZeRO stage 0 is DDP, stage 1 DDP with ZeroRedundancyOptimizer, stages 2 and 3 FSDP2's
  fully_shard without and with resharding after forward.

ZeRO stages 1-3 shard plain data parallelism only: a layout that asks for one beside tensor, pipeline or
expert parallelism is refused.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace

from benchsuite.config import RunConfig

# The mesh axes, named once. The main mesh is pp x dp x tp (pp only with pipeline > 1), ranks laid out
# pp-major and tp-minor; the expert mesh splits the data-parallel ranks into edp x ep.
PP, DP, TP = "pp", "dp", "tp"
EDP, EP = "edp", "ep"


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
    mesh: object | None = field(default=None, compare=False, repr=False)  # DeviceMesh (PP,) DP, TP
    ep_mesh: object | None = field(default=None, compare=False, repr=False)  # DeviceMesh (EDP, EP)

    def __post_init__(self):
        if self.world % (self.tp * self.pp) or self.dp % self.ep:
            raise ValueError(f"world {self.world} does not factor into pp {self.pp} x dp x tp {self.tp} "
                             f"with ep {self.ep}")
        if self.zero not in (0, 1, 2, 3):
            raise ValueError(f"ZeRO stage must be 0, 1, 2 or 3, got {self.zero!r}")
        if self.zero and (self.tp_enabled or self.pp_enabled or self.ep_enabled):
            raise ValueError(f"ZeRO stage {self.zero} shards plain data parallelism only: not with tensor "
                             f"{self.tp}, pipeline {self.pp} or expert {self.ep} > 1")

    @classmethod
    def from_run(cls, run: RunConfig) -> ParallelDims:
        p = run.parallel
        return cls(world=run.world_size, tp=p.tensor, ep=p.expert, zero=p.zero, pp=p.pipeline,
                   virtual_stages=p.virtual_stages, schedule=Schedule(p.schedule),
                   sequence_parallel=p.sequence_parallel)

    @classmethod
    def from_degrees(cls, *, tp: int = 1, pp: int = 1, dp: int = 1, ep: int = 1, zero: int = 0,
                     virtual_stages: int = 1, schedule: Schedule = Schedule.ONE_F_ONE_B,
                     sequence_parallel: bool = False) -> ParallelDims:
        """A layout of tp x pp x dp devices (a published one the predictor reproduces)."""
        return cls(world=tp * pp * dp, tp=tp, ep=ep, zero=zero, pp=pp, virtual_stages=virtual_stages,
                   schedule=schedule, sequence_parallel=sequence_parallel)

    @property
    def dp(self) -> int:
        return self.world // (self.tp * self.pp)

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
        if self.tp_enabled or self.pp_enabled:
            return DataParallel.REPLICATE
        return ZERO_WRAPPERS[self.zero]

    @property
    def num_stages(self) -> int:
        """Pipeline stages over all ranks: P·V."""
        return self.pp * self.virtual_stages

    def stage_ids(self, pp_rank: int) -> list[int]:
        """The stages a pipeline rank runs ("loop" placement: stage s on rank s mod P)."""
        return [pp_rank + k * self.pp for k in range(self.virtual_stages)]

    def build_meshes(self, device_type: str) -> ParallelDims:
        """These dims with their device meshes (every rank calls it, after init_process_group)."""
        from torch.distributed.device_mesh import init_device_mesh

        if self.pp_enabled:
            mesh = init_device_mesh(device_type, (self.pp, self.dp, self.tp), mesh_dim_names=(PP, DP, TP))
        else:
            mesh = init_device_mesh(device_type, (self.dp, self.tp), mesh_dim_names=(DP, TP))
        ep_mesh = init_device_mesh(device_type, (self.dp // self.ep, self.ep), mesh_dim_names=(EDP, EP)) \
            if self.ep_enabled else None
        return replace(self, mesh=mesh, ep_mesh=ep_mesh)

    def group(self, axis: str):
        """The process group of one mesh axis; None without meshes (a world of one) or for an axis
        the layout does not have."""
        mesh = self.ep_mesh if axis in (EDP, EP) else self.mesh
        if mesh is None or axis not in mesh.mesh_dim_names:
            return None
        return mesh[axis].get_group()
