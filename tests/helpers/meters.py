"""Doubles for the energy tests: a pynvml whose counters and power the test sets, a powercap tree of
RAPL zones, and a fixed CPU/RAM power model."""

from __future__ import annotations

from pathlib import Path
from unittest import mock

import pynvml

from benchsuite.energy import nvml
from benchsuite.energy.estimate import PowerModel

UUIDS = {  # NVML's enumeration order (PCI order), NVML spelling
    "h0": "GPU-aaaaaaaa-0000-0000-0000-000000000000",
    "h1": "GPU-bbbbbbbb-1111-1111-1111-111111111111",
    "h2": "GPU-cccccccc-2222-2222-2222-222222222222",
}


class FakeGpus:
    """State behind the pynvml double: per-handle energy counters (mJ) and power (mW)."""

    def __init__(self, counter_supported=True, instant_supported=True):
        self.counter_mj = {"h0": 1_000_000, "h1": 2_000_000, "h2": 3_000_000}
        self.step_mj = {"h0": 1_000, "h1": 2_000, "h2": 3_000}   # added on every counter read
        self.power_mw = {"h0": 100_000, "h1": 200_000, "h2": 300_000}
        self.counter_supported, self.instant_supported = counter_supported, instant_supported
        self.fail_counter = False
        lib = mock.create_autospec(pynvml, spec_set=True)
        lib.NVMLError = pynvml.NVMLError
        lib.NVML_FI_DEV_POWER_INSTANT = pynvml.NVML_FI_DEV_POWER_INSTANT
        lib.nvmlDeviceGetCount.return_value = len(UUIDS)
        lib.nvmlDeviceGetHandleByIndex.side_effect = lambda i: f"h{i}"
        lib.nvmlDeviceGetUUID.side_effect = lambda h: UUIDS[h]
        lib.nvmlDeviceGetName.side_effect = lambda h: b"NVIDIA H200"
        lib.nvmlDeviceGetTotalEnergyConsumption.side_effect = self._counter
        lib.nvmlDeviceGetFieldValues.side_effect = self._fields
        lib.nvmlDeviceGetPowerUsage.side_effect = lambda h: self.power_mw[h]
        self.lib = lib

    def _counter(self, h):
        if not self.counter_supported:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if self.fail_counter:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        self.counter_mj[h] += self.step_mj[h]
        return self.counter_mj[h]

    def _fields(self, h, ids):
        v = pynvml.c_nvmlFieldValue_t()
        v.fieldId = ids[0]
        if self.instant_supported:
            v.valueType, v.nvmlReturn = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, pynvml.NVML_SUCCESS
            v.value.uiVal = self.power_mw[h]
        else:
            v.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return [v]


def torch_uuids(mapping):
    """Patch the CUDA-side UUID lookup: torch prints UUIDs without the 'GPU-' prefix."""
    return mock.patch.object(nvml, "cuda_device_uuid", side_effect=lambda i: mapping[i])


def make_zone(path: Path, name: str, energy_uj: int, max_uj: int = 1_000_000):
    path.mkdir(parents=True)
    (path / "name").write_text(name + "\n")
    (path / "energy_uj").write_text(f"{energy_uj}\n")
    (path / "max_energy_range_uj").write_text(f"{max_uj}\n")


FIXED = PowerModel(cpu_max_w=100.0, ram_w=10.0, cpu_basis="test TDP 100 W", ram_basis="test RAM 10 W")
