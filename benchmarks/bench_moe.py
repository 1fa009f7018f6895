"""Forward + backward time of the dense MLP and the MoE layers, side by side: padded top-2 (gshard,
capacity slots) against dropless top-2 (token_choice, capacity_factor = 0: sorted rows, no padding)
on the same experts, with switch and expert choice beside them.

    python benchmarks/bench_moe.py                 # CPU-sized, fp32
    python benchmarks/bench_moe.py --device cuda   # the H200 shape of workloads/h200.toml, bf16;
                                                   # grouped_mm and the fallback paths both shown

Each expert has the dense FFN width, so switch does the dense layer's FLOPs per token, the two
top-2 layers twice that and expert choice E * floor(cf * N / E) / N times (plus padding: see the
slots/token column). Per row: model FLOPs per token of the layer (forward + backward, 6 per MAC,
counted as benchsuite/metrics/flops.py counts them: active experts and router, never padding),
expert rows executed per token (slot layout: every slot of padded_bmm, the filled ones of
grouped_mm; dropless: k), the expert implementation that ran, and the model TFLOP/s achieved.
The last line is the time of dropless top-2 over padded top-2, both with the device's default
expert path, measured in this run.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass

import torch

from benchsuite.config import ModelConfig, MoEConfig
from benchsuite.metrics.flops import computed_slot_share
from benchsuite.models.moe import (SLOT_IMPLS, MoELayer, active_experts_per_token, expected_slots_per_token,
                                   layout_impl, select_expert_impl)
from benchsuite.models.ffn import MLP

SIZES = {  # hidden, ffn, experts, batch, seq
    "cpu": (256, 1024, 8, 4, 256),
    "cuda": (2048, 8192, 8, 8, 2048),
}
PADDED, DROPLESS = "gshard", "dropless top-2"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--steps", type=int, default=None, help="timed steps (default 5 on CPU, 20 on CUDA)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--capacity-factor", type=float, default=1.25,
                   help="of the layers with capacity (switch, gshard, expert choice); dropless has none")
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


@dataclass(frozen=True)
class Variant:
    name: str
    module: torch.nn.Module
    moe: MoEConfig | None  # None: the dense MLP

    @property
    def impl(self) -> str:
        """The expert path the layer runs (its layout's: dropless runs sorted rows)."""
        return self.module.expert_impl if self.moe is not None else "-"


def layer_flops_per_token(cfg: ModelConfig, moe: MoEConfig | None, tokens: int) -> float:
    """Model FLOPs per token of one FFN layer, forward + backward: 6 x (its active matmul weights).
    MoE: the experts a token uses (metrics.flops.param_counts' rule) plus the shared ones and the router."""
    mats = 3 if cfg.activation == "swiglu" else 2
    if moe is None:
        return 6.0 * mats * cfg.hidden * cfg.ffn
    expert = mats * cfg.hidden * (moe.expert_hidden or cfg.ffn)
    return 6.0 * ((active_experts_per_token(moe, tokens) + moe.shared_experts) * expert + cfg.hidden * moe.experts)


def routers(experts: int, cf: float) -> list[tuple[str, MoEConfig]]:
    return [("switch", MoEConfig(experts=experts, router="switch", capacity_factor=cf)),
            (PADDED, MoEConfig(experts=experts, router="gshard", capacity_factor=cf)),
            (DROPLESS, MoEConfig(experts=experts, router="token_choice", top_k=2, capacity_factor=0)),
            ("expert choice", MoEConfig(experts=experts, router="expert_choice", capacity_factor=cf))]


def variants(cfg: ModelConfig, device: torch.device, dtype: torch.dtype, cf: float, experts: int):
    """Dense, then each router in every expert path this device runs (grouped_mm where it is fast,
    and the fallback: padded_bmm for slots, loop_mm for sorted rows)."""
    yield Variant("dense", MLP(cfg.hidden, cfg.ffn, cfg.activation), None)
    impls = list(SLOT_IMPLS[::-1]) if select_expert_impl(device, dtype) == "grouped_mm" else ["padded_bmm"]
    for name, moe in routers(experts, cf):
        for impl in dict.fromkeys(layout_impl(i, moe) for i in impls):
            yield Variant(name, MoELayer(cfg, moe, expert_impl=impl), moe)


@dataclass(frozen=True)
class Row:
    variant: Variant
    seconds: float
    flops_per_token: float
    slots_per_token: float | None
    dropped: float | None
    padding: float | None


def measure(v: Variant, cfg: ModelConfig, x: torch.Tensor, steps: int, warmup: int) -> Row:
    tokens = x.shape[0] * x.shape[1]
    seconds = time_step(v.module, x, steps, warmup)
    flops = layer_flops_per_token(cfg, v.moe, tokens)
    if v.moe is None:
        return Row(v, seconds, flops, None, None, None)
    with torch.no_grad():
        stats = v.module(x)[2]
    padding = stats.padding_frac.item()
    slots = expected_slots_per_token(v.moe, tokens) * (1.0 if v.moe.dropless else computed_slot_share(v.impl, padding))
    return Row(v, seconds, flops, slots, stats.dropped_frac.item(), padding)


def default_pair(rows: list[Row], device: torch.device, dtype: torch.dtype) -> tuple[Row, Row]:
    """Padded and dropless top-2 on the device's default expert path (select_expert_impl)."""
    impl = select_expert_impl(device, dtype)
    pick = {r.variant.name: r for r in rows
            if r.variant.moe is not None and r.variant.impl == layout_impl(impl, r.variant.moe)}
    return pick[PADDED], pick[DROPLESS]


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
    header = (f"{'layer':<15} {'impl':<11} {'ms/step':>9} {'tokens/s':>12} {'x dense':>8} {'GFLOP/tok':>9} "
              f"{'TFLOP/s':>8} {'experts/tok':>11} {'slots/tok':>9} {'dropped':>8} {'padding':>8}")
    print(header)
    print("-" * len(header))
    rows = []
    for v in variants(cfg, device, dtype, args.capacity_factor, experts):
        v.module.to(device=device, dtype=dtype)
        row = measure(v, cfg, x, steps, args.warmup)
        rows.append(row)
        dense_s = rows[0].seconds
        line = (f"{v.name:<15} {v.impl:<11} {row.seconds * 1e3:>9.2f} {tokens / row.seconds:>12,.0f} "
                f"{row.seconds / dense_s:>8.2f} {row.flops_per_token / 1e9:>9.4f} "
                f"{row.flops_per_token * tokens / row.seconds / 1e12:>8.3f}")
        if v.moe is not None:
            line += (f" {active_experts_per_token(v.moe, tokens):>11.2f} {row.slots_per_token:>9.2f}"
                     f" {row.dropped:>8.3f} {row.padding:>8.3f}")
        print(line)
    padded, dropless = default_pair(rows, device, dtype)
    print(f"dropless top-2 ({dropless.variant.impl}) / padded top-2 ({padded.variant.impl}), same experts, "
          f"this run: {dropless.seconds / padded.seconds:.2f} x the time "
          f"({dropless.seconds * 1e3:.2f} vs {padded.seconds * 1e3:.2f} ms/step)")


if __name__ == "__main__":
    main()
