"""The parts of a record that every run has, whoever built its loop, written once: the slowest rank's steps,
the speed and FLOP-rate figures, memory peaks, per-rank medians and the straggler ratio, the energy over
every rank and its carbon, the energy per unit of work, the env, and the record itself: flagged by the
sanity checks, made strict JSON and typed.
"""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass

from benchsuite.assembly.inputs import UNKNOWN, RankResult, RunFacts, Stamp
from benchsuite.config import CarbonConfig
from benchsuite.energy.attribution import attribute_energy
from benchsuite.energy.carbon import record_carbon
from benchsuite.environment import THREADS_SOURCE_VAR, host_facts, software_versions
from benchsuite.metrics import flops as fl
from benchsuite.metrics.ceiling import vs_ceiling
from benchsuite.metrics.energy import derived_metrics
from benchsuite.metrics.timing import summarize
from benchsuite.record import SCHEMA_VERSION, Record, as_record
from benchsuite.record.sanity import finite_or_none, sanity_flags

COUNTED_SOURCE = "FlopCounterMode, one eager step"


@dataclass(frozen=True)
class Work:
    """What a run's rates are of: each measured step's time and tokens, and its FLOPs per token as known."""

    step_times: list[float]  # each measured step, the slowest rank's (slowest_steps)
    tokens: list[int | None]  # each step's tokens over the whole job; None where not known
    model_per_token: float | None  # model FLOPs per token (no recompute); None: not known
    hardware_per_token: float | None  # FLOPs the hardware executes per token; None: not known
    hardware_source: str  # what hardware_per_token counts, or why it is null

    @property
    def tokens_per_step(self) -> float | None:
        return statistics.fmean(self.tokens) if self.tokens and None not in self.tokens else None

    @property
    def measured_tokens(self) -> int | None:
        return sum(self.tokens) if self.tokens and None not in self.tokens else None


def slowest_steps(ranks: list[RankResult]) -> list[float]:
    """Each step every rank measured, the slowest rank's time: a step ends when every rank is done."""
    return [max(ts) for ts in zip(*(r.step_times_s for r in ranks))]


def per_device(flops_per_token: float | None, tokens_per_s: float | None, world_size: int) -> float | None:
    """Achieved FLOP/s per device; None where the FLOPs or the tokens are not known."""
    return flops_per_token * tokens_per_s / world_size if flops_per_token and tokens_per_s else None


def counted_flops(ranks: list[RankResult], tokens_per_step: float | None) -> tuple[float | None, str]:
    """metrics.flops.counted_per_token over every rank's share, and its source (or why it is null)."""
    if any(r.counted_flops is None for r in ranks):
        return None, UNKNOWN["counted_per_token"]
    return sum(r.counted_flops for r in ranks) / tokens_per_step, COUNTED_SOURCE


def ceiling_figures(ranks: list[RankResult], model_per_device: float | None) -> dict:
    """The matmul ceiling (the slowest rank's best) and the run's share of it."""
    if any(r.matmul_ceiling_flops is None for r in ranks):
        return {"matmul_ceiling_tflops": None, "matmul_ceiling_source": None, "mfu_vs_ceiling": None,
                "mfu_vs_ceiling_reason": UNKNOWN["matmul_ceiling"]}
    ceiling = min(r.matmul_ceiling_flops for r in ranks)
    vs, vs_reason = vs_ceiling(model_per_device, ceiling)
    return {"matmul_ceiling_tflops": ceiling / 1e12,
            "matmul_ceiling_source": f"{ranks[0].matmul_ceiling_source}; the slowest rank's",
            "mfu_vs_ceiling": vs, "mfu_vs_ceiling_reason": vs_reason}


def memory_peaks(ranks: list[RankResult]) -> dict:
    """metrics.memory's peaks: the largest rank's, and every rank's."""
    memories = [r.memory for r in ranks]
    return {"peak_allocated_bytes": max((m["peak_allocated_bytes"] or 0) for m in memories) or None,
            "peak_reserved_bytes": max((m["peak_reserved_bytes"] or 0) for m in memories) or None,
            "source": memories[0]["source"], "per_rank": memories}


def per_rank_section(ranks: list[RankResult]) -> dict | None:
    """metrics.per_rank: each rank's median step and the straggler ratio (None when a rank timed no step)."""
    medians = [statistics.median(r.step_times_s) for r in ranks if r.step_times_s]
    if len(medians) < len(ranks):
        return None
    return {"step_time_median_s": medians, "straggler_ratio": max(medians) / statistics.median(medians)}


def shared_metrics(work: Work, facts: RunFacts, ranks: list[RankResult], energy: dict, carbon: dict) -> dict:
    """The metrics every record has: tokens/s = tokens per step / median step time, FLOP rates per device
    over the world, memory peaks, per-rank medians and energy per unit of work; null where not known."""
    summary = summarize(work.step_times) if work.step_times else None
    tokens_per_s = work.tokens_per_step / summary["median"] if summary and work.tokens_per_step else None
    model_rate = per_device(work.model_per_token, tokens_per_s, facts.world_size)
    measured = work.measured_tokens
    return {
        "tokens_per_s": tokens_per_s,
        "tokens_per_s_per_device": tokens_per_s / facts.world_size if tokens_per_s else None,
        "tokens_per_step": work.tokens_per_step,
        "step_time_s": summary,
        "flops": fl.record_flops(work.model_per_token, work.hardware_per_token, work.hardware_source,
                                 *counted_flops(ranks, work.tokens_per_step)),
        # MFU and tflops_per_device by model FLOPs (no recompute), HFU by hardware FLOPs
        **fl.rate_figures(model_rate, per_device(work.hardware_per_token, tokens_per_s, facts.world_size),
                          facts.peak_flops),
        "peak_tflops": facts.peak_flops / 1e12 if facts.peak_flops else None,
        "peak_source": facts.peak_source,
        **ceiling_figures(ranks, model_rate),
        "memory": memory_peaks(ranks),
        "per_rank": per_rank_section(ranks),
        "precision": facts.precision,
        "speed_valid": not facts.shared_device,
        "energy": derived_metrics(energy, tokens=measured, carbon=carbon,
                                  model_flops=measured * work.model_per_token
                                  if measured and work.model_per_token else None),
    }


def left_out_note(windows: list[dict]) -> str | None:
    """What the record's energy leaves out: rank 0's windows outside training, by name."""
    if not windows:
        return None
    names = ", ".join(dict.fromkeys(w["name"] for w in windows))
    return (f"{len(windows)} window(s) outside training ({names}; {sum(w['window_s'] for w in windows):.3g} s on "
            f"rank 0) left out of the energy, as the harness leaves its evaluations out")


def energy_and_carbon(ranks: list[RankResult], carbon_cfg: CarbonConfig) -> tuple[dict, dict]:
    """The record's energy (every rank's training windows: each physical GPU and each node's CPU/DRAM once,
    its reasons naming rank 0's windows left out) and the carbon of it."""
    energy = attribute_energy([r.energy_window for r in ranks])
    note = left_out_note(ranks[0].left_out)
    if note:
        energy["reasons"].append(note)
    return energy, record_carbon(energy, carbon_cfg)


def step_rows(work: Work, losses: list[float | None]) -> list[dict]:
    """The record's steps: each measured step's time (the slowest rank's), rank 0's loss, its tokens."""
    return [{"step": i, "time_s": t, "loss": loss, "tokens": n}
            for i, (t, loss, n) in enumerate(zip(work.step_times, losses, work.tokens))]


def env_section(facts: RunFacts, ranks: list[RankResult]) -> dict:
    """The record's env: hosts and devices of every rank, threads, software versions."""
    devices = [dict(r.device, rank=r.rank, node_rank=r.node_rank) for r in ranks]
    return {"hosts": sorted({d["host"] for d in devices}), "nodes": len({r.node_rank for r in ranks}),
            "world_size": facts.world_size, "backend": facts.backend, "devices": devices, **host_facts(devices),
            "threads_per_rank": ranks[0].device["cpu_threads"],  # torch.get_num_threads() in rank 0
            "threads_source": os.environ.get(THREADS_SOURCE_VAR) or "torch default (not started by benchsuite run)",
            **software_versions()}


def ok_record(stamp: Stamp, config: dict, env: dict, metrics: dict, energy: dict, carbon: dict,
              steps: list[dict]) -> Record:
    """The ok record: impossible figures (MFU > 1, NaN loss, negative energy, ...) flagged, not published
    silently; then non-finite floats null, so the record stays strict JSON (a NaN loss must not fail the run)."""
    record = {"schema_version": SCHEMA_VERSION, "run_key": stamp.run_key, "repeat": stamp.repeat,
              "suite": config["suite"], "workload": config["workload"], "status": "ok", "error": None,
              "started_at": stamp.started_at, "duration_s": stamp.duration_s, "config": config, "env": env,
              "metrics": metrics, "energy": energy, "carbon": carbon, "steps": steps}
    record["flags"] = sanity_flags(record)
    return as_record(finite_or_none(record))
