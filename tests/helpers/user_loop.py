"""A plain PyTorch training loop over benchsuite's built-in GPT, as a user writes one, measured with
benchsuite.measure(): the test of the API against the harness (same model, same batches), and the script
the two-rank test starts under torchrun:

    torchrun --nproc_per_node 2 tests/helpers/user_loop.py OUT STEPS

Beside it, synthetic meters of constant power, so that a record's energy sources are the same on every
machine.
"""

from __future__ import annotations

import sys
import time

import torch
import torch.nn.functional as F

import benchsuite
from benchsuite.config import ModelConfig
from benchsuite.data import SyntheticSource
from benchsuite.dist import shutdown
from benchsuite.energy.common import Reading
from benchsuite.energy.meters import NodeEnergyMonitor
from benchsuite.models.transformer import build_model

MODEL = ModelConfig(layers=2, hidden=64, heads=4, vocab=128, seq_len=32)
MICRO_BATCH = 4


class Clocked:
    """A synthetic meter: constant power integrated over the monotonic clock between its own reads."""

    def __init__(self, watts: float):
        self.watts, self.t0 = watts, {}

    def begin(self, name: str) -> None:
        self.t0[name] = time.monotonic()

    def joules(self, name: str) -> float:
        return self.watts * (time.monotonic() - self.t0.pop(name))


class ClockedGpu(Clocked):
    uuid, name, cuda_index = "GPU-5e1f0000-0000-0000-0000-000000000000", "synthetic GPU", 0

    def end(self, name: str) -> Reading:
        return Reading(self.joules(name), "measured")

    def close(self) -> None:
        pass


class ClockedCpu(Clocked):
    def end(self, name: str) -> dict[str, Reading]:
        j = self.joules(name)
        return {"cpu": Reading(j, "measured"), "dram": Reading(j / 10, "measured")}


WATTS = 300.0 + 50.0 + 5.0  # the synthetic GPU, CPU and DRAM together


def synthetic_meters(monkeypatch) -> None:
    """Every energy monitor made from here on (the harness's and measure()'s) reads the synthetic meters."""
    monkeypatch.setattr(NodeEnergyMonitor, "create", classmethod(
        lambda cls, *a, **kw: cls([ClockedGpu(300.0)], ClockedCpu(50.0), min_window_s=0.0)))


def train(m: benchsuite.Measurement, steps: int, *, first_step: int = 0, rank: int = 0, world: int = 1,
          eval_every: int = 0) -> None:
    """`steps` AdamW steps of the built-in GPT on synthetic tokens, m.step() after each; with eval_every, an
    evaluation in a window outside training every eval_every steps."""
    model = build_model(MODEL, seed=0)
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    source = SyntheticSource(MODEL.vocab, MODEL.seq_len, 0)
    for step in range(first_step, first_step + steps):
        x, y = source.batch(step, rank, world, MICRO_BATCH)
        logits, aux, _ = model(x)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten()) + aux
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        m.step(loss=loss)
        if eval_every and (step + 1) % eval_every == 0:
            with m.window("eval", training=False), torch.no_grad():
                model(x)


def main(out: str, steps: int) -> None:
    """Every rank of a torchrun job: the process group first, then the measured loop."""
    torch.distributed.init_process_group("gloo")
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    with benchsuite.measure("user-gpt", tokens_per_step=MICRO_BATCH * MODEL.seq_len * world, out=out,
                            energy={"min_window_s": 0}, description="plain loop, built-in GPT, DDP on gloo") as m:
        train(m, steps, rank=rank, world=world)
    # the harness's teardown: DDP's state sits in reference cycles that hold the process group; destroyed at
    # interpreter exit instead, gloo's threads abort the rank (SIGABRT) now and then on a busy machine
    shutdown()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
