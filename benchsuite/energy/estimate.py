"""CPU and DRAM energy when RAPL is absent: codecarbon's power model times the window, labelled estimated.

The model is codecarbon's own (TDP table, per-thread fallback, RAM DIMM model), looked up
offline once per process; the load curve is its machine-mode CPU formula.
"""

from __future__ import annotations

import csv
import functools
import logging
import time
from dataclasses import dataclass
from importlib import resources
from typing import Any

from benchsuite.energy.common import EnergyError, Reading
from benchsuite.record.types import Source


@dataclass(frozen=True)
class PowerModel:
    """codecarbon's CPU and RAM power model for this machine (looked up once, offline)."""

    cpu_max_w: float   # TDP x sockets, codecarbon's `max_power`
    ram_w: float
    cpu_basis: str
    ram_basis: str


@functools.cache
def cpu_power_table() -> dict[str, str]:
    """codecarbon's bundled data/hardware/cpu_power.csv as CPU name -> TDP text, first row of a
    name winning as in its TDP._get_cpu_constant_power; read with the csv module, since
    codecarbon's own loader imports pandas and parses all its tables (most of the lookup's cost).
    The TDP stays text until matched: a few rows are not numbers ("27.29.5")."""
    path = resources.files("codecarbon").joinpath("data/hardware/cpu_power.csv")
    table: dict[str, str] = {}
    with path.open(newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            table.setdefault(row["Name"], row["TDP"])
    return table


def registry_tdp(cpu_model: str) -> float | None:
    """The TDP codecarbon's TDP._get_cpu_power_from_registry gives for this CPU name: its own
    fuzzy matcher, run over the names of `cpu_power_table`."""
    from codecarbon.core import cpu as cc_cpu
    table = cpu_power_table()
    matcher = cc_cpu.TDP.__new__(cc_cpu.TDP)   # no __init__: that would detect and load everything
    match = matcher._get_matching_cpu(cpu_model, {"Name": list(table)})
    return float(table[match]) if match else None


def cpu_brand() -> str | None:
    """cpuinfo's brand_raw, as codecarbon's detect_cpu_model reads it. cpuinfo takes the field
    from /proc/cpuinfo before any later source, so that file is read alone when it names the
    CPU, sparing the cpuid subprocess; elsewhere codecarbon's own detection."""
    from codecarbon.core.util import detect_cpu_model
    from cpuinfo import cpuinfo
    return cpuinfo._get_cpu_info_from_proc_cpuinfo().get("brand_raw") or detect_cpu_model()


def cpu_tdp(cpu_model: str | None) -> tuple[float | None, str]:
    """codecarbon's TDP._main: the registry TDP, else 4 W per thread when psutil works, else
    none; with how it was found."""
    from codecarbon.core import cpu as cc_cpu
    from codecarbon.core.util import count_cpus
    if not cpu_model:
        return None, "Unknown"
    matched = registry_tdp(cpu_model)
    if matched:
        return matched, "TDP from codecarbon cpu_power.csv"
    if cc_cpu.is_psutil_available():
        return (count_cpus() * cc_cpu.DEFAULT_POWER_PER_CORE,
                f"codecarbon fallback {cc_cpu.DEFAULT_POWER_PER_CORE} W per thread (CPU not in cpu_power.csv)")
    return None, "CPU not in cpu_power.csv"


@functools.cache
def codecarbon_power_model() -> PowerModel:
    """What codecarbon 3.x assumes when RAPL is absent (core/resource_tracker.py
    `_setup_fallback_tracking`): TDP matched in its bundled data/hardware/cpu_power.csv,
    else 4 W per thread (core/cpu.py DEFAULT_POWER_PER_CORE), else 85 W
    (external/hardware.py POWER_CONSTANT); times the socket count. RAM: its DIMM-count
    model (external/ram.py, 5 W per x86 DIMM). No tracker, no network, no files."""
    try:
        from codecarbon.core.util import count_physical_cpus
        from codecarbon.external.hardware import POWER_CONSTANT
        from codecarbon.external.ram import RAM
    except Exception as e:
        raise EnergyError(f"codecarbon not importable: {type(e).__name__}: {e}") from e
    cc_log = logging.getLogger("codecarbon")   # after import: importing resets its level
    level = cc_log.level
    cc_log.setLevel(logging.ERROR)   # its warnings would go to stderr; the basis says it
    try:
        model = cpu_brand()
        tdp, how = cpu_tdp(model)
        sockets = count_physical_cpus() or 1
        if tdp is None:
            cpu_w = float(POWER_CONSTANT)
            basis = f"codecarbon POWER_CONSTANT {POWER_CONSTANT} W (CPU {model or 'Unknown'!r} unknown)"
        else:
            cpu_w, basis = float(tdp), f"{how}: {model} = {tdp} W"
        ram = RAM(tracking_mode="machine")
        ram_gb = ram.machine_memory_GB
        ram_w = ram.total_power().W
    except Exception as e:  # codecarbon internals moved, cpuinfo failed, ...
        raise EnergyError(f"codecarbon power lookup failed: {type(e).__name__}: {e}") from e
    finally:
        cc_log.setLevel(level)
    if not ram_w > 0:
        raise EnergyError("codecarbon RAM model gave no power")
    return PowerModel(cpu_max_w=cpu_w * sockets, ram_w=float(ram_w),
                      cpu_basis=f"{basis} x {sockets} socket(s)",
                      ram_basis=f"codecarbon RAM model: {ram_gb:.0f} GB -> {ram_w:.1f} W")


def cpu_load_watts(cpu_max_w: float, load_percent: float) -> float:
    """codecarbon's machine-mode CPU model (external/hardware.py CPU._get_power_from_cpu_load):
    10 % of TDP at idle, rising with the cube of load."""
    return cpu_max_w * (0.1 + 0.9 * (load_percent / 100.0) ** 3)


class EstimateSensor:
    """CPU and DRAM energy = codecarbon's power model x window time, labelled estimated."""

    def __init__(self, model: PowerModel | None = None):
        from codecarbon.external.hardware import SystemCPULoadMeter   # imported here: begin stays cheap
        self._load_meter = SystemCPULoadMeter
        self._model = model          # looked up lazily: only needed when RAPL is missing
        self._open: dict[str, tuple[float, Any]] = {}

    @property
    def model(self) -> PowerModel:
        if self._model is None:
            self._model = codecarbon_power_model()
        return self._model

    def begin(self, name: str) -> None:
        load = self._load_meter()    # codecarbon's system-wide load since its own baseline
        load.reset()
        self._open[name] = (time.monotonic(), load)

    def end(self, name: str) -> dict[str, Reading]:
        t0, load = self._open.pop(name)
        dt = time.monotonic() - t0
        m = self.model
        pct = load.percent(prime_interval=0.0)
        cpu_w = cpu_load_watts(m.cpu_max_w, pct)
        return {
            "cpu": Reading(cpu_w * dt, Source.ESTIMATED, f"codecarbon cpu_load model at {pct:.0f} % load: {m.cpu_basis}",
                          detail={"watts": cpu_w, "load_percent": pct, "cpu_max_w": m.cpu_max_w}),
            "dram": Reading(m.ram_w * dt, Source.ESTIMATED, m.ram_basis, detail={"watts": m.ram_w}),
        }
