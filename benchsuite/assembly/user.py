"""The record of a user's own loop (benchsuite.measure(), rank 0): the shared parts (sections.py) from what
the loop told, a config of kind "user", and the reason for every figure it leaves null."""

from __future__ import annotations

import msgspec

from benchsuite.assembly.inputs import UNKNOWN, RankResult, RunFacts, Stamp, UserLoop
from benchsuite.assembly.sections import (Work, energy_and_carbon, env_section, ok_record, shared_metrics,
                                          slowest_steps, step_rows)
from benchsuite.environment import hardware_identity
from benchsuite.record import Record
from benchsuite.record.names import digest
from benchsuite.record.types import Kind


def step_tokens(given: list[int | None], default: int | None) -> list[int | None]:
    """Each measured step's tokens: as given, else the default."""
    return [default if t is None else t for t in given]


def user_config(loop: UserLoop, facts: RunFacts, ranks: list[RankResult]) -> dict:
    """The record's config: what the user told; the sections of a model benchsuite builds are null."""
    return {"world_size": facts.world_size, "nodes": len({r.node_rank for r in ranks}), "scaling": "weak",
            "suite": loop.suite, "workload": loop.name, "kind": Kind.USER.value, "description": loop.description,
            "sweep_id": "", "model": None, "moe": None, "parallel": None, "train": None,
            "energy": msgspec.to_builtins(loop.energy), "carbon": msgspec.to_builtins(loop.carbon)}


def null_reasons(loop: UserLoop, facts: RunFacts, ranks: list[RankResult], work: Work) -> list[str]:
    """metrics.reasons: why each figure the loop could not give is null."""
    reasons = []
    counts = {len(r.step_times_s) for r in ranks}
    if len(counts) > 1:
        reasons.append(f"ranks measured different numbers of steps ({sorted(counts)}): the first "
                       f"{min(counts)} are compared")
    if not work.step_times:
        reasons.append("no step measured: call m.step() after each optimizer step")
    elif work.tokens_per_step is None:
        reasons.append("tokens per step not given (measure(tokens_per_step=) or m.step(tokens=)): tokens/s, MFU "
                       "and energy per token are null")
    if loop.flops_per_token is None:
        reasons.append("model FLOPs per token not given (measure(flops_per_token=)): MFU and TFLOP/s are null")
    if facts.peak_flops is None:
        reasons.append(f"no peak FLOP/s for this device, MFU is null (measure(peak_tflops=) gives one): "
                       f"{facts.peak_source}")
    return reasons + [f"{key}: {why}" for key, why in UNKNOWN.items()]


def user_record(loop: UserLoop, facts: RunFacts, ranks: list[RankResult], *, started_at: str,
                duration_s: float) -> Record:
    """The record of one measured loop (rank 0), by the harness's formulas from what the loop told: the
    slowest rank's step times, rank 0's tokens and losses, the given FLOPs per token. Its run key is its
    config's and the hardware's, rank 0's threads included (a loop run at another thread count is another run);
    it is repeat 0 (the caller knows the folder that may hold others)."""
    step_times = slowest_steps(ranks)
    work = Work(step_times, step_tokens(ranks[0].tokens, loop.tokens_per_step)[:len(step_times)],
                loop.flops_per_token, None, UNKNOWN["hardware_per_token"])
    energy, carbon = energy_and_carbon(ranks, loop.carbon)
    metrics = {**shared_metrics(work, facts, ranks, energy, carbon),
               "reasons": null_reasons(loop, facts, ranks, work)}
    config = user_config(loop, facts, ranks)
    hardware = {**hardware_identity(), "threads_per_rank": ranks[0].device["cpu_threads"]}
    stamp = Stamp(digest({"config": config, "hardware": hardware}), 0, started_at, duration_s)
    return ok_record(stamp, config, env_section(facts, ranks), metrics, energy, carbon,
                     step_rows(work, ranks[0].losses))
