"""torch.compile on CPU, as the worker applies it: every block kind compiles whole and stays compiled.

Each case builds a tiny model of one block kind (dense, switch, gshard, expert choice; with and
without full recompute; a Llama-style dense block), parallelizes it with
benchsuite.parallel.parallelize (checkpoint, then one compiled region per block) and trains the
worker's unmeasured steps and then measured steps.
The compiler backend is dynamo's counting backend over aot_eager (forward and backward graphs
traced, no C++ build): graph breaks and recompiles are decided by dynamo, before any backend.
Checked: no graph break at all, one compiled frame per distinct block (dense 1, MoE models 2),
and no frame compiled during the measured steps. With expert parallel, the all-to-all share is
timed over a step that compiles nothing (its synchronised timers recompile the blocks once).
"""

from __future__ import annotations

import types

import msgspec
import pytest
import torch
import torch.distributed as dist

from benchsuite.config import (CarbonConfig, EnergyConfig, ModelConfig, MoEConfig, ParallelConfig, RunConfig,
                               TrainConfig)
from benchsuite.dist import DistContext, ParallelDims
from benchsuite.models.transformer import build_model
from benchsuite.parallel import Parallelized, apply_compile, parallelize
from benchsuite.parallel.zero import make_adamw
from benchsuite import worker
from helpers import grouped_mm_runs_here

pytestmark = pytest.mark.heavy  # dynamo traces twelve models: about 25 s, so `make test` only

CPU = torch.device("cpu")
MEASURED = 2


def make_run(router: str | None, recompute: str) -> RunConfig:
    moe = MoEConfig(experts=4, router=router, every=2, z_loss_coef=0.0) if router else None
    return RunConfig(suite="t", workload="w", kind="moe" if router else "dense",
                     model=ModelConfig(layers=2, hidden=32, heads=2, vocab=64, seq_len=16, ffn_hidden=64),
                     train=TrainConfig(micro_batch=2, steps=MEASURED, precision="fp32", compile=True,
                                       recompute=recompute),
                     parallel=ParallelConfig(), moe=moe, energy=EnergyConfig(), carbon=CarbonConfig(), world_size=1)


def batch(step: int, run: RunConfig):
    g = torch.Generator().manual_seed(step)
    x = torch.randint(0, run.model.vocab, (run.train.micro_batch, run.model.seq_len), generator=g)
    return [(x, torch.roll(x, -1, 1))]


@pytest.fixture
def backend(monkeypatch):
    """Every Module.compile() of this test counts its frames on aot_eager."""
    from torch._dynamo.testing import CompileCounterWithBackend  # here: importing dynamo costs seconds

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    counting = CompileCounterWithBackend("aot_eager")
    compile_module = torch.nn.Module.compile
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, **kw: compile_module(self, backend=counting))
    yield counting
    torch._dynamo.reset()


def compile_and_train(run: RunConfig, backend, precision: str = "fp32", expert_impl: str | None = None):
    """parallelize (checkpoint, then one compiled region per block), the unmeasured steps, then the
    measured ones; (frames compiled by the unmeasured steps, the last step's result). expert_impl:
    the expert path every MoE layer runs instead of the one parallelize picked for the CPU."""
    from benchsuite.models.moe import set_expert_impl

    ctx = DistContext(0, 0, 1, 0, CPU, None, ParallelDims(1))
    par = parallelize(build_model(run.model, run.moe, seed=0), dims=ctx.dims, train=run.train, moe=run.moe,
                      device=ctx.device)
    assert par.applied.implementation()["compile"] == "torch.compile per block"
    if expert_impl:
        set_expert_impl(par.model, expert_impl)  # before the first forward: the blocks trace it
    warm = worker.unmeasured_steps(run)
    for step in range(warm):
        worker.train_step(par, batch(step, run), precision, CPU)
    compiled = backend.frame_count
    for step in range(warm, warm + MEASURED):
        result = worker.train_step(par, batch(step, run), precision, CPU)
    breaks = dict(torch._dynamo.utils.counters["graph_break"])
    assert breaks == {}, f"graph breaks: {breaks}"
    assert backend.frame_count == compiled, "a measured step recompiled"
    return compiled, result


@pytest.mark.parametrize("recompute", ["none", "full"])
@pytest.mark.parametrize("router", [None, "switch", "gshard", "expert_choice"])
def test_every_block_kind_compiles_without_break_or_recompile(router, recompute, backend):
    compiled, result = compile_and_train(make_run(router, recompute), backend)
    assert compiled == (2 if router else 1), f"{compiled} frames compiled for {2 if router else 1} block kinds"
    assert len(result.routing) == (1 if router else 0)  # the MoE block's routing stats came out of the graph


def test_llama_style_block_compiles_without_break_or_recompile(backend):
    """RMSNorm, rotary tables passed into each block, grouped-query attention (SDPA's enable_gqa),
    per-head query/key norm and SwiGLU, under full recompute: one graph for both blocks."""
    run = make_run(None, "full")
    llama = msgspec.structs.replace(run.model, heads=4, kv_heads=2, activation="swiglu", norm="rmsnorm", position="rope",
                                qk_norm="per_head")
    compiled, _ = compile_and_train(msgspec.structs.replace(run, model=llama), backend)
    assert compiled == 1, f"{compiled} frames compiled for one block kind"


@pytest.mark.skipif(not grouped_mm_runs_here(), reason="torch._grouped_mm has no kernel on this device")
@pytest.mark.parametrize("recompute", ["none", "full"])
def test_dropless_block_on_grouped_mm_compiles_without_break_or_recompile(recompute, backend):
    """The H200's dropless path: sorted rows into torch._grouped_mm (bf16; its shape check needs bf16
    even where the CPU kernel takes fp32), top-2 of 8 fine-grained experts plus a shared one. The
    split sizes stay on the device, so the block is one graph (loop_mm's host read is a break by design)."""
    run = make_run("token_choice", recompute)
    run = msgspec.structs.replace(run, moe=MoEConfig(experts=8, router="token_choice", top_k=2, capacity_factor=0,
                                                 every=2, shared_experts=1, expert_hidden=16, z_loss_coef=0.0))
    compiled, result = compile_and_train(run, backend, "bf16", expert_impl="grouped_mm")
    assert compiled == 2 and len(result.routing) == 1
    assert result.routing[0].dropped_frac == 0


def test_all_to_all_share_is_timed_over_a_step_that_compiles_nothing(backend, monkeypatch, tmp_path):
    """The share's step switches the synchronised collective timers on, which recompiles the
    blocks (graph breaks around the timed collectives): that must not land in the timed interval."""
    from benchsuite.parallel.expert import apply_expert_parallel

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        run = make_run("switch", "none")
        model = build_model(run.model, run.moe, seed=0)
        apply_expert_parallel(model)
        apply_compile(model)
        par = Parallelized(model, make_adamw(model.parameters(), run.train))
        for step in range(3):
            worker.train_step(par, batch(step, run), "fp32", CPU)
        frames_at_clock = []  # frames compiled so far, at each clock read of the worker
        monkeypatch.setattr(worker, "time", types.SimpleNamespace(
            perf_counter=lambda: frames_at_clock.append(backend.frame_count) or __import__("time").perf_counter()))
        share = worker.all_to_all_share(par, batch(3, run), "fp32", CPU)
    finally:
        dist.destroy_process_group()
    start, end = frames_at_clock[-2:]
    assert backend.frame_count > 2, "the timers were expected to recompile the blocks"
    assert start == end, f"{end - start} frames compiled inside the timed step"
    assert 0 < share < 1


def test_loop_mm_runs_outside_the_graph_and_new_counts_never_recompile(backend):
    """loop_mm splits the rows by per-expert counts read on the host: compiled, that loop runs outside the
    graph (one graph before it, one after), so each step's new counts recompile nothing, and the result
    is eager's. (Experts disables compilation of the loop at trace time, not when its module is imported.)"""
    from benchsuite.models.moe import Experts

    torch.manual_seed(0)
    experts = Experts(4, 16, 32, "gelu")

    def f(x, counts):
        return (experts.forward_sorted(x * 2, counts, "loop_mm") * 3).sum()

    compiled = torch.compile(f, backend=backend)
    for counts in ([3, 1, 0, 4], [2, 2, 2, 2], [0, 0, 5, 3], [1, 6, 1, 0]):
        counts = torch.tensor(counts)
        x = torch.randn(int(counts.sum()), 16)
        assert torch.equal(compiled(x, counts), f(x, counts)), counts
    assert backend.frame_count == 2, f"{backend.frame_count} frames compiled (2: before and after the loop)"
