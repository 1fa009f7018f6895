"""Who ran what where: hardware identity (part of the run key) and the record's `env`."""

from __future__ import annotations

import functools
import platform
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import torch

B_PER_GIB = 1024**3   # codecarbon's B_TO_GB (external/hardware.py): its ram_total_size is in GiB
# Set by the launcher beside OMP_NUM_THREADS: where a rank's thread count came from (env.threads_source).
THREADS_SOURCE_VAR = "BENCHSUITE_THREADS_SOURCE"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def hardware_identity() -> dict:
    """What makes two runs of one config comparable: accelerator and CPU model, not the host name."""
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] \
        if torch.cuda.is_available() else []
    return {"gpus": gpus, "cpu": _cpu_model(), "machine": platform.machine()}


@functools.cache
def git_commit() -> str | None:
    """The project's commit when run from a checkout (None from an installed wheel)."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True,
                             text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def device_info(device: torch.device) -> dict:
    """One rank's device: name, UUID (how NVML finds it), index; the host's CPU for CPU ranks."""
    info = {"host": socket.gethostname(), "type": device.type, "cpu_threads": torch.get_num_threads()}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(name=props.name, uuid=f"GPU-{props.uuid}", index=device.index,
                    memory_bytes=props.total_memory)
    else:
        info.update(name=_cpu_model(), uuid=None, index=None)
    return info


def host_facts(devices: list[dict]) -> dict:
    """The machine fields codecarbon writes in emissions.csv, read as it reads them (platform,
    psutil), of the host calling this (rank 0's, which writes the record), and the run's
    physical GPUs (each UUID once, whichever ranks share it; 0 on CPU)."""
    return {"os": platform.platform(), "cpu_count": psutil.cpu_count(),
            "ram_total_gb": psutil.virtual_memory().total / B_PER_GIB,
            "gpu_count": len({d["uuid"] for d in devices if d.get("type") == "cuda" and d.get("uuid")})}


def software_versions() -> dict:
    nccl = None
    if torch.cuda.is_available() and hasattr(torch.cuda, "nccl"):
        try:
            nccl = ".".join(map(str, torch.cuda.nccl.version()))
        except (RuntimeError, AttributeError):
            nccl = None
    driver = None
    if torch.cuda.is_available():
        try:
            import pynvml

            pynvml.nvmlInit()
            driver = pynvml.nvmlSystemGetDriverVersion()
        except Exception:  # NVML missing or refused: the driver version stays unknown
            driver = None
    return {"torch": torch.__version__, "cuda": torch.version.cuda, "nccl": nccl, "driver": driver,
            "python": sys.version.split()[0], "git_commit": git_commit()}
