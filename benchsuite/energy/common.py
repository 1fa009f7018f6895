"""What every energy module shares: the error, the figure and window types, the meter interface,
and the empty stand-ins for hardware that cannot be metered (Zeus zeus/device/gpu/common.py).

The vendor modules (nvml, rapl, estimate) import only this module and the bottom's (the record's types,
NVML's devices); meters.py composes them.
"""

from __future__ import annotations

import dataclasses
import socket
from dataclasses import dataclass, field
from typing import Any, Protocol

from benchsuite.record.types import Source


class EnergyError(Exception):
    """A sensor could not give a figure; vendor errors (NVML, sysfs, codecarbon) become this."""


def sum_or_none(values) -> float | None:
    """The sum, or None when there is nothing to sum or any part is unknown (never a partial sum)."""
    values = list(values)
    return None if not values or any(v is None for v in values) else sum(values)


@dataclass
class Reading:
    """One energy figure over one window; energy_j is None whenever source is unavailable."""

    energy_j: float | None
    source: Source
    reason: str | None = None
    sampled_energy_j: float | None = None   # integrated power beside the counter (sample_power=True)
    avg_w: float | None = None               # set by the monitor: energy_j / window_s
    idle_w: float | None = None              # idle baseline, when one was measured
    above_idle_j: float | None = None        # energy_j - idle_w * window_s
    detail: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def unavailable(cls, reason: str) -> Reading:
        return cls(energy_j=None, source=Source.UNAVAILABLE, reason=reason)


def unavailable_cpu(reason: str) -> dict[str, Reading]:
    """A CPU sensor's answer when it has no figure: cpu and dram unavailable for the same reason."""
    return {"cpu": Reading.unavailable(reason), "dram": Reading.unavailable(reason)}


@dataclass
class GpuReading:
    """A GPU figure with the identity attribution needs (UUID, not index)."""

    uuid: str
    name: str
    cuda_index: int
    figure: Reading


@dataclass
class WindowResult:
    """Everything one rank measured over one named window."""

    name: str
    rank: int
    host: str
    window_s: float
    short_window: bool
    gpus: list[GpuReading]
    cpu: Reading
    dram: Reading
    reasons: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Plain types only: safe for all_gather_object and JSON."""
        return dataclasses.asdict(self)


# --------------------------------------------------------------------------- the meter interface


class GpuMeter(Protocol):
    """One CUDA device's energy over named windows (nvml.NvmlGpuMeter, EmptyGpuMeter)."""

    uuid: str
    name: str
    cuda_index: int

    def begin(self, name: str) -> None: ...

    def end(self, name: str) -> Reading: ...

    def close(self) -> None: ...


class CpuSensor(Protocol):
    """The node's CPU package and DRAM energy over named windows (rapl, estimate, EmptyCpuSensor)."""

    def begin(self, name: str) -> None: ...

    def end(self, name: str) -> dict[str, Reading]:
        """{"cpu": Reading, "dram": Reading}."""
        ...


class EmptyGpuMeter:
    """Stand-in for a GPU that cannot be metered: every window is unavailable with the reason."""

    def __init__(self, cuda_index: int, reason: str, uuid: str | None = None, name: str = "unknown"):
        self.cuda_index, self.reason, self.name = cuda_index, reason, name
        self.uuid = uuid or f"unknown:{socket.gethostname()}:cuda{cuda_index}"

    def begin(self, name: str) -> None:
        pass

    def end(self, name: str) -> Reading:
        return Reading.unavailable(self.reason)

    def close(self) -> None:
        pass


class EmptyCpuSensor:
    """Stand-in when neither RAPL nor codecarbon's estimate is available."""

    def __init__(self, reason: str):
        self.reason = reason

    def begin(self, name: str) -> None:
        pass

    def end(self, name: str) -> dict[str, Reading]:
        return unavailable_cpu(self.reason)
