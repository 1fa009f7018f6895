"""A run's log: a header equal to the record, then one timestamped line per event with its rank, the
same events in the JSON-lines twin, warnings as one line naming the fix, and file names that say the
workload, seed and repeat; `run` shows the suite's runs done / left and an ETA."""

from __future__ import annotations

import io
import json
import re
import shlex
import warnings
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

import pytest

from benchsuite.commands.run import SuiteEta, _clock
from benchsuite.launch import log_stem
from benchsuite.runlog import LogEvent, ParsedLine, RunLog, split_fix, text_value, utc_stamp
from helpers import run_cli, write_suite

ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
# builtin data (its vocabulary: 257 byte tokens, so vocab >= 257), a validation loss every 2 of 6 steps
EVAL_SUITE = """
[suite]
name = "logs"

[defaults]
model = { layers = 2, hidden = 32, heads = 2, vocab = 300, seq_len = 16 }

[defaults.train]
micro_batch = 2
steps = 6
warmup_steps = 2
timeout_s = 120
eval_every = 2
data = "builtin"
seed = 3

[[workload]]
name = "dense"
kind = "dense"

[sweep]
world_size = [1]
"""


def test_a_line_is_time_rank_event_body_and_its_json_twin_has_the_same_fields():
    e = LogEvent(2, "eval", "step 4/10 val_loss 4.7100", {"step": 4, "steps": 10, "val_loss": 4.71},
                 time="2026-12-02T07:55:01.123Z")
    assert e.text() == "2026-12-02T07:55:01.123Z rank2 eval step 4/10 val_loss 4.7100"
    assert json.loads(e.json()) == {"time": "2026-12-02T07:55:01.123Z", "rank": 2, "event": "eval", "step": 4,
                                    "steps": 10, "val_loss": 4.71}
    assert ParsedLine.parse(e.text()) == ParsedLine(e.time, 2, "eval", "step 4/10 val_loss 4.7100")
    assert ParsedLine.parse("step 1/3 loss 4.0") is None  # a line of the old format, or torchrun's own


def test_times_are_iso_utc_with_milliseconds():
    assert utc_stamp(datetime(2026, 12, 2, 7, 55, 1, 123999, tzinfo=timezone.utc)) == "2026-12-02T07:55:01.123Z"
    assert ISO.match(utc_stamp())


def test_header_values_split_on_spaces():
    assert [text_value(v) for v in (None, 3, "dense", "Intel(R) Xeon(R)", "a=b", "")] == \
        ["none", "3", "dense", '"Intel(R) Xeon(R)"', '"a=b"', '""']


def test_a_warning_is_one_line_naming_the_fix_with_no_source_line(tmp_path):
    out, twin = io.StringIO(), tmp_path / "run.jsonl"
    twin.touch()
    log = RunLog(1, str(twin), out=out)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = log.showwarning
        warnings.warn("no peak FLOP/s for 'AMD EPYC' at fp32,\n  MFU is null; pass --peak-tflops")
    log.close()
    (line,) = out.getvalue().splitlines()
    parsed = ParsedLine.parse(line)
    assert (parsed.rank, parsed.event) == (1, "warning")
    assert parsed.body == "no peak FLOP/s for 'AMD EPYC' at fp32, MFU is null (fix: pass --peak-tflops)"
    assert "UserWarning" not in line and ".py:" not in line
    (obj,) = [json.loads(s) for s in twin.read_text().splitlines()]
    assert obj["fix"] == "pass --peak-tflops" and obj["category"] == "UserWarning" and obj["time"] == parsed.time
    assert split_fix("disk full; the run stops") == ("disk full; the run stops", None)  # no fix named


def test_the_json_twin_is_never_written_through_a_symlink(tmp_path):
    target = tmp_path / "elsewhere"
    target.touch()
    (tmp_path / "run.jsonl").symlink_to(target)
    with pytest.raises(OSError):
        RunLog(0, str(tmp_path / "run.jsonl"))


def test_a_log_is_named_with_its_workload_seed_and_repeat():
    assert log_stem(Path("out/s__dense__w2n1-weak-seed1__abc.json"), "abc", 0, 0) == \
        "s__dense__w2n1-weak-seed1-r0__abc.node0"
    assert log_stem(Path("out/s__dense__w2n1-weak-seed1__abc-r2.json"), "abc", 2, 1) == \
        "s__dense__w2n1-weak-seed1-r2__abc.node1"


def test_the_suite_eta_comes_from_the_measured_runs():
    eta = SuiteEta(4)
    assert eta.line() == "0/4 runs done, 4 left"  # nothing measured yet: no guess
    eta.finished(SimpleNamespace(duration_s=0.0))  # skipped: it says nothing of a run's time
    assert eta.line() == "1/4 runs done, 3 left"
    eta.finished(SimpleNamespace(duration_s=30.0))
    eta.finished(SimpleNamespace(duration_s=50.0))
    assert eta.line() == "3/4 runs done, 1 left, ETA 0:40"
    eta.finished(SimpleNamespace(duration_s=40.0))
    assert eta.line() == "4/4 runs done, 0 left"
    assert [_clock(s) for s in (38, 725, 3729)] == ["0:38", "12:05", "1:02:09"]


def _header_pairs(body: str) -> dict[str, str]:
    return dict(pair.split("=", 1) for pair in shlex.split(body))


@pytest.mark.procs
def test_a_real_runs_log_has_a_header_equal_to_the_record_and_timestamped_rank_lines(tmp_path):
    """Acceptance: a real run with eval_every = 2 over 6 steps (a step line each, k = 1)."""
    suite = write_suite(tmp_path / "logs.toml", EVAL_SUITE)
    out = tmp_path / "out"
    res = run_cli("run", str(suite), "--out", str(out))
    assert res.returncode == 0, res.stderr
    (rec,) = [json.loads(p.read_text()) for p in out.glob("*.json")]
    stem = f"logs__dense__w1n1-weak-seed3-r0__{rec['run_key']}.node0"
    assert sorted(p.name for p in (out / "logs").iterdir()) == [f"{stem}.jsonl", f"{stem}.log"]
    text = (out / "logs" / f"{stem}.log").read_text().splitlines()
    twin = [json.loads(line) for line in (out / "logs" / f"{stem}.jsonl").read_text().splitlines()]

    assert not [line for line in text if "UserWarning" in line or re.search(r"\.py:\d+:", line)]
    lines = [ParsedLine.parse(line) for line in text]
    assert all(lines), text  # every line: TIME rankN EVENT BODY
    assert all(ISO.match(p.time) and p.rank == 0 for p in lines)
    assert [(p.time, p.rank, p.event) for p in lines] == [(o["time"], o["rank"], o["event"]) for o in twin]

    header, header_json = lines[0], twin[0]
    assert header.event == "header"
    cfg, m = rec["config"], rec["metrics"]
    expected = {"suite": "logs", "workload": "dense", "kind": "dense", "preset": cfg["model"]["preset"],
                "params": m["params"]["total"], "active": m["params"]["active"], "world": cfg["world_size"],
                "nodes": cfg["nodes"], "seed": cfg["train"]["seed"], "precision": m["precision"],
                "device": rec["env"]["devices"][0]["name"], "steps": 6, "eval_every": 2,
                "layout": "tp{tensor}·pp{pipeline}·ep{expert}·zero{zero}".format(**cfg["parallel"])}
    assert {k: v for k, v in header_json.items() if k not in ("time", "rank", "event")} == expected
    assert _header_pairs(header.body) == {k: text_value(v).strip('"') for k, v in expected.items()}

    steps = [(p, o) for p, o in zip(lines, twin) if p.event == "step"]
    assert [p.body.split()[0] for p, _ in steps] == [f"{s}/6" for s in range(1, 7)]
    assert [o["loss"] for _, o in steps] == [s["loss"] for s in rec["steps"]]  # one rank: its loss is the record's
    evals = [o for o in twin if o["event"] == "eval"]
    assert [o["step"] for o in evals] == [0, 2, 4, 6]  # before the first step, then every eval_every steps
    assert [(o["step"], o["val_loss"]) for o in evals] == [(c["step"], c["val_loss"]) for c in m["quality"]["curve"]]
    assert [p.body for p in lines if p.event == "eval"][1] == f"step 2/6 val_loss {evals[1]['val_loss']:.4f}"
    warned = [o for o in twin if o["event"] == "warning"]
    if m["peak_tflops"] is None:  # a device not in the peak table: said once, with the fix
        assert [o["fix"] for o in warned] == ["pass --peak-tflops"]
    assert "suite logs: 0/1 runs done, 1 left" in res.stderr  # the suite line, not a terminal
    # the last line sums the run up as its record does, and names the record
    summary, summary_json = lines[-1], twin[-1]
    assert summary.event == "summary"
    assert {k: v for k, v in summary_json.items() if k not in ("time", "rank", "event")} == {
        "tokens_per_s": m["tokens_per_s"], "mfu": m["mfu"], "energy_j": rec["energy"]["total_j"],
        "energy_source": rec["energy"]["source"], "co2e_g": rec["carbon"]["co2e_g"],
        "record": str(next(out.glob("*.json")))}


@pytest.mark.procs
def test_a_raising_rank_logs_one_error_line_before_its_traceback(tmp_path, tiny_suite):
    out = tmp_path / "out"
    res = run_cli("run", str(tiny_suite()), "--out", str(out), env={"BENCHSUITE_INJECT_FAULT": "raise:0"})
    assert res.returncode == 1, res.stderr
    (log,) = (out / "logs").glob("*.log")
    errors = [p for p in map(ParsedLine.parse, log.read_text().splitlines()) if p and p.event == "error"]
    assert [(p.rank, p.body) for p in errors] == [(0, "RuntimeError: injected fault on rank 0")]
    twin = [json.loads(line) for line in log.with_suffix(".jsonl").read_text().splitlines()]
    assert [(o["type"], o["message"]) for o in twin if o["event"] == "error"] == \
        [("RuntimeError", "injected fault on rank 0")]
