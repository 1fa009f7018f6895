"""Memory model: ZeRO formulas against the paper's example, fp32 constants, activation estimate,
the `benchsuite memory` verb, and one real run whose record carries measured vs analytic state."""

from __future__ import annotations

import json

import pytest

from benchsuite.config import ModelConfig
from benchsuite.layout import ZERO_WRAPPERS, DataParallel, ParallelDims
from benchsuite.metrics import memory as mem
from helpers import run_cli, write_suite


def test_paper_example_7_5b_params_64_ranks():
    """Rajbhandari et al. 2019, Figure 1: Ψ = 7.5 B, N = 64, K = 12."""
    got = [round(r["total"] / 1e9, 1) for r in mem.stage_table(7.5e9, 64)]
    assert got == [120.0, 31.4, 16.6, 1.9]
    ddp = mem.zero_model_state(7.5e9, 64, 0)
    assert (ddp["params"], ddp["grads"], ddp["optimizer"]) == (15e9, 15e9, 90e9)
    assert [mem.zero_formula(s) for s in range(4)] == ["(2+2+K)Ψ", "4Ψ + KΨ/N", "2Ψ + (2+K)Ψ/N", "(2+2+K)Ψ/N"]


def test_fp32_constants_and_implementation_formulas():
    psi, n = 1000.0, 4
    fp32 = [mem.zero_model_state(psi, n, s, mem.FP32)["total"] for s in range(4)]
    assert fp32 == [16 * psi, 8 * psi + 8 * psi / n, 4 * psi + 12 * psi / n, 16 * psi / n]
    assert mem.zero_formula(0, mem.FP32) == "(4+4+8)Ψ"
    impl = [mem.implementation_model_state(psi, n, wrapper, "fp32")["total"] for wrapper in ZERO_WRAPPERS]
    # torch allocates the paper's fp32 figure except FSDP2 stage 2, which keeps its fp32 shard
    # beside the gathered parameters: + 4Ψ/N.
    assert impl[0] == fp32[0] and impl[1] == fp32[1] and impl[3] == fp32[3]
    assert impl[2] == fp32[2] + 4 * psi / n
    bf16 = mem.implementation_model_state(psi, n, DataParallel.FSDP_STAGE2, "bf16")
    assert bf16["params"] == 2 * psi + 4 * psi / n and bf16["grads"] == 4 * psi / n
    with pytest.raises(ValueError):
        mem.zero_model_state(psi, 0, 1)
    with pytest.raises(ValueError):
        mem.zero_model_state(psi, 2, 4)


def test_params_per_rank_splits_tensor_parallel_weights():
    from benchsuite.metrics.flops import param_counts

    cfg = ModelConfig(layers=2, hidden=32, heads=4, vocab=64, seq_len=16, ffn_hidden=64)
    total = param_counts(cfg).total
    assert mem.params_per_rank(cfg, tp=1) == total
    replicated = 16 * 32 + 2 * 4 * 32 + 2 * 32  # position embedding and LayerNorms
    assert mem.params_per_rank(cfg, tp=2) == replicated + (total - replicated) // 2


def test_activation_estimate_korthikanti():
    s, b, h, a, L, v = 2048, 1, 12288, 96, 1, 51200  # GPT-3 175B layer, Korthikanti et al. Table 2 setting
    none = mem.activation_bytes(s, b, h, a, L, v)
    assert none["per_layer_bytes"] == s * b * h * (34 + 5 * a * s / h)
    t8 = mem.activation_bytes(s, b, h, a, L, v, tp=8)
    assert t8["per_layer_bytes"] == pytest.approx(s * b * h * (10 + 24 / 8 + 5 * a * s / (h * 8)))
    assert mem.activation_bytes(s, b, h, a, L, v, recompute="full")["per_layer_bytes"] == 2 * s * b * h
    assert mem.activation_bytes(s, b, h, a, L, v, recompute="selective")["per_layer_bytes"] == 34 * s * b * h
    with pytest.raises(ValueError):
        mem.activation_bytes(s, b, h, a, L, v, recompute="some")


@pytest.mark.procs
def test_memory_cli_json_paper_example():
    p = run_cli("memory", "--params", "7.5e9", "--dp", "64", "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)  # stdout is exactly one JSON document
    assert [round(r["total"] / 1e9, 1) for r in doc["stages"]] == [120.0, 31.4, 16.6, 1.9]
    assert doc["K"] == 12 and doc["dp"] == 64 and doc["precision"] == "mixed"


def test_memory_cli_from_suite_and_errors(tmp_path):
    from benchsuite.cli import main

    suite = write_suite(tmp_path / "s.toml", """
        [defaults]
        model = { layers = 2, hidden = 32, heads = 4, vocab = 64, seq_len = 16 }
        [[workload]]
        name = "z"
        parallel = { zero = 3 }
        [sweep]
        world_size = [2, 4]
    """)
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["memory", str(suite), "--precision", "fp32", "--json"]) == 0
    doc = json.loads(buf.getvalue())
    assert [r["dp"] for r in doc["runs"]] == [2, 4]
    psi = doc["runs"][0]["params"]
    assert doc["runs"][1]["stages"][3]["total"] == pytest.approx(16 * psi / 4)
    assert doc["runs"][0]["activation_bytes_per_micro_batch"]["full"] > 0
    assert main(["memory", "--params", "1e9"]) == 2  # --dp needed
    assert main(["memory"]) == 2


def _memory_json(*argv) -> dict:
    import contextlib
    import io

    from benchsuite.cli import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["memory", *map(str, argv), "--json"]) == 0
    return json.loads(buf.getvalue())


def test_memory_cli_uses_each_runs_precision(tmp_path, monkeypatch):
    """fp32 runs get (4+4+8)Ψ, bf16 runs the paper's K = 12, "auto" fp32 without a GPU; --precision overrides."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    suite = write_suite(tmp_path / "s.toml", """
        [defaults]
        model = { layers = 2, hidden = 32, heads = 4, vocab = 64, seq_len = 16 }
        parallel = { zero = 1 }
        [[workload]]
        name = "fp32"
        train = { precision = "fp32" }
        [[workload]]
        name = "bf16"
        train = { precision = "bf16" }
        [[workload]]
        name = "auto"
        [sweep]
        world_size = [2]
    """)
    runs = {r["workload"]: r for r in _memory_json(suite)["runs"]}
    psi = runs["fp32"]["params_per_rank"]
    assert [runs[w]["precision"] for w in ("fp32", "bf16", "auto")] == ["fp32", "bf16", "fp32"]
    assert [runs[w]["K"] for w in ("fp32", "bf16", "auto")] == [8, 12, 8]
    assert runs["fp32"]["stages"][1]["total"] == 8 * psi + 8 * psi / 2  # ZeRO-1, fp32 constants
    assert runs["bf16"]["stages"][1]["total"] == 4 * psi + 12 * psi / 2  # the paper's mixed precision
    assert runs["fp32"]["formulas"]["DDP"] == "(4+4+8)Ψ"
    # the figure each record will hold: torch's ZeRO-1 keeps fp32 states whatever the precision
    for w in ("fp32", "bf16"):
        assert runs[w]["record_model_state"]["analytic"]["total"] == 8 * psi + 8 * psi / 2
        assert runs[w]["record_model_state"]["paper"]["total"] == runs[w]["stages"][1]["total"]
    forced = {r["workload"]: r for r in _memory_json(suite, "--precision", "mixed")["runs"]}
    assert {r["K"] for r in forced.values()} == {12}


@pytest.mark.procs
def test_run_record_carries_measured_and_analytic_state(tmp_path):
    """One real 2-rank ZeRO-2 run: the record's memory and comm sections, and the report column."""
    suite = write_suite(tmp_path / "z.toml", """
        [suite]
        name = "z"
        [defaults]
        model = { layers = 2, hidden = 32, heads = 2, vocab = 128, seq_len = 16 }
        train = { micro_batch = 2, steps = 2, warmup_steps = 2, timeout_s = 120 }
        [[workload]]
        name = "zero2"
        parallel = { zero = 2 }
        [sweep]
        world_size = [2]
    """)
    out = tmp_path / "out"
    p = run_cli("run", str(suite), "--out", str(out))
    assert p.returncode == 0, p.stderr
    rec = json.loads(next(out.glob("*.json")).read_text())
    ms = rec["metrics"]["memory"]["model_state_bytes"]
    assert "FSDP2" in rec["metrics"]["implementation"]["data"]
    assert ms["formula"].startswith("ZeRO-2 (fp32): 4Ψ + (4+4+8)Ψ/N") and ms["N"] == 2
    told = _memory_json(suite)["runs"][0]  # the verb says what the record holds
    assert told["record_model_state"]["analytic"] == ms["analytic"]
    assert told["record_model_state"]["formula"] == ms["formula"] and told["K"] == ms["paper"]["K"] == 8
    assert abs(ms["ratio"] - 1) <= 0.05
    assert ms["measured"]["total"] == max(ms["measured_per_rank_total"])
    assert rec["metrics"]["memory"]["activation_estimate_bytes"]["none"] > 0
    comm = rec["metrics"]["comm"]
    assert set(comm["bytes_per_step_by_kind"]) >= {"all_gather", "reduce_scatter"}
    assert comm["total_bytes_per_step"] == pytest.approx(sum(comm["bytes_per_step_by_kind"].values()))
    assert 0.95 <= comm["ratio"] <= 1.05
    report = run_cli("report", str(out), env={"COLUMNS": "250"})
    assert report.returncode == 0, report.stderr
    mib = f"{ms['measured']['total'] / 2**20:.2f} / {ms['analytic']['total'] / 2**20:.2f}"
    assert mib in report.stdout
    rows = json.loads(run_cli("report", str(out), "--json").stdout)["runs"]
    assert rows[0]["metrics.memory.model_state_bytes.measured.total"] == ms["measured"]["total"]


def test_model_state_record_reads_the_applied_precision_not_the_wrapper_name():
    """The gathered-parameter bytes of ZeRO-2 follow Applied.precision.forward_params: a wrapper name
    that mentions a MixedPrecisionPolicy changes nothing, a bf16 forward_params halves the gathered copy."""
    from dataclasses import replace

    import msgspec

    from benchsuite.parallel import Applied
    from benchsuite.parallel.zero import precision_policy

    cfg = ModelConfig(layers=2, hidden=32, heads=2, vocab=128, seq_len=16)
    dims = ParallelDims(world=4, zero=2)
    psi = mem.params_per_rank(cfg)
    named = Applied(zero_stage=2, precision=precision_policy("bf16"), data="FSDP2 + MixedPrecisionPolicy(bf16)")
    gathers_bf16 = replace(named, precision=msgspec.structs.replace(named.precision, forward_params="bf16"),
                           data="FSDP2")
    for applied, gathered in ((named, 4), (gathers_bf16, 2)):
        out = mem.model_state_record([None], model=cfg, moe=None, dims=dims, applied=applied)
        assert out["analytic"]["params"] == gathered * psi + 4 * psi / 4
        assert out["formula"] == f"ZeRO-2 (bf16): {gathered}Ψ + (4+4+8)Ψ/N" and out["K"] == 8
        assert out["paper"]["K"] == 12 and out["measured"] is None and out["ratio"] is None
