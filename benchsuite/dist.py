"""Process groups and device meshes from torchrun's environment.

Ranks read RANK / LOCAL_RANK / WORLD_SIZE / GROUP_RANK (set by torchrun); without them
the process is a world of one and no process group is created.
"""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass, field, replace

import torch
import torch.distributed as dist

from benchsuite.config import RunConfig
from benchsuite.device import pick_device


# The mesh axes, named once. The main mesh is pp x dp x tp (pp only with pipeline > 1), ranks laid out
# pp-major and tp-minor; the expert mesh splits the data-parallel ranks into edp x ep.
PP, DP, TP = "pp", "dp", "tp"
EDP, EP = "edp", "ep"


@dataclass(frozen=True)
class ParallelDims:
    """The parallel layout, validated once, and the device meshes over it (build_meshes); code
    branches on the *_enabled flags and takes process groups from here."""

    world: int
    tp: int = 1
    ep: int = 1
    zero: int = 0
    pp: int = 1
    mesh: object | None = field(default=None, compare=False, repr=False)  # DeviceMesh (PP,) DP, TP
    ep_mesh: object | None = field(default=None, compare=False, repr=False)  # DeviceMesh (EDP, EP)

    def __post_init__(self):
        if self.world % (self.tp * self.pp) or self.dp % self.ep:
            raise ValueError(f"world {self.world} does not factor into pp {self.pp} x dp x tp {self.tp} "
                             f"with ep {self.ep}")

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

    @classmethod
    def from_run(cls, run: RunConfig) -> ParallelDims:
        return cls(world=run.world_size, tp=run.parallel.tensor, ep=run.parallel.expert, zero=run.parallel.zero,
                   pp=run.parallel.pipeline)

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


@dataclass
class DistContext:
    rank: int
    local_rank: int
    world_size: int
    node_rank: int
    device: torch.device
    backend: str | None
    dims: ParallelDims
    shared_device: bool = False  # several ranks on one GPU: correct, but not a speed figure

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def dp_rank(self) -> int:
        """Ranks are laid out pp-major, tp-minor: rank = (pp_rank * dp + dp_rank) * tp + tp_rank."""
        return self.rank // self.dims.tp % self.dims.dp

    @property
    def pp_rank(self) -> int:
        return self.rank // (self.dims.tp * self.dims.dp)


def init_distributed(run: RunConfig) -> DistContext:
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    node_rank = int(os.environ.get("GROUP_RANK", "0"))
    if world != run.world_size:
        raise RuntimeError(f"launched with WORLD_SIZE={world} but the run config says world_size={run.world_size}")
    dims = ParallelDims.from_run(run)
    device, shared = pick_device(local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    ctx = DistContext(rank, local_rank, world, node_rank, device, None, dims, shared_device=shared)
    if world == 1:
        return ctx
    # NCCL needs one GPU per rank; with more ranks than GPUs gloo works on CUDA tensors.
    ctx.backend = "nccl" if device.type == "cuda" and not shared else "gloo"
    dist.init_process_group(ctx.backend, device_id=device if ctx.backend == "nccl" else None)
    ctx.dims = dims.build_meshes(device.type)
    return ctx


def shutdown() -> None:
    """Destroy every process group while the interpreter is fully alive.

    FSDP2 / DeviceMesh state sits in reference cycles that hold process groups: collect them first,
    not at interpreter exit, where gloo's threads releasing tensors abort the process (SIGABRT,
    "terminate called without an active exception").
    """
    gc.collect()
    if dist.is_initialized():
        dist.destroy_process_group()


def all_gather_objects(obj, ctx: DistContext) -> list:
    """Every rank's object, in rank order (a list of one without a process group)."""
    if ctx.world_size == 1:
        return [obj]
    out = [None] * ctx.world_size
    dist.all_gather_object(out, obj)
    return out
