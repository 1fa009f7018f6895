"""Locks on a shared file system, in this process: what is at a lock's path when the lock cannot be taken
(a symlink, a folder, a FIFO, a .locks that is no folder, a lock file or folder this user may not write) is
named with its owner and the fix, and the suite goes on; a read-only lock file whose launcher is gone is
taken over; lock files are group-writable whatever the umask; node 0 tells the other nodes its decisions.

Root writes any file, so where a test needs a permission refused it refuses it as the kernel would for
another user (deny_writing); as a normal user the file's real mode refuses it."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import pwd
import socket
import stat
import threading

import pytest

from benchsuite import cli, launch, runlock
from benchsuite.record import write_record
from benchsuite.runlock import Follower, Holder, Leader, LockUnavailable, claim, lock_path
from helpers.launcher import run_keys
from helpers.records import make_record

ME = pwd.getpwuid(os.geteuid()).pw_name
ROOT = os.geteuid() == 0
DEAD_PID = 2**22 + 12345  # above pid_max's default: no process has it


@pytest.fixture
def deny_writing(monkeypatch):
    """deny(name): opening a file of that name for writing fails with EACCES, as for a file of another user
    without group write; also for root, whom the kernel never refuses. Reading it still works."""
    names = set()
    real_open = os.open

    def guarded(path, flags, *args, **kwargs):
        if os.path.basename(os.fsdecode(path)) in names and flags & (os.O_RDWR | os.O_WRONLY):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fsdecode(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", guarded)
    return names.add


def another_users(path, holder: dict | None) -> None:
    """A lock file another user's launcher left: read-only to us (mode 0o644, owned by nobody where we may chown)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(holder) if holder else "")
    path.chmod(0o644 if ROOT else 0o444)
    if ROOT:
        os.chown(path, 65534, 65534)


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def plant(out, what: str, key: str = "k"):
    """Something that is no lock file at the lock's path (or no folder at .locks); returns the path to name."""
    locks = out / ".locks"
    if what == "locks is a file":
        locks.write_text("")
        return locks
    if what == "locks is a symlink":
        (out / "elsewhere").mkdir()
        locks.symlink_to(out / "elsewhere")
        return locks
    locks.mkdir(parents=True)
    path = lock_path(out, key)
    {"symlink": lambda: path.symlink_to("/etc/passwd"), "dangling symlink": lambda: path.symlink_to("/nonexistent"),
     "folder": path.mkdir, "fifo": lambda: os.mkfifo(path)}[what]()
    return path


KINDS = {"symlink": "is a symbolic link, not a lock file", "dangling symlink": "is a symbolic link, not a lock file",
         "folder": "is a folder, not a lock file", "fifo": "is a FIFO, not a lock file",
         "locks is a file": "is a file, not a folder", "locks is a symlink": "is a symbolic link, not a folder"}


@pytest.mark.parametrize("what", list(KINDS))
def test_what_is_no_lock_file_at_the_lock_path_is_named_with_its_owner_and_the_fix(tmp_path, what):
    path = plant(tmp_path, what)
    before = os.lstat(path)
    with claim(tmp_path, "k") as got:  # a FIFO must not block the open: this returns
        assert isinstance(got, LockUnavailable)
    assert (got.path, got.reason, got.owner) == (str(path), KINDS[what], ME)
    assert got.fix.startswith(f"remove it (rm {'-r ' if what == 'folder' else ''}{path})")
    assert str(got).startswith(f"{path} (owner {ME}) {KINDS[what]}; remove it")
    after = os.lstat(path)
    assert (after.st_ino, after.st_mode) == (before.st_ino, before.st_mode)  # left as it was
    assert os.path.realpath("/etc/passwd") == "/etc/passwd" and os.stat("/etc/passwd").st_size > 0


@pytest.mark.skipif(not ROOT, reason="chown to a uid without an account needs root")
def test_an_owner_without_an_account_is_named_by_uid(tmp_path):
    path = plant(tmp_path, "symlink")
    os.lchown(path, 54321, 54321)
    assert not any(p.pw_uid == 54321 for p in pwd.getpwall())
    with claim(tmp_path, "k") as got:
        assert got.owner == "uid 54321" and "(owner uid 54321)" in str(got)


def test_a_read_only_lock_file_whose_launcher_is_gone_is_taken_over_group_writable(tmp_path, deny_writing, umask_022):
    path = lock_path(tmp_path, "k")
    another_users(path, {"pid": DEAD_PID, "host": socket.gethostname()})
    deny_writing("k.lock")
    old = os.stat(path).st_ino
    with claim(tmp_path, "k") as got:
        assert got is None
        st = os.stat(path)
        assert st.st_ino != old and stat.S_IMODE(st.st_mode) == 0o664 and st.st_uid == os.geteuid()
        assert json.loads(path.read_text()) == {"pid": os.getpid(), "host": socket.gethostname()}
    assert sorted(p.name for p in path.parent.iterdir()) == ["k.lock"]  # no temp file left


def test_a_read_only_lock_file_whose_launcher_lives_names_it(tmp_path, deny_writing):
    path = lock_path(tmp_path, "k")
    another_users(path, {"pid": 4242, "host": "node9"})
    deny_writing("k.lock")
    fd = os.open(path, os.O_RDONLY)  # another launcher's open file holds the flock
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with claim(tmp_path, "k") as got:
            assert got == Holder(4242, "node9")
    finally:
        os.close(fd)
    assert json.loads(path.read_text()) == {"pid": 4242, "host": "node9"}


@pytest.mark.parametrize("holder, taken", [({"pid": DEAD_PID, "host": None}, True),  # host filled in below
                                           ({"pid": os.getpid(), "host": None}, False),
                                           ({"pid": DEAD_PID, "host": "another-host"}, False),
                                           (None, False)])
def test_where_a_read_only_file_cannot_be_flocked_a_dead_pid_on_this_host_is_what_allows_a_takeover(
        tmp_path, deny_writing, monkeypatch, holder, taken):
    """On NFS a file open read-only cannot be flocked (EBADF): only its holder's pid, dead on this host, tells."""
    if holder and holder["host"] is None:
        holder = {**holder, "host": socket.gethostname()}
    path = lock_path(tmp_path, "k")
    another_users(path, holder)
    deny_writing("k.lock")
    real_flock = fcntl.flock

    def nfs_flock(fd, op):
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY:
            raise OSError(errno.EBADF, os.strerror(errno.EBADF))
        return real_flock(fd, op)

    monkeypatch.setattr(fcntl, "flock", nfs_flock)
    with claim(tmp_path, "k") as got:
        if taken:
            assert got is None
            return
        assert isinstance(got, LockUnavailable)
    owner = "nobody" if ROOT else ME
    assert (got.path, got.owner) == (str(path), owner)
    assert got.reason == "cannot be written by this user (Permission denied)"
    assert got.fix == (f"if no benchsuite of {owner} is running, remove it (rm {path}) or have it made "
                       f"group-writable (chmod g+w {path})")


def test_a_locks_folder_this_user_may_not_write_is_named(tmp_path, deny_writing):
    (tmp_path / ".locks").mkdir()
    deny_writing("k.lock")  # creating it fails as in a folder without write permission
    with claim(tmp_path, "k") as got:
        assert isinstance(got, LockUnavailable)
    locks = tmp_path / ".locks"
    assert (got.path, got.owner) == (str(locks), ME)
    assert got.reason == "does not let this user create lock files in it (Permission denied)"
    assert got.fix == f"ask {ME} to make it group-writable for the team (chmod g+ws {locks})"
    assert not lock_path(tmp_path, "k").exists()


def test_a_full_disk_is_no_lock_problem_it_is_raised(tmp_path, monkeypatch):
    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    (tmp_path / ".locks").mkdir()
    monkeypatch.setattr(os, "open", full)
    with pytest.raises(OSError) as e, claim(tmp_path, "k"):
        pass
    assert e.value.errno == errno.ENOSPC


def test_lock_files_and_their_folder_are_group_writable_under_umask_022(tmp_path, umask_022):
    tmp_path.chmod(0o2775)  # a team's results folder: group-writable, setgid
    with claim(tmp_path, "k") as got:
        assert got is None
    assert stat.S_IMODE(os.stat(lock_path(tmp_path, "k")).st_mode) == 0o664
    assert stat.S_IMODE(os.stat(tmp_path / ".locks").st_mode) == 0o2775  # the setgid bit is inherited, kept
    old = lock_path(tmp_path, "old")
    old.write_text("")  # left by an older launcher under umask 022
    assert stat.S_IMODE(os.stat(old).st_mode) == 0o644
    with claim(tmp_path, "old") as got:
        assert got is None
    assert stat.S_IMODE(os.stat(old).st_mode) == 0o664


def test_a_lock_file_replaced_between_open_and_flock_is_looked_at_again(tmp_path, monkeypatch):
    """A takeover renames a fresh locked file over the old one: a launcher that locked the old file holds
    nothing, and must find the new one held."""
    path = lock_path(tmp_path, "k")
    path.parent.mkdir()
    path.write_text("")
    real_lock, taker = runlock._lock, {}

    def lock_after_a_takeover(fd, p):
        if "fd" not in taker:  # the first flock: another launcher takes the lock over just before it
            taker["fd"] = None  # (its own flock, inside _fresh, goes through)
            dir_fd = os.open(path.parent, os.O_RDONLY)
            taker["fd"] = runlock._fresh(dir_fd, path, json.dumps({"pid": 4242, "host": "node9"}).encode())
            os.close(dir_fd)
        return real_lock(fd, p)

    monkeypatch.setattr(runlock, "_lock", lock_after_a_takeover)
    try:
        with claim(tmp_path, "k") as got:
            assert got == Holder(4242, "node9")
    finally:
        os.close(taker["fd"])


# ----------------------------------------------------------------------------- the suite goes on


def fake_launch(run, key, out_dir, hardware, rdzv, peak_tflops=None, threads=None, on_progress=None, repeat=0,
                constants=None):
    rec = {**make_record(key), "config": run.to_dict(), "suite": run.suite, "workload": run.workload}
    return launch.RunOutcome(run, key, launch.RunStatus.OK, str(write_record(out_dir, rec)), None, 0.1)


@pytest.mark.parametrize("what", ["symlink", "folder", "fifo"])
def test_a_run_whose_lock_is_unavailable_is_skipped_naming_it_and_the_suite_goes_on(
        tmp_path, tiny_suite, monkeypatch, capsys, what):
    suite = tiny_suite(name="blocked", world_sizes=(1, 2))
    out = tmp_path / "out"
    k1, k2 = run_keys(suite)
    path = plant(out, what, k1)
    monkeypatch.setattr(launch, "launch_run", fake_launch)
    assert cli.main(["run", str(suite), "--out", str(out)]) == 1  # not everything was measured
    err = capsys.readouterr().err
    assert "Traceback" not in err and "free space" not in err
    assert f"skipped, lock unavailable: {path} (owner {ME}) {KINDS[what]}; remove it" in " ".join(err.split())
    assert "1 ok, 0 failed, 1 skipped (lock unavailable)" in err
    assert [p.name for p in out.glob("*.json")] and all(k2 in p.name for p in out.glob("*.json"))
    assert cli.main(["run", str(suite), "--out", str(out), "--json"]) == 1
    runs = json.loads(capsys.readouterr().out)["runs"]
    assert [r["status"] for r in runs] == ["skipped_lock_unavailable", "skipped_recorded"]
    assert runs[0]["lock"].startswith(f"{path} (owner {ME}) {KINDS[what]}")


# ----------------------------------------------------------------------------- node 0 and the other nodes


def test_a_node_hears_node0s_decisions_and_ignores_the_plan_an_earlier_job_left(tmp_path):
    earlier = Follower(tmp_path, "job", "h:1", 1, wait_s=5)
    leader = Leader(tmp_path, "job", "h:1", 2, wait_s=5)
    leader.tell(0, {"rid": "a", "status": "skipped_locked"})
    assert earlier.hear(0) == {"index": 0, "rid": "a", "status": "skipped_locked"}
    leader.close()
    earlier.close()

    follower = Follower(tmp_path, "job", "h:1", 1, wait_s=0.5)  # the next job with the same id
    assert "did not appear in 0.5 s" in follower.hear(0)  # the earlier job's plan is not this job's
    follower.wait_s = 30
    heard = {}
    listener = threading.Thread(target=lambda: heard.update(d=follower.hear(0)))
    listener.start()
    leader = Leader(tmp_path, "job", "h:1", 2, wait_s=5)
    leader.tell(0, {"rid": "a", "status": "start"})
    listener.join(timeout=30)
    assert heard["d"] == {"index": 0, "rid": "a", "status": "start"}
    leader.close()
    assert follower.hear(1) == "node 0 ended its suite before deciding this run"
    follower.close()


def test_a_node_hears_that_node0_died_at_once(tmp_path):
    follower = Follower(tmp_path, "job", "h:1", 1, wait_s=60)
    leader = Leader(tmp_path, "job", "h:1", 2, wait_s=5)
    os.close(leader._fd)  # SIGKILLed: no end line, and its flock is released
    assert follower.hear(0) == "node 0's launcher died before deciding this run"
    follower.close()


def test_node0_waits_for_the_other_nodes_only_as_long_as_they_live(tmp_path):
    gone = Follower(tmp_path, "job", "h:1", 1)
    gone.close()  # a greeting whose launcher is gone
    with contextlib.closing(Leader(tmp_path, "job", "h:1", 2, wait_s=0.5)) as leader:
        leader.tell(0, {"rid": "a", "status": "start"})
    plan = (tmp_path / ".locks").glob("job-*.plan")
    assert json.loads(next(plan).read_text().splitlines()[0])["tokens"] == {}


def test_a_node_following_another_plan_stops_saying_so(tmp_path, tiny_suite):
    from benchsuite.config import load_suite

    run = load_suite(tiny_suite()).runs[0]
    follower = Follower(tmp_path, "job", "h:1", 1, wait_s=5)
    with contextlib.closing(Leader(tmp_path, "job", "h:1", 2, wait_s=5)) as leader:
        leader.tell(0, {"rid": "other", "status": "start"})
        outcome = launch._follow_node0(follower, 0, run, "k" * 16, 0, launch=lambda: pytest.fail("launched"))
    follower.close()
    assert outcome.status == launch.RunStatus.SKIPPED_NO_DECISION
    assert outcome.error["message"].startswith("node 0 planned another run here (other, this node kkkk")
