"""Process groups and device meshes from torchrun's environment.

Ranks read RANK / LOCAL_RANK / WORLD_SIZE / GROUP_RANK (set by torchrun); without them
the process is a world of one and no process group is created.
"""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from benchsuite.config import RunConfig


@dataclass(frozen=True)
class ParallelDims:
    """The parallel layout, validated once; code branches on the *_enabled flags."""

    world: int
    tp: int = 1
    ep: int = 1
    zero: int = 0
    pp: int = 1

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

    @classmethod
    def from_run(cls, run: RunConfig) -> ParallelDims:
        return cls(world=run.world_size, tp=run.parallel.tensor, ep=run.parallel.expert, zero=run.parallel.zero,
                   pp=run.parallel.pipeline)


@dataclass
class DistContext:
    rank: int
    local_rank: int
    world_size: int
    node_rank: int
    device: torch.device
    backend: str | None
    dims: ParallelDims
    mesh: object | None = None  # DeviceMesh ("dp", "tp") when world > 1; ("pp", "dp", "tp") with pipeline > 1
    ep_mesh: object | None = None  # DeviceMesh ("edp", "ep") when expert parallelism is on
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

    @property
    def pp_group(self):
        return self.mesh["pp"].get_group() if self.dims.pp_enabled else None

    @property
    def dp_group(self):
        return self.mesh["dp"].get_group() if self.mesh is not None else None

    @property
    def tp_group(self):
        return self.mesh["tp"].get_group() if self.mesh is not None else None


def pick_device(local_rank: int) -> tuple[torch.device, bool]:
    """(device, shared): rank i takes GPU i mod count; CPU when there is none."""
    if not torch.cuda.is_available():
        return torch.device("cpu"), False
    n = torch.cuda.device_count()
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return torch.device("cuda", local_rank % n), local_world > n


def resolve_precision(precision: str, device: torch.device) -> str:
    """train.precision with "auto" made concrete: bf16 on GPU, fp32 on CPU."""
    return ("bf16" if device.type == "cuda" else "fp32") if precision == "auto" else precision


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
    from torch.distributed.device_mesh import init_device_mesh

    if dims.pp_enabled:
        ctx.mesh = init_device_mesh(device.type, (dims.pp, dims.dp, dims.tp), mesh_dim_names=("pp", "dp", "tp"))
    else:
        ctx.mesh = init_device_mesh(device.type, (dims.dp, dims.tp), mesh_dim_names=("dp", "tp"))
    if dims.ep_enabled:
        ctx.ep_mesh = init_device_mesh(device.type, (dims.dp // dims.ep, dims.ep), mesh_dim_names=("edp", "ep"))
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
