"""One launcher per run, with real processes: a lock held by another process names it, a lock
whose holder was SIGKILLed is taken over, two `benchsuite run` of one suite into one folder
measure each run once, a node > 0 follows node 0's skips, and another user takes over a dead
launcher's read-only lock file. In-process cases of unavailable locks: test_lock_problems.py."""

from __future__ import annotations

import getpass
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from benchsuite.runlock import Holder, claim, lock_path
from helpers import REPO, free_port, run_cli
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
    assert recs[k1].record.status == "failed" and recs[k1].record.error.type == "WorkerKilled"
    assert recs[k2].record.status == "ok" and len(recs) == 2


TWO_NODES = """
[defaults]
model = { layers = 1, hidden = 32, heads = 2, vocab = 128, seq_len = 16 }
train = { micro_batch = 2, steps = 3, warmup_steps = 2, timeout_s = 600 }
[[workload]]
name = "dense"
[sweep]
world_size = [2, 4]
nodes = [2]
"""


@pytest.mark.parametrize("blocked", ["locked", "unavailable"])
def test_node1_skips_the_run_node0_skipped_without_waiting_for_the_rendezvous(tmp_path, blocked, reap):
    """Two nodes on one host. Run 1's lock is held by another launcher, or is a symlink: node 0 skips it.
    Node 1 hears so and skips it too, not starting a torchrun that would wait for node 0 until the run's
    timeout (600 s); both then measure run 2 together."""
    suite = tmp_path / "two.toml"
    suite.write_text(TWO_NODES)
    out, port = tmp_path / "out", free_port()
    k1, k2 = run_keys(suite)
    reap += [k1, k2]
    holder = None
    out.mkdir()
    if blocked == "locked":
        holder = subprocess.Popen([sys.executable, "-c", HOLD.replace('"k"', repr(k1)), str(out)], cwd=REPO,
                                  stdout=subprocess.PIPE, text=True)
        assert holder.stdout.readline() == "held\n"
    else:
        (out / ".locks").mkdir()
        lock_path(out, k1).symlink_to("/etc/passwd")
    cmd = CLI + ["run", str(suite), "--out", str(out), "--nnodes", "2", "--rdzv-endpoint", f"127.0.0.1:{port}",
                 "--rdzv-id", "t", "--json"]
    nodes = [subprocess.Popen(cmd + ["--node-rank", str(n)], cwd=REPO, text=True, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE) for n in (0, 1)]
    try:
        results = [n.communicate(timeout=240) for n in nodes]
    finally:
        for n in nodes:
            n.kill()
        if holder:
            holder.kill()
            holder.wait(timeout=30)
    for (stdout, stderr), n in zip(results, nodes):
        assert "Traceback" not in stderr, stderr
        assert n.returncode == (0 if blocked == "locked" else 1), stderr
    runs = [json.loads(stdout)["runs"] for stdout, _ in results]
    skipped = "skipped_locked" if blocked == "locked" else "skipped_lock_unavailable"
    assert [[r["status"] for r in node] for node in runs] == [[skipped, "ok"], [skipped, "ok"]]
    if blocked == "locked":
        assert runs[0][0]["holder"] == runs[1][0]["holder"] == f"pid {holder.pid} on host {socket.gethostname()}"
    else:
        assert runs[0][0]["lock"] == runs[1][0]["lock"]
        assert runs[1][0]["lock"].startswith(f"{lock_path(out, k1)} (owner {getpass.getuser()}) is a symbolic link")
    assert not [p for p in (out / "logs").iterdir() if k1 in p.name]  # no torchrun started for run 1, on any node
    recs = strict_load(out)
    assert list(recs) == [k2] and recs[k2].record.status == "ok" and recs[k2].record.env.nodes == 2


GRAB = """
import json, sys
from benchsuite.runlock import claim
with claim(sys.argv[1], "k") as got:
    print(json.dumps(None if got is None else str(got)))
"""
AS_NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
NOBODY_ENV = {"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"}  # nothing of the checkout's environment


def _private_folder(path: str) -> Path | None:
    """The first folder on the way to path that other users cannot enter (no o+x), e.g. mktemp -d's 0700."""
    for folder in reversed(Path(os.path.abspath(path)).parents):
        if not os.stat(folder).st_mode & stat.S_IXOTH:
            return folder
    return None


def _readable_copy(dest: Path) -> Path:
    """The package as this checkout has it, world-readable under dest: nobody may not reach the checkout (a clone
    under a private folder), and the venv's editable install points there too."""
    shutil.copytree(REPO / "benchsuite", dest / "benchsuite", ignore=shutil.ignore_patterns("__pycache__"))
    for path in [dest, *dest.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return dest


def _interpreter_for_nobody(code: Path, team: Path) -> str:
    """An interpreter user nobody can execute that imports the copied runlock and can write in the lock folder,
    tried as nobody; the test skips, saying why, where none does."""
    candidates = dict.fromkeys(c for c in (sys.executable, os.path.realpath(sys.executable),
                                           getattr(sys, "_base_executable", ""), shutil.which("python3"),
                                           "/usr/bin/python3") if c)
    probe = f"import os, sys, benchsuite.runlock; sys.exit(0 if os.access({str(team)!r}, os.W_OK | os.X_OK) else 3)"
    failures = []
    for python in candidates:
        try:
            res = subprocess.run([*AS_NOBODY, python, "-B", "-c", probe], cwd=code, env=NOBODY_ENV,
                                 capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as e:
            failures.append(f"{python}: {e}")
            continue
        if res.returncode == 0:
            return python
        said = (f"cannot write in {team}" if res.returncode == 3 else
                (res.stderr.strip().splitlines() or [f"exit status {res.returncode}"])[-1])
        private = _private_folder(python)
        failures.append(f"{python}: {said}" + (f" ({private} is private, mode "
                                               f"{stat.S_IMODE(os.stat(private).st_mode):o})" if private else ""))
    pytest.skip(f"user nobody cannot execute an interpreter that runs a copy of benchsuite.runlock (the checkout "
                f"or the interpreter sits under a private folder): {'; '.join(failures)}")


def _grab_as_nobody(python: str, code: Path, team: Path):
    """GRAB's answer, run as nobody: its JSON, or the test fails with nobody's stderr."""
    res = subprocess.run([*AS_NOBODY, python, "-B", "-c", GRAB, str(team)], cwd=code, env=NOBODY_ENV,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and res.stdout.strip(), f"as nobody: exit status {res.returncode}: {res.stderr}"
    return json.loads(res.stdout)


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="runs a launcher as another user")
def test_another_users_read_only_lock_file_left_by_a_dead_launcher_is_taken_over():
    """The kernel's own refusal: root leaves a read-only lock file (0o644) naming a dead pid; nobody takes it over
    (a fresh file, nobody's, 0o664), and names it while a live launcher holds it. nobody runs a world-readable
    copy of the package (the checkout may sit under a private folder) with an interpreter it can execute."""
    base = Path(tempfile.mkdtemp(prefix="benchsuite-team-"))  # pytest's folders are root's only
    try:
        base.chmod(0o755)
        team, code = base / "team", _readable_copy(base / "code")
        team.mkdir(mode=0o777)
        team.chmod(0o777)
        path = lock_path(team, "k")
        path.parent.mkdir(mode=0o777)
        path.parent.chmod(0o777)
        python = _interpreter_for_nobody(code, team)
        path.write_text(json.dumps({"pid": 2**22 + 12345, "host": socket.gethostname()}))
        path.chmod(0o644)
        assert _grab_as_nobody(python, code, team) is None
        st = os.stat(path)
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (65534, 0o664)

        path.unlink()
        child = subprocess.Popen([sys.executable, "-c", HOLD, str(team)], cwd=REPO, stdout=subprocess.PIPE, text=True)
        try:
            assert child.stdout.readline() == "held\n"
            path.chmod(0o644)  # as an older launcher under umask 022 made it
            assert _grab_as_nobody(python, code, team) == f"pid {child.pid} on host {socket.gethostname()}"
        finally:
            child.kill()
            child.wait(timeout=30)
    finally:
        shutil.rmtree(base)
