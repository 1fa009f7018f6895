"""A run's record, assembled on rank 0 from every rank's RankResult and the run's own RunFacts.

Each rank measures its own figures (RankResult, gathered to rank 0); what holds for the whole run
(the resolved precision, what parallelize applied, the peak FLOP/s, the backend) is known on rank 0
and never gathered (RunFacts). Per-step time is the slowest rank's: a step ends when every rank is done.
"""

from __future__ import annotations

import os
import statistics
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from benchsuite.config import RunConfig, TrainConfig
from benchsuite.dist import ParallelDims
from benchsuite.energy.attribution import attribute_energy
from benchsuite.energy.bounds import to_target_bound
from benchsuite.energy.carbon import record_carbon
from benchsuite.energy.common import sum_or_none
from benchsuite.environment import THREADS_SOURCE_VAR, host_facts, software_versions
from benchsuite.metrics import comm
from benchsuite.metrics import flops as fl
from benchsuite.metrics import memory as mem
from benchsuite.metrics import quality as qual
from benchsuite.metrics.ceiling import vs_ceiling
from benchsuite.metrics.energy import derived_metrics
from benchsuite.metrics.timing import summarize
from benchsuite.record import SCHEMA_VERSION
from benchsuite.record.sanity import finite_or_none, sanity_flags

if TYPE_CHECKING:
    from benchsuite.parallel import Applied


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
    """What one rank measured (Zeus's Measurement is the model): plain values, units in the names."""

    rank: int
    node_rank: int
    device: dict  # environment.device_info
    step_times_s: list[float]  # each measured step on this rank
    losses: list[float]  # each measured step's loss, the mean over the data-parallel ranks
    counted_flops: float  # FlopCounterMode over one eager warm-up step, this rank's share
    memory: dict  # peak memory (device.peak_memory)
    matmul_ceiling_flops: float
    matmul_ceiling_source: str
    model_state: dict  # metrics.memory.ModelStateProbe.result()
    comm: dict  # metrics.comm.CommCounter.result()
    energy_window: dict  # the training windows combined (energy/windows.py)
    moe: dict | None = None  # the last step's routing figures (worker.moe_stats); None for a dense model
    quality: RankQuality | None = None
    pipeline: dict | None = None  # pipeline.PipelineRun.figures() with parallel.pipeline > 1


@dataclass(frozen=True)
class RunFacts:
    """What holds for the whole run, known on rank 0."""

    precision: str  # the compute precision, "auto" resolved
    applied: Applied  # what parallelize applied
    peak_flops: float | None  # per device; None for hardware without a datasheet figure
    peak_source: str
    backend: str | None  # the process group's; None for a world of one
    shared_device: bool  # several ranks on one GPU: no speed figure
    data: dict | None = None  # the data source's facts, with evaluation (metrics.quality.data)


def merge_moe_stats(per_rank: list[dict]) -> dict:
    """Scalars averaged over ranks; per-expert loads summed (each rank routes its own tokens), then the
    record's per-expert and imbalance figures from the sums (models.moe.load_figures)."""
    from benchsuite.models.moe import LOAD_STATS, SCALAR_STATS, load_figures

    def summed(loads):  # [rank][layer][expert] -> [layer][expert]
        return [[sum(vals) for vals in zip(*layer)] for layer in zip(*loads)]

    out = {k: statistics.fmean(r[k] for r in per_rank) for k in SCALAR_STATS}
    for key in LOAD_STATS:
        out[key] = summed(r[key] for r in per_rank)
    by_step = [summed(step) for step in zip(*(r["load_by_step"] for r in per_rank))]
    out.update(load_figures(out["tokens_per_expert"], by_step))
    out["expert_impl"] = per_rank[0]["expert_impl"]
    shares = [r["all_to_all_share"] for r in per_rank if r["all_to_all_share"] is not None]
    out["all_to_all_share"] = max(shares) if shares else None
    out["source"] = ("last measured step, mean over MoE layers and ranks, per-expert loads summed over ranks; "
                     "imbalance over every measured step; all_to_all_share from an extra synchronised step "
                     "after an untimed one (slowest rank)")
    return out


def quality_section(train: TrainConfig, ranks: list[RankResult], data: dict | None, step_times: list[float],
                    tokens_per_step: int, model_flops_per_token: float, energy: dict, carbon: dict) -> dict:
    """metrics.quality: the validation curve with cumulative training figures, what it took to reach
    train.target_loss, and evaluation time / energy kept apart (metrics/quality.py)."""
    q0 = ranks[0].quality

    def attributed(windows: str, j: int) -> dict:
        return attribute_energy([getattr(r.quality, windows)[j] for r in ranks])

    segments = [attributed("train_windows", j) for j in range(len(q0.train_windows))]
    evals = [attributed("eval_windows", j) for j in range(len(q0.eval_windows))]
    points = qual.curve(q0.points, q0.val_losses, step_times, tokens_per_step, model_flops_per_token,
                        [s["total_j"] for s in segments])
    why = "; ".join(energy.get("reasons") or []) or energy.get("source")
    out = qual.to_target(points, train.target_loss, carbon, energy_reason=why)
    out["energy_bound"] = to_target_bound(energy, out["energy_j"])
    best = min(points, key=lambda p: p["val_loss"])
    out.update({
        "initial_val_loss": points[0]["val_loss"], "final_val_loss": points[-1]["val_loss"],
        "best_val_loss": best["val_loss"], "best_step": best["step"],
        "eval_every": train.eval_every, "eval_count": len(points), "eval_rows": q0.eval_rows,
        "eval_tokens": q0.eval_tokens,
        "eval_seconds": sum(e["window_s"] for e in evals),
        "eval_energy_j": sum_or_none(e["total_j"] for e in evals),
        "energy_source": energy.get("source"),
        "counting": qual.COUNTING, "interpolation": qual.INTERPOLATION,
        "data": data, "curve": points,
    })
    return out


def memory_section(run: RunConfig, dims: ParallelDims, applied: Applied, ranks: list[RankResult]) -> dict:
    """metrics.memory: the largest rank's peaks, model-state bytes beside the formulas, activations."""
    return {
        "peak_allocated_bytes": max((r.memory["peak_allocated_bytes"] or 0) for r in ranks) or None,
        "peak_reserved_bytes": max((r.memory["peak_reserved_bytes"] or 0) for r in ranks) or None,
        "source": ranks[0].memory["source"],
        "per_rank": [r.memory for r in ranks],
        "model_state_bytes": mem.model_state_record([r.model_state for r in ranks], model=run.model, moe=run.moe,
                                                    dims=dims, applied=applied,
                                                    virtual_stages=run.parallel.virtual_stages),
        "activation_estimate_bytes": mem.activation_estimates(run.model, micro_batch=run.micro_batch_per_rank,
                                                              recompute=run.train.recompute, tp=run.parallel.tensor),
    }


def env_section(run: RunConfig, facts: RunFacts, ranks: list[RankResult]) -> dict:
    """The record's env: hosts and devices of every rank, threads, software versions."""
    devices = [dict(r.device, rank=r.rank, node_rank=r.node_rank) for r in ranks]
    return {"hosts": sorted({d["host"] for d in devices}), "nodes": len({r.node_rank for r in ranks}),
            "world_size": run.world_size, "backend": facts.backend, "devices": devices, **host_facts(devices),
            "threads_per_rank": ranks[0].device["cpu_threads"],  # torch.get_num_threads() in rank 0
            "threads_source": os.environ.get(THREADS_SOURCE_VAR) or "torch default (not started by benchsuite run)",
            **software_versions()}


def build_record(run: RunConfig, facts: RunFacts, ranks: list[RankResult], *, run_key: str, started_at: str,
                 duration_s: float) -> dict:
    """The run's ok record (rank 0), flagged by sanity checks and made strict JSON."""
    r0, dims = ranks[0], ParallelDims.from_run(run)
    step_times = [max(ts) for ts in zip(*(r.step_times_s for r in ranks))]
    summary = summarize(step_times)
    tokens_per_step = run.global_batch * run.model.seq_len
    tokens_per_s = tokens_per_step / summary["median"]
    moe = merge_moe_stats([r.moe for r in ranks]) if run.kind == "moe" else None
    expert_impl = facts.applied.expert_impl
    # grouped_mm computes only the filled expert slots: the hardware figure counts those
    f = fl.flops_per_token(run.model, run.moe, micro_batch=run.micro_batch_per_rank, recompute=run.train.recompute,
                           slot_share=fl.computed_slot_share(expert_impl, moe["padding_frac"] if moe else None))
    counted_per_token = sum(r.counted_flops for r in ranks) / tokens_per_step
    per_device = f.model * tokens_per_s / run.world_size
    peak = facts.peak_flops
    ceiling = min(r.matmul_ceiling_flops for r in ranks)  # the slowest rank's best
    vs, vs_reason = vs_ceiling(per_device, ceiling)
    rank_medians = [statistics.median(r.step_times_s) for r in ranks]
    metrics = {
        "tokens_per_s": tokens_per_s,
        "tokens_per_step": tokens_per_step,
        "step_time_s": summary,
        "flops": fl.record_flops(f.model, f.hardware, fl.hardware_basis(run.moe, recompute=run.train.recompute, expert_impl=expert_impl), counted_per_token,
                                 "FlopCounterMode, one eager step"),
        "params": {"total": f.params, "active": f.params_active, "non_embedding": f.params_non_embedding},
        # MFU and tflops_per_device by model FLOPs (no recompute), HFU by hardware FLOPs
        **fl.rate_figures(per_device, f.hardware * tokens_per_s / run.world_size, peak),
        "peak_tflops": peak / 1e12 if peak else None,
        "peak_source": facts.peak_source,
        "matmul_ceiling_tflops": ceiling / 1e12,
        "matmul_ceiling_source": f"{r0.matmul_ceiling_source}; the slowest rank's",
        "mfu_vs_ceiling": vs,
        "mfu_vs_ceiling_reason": vs_reason,
        "memory": memory_section(run, dims, facts.applied, ranks),
        "comm": comm.comm_record([r.comm for r in ranks], model=run.model, moe=run.moe, train=run.train,
                                 dims=dims, micro_batch=run.micro_batch_per_rank,
                                 applied=facts.applied, sequence_parallel=run.parallel.sequence_parallel,
                                 virtual_stages=run.parallel.virtual_stages),
        "per_rank": {"step_time_median_s": rank_medians,
                     "straggler_ratio": max(rank_medians) / statistics.median(rank_medians)},
        "precision": facts.precision,
        "precision_policy": asdict(facts.applied.precision),
        "implementation": facts.applied.implementation(),
        "speed_valid": not facts.shared_device,
    }
    energy = attribute_energy([r.energy_window for r in ranks])
    carbon = record_carbon(energy, run.carbon)
    measured_tokens = tokens_per_step * len(step_times)
    metrics["energy"] = derived_metrics(energy, tokens=measured_tokens, model_flops=measured_tokens * f.model,
                                        carbon=carbon)
    if moe:
        metrics["moe"] = moe
    if r0.pipeline:
        from benchsuite.parallel.pipeline import pipeline_section

        metrics["pipeline"] = pipeline_section([r.pipeline for r in ranks], parallel=run.parallel, model=run.model,
                                               train=run.train, micro_batch=run.micro_batch_per_rank,
                                               data_parallel=run.data_parallel)
    steps = [{"step": i, "time_s": t, "loss": loss, "tokens": tokens_per_step}
             for i, (t, loss) in enumerate(zip(step_times, r0.losses))]
    if r0.quality:
        metrics["quality"] = quality_section(run.train, ranks, facts.data, step_times, tokens_per_step, f.model,
                                             energy, carbon)
        for point in metrics["quality"]["curve"][1:]:  # steps[i]: the loss after step i's update
            steps[point["step"] - 1]["val_loss"] = point["val_loss"]
    record = {"schema_version": SCHEMA_VERSION, "run_key": run_key, "suite": run.suite, "workload": run.workload,
              "status": "ok", "error": None, "started_at": started_at, "duration_s": duration_s,
              "config": run.to_dict(), "env": env_section(run, facts, ranks), "metrics": metrics, "energy": energy,
              "carbon": carbon, "steps": steps}
    # Impossible figures (MFU > 1, NaN loss, negative energy, ...) are flagged, not published silently;
    # then non-finite floats become null so the record stays strict JSON (a NaN loss must not fail the run).
    record["flags"] = sanity_flags(record)
    return finite_or_none(record)
