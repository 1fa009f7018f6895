"""Step timing that respects asynchronous devices, and the statistics of step times."""

from __future__ import annotations

import time

import numpy as np
import torch

from benchsuite.device import synchronize
from benchsuite.record.values import coefficient_of_variation


class StepTimer:
    """Per-step durations. On CUDA: events recorded on the stream, read once after a final
    synchronisation (no host sync inside the loop). On CPU work is synchronous, so a
    perf_counter pair around each step is exact.

    Marks are chained: each mark() ends the interval opened by the previous one (one event
    per step). pause() breaks the chain, so work done before the next mark() (evaluation,
    logging) belongs to no step: mark(), step, mark(), step, mark(), pause(), eval, mark(), step, mark()
    gives three step intervals and leaves the evaluation out. suspend() and resume() leave out a part of
    one step (an evaluation inside it): the step's time is the sum of its pieces either side."""

    def __init__(self, device: torch.device):
        self.device = device
        self._intervals: list[list[tuple]] = []  # the (start, end) pieces of each timed step
        self._pieces: list[tuple] = []  # the open step's pieces before a suspend()
        self._last = None  # the mark that opens the next interval; None after pause() or suspend()

    def _stamp(self):
        if self.device.type == "cuda":
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def mark(self) -> None:
        """Call once before the first step (and after a pause) and once after every step."""
        t = self._stamp()
        if self._last is not None:
            self._intervals.append([*self._pieces, (self._last, t)])
        self._pieces, self._last = [], t

    def pause(self) -> None:
        """End the chain: the time until the next mark() (and the open step's pieces) is in no step."""
        self._pieces, self._last = [], None

    def suspend(self) -> None:
        """Keep the open step's time so far as one of its pieces; the time until resume() is in no step."""
        if self._last is not None:
            self._pieces.append((self._last, self._stamp()))
        self._last = None

    def resume(self) -> None:
        """Go on timing the open step (or, before the first mark, start the chain)."""
        self._last = self._stamp()

    def durations_s(self) -> list[float]:
        if self.device.type == "cuda":
            synchronize(self.device)
            return [sum(a.elapsed_time(b) for a, b in pieces) / 1e3 for pieces in self._intervals]
        return [sum(b - a for a, b in pieces) for pieces in self._intervals]


def bootstrap_ci_median(xs: list[float], resamples: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95 % percentile-bootstrap interval of the median; seeded so a record is reproducible."""
    x = np.asarray(xs, dtype=float)
    picks = np.random.default_rng(seed).integers(0, x.size, size=(resamples, x.size))
    lo, hi = np.percentile(np.median(x[picks], axis=1), [2.5, 97.5])
    return float(lo), float(hi)


def summarize(xs: list[float]) -> dict:
    """The record's step_time_s: median, p10, p90 (numpy's linear percentiles), ci95 [lo, hi], n, cv."""
    if not xs:
        raise ValueError("no step times to summarize")
    p10, p90 = np.percentile(xs, [10, 90])
    return {"median": float(np.median(xs)), "p10": float(p10), "p90": float(p90),
            "ci95": list(bootstrap_ci_median(xs)), "n": len(xs), "cv": coefficient_of_variation(xs)}
