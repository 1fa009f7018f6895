"""`benchsuite predict` for MoE, FP8, small models and dense-vs-MoE: each term against its docstring
formula (benchsuite/predict/moe.py, fp8.py, step.py's host floor, compare.py), in numbers."""

from __future__ import annotations

import dataclasses
import json
import math

import msgspec
import pytest

from benchsuite.cli import main
from benchsuite.config import CarbonConfig, ModelConfig, MoEConfig
from benchsuite.layout import ParallelDims
from benchsuite.metrics.comm import data_parallel_collectives, ring_bytes
from benchsuite.models.moe import capacity
from benchsuite.predict import load_system, predict
from benchsuite.predict.compute import params_per_device
from benchsuite.predict.workload import Implementation, Recompute, Workload

H100 = "workloads/systems/h100-8x.toml"
MODEL = ModelConfig(layers=4, hidden=512, heads=8, vocab=1024, seq_len=256, ffn_hidden=1024, activation="swiglu")
DROPLESS = MoEConfig(experts=16, router="token_choice", top_k=2, capacity_factor=0, every=1)
R, B = 660e12, 3350e9  # h100-8x.toml: matmul FLOP/s, memory bytes/s


def workload(moe=DROPLESS, layout=ParallelDims.from_degrees(dp=4, ep=4), impl=Implementation.MEGATRON, **kw):
    args = dict(model=MODEL, moe=moe, layout=layout, micro_batch=2, microbatches=1, recompute=Recompute.NONE,
                compute_bytes=2, implementation=impl)
    return Workload(**{**args, **kw})


def run(w, system=None):
    return predict(w, system or load_system(H100), carbon=CarbonConfig(intensity_g_per_kwh=400), run_tokens=1e9)


def test_moe_terms_follow_their_formulas():
    """Dropless top-2 of 16 experts on EP 4: N = 512 tokens, S = 1,024 rows, g = 4 experts a device,
    T = 256 rows per expert, T½ = R·2/(2·B), ρ = 1 + (1.05 − 1)/√4."""
    p = run(workload())
    layers, n, rows, h = 4, 512, 1024, 512
    expert = 3 * h * 1024
    half = R * 2 / (2 * B)
    eta = 256 / (256 + half)
    experts = layers * 6 * rows * expert / (R * eta)
    assert p.seconds("moe.experts") == pytest.approx(experts)
    assert p.seconds("moe.router") == pytest.approx(layers * 3 * 5 * n * 16 * 4 / B)  # 4 passes + aux loss
    assert p.seconds("moe.permutation") == pytest.approx(layers * 2 * 2 * 4 * rows * h * 2 / B)  # Q = 4: g > 1
    rho = 1 + 0.05 / 2
    assert p.seconds("moe.imbalance") == pytest.approx((rho - 1) * (experts + p.seconds("expert_parallel")))
    assert f"{eta:.2f} of the matmul rate" in p.detail("moe.experts")
    assert "assumed" in p.detail("moe.imbalance") and p.expert_load.startswith("1.05")
    # the routed experts left the dense matmul term: with none routed it is the whole of executed_matmul
    dense = run(workload(moe=None))
    assert p.seconds("compute.matmul") == pytest.approx(dense.seconds("compute.matmul") + layers * 6 * n * h * 16 / R
                                                        - layers * 6 * n * 3 * h * 1024 / R)


@pytest.mark.parametrize("moe,source", [
    (MoEConfig(experts=16, router="expert_choice", capacity_factor=2.0, every=1), "balanced by construction"),
    (MoEConfig(experts=16, router="token_choice", top_k=2, capacity_factor=0, every=1, routing="forced"), "forced"),
    (MoEConfig(experts=16, router="gshard", capacity_factor=1.25, every=1), "padded slots"),
])
def test_routers_that_cannot_overload_a_device_carry_no_imbalance(moe, source):
    p = run(workload(moe=moe))
    assert p.seconds("moe.imbalance") == 0.0 and source in p.detail("moe.imbalance")


def test_a_recorded_load_replaces_the_assumption_and_one_expert_a_device_carries_it_whole():
    """EP 16 of 16 experts: g = 1, so ρ = r; r from the record (its source named), not the system file."""
    w = workload(layout=ParallelDims.from_degrees(dp=16, ep=16), expert_load=1.6, expert_load_source="r.json")
    p = run(w)
    assert "busiest device 1.6×" in p.detail("moe.imbalance") and "recorded (r.json)" in p.detail("moe.imbalance")
    assert p.seconds("moe.imbalance") == pytest.approx(0.6 * (p.seconds("moe.experts") + p.seconds("expert_parallel")))


def test_capacity_pads_every_expert_to_c_rows():
    """gshard at capacity factor 1.25: S = E·C rows per device (padding computed), T = C."""
    moe = MoEConfig(experts=16, router="gshard", capacity_factor=1.25, every=1)
    p = run(workload(moe=moe, layout=ParallelDims(1), impl=Implementation.BENCHSUITE))
    c = capacity(moe, 512)
    half = R * 2 / (2 * B)
    assert p.seconds("moe.experts") == pytest.approx(4 * 6 * 16 * c * 3 * 512 * 1024 / (R * c / (c + half)))


def test_all_to_all_across_nodes_splits_its_bytes_between_the_links():
    """Megatron's folded EP 16 over two 8-GPU nodes: 8/16 of a rank's payload leaves the node at the
    inter-node rate while 7/16 stays inside, at once; 4 calls a layer."""
    p = run(workload(layout=ParallelDims.from_degrees(dp=16, ep=16)))
    s = load_system(H100)
    payload = 1024 * 512 * 2
    inside, outside = payload * 7 / 16 / (s.intra_node.gbps * 1e9), payload * 8 / 16 / (s.inter_node.gbps * 1e9)
    assert p.seconds("expert_parallel") == pytest.approx(16 * (s.inter_node.latency_us * 1e-6 + max(inside, outside)))
    assert "across nodes" in p.detail("expert_parallel")
    assert p.ep_bytes_per_microbatch == pytest.approx(16 * ring_bytes("all_to_all", payload, 16))


def test_a_tiny_model_is_bound_by_its_operators_and_says_so():
    """A 5 M-parameter model (the issue's case) on the H100 file: the step is its operators' floor, not a
    1.9 µs step from the device rates, and the prediction warns; a 7B-class step does not."""
    tiny = ModelConfig(layers=4, hidden=256, heads=4, vocab=8192, seq_len=128)
    w = workload(moe=None, layout=ParallelDims(1), impl=Implementation.BENCHSUITE, model=tiny)
    p = run(w)
    ops = 4 * 92 + 50
    assert p.step_s == pytest.approx(ops * 5e-6)
    assert len(p.warnings) == 1 and "model too small" in p.warnings[0] and f"{ops:,.0f} operators" in p.warnings[0]
    big = ModelConfig(layers=32, hidden=4096, heads=32, vocab=32000, seq_len=4096)
    assert run(workload(moe=None, layout=ParallelDims(1), model=big)).warnings == ()


def test_on_a_cpu_the_floor_runs_in_line_with_the_compute():
    cpu = load_system("workloads/systems/cpu-gloo.toml")
    w = workload(moe=None, layout=ParallelDims(1), impl=Implementation.BENCHSUITE, compute_bytes=4)
    p = run(w, cpu)
    assert p.seconds("host_floor") == pytest.approx((4 * 92 + 50) * cpu.node.op_floor_us * 1e-6)


def test_fp8_runs_the_weight_matmuls_at_the_fp8_rate_and_pays_its_casts():
    """Dense, one device: compute.matmul scales by the two rates; casts = 3·(rows·Σ(K + N) + Ψ)/B."""
    w = workload(moe=None, layout=ParallelDims(1))
    bf16, fp8 = run(w), run(dataclasses.replace(w, fp8=True))
    assert fp8.seconds("compute.matmul") == pytest.approx(bf16.seconds("compute.matmul") * 660 / 1320)
    assert fp8.seconds("compute.attention") == bf16.seconds("compute.attention")
    h, f = 512, 1024
    per_row = 4 * ((h + 3 * h) + (h + h) + (h + 2 * f) + (f + h))
    assert fp8.seconds("fp8_casts") == pytest.approx(3 * (512 * per_row + params_per_device(w)) / B)
    assert bf16.seconds("fp8_casts") == 0.0


def test_zero3_gathers_the_fp32_parameters_the_harness_gathers():
    """A bf16 benchsuite ZeRO-3 run: FSDP2 has no MixedPrecisionPolicy here, so its gathers move 4 bytes a
    parameter (the predictor assumed 2)."""
    w = workload(moe=None, layout=ParallelDims.from_degrees(dp=4, zero=3), impl=Implementation.BENCHSUITE)
    psi = params_per_device(w)
    calls = data_parallel_collectives(psi, stage=3, grad_accum=1, grad_bytes=4, gather_bytes=4, units=4 + 2)
    assert run(w).dp_bytes_per_step == pytest.approx(sum(ring_bytes(c.kind, c.payload, 4) * c.calls for c in calls))


SUITE = """[suite]
name = "dm"
[defaults]
model = { layers = 8, hidden = 2048, heads = 16, vocab = 32000, seq_len = 2048 }
train = { micro_batch = 4, precision = "bf16" }
[[workload]]
name = "dense"
sweep = { world_size = [4] }
[[workload]]
name = "moe"
kind = "moe"
moe = { experts = 8, router = "token_choice", top_k = 2, capacity_factor = 0, every = 2 }
parallel = { expert = 4 }
sweep = { world_size = [4] }
"""


def test_predict_prints_each_moe_run_over_its_dense_partner(tmp_path, capsys):
    """Time, energy and CO2e to the same tokens, each ratio within its range and with the input that moves it
    most; --expert-load replaces the assumption in every MoE prediction."""
    suite = tmp_path / "s.toml"
    suite.write_text(SUITE)
    assert main(["predict", str(suite), "--system", H100, "--tokens", "1e9", "--expert-load", "1.4", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    dense, moe = doc["runs"]
    (pair,) = doc["dense_vs_moe"]
    assert (pair["moe"], pair["dense"]) == (moe["run"], dense["run"])
    assert pair["time"]["value"] == pytest.approx(moe["energy"]["run_s"] / dense["energy"]["run_s"])
    assert pair["energy"]["value"] == pytest.approx(moe["energy"]["run_energy_j"] / dense["energy"]["run_energy_j"])
    for what in ("time", "energy", "co2e"):
        r = pair[what]
        assert r["low"] <= r["value"] <= r["high"] and r["dominant"]
    assert moe["expert_load"].startswith("1.4 (recorded (--expert-load))")
    assert main(["predict", str(suite), "--system", H100, "--tokens", "1e9"]) == 0
    text = capsys.readouterr().out
    assert "Dense vs MoE" in text and "dominated by" in text
    assert main(["predict", str(suite), "--system", "workloads/systems/a100-8x.toml", "--precision", "fp8"]) == 2
    assert "device.fp8_matmul_tflops" in capsys.readouterr().err


def test_a_system_file_without_the_new_keys_still_loads(tmp_path):
    """[experts], op_floor_us, ep_overlap and the FP8 rates are optional: a user's older file predicts as
    before (no floor, the all-to-all exposed, r = 1)."""
    text = open(H100).read()
    old = "\n".join(line for line in text.splitlines()
                    if not line.startswith(("op_floor_us", "ep_overlap", "fp8_", "load_max_over_mean", "[experts]")))
    path = tmp_path / "old.toml"
    path.write_text(old)
    s = load_system(path)
    assert s.node.op_floor_us == 0.0 and s.experts.load_max_over_mean == 1.0 and s.device.fp8_matmul_tflops is None
    assert math.isfinite(run(workload(), s).step_s)
    s2 = dataclasses.replace(s, node=msgspec.structs.replace(s.node, ep_overlap=1.0))
    assert run(workload(), s2).seconds("expert_parallel") == 0.0
