"""Overhead of energy metering on a training loop: meters on vs off, interleaved in one run.

Each round runs the same steps twice, once bare and once inside an energy window
(plus a window per step with --per-step, and the 20 ms power sampler with
--sample-power on a GPU). Rounds alternate which goes first, so drift (clocks,
thermals, other load) hits both. Prints median(on) / median(off); target <= 1.01.

    python benchmarks/bench_meter_overhead.py [--device cuda] [--rounds 7] [--steps 20]

Seen on one H200 (2 layers, width 2048, 40 steps ~1.1 s): one window around the loop
with the power sampler on, ratio 1.008; a window around every step, 1.32 -- each edge
synchronises the device, so per-step windows serialise the launch pipeline. Put one
window around the measured region, as the worker does.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from benchsuite.energy.meters import NodeEnergyMonitor

TARGET_RATIO = 1.01


def make_step(device: torch.device, width: int, batch: int):
    """A small model and one optimizer step on it; the step returns its loss, still on the device."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.TransformerEncoderLayer(width, 4, 4 * width, batch_first=True)
                                  for _ in range(2)]).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(batch, 128, width, device=device)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        return loss
    return step


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(step, steps: int, device: torch.device, monitor: NodeEnergyMonitor | None, per_step: bool):
    """(seconds, the loop window's result or None)."""
    sync(device)
    t0 = time.perf_counter()
    result = None
    if monitor:
        monitor.begin("loop")
    for i in range(steps):
        if monitor and per_step:
            monitor.begin(f"step{i}")
        step()
        if monitor and per_step:
            monitor.end(f"step{i}")
    if monitor:
        result = monitor.end("loop")
    sync(device)
    return time.perf_counter() - t0, result


def describe(r) -> str:
    """GPU counter vs integrated power over the same window, and the CPU/DRAM figures."""
    parts = []
    for d in r.gpus:
        f = d.figure
        text = f"gpu {f.source} {f.energy_j if f.energy_j is None else round(f.energy_j, 1)} J"
        if f.sampled_energy_j is not None and f.energy_j:
            diff = 100 * (f.sampled_energy_j - f.energy_j) / f.energy_j
            text += f" (sampled {f.sampled_energy_j:.1f} J, {diff:+.2f} %, {f.detail.get('power_api')})"
        parts.append(text + (f" avg {f.avg_w:.0f} W" if f.avg_w else ""))
    parts.append(f"cpu {r.cpu.source} {r.cpu.energy_j}")
    return f"[{r.window_s:.2f} s] " + ", ".join(parts)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (CPU device only)")
    p.add_argument("--per-step", action="store_true", help="also a window around every step (costly: syncs each step)")
    p.add_argument("--sample-power", action="store_true", help="run the NVML power sampler too")
    args = p.parse_args()

    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(args.threads)   # steadier timings on a shared CPU box
    step = make_step(device, args.width, args.batch)
    monitor = NodeEnergyMonitor.create([device], rank=0, sample_power=args.sample_power)
    monitor.min_window_s = 0.0
    for _ in range(3):      # warm-up: allocator, kernels, the meters' first reads
        timed(step, 2, device, monitor, args.per_step)
        timed(step, 2, device, None, False)
    probe = None

    on, off = [], []
    for r in range(args.rounds):
        order = [True, False] if r % 2 == 0 else [False, True]
        for metered in order:
            t, result = timed(step, args.steps, device, monitor if metered else None, args.per_step)
            (on if metered else off).append(t)
            if result is not None:
                probe = result
        print(f"round {r}: off {off[-1] * 1e3:8.1f} ms   on {on[-1] * 1e3:8.1f} ms   {describe(probe)}")
    monitor.close()

    ratio = statistics.median(on) / statistics.median(off)
    sources = {"gpu": [d.figure.source for d in probe.gpus], "cpu": probe.cpu.source, "dram": probe.dram.source}
    print(f"device {device}, {args.rounds} rounds x {args.steps} steps, per_step={args.per_step}, "
          f"sample_power={args.sample_power}, meter sources {sources}")
    print(f"median off {statistics.median(off) * 1e3:.1f} ms, on {statistics.median(on) * 1e3:.1f} ms, "
          f"ratio {ratio:.4f} ({'within' if ratio <= TARGET_RATIO else 'ABOVE'} target {TARGET_RATIO})")


if __name__ == "__main__":
    main()
