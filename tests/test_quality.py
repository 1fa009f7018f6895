"""Validation loss during training, and what it takes to reach a target loss (metrics/quality.py)."""

import time
import warnings

import pytest
import torch

from benchsuite.energy.windows import combine_windows
from benchsuite.metrics import quality as q
from benchsuite.metrics.timing import StepTimer
from benchsuite.record import utc_now

# A constructed curve: evaluations after 0, 10 and 20 measured steps of 100 tokens each.
CURVE = [
    {"step": 0, "tokens": 0, "seconds": 0.0, "model_flops": 0.0, "energy_j": 0.0, "val_loss": 5.0},
    {"step": 10, "tokens": 1000, "seconds": 2.0, "model_flops": 1e9, "energy_j": 100.0, "val_loss": 3.0},
    {"step": 20, "tokens": 2000, "seconds": 4.0, "model_flops": 2e9, "energy_j": 300.0, "val_loss": 2.0},
]
CARBON = {"pue": 1.5, "intensity_g_per_kwh": 400.0}


def test_target_is_interpolated_between_the_two_evaluations_that_straddle_it():
    # 2.5 lies halfway from 3.0 (step 10) to 2.0 (step 20): f = (3.0 - 2.5) / (3.0 - 2.0) = 0.5
    r = q.to_target(CURVE, 2.5, CARBON)
    assert r["reached"] is True and r["reason"] is None and r["energy_reason"] is None
    assert r["step"] == pytest.approx(15.0)
    assert r["reached_step"] == 20
    assert r["tokens"] == pytest.approx(1500.0)
    assert r["seconds"] == pytest.approx(3.0)
    assert r["model_flops"] == pytest.approx(1.5e9)
    assert r["energy_j"] == pytest.approx(200.0)  # 100 + 0.5 * (300 - 100)
    assert r["co2e_g"] == pytest.approx(200.0 / 3.6e6 * 1.5 * 400.0)
    # 4.0 lies a quarter of the way from 5.0 (step 0) to 3.0 (step 10): f = 0.5
    r = q.to_target(CURVE, 4.0, CARBON)
    assert (r["step"], r["tokens"], r["energy_j"]) == pytest.approx((5.0, 500.0, 50.0))
    # exactly on an evaluation: that evaluation's figures
    r = q.to_target(CURVE, 3.0, CARBON)
    assert (r["step"], r["seconds"], r["energy_j"]) == pytest.approx((10.0, 2.0, 100.0))


def test_target_already_met_at_the_first_evaluation_costs_nothing():
    r = q.to_target(CURVE, 6.0, CARBON)
    assert r["reached"] and r["step"] == 0 and r["tokens"] == 0 and r["energy_j"] == 0.0


def test_never_reached_no_target_or_no_curve_give_null_with_a_reason():
    r = q.to_target(CURVE, 1.5, CARBON)
    assert r["reached"] is False
    assert all(r[k] is None for k in ("step", "tokens", "seconds", "model_flops", "energy_j", "co2e_g"))
    assert r["reason"] == "target 1.5 not reached; best 2 at step 20"
    r = q.to_target(CURVE, None)
    assert r["reached"] is None and "target_loss is not set" in r["reason"]
    r = q.to_target([], 2.5)
    assert r["reached"] is None and "eval_every is 0" in r["reason"]


def test_energy_unavailable_leaves_the_other_figures_and_says_why():
    curve = [dict(p, energy_j=None if p["step"] else 0.0) for p in CURVE]
    r = q.to_target(curve, 2.5, CARBON, energy_reason="no RAPL, no estimate")
    assert r["reached"] and r["tokens"] == pytest.approx(1500.0)
    assert r["energy_j"] is None and r["co2e_g"] is None
    assert "no RAPL, no estimate" in r["energy_reason"]


def test_curve_accumulates_training_figures_and_energy_stays_null_after_a_gap():
    points = q.eval_points(5, 2)
    assert points == [0, 2, 4, 5] and q.eval_points(6, 3) == [0, 3, 6] and q.eval_points(6, 0) == []
    c = q.curve(points, [5.0, 4.0, 3.5, 3.4], [0.1, 0.2, 0.3, 0.4, 0.5], 100, 1e6, [10.0, None, 5.0])
    assert [p["tokens"] for p in c] == [0, 200, 400, 500]
    assert [p["seconds"] for p in c] == pytest.approx([0.0, 0.3, 1.0, 1.5])
    assert [p["model_flops"] for p in c] == [0, 2e8, 4e8, 5e8]
    assert [p["energy_j"] for p in c] == [0.0, 10.0, None, None]
    with pytest.raises(ValueError):
        q.curve(points, [5.0], [0.1], 100, 1e6, [])


def _window(name, s, cpu_j, gpu_j=None, short=False):
    fig = lambda j: {"energy_j": j, "source": "estimated" if j is not None else "unavailable",  # noqa: E731
                     "reason": None if j is not None else "off", "sampled_energy_j": None, "avg_w": None,
                     "idle_w": None, "above_idle_j": None, "detail": {}}
    return {"name": name, "rank": 0, "host": "h", "window_s": s, "short_window": short,
            "gpus": [{"uuid": "GPU-1", "name": "g", "cuda_index": 0, "figure": fig(gpu_j)}],
            "cpu": fig(cpu_j), "dram": fig(1.0),
            "reasons": ["a note"] + ([f"window {s} s is shorter"] if short else [])}


def test_combined_training_windows_sum_and_keep_unavailable_as_null():
    w = combine_windows([_window("train-0", 2.0, 10.0, 4.0), _window("train-2", 1.0, 5.0, None, short=True)],
                        "measure", 1.5)
    assert w["name"] == "measure" and w["window_s"] == 3.0
    assert w["cpu"]["energy_j"] == 15.0 and w["cpu"]["avg_w"] == 5.0 and w["dram"]["energy_j"] == 2.0
    assert w["gpus"][0]["figure"]["energy_j"] is None and w["gpus"][0]["figure"]["source"] == "unavailable"
    assert w["short_window"] and any("1 of 2 windows" in r for r in w["reasons"]) and "a note" in w["reasons"]


def test_step_timer_pause_leaves_the_gap_out():
    timer = StepTimer(torch.device("cpu"))
    timer.mark()
    time.sleep(0.01)
    timer.mark()
    timer.pause()
    time.sleep(0.5)  # "evaluation"
    timer.mark()
    time.sleep(0.01)
    timer.mark()
    d = timer.durations_s()
    assert len(d) == 2 and all(0.009 < x < 0.4 for x in d)


def test_eval_rows_is_a_fixed_set_whatever_the_batch_size():
    from benchsuite.data import make_source

    src = make_source("builtin", 260, 16, seed=0)
    a = torch.cat([x for x, _ in q.eval_rows(src.val_batches(5), rows=12)])
    b = torch.cat([x for x, _ in q.eval_rows(src.val_batches(4), rows=12)])
    assert a.shape == (12, 16) and torch.equal(a, b)


# ------------------------------------------------------------------------- a tiny real run


def _run(monkeypatch, eval_every, eval_sleep_s=0.0):
    from benchsuite import dist as bdist
    from benchsuite import worker
    from benchsuite.assembly import Stamp, harness_record
    from benchsuite.config import parse_suite
    from benchsuite.record import to_dict

    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")
    if eval_sleep_s:
        real = worker.evaluate_loss

        def heavy(*args, **kwargs):  # an evaluation that takes long: none of it may show in step times
            time.sleep(eval_sleep_s)
            return real(*args, **kwargs)

        monkeypatch.setattr(worker, "evaluate_loss", heavy)
    doc = {"suite": {"name": "tq"},
           "defaults": {"model": {"layers": 1, "hidden": 16, "heads": 2, "vocab": 260, "seq_len": 16},
                        "train": {"micro_batch": 2, "steps": 5, "warmup_steps": 2, "precision": "fp32",
                                  "data": "builtin", "lr": 1e-2, "eval_every": eval_every}},
           "workload": [{"name": "dense", "kind": "dense"}]}
    if eval_every:  # a target without evaluations would change nothing: refused
        doc["defaults"]["train"]["target_loss"] = 4.85
    run = parse_suite(doc).runs[0]
    ctx = bdist.init_distributed(run)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "no peak FLOP/s known" for a CPU
        mine, facts = worker.run_rank(run, ctx, None)
    rec = to_dict(harness_record(run, facts, [mine], Stamp("k", 0, utc_now(), 1.0)))
    return mine, rec


@pytest.mark.heavy  # in this process, seconds: the full pass runs it, the fast tier does not
def test_tiny_run_evaluates_at_the_right_steps_and_keeps_eval_out_of_time_and_energy(monkeypatch, tmp_path):
    sleep = 0.5  # far above a step of this model (~5 ms), so contention on a shared box cannot blur it
    mine, rec = _run(monkeypatch, eval_every=2, eval_sleep_s=sleep)
    qual = rec["metrics"]["quality"]
    # evaluations after 0, 2, 4 and 5 (the last) measured steps; steps[i] carries the loss after step i
    assert [p["step"] for p in qual["curve"]] == [0, 2, 4, 5]
    assert [i for i, s in enumerate(rec["steps"]) if s["val_loss"] is not None] == [1, 3, 4]
    assert [rec["steps"][i]["val_loss"] for i in (1, 3, 4)] == [p["val_loss"] for p in qual["curve"][1:]]
    assert qual["curve"][-1]["val_loss"] < qual["curve"][0]["val_loss"]  # it learns
    assert qual["eval_rows"] == q.EVAL_ROWS and qual["eval_count"] == 4
    # eval time is in no step and not in the training energy window
    times = [s["time_s"] for s in rec["steps"]]
    assert len(times) == 5 and max(times) < sleep
    assert qual["eval_seconds"] >= 4 * sleep
    assert qual["curve"][-1]["seconds"] == pytest.approx(sum(times))
    assert [w["name"] for w in mine.quality.train_windows] == ["train-0", "train-2", "train-4"]
    assert [w["name"] for w in mine.quality.eval_windows] == ["eval-0", "eval-2", "eval-4", "eval-5"]
    assert mine.energy_window["name"] == "measure"
    assert rec["energy"]["window_s"] == pytest.approx(sum(w["window_s"] for w in mine.quality.train_windows))
    # the four evaluations (each >= sleep) are outside the energy window: with them it would be >= 4 * sleep
    assert rec["energy"]["window_s"] < 4 * sleep <= qual["eval_seconds"]
    if rec["energy"]["total_j"] is not None:  # estimated on a CPU box; unavailable only without codecarbon
        assert qual["curve"][-1]["energy_j"] == pytest.approx(rec["energy"]["total_j"])
        assert qual["eval_energy_j"] is not None
    # the target (4.85) lies between the evaluations after 2 (~5.0) and 4 steps (~4.7): interpolated there
    assert qual["target_loss"] == 4.85 and qual["reached"] is True and qual["reached_step"] == 4
    assert 2 < qual["step"] < 4 and qual["tokens"] == pytest.approx(qual["step"] * 32)
    assert qual["curve"][1]["seconds"] < qual["seconds"] < qual["curve"][2]["seconds"]

    # without evaluation: one window, no quality section, and the very same training (eval changed nothing)
    mine0, rec0 = _run(monkeypatch, eval_every=0)
    assert mine0.quality is None and rec0["metrics"]["quality"] is None
    assert all(s["val_loss"] is None for s in rec0["steps"])
    assert [s["loss"] for s in rec0["steps"]] == [s["loss"] for s in rec["steps"]]

    # the record's flat columns and the report's "to target" cell
    from benchsuite.results.report import report_rows, report_table
    from benchsuite.record import write_record
    from benchsuite.results.model import results_at

    write_record(tmp_path, rec)
    results = results_at(tmp_path)
    df = results.df
    row = next(report_rows(results))
    assert row["quality.target_loss"] == 4.85 and row["quality.reached"] is True
    assert row["quality.tokens"] == qual["tokens"]
    assert "quality.energy_j" in df and "metrics.quality.eval_seconds" in df
    table = report_table(results)
    cell = list(table.columns[[c.header for c in table.columns].index("to target")].cells)[0]
    assert cell.startswith(f"{qual['tokens']:.2g} tok, ")


def test_curve_without_any_energy_has_no_zero_joules():
    c = q.curve([0, 2, 4], [5.0, 4.0, 3.5], [0.1] * 4, 100, 1e6, [None, None])
    assert [p["energy_j"] for p in c] == [None, None, None]
