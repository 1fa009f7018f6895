"""measure() checks every argument and every name a user gives before the loop runs, by a suite's rules; one
Measurement measures one job; a window outside training inside a step leaves the step's two parts its time."""

from __future__ import annotations

import math
import re
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import benchsuite
from benchsuite.adapters import MeasureCallback
from benchsuite.config import ConfigError
from benchsuite.results.store import load_records
from helpers.user_loop import synthetic_meters

ARGUMENTS = ("name", "suite", "description", "flops_per_token", "tokens_per_step", "peak_tflops", "warmup_steps",
             "precision", "out", "device")


@pytest.fixture(autouse=True)
def one_rank(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")
    synthetic_meters(monkeypatch)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="no peak FLOP/s")
        yield


ANY = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.integers(2**62, 2**70),
                st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=6), st.lists(st.integers(), max_size=2))
NAMES = st.one_of(st.text(max_size=8), st.sampled_from(["loop", "a\u200bb", "x\x1b[2J", "tab\there", " ", "dé"]))


def mostly(sane, wild) -> st.SearchStrategy:
    """`sane` nine times in ten, else a draw of `wild`: most examples reach a record, every argument is tried."""
    return st.integers(0, 9).flatmap(lambda i: wild if i == 0 else st.just(sane))


@st.composite
def arguments(draw, folder: Path) -> dict:
    """measure() arguments of every type, sane ones among them often enough to reach a record."""
    kwargs = {"name": draw(mostly("loop", st.one_of(NAMES, ANY))),
              "suite": draw(mostly("user", st.one_of(NAMES, ANY))),
              "description": draw(mostly("a model", st.one_of(st.text(max_size=8), ANY))),
              "flops_per_token": draw(mostly(1e6, st.one_of(st.just(None), ANY))),
              "tokens_per_step": draw(mostly(64, st.one_of(st.just(None), st.just(2.5), ANY))),
              "peak_tflops": draw(mostly(1.0, ANY)),
              "warmup_steps": draw(mostly(1, ANY)),
              "precision": draw(mostly("fp32", st.one_of(st.sampled_from(["bf16", "fp8"]), ANY))),
              "out": draw(mostly(folder / "out", st.sampled_from([folder / "a-file", folder / "a-file" / "below",
                                                                  3, ""]))),
              "device": draw(mostly("cpu", st.one_of(st.sampled_from(["nonsense:7", torch.device("cpu")]), ANY)))}
    return {k: v for k, v in kwargs.items() if v is not None or k in ("name", "flops_per_token", "tokens_per_step")}


@pytest.mark.heavy  # in this process, seconds: the full pass runs it, the fast tier does not
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_every_argument_is_refused_before_the_loop_naming_it_or_gives_a_record_every_reader_takes(tmp_path_factory,
                                                                                                data):
    folder = tmp_path_factory.mktemp("m")
    (folder / "a-file").write_text("not a folder")
    kwargs = data.draw(arguments(folder))
    try:
        m = benchsuite.measure(**kwargs)
    except (ValueError, ConfigError) as e:
        said = str(e).replace("benchsuite.measure", "")  # "benchsuite" holds "suite"
        named = [a for a in ARGUMENTS if re.search(rf"\b{a}\b", said)]
        assert named, f"{e} names no argument"
        event(f"refused: {', '.join(named)}")
        return
    warmup = kwargs.get("warmup_steps", 0)
    if warmup > 3:  # a loop shorter than its warm-up measures nothing, and says so
        with pytest.raises(RuntimeError, match="warm-up steps; nothing was measured"):
            with m:
                m.step()
        return
    event("measured")
    with m:
        for _ in range(2 + warmup):
            time.sleep(0.001)
            m.step()
    loaded = load_records(m.out)
    assert [one.record.run_key for one in loaded] == [m.record.run_key]
    assert len(benchsuite.load(m.out)) == 1


@pytest.mark.parametrize("kwargs, named", [
    ({"out": "FILE"}, "out"), ({"tokens_per_step": 2.5}, "tokens_per_step"), ({"description": 123}, "description"),
    ({"flops_per_token": math.inf}, "flops_per_token"), ({"flops_per_token": math.nan}, "flops_per_token"),
    ({"peak_tflops": math.inf}, "peak_tflops"), ({"suite": "s\u200b"}, "suite"), ({"name": "a\nb"}, "name"),
    ({"warmup_steps": True}, "warmup_steps"), ({"device": "nonsense:7"}, "device"), ({"tokens_per_step": True},
                                                                                       "tokens_per_step")])
def test_what_once_failed_only_at_stop_is_refused_before_the_loop(tmp_path, kwargs, named):
    if kwargs.get("out") == "FILE":
        kwargs = {"out": tmp_path / "f"}
        (tmp_path / "f").write_text("x")
    with pytest.raises(ValueError, match=named):
        benchsuite.measure(kwargs.pop("name", "loop"), **kwargs)


def test_a_step_and_a_window_refuse_what_they_cannot_record(tmp_path):
    with benchsuite.measure("loop", out=tmp_path, tokens_per_step=10) as m:
        with pytest.raises(ValueError, match="step\\(tokens=\\)"):
            m.step(tokens=2.5)
        with pytest.raises(ValueError, match="step\\(loss=\\)"):
            m.step(loss="low")
        with pytest.raises(ValueError, match="window name"):
            m.begin("ev\u200bal")
        m.step()
    assert len(m.record.steps) == 1


def test_one_measurement_measures_one_job(tmp_path):
    m = benchsuite.measure("loop", out=tmp_path, tokens_per_step=10)
    with m:
        m.step()
    with pytest.raises(RuntimeError, match="measured a job already"):
        with m:
            m.step()
    assert [one.record.repeat for one in load_records(tmp_path)] == [0]


def test_the_trainer_callback_measures_each_train_call_as_a_job_of_its_own(tmp_path):
    callback = MeasureCallback("hf", out=tmp_path, tokens_per_step=10)
    for steps in (2, 3):
        state = SimpleNamespace(num_input_tokens_seen=0)
        callback.on_train_begin(None, state, None)
        for _ in range(steps):
            callback.on_step_begin(None, state, None)
            time.sleep(0.001)
            callback.on_step_end(None, state, None)
        callback.on_train_end(None, state, None)
    records = sorted((one.record for one in load_records(tmp_path)), key=lambda r: r.repeat)
    assert [(r.repeat, len(r.steps)) for r in records] == [(0, 2), (1, 3)]


def test_an_evaluation_inside_a_step_leaves_the_steps_two_parts_its_time(tmp_path):
    """Work, then an evaluation window, then more work, then step(): once only the part after the window."""
    with benchsuite.measure("split", out=tmp_path, tokens_per_step=10) as m:
        for _ in range(3):
            time.sleep(0.05)
            with m.window("eval", training=False):
                time.sleep(0.1)
            time.sleep(0.05)
            m.step()
    times = [s.time_s for s in m.record.steps]
    assert all(0.095 < t < 0.15 for t in times), times
