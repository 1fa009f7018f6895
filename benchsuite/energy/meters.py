"""Energy windows for one rank: GPU (NVML), CPU/DRAM (RAPL, else codecarbon's estimate).

Zeus-style: named begin/end windows that may nest or overlap, the device synchronised
at both edges, every figure carrying its source (measured | sampled | estimated |
unavailable) and `None` plus a reason for what was not measured -- never 0. A sensor
that fails degrades to the next one; a meter never fails a run.

The per-rank result (`WindowResult.to_dict()`) is what the worker all_gathers;
`attribute_energy` (pure) turns the gathered list into the record's `energy` section.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import socket
import time
from dataclasses import dataclass, field
from typing import Any, Iterable

# Strongest first; an aggregate is only as good as its weakest part.
SOURCES = ("measured", "sampled", "estimated", "unavailable")

# NVML's total-energy counter updates about every 100 ms (ANCHORS: it advanced 10x/s on
# an H200), so a window needs to be long against that to be accurate to ~1 %.
DEFAULT_MIN_WINDOW_S = 1.0


class EnergyError(Exception):
    """A sensor could not give a figure; vendor errors (NVML, sysfs, codecarbon) become this."""


def weakest(sources: Iterable[str]) -> str:
    """The least trustworthy source among `sources` ("unavailable" when empty)."""
    ranks = [SOURCES.index(s) for s in sources]
    return SOURCES[max(ranks)] if ranks else "unavailable"


@dataclass
class Figure:
    """One energy figure over one window; energy_j is None whenever source is unavailable."""

    energy_j: float | None
    source: str
    reason: str | None = None
    sampled_energy_j: float | None = None   # integrated power beside the counter (sample_power=True)
    avg_w: float | None = None               # set by the monitor: energy_j / window_s
    idle_w: float | None = None              # idle baseline, when one was measured
    above_idle_j: float | None = None        # energy_j - idle_w * window_s
    detail: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def unavailable(cls, reason: str) -> Figure:
        return cls(energy_j=None, source="unavailable", reason=reason)


@dataclass
class DeviceEnergy:
    """A GPU figure with the identity attribution needs (UUID, not index)."""

    uuid: str
    name: str
    cuda_index: int
    figure: Figure


@dataclass
class WindowResult:
    """Everything one rank measured over one named window."""

    name: str
    rank: int
    host: str
    window_s: float
    short_window: bool
    gpus: list[DeviceEnergy]
    cpu: Figure
    dram: Figure
    reasons: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Plain types only: safe for all_gather_object and JSON."""
        return dataclasses.asdict(self)


# --------------------------------------------------------------------------- estimate


@dataclass(frozen=True)
class PowerModel:
    """codecarbon's CPU and RAM power model for this machine (looked up once, offline)."""

    cpu_max_w: float   # TDP x sockets, codecarbon's `max_power`
    ram_w: float
    cpu_basis: str
    ram_basis: str


@functools.cache
def codecarbon_power_model() -> PowerModel:
    """What codecarbon 3.x assumes when RAPL is absent (core/resource_tracker.py
    `_setup_fallback_tracking`): TDP matched in its bundled data/hardware/cpu_power.csv,
    else 4 W per thread (core/cpu.py DEFAULT_POWER_PER_CORE), else 85 W
    (external/hardware.py POWER_CONSTANT); times the socket count. RAM: its DIMM-count
    model (external/ram.py, 5 W per x86 DIMM). No tracker, no network, no files."""
    try:
        from codecarbon.core import cpu as cc_cpu
        from codecarbon.core.util import count_physical_cpus
        from codecarbon.external.hardware import POWER_CONSTANT
        from codecarbon.external.ram import RAM
    except Exception as e:
        raise EnergyError(f"codecarbon not importable: {type(e).__name__}: {e}") from e
    cc_log = logging.getLogger("codecarbon")   # after import: importing resets its level
    level = cc_log.level
    cc_log.setLevel(logging.ERROR)   # its "unknown CPU" warnings would go to stderr; the reason says it
    try:
        tdp = cc_cpu.TDP()
        sockets = count_physical_cpus() or 1
        if tdp.tdp is None:
            cpu_w = float(POWER_CONSTANT)
            basis = f"codecarbon POWER_CONSTANT {POWER_CONSTANT} W (CPU {tdp.model!r} unknown)"
        else:
            matched = tdp._get_cpu_power_from_registry(tdp.model) if tdp.model != "Unknown" else None
            how = ("TDP from codecarbon cpu_power.csv" if matched else
                   f"codecarbon fallback {cc_cpu.DEFAULT_POWER_PER_CORE} W per thread (CPU not in cpu_power.csv)")
            cpu_w, basis = float(tdp.tdp), f"{how}: {tdp.model} = {tdp.tdp} W"
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

    def end(self, name: str) -> dict[str, Figure]:
        t0, load = self._open.pop(name)
        dt = time.monotonic() - t0
        m = self.model
        pct = load.percent(prime_interval=0.0)
        cpu_w = cpu_load_watts(m.cpu_max_w, pct)
        return {
            "cpu": Figure(cpu_w * dt, "estimated", f"codecarbon cpu_load model at {pct:.0f} % load: {m.cpu_basis}",
                          detail={"watts": cpu_w, "load_percent": pct, "cpu_max_w": m.cpu_max_w}),
            "dram": Figure(m.ram_w * dt, "estimated", m.ram_basis, detail={"watts": m.ram_w}),
        }


class FirstAvailable:
    """Sensors in order of preference; for each figure the first one with a value wins,
    and why the ones before it failed is kept in its reason."""

    def __init__(self, sensors: list, notes: list[str] | None = None):
        self.sensors = sensors
        self.notes = list(notes or [])      # why preferred sensors were dropped at startup
        self._begin_errors: dict[tuple[str, int], str] = {}

    def begin(self, name: str) -> None:
        for i, s in enumerate(self.sensors):
            try:
                s.begin(name)
            except Exception as e:
                self._begin_errors[(name, i)] = f"{type(s).__name__} failed at window start: {e}"

    def end(self, name: str) -> dict[str, Figure]:
        per_sensor: list[dict[str, Figure]] = []
        for i, s in enumerate(self.sensors):
            err = self._begin_errors.pop((name, i), None)
            if err is None:
                try:
                    per_sensor.append(s.end(name))
                    continue
                except Exception as e:
                    err = f"{type(s).__name__} failed at window end: {e}"
            per_sensor.append({"cpu": Figure.unavailable(err), "dram": Figure.unavailable(err)})
        out = {}
        for key in ("cpu", "dram"):
            reasons = list(self.notes)
            chosen = None
            for figs in per_sensor:
                fig = figs.get(key) or Figure.unavailable("no figure")
                if fig.energy_j is not None:
                    chosen = fig
                    break
                reasons.append(fig.reason or "unavailable")
            if chosen is None:
                chosen = Figure.unavailable("; ".join(reasons))
            elif reasons:
                chosen.reason = "; ".join(reasons + [chosen.reason or ""]).strip("; ")
            out[key] = chosen
        return out


class EmptyGpuMeter:
    """Stand-in for a GPU that cannot be metered: every window is unavailable with the reason."""

    def __init__(self, cuda_index: int, reason: str, uuid: str | None = None, name: str = "unknown"):
        self.cuda_index, self.reason, self.name = cuda_index, reason, name
        self.uuid = uuid or f"unknown:{socket.gethostname()}:cuda{cuda_index}"

    def begin(self, name: str) -> None:
        pass

    def end(self, name: str) -> Figure:
        return Figure.unavailable(self.reason)

    def close(self) -> None:
        pass


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

    def __init__(self, gpu_meters: list, cpu_sensor, *, min_window_s: float = DEFAULT_MIN_WINDOW_S,
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
        self._begin_failed: dict[tuple[str, int], Figure] = {}   # (window, meter index): why its start failed

    @classmethod
    def create(cls, devices: Iterable[Any] = (), energy_cfg=None, *, rank: int = 0,
               sample_power: bool = False, rapl_root: str = "/sys/class/powercap") -> NodeEnergyMonitor:
        """Meters for the rank's CUDA devices (torch devices, "cuda:i" or ints; CPU devices
        are ignored) and this node's CPU/DRAM. Never raises for missing hardware."""
        from benchsuite.energy.nvml import make_gpu_meter
        from benchsuite.energy.rapl import RaplSensor

        indices = _cuda_indices(devices)
        gpus = [make_gpu_meter(i, sample_power=sample_power) for i in indices]
        notes = []
        try:
            rapl = RaplSensor(rapl_root)
            sensors = [rapl, _estimate(preload=not rapl.has_dram)]
        except EnergyError as e:
            notes.append(f"RAPL unavailable: {e}")
            sensors = [_estimate(preload=True)]
        def sync():
            import torch
            for i in indices:
                torch.cuda.synchronize(i)
        min_s = getattr(energy_cfg, "min_window_s", DEFAULT_MIN_WINDOW_S)
        return cls(gpus, FirstAvailable(sensors, notes), min_window_s=min_s, rank=rank, sync=sync if indices else None)

    def begin(self, name: str) -> None:
        """Open window `name` after the device has finished queued work."""
        if name in self._open:
            raise ValueError(f"energy window {name!r} is already open")
        self._sync()
        self._open[name] = time.monotonic()
        for i, g in enumerate(self.gpu_meters):
            failed = _safe(lambda: g.begin(name), default_reason="GPU meter failed at window start")
            if failed is not None:
                self._begin_failed[(name, i)] = failed
        _safe(lambda: self.cpu_sensor.begin(name))

    def end(self, name: str) -> WindowResult:
        """Close window `name` (after syncing the device) and return what was measured."""
        if name not in self._open:
            raise ValueError(f"energy window {name!r} was not begun")
        self._sync()
        window_s = time.monotonic() - self._open.pop(name)
        gpus = []
        for i, g in enumerate(self.gpu_meters):
            fig = self._begin_failed.pop((name, i), None) or _safe(lambda: g.end(name),
                                                                   default_reason="GPU meter failed")
            gpus.append(DeviceEnergy(g.uuid, g.name, g.cuda_index, self._finish(fig, window_s, f"gpu:{g.uuid}")))
        cpu_figs = _safe(lambda: self.cpu_sensor.end(name), default_reason="CPU sensor failed", many=True)
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

    def _finish(self, fig: Figure, window_s: float, key: str) -> Figure:
        if fig.energy_j is not None and window_s > 0:
            fig.avg_w = fig.energy_j / window_s
        if self.idle_w is not None and self.idle_w.get(key) is not None:
            fig.idle_w = self.idle_w[key]
            if fig.energy_j is not None:
                fig.above_idle_j = fig.energy_j - fig.idle_w * window_s
        return fig


def _estimate(preload: bool) -> EstimateSensor | EmptyCpuSensor:
    """codecarbon's estimate; its lookup (~0.5 s) is done now only when it will be used."""
    try:
        return EstimateSensor(codecarbon_power_model() if preload else None)
    except Exception as e:
        return EmptyCpuSensor(f"codecarbon estimate unavailable: {e}")


class EmptyCpuSensor:
    """Stand-in when neither RAPL nor codecarbon's estimate is available."""

    def __init__(self, reason: str):
        self.reason = reason

    def begin(self, name: str) -> None:
        pass

    def end(self, name: str) -> dict[str, Figure]:
        return {"cpu": Figure.unavailable(self.reason), "dram": Figure.unavailable(self.reason)}


def _safe(fn, default_reason: str = "meter failed", many: bool = False):
    """Run a meter call; any exception becomes an unavailable figure (a meter never fails a run)."""
    try:
        return fn()
    except Exception as e:
        reason = f"{default_reason}: {type(e).__name__}: {e}"
        if many:
            return {"cpu": Figure.unavailable(reason), "dram": Figure.unavailable(reason)}
        return Figure.unavailable(reason)


# --------------------------------------------------------------------------- attribution


def _pick(readings: list[tuple[int, dict]]) -> tuple[int, dict]:
    """One rank's reading for a shared device/node: the best source, then the lowest rank."""
    return min(readings, key=lambda rf: (SOURCES.index(rf[1]["source"]), rf[0]))


def _pick_device(readings: list[tuple[int, dict]]) -> tuple[int, dict]:
    rank, _ = _pick([(rk, d["figure"]) for rk, d in readings])
    return rank, next(d for rk, d in readings if rk == rank)


def sum_or_none(values) -> float | None:
    """The sum, or None when there is nothing to sum or any part is unknown (never a partial sum)."""
    values = list(values)
    return None if not values or any(v is None for v in values) else sum(values)


def attribute_energy(per_rank: list[dict[str, Any]]) -> dict[str, Any]:
    """The record's `energy` section from every rank's `WindowResult.to_dict()` (one window).

    Each physical GPU counts once (grouped by UUID, also when ranks share one), each
    node's CPU/DRAM once (grouped by host), and nodes are summed. gpu_j / cpu_j / dram_j
    are None unless every device / node has a figure, so no field holds a partial sum.
    total_j = sum of the available figures among gpu_j, cpu_j, dram_j -- listed in
    `total_includes` -- and None when none is available; `source` is the weakest source
    among them, `sources` gives each one's.
    """
    ranks = sorted(per_rank, key=lambda r: r["rank"])
    reasons: list[str] = []

    def note(text: str | None) -> None:
        if text and text not in reasons:
            reasons.append(text)

    by_uuid: dict[str, list[tuple[int, dict]]] = {}
    by_host: dict[str, list[tuple[int, dict]]] = {}
    windows = {r["rank"]: r["window_s"] for r in ranks}
    for r in ranks:
        for t in r.get("reasons", []):
            note(t)
        for d in r["gpus"]:
            by_uuid.setdefault(d["uuid"], []).append((r["rank"], d))
        by_host.setdefault(r["host"], []).append((r["rank"], r))

    def figure(f: dict, rank: int) -> dict:
        out = _flat(f)
        if out["avg_w"] is None and f["energy_j"] is not None and windows[rank]:
            out["avg_w"] = f["energy_j"] / windows[rank]
        return out

    per_device = []
    for uuid, readings in by_uuid.items():
        rank, dev = _pick_device(readings)
        host = next(r["host"] for r in ranks if r["rank"] == rank)
        per_device.append({"uuid": uuid, "name": dev["name"], "host": host, "cuda_index": dev["cuda_index"],
                           "ranks": sorted(rk for rk, _ in readings), "reading_rank": rank,
                           **figure(dev["figure"], rank)})
        if dev["figure"]["energy_j"] is None:
            note(f"GPU {uuid} on {host}: {dev['figure']['reason']}")

    per_node = []
    for host, readings in by_host.items():
        entry = {"host": host, "ranks": sorted(rk for rk, _ in readings)}
        for key in ("cpu", "dram"):
            rank, f = _pick([(rk, r[key]) for rk, r in readings])
            entry[key] = {"reading_rank": rank, **figure(f, rank)}
            if f["energy_j"] is None:
                note(f"{key} on {host}: {f['reason']}")
        per_node.append(entry)

    parts = {
        "gpu": per_device,
        "cpu": [n["cpu"] for n in per_node],
        "dram": [n["dram"] for n in per_node],
    }
    totals = {k: sum_or_none([f["energy_j"] for f in fs]) for k, fs in parts.items()}
    sources = {k: weakest(f["source"] for f in fs) if totals[k] is not None else "unavailable"
               for k, fs in parts.items()}
    included = [k for k in ("gpu", "cpu", "dram") if totals[k] is not None]
    idle_parts = {k: sum_or_none([f["idle_w"] for f in parts[k]]) for k in included}
    above_parts = {k: sum_or_none([f["above_idle_j"] for f in parts[k]]) for k in included}
    return {
        "gpu_j": totals["gpu"], "cpu_j": totals["cpu"], "dram_j": totals["dram"],
        "total_j": sum(totals[k] for k in included) if included else None,
        "total_includes": included,
        "source": weakest(sources[k] for k in included) if included else "unavailable",
        "sources": sources,
        "window_s": max(windows.values()) if windows else None,
        "short_window": any(r.get("short_window") for r in ranks),
        "idle_w": sum_or_none(list(idle_parts.values())) if included else None,
        "above_idle_j": sum_or_none(list(above_parts.values())) if included else None,
        "idle_w_parts": idle_parts,
        "per_device": per_device,
        "per_node": per_node,
        "reasons": reasons,
    }


def _flat(f: dict) -> dict:
    """A figure dict for the record (detail kept; unit-named fields first)."""
    keys = ("energy_j", "source", "avg_w", "reason", "sampled_energy_j", "idle_w", "above_idle_j", "detail")
    return {k: f.get(k) for k in keys}
