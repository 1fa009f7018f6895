"""Pipeline parallelism on real gloo processes against the single-process model.

One spawn at world 4 checks every layout in turn: PP 2 × DP 2 (1F1B, interleaved, GPipe, and 1F1B
with activation checkpointing), PP 4 (1F1B, interleaved) and PP 2 × TP 2, the last also with a
Llama-style model (RMSNorm, RoPE on every stage and no position table on the first, grouped-query
attention: 4 query heads, 2 key/value heads, SwiGLU), once more interleaved with sequence parallelism
(the stages send their sequence shards, and a stage's rotary tables span the whole sequence). Each builds the plain
model with the same seed, parallelizes it with benchsuite.parallel.parallelize and trains it with the worker's own train_step, beside a
single-process reference trained on the concatenated global batch. Checked (fp32, relative error
≤ 1e-5): the last stage's logits, the loss every rank reports, every gradient after the first
backward and every weight after 3 AdamW steps (each rank its own stages; together, every
parameter), and the point-to-point bytes the stages send against the formula.
"""

from __future__ import annotations

import json
import re
from msgspec.structs import replace

import pytest
import torch
import torch.nn.functional as F

from benchsuite.config import (CarbonConfig, ConfigError, EnergyConfig, ModelConfig, ParallelConfig, RunConfig,
                               TrainConfig, parse_suite)
from benchsuite.dist import shutdown
from helpers import run_cli, spawn_gather, write_suite

CFG = ModelConfig(layers=8, hidden=16, heads=2, vocab=32, seq_len=8, ffn_hidden=32)
LLAMA = replace(CFG, heads=4, kv_heads=2, activation="swiglu", norm="rmsnorm", position="rope")
MB, STEPS, TOL, WORLD = 4, 3, 1e-5, 4

# name: (pipeline, tensor, schedule, virtual_stages, microbatches[, recompute[, model[, sequence_parallel]]])
CASES = {
    "pp2_1f1b": (2, 1, "1f1b", 1, 2),
    "pp2_interleaved": (2, 1, "interleaved", 2, 4),
    "pp2_gpipe": (2, 1, "gpipe", 1, 4),
    "pp4_1f1b": (4, 1, "1f1b", 1, 4),
    "pp4_interleaved": (4, 1, "interleaved", 2, 4),
    "pp2xtp2": (2, 2, "1f1b", 1, 2),
    "pp2_recompute": (2, 1, "1f1b", 1, 4, "full"),
    "pp2xtp2_llama": (2, 2, "1f1b", 1, 2, "none", LLAMA),
    "pp2xtp2_sp_llama": (2, 2, "interleaved", 2, 2, "none", LLAMA, True),
}


def make_run(pp: int, tp: int, schedule: str, virtual: int, microbatches: int, recompute: str = "none",
             model: ModelConfig = CFG, sequence_parallel: bool = False) -> RunConfig:
    return RunConfig(suite="t", workload="w", kind="dense", model=model,
                     train=TrainConfig(micro_batch=MB, steps=STEPS, precision="fp32", recompute=recompute),
                     parallel=ParallelConfig(tensor=tp, pipeline=pp, schedule=schedule, virtual_stages=virtual,
                                             microbatches=microbatches, sequence_parallel=sequence_parallel),
                     energy=EnergyConfig(), carbon=CarbonConfig(), world_size=WORLD)


def section_of(run: RunConfig, figs: list[dict]) -> dict:
    """metrics.pipeline of `run` from the ranks' figures, given the sections assembly/harness.py passes."""
    from benchsuite.parallel.pipeline import pipeline_section

    return pipeline_section(figs, parallel=run.parallel, model=run.model, train=run.train,
                            micro_batch=run.micro_batch_per_rank, data_parallel=run.data_parallel)


def p2p_formula_of(run: RunConfig) -> int:
    from benchsuite.parallel.pipeline import p2p_bytes_formula

    return p2p_bytes_formula(parallel=run.parallel, model=run.model, micro_batch=run.micro_batch_per_rank)


def global_batch(step: int, dp: int):
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randint(0, CFG.vocab, (dp * MB, CFG.seq_len), generator=g)
    y = torch.randint(0, CFG.vocab, (dp * MB, CFG.seq_len), generator=g)
    return x, y


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach().float() - b.detach().float()).norm() / b.detach().float().norm().clamp_min(1e-30))


def full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def stage_params(par) -> dict:
    """{name in the full model: parameter} of this rank's stages (unwrapping DDP)."""
    out = {}
    for part in par.model:
        stage = getattr(part, "module", part)
        for n, p in stage.named_parameters():
            out[stage.full_name(re.sub(r"(^|\.)_checkpoint_wrapped_module\.", r"\1", n))] = p
    return out


class GradCapture:
    def __init__(self, par):
        self.par, self.grads = par, None

    def after_backward(self):
        self.grads = {n: full(p.grad).clone() for n, p in stage_params(self.par).items()}

    def after_step(self):
        pass


def make_ctx(rank: int, run: RunConfig):
    from benchsuite.dist import DistContext
    from benchsuite.layout import ParallelDims

    dims = ParallelDims.from_run(run).build_meshes("cpu")
    return DistContext(rank, rank, WORLD, 0, torch.device("cpu"), "gloo", dims)


def train_and_compare(run: RunConfig, ctx) -> dict:
    from benchsuite.models.transformer import build_model
    from benchsuite.parallel import parallelize
    from benchsuite.parallel.pipeline import PipelinePlan
    from benchsuite.parallel.zero import make_adamw
    from benchsuite.worker import train_step

    dp, cpu = ctx.dims.dp, torch.device("cpu")
    ref = build_model(run.model, seed=0)
    ref_opt = make_adamw(ref.parameters(), run.train)
    par = parallelize(build_model(run.model, seed=0), dims=ctx.dims, train=run.train, moe=run.moe, device=ctx.device,
                      pipeline=PipelinePlan.from_run(run))
    par.pipeline.keep_outputs = True
    sl = slice(ctx.dp_rank * MB, (ctx.dp_rank + 1) * MB)
    out = {"impl": par.applied.implementation(), "names": sorted(stage_params(par)), "logits": None}
    grad_err = 0.0
    for step in range(STEPS):
        x, y = global_batch(step, dp)
        probe = GradCapture(par) if step == 0 else None
        loss = train_step(par, [(x[sl], y[sl])], "fp32", cpu, probe=probe).loss
        ref_logits = ref(x).logits
        if step == 0:
            if par.pipeline.has_last:
                out["logits"] = rel(full(par.pipeline.last_outputs), ref_logits[sl])
            ref_local = F.cross_entropy(ref_logits[sl].flatten(0, 1), y[sl].flatten())
            out["loss"] = abs(float(loss) - float(ref_local.detach())) / float(ref_local.detach())
        F.cross_entropy(ref_logits.flatten(0, 1), y.flatten()).backward()
        if step == 0:
            ref_grads = {n: p.grad for n, p in ref.named_parameters()}
            grad_err = max(rel(g, ref_grads[n]) for n, g in probe.grads.items())
        ref_opt.step()
        ref_opt.zero_grad(set_to_none=True)
    ref_params = dict(ref.named_parameters())
    out["params"] = max(rel(full(p), ref_params[n]) for n, p in stage_params(par).items())
    out["numel"] = sum((p.to_local() if hasattr(p, "to_local") else p).numel() for p in stage_params(par).values())
    out["grads"] = grad_err
    out["figures"] = par.pipeline.figures()
    return out


def _rank(rank: int, world: int) -> dict:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    results = {}
    for name, spec in CASES.items():
        run = make_run(*spec)
        results[name] = train_and_compare(run, make_ctx(rank, run))
    shutdown()
    return results


@pytest.mark.procs
def test_pipeline_matches_single_process():
    from benchsuite.metrics.memory import params_per_pipeline_rank
    from benchsuite.models.transformer import build_model
    ranks = spawn_gather(_rank, WORLD)
    for name, spec in CASES.items():
        run = make_run(*spec)
        all_names = {n for n, _ in build_model(run.model).named_parameters()}
        for rank, results in enumerate(ranks):
            r, where = results[name], f"{name} rank {rank}"
            assert "pipeline" in r["impl"] and ("tensor" in r["impl"]) == (spec[1] > 1), where
            assert ("recompute" in r["impl"]) == (run.train.recompute == "full"), where
            assert r["loss"] <= TOL, f"{where}: loss rel err {r['loss']:.2e}"
            assert r["grads"] <= TOL, f"{where}: grad rel err {r['grads']:.2e}"
            assert r["params"] <= TOL, f"{where}: params after {STEPS} steps rel err {r['params']:.2e}"
            if r["logits"] is not None:
                assert r["logits"] <= TOL, f"{where}: logits rel err {r['logits']:.2e}"
        assert any(res[name]["logits"] is not None for res in ranks), f"{name}: no rank holds the last stage"
        assert set().union(*(res[name]["names"] for res in ranks)) == all_names, f"{name}: a parameter is lost"
        # metrics.memory's and metrics.comm's Ψ of a pipeline rank (its tensor-parallel share): the one holding most
        assert max(res[name]["numel"] for res in ranks) == \
            params_per_pipeline_rank(run.model, spec[0], spec[3], spec[1]), name
        figs = [res[name]["figures"] for res in ranks]
        expected_stages = sorted(range(spec[0] * spec[3]))
        assert sorted({s for f in figs for s in f["stages"]}) == expected_stages, name
        section = section_of(run, figs)
        assert section["p2p_bytes_per_step"] == p2p_formula_of(run), f"{name}: p2p bytes {section}"
        assert section["bubble_measured"] is not None and section["bubble_measured"] > 0, name
        assert section["bubble_formula"] == (spec[0] - 1) / (spec[3] * spec[4])


def test_p2p_formula_and_bubble_formula_values():
    from benchsuite.parallel.pipeline import bubble_formula, p2p_bytes_formula, rank_bubble

    run = make_run(4, 1, "interleaved", 2, 4)  # 7 boundaries, 4 microbatches of 1 sequence, fwd + bwd
    assert p2p_formula_of(run) == 2 * 7 * 4 * 1 * CFG.seq_len * CFG.hidden * 4
    # the sections alone, keyword-only: 8 sequences per rank make microbatches of 2
    assert p2p_bytes_formula(parallel=run.parallel, model=CFG, micro_batch=8) \
        == 2 * 7 * 4 * 2 * CFG.seq_len * CFG.hidden * 4
    with pytest.raises(TypeError):
        p2p_bytes_formula(run)  # a whole RunConfig is not what it takes
    assert bubble_formula(4, 2, 8) == 3 / 16
    # wall 3 s with 2 s of compute: 0.5 of idle over compute; the median over the measured steps only
    assert rank_bubble({"wall_s": [100.0, 3.0, 3.0, 6.0], "busy_s": [1.0, 2.0, 2.0, 2.0]}, 3) == 0.5


# ------------------------------------------------------------------ validation before launch

def _suite(parallel: dict, model: dict | None = None, train: dict | None = None, kind: str = "dense",
           world: int = 4) -> dict:
    base = dict(layers=4, hidden=32, heads=4, vocab=64, seq_len=16)
    workload = {"name": "w", "kind": kind, "parallel": parallel, "train": {"micro_batch": 8, **(train or {})}}
    return {"defaults": {"model": {**base, **(model or {})}}, "workload": [workload],
            "sweep": {"world_size": [world]}}


@pytest.mark.parametrize("parallel,model,train,kind,world,key,needle", [
    ({"pipeline": 2, "virtual_stages": 3, "schedule": "interleaved"}, None, None, "dense", 4, "parallel.pipeline",
     "exceeds model.layers (4)"),
    ({"pipeline": 2, "first_stage_layers": 4}, None, None, "dense", 4, "parallel.first_stage_layers",
     "one block at least each"),
    ({"pipeline": 4, "first_stage_layers": 1, "microbatches": 4}, {"layers": 6}, None, "dense", 4,
     "parallel.first_stage_layers", "split them equally"),
    ({"pipeline": 2, "expert": 2, "zero": 1}, None, None, "moe", 4, "parallel.zero", "set zero = 0"),
    ({"pipeline": 4, "microbatches": 2}, None, None, "dense", 4, "parallel.microbatches", "microbatches >= pipeline"),
    ({"pipeline": 2, "zero": 1}, None, None, "dense", 4, "parallel.zero", "zero = 2 or 3 (FSDP2 shards each stage)"),
    ({"pipeline": 2}, None, {"grad_accum": 2}, "dense", 4, "train.grad_accum", "set grad_accum = 1"),
    ({"pipeline": 2}, None, {"compile": True, "warmup_steps": 3}, "dense", 4, "train.compile", "compile = false"),
    ({"pipeline": 2, "tensor": 2}, None, None, "dense", 6, "parallel.pipeline", "divisible by tensor × pipeline"),
    ({"pipeline": 2, "microbatches": 3}, None, None, "dense", 4, "parallel.microbatches", "must divide evenly"),
    ({"pipeline": 2, "virtual_stages": 2}, None, None, "dense", 4, "parallel.virtual_stages",
     "needs schedule = \"interleaved\""),
])
def test_impossible_pipeline_layouts_are_rejected_before_launch(parallel, model, train, kind, world, key, needle):
    with pytest.raises(ConfigError) as e:
        parse_suite(_suite(parallel, model, train, kind, world))
    assert key in str(e.value) and needle in str(e.value), str(e.value)


def test_valid_pipeline_layouts_pass_with_default_microbatches():
    suite = parse_suite(_suite({"pipeline": 2, "tensor": 2}))
    assert [r.data_parallel for r in suite.runs] == [1]
    assert suite.runs[0].parallel.n_microbatches == 4  # 2 × pipeline, dividing micro_batch 8


def test_moe_tied_and_uneven_pipelines_pass():
    """MoE and expert parallelism on stages, a tied LM head and a layer count no stage count divides run now."""
    for parallel, model, kind in (({"pipeline": 2, "expert": 2}, None, "moe"), ({"pipeline": 2}, None, "moe"),
                                  ({"pipeline": 2}, {"tie_embeddings": True}, "dense"),
                                  ({"pipeline": 2, "virtual_stages": 2, "schedule": "interleaved"}, {"layers": 5},
                                   "dense"),
                                  ({"pipeline": 2, "first_stage_layers": 1}, None, "dense"),
                                  ({"pipeline": 4, "first_stage_layers": 1, "last_stage_layers": 1}, {"layers": 6},
                                   "dense")):
        assert len(parse_suite(_suite(parallel, model, kind=kind)).runs) == 1, parallel


@pytest.mark.procs
def test_bad_pipeline_input_exits_2_naming_key_and_fix(tmp_path):
    path = write_suite(tmp_path / "pp.toml", """
        [[workload]]
        name = "a"
        model = { layers = 3 }
        parallel = { pipeline = 2, last_stage_layers = 3 }
        [sweep]
        world_size = [2]
        """)
    res = run_cli("run", str(path), "--out", str(tmp_path / "out"))
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "workload[0] (a).parallel.last_stage_layers" in res.stderr and "one block at least" in res.stderr
    assert not (tmp_path / "out").exists()


def test_report_pipeline_table_shows_bubble_measured_and_formula(tmp_path):
    from rich.console import Console

    from benchsuite.results.report import section_tables
    from benchsuite.results.model import results_at
    from helpers import REPO

    rec = json.loads((REPO / "tests/fixtures/results/make_dvs-dense-w4.json").read_text())
    run = make_run(2, 1, "interleaved", 2, 4)
    fig = {"stages": [0, 2], "wall_s": [1.5] * STEPS, "busy_s": [1.0] * STEPS, "sent_bytes": [1000] * STEPS}
    rec["metrics"]["pipeline"] = section_of(run, [fig] * WORLD)
    (tmp_path / "r.json").write_text(json.dumps(rec))
    console = Console(record=True, width=300)
    for table in section_tables(results_at(tmp_path)):
        console.print(table)
    text = console.export_text()
    row = next(line for line in text.splitlines() if "interleaved" in line)
    assert "0.500" in row and "0.125" in row  # measured (1.5 - 1) / 1 beside (2 - 1) / (2 · 4)
    assert f"{4 * 1000 // run.data_parallel:,}" in row and f"{p2p_formula_of(run):,}" in row


def test_run_page_shows_bubble_measured_beside_formula(tmp_path):
    from helpers import REPO
    from benchsuite.dashboard.build import build_site

    rec = json.loads((REPO / "tests/fixtures/results/make_dvs-dense-w4.json").read_text())
    run = make_run(2, 1, "interleaved", 2, 4)
    fig = {"stages": [0, 2], "wall_s": [1.5] * STEPS, "busy_s": [1.0] * STEPS, "sent_bytes": [1000] * STEPS}
    rec["metrics"]["pipeline"] = section_of(run, [fig] * WORLD)
    res = build_site([rec], tmp_path)
    page = (tmp_path / res.pages[1]).read_text(encoding="utf-8")
    assert "<h3>Pipeline</h3>" in page
    assert "bubble measured</th><td>50.0%<" in page and "bubble formula (P−1)/(V·M)</th><td>12.5%<" in page
