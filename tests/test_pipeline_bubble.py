"""The measured pipeline bubble counts every rank's wait up to the pipeline's flush.

One spawn at world 4 (PP 4, 4 microbatches) runs 1F1B, GPipe and interleaved (2 stages per rank) in
turn on a model whose own compute takes milliseconds. A known delay D (a sleep, so it is the stage's
compute as the harness times it) is injected into one chunk of one stage in some steps:

- "flush": the first stage's backward of the last microbatch, the pipeline's last chunk. Every
  other rank's schedule has ended by then: only the flush makes them wait for it.
- "start": the last stage's forward of the first microbatch, which every later chunk waits for.

Either way the pipeline's step lasts D longer, so each rank's idle time (wall to the flush minus
its chunks' time) grows by D against the steps without a delay, but on the delayed rank, whose
chunks grow by D instead. Checked within 10 % of D, medians over 3 steps of each kind, the kinds
taking turns. (D is 1 s: on a shared 2-core box a woken rank can wait tens of ms for a core.)
"""

from __future__ import annotations

import statistics
import time

import pytest
import torch

from benchsuite.config import CarbonConfig, EnergyConfig, ModelConfig, ParallelConfig, RunConfig, TrainConfig
from helpers import spawn_gather

WORLD, PP, M, ROUNDS, DELAY_S = 4, 4, 4, 3, 1.0
CFG = ModelConfig(layers=8, hidden=16, heads=2, vocab=32, seq_len=8, ffn_hidden=32)
SCHEDULES = {"1f1b": 1, "gpipe": 1, "interleaved": 2}  # name: virtual stages per rank
# placement: (stage, microbatch, "forward" | "backward"), stage -1 being the last
PLACEMENTS = {"flush": (0, M - 1, "backward"), "start": (-1, 0, "forward")}


def make_run(schedule: str, virtual: int) -> RunConfig:
    return RunConfig(suite="t", workload="w", kind="dense", model=CFG,
                     train=TrainConfig(micro_batch=M, precision="fp32"),
                     parallel=ParallelConfig(pipeline=PP, schedule=schedule, virtual_stages=virtual, microbatches=M),
                     energy=EnergyConfig(), carbon=CarbonConfig(), world_size=WORLD)


class SleepInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        time.sleep(DELAY_S)
        return grad


class Delay:
    """A forward hook on a stage module: when armed, sleeps in the forward of microbatch `micro`, or
    in its backward (through SleepInBackward on the stage's output). Forwards run in microbatch order."""

    def __init__(self, micro: int, phase: str):
        self.micro, self.phase, self.calls, self.armed = micro, phase, 0, False

    def __call__(self, module, args, output):
        micro, self.calls = self.calls % M, self.calls + 1
        if not self.armed or micro != self.micro:
            return None
        if self.phase == "forward":
            time.sleep(DELAY_S)
            return None
        return SleepInBackward.apply(output)


def idle_and_busy(samples: list) -> tuple[float, float]:
    """Medians of the steps' idle (wall - busy) and busy seconds."""
    return statistics.median(s.wall_s - s.busy_s for s in samples), statistics.median(s.busy_s for s in samples)


def measure(schedule: str, virtual: int, rank: int) -> dict:
    """{placement: (idle growth, busy growth)} of this rank, against steps without a delay (the
    "baseline": their idle and busy seconds)."""
    from benchsuite.dist import DistContext
    from benchsuite.layout import ParallelDims
    from benchsuite.models.transformer import build_model
    from benchsuite.parallel import parallelize
    from benchsuite.parallel.pipeline import PipelinePlan
    from benchsuite.worker import train_step

    run = make_run(schedule, virtual)
    dims = ParallelDims.from_run(run).build_meshes("cpu")
    ctx = DistContext(rank, rank, WORLD, 0, torch.device("cpu"), "gloo", dims)
    par = parallelize(build_model(CFG, seed=0), dims=dims, train=run.train, moe=None, device=ctx.device,
                      pipeline=PipelinePlan.from_run(run))
    stages = PP * virtual
    delays = {}
    for name, (stage, micro, phase) in PLACEMENTS.items():
        for module, st in zip(par.model, par.pipeline.stages):
            if st.stage_index == stage % stages:
                delays[name] = Delay(micro, phase)
                module.register_forward_hook(delays[name])
    g = torch.Generator().manual_seed(0)
    batch = [(torch.randint(0, CFG.vocab, (M, CFG.seq_len), generator=g),
              torch.randint(0, CFG.vocab, (M, CFG.seq_len), generator=g))]

    train_step(par, batch, "fp32", ctx.device)  # first-step costs (connections, allocations)
    kinds = [None, *PLACEMENTS]
    samples: dict = {kind: [] for kind in kinds}
    for _ in range(ROUNDS):
        for kind in kinds:  # taking turns, so a change in the machine's load reaches every kind alike
            for name, delay in delays.items():
                delay.armed = name == kind
            train_step(par, batch, "fp32", ctx.device)
            samples[kind].append(par.pipeline.samples[-1])
    idle0, busy0 = idle_and_busy(samples[None])
    out = {"baseline": (idle0, busy0)}
    for name in PLACEMENTS:
        idle, busy = idle_and_busy(samples[name])
        out[name] = (idle - idle0, busy - busy0)
    return out


def _rank(rank: int, world: int) -> dict:
    import torch.distributed as dist

    from benchsuite.dist import shutdown

    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    results = {name: measure(name, virtual, rank) for name, virtual in SCHEDULES.items()}
    shutdown()
    return results


@pytest.mark.procs
def test_every_rank_idles_the_injected_delay_up_to_the_flush():
    ranks = spawn_gather(_rank, WORLD)
    failures = []
    for schedule in SCHEDULES:
        for name, (stage, _, _) in PLACEMENTS.items():
            delayed_rank = stage % (PP * SCHEDULES[schedule]) % PP  # stage s runs on rank s mod P
            for rank, results in enumerate(ranks):
                idle, busy = results[schedule][name]
                waited = 0.0 if rank == delayed_rank else DELAY_S
                worked = DELAY_S if rank == delayed_rank else 0.0
                if abs(idle - waited) > 0.1 * DELAY_S or abs(busy - worked) > 0.1 * DELAY_S:
                    failures.append(f"{schedule} {name} rank {rank}: idle +{idle:.3f} s (expected {waited}), "
                                    f"busy +{busy:.3f} s (expected {worked}); without the delay idle "
                                    f"{results[schedule]['baseline'][0]:.3f} s, busy {results[schedule]['baseline'][1]:.3f} s")
    assert not failures, "\n".join(failures)
