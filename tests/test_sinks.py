"""A suite's [sinks] (and measure(sinks=...)): each run's figures and per-step loss and throughput reach MLflow,
TensorBoard and W&B as the record holds them (read back with each tracker's own library, compared with ==); a
sink that fails warns once and loses no record; a sink whose package is missing is refused up front."""

from __future__ import annotations

import json
import sys
import tomllib
import warnings
from pathlib import Path

import msgspec
import pytest

from benchsuite.config import ConfigError, parse_suite
from benchsuite.config.sinks import Sinks, TensorBoardSink
from benchsuite.record.values import dig
from benchsuite.results.decoding import read_record
from benchsuite.sinks import Sender, SinkWarning
from benchsuite.sinks.figures import figures, params, step_rows
from helpers import REPO, TINY_SUITE, run_cli
from helpers.trackers import mlflow_run, tensorboard_scalars, wandb_offline_run

RECORD = REPO / "tests" / "fixtures" / "results" / "make_dvs-switch-w2.json"


def test_a_trackers_figures_are_the_records_own_fields():
    record = read_record(RECORD)
    sent = figures(record)
    doc = msgspec.to_builtins(record)  # as read: migrated to this schema
    assert sent["metrics.tokens_per_s"] == record.metrics.tokens_per_s
    assert sent["metrics.mfu"] == record.metrics.mfu and sent["metrics.step_time_s.median"] == \
        record.metrics.step_time_s.median
    assert any(k.startswith("energy.") for k in sent) and any(k.startswith("metrics.moe.") for k in sent)
    for key, value in sent.items():  # every one is the record's field of that dotted name
        assert value == (doc[key] if "." not in key else dig(doc, *key.split("."))), key
    facts = params(record, RECORD)
    assert facts["config.moe.router"] == record.config.moe.router and facts["record"] == str(RECORD)
    assert json.loads(facts["config.model.layers"]) == record.config.model.layers
    rows = dict(step_rows(record))
    first = record.steps[0]
    assert rows[first.step]["train.loss"] == first.loss
    assert rows[first.step]["train.tokens_per_s"] == first.tokens / first.time_s


def _suite(extra: str) -> str:
    return TINY_SUITE.format(name="sinks", world_sizes=[1], timeout=120) + extra


def _parsed(extra: str):
    return parse_suite(tomllib.loads(_suite(extra)), "s.toml")


def test_a_bad_sinks_table_is_refused_naming_each_key():
    with pytest.raises(ConfigError) as e:
        _parsed('[sinks]\nneptune = {}\ntensorboard = { log_dir = 3, flush = true }\n')
    text = str(e.value)
    assert "sinks.neptune: unknown sink; valid sinks: mlflow, tensorboard, wandb" in text
    assert "sinks.tensorboard.log_dir: expected str, got int 3" in text
    assert "sinks.tensorboard.flush: unknown key; valid keys: log_dir" in text
    with pytest.raises(ConfigError, match=r"sinks.wandb.mode: must be one of 'offline', 'online'"):
        _parsed('[sinks]\nwandb = { mode = "cloud" }\n')


def test_a_sink_is_no_part_of_a_run():
    plain = _parsed("")
    tracked = _parsed('[sinks]\ntensorboard = { log_dir = "tb" }\n')
    assert tracked.sinks == Sinks(tensorboard=TensorBoardSink(log_dir="tb")) and plain.sinks == Sinks()
    assert [r.run_key({}) for r in plain.runs] == [r.run_key({}) for r in tracked.runs]


def test_a_sink_whose_package_is_missing_is_refused_with_the_extra_to_install(monkeypatch, tmp_path):
    import benchsuite

    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb now fails, as without the package
    with pytest.raises(ConfigError) as e:
        _parsed("[sinks]\nwandb = {}\n")
    (problem,) = e.value.problems
    assert problem[0] == "sinks.wandb" and "pip install 'benchsuite[wandb]'" in problem[1]
    with pytest.raises(ConfigError, match=r"pip install 'benchsuite\[wandb\]'"):
        benchsuite.measure("loop", out=tmp_path, sinks={"wandb": {}})


@pytest.mark.procs  # W&B starts its own service process
def test_each_tracker_reads_back_the_records_figures_and_steps(tmp_path):
    record = read_record(RECORD)
    sinks = _parsed('[sinks]\nmlflow = { experiment = "study" }\ntensorboard = {}\nwandb = {}\n').sinks
    with warnings.catch_warnings():
        warnings.simplefilter("error", SinkWarning)
        Sender(sinks, tmp_path).send(record, "switch · w2 · seed 0 · repeat 0", RECORD)
    sent, steps = figures(record), {k: {s: row[k] for s, row in step_rows(record) if k in row}
                                    for k in ("train.loss", "train.tokens_per_s", "train.step_time_s")}
    metrics, facts, tags, history = mlflow_run(f"sqlite:///{tmp_path / 'mlflow.db'}", "study",
                                               "switch · w2 · seed 0 · repeat 0")
    assert {k: metrics[k] for k in sent} == sent
    assert {k: history[k] for k in steps} == steps
    assert tags["run_key"] == record.run_key and facts["config.moe.router"] == record.config.moe.router
    scalars = tensorboard_scalars(tmp_path / "tensorboard" / RECORD.stem)
    last = record.steps[-1].step
    assert {k: scalars[f"figures/{k}"] for k in sent} == {k: {last: v} for k, v in sent.items()}
    assert {k: scalars[k.replace(".", "/", 1)] for k in steps} == steps
    config, summary, wandb_history = wandb_offline_run(tmp_path)
    assert {k: summary[k] for k in sent} == sent
    assert {k: wandb_history[k] for k in steps} == steps
    assert config["run_key"] == record.run_key


def test_a_failing_sink_warns_once_and_keeps_every_record(tmp_path):
    """A TensorBoard folder that cannot be made (a file in its place): one warning for two records, both
    records untouched, and the next sink still served."""
    (tmp_path / "tensorboard").write_text("not a folder")
    before = RECORD.read_bytes()
    sender = Sender(Sinks(tensorboard=TensorBoardSink()), tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for repeat in (0, 1):
            sender.send(read_record(RECORD), f"switch · seed 0 · repeat {repeat}", RECORD)
    (warning,) = [w for w in caught if issubclass(w.category, SinkWarning)]
    assert str(warning.message).startswith("sinks.tensorboard: could not send switch · seed 0 · repeat 0 (")
    assert f"the record is kept at {RECORD}" in str(warning.message)
    assert RECORD.read_bytes() == before


@pytest.mark.procs
def test_a_suite_run_sends_each_record_to_its_trackers(tmp_path):
    """A real `benchsuite run` with [sinks]: the tracker holds each record's figures as written (TensorBoard
    here; the three trackers' contents are the Sender test's)."""
    suite = tmp_path / "sinks.toml"
    suite.write_text(_suite('[sinks]\ntensorboard = { log_dir = "tb" }\n'))
    out = tmp_path / "out"
    res = run_cli("run", str(suite), "--out", str(out), "--json", timeout=300)
    assert res.returncode == 0, res.stderr
    (path,) = out.glob("*.json")
    record = read_record(path)
    scalars = tensorboard_scalars(out / "tb" / path.stem)
    assert scalars["figures/metrics.tokens_per_s"] == {record.steps[-1].step: record.metrics.tokens_per_s}
    assert "warning" not in res.stderr


def test_measure_sends_the_record_it_writes(tmp_path):
    """measure(sinks=...) takes the [sinks] table as a dict: the loop's record reaches TensorBoard as written."""
    import benchsuite
    import torch

    with benchsuite.measure("loop", out=tmp_path, energy={"min_window_s": 0},
                            sinks={"tensorboard": {"log_dir": "tb"}}) as m:
        for n in (100, 300):
            m.step(tokens=torch.tensor(n), loss=torch.tensor(2.5))
    scalars = tensorboard_scalars(tmp_path / "tb" / m.path.stem)
    assert scalars["train/loss"] == {s.step: 2.5 for s in m.record.steps}
    assert scalars["figures/metrics.tokens_per_step"] == {m.record.steps[-1].step: 200.0}
