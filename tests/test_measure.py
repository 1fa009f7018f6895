"""The order of worker.measure: what happens before the model touches the device, and what is
left out of the timed steps (a tiny real run in this process, world of one)."""

from __future__ import annotations

import warnings

import benchsuite.data
from benchsuite import dist as bdist
from benchsuite import worker
from benchsuite.config import parse_suite
from benchsuite.energy.meters import NodeEnergyMonitor


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
    mine = worker.measure(run, bdist.init_distributed(run), None)
    assert events == ["idle", "build model"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "no peak FLOP/s known" for a CPU
        rec = worker.build_record(run, "k", [mine], bdist.init_distributed(run), "now", 1.0)
    assert rec["metrics"]["precision_policy"] == {"params": "fp32", "forward_params": "fp32", "compute": "fp32",
                                                  "gradients": "fp32", "residual": "fp32"}


def test_measured_batches_are_made_before_the_timed_steps(monkeypatch):
    """No batch is read or copied to the device inside a timed step: each timed step gets a batch
    that was ready before the first of them, and it is the batch of its step number."""
    made, timing = [], []
    make_source = benchsuite.data.make_source

    def spying_source(*args, **kwargs):
        source = make_source(*args, **kwargs)
        batch = source.batch
        source.batch = lambda step, *a, **kw: made.append((step, bool(timing))) or batch(step, *a, **kw)
        return source

    timed_steps = worker.timed_steps

    def spying_timed_steps(timer, step, batches, log=None):
        timing.append(len(batches))
        try:
            return timed_steps(timer, step, batches, log)
        finally:
            timing.clear()

    monkeypatch.setattr(benchsuite.data, "make_source", spying_source)
    monkeypatch.setattr(worker, "timed_steps", spying_timed_steps)
    run = tiny_run(monkeypatch)
    mine = worker.measure(run, bdist.init_distributed(run), None)
    assert len(mine["step_times_s"]) == run.train.steps
    assert [step for step, in_timed in made] == list(range(worker.unmeasured_steps(run) + run.train.steps))
    assert not any(in_timed for _, in_timed in made)
