"""One launcher per run, with real processes: a lock held by another process names it, a lock
whose holder was SIGKILLed is taken over, and two `benchsuite run` of one suite into one folder
measure each run once."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys

import pytest

from benchsuite.runlock import Holder, claim, lock_path
from helpers import REPO, run_cli
from helpers.launcher import CLI, rank_started, run_keys, strict_load, wait_for, workdirs

pytestmark = pytest.mark.procs  # every test here launches processes

HOLD = """
import sys, time
from benchsuite.runlock import claim
with claim(sys.argv[1], "k") as holder:
    assert holder is None
    print("held", flush=True)
    time.sleep(600)
"""


def test_a_held_lock_names_its_holder_and_the_lock_of_a_killed_holder_is_taken_over(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "held\n"
        with claim(tmp_path, "k") as holder:
            assert holder == Holder(child.pid, socket.gethostname())
            assert str(holder) == f"pid {child.pid} on host {socket.gethostname()}"
    finally:
        child.kill()
        child.wait(timeout=30)
    assert json.loads(lock_path(tmp_path, "k").read_text())["pid"] == child.pid  # a dead holder's name is left
    with claim(tmp_path, "k") as holder:
        assert holder is None  # the kernel released the dead holder's flock: taken over
        assert json.loads(lock_path(tmp_path, "k").read_text()) == {"pid": os.getpid(), "host": socket.gethostname()}
        with claim(tmp_path, "k") as other:  # a second open file in this same process is another claimant
            assert other == Holder(os.getpid(), socket.gethostname())
    assert lock_path(tmp_path, "k").read_text() == ""


def test_two_launchers_of_one_suite_into_one_folder_measure_each_run_once(tmp_path, tiny_suite, reap):
    """A measures run 1 (held busy by a hanging rank) when B starts: B skips run 1, naming A, and
    measures run 2. Then run 1 ends (its rank is killed) and A finds run 2 recorded by B: not measured
    again, although A's own resume scan, at its start, saw no record of it."""
    suite = tiny_suite(name="twice", world_sizes=(2, 1), timeout=120)
    out = tmp_path / "out"
    k1, k2 = run_keys(suite)
    reap += [k1, k2]
    old = workdirs(k1)
    a = subprocess.Popen(CLI + ["run", str(suite), "--out", str(out), "--json"], cwd=REPO, text=True,
                         env={**os.environ, "BENCHSUITE_INJECT_FAULT": "hang:1"},  # only run 1 has a rank 1
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_for(lambda: rank_started(k1, 1, old), 120, "A's run 1, rank 1")
    b = run_cli("run", str(suite), "--out", str(out), "--json", timeout=180)
    assert b.returncode == 0, b.stderr
    b_runs = json.loads(b.stdout)["runs"]
    assert [r["status"] for r in b_runs] == ["skipped_locked", "ok"]
    assert b_runs[0]["holder"] == f"pid {a.pid} on host {socket.gethostname()}"

    (hung,) = workdirs(k1) - old
    os.kill(int((hung / "pid.1").read_text()), signal.SIGKILL)
    a_out, a_err = a.communicate(timeout=120)
    assert a.returncode == 1, a_err
    assert [r["status"] for r in json.loads(a_out)["runs"]] == ["failed", "skipped_recorded"]
    recs = strict_load(out)
    assert recs[k1]["status"] == "failed" and recs[k1]["error"]["type"] == "WorkerKilled"
    assert recs[k2]["status"] == "ok" and len(recs) == 2
