"""Selective recompute's FLOPs: what a real step executes is the hardware figure (HFU counts the
re-run attention core), and the model figure (MFU) is the one without recompute."""

from __future__ import annotations

import pytest
import torch

from benchsuite.config import CarbonConfig, EnergyConfig, ModelConfig, ParallelConfig, RunConfig, TrainConfig
from benchsuite.metrics import flops as fl


def _run(recompute: str, **model) -> RunConfig:
    return RunConfig(suite="t", workload="w", kind="dense", model=ModelConfig(**model),
                     train=TrainConfig(micro_batch=2, precision="fp32", recompute=recompute),
                     parallel=ParallelConfig(), energy=EnergyConfig(), carbon=CarbonConfig(), world_size=1)


def _counted_per_token(run: RunConfig) -> float:
    """FlopCounterMode over one training step of the model as parallelize wraps it."""
    from benchsuite.dist import ParallelDims
    from benchsuite.models.transformer import build_model
    from benchsuite.parallel import parallelize
    from benchsuite.worker import train_step

    par = parallelize(build_model(run.model), dims=ParallelDims(1), train=run.train, moe=None,
                      device=torch.device("cpu"))
    x = torch.randint(0, run.model.vocab, (run.micro_batch_per_rank, run.model.seq_len),
                      generator=torch.Generator().manual_seed(0))
    with fl.flop_counter() as counter:
        train_step(par, [(x, x)], "fp32", torch.device("cpu"))
    return counter.get_total_flops() / x.numel()


@pytest.mark.parametrize("model", [dict(layers=2, hidden=64, heads=4, seq_len=128, vocab=256),
                                   dict(layers=2, hidden=64, heads=4, kv_heads=2, seq_len=128, vocab=256,
                                        activation="swiglu", norm="rmsnorm", position="rope")])
def test_selective_recompute_executes_the_hardware_figure_and_mfu_leaves_it_out(model):
    selective, plain = _run("selective", **model), _run("none", **model)
    per_token = fl.flops_per_token(selective.model, None, micro_batch=2, recompute="selective")
    without = fl.flops_per_token(plain.model, None, micro_batch=2, recompute="none")
    scores = model["layers"] * model["seq_len"] * model["hidden"]  # Q·Kᵀ MACs per token
    assert per_token.model == without.model  # MFU never counts recompute
    assert per_token.hardware == without.hardware + 4 * scores  # HFU: the core's forward once more
    counted = _counted_per_token(selective)
    assert counted == pytest.approx(per_token.hardware, rel=0.01)
    assert counted - _counted_per_token(plain) == pytest.approx(4 * scores, rel=1e-9)
