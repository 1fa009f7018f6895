"""The order of worker.run_rank: what happens before the model touches the device, and what is
left out of the timed steps (a tiny real run in this process, world of one)."""

from __future__ import annotations

import warnings

import msgspec

import benchsuite.data
from benchsuite import dist as bdist
from benchsuite import worker
from benchsuite.config import parse_suite
from benchsuite.energy.meters import NodeEnergyMonitor
from benchsuite.assembly import Stamp, harness_record
from benchsuite.record import to_dict


def tiny_run(monkeypatch, energy: dict | None = None):
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")
    doc = {"suite": {"name": "tm"},
           "defaults": {"model": {"layers": 1, "hidden": 16, "heads": 2, "vocab": 64, "seq_len": 8},
                        "train": {"micro_batch": 2, "steps": 4, "warmup_steps": 2, "precision": "fp32"},
                        "energy": energy or {}},
           "workload": [{"name": "dense", "kind": "dense"}]}
    return parse_suite(doc).runs[0]


def test_idle_baseline_is_measured_before_the_model_is_built(monkeypatch):
    """A GPU that has just run warm-up and the matmul burst is hot and draws more than idle."""
    events = []
    build, idle = worker.build_model, NodeEnergyMonitor.measure_idle
    monkeypatch.setattr(worker, "build_model", lambda *a, **kw: events.append("build model") or build(*a, **kw))
    monkeypatch.setattr(NodeEnergyMonitor, "measure_idle",
                        lambda self, s: events.append("idle") or idle(self, s))
    run = tiny_run(monkeypatch, {"idle_baseline_s": 0.05})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "no peak FLOP/s known" for a CPU
        mine, facts = worker.run_rank(run, bdist.init_distributed(run), None)
    assert events == ["idle", "build model"]
    rec = to_dict(harness_record(run, facts, [mine], Stamp("k", 0, "2026-01-01T00:00:00+00:00", 1.0)))
    assert rec["metrics"]["precision_policy"] == {"params": "fp32", "forward_params": "fp32", "compute": "fp32",
                                                  "gradients": "fp32", "residual": "fp32"}


def spy_on_batches(monkeypatch) -> tuple[list, list]:
    """(made, timed): every batch the source makes as (step, inside a timed_steps call), and the number of
    batches of each timed_steps call."""
    made, timed, timing = [], [], []
    make_source, timed_steps = benchsuite.data.make_source, worker.timed_steps

    def spying_source(*args, **kwargs):
        source = make_source(*args, **kwargs)
        batch = source.batch
        source.batch = lambda step, *a, **kw: made.append((step, bool(timing))) or batch(step, *a, **kw)
        return source

    def spying_timed_steps(timer, step, batches, log=None):
        timed.append(len(batches))
        timing.append(True)
        try:
            return timed_steps(timer, step, batches, log)
        finally:
            timing.pop()

    monkeypatch.setattr(benchsuite.data, "make_source", spying_source)
    monkeypatch.setattr(worker, "timed_steps", spying_timed_steps)
    return made, timed


def test_measured_batches_are_made_before_the_timed_steps(monkeypatch):
    """No batch is read or copied to the device inside a timed step: each timed step gets a batch
    that was ready before the first of them, and it is the batch of its step number."""
    made, timed = spy_on_batches(monkeypatch)
    run = tiny_run(monkeypatch)
    mine, _ = worker.run_rank(run, bdist.init_distributed(run), None)
    assert len(mine.step_times_s) == run.train.steps and timed == [run.train.steps]
    assert [step for step, in_timed in made] == list(range(worker.unmeasured_steps(run) + run.train.steps))
    assert not any(in_timed for _, in_timed in made)


def test_a_long_runs_batches_are_staged_in_chunks_each_before_its_steps(monkeypatch):
    """Past STAGED_BYTES the measured batches go to the device a chunk at a time, never inside a timed
    step, each the batch of its step number, and every measured step is timed once."""
    made, timed = spy_on_batches(monkeypatch)
    run = tiny_run(monkeypatch)
    run = msgspec.structs.replace(run, train=msgspec.structs.replace(run.train, steps=5))
    step_bytes = 2 * run.micro_batch_per_rank * run.model.seq_len * 8  # inputs and targets, int64
    monkeypatch.setattr(worker, "STAGED_BYTES", 2 * step_bytes)
    mine, _ = worker.run_rank(run, bdist.init_distributed(run), None)
    assert timed == [2, 2, 1] and len(mine.step_times_s) == 5
    assert [step for step, _ in made] == list(range(worker.unmeasured_steps(run) + 5))
    assert not any(in_timed for _, in_timed in made)


def test_a_rank_returns_a_typed_result_and_rank_0_the_run_facts(monkeypatch):
    """Per-rank figures travel as a RankResult; what holds for the run (precision, what parallelize
    applied, the peak) is rank 0's RunFacts, never part of the gathered result."""
    from dataclasses import fields

    from benchsuite.parallel.zero import precision_policy
    from benchsuite.assembly import RankResult, RunFacts

    run = tiny_run(monkeypatch)
    mine, facts = worker.run_rank(run, bdist.init_distributed(run), 2.0)  # --peak-tflops 2
    assert isinstance(mine, RankResult) and isinstance(facts, RunFacts)
    assert {"precision", "peak_tflops", "impl", "precision_policy"}.isdisjoint(f.name for f in fields(RankResult))
    assert (mine.rank, len(mine.step_times_s), len(mine.losses)) == (0, run.train.steps, run.train.steps)
    assert (facts.peak_flops, facts.peak_source, facts.precision) == (2e12, "given (--peak-tflops)", "fp32")
    assert facts.applied.precision == precision_policy("fp32") and facts.applied.zero_stage == 0
    assert facts.applied.implementation() == {"data": "single process"} and facts.backend is None
    rec = to_dict(harness_record(run, facts, [mine], Stamp("k", 0, "2026-01-01T00:00:00+00:00", 1.0)))
    assert rec["metrics"]["peak_tflops"] == 2.0 and rec["metrics"]["implementation"] == {"data": "single process"}
    assert [s["loss"] for s in rec["steps"]] == mine.losses


def test_the_worker_computes_in_the_precision_parallelize_applied(monkeypatch):
    """One source for the compute precision: parallelize resolves train.precision and records it in
    Applied.precision; the worker's autocast, ceiling, peak and record read that, never a second
    resolution of their own."""
    from dataclasses import replace

    from benchsuite.parallel.zero import precision_policy

    real, casts = worker.parallelize, []

    def applying_bf16(*args, **kwargs):  # as parallelize would resolve "auto" on a GPU
        par = real(*args, **kwargs)
        par.applied = replace(par.applied, precision=precision_policy("bf16"))
        return par

    autocast = worker.autocast
    monkeypatch.setattr(worker, "parallelize", applying_bf16)
    monkeypatch.setattr(worker, "autocast",
                        lambda precision, device: casts.append(precision) or autocast(precision, device))
    run = tiny_run(monkeypatch)  # train.precision = "fp32"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "no peak FLOP/s known" for a CPU
        mine, facts = worker.run_rank(run, bdist.init_distributed(run), None)
    assert facts.precision == "bf16" and facts.applied.precision.compute == "bf16"
    assert casts and set(casts) == {"bf16"}  # every step ran under the applied precision
    rec = to_dict(harness_record(run, facts, [mine], Stamp("k", 0, "2026-01-01T00:00:00+00:00", 1.0)))
    assert rec["metrics"]["precision"] == rec["metrics"]["precision_policy"]["compute"] == "bf16"
