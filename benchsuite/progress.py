"""Progress lines: what rank 0 prints to its log (DIR/logs/) while a run trains, and how the
launcher recognises them when it tails that log. Torch-free: the launcher imports it."""

from __future__ import annotations

from dataclasses import dataclass

STEP = "step "
WARM_UP = "warm-up "
GIB = 2**30


def log_every(steps: int) -> int:
    """k: a step line every k measured steps, about ten per run."""
    return max(1, steps // 10)


def line_due(done: int, steps: int) -> bool:
    """Whether measured step `done` (counted from 1) gets a line: every k-th, and the last."""
    return done % log_every(steps) == 0 or done == steps


def _seconds(s: float) -> str:
    return f"{s:.1f}s"


@dataclass(frozen=True)
class StepFigures:
    """One step line: rank 0's loss of step `step`, and rates over the steps since the last line."""

    step: int
    steps: int
    loss: float
    tokens_per_s: float
    tflops_per_s: float  # model FLOPs per device
    mfu: float | None  # None: no peak FLOP/s known for the device
    memory_bytes: int | None  # peak so far (device allocator on GPU, process RSS on CPU)
    elapsed_s: float  # since the measured phase began (evaluations included)

    def line(self) -> str:
        mfu = f"{self.mfu:.1%}" if self.mfu is not None else "n/a"
        mem = f"{self.memory_bytes / GIB:.2f} GiB" if self.memory_bytes is not None else "n/a"
        eta = self.elapsed_s / self.step * (self.steps - self.step)
        return (f"{STEP}{self.step}/{self.steps} loss {self.loss:.4f} tok/s {self.tokens_per_s:,.0f} "
                f"TFLOP/s {self.tflops_per_s:.3g} MFU {mfu} mem {mem} elapsed {_seconds(self.elapsed_s)} "
                f"ETA {_seconds(eta)}")


def warm_up_line(steps: int, seconds: float, compiled: bool) -> str:
    return f"{WARM_UP}{steps} steps {seconds:.1f} s" + (" (compile included)" if compiled else "")


@dataclass(frozen=True)
class ProgressLine:
    """A progress line read back from a run's log."""

    text: str

    @classmethod
    def parse(cls, line: str) -> ProgressLine | None:
        return cls(line) if line.startswith((STEP, WARM_UP)) else None
