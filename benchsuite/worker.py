"""What runs inside each rank: build, parallelize, warm up, measure, report.

Started by torchrun (one process per rank) as `python -m benchsuite.worker WORKDIR` (run.json inside).
Rank 0 gathers every rank's figures and writes the run's record; a rank that raises
leaves an error file in the run's work folder so the launcher can name it.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import signal
import statistics
import sys
import time
import traceback
import warnings
from dataclasses import asdict
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F

from benchsuite import dist as bdist
from benchsuite import prctl
from benchsuite.config import RunConfig
from benchsuite.environment import THREADS_SOURCE_VAR, device_info, host_facts, software_versions
from benchsuite.metrics import comm
from benchsuite.metrics import flops as fl
from benchsuite.metrics import memory as mem
from benchsuite.metrics import quality as qual
from benchsuite.metrics.ceiling import measure_matmul_ceiling, vs_ceiling
from benchsuite.energy.carbon import carbon_section
from benchsuite.energy.attribution import attribute_energy
from benchsuite.energy.common import sum_or_none
from benchsuite.energy.meters import NodeEnergyMonitor
from benchsuite.energy.windows import combine_windows
from benchsuite.metrics.energy import derived_metrics
from benchsuite.metrics.timing import StepTimer, summarize, synchronize
from benchsuite.models.transformer import build_model
from benchsuite.parallel import Parallelized, parallelize
from benchsuite.parallel.zero import precision_policy
from benchsuite.progress import StepFigures, line_due, warm_up_line
from benchsuite.results.sanity import finite_or_none, sanity_flags
from benchsuite.results.schema import SCHEMA_VERSION, utc_now
from benchsuite.results.store import write_record


def autocast(precision: str, device: torch.device):
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def lm_loss(par: Parallelized, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy in fp32; vocab-parallel under tensor parallelism, where the
    full-vocabulary logits never exist on one rank (call inside par.loss_context())."""
    loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
    return loss.full_tensor() if par.loss_parallel else loss  # TP: a replicated DTensor scalar


def timed_steps(timer: StepTimer, step, batches: list, log: StepLog | None = None) -> list:
    """step(b) for each of `batches`, one timer interval each; the interval chain ends with the
    last step. The one way steps are timed: the measured loop and the GPU check's bare loop both
    come through here, so their figures differ only by what their step does. A due log line is
    written between steps with the timer paused: its device sync (reading the loss) is in no step."""
    timer.mark()
    results = []
    for b in batches:
        results.append(step(b))
        timer.mark()
        if log is not None and log.advance():
            timer.pause()
            log.write(results[-1].loss)
            timer.mark()
    timer.pause()
    return results


class StepLog:
    """Rank 0's step lines (progress.py) on stdout, which torchrun sends to the run's log: the
    loss of the step just ended, and rates over the rank's timed steps since the previous line."""

    def __init__(self, run: RunConfig, timer: StepTimer, device_name: str, precision: str,
                 peak_tflops: float | None):
        self.steps, self.timer, self.device = run.train.steps, timer, timer.device
        self.tokens_per_step = run.global_batch * run.model.seq_len
        self.flops_per_token, self.world_size = fl.flops_per_token(run).model, run.world_size
        with warnings.catch_warnings():  # an unknown peak is warned about once, in the record
            warnings.simplefilter("ignore")
            self.peak, _ = fl.peak_flops(device_name, precision, peak_tflops)
        self.done = self.lined = 0
        self.t0 = time.perf_counter()

    def advance(self) -> bool:
        """Count one measured step; True when it gets a line."""
        self.done += 1
        return line_due(self.done, self.steps)

    def write(self, loss: torch.Tensor) -> None:
        loss_value = loss.item()  # synchronises the device: every timed step before it has ended
        seconds = sum(self.timer.durations_s()[self.lined:self.done])
        tokens_per_s = self.tokens_per_step * (self.done - self.lined) / seconds
        per_device = self.flops_per_token * tokens_per_s / self.world_size
        memory = peak_memory(self.device)
        figures = StepFigures(self.done, self.steps, loss_value, tokens_per_s, per_device / 1e12,
                              fl.mfu(per_device, self.peak),
                              memory["peak_allocated_bytes"] or memory.get("peak_rss_bytes"),
                              time.perf_counter() - self.t0)
        print(figures.line(), flush=True)
        self.lined = self.done


class StepResult(NamedTuple):
    loss: torch.Tensor  # 0-d, the mean loss over the micro-batches, still on device
    routing: tuple  # RoutingStats of each MoE layer for the last micro-batch (empty for a dense model)


def train_step(par: Parallelized, batches, precision: str, device: torch.device, probe=None) -> StepResult:
    """One optimizer step over grad_accum micro-batches.
    probe (metrics.memory.ModelStateProbe) is told when the gradients and the optimizer state exist."""
    total = torch.zeros((), device=device)
    routing = None  # MoE routing statistics of the last micro-batch (none under pipeline parallel)
    if par.pipeline is not None:  # the schedule runs every microbatch's forward and backward
        with autocast(precision, device), par.loss_context():
            total = par.pipeline.forward_backward(batches)
    else:
        for i, (inputs, targets) in enumerate(batches):
            with par.grad_sync(i == len(batches) - 1):  # DDP all-reduces on the last micro-batch only
                with autocast(precision, device):
                    logits, aux, routing = par.model(inputs)
                with par.loss_context():
                    loss = (lm_loss(par, logits, targets) + aux) / len(batches)
                    loss.backward()
            total += loss.detach()
    for hook in par.grad_hooks:
        hook()
    if probe is not None:
        probe.after_backward()
    par.optimizer.step()
    if probe is not None:
        probe.after_step()
    par.optimizer.zero_grad(set_to_none=True)
    return StepResult(total, routing)


def evaluate_loss(par: Parallelized, batches, precision: str, device: torch.device) -> torch.Tensor:
    """Mean validation loss per token over `batches`, still on device: eval mode, no grad, the
    training loss path (autocast; vocab-parallel cross-entropy under tensor parallel) without the
    MoE auxiliary losses. Training mode and the RNG state (GShard's random policy draws from it) are
    restored, so evaluating does not change training."""
    was_training = par.model.training
    total = torch.zeros((), device=device)
    count = 0
    par.model.eval()
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            for inputs, targets in batches:
                with autocast(precision, device):
                    logits, _, _ = par.model(inputs)
                with par.loss_context():
                    loss = lm_loss(par, logits, targets)
                total += loss * targets.numel()
                count += targets.numel()
    finally:
        par.model.train(was_training)
    return total / count


def peak_memory(device: torch.device) -> dict:
    if device.type == "cuda":
        return {"peak_allocated_bytes": torch.cuda.max_memory_allocated(device),
                "peak_reserved_bytes": torch.cuda.max_memory_reserved(device), "source": "torch.cuda"}
    import resource

    # ru_maxrss is KiB on Linux: the whole process, model and framework alike.
    return {"peak_allocated_bytes": None, "peak_reserved_bytes": None,
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "source": "host_rss"}


def all_to_all_share(par: Parallelized, batches, precision: str, device: torch.device) -> float:
    """Share of step time in expert all-to-alls, from extra unmeasured steps with the device
    synchronised around each collective (which lengthens a step a little). The timers break a
    compiled block's graph around each collective, so the first such step recompiles the blocks:
    it runs untimed, and the share comes from the second."""
    from benchsuite.parallel.expert import all_to_all_seconds, set_all_to_all_timing

    set_all_to_all_timing(par.model, True)
    train_step(par, batches, precision, device)
    all_to_all_seconds(par.model, reset=True)
    synchronize(device)
    t0 = time.perf_counter()
    train_step(par, batches, precision, device)
    synchronize(device)
    share = all_to_all_seconds(par.model, reset=True) / (time.perf_counter() - t0)
    set_all_to_all_timing(par.model, False)
    return share


def moe_stats(model, routing_by_step: list, all_to_all_share: float | None = None) -> dict | None:
    """Routing figures of this rank: the last measured step's (its RoutingStats per MoE layer;
    scalars averaged over MoE layers, per-expert loads per layer) and every measured step's
    expert load [step][MoE layer][expert], read from the device once, after the steps."""
    from benchsuite.models.moe import LOAD_STATS, moe_layers, summarize_stats

    layers = moe_layers(model)
    if not layers:
        return None
    last = routing_by_step[-1]
    stats = summarize_stats(last)
    for key in LOAD_STATS:
        stats[key] = [getattr(r, key).float().tolist() for r in last]
    stats["load_by_step"] = torch.stack([torch.stack([r.expert_load for r in step])
                                         for step in routing_by_step]).float().tolist()  # one device read
    stats["expert_impl"] = layers[0].expert_impl
    stats["all_to_all_share"] = all_to_all_share
    return stats


FAULT_PHASES = {"raise": "measure", "hang": "measure", "kill": "measure", "segv": "measure",
                "abort_at_exit": "exit", "hang_at_exit": "exit"}


def inject_fault(rank: int, phase: str = "measure") -> None:
    """Deliberate failure for testing failure isolation: BENCHSUITE_INJECT_FAULT=KIND:RANK with
    KIND raise | hang | kill | segv, applied by that rank before the first measured step, or
    abort_at_exit | hang_at_exit, applied after the record is written and the process groups are
    destroyed (the SIGABRT or hang a library can cause in teardown)."""
    spec = os.environ.get("BENCHSUITE_INJECT_FAULT")
    if not spec:
        return
    kind, _, target = spec.partition(":")
    if (target and int(target) != rank) or FAULT_PHASES.get(kind) != phase:
        return
    if kind == "raise":
        raise RuntimeError(f"injected fault on rank {rank}")
    if kind in ("hang", "hang_at_exit"):
        time.sleep(10**6)
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "segv":
        ctypes.string_at(0)
    if kind == "abort_at_exit":
        os.abort()


def unmeasured_steps(run: RunConfig) -> int:
    """train.warmup_steps, but at least the two instrumented steps, and with compile at least one
    more so that compilation never lands in a measured step."""
    return max(run.train.warmup_steps, run.train.min_warmup_steps)


def warm_up(par: Parallelized, batches, run: RunConfig, precision: str, device: torch.device):
    """The unmeasured steps: (counted FLOPs, model-state bytes, collective bytes) of this rank.
    Step 0 is counted by FlopCounterMode; step 1 measures the model-state bytes held and the bytes
    sent in collectives. Both run eager: a dispatch mode sees every op only outside compiled
    graphs. The remaining steps warm up compile, the allocator and caches."""
    with fl.flop_counter() as counter, torch.compiler.set_stance("force_eager"):
        train_step(par, batches(0), precision, device)
    probe = mem.ModelStateProbe(par.model, par.optimizer)
    with comm.CommCounter() as comm_counter, torch.compiler.set_stance("force_eager"):
        train_step(par, batches(1), precision, device, probe=probe)
    probe.close()
    for step in range(2, unmeasured_steps(run)):
        train_step(par, batches(step), precision, device)
    return counter.get_total_flops(), probe.result(), comm_counter.result()


def measure(run: RunConfig, ctx: bdist.DistContext, peak_tflops: float | None) -> dict:
    """Everything one rank measures; rank 0 turns the gathered dicts into the record."""
    from benchsuite.data import make_source

    torch.manual_seed(run.train.seed)
    precision = bdist.resolve_precision(run.train.precision, ctx.device)
    # On GPU the NVML counter is the figure; integrated power samples ride along as its cross-check.
    monitor = NodeEnergyMonitor.create([ctx.device], run.energy, rank=ctx.rank,
                                       sample_power=ctx.device.type == "cuda")
    if run.energy.idle_baseline_s > 0:  # before the model touches the device: a cold, idle GPU
        monitor.measure_idle(run.energy.idle_baseline_s)
    model = build_model(run.model, run.moe, seed=run.train.seed).to(ctx.device)
    par = parallelize(model, run, ctx)
    source = make_source(run.train.data, run.model.vocab, run.model.seq_len, run.train.seed)
    mb, dp_rank, dp = run.micro_batch_per_rank, ctx.dp_rank, ctx.dims.dp

    def batches(step: int):
        out = []
        for micro in range(run.train.grad_accum):
            x, y = source.batch(step * run.train.grad_accum + micro, dp_rank, dp, mb)
            out.append((x.to(ctx.device, non_blocking=True), y.to(ctx.device, non_blocking=True)))
        return out

    warm_t0 = time.perf_counter()
    counted_flops, model_state, comm_bytes = warm_up(par, batches, run, precision, ctx.device)
    step = unmeasured_steps(run)
    synchronize(ctx.device)
    if ctx.is_main:
        print(warm_up_line(step, time.perf_counter() - warm_t0, run.train.compile), flush=True)
    ceiling = measure_matmul_ceiling(ctx.device, torch.bfloat16 if precision == "bf16" else torch.float32)

    if ctx.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(ctx.device)
    # Every measured step's batches are on the device before the first one: no host-to-device copy
    # (from pageable memory) inside a timed step.
    measured = [batches(step + i) for i in range(run.train.steps)]
    inject_fault(ctx.rank)
    # Measured steps run in energy windows "train-k" between validation points (one window when
    # train.eval_every = 0); each evaluation has its own window "eval-k" outside the step timer.
    # The record's energy is the training windows summed (see metrics/quality.py).
    evaluating = run.train.eval_every > 0
    points = qual.eval_points(run.train.steps, run.train.eval_every) if evaluating else [0, run.train.steps]
    val = [(x.to(ctx.device), y.to(ctx.device))
           for x, y in qual.eval_rows(source.val_batches(mb))] if evaluating else []  # same rows on every rank
    timer = StepTimer(ctx.device)
    log = StepLog(run, timer, device_info(ctx.device)["name"], precision, peak_tflops) if ctx.is_main else None
    losses, val_losses, train_windows, eval_windows, routing_by_step = [], [], [], [], []

    def evaluate(k: int) -> None:
        monitor.begin(f"eval-{k}")
        val_losses.append(evaluate_loss(par, val, precision, ctx.device))
        eval_windows.append(monitor.end(f"eval-{k}").to_dict())

    if evaluating:
        evaluate(0)
    for start, stop in zip(points, points[1:]):
        monitor.begin(f"train-{start}")  # window edges synchronise the device
        results = timed_steps(timer, lambda b: train_step(par, b, precision, ctx.device), measured[start:stop],
                              log)
        losses.extend(r.loss for r in results)
        routing_by_step.extend(r.routing for r in results)
        train_windows.append(monitor.end(f"train-{start}").to_dict())
        if evaluating:
            evaluate(stop)
    energy_window = combine_windows(train_windows, "measure", run.energy.min_window_s)
    quality = None
    if evaluating:
        val_values = torch.stack(val_losses)
        if ctx.world_size > 1:  # every rank evaluated the same rows: the mean is that value
            torch.distributed.all_reduce(val_values, group=ctx.dp_group)
            val_values /= dp
        quality = {"points": points, "val_losses": val_values.tolist(), "train_windows": train_windows,
                   "eval_windows": eval_windows, "eval_rows": sum(len(y) for _, y in val),
                   "eval_tokens": sum(y.numel() for _, y in val),
                   "data": source.describe() if ctx.is_main else None}
    monitor.close()
    if ctx.dims.ep_enabled:  # the dropless all-to-alls' bytes in each measured step: they follow the routing
        from benchsuite.parallel.expert import all_to_all_bytes_by_step
        comm_bytes["all_to_all_bytes_by_step"] = all_to_all_bytes_by_step(par.model, last=run.train.steps)
    a2a_share = all_to_all_share(par, batches(step + run.train.steps), precision, ctx.device) \
        if ctx.dims.ep_enabled else None
    step_times = timer.durations_s()
    loss_values = torch.stack(losses)
    if ctx.world_size > 1:
        torch.distributed.all_reduce(loss_values, group=ctx.dp_group)
        loss_values /= dp
    return {
        "rank": ctx.rank, "node_rank": ctx.node_rank, "device": device_info(ctx.device),
        "step_times_s": step_times, "losses": loss_values.tolist(), "counted_flops": counted_flops,
        "memory": peak_memory(ctx.device), "matmul_ceiling_flops": ceiling.flops_per_s,
        "matmul_ceiling_source": ceiling.source, "precision": precision,
        "precision_policy": asdict(precision_policy(precision)),
        "impl": par.impl, "peak_tflops": peak_tflops,
        "model_state": model_state, "comm": comm_bytes, "energy_window": energy_window,
        "moe": moe_stats(par.model, routing_by_step, a2a_share), "quality": quality,
        "pipeline": par.pipeline.figures() if par.pipeline is not None else None,
    }


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


def quality_section(run: RunConfig, ranks: list[dict], step_times: list[float], tokens_per_step: int,
                    model_flops_per_token: float, energy: dict, carbon: dict) -> dict:
    """metrics.quality: the validation curve with cumulative training figures, what it took to reach
    train.target_loss, and evaluation time / energy kept apart (metrics/quality.py)."""
    q0 = ranks[0]["quality"]

    def attributed(key: str, j: int) -> dict:
        return attribute_energy([r["quality"][key][j] for r in ranks])

    segments = [attributed("train_windows", j) for j in range(len(q0["train_windows"]))]
    evals = [attributed("eval_windows", j) for j in range(len(q0["eval_windows"]))]
    points = qual.curve(q0["points"], q0["val_losses"], step_times, tokens_per_step, model_flops_per_token,
                        [s["total_j"] for s in segments])
    why = "; ".join(energy.get("reasons") or []) or energy.get("source")
    out = qual.to_target(points, run.train.target_loss, carbon, energy_reason=why)
    best = min(points, key=lambda p: p["val_loss"])
    out.update({
        "initial_val_loss": points[0]["val_loss"], "final_val_loss": points[-1]["val_loss"],
        "best_val_loss": best["val_loss"], "best_step": best["step"],
        "eval_every": run.train.eval_every, "eval_count": len(points), "eval_rows": q0["eval_rows"],
        "eval_tokens": q0["eval_tokens"],
        "eval_seconds": sum(e["window_s"] for e in evals),
        "eval_energy_j": sum_or_none(e["total_j"] for e in evals),
        "energy_source": energy.get("source"),
        "counting": qual.COUNTING, "interpolation": qual.INTERPOLATION,
        "data": q0.get("data"), "curve": points,
    })
    return out


def build_record(run: RunConfig, run_key: str, ranks: list[dict], ctx: bdist.DistContext,
                 started_at: str, duration_s: float) -> dict:
    """Rank 0: per-step time is the slowest rank's (a step ends when every rank is done)."""
    r0 = ranks[0]
    step_times = [max(ts) for ts in zip(*(r["step_times_s"] for r in ranks))]
    summary = summarize(step_times)
    tokens_per_step = run.global_batch * run.model.seq_len
    tokens_per_s = tokens_per_step / summary["median"]
    moe = merge_moe_stats([r["moe"] for r in ranks]) if run.kind == "moe" else None
    expert_impl = moe["expert_impl"] if moe else None
    # grouped_mm computes only the filled expert slots: the hardware figure counts those
    f = fl.flops_per_token(run, fl.computed_slot_share(expert_impl, moe["padding_frac"] if moe else None))
    counted_per_token = sum(r["counted_flops"] for r in ranks) / tokens_per_step
    per_device = f.model * tokens_per_s / run.world_size
    peak, peak_source = fl.peak_flops(r0["device"]["name"], r0["precision"], r0["peak_tflops"])
    ceiling = min(r["matmul_ceiling_flops"] for r in ranks)  # the slowest rank's best
    vs, vs_reason = vs_ceiling(per_device, ceiling)
    rank_medians = [statistics.median(r["step_times_s"]) for r in ranks]
    metrics = {
        "tokens_per_s": tokens_per_s,
        "tokens_per_step": tokens_per_step,
        "step_time_s": summary,
        "flops": fl.record_flops(f.model, f.hardware, fl.hardware_basis(run, expert_impl), counted_per_token,
                                 "FlopCounterMode, one eager step"),
        "params": {"total": f.params, "active": f.params_active, "non_embedding": f.params_non_embedding},
        # MFU and tflops_per_device by model FLOPs (no recompute), HFU by hardware FLOPs
        **fl.rate_figures(per_device, f.hardware * tokens_per_s / run.world_size, peak),
        "peak_tflops": peak / 1e12 if peak else None,
        "peak_source": peak_source,
        "matmul_ceiling_tflops": ceiling / 1e12,
        "matmul_ceiling_source": f"{r0['matmul_ceiling_source']}; the slowest rank's",
        "mfu_vs_ceiling": vs,
        "mfu_vs_ceiling_reason": vs_reason,
        "memory": {
            "peak_allocated_bytes": max((r["memory"]["peak_allocated_bytes"] or 0) for r in ranks) or None,
            "peak_reserved_bytes": max((r["memory"]["peak_reserved_bytes"] or 0) for r in ranks) or None,
            "source": r0["memory"]["source"],
            "per_rank": [r["memory"] for r in ranks],
            "model_state_bytes": mem.model_state_record(run, [r.get("model_state") for r in ranks], r0["precision"],
                                                        r0["impl"]),
            "activation_estimate_bytes": mem.activation_estimates(run),
        },
        "comm": comm.comm_record(run, [r.get("comm") for r in ranks], r0["precision"], r0["impl"]),
        "per_rank": {"step_time_median_s": rank_medians,
                     "straggler_ratio": max(rank_medians) / statistics.median(rank_medians)},
        "precision": r0["precision"],
        "precision_policy": r0["precision_policy"],
        "implementation": r0["impl"],
        "speed_valid": not ctx.shared_device,
    }
    energy = attribute_energy([r["energy_window"] for r in ranks])
    carbon = carbon_section(energy["total_j"], run.carbon, energy_source=energy["source"])
    measured_tokens = tokens_per_step * len(step_times)
    metrics["energy"] = derived_metrics(energy, tokens=measured_tokens, model_flops=measured_tokens * f.model,
                                        carbon=carbon)
    if moe:
        metrics["moe"] = moe
    if r0.get("pipeline"):
        from benchsuite.parallel.pipeline import pipeline_section

        metrics["pipeline"] = pipeline_section(run, [r["pipeline"] for r in ranks])
    devices = [dict(r["device"], rank=r["rank"], node_rank=r["node_rank"]) for r in ranks]
    env = {"hosts": sorted({d["host"] for d in devices}), "nodes": len({r["node_rank"] for r in ranks}),
           "world_size": ctx.world_size, "backend": ctx.backend, "devices": devices, **host_facts(devices),
           "threads_per_rank": r0["device"]["cpu_threads"],  # torch.get_num_threads() in rank 0
           "threads_source": os.environ.get(THREADS_SOURCE_VAR) or "torch default (not started by benchsuite run)",
           **software_versions()}
    steps = [{"step": i, "time_s": t, "loss": loss, "tokens": tokens_per_step}
             for i, (t, loss) in enumerate(zip(step_times, r0["losses"]))]
    if r0.get("quality"):
        metrics["quality"] = quality_section(run, ranks, step_times, tokens_per_step, f.model,
                                             energy, carbon)
        for point in metrics["quality"]["curve"][1:]:  # steps[i]: the loss after step i's update
            steps[point["step"] - 1]["val_loss"] = point["val_loss"]
    record = {"schema_version": SCHEMA_VERSION, "run_key": run_key, "suite": run.suite, "workload": run.workload,
              "status": "ok", "error": None, "started_at": started_at, "duration_s": duration_s,
              "config": run.to_dict(), "env": env, "metrics": metrics, "energy": energy, "carbon": carbon,
              "steps": steps}
    # Impossible figures (MFU > 1, NaN loss, negative energy, ...) are flagged, not published silently;
    # then non-finite floats become null so the record stays strict JSON (a NaN loss must not fail the run).
    record["flags"] = sanity_flags(record)
    return finite_or_none(record)


def apply_threads() -> None:
    """The launcher's thread count (launch.thread_plan, passed as OMP_NUM_THREADS), applied to torch
    before anything runs: the count every rank of the sweep gets."""
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="benchsuite.worker")
    p.add_argument("workdir", help="the run's folder: run.json in, pid and error files out")
    workdir = Path(p.parse_args(argv).workdir)
    prctl.die_with_parent(signal.SIGKILL)  # torchrun starts ranks in their own sessions
    rank = int(os.environ.get("RANK", "0"))
    (workdir / f"pid.{rank}").write_text(str(os.getpid()))
    started_at, t0 = utc_now(), time.perf_counter()
    try:
        spec = json.loads((workdir / "run.json").read_text())
        run = RunConfig.from_dict(spec["run"])
        apply_threads()
        ctx = bdist.init_distributed(run)
        mine = measure(run, ctx, spec["peak_tflops"])
        ranks = bdist.all_gather_objects(mine, ctx)
        if ctx.is_main:
            record = build_record(run, spec["run_key"], ranks, ctx, started_at, time.perf_counter() - t0)
            record["repeat"] = spec.get("repeat", 0)  # which measurement of the run (launch.plan)
            write_record(spec["out"], record)
        bdist.shutdown()
        inject_fault(rank, phase="exit")
    except BaseException as e:
        err = {"type": type(e).__name__, "message": str(e)[:2000], "rank": rank, "time": time.time_ns(),
               "traceback": traceback.format_exc()[-4000:]}
        (workdir / f"error.{rank}.json").write_text(json.dumps(err))
        traceback.print_exc()
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
