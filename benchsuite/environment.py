"""Who ran what where: hardware identity (part of the run key) and the record's `env`.

The launcher needs the hardware identity before any run starts, and importing torch costs it seconds
(a run's whole fixed cost is a few torch imports): GPU names come from NVML, as CUDA numbers and
filters them, and torch is imported only where NVML cannot give CUDA's answer. The ranks, which
import torch anyway, call the functions that take a torch device.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import platform
import socket
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from benchsuite.nvml import Nvml, NvmlError

if TYPE_CHECKING:
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
    return {"gpus": gpu_names(), "cpu": _cpu_model(), "machine": platform.machine()}


class NotLikeCuda(Exception):
    """NVML cannot tell which devices CUDA would show here, and in what order."""


GPU_DEVICE_NODES = ("/dev/nvidiactl", "/dev/kfd")  # an NVIDIA or an AMD (ROCm) driver is loaded


def gpu_names() -> list[str]:
    """torch.cuda's device names in CUDA's order, without importing torch where NVML gives the same
    answer: no GPU driver (no device node) means none, a torch built without CUDA sees none, else
    NVML's devices filtered by CUDA_VISIBLE_DEVICES. MIG, mixed models in CUDA's fastest-first order,
    or a driver NVML cannot read: torch says, as it always did."""
    if not any(os.path.exists(node) for node in GPU_DEVICE_NODES):
        return []
    if not _torch_has_gpu_build():
        return []
    try:
        return nvml_gpu_names(os.environ.get("CUDA_VISIBLE_DEVICES"), os.environ.get("CUDA_DEVICE_ORDER"))
    except NotLikeCuda:
        import torch

        return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] \
            if torch.cuda.is_available() else []


def _torch_has_gpu_build() -> bool:
    """Whether the installed torch has a CUDA or ROCm library beside it (found, not imported)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return False
    lib = Path(next(iter(spec.submodule_search_locations))) / "lib"
    return any(lib.glob("libtorch_cuda*.so*")) or any(lib.glob("libtorch_hip*.so*"))


def nvml_gpu_names(visible: str | None, order: str | None, lib=None) -> list[str]:
    """NVML's device names as CUDA shows them: only the CUDA_VISIBLE_DEVICES entries (indices or
    GPU-UUID prefixes), in their order, up to the first one CUDA would not accept. NotLikeCuda where
    NVML cannot say (no NVML, MIG, several models numbered fastest first)."""
    try:
        nvml = Nvml(lib)
    except Exception as e:  # no pynvml, no libnvidia-ml (ROCm), driver not loaded
        raise NotLikeCuda(f"NVML unavailable: {e}") from None
    try:
        devices = []
        for handle, uuid in nvml.devices():
            if _mig_enabled(nvml.lib, handle):
                raise NotLikeCuda("MIG is enabled")
            devices.append((uuid, nvml.name(handle)))
    except NotLikeCuda:
        raise
    except Exception as e:
        raise NotLikeCuda(f"NVML failed: {e}") from None
    finally:
        nvml.shutdown()
    if len({name for _, name in devices}) > 1 and order != "PCI_BUS_ID":
        raise NotLikeCuda("several GPU models: CUDA numbers them fastest first, NVML by PCI bus")
    if visible is None:
        return [name for _, name in devices]
    chosen: list[int] = []
    for entry in (e.strip() for e in visible.split(",")):
        if entry.startswith("MIG-"):
            raise NotLikeCuda("CUDA_VISIBLE_DEVICES names a MIG instance")
        matches = [i for i, (uuid, _) in enumerate(devices) if entry.startswith("GPU-") and uuid.startswith(entry)]
        index = int(entry) if entry.isdigit() and int(entry) < len(devices) else (
            matches[0] if len(matches) == 1 else None)
        if index is None or index in chosen:  # CUDA ignores this entry and every one after it
            break
        chosen.append(index)
    return [devices[i][1] for i in chosen]


def _mig_enabled(lib, handle) -> bool:
    try:
        current, _ = lib.nvmlDeviceGetMigMode(handle)
    except Exception:  # a GPU without MIG support
        return False
    return bool(current)


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
    import torch

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
    import psutil

    return {"os": platform.platform(), "cpu_count": psutil.cpu_count(),
            "ram_total_gb": psutil.virtual_memory().total / B_PER_GIB,
            "gpu_count": len({d["uuid"] for d in devices if d.get("type") == "cuda" and d.get("uuid")})}


def software_versions() -> dict:
    """torch, CUDA, NCCL, driver, Python and the commit (the launcher imports torch here only to record
    a failed run)."""
    import torch

    nccl = None
    if torch.cuda.is_available() and hasattr(torch.cuda, "nccl"):
        try:
            nccl = ".".join(map(str, torch.cuda.nccl.version()))
        except (RuntimeError, AttributeError):
            nccl = None
    return {"torch": torch.__version__, "cuda": torch.version.cuda, "nccl": nccl,
            "driver": driver_version() if torch.cuda.is_available() else None,
            "python": sys.version.split()[0], "git_commit": git_commit()}


def driver_version(lib=None) -> str | None:
    """The GPU driver's version as NVML states it; None where NVML is missing or refuses."""
    try:
        nvml = Nvml(lib)
    except Exception:  # no pynvml, no libnvidia-ml (ROCm), driver not loaded
        return None
    try:
        return nvml.driver_version()
    except NvmlError:
        return None
    finally:
        nvml.shutdown()
