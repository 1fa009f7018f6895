"""Forward + backward time of the dense MLP and the three MoE routers, side by side.

    python benchmarks/bench_moe.py                 # CPU-sized, fp32
    python benchmarks/bench_moe.py --device cuda   # GPU-sized, bf16; grouped_mm and padded_bmm both shown

Each expert has the dense FFN width, so switch does the dense layer's FLOPs per
token, gshard twice that and expert choice capacity_factor times (plus padding:
see the slots/token column).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from benchsuite.config import ModelConfig, MoEConfig
from benchsuite.models.moe import (MoELayer, active_experts_per_token, expected_slots_per_token,
                                   select_expert_impl)
from benchsuite.models.transformer import MLP

SIZES = {  # hidden, ffn, experts, batch, seq
    "cpu": (256, 1024, 8, 4, 256),
    "cuda": (2048, 8192, 8, 8, 2048),
}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--steps", type=int, default=None, help="timed steps (default 5 on CPU, 20 on CUDA)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--capacity-factor", type=float, default=1.25)
    return p.parse_args()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_step(module: torch.nn.Module, x: torch.Tensor, steps: int, warmup: int) -> float:
    """Median seconds of one forward + backward, the device synchronised around each step."""
    times = []
    for i in range(warmup + steps):
        module.zero_grad(set_to_none=True)
        x.grad = None
        sync(x.device)
        start = time.perf_counter()
        y, aux = module(x)[:2]
        loss = y.float().square().mean()
        (loss + aux if aux is not None else loss).backward()
        sync(x.device)
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def variants(cfg: ModelConfig, device: torch.device, dtype: torch.dtype, cf: float, experts: int):
    """(name, impl, module, moe config | None); on devices with grouped_mm, each router in both impls."""
    yield "dense", "-", MLP(cfg.hidden, cfg.ffn, cfg.activation), None
    impls = ["padded_bmm"]
    if select_expert_impl(device, dtype) == "grouped_mm":
        impls.insert(0, "grouped_mm")
    for router in ("switch", "gshard", "expert_choice"):
        moe = MoEConfig(experts=experts, router=router, capacity_factor=cf)
        for impl in impls:
            yield router, impl, MoELayer(cfg, moe, expert_impl=impl), moe


def main() -> None:
    args = parse_args()
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    steps = args.steps or (20 if device.type == "cuda" else 5)
    hidden, ffn, experts, batch, seq = SIZES[device.type]
    tokens = batch * seq
    cfg = ModelConfig(hidden=hidden, ffn_hidden=ffn, seq_len=seq)
    torch.manual_seed(0)
    x = torch.randn(batch, seq, hidden, device=device, dtype=dtype, requires_grad=True)

    print(f"device={device} dtype={dtype} tokens={tokens} hidden={hidden} ffn={ffn} experts={experts} "
          f"capacity_factor={args.capacity_factor} steps={steps}")
    header = f"{'layer':<14} {'impl':<11} {'ms/step':>9} {'tokens/s':>12} {'x dense':>8} " \
             f"{'experts/tok':>11} {'slots/tok':>9} {'dropped':>8} {'padding':>8}"
    print(header)
    print("-" * len(header))
    dense_s = None
    for name, impl, module, moe in variants(cfg, device, dtype, args.capacity_factor, experts):
        module = module.to(device=device, dtype=dtype)
        seconds = time_step(module, x, steps, args.warmup)
        dense_s = dense_s or seconds
        row = f"{name:<14} {impl:<11} {seconds * 1e3:>9.2f} {tokens / seconds:>12,.0f} {seconds / dense_s:>8.2f}"
        if moe is not None:
            _, _, s = module(x)
            row += (f" {active_experts_per_token(moe, tokens):>11.2f} {expected_slots_per_token(moe, tokens):>9.2f}"
                    f" {s.dropped_frac.item():>8.3f} {s.padding_frac.item():>8.3f}")
        print(row)


if __name__ == "__main__":
    main()
