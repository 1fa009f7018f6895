"""The device a rank runs on, at the bottom of the house: which one it takes, its synchronisation and its
peak memory. The meters, the parallel code, the worker and `measure()` all ask here (Zeus keeps its device
layer and framework sync below the monitors that use them)."""

from __future__ import annotations

import os

import torch


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


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work: the only way a host clock can time asynchronous work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_memory(device: torch.device) -> dict:
    """The record's per-rank memory: the allocator's peaks on a GPU, the process's peak RSS on a CPU."""
    if device.type == "cuda":
        return {"peak_allocated_bytes": torch.cuda.max_memory_allocated(device),
                "peak_reserved_bytes": torch.cuda.max_memory_reserved(device), "source": "torch.cuda"}
    import resource

    # ru_maxrss is KiB on Linux: the whole process, model and framework alike.
    return {"peak_allocated_bytes": None, "peak_reserved_bytes": None,
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "source": "host_rss"}
