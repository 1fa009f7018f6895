"""Process groups and device meshes from torchrun's environment.

Ranks read RANK / LOCAL_RANK / WORLD_SIZE / GROUP_RANK (set by torchrun); without them
the process is a world of one and no process group is created. The layout the meshes follow
is layout.py's ParallelDims.
"""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from benchsuite.config import RunConfig
from benchsuite.device import pick_device
from benchsuite.layout import ParallelDims


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
