"""What a record is assembled from: each rank's RankResult (gathered to rank 0), rank 0's RunFacts, which
measurement it is (Stamp), and for a user's own loop what the user told benchsuite.measure() (UserLoop).

The harness's worker fills every field; a loop benchsuite did not build leaves None what it cannot know, and
the record says why (UNKNOWN, by the record field it leaves null).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from benchsuite.config import CarbonConfig, EnergyConfig
from benchsuite.parallel import Applied

UNKNOWN = {  # what a loop benchsuite did not build cannot tell it, by the field it leaves null
    "hardware_per_token": "not known in a user's loop (recompute and padding are the loop's own)",
    "counted_per_token": "not counted in a user's loop (benchsuite counts FlopCounterMode over a step it runs)",
    "matmul_ceiling": "not measured in a user's loop (the harness measures it after its warm-up steps)",
}


@dataclass(frozen=True)
class RankQuality:
    """One rank's evaluation figures (train.eval_every > 0)."""

    points: list[int]  # the steps evaluated after (0: before the first)
    val_losses: list[float]  # at each point, the mean over the data-parallel ranks
    train_windows: list[dict]  # this rank's energy window of each training segment
    eval_windows: list[dict]  # and of each evaluation
    eval_rows: int  # validation sequences per evaluation (the same on every rank)
    eval_tokens: int


@dataclass(frozen=True)
class RankResult:
    """What one rank measured (Zeus's Measurement is the model): plain values, units in the names. The fields
    after energy_window are the harness's own (None in a user's loop: UNKNOWN) or a user's loop's own."""

    rank: int
    node_rank: int
    device: dict  # environment.device_info
    step_times_s: list[float]  # each measured step on this rank
    losses: list[float | None]  # each measured step's loss (the harness: the mean over the data-parallel ranks)
    memory: dict  # peak memory (device.peak_memory)
    energy_window: dict  # the training windows combined (energy/windows.py)
    counted_flops: float | None = None  # FlopCounterMode over one eager warm-up step, this rank's share
    matmul_ceiling_flops: float | None = None
    matmul_ceiling_source: str | None = None
    model_state: dict | None = None  # metrics.memory.ModelStateProbe.result()
    comm: dict | None = None  # metrics.comm.CommCounter.result()
    moe: dict | None = None  # the last step's routing figures (worker.moe_stats); None for a dense model
    quality: RankQuality | None = None
    pipeline: dict | None = None  # pipeline.PipelineRun.figures() with parallel.pipeline > 1
    tokens: list[int | None] | None = None  # a user's loop: each step's tokens over the job as told (None: not)
    left_out: list[dict] = field(default_factory=list)  # a user's loop: its windows outside training, in order


@dataclass(frozen=True)
class RunFacts:
    """What holds for the whole run, known on rank 0 and never gathered."""

    world_size: int
    precision: str  # the compute precision, "auto" resolved
    peak_flops: float | None  # per device; None for hardware without a datasheet figure
    peak_source: str
    backend: str | None  # the process group's; None for a world of one
    shared_device: bool  # several ranks on one GPU: no speed figure
    applied: Applied | None = None  # what parallelize applied; None in a user's loop
    data: dict | None = None  # the data source's facts, with evaluation (metrics.quality.data)


@dataclass(frozen=True)
class UserLoop:
    """What a user told benchsuite.measure() about a loop it did not build: the record's config, and the
    figures only the user can give (None: not given, the figures from them null)."""

    name: str
    suite: str
    description: str
    flops_per_token: float | None  # model FLOPs per token
    tokens_per_step: int | None  # over the whole job
    energy: EnergyConfig
    carbon: CarbonConfig


@dataclass(frozen=True)
class Stamp:
    """Which measurement a record is and when it ran."""

    run_key: str
    repeat: int  # which measurement of its run (0 to N-1 of `run --repeat N`)
    started_at: str
    duration_s: float
