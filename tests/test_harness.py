"""The distributed harness with real processes: DDP numerics, failure isolation, resume, two nodes."""

import json
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import msgspec
import numpy as np
import pytest
import torch

from benchsuite.config import parse_suite
from benchsuite.results.store import load_records
from helpers import free_port, processes_matching, run_cli, spawn

DOC = {"defaults": {"model": {"layers": 2, "hidden": 32, "heads": 2, "vocab": 128, "seq_len": 16},
                    "train": {"micro_batch": 2, "lr": 1e-2, "precision": "fp32"}},
       "workload": [{"name": "dense"}]}


def _train(run, steps, out_file):
    from benchsuite.data import make_source
    from benchsuite.dist import init_distributed, shutdown
    from benchsuite.models.transformer import build_model
    from benchsuite.parallel import parallelize
    from benchsuite.worker import train_step

    torch.set_default_dtype(torch.float64)  # Adam amplifies rounding in near-zero gradients; fp64 removes it
    ctx = init_distributed(run)
    par = parallelize(build_model(run.model, seed=1), dims=ctx.dims, train=run.train, moe=run.moe, device=ctx.device)
    source = make_source("synthetic", run.model.vocab, run.model.seq_len, seed=0)
    accum = run.train.grad_accum
    for step in range(steps):
        micro = [source.batch(step * accum + m, ctx.dp_rank, ctx.dims.dp, run.micro_batch_per_rank)
                 for m in range(accum)]
        train_step(par, micro, "fp32", ctx.device)
    if ctx.rank == 0:
        model = getattr(par.model, "module", par.model)
        np.savez(out_file, **{k: v.detach().numpy() for k, v in model.state_dict().items()})
    shutdown()


def _ddp_rank(rank, world, run_dict, out_file):
    from benchsuite.config import RunConfig

    _train(RunConfig.from_dict(run_dict), 3, out_file)


@pytest.mark.procs
@pytest.mark.parametrize("grad_accum", [1, 2])
def test_ddp_after_k_steps_equals_one_process_on_the_concatenated_batch(tmp_path, grad_accum):
    """With grad_accum 2 DDP skips the all-reduce of the first micro-batch (no_sync): still equal."""
    train = {**DOC["defaults"]["train"], "micro_batch": 4, "grad_accum": grad_accum}
    runs = parse_suite({**DOC, "sweep": {"world_size": [1, 2], "scaling": "strong"},
                        "defaults": {**DOC["defaults"], "train": train}}).runs
    single, ddp = runs
    spawn(_ddp_rank, 1, single.to_dict(), tmp_path / "single.npz")
    spawn(_ddp_rank, 2, ddp.to_dict(), tmp_path / "ddp.npz")
    a, b = np.load(tmp_path / "single.npz"), np.load(tmp_path / "ddp.npz")
    assert set(a.files) == set(b.files)
    for k in a.files:
        np.testing.assert_allclose(b[k], a[k], rtol=1e-6, atol=1e-7, err_msg=k)
    from benchsuite.models.transformer import build_model

    init = build_model(single.model, seed=1).state_dict()
    assert np.abs(a["head.weight"] - init["head.weight"].numpy()).max() > 1e-3  # training moved the weights


def _records(out):
    return {one.record.config.world_size: one.record for one in load_records(out)}


@pytest.mark.procs
def test_a_raising_rank_is_recorded_and_the_suite_goes_on_then_resume_reruns_it(tmp_path, tiny_suite):
    suite = tiny_suite(world_sizes=(2, 1))
    out = tmp_path / "out"
    res = run_cli("run", str(suite), "--out", str(out), "--json", env={"BENCHSUITE_INJECT_FAULT": "raise:1"})
    assert res.returncode == 1
    summary = json.loads(res.stdout)  # --json: stdout is one JSON document
    assert [r["status"] for r in summary["runs"]] == ["failed", "ok"]
    recs = _records(out)
    assert recs[2].status == "failed"
    assert recs[2].error.type == "RuntimeError" and recs[2].error.rank == 1
    assert "injected fault on rank 1" in recs[2].error.message
    assert recs[1].status == "ok" and recs[1].metrics.tokens_per_s > 0

    res = run_cli("run", str(suite), "--out", str(out), "--json")
    assert res.returncode == 0
    assert [r["status"] for r in json.loads(res.stdout)["runs"]] == ["ok", "skipped_recorded"]
    assert _records(out)[2].status == "ok"
    assert len(load_records(out)) == 2  # the ok record replaced the failed one


@pytest.mark.procs
@pytest.mark.parametrize("fault, world, timeout, error_type, words", [
    ("hang:1", 2, 12, "Timeout", "exceeded train.timeout_s = 12 s"),
    ("kill:1", 2, 120, "WorkerKilled", "rank 1 died from SIGKILL"),
    # one rank: the worker is the launched process itself (launch.starts_worker_directly), not a torchrun child
    ("kill:0", 1, 120, "WorkerKilled", "rank 0 died from SIGKILL"),
    ("segv:0", 1, 120, "WorkerKilled", "rank 0 died from SIGSEGV (segmentation fault)"),
    ("raise:0", 1, 120, "RuntimeError", "injected fault on rank 0"),
])
def test_a_killed_or_hanging_run_fails_cleanly_with_no_orphans(tmp_path, tiny_suite, fault, world, timeout,
                                                               error_type, words):
    out = tmp_path / "out"
    suite = tiny_suite(world_sizes=(world,), timeout=timeout)
    t0 = time.perf_counter()
    res = run_cli("run", str(suite), "--out", str(out), "--json", env={"BENCHSUITE_INJECT_FAULT": fault})
    assert res.returncode == 1
    rec = _records(out)[world]
    assert rec.status == "failed" and rec.error.type == error_type and words in rec.error.message
    if fault.startswith("hang"):
        assert time.perf_counter() - t0 < timeout + 30
    assert processes_matching(f"benchsuite-{rec.run_key}") == []


@pytest.mark.procs
@pytest.mark.parametrize("rank, world", [(0, 2), (1, 2), (0, 1)])
def test_a_rank_dying_after_the_record_is_written_keeps_the_record_flagged(tmp_path, tiny_suite, rank, world):
    """A crash in teardown (gloo can SIGABRT at interpreter exit) must not throw away a finished
    measurement: the run stays ok, its figures intact, with a flag saying what happened after."""
    out = tmp_path / "out"
    res = run_cli("run", str(tiny_suite(world_sizes=(world,))), "--out", str(out), "--json",
                  env={"BENCHSUITE_INJECT_FAULT": f"abort_at_exit:{rank}"})
    assert res.returncode == 0, res.stderr
    (summary,) = json.loads(res.stdout)["runs"]
    (one,) = load_records(out)
    rec = one.record
    assert summary["status"] == rec.status == "ok" and rec.error is None
    assert rec.metrics.tokens_per_s > 0 and len(rec.steps) == 3
    (flag,) = [f for f in rec.flags if f.field == "status"]
    assert flag.value == "WorkerKilled" and f"rank {rank} died from SIGABRT" in flag.reason
    assert "after this record was written" in flag.reason
    assert msgspec.to_builtins(flag) in summary["flags"]  # --json says so too


@pytest.mark.procs
def test_two_nodes_on_one_host_make_one_record(tmp_path):
    suite = tmp_path / "two.toml"
    suite.write_text("""
[defaults]
model = { layers = 1, hidden = 32, heads = 2, vocab = 128, seq_len = 16 }
train = { micro_batch = 2, steps = 3, warmup_steps = 2, timeout_s = 120 }
[[workload]]
name = "dense"
[sweep]
world_size = [4]
nodes = [2]
""")
    out, port = tmp_path / "out", free_port()
    cmd = [sys.executable, "-m", "benchsuite.cli", "run", str(suite), "--out", str(out), "--nnodes", "2",
           "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "t"]
    procs = [subprocess.Popen(cmd + ["--node-rank", str(n)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for n in (0, 1)]
    for p in procs:
        p.wait(timeout=240)
    assert [p.returncode for p in procs] == [0, 0]
    (one,) = load_records(out)
    rec = one.record
    assert rec.status == "ok"
    assert rec.env.world_size == 4 and rec.env.nodes == 2
    assert sorted(d.node_rank for d in rec.env.devices) == [0, 0, 1, 1]


TORCHRUN_SEGV_LOG = """
Failures:
[1]:
  time      : 2026-11-29_22:50:01
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 101)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 101
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-29_22:50:00
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -11 (pid: 102)
  error_file: <N/A>
  traceback : Signal 11 (SIGSEGV) received by PID 102
"""


def test_diagnosis_names_the_root_cause_not_the_rank_torchrun_stopped(tmp_path):
    """After rank 1 segfaults torchrun SIGTERMs rank 0: the record must blame rank 1."""
    from benchsuite.launch import diagnose

    err = diagnose(1, tmp_path, TORCHRUN_SEGV_LOG)
    assert (err["type"], err["rank"]) == ("WorkerKilled", 1) and "SIGSEGV" in err["message"]
    (tmp_path / "error.0.json").write_text(json.dumps({"type": "RuntimeError", "message": "gloo: peer closed",
                                                       "rank": 0, "time": 1}))
    assert diagnose(1, tmp_path, TORCHRUN_SEGV_LOG)["rank"] == 1  # a peer's broken collective is a consequence


def test_one_rank_starts_its_worker_directly_and_more_ranks_start_torchrun(tmp_path):
    """A one-rank run pays no torchrun (its own torch import); every other run is torchrun's, and a
    direct worker's signal death is rank 0's."""
    from benchsuite.launch import Rendezvous, diagnose, launch_command

    one, two, two_nodes = (parse_suite(tomllib.loads(f"""
[defaults]
model = {{ layers = 1, hidden = 32, heads = 2, vocab = 128, seq_len = 16 }}
[[workload]]
name = "dense"
sweep = {{ world_size = [{w}], nodes = [{n}] }}
""")).runs[0] for w, n in ((1, 1), (2, 1), (2, 2)))
    rdzv = Rendezvous(nnodes=2, endpoint="h:1")
    worker = ["-m", "benchsuite.worker", str(tmp_path)]
    assert launch_command(one, "k", tmp_path, Rendezvous()) == [sys.executable, *worker]
    for run in (two, two_nodes):
        cmd = launch_command(run, "k", tmp_path, rdzv)
        assert cmd[1:3] == ["-m", "torch.distributed.run"] and cmd[-3:] == worker
    assert diagnose(-9, tmp_path, "", direct=True) == {"type": "WorkerKilled", "rank": 0, "message":
                                                       "rank 0 died from SIGKILL (killed: out of memory or an "
                                                       "external kill)"}
    assert diagnose(3, tmp_path, "", direct=True)["message"] == "rank 0 exited with code 3"


@pytest.mark.procs
def test_runs_left_to_another_node_count_are_listed_not_a_crash(tmp_path, tiny_suite):
    """A suite with nodes = [1, 2] run with --nnodes 1: the one-node run is measured, the two-node
    run is reported as left to another job, in the lines, the summary and --json."""
    suite = tiny_suite(name="mixed", world_sizes=(2,), extra="nodes = [1, 2]\n")
    out = tmp_path / "out"
    res = run_cli("run", str(suite), "--out", str(out), "--nnodes", "1")
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    assert "nodes = 2, left to a job started with --nnodes 2" in res.stderr
    assert "1 ok, 0 failed, 1 left to a job with another --nnodes" in res.stderr
    res = run_cli("run", str(suite), "--out", str(out), "--json")
    assert res.returncode == 0, res.stderr
    runs = json.loads(res.stdout)["runs"]
    assert [r["status"] for r in runs] == ["skipped_recorded", "skipped_other_nodes"]
    assert Path(runs[0]["record"]).is_file() and runs[1]["record"] is None  # the record a skip found, named


def test_every_run_status_has_an_outcome_line_and_a_place_in_the_summary(tiny_suite):
    from benchsuite.commands.run import SUMMARY_WORDS, _outcome_line, _summary_line
    from benchsuite.config import load_suite
    from benchsuite.launch import RunOutcome, RunStatus
    from benchsuite.runlock import Holder

    (run,) = load_suite(tiny_suite()).runs
    error = {"type": "Interrupted", "message": "stopped by SIGTERM", "rank": None}
    lines = {}
    for status in RunStatus:
        if status == RunStatus.OK:
            continue  # an ok line reads the record: covered by the real runs above
        o = RunOutcome(run, "k" * 16, status, "out/r.json", error, holder=Holder(42, "node7"))
        lines[status] = _outcome_line(o)
    assert "being measured by pid 42 on host node7" in lines[RunStatus.SKIPPED_LOCKED]
    assert "interrupted (stopped by SIGTERM); recorded failed" in lines[RunStatus.INTERRUPTED]
    assert ("already recorded in out/r.json (run key kkkkkkkkkkkkkkkk: the same config, hardware and threads per "
            "rank)") in lines[RunStatus.SKIPPED_RECORDED]
    assert "Interrupted: stopped by SIGTERM" in lines[RunStatus.FAILED]
    assert len(set(lines.values())) == len(lines)
    assert set(SUMMARY_WORDS) == {s.value for s in RunStatus}
    outcomes = [RunOutcome(run, "k", s) for s in (RunStatus.SKIPPED_LOCKED, RunStatus.SKIPPED_LOCKED)]
    assert _summary_line(outcomes, 3) == "0 ok, 0 failed, 2 being measured by another launcher, 1 not started"
    kept = RunOutcome(run, "k", RunStatus.FAILED, "out/r.json", error, kept_earlier=True)
    assert "the earlier ok record is kept as the run's result (out/r.json)" in _outcome_line(kept)
