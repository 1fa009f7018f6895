"""Energy windows for one rank: GPU (NVML), CPU/DRAM (RAPL, else codecarbon's estimate in energy/estimate.py).

Zeus-style: named begin/end windows that may nest or overlap, the device synchronised
at both edges, every figure carrying its source (measured | sampled | estimated |
unavailable) and `None` plus a reason for what was not measured -- never 0. A sensor
that fails degrades to the next one; a meter never fails a run.

This module composes the vendor meters (nvml, rapl, estimate), which know only energy/common.py and the
bottom of the house (the record's types, NVML's devices in benchsuite/nvml.py).
The per-rank result (`WindowResult.to_dict()`) is what the worker all_gathers;
`energy.attribution.attribute_energy` (pure) turns the gathered list into the record's `energy` section.
"""

from __future__ import annotations

import socket
import time
from typing import Any, Iterable

import torch

from benchsuite.energy.common import (CpuSensor, GpuReading, EmptyCpuSensor, EnergyError, Reading, GpuMeter,
                                      WindowResult, unavailable_cpu)
from benchsuite.energy import estimate, nvml, rapl
from benchsuite.device import synchronize

# NVML's total-energy counter updates about every 100 ms (it advanced 10x/s on
# an H200, measured), so a window needs to be long against that to be accurate to ~1 %.
DEFAULT_MIN_WINDOW_S = 1.0


class FirstAvailable:
    """Sensors in order of preference; for each figure the first one with a value wins,
    and why the ones before it failed is kept in its reason."""

    def __init__(self, sensors: list[CpuSensor], notes: list[str] | None = None):
        self.sensors = sensors
        self.notes = list(notes or [])      # why preferred sensors were dropped at startup
        self._begin_errors: dict[tuple[str, int], str] = {}

    def begin(self, name: str) -> None:
        for i, s in enumerate(self.sensors):
            try:
                s.begin(name)
            except Exception as e:
                self._begin_errors[(name, i)] = f"{type(s).__name__} failed at window start: {e}"

    def end(self, name: str) -> dict[str, Reading]:
        per_sensor: list[dict[str, Reading]] = []
        for i, s in enumerate(self.sensors):
            err = self._begin_errors.pop((name, i), None)
            if err is None:
                try:
                    per_sensor.append(s.end(name))
                    continue
                except Exception as e:
                    err = f"{type(s).__name__} failed at window end: {e}"
            per_sensor.append(unavailable_cpu(err))
        out = {}
        for key in ("cpu", "dram"):
            reasons = list(self.notes)
            chosen = None
            for figs in per_sensor:
                fig = figs.get(key) or Reading.unavailable("no figure")
                if fig.energy_j is not None:
                    chosen = fig
                    break
                reasons.append(fig.reason or "unavailable")
            if chosen is None:
                chosen = Reading.unavailable("; ".join(reasons))
            elif reasons:
                chosen.reason = "; ".join(reasons + [chosen.reason or ""]).strip("; ")
            out[key] = chosen
        return out


# --------------------------------------------------------------------------- monitor


def _cuda_indices(devices: Iterable[Any]) -> list[int]:
    """CUDA ordinals among torch devices / strings / ints; CPU devices are dropped."""
    out = []
    for d in devices:
        if isinstance(d, int):
            out.append(d)
            continue
        dev_type, index = getattr(d, "type", None), getattr(d, "index", None)
        if dev_type is None:   # a string like "cuda:1"
            text = str(d)
            dev_type, _, idx = text.partition(":")
            index = int(idx) if idx else None
        if dev_type == "cuda":
            out.append(0 if index is None else index)
    return out


class NodeEnergyMonitor:
    """One rank's meters: its GPUs by UUID, and the node's CPU/DRAM (RAPL else estimate)."""

    def __init__(self, gpu_meters: list[GpuMeter], cpu_sensor: CpuSensor, *, min_window_s: float = DEFAULT_MIN_WINDOW_S,
                 rank: int = 0, host: str | None = None, sync=None, notes: list[str] | None = None):
        self.gpu_meters = gpu_meters
        self.cpu_sensor = cpu_sensor
        self.min_window_s = min_window_s
        self.rank = rank
        self.host = host or socket.gethostname()
        self._sync = sync or (lambda: None)
        self.notes = list(notes or [])
        self.idle_w: dict[str, float | None] | None = None
        self._open: dict[str, float] = {}
        self._begin_failed: dict[tuple[str, int], Reading] = {}   # (window, meter index): why its start failed

    @classmethod
    def create(cls, devices: Iterable[Any] = (), energy_cfg=None, *, rank: int = 0,
               sample_power: bool = False, rapl_root: str = "/sys/class/powercap") -> NodeEnergyMonitor:
        """Meters for the rank's CUDA devices (torch devices, "cuda:i" or ints; CPU devices
        are ignored) and this node's CPU/DRAM. Never raises for missing hardware."""
        indices = _cuda_indices(devices)
        gpus = [nvml.make_gpu_meter(i, sample_power=sample_power) for i in indices]
        notes = []
        try:
            package = rapl.RaplSensor(rapl_root)
            sensors = [package, _estimate(preload=not package.has_dram)]
        except EnergyError as e:
            notes.append(f"RAPL unavailable: {e}")
            sensors = [_estimate(preload=True)]

        def sync():
            for i in indices:
                synchronize(torch.device("cuda", i))
        min_s = getattr(energy_cfg, "min_window_s", DEFAULT_MIN_WINDOW_S)
        return cls(gpus, FirstAvailable(sensors, notes), min_window_s=min_s, rank=rank, sync=sync if indices else None)

    def begin(self, name: str) -> None:
        """Open window `name` after the device has finished queued work. The GPU meters first (each waits
        for its counter's next update), then the clock and the CPU sensor, so every source's window starts
        within a poll of the GPU counter's edge."""
        if name in self._open:
            raise ValueError(f"energy window {name!r} is already open")
        self._sync()
        for i, g in enumerate(self.gpu_meters):
            failed = _safe(lambda: g.begin(name), default_reason="GPU meter failed at window start")
            if failed is not None:
                self._begin_failed[(name, i)] = failed
        self._open[name] = time.monotonic()
        _safe(lambda: self.cpu_sensor.begin(name))

    def end(self, name: str) -> WindowResult:
        """Close window `name` (after syncing the device) and return what was measured."""
        if name not in self._open:
            raise ValueError(f"energy window {name!r} was not begun")
        self._sync()
        figs = [self._begin_failed.pop((name, i), None) or _safe(lambda: g.end(name), default_reason="GPU meter failed")
                for i, g in enumerate(self.gpu_meters)]  # each waits for its counter's update, as at begin
        window_s = time.monotonic() - self._open.pop(name)
        cpu_figs = _safe(lambda: self.cpu_sensor.end(name), default_reason="CPU sensor failed", many=True)
        gpus = [GpuReading(g.uuid, g.name, g.cuda_index, self._finish(fig, window_s, f"gpu:{g.uuid}"))
                for g, fig in zip(self.gpu_meters, figs)]
        reasons = list(self.notes)
        short = window_s < self.min_window_s
        if short:
            reasons.append(f"window {window_s:.3f} s is shorter than min_window_s {self.min_window_s} s: energy "
                           f"counters (NVML) update about every 100 ms; extend the measured region")
        if not gpus:
            reasons.append("no CUDA device on this rank: GPU energy not measured")
        return WindowResult(name=name, rank=self.rank, host=self.host, window_s=window_s, short_window=short,
                            gpus=gpus, cpu=self._finish(cpu_figs["cpu"], window_s, "cpu"),
                            dram=self._finish(cpu_figs["dram"], window_s, "dram"), reasons=reasons)

    def measure_idle(self, seconds: float) -> dict[str, float | None]:
        """Idle watts per GPU (key "gpu:<uuid>"), "cpu" and "dram"; later windows report
        energy above idle beside the total. Run before the workload touches the device."""
        self.idle_w = None
        self.begin("__idle__")
        time.sleep(seconds)
        r = self.end("__idle__")
        idle = {f"gpu:{d.uuid}": d.figure.avg_w for d in r.gpus}
        idle.update(cpu=r.cpu.avg_w, dram=r.dram.avg_w)
        self.idle_w = idle
        return idle

    def close(self) -> None:
        for g in self.gpu_meters:
            _safe(g.close)

    def _finish(self, fig: Reading, window_s: float, key: str) -> Reading:
        if fig.energy_j is not None and window_s > 0:
            fig.avg_w = fig.energy_j / window_s
        if self.idle_w is not None and self.idle_w.get(key) is not None:
            fig.idle_w = self.idle_w[key]
            if fig.energy_j is not None:
                fig.above_idle_j = fig.energy_j - fig.idle_w * window_s
        return fig


def _estimate(preload: bool) -> CpuSensor:
    """codecarbon's estimate (else an EmptyCpuSensor); its lookup (~0.5 s) is done now only when
    it will be used."""
    try:
        return estimate.EstimateSensor(estimate.codecarbon_power_model() if preload else None)
    except Exception as e:
        return EmptyCpuSensor(f"codecarbon estimate unavailable: {e}")


def _safe(fn, default_reason: str = "meter failed", many: bool = False):
    """Run a meter call; any exception becomes an unavailable figure (a meter never fails a run)."""
    try:
        return fn()
    except Exception as e:
        reason = f"{default_reason}: {type(e).__name__}: {e}"
        if many:
            return unavailable_cpu(reason)
        return Reading.unavailable(reason)
