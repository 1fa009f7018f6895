"""Per-step cost of benchsuite.measure()'s m.step() on a training loop (goal: below 1 % of a 50 ms step).

Two figures. (1) The call itself: many m.step() calls back to back, nothing else, in microseconds per call,
and as a share of a 50 ms step. (2) A real loop: the same CPU training steps (a model sized to about 50 ms a
step) bare and inside measure() with m.step() after each, interleaved rounds (which goes first alternates,
so drift hits both); median(measured) / median(bare). (2) carries the machine's noise, which on a shared
box is larger than the overhead; (1) is the overhead. The load average is printed beside them.

    python benchmarks/bench_measure.py [--device cpu|cuda] [--calls 20000] [--rounds 5] [--steps 10]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

import benchsuite

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_meter_overhead import make_step  # noqa: E402  the same small model and AdamW step

STEP_S = 0.050  # the step the goal is stated for
GOAL = 0.01


def per_call_s(device: torch.device, calls: int, out: str) -> tuple[float, float]:
    """(seconds per m.step(tokens=...), per m.step(tokens=..., loss=<device tensor>)), the loop doing nothing else."""
    loss = torch.ones((), device=device)
    figures = []
    for kwargs in ({"tokens": 4096}, {"tokens": 4096, "loss": loss}):
        with benchsuite.measure("bench-measure-calls", out=out, device=device) as m:
            t0 = time.perf_counter()
            for _ in range(calls):
                m.step(**kwargs)
            figures.append((time.perf_counter() - t0) / calls)
    return figures[0], figures[1]


def loop_s(step, steps: int, device: torch.device, out: str | None) -> float:
    """Seconds of `steps` steps, bare (out None) or inside measure() with m.step() after each; the
    measurement's start and stop (meters, the record) are outside the figure, as they are outside a loop."""
    if out is None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - t0
    with benchsuite.measure("bench-measure-loop", out=out, device=device, energy={"min_window_s": 0}) as m:
        t0 = time.perf_counter()
        for _ in range(steps):
            m.step(tokens=4096, loss=step())
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds = time.perf_counter() - t0
    return seconds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--calls", type=int, default=20000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--width", type=int, default=160, help="model width (about 50 ms a step on one CPU thread)")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (steadier on a shared box)")
    args = p.parse_args()
    warnings.filterwarnings("ignore", message="no peak FLOP/s")  # a CPU has no datasheet peak: MFU is null
    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as out:
        plain, with_loss = per_call_s(device, args.calls, out)
        print(f"m.step(tokens=...): {plain * 1e6:.2f} us per call = {plain / STEP_S:.4%} of a {STEP_S * 1e3:.0f} ms "
              f"step; with loss=<tensor>: {with_loss * 1e6:.2f} us = {with_loss / STEP_S:.4%} "
              f"({'within' if with_loss / STEP_S < GOAL else 'ABOVE'} the {GOAL:.0%} goal)")
        step = make_step(device, args.width, args.batch)
        loop_s(step, 2, device, None)  # warm-up: allocator, kernels
        bare, measured = [], []
        for r in range(args.rounds):
            for metered in ([True, False] if r % 2 == 0 else [False, True]):
                (measured if metered else bare).append(loop_s(step, args.steps, device, out if metered else None))
        ratio = statistics.median(measured) / statistics.median(bare)
        print(f"loop of {args.steps} steps x {args.rounds} rounds on {device}: bare "
              f"{statistics.median(bare) / args.steps * 1e3:.1f} ms/step, measured "
              f"{statistics.median(measured) / args.steps * 1e3:.1f} ms/step, ratio {ratio:.4f} (machine noise "
              f"included)")
    print(f"load average {os.getloadavg()[0]:.2f} (1 min) on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
