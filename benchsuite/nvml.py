"""NVML's devices, each found by its UUID: the library handle, the enumeration, names and the driver's version.

At the bottom, importing nothing from benchsuite: the hardware identity (environment.py) names the GPUs for
the run key from here without the energy layer, and the energy meter (energy/nvml.py) finds its device here.
NVML enumerates every GPU in its own (PCI) order and ignores CUDA_VISIBLE_DEVICES, so cuda:i and NVML
index i can be different chips: a device is matched by UUID, never by index. pynvml is imported only
when NVML is opened, and its errors become NvmlError.
"""

from __future__ import annotations

from typing import Any, Callable


class NvmlError(Exception):
    """NVML could not answer: pynvml is missing or one of its calls failed."""


def load_nvml():
    """The pynvml module, imported only when NVML is opened."""
    try:
        import pynvml
    except ImportError as e:
        raise NvmlError(f"pynvml (nvidia-ml-py) not importable: {e}") from e
    return pynvml


def text(value: Any) -> str:
    """pynvml returns str, older versions bytes."""
    return value.decode() if isinstance(value, bytes) else str(value)


def normalize_uuid(uuid: Any) -> str:
    """Comparable form: torch gives '58a7...', NVML 'GPU-58a7...' (bytes in old pynvml)."""
    text_ = text(uuid).strip().lower()
    for prefix in ("gpu-", "mig-"):
        if text_.startswith(prefix):
            text_ = text_[len(prefix):]
    return text_


def cuda_device_uuid(index: int) -> str:
    """UUID of CUDA ordinal `index` as this process sees it (after CUDA_VISIBLE_DEVICES); torch is
    imported here only, by the ranks that already hold it."""
    import torch
    return str(torch.cuda.get_device_properties(index).uuid)


class Nvml:
    """pynvml with its errors translated; one nvmlInit per instance."""

    def __init__(self, lib=None):
        self.lib = lib if lib is not None else load_nvml()
        self.call(self.lib.nvmlInit)

    def call(self, fn: Callable, *args):
        try:
            return fn(*args)
        except self.lib.NVMLError as e:
            raise NvmlError(f"{getattr(fn, '__name__', 'nvml')}: {e}") from e

    def devices(self) -> list[tuple[Any, str]]:
        """(handle, UUID) of every device, in NVML's own (PCI) order."""
        handles = [self.call(self.lib.nvmlDeviceGetHandleByIndex, i)
                   for i in range(self.call(self.lib.nvmlDeviceGetCount))]
        return [(h, text(self.call(self.lib.nvmlDeviceGetUUID, h))) for h in handles]

    def name(self, handle) -> str:
        return text(self.call(self.lib.nvmlDeviceGetName, handle))

    def driver_version(self) -> str:
        return text(self.call(self.lib.nvmlSystemGetDriverVersion))

    def handle_for_uuid(self, uuid: str):
        """(handle, NVML's UUID string) of the device whose UUID matches."""
        want = normalize_uuid(uuid)
        devices = self.devices()
        for h, got in devices:
            if normalize_uuid(got) == want:
                return h, got
        raise NvmlError(f"no NVML device has UUID {uuid} (NVML sees {', '.join(u for _, u in devices) or 'none'})")

    def shutdown(self) -> None:
        try:
            self.lib.nvmlShutdown()
        except Exception:
            pass
