"""NVML GPU energy: the total-energy counter per device, sampled power where it is missing.

The device is found by UUID (benchsuite/nvml.py, never by index: NVML's order is not CUDA's), and
NVML's errors become EnergyError here, where the meter reads it.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from benchsuite.energy.common import EmptyGpuMeter, EnergyError, Reading
from benchsuite.nvml import Nvml, NvmlError, cuda_device_uuid, normalize_uuid
from benchsuite.record.types import Source

# Power sampling period when integrating. 20 ms is 5 samples per counter update
# (~100 ms); on an H200 20 ms samples matched the counter within 0.1-1.5 % over
# 10 s windows (measured beside the plain-PyTorch reference run).
SAMPLE_INTERVAL_S = 0.02

# Window edges wait for the energy counter's next update (it advances about every 100 ms), polled this
# often, so an edge is read within one poll of an update rather than up to a whole period late; a counter
# that does not move within EDGE_WAIT_S is read as it is (the bound then counts a whole period).
EDGE_POLL_S = 0.001
EDGE_WAIT_S = 0.25

# c_nvmlValue_t member per nvmlValueType_t (nvml.h: NVML_VALUE_TYPE_*).
_VALUE_MEMBER = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


class PowerSampler:
    """Background power samples (t, W) while any window is open; windows integrate
    their own slice with the trapezoid rule, so windows may overlap."""

    def __init__(self, read_w: Callable[[], float], interval_s: float = SAMPLE_INTERVAL_S):
        self.read_w, self.interval_s = read_w, interval_s
        self._samples: list[tuple[float, float]] = []
        self._lock = threading.Lock()
        self._stop: threading.Event | None = None
        self._thread: threading.Thread | None = None
        self._open = 0
        self.error: str | None = None

    def _take(self) -> None:
        try:
            w = self.read_w()
        except Exception as e:
            self.error = self.error or f"power sample failed: {e}"
            return
        with self._lock:
            self._samples.append((time.monotonic(), w))

    def _run(self, stop: threading.Event) -> None:
        while not stop.wait(self.interval_s) and self.error is None:
            self._take()

    def open(self) -> int:
        """Start sampling if needed, take a sample now; returns the window's first index."""
        with self._lock:
            self._open += 1
            if self._thread is None:
                self._stop = threading.Event()   # one per thread: a stopping thread keeps its own
                self._thread = threading.Thread(target=self._run, args=(self._stop,),
                                                name="gpu-power-sampler", daemon=True)
                self._thread.start()
            start = len(self._samples)
        self._take()
        return start

    def close(self, start: int) -> tuple[float, float, float]:
        """(energy J, lowest W, highest W) from the window's samples; stops the thread when no window is
        open. The range is what the unseen part of the time may have drawn (energy/bounds.py)."""
        self._take()
        with self._lock:
            window = self._samples[start:]
            self._open -= 1
            last = self._open == 0
            thread = self._thread
            if last:
                self._thread = None
                self._stop.set()
        if last and thread is not None:
            thread.join()
            with self._lock:
                if self._thread is None:
                    self._samples.clear()
        if self.error:
            raise EnergyError(self.error)
        if len(window) < 2:
            raise EnergyError("fewer than 2 power samples in the window")
        watts = [w for _, w in window]
        return trapezoid(window), min(watts), max(watts)


def trapezoid(samples: list[tuple[float, float]]) -> float:
    """Integral of watts over seconds: sum of 0.5 (w0 + w1) (t1 - t0)."""
    return sum(0.5 * (w0 + w1) * (t1 - t0) for (t0, w0), (t1, w1) in zip(samples, samples[1:]))


class NvmlGpuMeter:
    """Energy of one CUDA device: counter difference (measured), or integrated power
    samples (sampled) where the counter is unsupported; both when sample_power=True."""

    def __init__(self, cuda_index: int, *, sample_power: bool = False, lib=None,
                 interval_s: float = SAMPLE_INTERVAL_S, uuid: str | None = None):
        self.cuda_index = cuda_index
        try:
            self.nvml = Nvml(lib)
            self.handle, self.uuid = self.nvml.handle_for_uuid(uuid or cuda_device_uuid(cuda_index))
            self.name = self.nvml.name(self.handle)
        except NvmlError as e:
            raise EnergyError(str(e)) from e
        self.counter_reason = None
        try:
            self._counter_mj()
        except NvmlError as e:
            self.counter_reason = f"NVML energy counter unsupported ({e}); power integrated"
        self.power_api: str | None = None   # "instant" field or "average" nvmlDeviceGetPowerUsage
        want_samples = sample_power or self.counter_reason is not None
        self.sampler = PowerSampler(self._power_w, interval_s) if want_samples else None
        self._open: dict[str, dict[str, Any]] = {}

    def _counter_mj(self) -> int:
        return self.nvml.call(self.nvml.lib.nvmlDeviceGetTotalEnergyConsumption, self.handle)

    def _counter_at_update(self) -> tuple[int, float | None]:
        """(counter mJ, seconds within which it was read after an update): the counter polled until it
        advances, so the edge falls on an update; (last value, None) when it does not move in time."""
        first = self._counter_mj()
        deadline = time.monotonic() + EDGE_WAIT_S
        while time.monotonic() < deadline:
            before = time.monotonic()
            now = self._counter_mj()
            if now != first:
                return now, max(time.monotonic() - before, EDGE_POLL_S)
            time.sleep(EDGE_POLL_S)
        return first, None

    def _power_w(self) -> float:
        """Instantaneous power where the field exists (the plain reading is a 1 s average on
        Ampere and newer, per the NVML docs), else nvmlDeviceGetPowerUsage. mW -> W."""
        lib = self.nvml.lib
        if self.power_api in (None, "instant") and hasattr(lib, "NVML_FI_DEV_POWER_INSTANT"):
            try:
                v = self.nvml.call(lib.nvmlDeviceGetFieldValues, self.handle, [lib.NVML_FI_DEV_POWER_INSTANT])[0]
                if v.nvmlReturn != 0:
                    raise NvmlError(f"NVML_FI_DEV_POWER_INSTANT returned {v.nvmlReturn}")
                self.power_api = "instant"
                return getattr(v.value, _VALUE_MEMBER[v.valueType]) / 1000.0
            except NvmlError:
                if self.power_api == "instant":
                    raise
        self.power_api = "average"
        return self.nvml.call(lib.nvmlDeviceGetPowerUsage, self.handle) / 1000.0

    def begin(self, name: str) -> None:
        state: dict[str, Any] = {}
        if self.counter_reason is None:
            try:
                state["mj"], state["edge_s"] = self._counter_at_update()
            except NvmlError as e:
                state["counter_error"] = f"counter failed at window start: {e}"
        if self.sampler is not None:
            state["i0"] = self.sampler.open()
        self._open[name] = state

    def end(self, name: str) -> Reading:
        state = self._open.pop(name)
        counter_j, reasons, edges = None, [], [state.get("edge_s")]
        if self.counter_reason is not None:
            reasons.append(self.counter_reason)
        elif "mj" in state:
            try:
                end_mj, end_edge_s = self._counter_at_update()
                counter_j = (end_mj - state["mj"]) / 1000.0
                edges.append(end_edge_s)
            except NvmlError as e:
                reasons.append(f"counter failed at window end: {e}")
            if counter_j is not None and counter_j < 0:  # the counter restarts on a GPU reset / driver reload
                reasons.append(f"energy counter went backwards by {-counter_j:.3f} J during the window "
                               "(GPU reset or driver reload?)")
                counter_j = None
        else:
            reasons.append(state["counter_error"])
        sampled_j, detail = None, {}
        if "i0" in state:
            try:
                sampled_j, low_w, high_w = self.sampler.close(state["i0"])
                detail.update(sample_min_w=low_w, sample_max_w=high_w)
            except EnergyError as e:
                reasons.append(f"power sampling: {e}")
        if self.sampler is not None:
            detail["power_api"] = self.power_api
        if counter_j is not None:
            if None not in edges:  # both edges on a counter update (else the bound counts a whole period)
                detail["counter_edge_s"] = max(edges)
            return Reading(counter_j, Source.MEASURED, "; ".join(reasons) or None, sampled_energy_j=sampled_j,
                          detail=detail)
        if sampled_j is not None:
            return Reading(sampled_j, Source.SAMPLED, "; ".join(reasons), sampled_energy_j=sampled_j, detail=detail)
        return Reading.unavailable("; ".join(reasons) or "no GPU energy source")

    def close(self) -> None:
        self.nvml.shutdown()


def make_gpu_meter(cuda_index: int, *, sample_power: bool = False, lib=None):
    """An NvmlGpuMeter, or an EmptyGpuMeter saying why not (no driver, no pynvml, ...)."""
    uuid = None
    try:
        uuid = cuda_device_uuid(cuda_index)
        return NvmlGpuMeter(cuda_index, sample_power=sample_power, lib=lib, uuid=uuid)
    except Exception as e:
        uuid = f"GPU-{normalize_uuid(uuid)}" if uuid else None   # NVML's spelling, for dedupe
        return EmptyGpuMeter(cuda_index, f"NVML unavailable: {type(e).__name__}: {e}", uuid=uuid)
