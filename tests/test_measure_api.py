"""benchsuite.measure(): the user's own loop measured with the harness's meters, timing and record, read by
every view as any run (benchsuite/measuring.py, benchsuite/adapters.py)."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

import benchsuite
from benchsuite import cli
from benchsuite import assembly
from benchsuite import dist as bdist
from benchsuite import worker
from benchsuite.config import ConfigError, parse_suite
from benchsuite.energy.meters import NodeEnergyMonitor
from benchsuite.record import to_dict
from benchsuite.results.model import results_at

from helpers import REPO, runs_rows
from helpers.launcher import strict_load
from helpers.user_loop import MICRO_BATCH, MODEL, WATTS, ClockedGpu, synthetic_meters, train

FIXTURES = Path(__file__).parent / "fixtures" / "results"
BUILT_IN = FIXTURES / "smoke__dense-tiny__w1n1-weak__ee7bbe62e331231c.json"


@pytest.fixture(autouse=True)
def one_rank_one_thread(monkeypatch):
    """A world of one on one thread (as the launcher gives each rank its own: two threads contending for a
    busy 2-core box stall steps by half a second). A CPU has no datasheet peak: measure() warns about it as
    the harness does; said once here, not tested."""
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="no peak FLOP/s")
        yield
    torch.set_num_threads(threads)


@pytest.fixture
def synthetic(monkeypatch):
    """Every monitor measure() makes reads the synthetic meters."""
    synthetic_meters(monkeypatch)


def user_record(out: Path, name: str = "user-gpt", steps: int = 4, **kwargs) -> dict:
    """A measured plain loop over the built-in GPT in this process: its record."""
    kwargs = {"tokens_per_step": MICRO_BATCH * MODEL.seq_len, "energy": {"min_window_s": 0}, **kwargs}
    with benchsuite.measure(name, out=out, **kwargs) as m:
        train(m, steps)
    return to_dict(m.record)


# -- against the harness -------------------------------------------------------------------------


def harness_record(steps: int) -> dict:
    """The harness's record of the loop's model, batch and step count (worker.run_rank in this process)."""
    doc = {"suite": {"name": "cmp"},
           "defaults": {"model": {"layers": MODEL.layers, "hidden": MODEL.hidden, "heads": MODEL.heads,
                                  "vocab": MODEL.vocab, "seq_len": MODEL.seq_len},
                        "train": {"micro_batch": MICRO_BATCH, "steps": steps, "warmup_steps": 2, "precision": "fp32"},
                        "energy": {"min_window_s": 0}},
           "workload": [{"name": "dense", "kind": "dense"}]}
    run = parse_suite(doc).runs[0]
    mine, facts = worker.run_rank(run, bdist.init_distributed(run), None)
    return to_dict(assembly.harness_record(run, facts, [mine], assembly.Stamp("k", 0, "2026-12-02T00:00:00+00:00",
                                                                              1.0)))


def test_a_measured_plain_loop_records_what_the_harness_records_of_the_same_model(tmp_path):
    steps = 12
    ref = harness_record(steps)
    per_token = ref["metrics"]["flops"]["model_per_token"]
    rec = user_record(tmp_path, steps=steps + 2, warmup_steps=2, flops_per_token=per_token,
                      description="plain loop, built-in GPT")
    m, r = rec["metrics"], ref["metrics"]
    assert rec["config"]["kind"] == "user" and rec["config"]["description"] == "plain loop, built-in GPT"
    assert rec["config"]["model"] is None and rec["config"]["train"] is None
    assert len(rec["steps"]) == steps and all(s["loss"] > 0 for s in rec["steps"])
    assert m["flops"]["model_per_token"] == per_token
    assert m["tokens_per_step"] == r["tokens_per_step"]
    # the harness's formula on the loop's own steps (how fast the two are is a benchmark's question,
    # benchmarks/bench_measure.py: on a shared 2-core box a burst slowed one side 2.8× in a full test pass)
    assert m["tokens_per_s"] == m["tokens_per_step"] / m["step_time_s"]["median"]
    assert m["step_time_s"]["median"] == statistics.median(s["time_s"] for s in rec["steps"])
    assert m["precision"] == r["precision"] == "fp32"
    # the same source, each naming its own way to give a peak (the harness's flag, measure()'s argument)
    assert m["peak_source"] == r["peak_source"].replace("--peak-tflops", "measure(peak_tflops=)")
    assert m["mfu"] is r["mfu"] is None
    for key in ("source", "sources", "total_includes", "reasons"):
        assert rec["energy"][key] == ref["energy"][key], key
    for part in ("cpu", "dram"):
        assert rec["energy"]["per_node"][0][part]["source"] == ref["energy"]["per_node"][0][part]["source"]
    assert m["energy"]["energy_source"] == r["energy"]["energy_source"]
    assert m["energy"]["gpu_j_per_token_reason"] == r["energy"]["gpu_j_per_token_reason"]
    assert {k: rec["carbon"][k] for k in ("intensity_source", "pue")} == \
        {k: ref["carbon"][k] for k in ("intensity_source", "pue")}
    assert rec["flags"] == []


def test_what_the_loop_did_not_tell_is_null_with_its_reason(tmp_path):
    rec = user_record(tmp_path, tokens_per_step=None)
    m = rec["metrics"]
    assert m["flops"]["model_per_token"] is None and m["mfu"] is None and m["tflops_per_device"] is None
    assert m["tokens_per_s"] is None and m["energy"]["j_per_token"] is None
    assert m["step_time_s"]["n"] == 4
    said = " ".join(m["reasons"])
    assert "flops_per_token" in said and "tokens_per_step" in said and "hardware_per_token" in said
    assert rec["energy"]["total_j"] is not None  # energy needs no tokens


def test_mfu_from_the_given_flops_and_peak(tmp_path):
    rec = user_record(tmp_path, flops_per_token=1e6, peak_tflops=1.0)
    m = rec["metrics"]
    assert m["mfu"] == pytest.approx(1e6 * m["tokens_per_s"] / 1e12)
    assert m["peak_source"] == "given (measure(peak_tflops=))"  # the fix a user of measure() can apply
    assert not any("MFU is null" in why for why in m["reasons"])


def test_step_tokens_and_device_tensors_are_read_at_the_end(tmp_path):
    with benchsuite.measure("tokens", out=tmp_path, energy={"min_window_s": 0}) as m:
        for n in (100, 300):
            m.step(tokens=torch.tensor(n), loss=torch.tensor(2.5))
    steps = m.record.steps
    assert [s.tokens for s in steps] == [100, 300] and [s.loss for s in steps] == [2.5, 2.5]
    assert m.record.metrics.tokens_per_step == 200


def test_a_step_never_touches_the_meters(tmp_path, synthetic, monkeypatch):
    """Window edges synchronise the device; a step is a timer mark only."""
    edges = []
    begin, end = NodeEnergyMonitor.begin, NodeEnergyMonitor.end
    monkeypatch.setattr(NodeEnergyMonitor, "begin", lambda self, n: edges.append(n) or begin(self, n))
    monkeypatch.setattr(NodeEnergyMonitor, "end", lambda self, n: edges.append(n) or end(self, n))
    with benchsuite.measure("edges", out=tmp_path) as m:
        for _ in range(50):
            m.step(tokens=1)
    assert edges == ["__train-0", "__train-0"]
    assert m.record.metrics.step_time_s.n == 50


def test_warm_up_steps_are_left_out_of_steps_and_energy(tmp_path, synthetic):
    with benchsuite.measure("warm", out=tmp_path, tokens_per_step=10, warmup_steps=2) as m:
        time.sleep(0.2)  # "compilation", in the first warm-up step
        for _ in range(5):
            m.step()
    rec = m.record
    assert len(rec.steps) == 3 and rec.energy.window_s < 0.15


def test_measure_refuses_bad_settings_before_anything_runs():
    with pytest.raises(ConfigError, match="carbon.country"):
        benchsuite.measure("x", carbon={"country": "Atlantis"})
    with pytest.raises(ConfigError, match="carbon.pue"):
        benchsuite.measure("x", carbon={"pue": 0.5})
    with pytest.raises(ConfigError, match="carbon.colour"):
        benchsuite.measure("x", carbon={"colour": "green"})
    with pytest.raises(ValueError, match="flops_per_token"):
        benchsuite.measure("x", flops_per_token=-1)
    with pytest.raises(ValueError, match="precision"):
        benchsuite.measure("x", precision="fp8")
    with pytest.raises(ValueError, match="name"):
        benchsuite.measure("")


def test_carbon_settings_as_a_suite_gives_them(tmp_path, synthetic):
    with benchsuite.measure("fr", out=tmp_path, tokens_per_step=10, carbon={"country": "FRA", "pue": 1.2}) as m:
        m.step()
    carbon = m.record.carbon
    assert carbon.pue == 1.2 and carbon.intensity_source == "codecarbon:global_energy_mix:FRA"
    kwh = m.record.energy.total_j / 3.6e6
    assert carbon.co2e_g == pytest.approx(kwh * 1.2 * carbon.intensity_g_per_kwh)


# -- windows -------------------------------------------------------------------------------------


def test_an_outer_window_is_the_sum_of_its_parts_and_the_gaps(tmp_path, synthetic):
    with benchsuite.measure("nest", out=tmp_path) as m:
        m.begin("outer")
        time.sleep(0.03)
        with m.window("a"):
            time.sleep(0.05)
        time.sleep(0.03)
        with m.window("b"):
            with m.window("b.inner"):
                time.sleep(0.05)
        time.sleep(0.03)
        outer = m.end("outer")
    a, b = (w for w in m.windows if w.name in ("a", "b"))
    gaps_s = outer.seconds - a.seconds - b.seconds
    assert outer.total_j == pytest.approx(a.total_j + b.total_j + WATTS * gaps_s, rel=0.01)
    assert outer.energy["gpu_j"] == pytest.approx(300.0 * outer.seconds, rel=0.01)
    assert outer.source == "measured" and outer.energy["per_device"][0]["uuid"] == ClockedGpu.uuid
    assert [w.name for w in m.windows] == ["a", "b.inner", "b", "outer"]
    # each window's bound holds its figure; these sub-second windows cannot resolve 2 % (min_window_s = 0 here,
    # so it is their share that flags them)
    assert all(w.bound["low_j"] <= w.total_j <= w.bound["high_j"] and w.bound["exceeds"] for w in m.windows)
    assert outer.bound["reason"].startswith("the meters' bound is ±")


def test_a_window_outside_training_is_in_no_step_and_not_in_the_record_energy(tmp_path, synthetic):
    with benchsuite.measure("eval", out=tmp_path, tokens_per_step=10) as m:
        for i in range(4):
            time.sleep(0.01)
            m.step()
            if i == 1:
                with m.window("eval", training=False):
                    time.sleep(0.3)
    rec, evaluation = to_dict(m.record), m.windows[0]
    assert max(s["time_s"] for s in rec["steps"]) < 0.2
    assert rec["energy"]["total_j"] == pytest.approx(WATTS * rec["energy"]["window_s"], rel=0.01)
    assert rec["energy"]["window_s"] < 0.25 and evaluation.seconds >= 0.3
    assert any("outside training (eval" in why for why in rec["energy"]["reasons"])
    assert rec["metrics"]["energy"]["j_per_token"] == pytest.approx(rec["energy"]["total_j"] / 40)


def test_window_misuse_is_refused(tmp_path, synthetic):
    with benchsuite.measure("misuse", out=tmp_path) as m:
        m.begin("w")
        with pytest.raises(ValueError, match="already open"):
            m.begin("w")
        with pytest.raises(ValueError, match="benchsuite's own"):
            m.begin("__train-0")
        with m.window("eval", training=False):
            with pytest.raises(RuntimeError, match="outside training"):
                m.step()
            with pytest.raises(ValueError, match="also outside"):
                m.begin("save", training=False)
    assert [w.name for w in m.windows] == ["eval", "w"]  # a window left open ends with the job


# -- several ranks -------------------------------------------------------------------------------


def two_ranks(out: Path, steps: int) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(REPO / "tests" / "helpers" / "user_loop.py"), str(out), str(steps)],
                          capture_output=True, text=True, timeout=300, cwd=REPO,
                          env={k: v for k, v in os.environ.items()
                               if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")} | {"OMP_NUM_THREADS": "1"})


@pytest.mark.procs
def test_two_gloo_ranks_under_torchrun_write_one_record(tmp_path):
    done = two_ranks(tmp_path, 5)
    assert done.returncode == 0, done.stderr[-3000:]
    records = [one.record for one in strict_load(tmp_path).values()]
    assert len(records) == 1 and len(list(tmp_path.glob("*.json"))) == 1
    rec = records[0]
    assert rec.config.world_size == 2 and rec.env.backend == "gloo"
    assert [d.rank for d in rec.env.devices] == [0, 1]
    assert len(rec.metrics.per_rank.step_time_median_s) == 2 and len(rec.steps) == 5
    (node,) = rec.energy.per_node  # one host: its CPU and DRAM counted once, read by one rank
    assert node.ranks == [0, 1] and node.cpu.reading_rank == 0
    assert rec.metrics.tokens_per_step == 2 * MICRO_BATCH * MODEL.seq_len


def test_each_physical_gpu_counts_once_whichever_ranks_share_it(tmp_path, synthetic):
    """Two ranks on one GPU (by UUID): one device in the energy, and no speed figure."""
    from benchsuite.measuring import shares_a_gpu

    with benchsuite.measure("shared", out=tmp_path, tokens_per_step=10) as m:
        m.step()
    device = {"host": "h", "type": "cuda", "name": "synthetic GPU", "uuid": ClockedGpu.uuid, "index": 0,
              "cpu_threads": 1}
    memory = {"peak_allocated_bytes": 1, "peak_reserved_bytes": 2, "source": "torch.cuda"}
    ranks = [assembly.RankResult(rank, 0, device, [0.01], [None], memory, {**m._segments[0], "rank": rank},
                                 tokens=[None]) for rank in (0, 1)]
    facts = assembly.RunFacts(2, "fp32", None, "none", "gloo", shared_device=shares_a_gpu(ranks))
    rec = to_dict(assembly.user_record(m.loop, facts, ranks, started_at=m.started_at, duration_s=1.0))
    (gpu,) = rec["energy"]["per_device"]
    assert gpu["ranks"] == [0, 1] and rec["energy"]["gpu_j"] == gpu["energy_j"]
    assert rec["metrics"]["speed_valid"] is False and rec["env"]["gpu_count"] == 1


# -- every view ----------------------------------------------------------------------------------


@pytest.mark.heavy  # in this process, a second or more: the full pass runs it, the fast tier does not
def test_every_view_reads_a_user_run_beside_built_in_runs(tmp_path, capsys):
    folder, other = tmp_path / "results", tmp_path / "other"
    folder.mkdir()
    shutil.copy(BUILT_IN, folder)
    first = user_record(folder, "my-loop")
    user_record(other, "my-loop")
    capsys.readouterr()

    assert cli.main(["report", str(folder)]) == 0
    assert "my-loop" in capsys.readouterr().out
    assert cli.main(["report", str(folder), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {"user", "dense"} <= {r["kind"] for r in (rows["runs"] if isinstance(rows, dict) else rows)}

    site = tmp_path / "site"
    assert cli.main(["dashboard", str(folder), "-o", str(site)]) == 0
    table = json.dumps(runs_rows(site))
    assert "my-loop" in table and "dense-tiny" in table and "your loop" in table
    page = next((site / "runs").glob(f"{first['run_key']}*.html")).read_text(encoding="utf-8")
    assert "my-loop" in page and "not known" in page and "hardware_per_token" in page

    assert cli.main(["compare", str(folder), str(other)]) == 0
    assert "my-loop" in capsys.readouterr().out

    csv = tmp_path / "emissions.csv"
    assert cli.main(["export", str(folder), "-o", str(csv)]) == 0
    assert "my-loop" in csv.read_text(encoding="utf-8")

    assert cli.main(["carbon", "project", str(folder / next(p.name for p in folder.glob("user__*"))),
                     "--tokens", "1e9", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)

    loaded = benchsuite.load(folder)
    assert set(loaded["kind"].astype(str)) == {"dense", "user"}


def test_measuring_a_loop_again_adds_a_repeat_of_its_run(tmp_path):
    for _ in range(2):
        user_record(tmp_path, "again", steps=2)
    results = results_at(tmp_path)
    assert sorted(results.df["repeat"]) == [0, 1]
    assert len(results.runs) == 1 and int(results.runs["repeats"][0]) == 2


# -- adapters ------------------------------------------------------------------------------------


def test_the_hugging_face_callback_measures_the_trainer_steps(tmp_path):
    """The Trainer's own dispatcher (CallbackHandler) calls the callback in the Trainer's order; a real
    Trainer needs accelerate, which is not installed here."""
    pytest.importorskip("transformers")
    from transformers import TrainerControl, TrainerState
    from transformers.trainer_callback import CallbackHandler

    from benchsuite.adapters import MeasureCallback

    callback = MeasureCallback("hf-loop", out=tmp_path, flops_per_token=1e6, energy={"min_window_s": 0})
    handler = CallbackHandler([callback], None, None, None, None)
    state, control = TrainerState(), TrainerControl()
    handler.on_train_begin(None, state, control)
    for step in range(3):
        handler.on_step_begin(None, state, control)
        time.sleep(0.01)
        state.num_input_tokens_seen += 64 * (step + 1)  # as the Trainer counts them, every process's
        state.global_step += 1
        handler.on_step_end(None, state, control)
        time.sleep(0.05)  # logging, evaluation, checkpointing: between steps, in none
    handler.on_train_end(None, state, control)
    rec = to_dict(callback.measurement.record)
    assert [s["tokens"] for s in rec["steps"]] == [64, 128, 192]
    assert max(s["time_s"] for s in rec["steps"]) < 0.05
    assert rec["workload"] == "hf-loop" and rec["config"]["kind"] == "user"
    assert rec["metrics"]["flops"]["model_per_token"] == 1e6


def test_benchsuite_measure_is_the_function_whatever_was_imported_first(tmp_path):
    """The adapters import benchsuite.measuring: the package's `measure` stays the function."""
    import benchsuite.adapters  # noqa: F401

    assert isinstance(benchsuite.measure("b", out=tmp_path), benchsuite.Measurement)


@pytest.mark.cuda
def test_on_a_gpu_the_nvml_counter_of_the_device_is_the_figure(tmp_path):
    """The harness's GPU meter: NVML's counter, found by the device's UUID; steps timed by CUDA events."""
    with benchsuite.measure("gpu", out=tmp_path, tokens_per_step=2048, energy={"min_window_s": 0}) as m:
        x = torch.randn(2048, 2048, device="cuda")
        for _ in range(20):
            x = torch.tanh(x @ x)
            m.step()
    rec = to_dict(m.record)
    (gpu,) = rec["energy"]["per_device"]
    assert gpu["uuid"] == rec["env"]["devices"][0]["uuid"] and gpu["source"] in ("measured", "sampled")
    assert rec["metrics"]["step_time_s"]["n"] == 20 and rec["metrics"]["precision"] == "bf16"
