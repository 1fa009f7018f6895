"""Fair scaling figures: the thread rule (every run of a sweep gets the same threads per rank, applied
in the rank and recorded), baselines that share config, hardware and threads (repeats → median,
none → null with a reason), superlinear efficiency flagged, and a matmul ceiling measured by a
time-based best-of loop that is blamed (not the run) when a run outpaces it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from benchsuite import cli
from benchsuite.config import ConfigError, parse_suite
from benchsuite.launch import Threads, host_cores, thread_plan, worker_env
from benchsuite.metrics import ceiling as ce
from benchsuite.record import SCHEMA_VERSION, write_record
from benchsuite.results import migrate
from benchsuite.results.migrate import upgrade_v1_env
from benchsuite.results.model import results_at
from benchsuite.results.scaling import BASELINE
from benchsuite.results.store import load_records
from helpers import REPO
from helpers.records import typed

# ----------------------------------------------------------------------------- thread rule


def _suite(sweeps: dict[str, dict]):
    doc = {"suite": {"name": "t"}, "workload": [{"name": name, "kind": "dense", "sweep": sweep}
                                                 for name, sweep in sweeps.items()]}
    return parse_suite(doc)


def test_every_run_of_a_sweep_gets_cores_over_the_sweeps_largest_ranks_per_node():
    suite = _suite({"a": {"world_size": [1, 2, 4]}, "b": {"world_size": [1]},
                    "c": {"world_size": [2, 8], "nodes": [2]}, "d": {"world_size": [1, 64]}})
    plan = thread_plan(suite.runs, cores=16, environ={})
    assert plan == {"t/a/weak": Threads(4, "sweep rule"), "t/b/weak": Threads(16, "sweep rule"),
                    "t/c/weak": Threads(4, "sweep rule"),  # 8 ranks on 2 nodes: 4 per node
                    "t/d/weak": Threads(1, "sweep rule")}  # never below one
    envs = {run.world_size: worker_env(run, plan[run.sweep_id])["OMP_NUM_THREADS"]
            for run in suite.runs if run.workload == "a"}
    assert envs == {1: "4", 2: "4", 4: "4"}  # the old rule gave 16, 8, 4


@pytest.mark.procs
def test_a_users_omp_num_threads_wins_and_a_bad_one_is_refused_before_anything_runs(tmp_path):
    suite = _suite({"a": {"world_size": [1, 2]}})
    assert set(thread_plan(suite.runs, cores=16, environ={"OMP_NUM_THREADS": "3"}).values()) == \
        {Threads(3, "OMP_NUM_THREADS from the user")}
    for bad in ("abc", "0", "-2", ""):
        with pytest.raises(ConfigError, match="OMP_NUM_THREADS"):
            thread_plan(suite.runs, environ={"OMP_NUM_THREADS": bad})
    (tmp_path / "s.toml").write_text('[suite]\nname = "s"\n[[workload]]\nname = "w"\n')
    res = subprocess.run([sys.executable, "-m", "benchsuite.cli", "run", str(tmp_path / "s.toml"), "--out",
                          str(tmp_path / "out")], capture_output=True, text=True, timeout=120, cwd=REPO,
                         env={**os.environ, "OMP_NUM_THREADS": "many"})
    assert res.returncode == 2 and "OMP_NUM_THREADS: must be a positive integer" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr and not list((tmp_path / "out").glob("*.json"))


TINY = """
[suite]
name = "threads"
[defaults]
model = { layers = 1, hidden = 32, heads = 2, vocab = 128, seq_len = 16 }
train = { micro_batch = 2, steps = 2, warmup_steps = 2, timeout_s = 240 }
[[workload]]
name = "dense"
[sweep]
world_size = WORLDS
"""


def _run(tmp_path, worlds, omp: str | None):
    suite, out = tmp_path / f"s{len(worlds)}.toml", tmp_path / f"out{len(worlds)}"
    suite.write_text(TINY.replace("WORLDS", str(worlds)))
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    if omp:
        env["OMP_NUM_THREADS"] = omp
    res = subprocess.run([sys.executable, "-m", "benchsuite.cli", "run", str(suite), "--out", str(out)],
                         capture_output=True, text=True, timeout=600, cwd=REPO, env=env)
    assert res.returncode == 0, res.stderr
    return {one.record.config.world_size: one.record for one in load_records(out)}


@pytest.mark.procs
def test_each_rank_runs_with_the_recorded_thread_count(tmp_path):
    """devices[].cpu_threads is torch.get_num_threads() read inside each rank: the record's
    env.threads_per_rank is what every rank had, at both world sizes."""
    recs = _run(tmp_path, [1, 2], omp=None)
    expected = max(1, host_cores() // 2)
    for world, rec in recs.items():
        assert rec.env.threads_per_rank == expected and rec.env.threads_source == "sweep rule"
        assert [d.cpu_threads for d in rec.env.devices] == [expected] * world
    user = _run(tmp_path, [1], omp="3")[1]
    assert user.env.threads_per_rank == 3 and user.env.devices[0].cpu_threads == 3
    assert user.env.threads_source == "OMP_NUM_THREADS from the user"
    assert "3 thread(s)" in user.metrics.matmul_ceiling_source  # the ceiling ran with the rank's threads


def test_upgrade_v1_env_keeps_the_threads_old_records_measured_or_says_why_not():
    old = {"env": {"devices": [{"cpu_threads": 2}, {"cpu_threads": 2}]}}
    assert upgrade_v1_env(old)["env"]["threads_per_rank"] == 2
    assert "cpu_threads" in old["env"]["threads_source"]
    for env in ({"devices": [{"cpu_threads": None}]}, {"devices": [{"cpu_threads": 1}, {"cpu_threads": 2}]},
                {"hardware": {"cpu": "x"}}):
        rec = upgrade_v1_env({"env": env})
        assert rec["env"]["threads_per_rank"] is None and rec["env"]["threads_source"].startswith("not recorded")
    new = {"env": {"threads_per_rank": 4, "threads_source": "sweep rule"}}
    assert upgrade_v1_env(json.loads(json.dumps(new))) == new


# ----------------------------------------------------------------------------- baselines

CPU_A, CPU_B = "AMD EPYC 7B13", "Intel Xeon 8480"


def rec(key, world, tokens_per_s=100.0, step=1.0, scaling="weak", hidden=64, cpu=CPU_A, threads=1,
        status="ok", seed=0):
    cfg = {"suite": "s", "workload": "w", "kind": "dense", "world_size": world, "nodes": 1, "scaling": scaling,
           "sweep_id": f"s/w/{scaling}", "description": f"run {key}",
           "model": {"layers": 2, "hidden": hidden, "heads": 4}, "train": {"micro_batch": 8, "seed": seed}}
    return typed({"schema_version": SCHEMA_VERSION, "run_key": key, "suite": "s", "workload": "w", "status": status,
            "error": None if status == "ok" else {"type": "X", "message": "x", "rank": 0},
            "started_at": f"2026-01-01T00:00:{len(key):02d}+00:00", "duration_s": 1.0, "config": cfg,
            "env": {"devices": [{"type": "cpu", "name": cpu, "rank": r} for r in range(world)],
                    "threads_per_rank": threads, "threads_source": "sweep rule"},
            "metrics": {"tokens_per_s": tokens_per_s, "mfu": None,
                        "step_time_s": {"median": step, "p10": step, "p90": step, "ci95": [step, step]}}
            if status == "ok" else None,
            "energy": None, "carbon": None, "steps": []})


def frame(tmp_path, *records):
    """One row per record, each with its run's efficiency, baseline and run-level flags."""
    for r in records:
        write_record(tmp_path, r)
    return results_at(tmp_path).df.set_index("run_key")


def test_a_baseline_from_other_hardware_or_another_config_is_ignored(tmp_path):
    df = frame(tmp_path, rec("other-cpu", 1, tokens_per_s=400.0, cpu=CPU_B),
               rec("other-hidden", 1, tokens_per_s=50.0, hidden=128),
               rec("same", 1, tokens_per_s=100.0), rec("w2", 2, tokens_per_s=150.0))
    assert df.loc["w2", "scaling_efficiency"] == pytest.approx(150 / (2 * 100))
    assert df.loc["w2", "scaling_baseline_identities"] == [df.loc["same", "identity"]]
    assert df.loc["w2", "scaling_baseline"] == df.loc["same", "label"]
    # each 1-device run is its own baseline, shown as the baseline: the others differ in hardware or config
    for key in ("other-cpu", "other-hidden", "same"):
        assert df.loc[key, "scaling_efficiency"] == 1.0 and df.loc[key, "scaling_baseline"] == BASELINE
    assert len({df.loc[k, "label"] for k in ("other-cpu", "other-hidden", "same")}) == 3  # told apart


@pytest.mark.parametrize("base, reason", [
    (dict(cpu=CPU_B), "no 1-device run of this sweep with the same hardware"),
    (dict(hidden=128), "no 1-device run of this sweep with the same config"),
    (dict(threads=2), "no 1-device run of this sweep with the same threads per rank"),
    (dict(status="failed"), "no successful 1-device run in this sweep"),
])
def test_no_qualifying_baseline_gives_null_efficiency_with_the_reason(tmp_path, base, reason):
    df = frame(tmp_path, rec("base", 1, **base), rec("w2", 2, tokens_per_s=150.0))
    assert df.loc["w2", "scaling_efficiency"] != df.loc["w2", "scaling_efficiency"]  # NaN: null
    assert df.loc["w2", "scaling_efficiency_reason"] == reason
    assert df.loc["w2", "scaling_baseline_identities"] is None


def test_a_baseline_run_is_its_median_and_each_of_its_repeats_shows_the_run_not_a_ratio_to_it(tmp_path):
    """Records of one config on one machine are one run: its figure is their median, and every record of
    the 1-device run shows the baseline (once each repeat was divided by the median: 90 %, 130 %)."""
    weak = [rec(f"b{i}", 1, tokens_per_s=t) for i, t in enumerate((90.0, 100.0, 130.0))]
    strong = [rec(f"s{i}", 1, step=t, scaling="strong") for i, t in enumerate((2.0, 1.0, 1.2, 5.0))]
    df = frame(tmp_path, *weak, *strong, rec("w2", 2, tokens_per_s=180.0),
               rec("st2", 2, step=0.8, scaling="strong"))
    assert df.loc["w2", "scaling_efficiency"] == pytest.approx(180 / (2 * 100))
    assert df.loc["st2", "scaling_efficiency"] == pytest.approx(1.6 / (2 * 0.8))  # median of 1.0, 1.2, 2.0, 5.0
    assert df.loc["w2", "scaling_baseline_identities"] == [df.loc["b0", "identity"]]
    for key in ("b0", "b1", "b2"):
        assert df.loc[key, "scaling_efficiency"] == 1.0 and df.loc[key, "scaling_baseline"] == BASELINE
    # 90–130 tok/s between repeats (CV 19 %) is a noisy measurement, flagged on the run and its records
    assert [f["field"] for f in df.loc["b2", "flags"]] == ["repeats"]
    assert "noisy measurement" in df.loc["b2", "flags"][0]["reason"] and "90–130 tok/s" in df.loc["b2", "flags"][0]["reason"]
    assert not bool(df.loc["w2", "flagged"])


def test_a_baseline_over_seeds_is_the_median_of_each_seeds_median(tmp_path):
    base = [{**rec("b", 1, tokens_per_s=t), "repeat": i} for i, t in enumerate((90.0, 130.0, 100.0))]
    for r in [*base, rec("w2", 2, tokens_per_s=180.0)]:
        write_record(tmp_path, r)
    (w2,) = results_at(tmp_path).df.query("run_key == 'w2'").to_dict("records")
    assert w2["scaling_efficiency"] == pytest.approx(180 / (2 * 100))  # the median of the three repeats
    write_record(tmp_path, rec("c", 1, tokens_per_s=130.0, seed=1))  # seed 1 of the same run
    results = results_at(tmp_path)
    (w2,) = results.df.query("run_key == 'w2'").to_dict("records")
    assert w2["scaling_efficiency"] == pytest.approx(180 / (2 * 115))  # median of seed 0's 100, seed 1's 130
    (base_run,) = results.runs.query("world_size == 1").to_dict("records")
    assert base_run["seeds"] == [0, 1] and base_run["repeats"] == 4 and w2["scaling_baseline"] == base_run["label"]


def test_superlinear_efficiency_is_flagged_in_the_report_and_its_json(tmp_path, capsys, monkeypatch):
    df = frame(tmp_path, rec("b", 1, tokens_per_s=100.0), rec("w2", 2, tokens_per_s=360.0),
               rec("b-repeat", 1, tokens_per_s=100.0, threads=2), rec("w4", 4, tokens_per_s=400.0, threads=2))
    assert df.loc["w2", "scaling_efficiency"] == pytest.approx(1.8) and bool(df.loc["w2", "flagged"])
    (flag,) = df.loc["w2", "flags"]
    assert flag["field"] == "scaling_efficiency" and "exceeds 105%" in flag["reason"]
    assert not bool(df.loc["w4", "flagged"]) and not bool(df.loc["b", "flagged"])  # 100 %: fine
    monkeypatch.setenv("COLUMNS", "300")
    assert cli.main(["report", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "180% ⚠" in text and "ok ⚠" in text and "weak scaling efficiency 180% at 2 devices" in " ".join(text.split())
    assert cli.main(["report", str(tmp_path), "--json"]) == 0
    rows = {r["run_keys"][0]: r for r in json.loads(capsys.readouterr().out)["runs"]}
    assert rows["w2"]["flagged"] is True and rows["w2"]["flags"][0]["field"] == "scaling_efficiency"
    assert rows["w4"]["scaling_baseline_identities"] == [df.loc["b-repeat", "identity"]]
    assert rows["w4"]["scaling_efficiency"] == 1.0 and rows["b"]["scaling_baseline"] == BASELINE


def test_the_report_names_the_baseline_or_why_there_is_none(tmp_path, capsys, monkeypatch):
    df = frame(tmp_path, rec("base0000aaaa", 1), rec("w2", 2, tokens_per_s=150.0),
               rec("x", 1, scaling="strong", cpu=CPU_B), rec("x2", 2, scaling="strong", step=0.6))
    monkeypatch.setenv("COLUMNS", "300")
    assert cli.main(["report", str(tmp_path), "--columns", "workload,world,efficiency,baseline"]) == 0
    text = capsys.readouterr().out  # (four columns: no name wraps)
    assert df.loc["base0000aaaa", "label"] in text and "75%" in text and "baseline" in text
    assert f"efficiency — {df.loc['x2', 'label']}: no 1-device run of this sweep with the same hardware" in text
    assert cli.main(["report", str(tmp_path), "--json"]) == 0
    rows = {r["run_keys"][0]: r for r in json.loads(capsys.readouterr().out)["runs"]}
    assert rows["x2"]["scaling_efficiency"] is None
    assert rows["x2"]["scaling_efficiency_reason"] == "no 1-device run of this sweep with the same hardware"


def test_the_dashboard_names_baselines_flags_superlinear_points_and_shows_threads_and_ceiling(tmp_path):
    from benchsuite.dashboard import build_site

    w2 = rec("w2", 2, tokens_per_s=360.0)
    w2["metrics"].update(matmul_ceiling_tflops=0.05, mfu_vs_ceiling=None, matmul_ceiling_source="512^3 fp32 matmul",
                         mfu_vs_ceiling_reason="the matmul ceiling measurement is unreliable: ...")
    records = [rec("b", 1), w2, rec("s1", 1, scaling="strong", threads=4), rec("s2", 2, scaling="strong", step=0.6)]
    res = build_site(records, tmp_path / "site")
    index = (tmp_path / "site" / "index.html").read_text(encoding="utf-8")
    assert "w · weak: baseline w · weak · w1." in index
    assert "w · strong · 2 devices: no efficiency (no 1-device run of this sweep with the same threads per " \
           "rank)" in index
    assert "⚠ w · weak · 2 devices: weak scaling efficiency 180%" in index
    pages = {p.rsplit("/", 1)[-1]: (tmp_path / "site" / p).read_text(encoding="utf-8") for p in res.pages[1:]}
    page = pages["w2.html"]
    assert '<div class="flags flags-impossible" role="alert">' in page and "scaling_efficiency" in page
    assert "CPU threads per rank</th><td>1 · sweep rule</td>" in page
    assert "50 GFLOP/s · 512^3 fp32 matmul" in page and "the matmul ceiling measurement is unreliable" in page


# ----------------------------------------------------------------------------- the matmul ceiling


@pytest.fixture
def cpu():
    import torch

    return torch.device("cpu")


def test_the_timing_loop_honours_its_warm_up_and_window_durations(cpu):
    calls = []

    def step():
        calls.append(time.perf_counter())
        time.sleep(0.002)

    t0 = time.perf_counter()
    timing = ce.time_loop(step, cpu, warmup_s=0.05, duration_s=0.04, repeats=3)
    wall = time.perf_counter() - t0
    assert len(timing.windows) == 3
    assert timing.warmup.seconds >= 0.05 and all(w.seconds >= 0.04 for w in timing.windows)
    assert len(calls) == timing.warmup.iters + sum(w.iters for w in timing.windows)
    assert wall >= 0.05 + 3 * 0.04
    assert timing.best.rate == max(w.rate for w in timing.windows)


def test_the_best_window_wins_on_a_box_that_was_busy_for_a_while(cpu, monkeypatch):
    """Windows 1 and 3 run on a 'loaded' box (20 ms a step), window 2 on a quiet one (2 ms): the
    ceiling is window 2's rate, not an average and not the last."""
    windows = []
    start = ce._Clock.start
    monkeypatch.setattr(ce._Clock, "start", lambda self: (windows.append(1), start(self)))
    timing = ce.time_loop(lambda: time.sleep(0.002 if len(windows) == 3 else 0.02), cpu, warmup_s=0.02,
                          duration_s=0.1, repeats=3)
    assert timing.best is timing.windows[1]


def test_measure_matmul_ceiling_returns_the_best_repeat_as_flops(cpu, monkeypatch):
    import torch

    fake = ce.LoopTiming(ce.TimedWindow(5, 1.0), [ce.TimedWindow(10, 1.0), ce.TimedWindow(30, 1.0), ce.TimedWindow(20, 1.0)])
    seen = {}

    def fake_loop(step, device, warmup_s, duration_s, repeats):
        step()
        seen.update(warmup_s=warmup_s, duration_s=duration_s, repeats=repeats)
        return fake

    monkeypatch.setattr(ce, "time_loop", fake_loop)
    got = ce.measure_matmul_ceiling(cpu, torch.float32, n=64)
    assert got.flops_per_s == 2 * 64**3 * 30
    assert seen == {"warmup_s": 0.05, "duration_s": 0.05, "repeats": 3}  # the CPU defaults
    assert f"{torch.get_num_threads()} thread(s)" in got.source and "best of 3" in got.source
    monkeypatch.undo()
    real = ce.measure_matmul_ceiling(cpu, torch.float32, n=64, warmup_s=0.01, duration_s=0.02, repeats=2)
    assert real.flops_per_s > 0 and "best of 2 windows of >= 0.02 s after 0.01 s warm-up" in real.source


def test_a_run_faster_than_its_ceiling_blames_the_ceiling_not_the_run():
    assert ce.vs_ceiling(0.5e12, 1e12) == (0.5, None)
    ratio, reason = ce.vs_ceiling(1.95e12, 1e12)
    assert ratio is None and "ceiling measurement is unreliable" in reason and "1.95 x" in reason
    old = {"status": "ok", "metrics": {"mfu_vs_ceiling": 1.95, "matmul_ceiling_tflops": 0.018}}
    m = migrate.upgrade_v1_ceiling(old)["metrics"]
    assert m["mfu_vs_ceiling"] is None and "unreliable" in m["mfu_vs_ceiling_reason"]
    assert "10 back-to-back matmuls" in m["matmul_ceiling_source"]
    fine = migrate.upgrade_v1_ceiling({"status": "ok", "metrics": {"mfu_vs_ceiling": 0.5, "matmul_ceiling_tflops": 1.0}})
    assert fine["metrics"]["mfu_vs_ceiling"] == pytest.approx(0.5) and fine["metrics"]["mfu_vs_ceiling_reason"] is None
