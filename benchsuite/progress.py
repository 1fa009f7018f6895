"""Progress lines: what rank 0 logs (runlog.py: DIR/logs/) while a run trains, and how the
launcher recognises them when it tails that log. Torch-free: the launcher imports it."""

from __future__ import annotations

from dataclasses import dataclass

from benchsuite.runlog import EVAL, HEADER, STEP, WARM_UP, ParsedLine, Value

GIB = 2**30
STARTING = "starting ranks…"  # the bar's text from a run's start to its header line
WARMING_UP = "warming up…"  # from the header line to the warm-up line


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

    @property
    def eta_s(self) -> float:
        return self.elapsed_s / self.step * (self.steps - self.step)

    def body(self) -> str:
        """'3/10 loss 5.8912 tok/s 11,080 ...': the step line after its event word."""
        mfu = f"{self.mfu:.1%}" if self.mfu is not None else "n/a"
        mem = f"{self.memory_bytes / GIB:.2f} GiB" if self.memory_bytes is not None else "n/a"
        return (f"{self.step}/{self.steps} loss {self.loss:.4f} tok/s {self.tokens_per_s:,.0f} "
                f"TFLOP/s {self.tflops_per_s:.3g} MFU {mfu} mem {mem} elapsed {_seconds(self.elapsed_s)} "
                f"ETA {_seconds(self.eta_s)}")

    def fields(self) -> dict[str, Value]:
        """The same figures for the JSON-lines twin, unrounded."""
        return {"step": self.step, "steps": self.steps, "loss": self.loss, "tokens_per_s": self.tokens_per_s,
                "tflops_per_s": self.tflops_per_s, "mfu": self.mfu, "memory_bytes": self.memory_bytes,
                "elapsed_s": self.elapsed_s, "eta_s": self.eta_s}


def warm_up_body(steps: int, seconds: float, compiled: bool) -> str:
    return f"{steps} steps {seconds:.1f} s" + (" (compile included)" if compiled else "")


def eval_body(step: int, steps: int, val_loss: float) -> str:
    return f"step {step}/{steps} val_loss {val_loss:.4f}"


@dataclass(frozen=True)
class ProgressLine:
    """What the live bar shows of a run's log line: 'step 3/10 loss …' (time and rank left out)."""

    text: str

    @classmethod
    def parse(cls, line: str) -> ProgressLine | None:
        parsed = ParsedLine.parse(line)
        if parsed is None or parsed.event not in (HEADER, WARM_UP, STEP, EVAL):
            return None
        return cls(WARMING_UP if parsed.event == HEADER else f"{parsed.event} {parsed.body}")
