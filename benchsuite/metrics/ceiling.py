"""The matmul ceiling: the FLOP/s one large square matmul sustains on a rank's device, the
reachable figure `mfu_vs_ceiling` divides by (an H200 sits at its power limit well below its
datasheet peak: 660-770 TFLOP/s of bf16 matmul against 989 on the datasheet, benchmarks/NOTES.md).

A short burst overstates it (the first milliseconds run at boost clocks before the card hits its
power limit) and one pass on a loaded CPU understates it (another process took the cores for
a while). So the loop is time-based: it warms up for `warmup_s`, then times `repeats` windows
of at least `duration_s` each (CUDA events on GPU, perf_counter on CPU, where work is
synchronous) and keeps the best window. On CPU it runs with the rank's own thread count (the
launcher's thread rule is applied before it is called).

The ceiling is a constant of the host for the suite's duration: suite_ceiling measures it in the
first run that needs it (per device, precision, CPU threads and ranks on the node) and later runs
reuse it, their record's source saying so (suite_constants.py).

When a run still achieves more than the ceiling, the ceiling measurement is what is wrong (a
run cannot outpace the device's best matmul): `mfu_vs_ceiling` is then null with that reason.
torch is imported where something is measured, so the record upgrade below needs none.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Callable

from benchsuite.record.types import MFU_VS_CEILING_MAX
from benchsuite.suite_constants import SuiteConstants, ranks_on_this_node

# (warm-up s, window s, windows) per device type: on GPU past the power-limit transient, then
# 2 s timed; on CPU (no transient; a 512^3 matmul takes ~5 ms) 50 ms windows, best of three:
# on a loaded box their spread run to run matched that of 0.2 s windows, at a quarter the time.
DEFAULTS = {"cuda": (1.0, 1.0, 2), "cpu": (0.05, 0.05, 3)}
SIZE = {"cuda": 8192, "cpu": 512}


@dataclass(frozen=True)
class TimedWindow:
    iters: int
    seconds: float

    @property
    def rate(self) -> float:
        """Iterations per second."""
        return self.iters / self.seconds


@dataclass(frozen=True)
class LoopTiming:
    warmup: TimedWindow
    windows: list[TimedWindow]

    @property
    def best(self) -> TimedWindow:
        return max(self.windows, key=lambda w: w.rate)


class _Clock:
    """Elapsed seconds since start(), read with the device synchronised: CUDA events on GPU
    (the device's own clock), perf_counter on CPU."""

    def __init__(self, device):
        import torch

        self.cuda = device.type == "cuda"
        self._torch = torch

    def start(self) -> None:
        if self.cuda:
            self._start = self._torch.cuda.Event(enable_timing=True)
            self._start.record()
        else:
            self._start = time.perf_counter()

    def elapsed_s(self) -> float:
        if not self.cuda:
            return time.perf_counter() - self._start
        end = self._torch.cuda.Event(enable_timing=True)
        end.record()
        end.synchronize()
        return self._start.elapsed_time(end) / 1e3


def _run_for(step: Callable[[], None], clock: _Clock, seconds: float, chunk: int) -> TimedWindow:
    """Calls step in chunks until at least `seconds` have elapsed; checked between chunks only, so
    on GPU the device stays busy inside a chunk."""
    clock.start()
    iters = 0
    while True:
        for _ in range(chunk):
            step()
        iters += chunk
        elapsed = clock.elapsed_s()
        if elapsed >= seconds:
            return TimedWindow(iters, elapsed)


def time_loop(step: Callable[[], None], device, warmup_s: float, duration_s: float, repeats: int) -> LoopTiming:
    """Warm up for warmup_s (one call per check), then `repeats` windows of at least duration_s,
    each checked about 20 times (chunk size from the warm-up's pace)."""
    clock = _Clock(device)
    warmup = _run_for(step, clock, warmup_s, chunk=1)
    chunk = max(1, int(duration_s / 20 * warmup.rate))
    return LoopTiming(warmup, [_run_for(step, clock, duration_s, chunk) for _ in range(repeats)])


@dataclass(frozen=True)
class MatmulCeiling:
    flops_per_s: float
    source: str  # how it was measured, for the record


def measure_matmul_ceiling(device, dtype, n: int | None = None, warmup_s: float | None = None,
                           duration_s: float | None = None, repeats: int | None = None) -> MatmulCeiling:
    """Best sustained FLOP/s of an n³ matmul on device (see the module docstring)."""
    import torch

    kind = "cuda" if device.type == "cuda" else "cpu"
    d_warm, d_dur, d_rep = DEFAULTS[kind]
    warmup_s, duration_s, repeats = (d_warm if warmup_s is None else warmup_s,
                                     d_dur if duration_s is None else duration_s, repeats or d_rep)
    n = n or SIZE[kind]
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    timing = time_loop(lambda: torch.matmul(a, b, out=out), device, warmup_s, duration_s, repeats)
    threads = f", {torch.get_num_threads()} thread(s)" if kind == "cpu" else ""
    source = (f"{n}^3 {str(dtype).removeprefix('torch.')} matmul: best of {repeats} windows of >= {duration_s:g} s "
              f"after {warmup_s:g} s warm-up{threads}")
    return MatmulCeiling(2 * n**3 * timing.best.rate, source)


def suite_ceiling(constants: SuiteConstants, device, dtype) -> MatmulCeiling:
    """The device's ceiling at dtype, measured once per suite: another run of the suite on the same
    device (GPU UUID, or the CPU model and this rank's thread count), dtype and ranks per node reuses
    it, its source extended with where it came from."""
    from benchsuite.environment import device_info

    info = device_info(device)
    key = {"host": info["host"], "device": info["uuid"] or info["name"], "dtype": str(dtype),
           "cpu_threads": info["cpu_threads"] if device.type == "cpu" else None, "ranks_on_node": ranks_on_this_node()}
    value, reuse = constants.reuse_or_measure("matmul-ceiling", key,
                                              lambda: asdict(measure_matmul_ceiling(device, dtype)))
    ceiling = MatmulCeiling(**value)
    return ceiling if reuse is None else MatmulCeiling(ceiling.flops_per_s, f"{ceiling.source}; {reuse.label()}")


def vs_ceiling(achieved_flops_per_s: float, ceiling_flops_per_s: float | None) -> tuple[float | None, str | None]:
    """(mfu_vs_ceiling, reason when null). Above the ceiling (past timing noise) the ceiling is the
    figure in doubt, not the run."""
    if not ceiling_flops_per_s or ceiling_flops_per_s <= 0:
        return None, "no matmul ceiling measured"
    ratio = achieved_flops_per_s / ceiling_flops_per_s
    if ratio > MFU_VS_CEILING_MAX:
        return None, (f"the matmul ceiling measurement is unreliable: the run achieved {ratio:.2f} x the "
                      f"{ceiling_flops_per_s / 1e12:.3g} TFLOP/s measured (the device was busy while the "
                      "ceiling was timed); the run's step time and FLOPs are not in question")
    return ratio, None
