"""The model, run and batches the multi-process parallelism tests (tensor, ZeRO) share, their process
context, and the comparison of a sharded tensor with the single-process reference's."""

from __future__ import annotations

import re

import torch
from msgspec.structs import replace

from benchsuite.config import CarbonConfig, EnergyConfig, ModelConfig, ParallelConfig, RunConfig, TrainConfig

CFG = ModelConfig(layers=2, hidden=32, heads=4, vocab=64, seq_len=16, ffn_hidden=64)
MB, STEPS = 2, 3


def make_run(world: int, tensor: int, zero: int = 0, activation: str = "gelu", precision: str = "fp32") -> RunConfig:
    cfg = replace(CFG, activation=activation)
    return RunConfig(suite="t", workload="w", kind="dense", model=cfg,
                     train=TrainConfig(micro_batch=MB, steps=STEPS, precision=precision),
                     parallel=ParallelConfig(tensor=tensor, zero=zero), energy=EnergyConfig(),
                     carbon=CarbonConfig(), world_size=world)


def global_batch(step: int, dp: int, vocab: int, seq: int):
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randint(0, vocab, (dp * MB, seq), generator=g)
    y = torch.randint(0, vocab, (dp * MB, seq), generator=g)
    return x, y


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach().float() - b.detach().float()).norm() / b.detach().float().norm().clamp_min(1e-30))


def full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def clean_name(name: str) -> str:
    return re.sub(r"(^|\.)(module|_checkpoint_wrapped_module|_orig_mod)\.", r"\1", name)


def make_ctx(rank: int, world: int, dp: int, tp: int, zero: int = 0, mesh=None, device: str = "cpu"):
    """mesh: the ("dp", "tp") mesh of an earlier make_ctx to reuse; a new one by default. device "cuda":
    every rank on the one GPU, over the gloo group the test started (as the harness runs more ranks
    than GPUs)."""
    from dataclasses import replace

    from benchsuite.dist import DistContext, ParallelDims

    dims = ParallelDims(world, tp, 1, zero)
    assert dims.dp == dp
    dims = replace(dims, mesh=mesh) if mesh is not None else dims.build_meshes(device)
    return DistContext(rank, rank, world, 0, torch.device(device), "gloo", dims, shared_device=device == "cuda")


class GradCapture:
    """A train_step probe that gathers every gradient after backward (a collective: all ranks call it)."""

    def __init__(self, model):
        self.model, self.grads = model, None

    def after_backward(self):
        self.grads = {clean_name(n): full(p.grad).clone() for n, p in self.model.named_parameters()}

    def after_step(self):
        pass
