"""Progress lines: rank 0 logs every k measured steps, the launcher tails the log, `run` shows them on stderr."""

from __future__ import annotations

import json
import re
import time

import pytest
import torch

from benchsuite.launch import LogTail
from benchsuite.metrics.timing import StepTimer
from benchsuite.progress import ProgressLine, line_due, log_every
from benchsuite.worker import timed_steps
from helpers import run_cli

T = "2026-12-02T07:55:01.123Z"  # a log line's time
STEP_LINE = re.compile(r"^step (\d+)/(\d+) loss [\d.]+ tok/s [\d,]+ TFLOP/s \S+ MFU n/a mem [\d.]+ GiB "
                       r"elapsed [\d.]+s ETA [\d.]+s$")


def test_a_line_every_kth_step_and_the_last():
    assert log_every(4) == 1 and log_every(20) == 2 and log_every(140) == 14
    assert [d for d in range(1, 26) if line_due(d, 25)] == [2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 25]
    assert [d for d in range(1, 5) if line_due(d, 4)] == [1, 2, 3, 4]


class SlowLog:
    """A log whose lines take long to write: that time must be in no step's interval."""

    def __init__(self, steps: int):
        self.steps, self.done, self.written = steps, 0, []

    def advance(self) -> bool:
        self.done += 1
        return line_due(self.done, self.steps)

    def write(self, loss) -> None:
        self.written.append((self.done, float(loss)))
        time.sleep(0.2)


@pytest.mark.heavy  # in this process, a second or more: the full pass runs it, the fast tier does not
def test_log_lines_are_written_between_timed_steps():
    class Result:
        def __init__(self, i):
            self.loss = torch.tensor(float(i))

    timer, log = StepTimer(torch.device("cpu")), SlowLog(steps=6)
    results = timed_steps(timer, lambda b: Result(b), list(range(6)), log)
    durations = timer.durations_s()
    assert len(results) == len(durations) == 6  # one interval per step, none for a log line
    assert max(durations) < 0.1  # the 0.2 s of each line is outside the steps
    assert log.written == [(d, d - 1.0) for d in range(1, 7)]  # step d's own loss (k = 1 for 6 steps)


def test_log_tail_reports_complete_progress_lines_once(tmp_path):
    path = tmp_path / "run.log"
    path.write_text("")
    tail = LogTail(path)
    with path.open("a") as f:
        f.write(f"{T} rank0 header workload=dense\n{T} rank0 warm-up 3 steps 1.0 s\nsome torchrun line\n"
                f"{T} rank1 warning low disk (fix: free space)\n{T} rank0 step 1/4 loss 1")
        f.flush()
        assert tail.new_lines() == [ProgressLine("warming up…"), ProgressLine("warm-up 3 steps 1.0 s")]
        f.write(f".5\n{T} rank0 eval step 1/4 val_loss 2.0000\n")
        f.flush()
        assert tail.new_lines() == [ProgressLine("step 1/4 loss 1.5"), ProgressLine("eval step 1/4 val_loss 2.0000")]
        assert tail.new_lines() == []
    tail.close()


def _progress(lines: list[str]) -> tuple[list[tuple[int, int]], list[str]]:
    """(step, steps) of each step line, and the warm-up lines."""
    steps = [STEP_LINE.match(line) for line in lines if line.startswith("step ")]
    assert all(steps), lines
    return [(int(m[1]), int(m[2])) for m in steps], [line for line in lines if line.startswith("warm-up ")]


@pytest.mark.procs
def test_run_logs_and_shows_progress(tiny_suite, tmp_path):
    """A real run: its log has a step line every k steps and the warm-up line; stderr shows the same lines,
    non-TTY and under --json; the measured steps are as many as before."""
    label = "dense · w1 · weak · seed 0 · repeat 0: "
    for steps, json_flag, expected in ((20, ["--json"], [(s, 20) for s in range(2, 21, 2)]),
                                      (4, [], [(s, 4) for s in range(1, 5)])):
        suite = tiny_suite(name=f"p{steps}", extra="").read_text().replace("steps = 3", f"steps = {steps}")
        path = tmp_path / f"p{steps}.toml"
        path.write_text(suite)
        out = tmp_path / f"out{steps}"
        res = run_cli("run", str(path), "--out", str(out), *json_flag)
        assert res.returncode == 0, res.stderr
        (log,) = (out / "logs").glob("*.log")
        logged, warm = _progress([p.text for p in map(ProgressLine.parse, log.read_text().splitlines()) if p])
        assert logged == expected
        assert len(warm) == 1 and re.fullmatch(r"warm-up 2 steps [\d.]+ s", warm[0])
        shown, shown_warm = _progress([line.removeprefix(label) for line in res.stderr.splitlines()
                                       if line.startswith(label)])
        assert shown == expected and shown_warm == warm
        (record,) = [json.loads(p.read_text()) for p in out.glob("*.json")]
        assert record["metrics"]["step_time_s"]["n"] == steps and len(record["steps"]) == steps
        if json_flag:
            assert json.loads(res.stdout)["runs"][0]["status"] == "ok"  # stdout: the JSON document alone


def test_a_terminal_shows_the_line_in_the_progress_bar(monkeypatch, tiny_suite, tmp_path, capsys):
    from rich.progress import Progress

    from benchsuite import cli, launch

    line = ProgressLine("step 1/3 loss 4.0000")

    def fake_run_suite(suite, out, on_event, **kwargs):
        on_event("start", 0, 1, suite.runs[0])
        on_event("progress", 0, 1, line)
        return []

    descriptions = []
    update = Progress.update
    monkeypatch.setattr(Progress, "update", lambda self, task, **kw: (descriptions.append(kw.get("description")),
                                                                      update(self, task, **kw)))
    monkeypatch.setattr(launch, "run_suite", fake_run_suite)
    monkeypatch.setattr(cli.err, "_force_terminal", True)
    assert cli.main(["run", str(tiny_suite()), "--out", str(tmp_path / "out")]) == 0
    assert descriptions[0] == "dense · w1 · weak · seed 0 · repeat 0 · starting ranks…"  # not blank till step 1
    assert descriptions[-1] == "dense · w1 · weak · seed 0 · repeat 0 · step 1/3 loss 4.0000"
    assert "weak: step" not in capsys.readouterr().err  # no plain line on a terminal


@pytest.mark.procs
def test_a_validation_failure_under_json_prints_one_json_error_document(tmp_path):
    """A jq pipeline gets a document on stdout even when the suite is refused (exit 2)."""
    suite = tmp_path / "bad.toml"
    suite.write_text('[[workload]]\nname = "w"\ntrain = { steps = "many" }\n')
    r = run_cli("run", str(suite), "--out", str(tmp_path / "out"), "--json")
    doc = json.loads(r.stdout)
    assert r.returncode == 2 and doc["error"] == "config" and doc["file"] == str(suite)
    assert [p["key"] for p in doc["problems"]] == ["workload[0] (w).train.steps"]
    r = run_cli("carbon", "project", str(tmp_path / "missing"), "--tokens", "1e9", "--json")
    assert r.returncode == 2 and json.loads(r.stdout)["error"] == "usage"
