"""What runs inside each rank: build, parallelize, warm up, the measured steps, report.

Started by torchrun (one process per rank) as `python -m benchsuite.worker WORKDIR` (run.json inside).
Each rank's figures (a RankResult) are gathered to rank 0, which assembles the run's record from
them and its own RunFacts (benchsuite/assembly/) and writes it; a rank that raises
leaves an error file in the run's work folder so the launcher can name it.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import os
import signal
import sys
import time
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F

from benchsuite import dist as bdist
from benchsuite import prctl
from benchsuite.assembly import RankQuality, RankResult, RunFacts, Stamp, harness_record
from benchsuite.config import RunConfig
from benchsuite.environment import device_info
from benchsuite.layout import DP, PP
from benchsuite.metrics import comm
from benchsuite.metrics import flops as fl
from benchsuite.metrics import memory as mem
from benchsuite.metrics import quality as qual
from benchsuite.metrics.ceiling import MatmulCeiling, suite_ceiling
from benchsuite.energy.meters import NodeEnergyMonitor
from benchsuite.energy.windows import combine_windows
from benchsuite.device import peak_memory, synchronize
from benchsuite.metrics.timing import StepTimer
from benchsuite.models.transformer import build_model
from benchsuite.parallel import Parallelized, parallelize
from benchsuite.parallel.pipeline import PipelinePlan
from benchsuite.progress import StepFigures, eval_body, line_due, warm_up_body
from benchsuite.record import utc_now
from benchsuite.record import Record, write_record
from benchsuite.runlog import ERROR, EVAL, STEP, WARM_UP, RunLog, Value
from benchsuite.suite_constants import NOT_SHARED, SuiteConstants, ranks_on_this_node


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
    """Rank 0's step lines (progress.py, written by runlog.RunLog to the run's log and its JSON-lines
    twin): the loss of the step just ended, and rates over the rank's timed steps since the previous line."""

    def __init__(self, run: RunConfig, timer: StepTimer, peak: float | None, log: RunLog):
        self.log = log
        self.steps, self.timer, self.device, self.peak = run.train.steps, timer, timer.device, peak
        self.tokens_per_step = run.global_batch * run.model.seq_len
        self.flops_per_token = fl.flops_per_token(run.model, run.moe, micro_batch=run.routed_micro_batch,
                                                  recompute=run.train.recompute).model
        self.world_size = run.world_size
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
        self.log.emit(STEP, figures.body(), figures.fields())
        self.lined = self.done


class StepResult(NamedTuple):
    loss: torch.Tensor  # 0-d, the mean loss over the micro-batches, still on device
    routing: tuple  # RoutingStats of each MoE layer for the last micro-batch (empty for a dense model)


def train_step(par: Parallelized, batches, precision: str, device: torch.device, probe=None) -> StepResult:
    """One optimizer step over grad_accum micro-batches.
    probe (metrics.memory.ModelStateProbe) is told when the gradients and the optimizer state exist."""
    total = torch.zeros((), device=device)
    routing = None  # MoE routing statistics of the last micro-batch (a pipeline: of this rank's stages)
    if par.pipeline is not None:  # the schedule runs every microbatch's forward and backward
        with autocast(precision, device), par.loss_context():
            total = par.pipeline.forward_backward(batches)
        routing = par.pipeline.routing()
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


def moe_stats(model, routing_by_step: list, all_to_all_share: float | None = None, *,
              ctx: bdist.DistContext | None = None, pipeline=None) -> dict | None:
    """Routing figures of this rank's data-parallel group: the last measured step's (its RoutingStats
    per MoE layer; scalars averaged over MoE layers, per-expert loads per layer) and every measured
    step's expert load [step][MoE layer][expert], read from the device once, after the steps.

    In a pipeline each rank routes its own stages' layers: the figures of every layer are gathered over
    the pipeline group (pipeline: parallel.pipeline.PipelineRun). The ranks of a tensor-parallel group
    route the same tokens and a pipeline's ranks now hold the same figures, so only the first tensor and
    pipeline rank of each data-parallel group (with context parallelism, of each group of context-parallel
    ranks, which route their gathered sequences together) reports loads (zeros elsewhere): the record's sum over
    ranks (assembly.harness.merge_moe_stats) counts every token once; the scalars, the same on each, are
    averaged there."""
    from benchsuite.models.moe import LOAD_STATS, mean_scalars, moe_layers, scalar_rows

    layers = moe_layers(model)
    if not layers and pipeline is None:
        return None
    last = routing_by_step[-1]
    mine = {"ids": pipeline.moe_layer_ids() if pipeline is not None else list(range(len(last))),
            "impl": layers[0].expert_impl if layers else None,
            "scalars": scalar_rows(last),
            "loads": {key: [getattr(r, key).float().tolist() for r in last] for key in LOAD_STATS},
            "by_step": torch.stack([torch.stack([r.expert_load for r in step]) for step in routing_by_step]
                                   ).float().tolist() if last else [[] for _ in routing_by_step]}
    parts = [mine]
    if pipeline is not None and ctx is not None and ctx.world_size > 1:  # every pipeline rank, MoE layers or not
        parts = [None] * ctx.dims.pp
        torch.distributed.all_gather_object(parts, mine, group=ctx.dims.group(PP))
    if not any(part["ids"] for part in parts):
        return None
    order = sorted(((layer_id, part, i) for part in parts for i, layer_id in enumerate(part["ids"])),
                   key=lambda entry: entry[0])  # every MoE layer of the model, in block order
    stats = mean_scalars([part["scalars"][i] for _, part, i in order])
    reports = ctx is None or (ctx.rank % ctx.dims.tp == 0 and ctx.pp_rank == 0 and ctx.dp_rank % ctx.dims.cp == 0)
    keep = (lambda values: values) if reports else (lambda values: [0.0] * len(values))
    for key in LOAD_STATS:
        stats[key] = [keep(part["loads"][key][i]) for _, part, i in order]
    stats["load_by_step"] = [[keep(part["by_step"][step][i]) for _, part, i in order]
                             for step in range(len(routing_by_step))]
    stats["expert_impl"] = next(part["impl"] for part in parts if part["impl"] is not None)
    stats["all_to_all_share"] = all_to_all_share
    return stats


def summary_fields(record: Record, path: Path) -> dict[str, Value]:
    """The log's last line of a run: median tok/s, MFU, energy with its source, CO2e and the record's path,
    each as the record states it (null where it does)."""
    m, energy, carbon = record.metrics, record.energy, record.carbon
    return {"tokens_per_s": m.tokens_per_s if m else None, "mfu": m.mfu if m else None,
            "energy_j": energy.total_j if energy else None, "energy_source": energy.source if energy else None,
            "co2e_g": carbon.co2e_g if carbon else None, "record": str(path)}


FAULT_PHASES = {"raise": "steps", "hang": "steps", "kill": "steps", "segv": "steps",
                "abort_at_exit": "exit", "hang_at_exit": "exit"}


def inject_fault(rank: int, phase: str = "steps") -> None:
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


@dataclass
class Bench:
    """One rank's set-up: the parallel model, its data and its energy monitor."""

    run: RunConfig
    ctx: bdist.DistContext
    par: Parallelized
    source: object  # data.SyntheticSource | data.TokenSource
    monitor: NodeEnergyMonitor
    constants: SuiteConstants = NOT_SHARED  # the suite's host constants (ceiling, idle power), measured once

    @property
    def precision(self) -> str:
        """The compute precision ("auto" resolved) as parallelize applied it: one source for the
        autocast, the matmul ceiling, the peak and the record."""
        return self.par.applied.precision.compute

    def batches(self, step: int) -> list:
        """The rank's micro-batches of one step, on the device. With context parallelism the cp ranks of a
        group share their cp·b sequences, each taking its shard of every sequence (parallel/context.py)."""
        run, ctx, device, cp = self.run, self.ctx, self.ctx.device, self.ctx.dims.cp
        at = None
        if cp > 1:  # this rank's positions of every sequence, the same for each micro-batch
            from benchsuite.parallel.context import shard_positions

            at = shard_positions(ctx.dp_rank % cp, cp, run.model.seq_len)
        out = []
        for micro in range(run.train.grad_accum):
            x, y = self.source.batch(step * run.train.grad_accum + micro, ctx.dp_rank // cp, ctx.dims.dp_batches,
                                     run.micro_batch_per_rank * cp)
            if at is not None:
                x, y = x[:, at], y[:, at]
            out.append((x.to(device, non_blocking=True), y.to(device, non_blocking=True)))
        return out

    def step(self, batches, probe=None) -> StepResult:
        return train_step(self.par, batches, self.precision, self.ctx.device, probe)

    def dp_mean(self, values: list) -> torch.Tensor:
        """Per-rank 0-d tensors stacked and averaged over the data-parallel ranks."""
        out = torch.stack(values)
        if self.ctx.world_size > 1:
            torch.distributed.all_reduce(out, group=self.ctx.dims.group(DP))
            out /= self.ctx.dims.dp
        return out


def set_up(run: RunConfig, ctx: bdist.DistContext, constants: SuiteConstants = NOT_SHARED) -> Bench:
    """Seed, energy monitor (and its idle baseline, before the model touches the device, or the
    suite's, measured by an earlier run), the parallel model and the data source."""
    from benchsuite.data import make_source

    torch.manual_seed(run.train.seed)
    # On GPU the NVML counter is the figure; integrated power samples ride along as its cross-check.
    monitor = NodeEnergyMonitor.create([ctx.device], run.energy, rank=ctx.rank,
                                       sample_power=ctx.device.type == "cuda")
    if run.energy.idle_baseline_s > 0:  # before the model touches the device: a cold, idle GPU
        idle_baseline(monitor, run.energy.idle_baseline_s, constants)
    model = build_model(run.model, run.moe, seed=run.train.seed).to(ctx.device)
    par = parallelize(model, dims=ctx.dims, train=run.train, moe=run.moe, device=ctx.device,
                      pipeline=PipelinePlan.from_run(run) if ctx.dims.pp_enabled else None)
    if run.moe is not None and run.moe.balance == "aux_free":  # once per step, after the last backward
        from benchsuite.models.moe import update_expert_bias

        par.grad_hooks.append(lambda: update_expert_bias(par.model, ctx.dims.group(DP)))
    source = make_source(run.train.data, run.model.vocab, run.model.seq_len, run.train.seed)
    return Bench(run, ctx, par, source, monitor, constants)


def idle_baseline(monitor: NodeEnergyMonitor, seconds: float, constants: SuiteConstants) -> None:
    """The monitor's idle watts: measured here, or the suite's figure for the same devices, host,
    duration and ranks per node, said in the energy reasons."""
    key = {"host": monitor.host, "gpus": [g.uuid for g in monitor.gpu_meters], "seconds": seconds,
           "ranks_on_node": ranks_on_this_node()}
    idle, reuse = constants.reuse_or_measure("idle-power", key, lambda: monitor.measure_idle(seconds))
    if reuse is not None:
        monitor.idle_w = idle
        monitor.notes.append(f"idle baseline {reuse.label()}")


def run_facts(bench: Bench, peak_tflops: float | None) -> RunFacts:
    """Rank 0's facts of the whole run. An unknown peak is warned about here, once."""
    ctx = bench.ctx
    peak, peak_source = fl.peak_flops(device_info(ctx.device)["name"], bench.precision, peak_tflops)
    return RunFacts(world_size=bench.run.world_size, precision=bench.precision, peak_flops=peak,
                    peak_source=peak_source, backend=ctx.backend, shared_device=ctx.shared_device,
                    applied=bench.par.applied, data=bench.source.describe() if bench.run.train.eval_every > 0 else None)


class WarmUp(NamedTuple):
    """What the unmeasured steps measured on this rank."""

    counted_flops: float  # FlopCounterMode over step 0
    model_state: dict  # ModelStateProbe over step 1
    comm: dict  # CommCounter over step 1
    ceiling: MatmulCeiling  # the device's matmul rate, measured after the steps


def header_fields(bench: Bench) -> dict[str, Value]:
    """What the log's header says of the run: the record's config, parameters, layout, precision and
    rank 0's device (each equal to the record's value: metrics.params, metrics.precision, env.devices)."""
    run, par = bench.run, bench.run.parallel
    f = fl.flops_per_token(run.model, run.moe, micro_batch=run.micro_batch_per_rank, recompute=run.train.recompute)
    return {"suite": run.suite, "workload": run.workload, "kind": run.kind, "preset": run.model.preset,
            "params": int(f.params), "active": int(f.params_active), "world": run.world_size, "nodes": run.nodes,
            "layout": f"tp{par.tensor}·pp{par.pipeline}·ep{par.expert}·zero{par.zero}"
                      + (f"·cp{par.context}" if par.context > 1 else "")
                      + (f"·etp{par.expert_tensor}" if par.expert_tensor > 1 else ""), "seed": run.train.seed,
            "precision": bench.precision, "device": device_info(bench.ctx.device)["name"],
            "steps": run.train.steps, "eval_every": run.train.eval_every}


def warm_up(bench: Bench, log: RunLog) -> WarmUp:
    """The unmeasured steps. Step 0 is counted by FlopCounterMode; step 1 measures the model-state
    bytes held and the bytes sent in collectives. Both run eager: a dispatch mode sees every op only
    outside compiled graphs. The remaining steps warm up compile, the allocator and caches; then the
    matmul ceiling is measured on the warm device."""
    par, device, t0 = bench.par, bench.ctx.device, time.perf_counter()
    with fl.flop_counter() as counter, torch.compiler.set_stance("force_eager"):
        bench.step(bench.batches(0))
    probe = mem.ModelStateProbe(par.model, par.optimizer)
    with comm.CommCounter() as comm_counter, torch.compiler.set_stance("force_eager"):
        bench.step(bench.batches(1), probe=probe)
    probe.close()
    steps = unmeasured_steps(bench.run)
    for step in range(2, steps):
        bench.step(bench.batches(step))
    synchronize(device)
    if bench.ctx.is_main:
        seconds, compiled = time.perf_counter() - t0, bench.run.train.compile
        log.emit(WARM_UP, warm_up_body(steps, seconds, compiled), {"steps": steps, "seconds": seconds,
                                                                    "compiled": compiled})
    ceiling = suite_ceiling(bench.constants, device, torch.bfloat16 if bench.precision == "bf16" else torch.float32)
    return WarmUp(counter.get_total_flops(), probe.result(), comm_counter.result(), ceiling)


STAGED_BYTES = 128 * 2**20  # measured batches staged at once (twice that on the device while the next is staged)


class StagedBatches:
    """The measured steps' batches, put on the device before the steps that use them, at most
    STAGED_BYTES at a time: no host-to-device copy (from pageable memory) inside a timed step, and a
    long run does not hold every step's tokens on the device, crowding the model and counting in its
    peak memory. The first chunk is staged at construction; a run whose batches fit is staged whole."""

    def __init__(self, bench: Bench, first: int, steps: int):
        self.bench, self.first, self.steps = bench, first, steps
        one = bench.batches(first)
        size = sum(t.numel() * t.element_size() for micro in one for t in micro)
        self.per_chunk = max(1, min(steps, STAGED_BYTES // max(1, size)))
        self.lo, self.held = 0, [one] + [bench.batches(first + i) for i in range(1, self.per_chunk)]

    def chunks(self, start: int, stop: int):
        """Lists of consecutive measured steps' batches covering [start, stop), each staged (outside any
        timed step: the caller times a chunk at a time) once the previous chunk has run."""
        i = start
        while i < stop:
            if not self.lo <= i < self.lo + len(self.held):
                self.held = []  # the finished chunk's tensors go before the next chunk is staged
                n = min(self.per_chunk, self.steps - i)
                self.lo, self.held = i, [self.bench.batches(self.first + j) for j in range(i, i + n)]
            end = min(stop, self.lo + len(self.held))
            yield self.held[i - self.lo:end - self.lo]
            i = end


def measured_loop(bench: Bench, warm: WarmUp, peak: float | None, log: RunLog) -> RankResult:
    """The measured steps, in energy windows "train-k" between validation points (one window when
    train.eval_every = 0); each evaluation has its own window "eval-k" outside the step timer. The
    record's energy is the training windows summed (energy/windows.py). peak: rank 0's peak
    FLOP/s, for its step lines; rank 0 logs each validation loss after its window."""
    run, ctx, monitor = bench.run, bench.ctx, bench.monitor
    first = unmeasured_steps(run)
    if ctx.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(ctx.device)
    measured = StagedBatches(bench, first, run.train.steps)
    inject_fault(ctx.rank)
    evaluating = run.train.eval_every > 0
    points = qual.eval_points(run.train.steps, run.train.eval_every) if evaluating else [0, run.train.steps]
    val = [(x.to(ctx.device), y.to(ctx.device))
           for x, y in qual.eval_rows(bench.source.val_batches(run.micro_batch_per_rank))] \
        if evaluating else []  # same rows on every rank
    timer = StepTimer(ctx.device)
    step_log = StepLog(run, timer, peak, log) if ctx.is_main else None
    losses, val_losses, train_windows, eval_windows, routing_by_step = [], [], [], [], []

    def evaluate(k: int) -> None:
        monitor.begin(f"eval-{k}")
        val_losses.append(evaluate_loss(bench.par, val, bench.precision, ctx.device))
        eval_windows.append(monitor.end(f"eval-{k}").to_dict())
        if ctx.is_main:  # rank 0's value: every rank evaluates the same rows, so it is the record's mean
            val_loss = val_losses[-1].item()
            log.emit(EVAL, eval_body(k, run.train.steps, val_loss),
                     {"step": k, "steps": run.train.steps, "val_loss": val_loss})

    if evaluating:
        evaluate(0)
    for start, stop in zip(points, points[1:]):
        monitor.begin(f"train-{start}")  # window edges synchronise the device
        for chunk in measured.chunks(start, stop):
            results = timed_steps(timer, bench.step, chunk, step_log)
            losses.extend(r.loss for r in results)
            routing_by_step.extend(r.routing for r in results)
        train_windows.append(monitor.end(f"train-{start}").to_dict())
        if evaluating:
            evaluate(stop)
    energy_window = combine_windows(train_windows, "measure", run.energy.min_window_s)
    quality = None
    if evaluating:  # every rank evaluated the same rows: the data-parallel mean is that value
        quality = RankQuality(points, bench.dp_mean(val_losses).tolist(), train_windows, eval_windows,
                              eval_rows=sum(len(y) for _, y in val), eval_tokens=sum(y.numel() for _, y in val))
    monitor.close()
    if ctx.dims.ep_enabled:  # the dropless all-to-alls' bytes in each measured step: they follow the routing
        from benchsuite.parallel.expert import all_to_all_bytes_by_step
        warm.comm["all_to_all_bytes_by_step"] = all_to_all_bytes_by_step(bench.par.model, last=run.train.steps)
    a2a_share = all_to_all_share(bench.par, bench.batches(first + run.train.steps), bench.precision, ctx.device) \
        if ctx.dims.ep_enabled else None
    par = bench.par
    return RankResult(
        rank=ctx.rank, node_rank=ctx.node_rank, device=device_info(ctx.device), step_times_s=timer.durations_s(),
        losses=bench.dp_mean(losses).tolist(), counted_flops=warm.counted_flops, memory=peak_memory(ctx.device),
        matmul_ceiling_flops=warm.ceiling.flops_per_s, matmul_ceiling_source=warm.ceiling.source,
        model_state=warm.model_state, comm=warm.comm, energy_window=energy_window,
        moe=moe_stats(par.model, routing_by_step, a2a_share, ctx=ctx, pipeline=par.pipeline), quality=quality,
        pipeline=par.pipeline.figures() if par.pipeline is not None else None)


def run_rank(run: RunConfig, ctx: bdist.DistContext, peak_tflops: float | None,
             log: RunLog | None = None, constants: SuiteConstants = NOT_SHARED) -> tuple[RankResult, RunFacts | None]:
    """Everything one rank measures (set up, warm up, the measured steps), and on rank 0 the run's own facts
    (None on other ranks). Rank 0 logs the header first (log: stdout alone by default)."""
    log = log or RunLog(ctx.rank)
    bench = set_up(run, ctx, constants)
    if ctx.is_main:
        log.header(header_fields(bench))
    facts = run_facts(bench, peak_tflops) if ctx.is_main else None
    warm = warm_up(bench, log)
    return measured_loop(bench, warm, facts.peak_flops if facts else None, log), facts


def apply_threads() -> None:
    """The launcher's thread count (launch.thread_plan, passed as OMP_NUM_THREADS), applied to torch
    before anything runs: the count every rank of the sweep gets."""
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))


def launched(spec: dict, started_at: str, t0: float) -> tuple[str, float]:
    """(start, seconds so far) of the run: from the launcher's start when it names one (the launch, the
    process start and torch's import included, as a failed run's record counts them), else from this
    worker's (a rank started without the launcher). Both are perf_counter readings: on Linux its clock
    (CLOCK_MONOTONIC) is one clock for every process of a host, and rank 0 runs on the host of the
    launcher that wrote run.json."""
    t0 = spec.get("launched_monotonic_s", t0)
    return spec.get("launched_at", started_at), time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="benchsuite.worker")
    p.add_argument("workdir", help="the run's folder: run.json in, pid and error files out")
    workdir = Path(p.parse_args(argv).workdir)
    prctl.die_with_parent(signal.SIGKILL)  # torchrun starts ranks in their own sessions
    rank = int(os.environ.get("RANK", "0"))
    (workdir / f"pid.{rank}").write_text(str(os.getpid()))
    started_at, t0 = utc_now(), time.perf_counter()
    log = RunLog(rank)  # stdout alone until run.json names the JSON-lines twin
    try:
        spec = json.loads((workdir / "run.json").read_text())
        log = RunLog(rank, spec.get("log_json"))
        warnings.showwarning = log.showwarning  # a warning is one log line, never a source line
        run = RunConfig.from_dict(spec["run"])
        apply_threads()
        ctx = bdist.init_distributed(run)
        constants = SuiteConstants(Path(spec["suite_constants"]), spec["record_name"]) \
            if spec.get("suite_constants") else NOT_SHARED
        mine, facts = run_rank(run, ctx, spec["peak_tflops"], log, constants)
        ranks = bdist.all_gather_objects(mine, ctx)
        if ctx.is_main:  # repeat: which measurement of the run (launch.plan)
            stamp = Stamp(spec["run_key"], spec.get("repeat", 0), *launched(spec, started_at, t0))
            record = harness_record(run, facts, ranks, stamp)
            log.summary(summary_fields(record, write_record(spec["out"], record)))
        bdist.shutdown()
        inject_fault(rank, phase="exit")
    except BaseException as e:
        err = {"type": type(e).__name__, "message": str(e)[:2000], "rank": rank, "time": time.time_ns(),
               "traceback": traceback.format_exc()[-4000:]}
        (workdir / f"error.{rank}.json").write_text(json.dumps(err))
        log.emit(ERROR, f"{err['type']}: {' '.join(err['message'].split())}",
                 {"type": err["type"], "message": err["message"]})
        traceback.print_exc()
        return 1
    finally:
        log.close()
    return 0


if __name__ == "__main__":
    code = main()
    # Everything is written and closed and the process groups are destroyed (bdist.shutdown collected
    # their cycles): the interpreter's last collection at exit would only walk torch's and torch._dynamo's
    # objects, about 0.4 s of every run on a 2-core box. Frozen objects are left to the process's end.
    gc.freeze()
    sys.exit(code)
