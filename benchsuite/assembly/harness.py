"""The record of a run of the harness (the worker's, on rank 0): the shared parts (sections.py) from the
run's config, and what only a model benchsuite built can tell: FLOPs and parameters from the config, model
state and activation memory, communication, the precision policy and wrappers applied, routing, the
pipeline's figures and the validation curve."""

from __future__ import annotations

import statistics

import msgspec

from benchsuite.assembly.inputs import RankResult, RunFacts, Stamp
from benchsuite.assembly.sections import (Work, energy_and_carbon, env_section, ok_record, shared_metrics,
                                          slowest_steps, step_rows)
from benchsuite.config import RunConfig, TrainConfig
from benchsuite.layout import ParallelDims
from benchsuite.energy.attribution import attribute_energy
from benchsuite.energy.bounds import to_target_bound
from benchsuite.energy.common import sum_or_none
from benchsuite.metrics import comm
from benchsuite.metrics import flops as fl
from benchsuite.metrics import memory as mem
from benchsuite.metrics import quality as qual
from benchsuite.models.moe import LOAD_STATS, SCALAR_STATS, load_figures
from benchsuite.parallel import Applied
from benchsuite.parallel.pipeline import pipeline_section
from benchsuite.record import Record


def merge_moe_stats(per_rank: list[dict]) -> dict:
    """Scalars averaged over ranks; per-expert loads summed (each rank routes its own tokens), then the
    record's per-expert and imbalance figures from the sums (models.moe.load_figures)."""

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


def model_memory(run: RunConfig, dims: ParallelDims, applied: Applied, ranks: list[RankResult]) -> dict:
    """metrics.memory beside the peaks: model-state bytes beside the formulas, activations."""
    return {
        "model_state_bytes": mem.model_state_record([r.model_state for r in ranks], model=run.model, moe=run.moe,
                                                    dims=dims, applied=applied),
        "activation_estimate_bytes": mem.activation_estimates(run.model, micro_batch=run.micro_batch_per_rank,
                                                              recompute=run.train.recompute, tp=run.parallel.tensor,
                                                              context=run.parallel.context),
    }


def model_metrics(run: RunConfig, dims: ParallelDims, facts: RunFacts, ranks: list[RankResult],
                  f: fl.TokenFlops, moe: dict | None) -> dict:
    """The metrics only a model benchsuite built has: parameters, communication, the precision policy and
    wrappers applied, routing, the pipeline's figures."""
    return {
        "params": {"total": f.params, "active": f.params_active, "non_embedding": f.params_non_embedding},
        "comm": comm.comm_record([r.comm for r in ranks], model=run.model, moe=run.moe, train=run.train,
                                 dims=dims, micro_batch=run.micro_batch_per_rank, applied=facts.applied),
        "precision_policy": msgspec.to_builtins(facts.applied.precision),
        "implementation": facts.applied.implementation(),
        "moe": moe,
        "pipeline": pipeline_section([r.pipeline for r in ranks], parallel=run.parallel, model=run.model,
                                     train=run.train, micro_batch=run.micro_batch_per_rank,
                                     data_parallel=run.data_parallel) if ranks[0].pipeline else None,
    }


def harness_record(run: RunConfig, facts: RunFacts, ranks: list[RankResult], stamp: Stamp) -> Record:
    """A run's ok record (rank 0), from every rank's result and rank 0's facts."""
    moe = merge_moe_stats([r.moe for r in ranks]) if run.kind == "moe" else None
    expert_impl = facts.applied.expert_impl
    # grouped_mm computes only the filled expert slots: the hardware figure counts those
    f = fl.flops_per_token(run.model, run.moe, micro_batch=run.routed_micro_batch, recompute=run.train.recompute,
                           slot_share=fl.computed_slot_share(expert_impl, moe["padding_frac"] if moe else None))
    step_times = slowest_steps(ranks)
    tokens_per_step = run.global_batch * run.model.seq_len
    work = Work(step_times, [tokens_per_step] * len(step_times), f.model, f.hardware,
                fl.hardware_basis(run.moe, recompute=run.train.recompute, expert_impl=expert_impl))
    energy, carbon = energy_and_carbon(ranks, run.carbon)
    dims = ParallelDims.from_run(run)
    metrics = {**shared_metrics(work, facts, ranks, energy, carbon), **model_metrics(run, dims, facts, ranks, f, moe)}
    metrics["memory"].update(model_memory(run, dims, facts.applied, ranks))
    steps = step_rows(work, ranks[0].losses)
    if ranks[0].quality:
        metrics["quality"] = quality_section(run.train, ranks, facts.data, step_times, tokens_per_step, f.model,
                                             energy, carbon)
        for point in metrics["quality"]["curve"][1:]:  # steps[i]: the loss after step i's update
            steps[point["step"] - 1]["val_loss"] = point["val_loss"]
    return ok_record(stamp, run.to_dict(), env_section(facts, ranks), metrics, energy, carbon, steps)
