"""The shipped suites: every workloads/*.toml loads, and the sparse workloads of the dense-vs-sparse
comparisons are matched to their dense baseline on model FLOPs per token (metrics.flops), as the
comments in those files state: the experts a token uses (routed + shared) do the dense FFN's work
exactly, and the router adds what is left, under ROUTER_TOLERANCE."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchsuite.config import RunConfig, load_suite
from helpers import per_token

WORKLOADS = Path(__file__).resolve().parents[1] / "workloads"
ROUTER_TOLERANCE = 0.02  # the router's share of the model FLOPs: 1.6 % for 32 experts at hidden 64
MATCHED = ("dense-vs-sparse.toml", "quality.toml")  # every MoE workload there matches dense
NEW = {  # suite file -> (its dropless top-2 workload, its fine-grained + shared-experts workload)
    "dense-vs-sparse.toml": ("dropless-top2", "fine-grained-shared"),
    "quality.toml": ("dropless_top2", "fine_grained_shared"),
    "h200.toml": ("dropless-top2-compiled", "fine-grained-shared-compiled"),
}


def _runs(name: str) -> dict[str, RunConfig]:
    """The suite's runs by workload (the first seed's, where a suite sweeps seeds)."""
    runs: dict[str, RunConfig] = {}
    for run in load_suite(WORKLOADS / name).runs:
        runs.setdefault(run.workload, run)
    return runs


def router_flops(run: RunConfig) -> float:
    """Training FLOPs per token of the routers: a [hidden, experts] matmul in each MoE block, 6 FLOPs a MAC."""
    return 6 * (run.model.layers // run.moe.every) * run.model.hidden * run.moe.experts


def _dense(runs: dict[str, RunConfig]) -> RunConfig:
    return next(r for r in runs.values() if r.kind == "dense" and not r.train.compile)


@pytest.mark.parametrize("path", sorted(WORKLOADS.glob("*.toml")), ids=lambda p: p.name)
def test_every_shipped_suite_loads(path):
    assert load_suite(path).runs


@pytest.mark.parametrize("name", MATCHED)
def test_every_moe_workload_does_the_dense_models_flops_per_token_but_its_router(name):
    runs = _runs(name)
    dense = per_token(_dense(runs)).model
    moe = [r for r in runs.values() if r.kind == "moe"]
    assert {NEW[name][0], NEW[name][1]} <= {r.workload for r in moe}
    for run in moe:
        model = per_token(run).model
        assert model - router_flops(run) == pytest.approx(dense, rel=1e-12), run.workload
        assert abs(model / dense - 1) < ROUTER_TOLERANCE, run.workload


@pytest.mark.parametrize("name", sorted(NEW))
def test_the_dropless_top2_workload_is_token_choice_top2_without_capacity(name):
    run = _runs(name)[NEW[name][0]]
    assert (run.moe.router, run.moe.k, run.moe.capacity_factor, run.moe.shared_experts) == ("token_choice", 2, 0, 0)
    assert run.moe.dropless


@pytest.mark.parametrize("name", sorted(NEW))
def test_the_fine_grained_workload_has_many_small_experts_and_shared_ones_at_the_dense_flops(name):
    runs = _runs(name)
    run = runs[NEW[name][1]]
    moe, ffn = run.moe, run.model.ffn
    assert moe.shared_experts >= 1 and moe.experts >= 16 and moe.expert_hidden * 4 <= ffn
    assert (moe.k + moe.shared_experts) * moe.expert_hidden == ffn  # the experts a token uses: one dense FFN
    dense = per_token(_dense(runs)).model
    model = per_token(run).model
    assert model - router_flops(run) == pytest.approx(dense, rel=1e-12)
    assert abs(model / dense - 1) < ROUTER_TOLERANCE


def test_h200_dropless_top2_is_gshards_model_without_capacity():
    """Padded against dropless routing of the same model: same experts, same model FLOPs."""
    runs = _runs("h200.toml")
    gshard, dropless = runs["gshard-compiled"], runs["dropless-top2-compiled"]
    assert (dropless.moe.experts, dropless.moe.expert_hidden, dropless.moe.every) == \
        (gshard.moe.experts, gshard.moe.expert_hidden, gshard.moe.every)
    assert per_token(dropless).model == per_token(gshard).model
    assert runs["dropless-top2-eager"].moe == dropless.moe


def test_quality_runs_every_workload_on_the_same_seeds():
    seeds: dict[str, set[int]] = {}
    for run in load_suite(WORKLOADS / "quality.toml").runs:
        seeds.setdefault(run.workload, set()).add(run.train.seed)
    assert set(seeds) >= set(NEW["quality.toml"])
    assert all(s == {0, 1, 2} for s in seeds.values()), seeds
