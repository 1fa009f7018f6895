"""benchmarks/bench_moe.py on a tiny CPU shape: the layers it compares, the expert path each runs,
its per-layer model FLOPs (the same count as metrics.flops for a whole model), the expert rows it
says were executed, and the padded / dropless pair its ratio line divides."""

from __future__ import annotations

import msgspec
import pytest
import torch

from benchmarks.bench_moe import DROPLESS, PADDED, default_pair, layer_flops_per_token, measure, routers, variants
from benchsuite.config import CarbonConfig, EnergyConfig, ModelConfig, MoEConfig, ParallelConfig, RunConfig, TrainConfig
from benchsuite.models.moe import capacity
from helpers import per_token

CPU = torch.device("cpu")
TINY = ModelConfig(hidden=16, ffn_hidden=32, seq_len=16, heads=2, layers=2, vocab=64)


def _run(moe: MoEConfig | None) -> RunConfig:
    return RunConfig(suite="s", workload="w", kind="moe" if moe else "dense", model=TINY,
                     train=TrainConfig(micro_batch=4), parallel=ParallelConfig(), energy=EnergyConfig(),
                     carbon=CarbonConfig(), moe=moe)


def test_it_compares_dense_switch_padded_and_dropless_top2_and_expert_choice_each_on_its_cpu_path():
    found = [(v.name, v.impl) for v in variants(TINY, CPU, torch.float32, 1.25, 4)]
    assert found == [("dense", "-"), ("switch", "padded_bmm"), (PADDED, "padded_bmm"), (DROPLESS, "loop_mm"),
                     ("expert choice", "padded_bmm")]
    moe = dict(routers(4, 1.25))
    assert (moe[DROPLESS].router, moe[DROPLESS].k, moe[DROPLESS].dropless) == ("token_choice", 2, True)
    assert (moe[PADDED].router, moe[PADDED].capacity_factor) == ("gshard", 1.25)


@pytest.mark.parametrize("moe", [m for _, m in routers(4, 1.25)]
                         + [MoEConfig(experts=8, router="token_choice", top_k=3, capacity_factor=0, shared_experts=1,
                                      expert_hidden=8)], ids=lambda m: f"{m.router}-cf{m.capacity_factor}")
def test_layer_flops_are_what_the_layer_adds_to_a_models_model_flops(moe):
    """A 2-block model with every = 2 has one MoE block: its model FLOPs less the dense model's are
    the MoE layer's less the dense FFN's."""
    moe = msgspec.structs.replace(moe, every=2)
    tokens = 4 * TINY.seq_len
    added = per_token(_run(moe)).model - per_token(_run(None)).model
    assert layer_flops_per_token(TINY, moe, tokens) - layer_flops_per_token(TINY, None, tokens) == added


def test_rows_count_slots_drops_and_the_ratio_pairs_padded_with_dropless_top2():
    torch.manual_seed(0)
    x = torch.randn(2, 16, TINY.hidden, requires_grad=True)
    rows = [measure(v, TINY, x, steps=1, warmup=0) for v in variants(TINY, CPU, torch.float32, 1.25, 4)]
    by_name = {r.variant.name: r for r in rows}
    gshard, dropless = by_name[PADDED], by_name[DROPLESS]
    assert gshard.slots_per_token == 4 * capacity(gshard.variant.moe, 32) / 32 == 4 * 20 / 32  # every slot
    assert dropless.slots_per_token == 2 and dropless.dropped == 0 and dropless.padding == 0
    assert gshard.flops_per_token == dropless.flops_per_token == layer_flops_per_token(TINY, dropless.variant.moe, 32)
    assert by_name["dense"].slots_per_token is None
    assert default_pair(rows, CPU, torch.float32) == (gshard, dropless)
