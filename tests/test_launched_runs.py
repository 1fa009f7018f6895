"""What a launched run is and how long it took. The thread count per rank is part of a run: a rerun at
another OMP_NUM_THREADS into the same folder is another run, measured beside the first (it was skipped as
"already recorded", or written under the same key), and every view names the two apart; a rerun at the same
count is skipped. A record's duration counts from the launch."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import pytest

from helpers import run_cli
from helpers.launcher import run_keys


@pytest.mark.procs
def test_a_rerun_at_another_thread_count_is_another_run(tmp_path, tiny_suite):
    suite, out = tiny_suite(), tmp_path / "out"

    def run(threads: str) -> list[str]:
        r = run_cli("run", str(suite), "--out", str(out), "--json", env={"OMP_NUM_THREADS": threads})
        assert r.returncode == 0, r.stderr[-2000:]
        return [x["status"] for x in json.loads(r.stdout)["runs"]]

    assert run("1") == ["ok"]
    assert run("2") == ["ok"]  # measured, not skipped as recorded
    assert run("2") == ["skipped_recorded"]
    keys = {threads: run_keys(suite, {"OMP_NUM_THREADS": threads})[0] for threads in ("1", "2")}
    assert keys["1"] != keys["2"]
    files = sorted(p.name for p in out.glob("*.json"))
    assert len(files) == 2 and all(any(key in f for f in files) for key in keys.values())

    listed = json.loads(run_cli("list", str(out), "--json").stdout)
    names = sorted(r["record_name"] for r in listed)
    assert names == ["dense · w1 · 1 thread · seed 0 · repeat 0", "dense · w1 · 2 threads · seed 0 · repeat 0"]
    text = run_cli("list", str(out)).stdout
    assert all(name in text for name in names)


@pytest.mark.procs
def test_a_records_duration_counts_from_the_launch(tmp_path, tiny_suite):
    """duration_s is the run's wall time, launch included (the process start and torch's import are most of
    a tiny run): at least most of what the launcher timed, and started_at is the launcher's start."""
    from benchsuite.config import load_suite
    from benchsuite.launch import run_suite
    from benchsuite.results.decoding import read_record

    t0 = datetime.datetime.now(datetime.timezone.utc)
    (outcome,) = run_suite(load_suite(tiny_suite()), tmp_path / "out")
    rec = read_record(Path(outcome.record_path))
    assert outcome.duration_s * 0.7 <= rec.duration_s <= outcome.duration_s
    assert (rec.started_at - t0).total_seconds() < 1.0  # the launch, not the worker's start after torch's import
