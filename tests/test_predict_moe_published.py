"""`benchsuite predict` against published MoE training throughput, validation only (nothing here is fit):
Liu et al. 2025, "MoE Parallel Folding: Heterogeneous Parallelism Mappings for Efficient Large-Scale MoE
Model Training with Megatron Core" (arXiv 2504.14960), Megatron-Core with folding on H100, its Table 3: 49.3 %
MFU for Mixtral 8x22B and 39.0 % for Qwen2-57B-A14B (global batch 256, sequence 4096, bf16, token dropping at
capacity factor 1 with sub-sequence dropping, §4.2). Every layout of its tables is a suite in
tests/test_published_moe_layouts.py.

The layouts are Table 3's (TP, EP, PP, expert-TP 1); what the table leaves out (micro-batch 1, the virtual
stages, sequence parallelism, the all-to-all dispatcher, grouped GEMM, distributed optimizer, no recompute) is
the authors' benchmarking configuration released with the paper (yanring/Megatron-MoE-ModelZoo, commit
78fd4d6 of 2025-04-03: runtime_configs/benchmarking/runtime.conf and
model_configs/benchmarking/{Mixtral-8x22B,Qwen2-57B-A14B}.yaml).

    Mixtral 8x22B    128 GPUs  TP 2  PP 8 (1F1B)         EP 8  56 layers, h 6144, 48 heads / 8 KV, 8 experts
                                                              top-2 of FFN 16384, vocab 32000
    Qwen2-57B-A14B    64 GPUs  TP 2  PP 4 (interleaved 7) EP 4  28 layers, h 3584, 28 heads / 4 KV, 64 experts
                                                              top-8 of FFN 2560 + a shared 20480, vocab 151936

Every assumption is workloads/systems/h100-8x.toml's (matmul rate measured on an H200, the expert load r,
the grouped-GEMM roofline); the dense rows of tests/test_predict_published.py use the A100 file. MFU on
both sides counts model FLOPs (6 per active parameter and token plus attention, Megatron-LM's convention,
no recompute) over the bf16 dense peak, 989.5 TFLOP/s. Run with -s to see every component.
"""

from __future__ import annotations

import msgspec
import pytest

from benchsuite.config import CarbonConfig, ModelConfig, MoEConfig
from benchsuite.layout import ParallelDims, Schedule
from benchsuite.predict import load_system, predict
from benchsuite.predict.workload import Implementation, Recompute, Workload

H100 = "workloads/systems/h100-8x.toml"
GLOBAL_BATCH = 256
TOLERANCE = 0.15

MIXTRAL_8X22B = ModelConfig(layers=56, hidden=6144, heads=48, kv_heads=8, vocab=32000, seq_len=4096,
                            ffn_hidden=16384, activation="swiglu", norm="rmsnorm", position="rope")
QWEN2_57B = ModelConfig(layers=28, hidden=3584, heads=28, kv_heads=4, vocab=151936, seq_len=4096, ffn_hidden=2560,
                        activation="swiglu", norm="rmsnorm", position="rope")
ROWS = {  # name: model, MoE, layout, published MFU
    "mixtral-8x22b": (MIXTRAL_8X22B, MoEConfig(experts=8, router="token_choice", top_k=2, capacity_factor=1.0,
                                               every=1),
                      ParallelDims.from_degrees(tp=2, pp=8, dp=8, ep=8, sequence_parallel=True), 0.493),
    "qwen2-57b-a14b": (QWEN2_57B, MoEConfig(experts=64, router="token_choice", top_k=8, capacity_factor=1.0,
                                            every=1, expert_hidden=2560, shared_experts=8),  # one shared 8 x 2560
                       ParallelDims.from_degrees(tp=2, pp=4, dp=8, ep=4, sequence_parallel=True, virtual_stages=7,
                                                 schedule=Schedule.INTERLEAVED), 0.390),
}


def predicted(name: str, capacity_factor: float | None = None):
    """The row's prediction; capacity_factor: another than the paper's 1 (0: dropless)."""
    model, moe, layout, published = ROWS[name]
    if capacity_factor is not None:
        moe = msgspec.structs.replace(moe, capacity_factor=capacity_factor)
    w = Workload(model=model, moe=moe, layout=layout, micro_batch=1, microbatches=GLOBAL_BATCH // layout.dp,
                 recompute=Recompute.NONE, compute_bytes=2, implementation=Implementation.MEGATRON)
    p = predict(w, load_system(H100), carbon=CarbonConfig())
    print(f"\n{name} ({layout.world} GPUs): predicted MFU {p.mfu:.3f}, published {published} "
          f"({p.mfu / published - 1:+.1%}); step {p.step_s:.3f} s")
    for c in p.components:
        print(f"  {c.name:<18} {c.seconds:8.3f} s  {c.detail}")
    return p, published


@pytest.mark.parametrize("name", list(ROWS))
def test_published_moe_row_within_15_percent(name):
    p, published = predicted(name)
    assert abs(p.mfu / published - 1) <= TOLERANCE
    assert p.step_s == pytest.approx(sum(c.seconds for c in p.components))


def test_what_sets_each_row_apart_is_in_its_own_terms():
    """At the paper's capacity factor 1 every expert computes its padded slots and no device waits on a busier
    one; dropless, Mixtral's one expert per device would carry the assumed load whole (ρ = r) and Qwen2's
    sixteen average it (ρ = 1 + (r − 1)/4). Qwen2's 1,024 rows per expert run its grouped GEMMs further below the
    matmul rate than Mixtral's 4,096; both all-to-alls stay inside a node (EP 8 and 4 of consecutive ranks)."""
    mixtral, _ = predicted("mixtral-8x22b")
    qwen, _ = predicted("qwen2-57b-a14b")
    for p in (mixtral, qwen):
        assert p.seconds("moe.imbalance") == 0 and "capacity factor 1: every expert computes" in p.detail(
            "moe.imbalance")
    r = load_system(H100).experts.load_max_over_mean
    assert f"busiest device {r:.3g}×" in predicted("mixtral-8x22b", 0)[0].detail("moe.imbalance")
    assert f"busiest device {1 + (r - 1) / 4:.3g}×" in predicted("qwen2-57b-a14b", 0)[0].detail("moe.imbalance")
    half = 660e12 * 2 / (2 * 3350e9)
    assert f"{4096 / (4096 + half):.2f} of the matmul rate" in mixtral.detail("moe.experts")
    assert f"{1024 / (1024 + half):.2f} of the matmul rate" in qwen.detail("moe.experts")
    assert all("inside a node" in p.detail("expert_parallel") for p in (mixtral, qwen))
