"""One launcher per run: an advisory lock per run key in the results folder.

Two `benchsuite run` of one suite into one folder (two shells, two Slurm jobs on a shared file
system) must not measure a run twice. The launcher that starts a run holds flock on
DIR/.locks/KEY.lock for the run's life; another launcher skips that run and names the holder.
The kernel (or the NFS server) releases a flock when its holder dies, however it dies, so a
stale lock is simply taken over; the pid and host written inside only tell a user who holds it.

A lock that cannot be taken at all (a lock file this user may not write whose launcher is not
provably gone; a symlink, folder, FIFO or device at its name; a .locks that is no folder or not
writable) skips that run only, naming the path, the reason, the owner and the fix
(LockUnavailable): the next run may well be fine. Lock files (0o664) and .locks (0o775) are made
group-writable whatever the umask, so a team's results folder works for the whole group.

In a multi-node job node 0 alone takes the locks and tells the other nodes what it decided for
each run (Leader, Follower), so that no node starts torchrun for a run node 0 skipped.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import pwd
import secrets
import shlex
import socket
import stat
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

LOCK_DIR = ".locks"
FILE_MODE = 0o664  # the group may take over a lock file a teammate's dead launcher left
DIR_MODE = 0o775  # the group may create lock files in .locks
_NO_FLOCK = (errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOLCK)  # e.g. Lustre mounted without -o flock
_STORAGE = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO)  # the results folder itself fails: not a lock's problem
# Never through a symlink at the name, never blocked by a FIFO there, never inherited by the run's processes.
_OPEN = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_TRIES = 5  # a lock file replaced (taken over) between our open and our flock is looked at again this often
_KINDS = {stat.S_IFREG: "a file", stat.S_IFDIR: "a folder", stat.S_IFLNK: "a symbolic link", stat.S_IFIFO: "a FIFO",
          stat.S_IFSOCK: "a socket", stat.S_IFCHR: "a device", stat.S_IFBLK: "a device"}


@dataclass(frozen=True)
class Holder:
    """The launcher measuring a run (pid and host are unknown in the instant after it took the lock)."""

    pid: int | None
    host: str | None

    def __str__(self) -> str:
        if self.pid is None:
            return "another launcher"
        return f"pid {self.pid} on host {self.host}"


@dataclass(frozen=True)
class LockUnavailable:
    """A run's lock that cannot be taken, and what to do about it: that run is skipped, the suite goes on."""

    path: str
    reason: str
    owner: str
    fix: str

    def __str__(self) -> str:
        return f"{self.path} (owner {self.owner}) {self.reason}; {self.fix}"


def lock_path(out_dir: str | Path, key: str) -> Path:
    return Path(out_dir) / LOCK_DIR / f"{key}.lock"


def pid_alive(pid: int) -> bool:
    """Whether a process of this host has this pid (another user's too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def owner_name(uid: int) -> str:
    """The user name of uid, or 'uid N' where no account here has it (a file made on another host)."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


@contextlib.contextmanager
def claim(out_dir: str | Path, key: str) -> Iterator[Holder | LockUnavailable | None]:
    """Holds the run's lock for the block and yields None; when another launcher holds it, holds
    nothing and yields that launcher; when it cannot be taken at all, yields why (LockUnavailable).
    A full or read-only results folder is no lock problem: that OSError is raised."""
    path = lock_path(out_dir, key)
    try:
        got = _acquire(path)
    except OSError as e:
        if e.errno in _STORAGE:
            raise
        got = _unavailable(path, e)
    if not isinstance(got, int):
        yield got
        return
    try:
        os.ftruncate(got, 0)
        os.pwrite(got, json.dumps({"pid": os.getpid(), "host": socket.gethostname()}).encode(), 0)
        try:
            yield None
        finally:
            os.ftruncate(got, 0)  # released: no holder named any more
    finally:
        os.close(got)  # closing the descriptor releases the flock


def _acquire(path: Path) -> int | Holder:
    """A descriptor holding the run's lock, or the launcher holding it. A lock file replaced (taken
    over, _take_over) between our open and our flock is no longer the lock: it is looked at again."""
    dir_fd = _locks_dir(path.parent)
    try:
        for _ in range(_TRIES):
            got = _open(dir_fd, path)
            if got is None:
                continue
            if isinstance(got, Holder):
                return got
            held = False
            try:
                locked = _lock(got, path)
                if _still_at(dir_fd, path.name, got):
                    held = locked
                    return got if locked else _read_holder(got)
            finally:
                if not held:
                    os.close(got)
        return Holder(None, None)  # taken over again and again: other launchers hold it
    finally:
        os.close(dir_fd)


def _locks_dir(path: Path) -> int:
    """DIR/.locks, open as a folder (never through a symlink); created group-writable whatever the
    umask, keeping the setgid bit it inherits from a team's results folder."""
    try:
        os.mkdir(path, DIR_MODE)
    except FileExistsError:
        return os.open(path, _DIR)
    fd = os.open(path, _DIR)
    os.fchmod(fd, DIR_MODE | (os.fstat(fd).st_mode & stat.S_ISGID))
    return fd


def _open(dir_fd: int, path: Path) -> int | Holder | None:
    """The lock file, read-write (created when missing), or, where this user may not write it, what
    _take_over makes of it."""
    try:
        fd = os.open(path.name, os.O_RDWR | os.O_CREAT | _OPEN, FILE_MODE, dir_fd=dir_fd)
    except PermissionError as denied:
        return _take_over(dir_fd, path, denied)
    try:
        _check_regular(fd)
        _share(fd)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _check_regular(fd: int) -> None:
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO or device at the lock's name (_unavailable names it)
        raise OSError(errno.EINVAL, "not a regular file")


def _share(fd: int) -> None:
    """Group-writable (FILE_MODE), when this user owns the file: the umask (022) took group write away
    from the file just created, or from one an older launcher left."""
    st = os.fstat(fd)
    if st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) != FILE_MODE:
        os.fchmod(fd, FILE_MODE)


def _take_over(dir_fd: int, path: Path, denied: PermissionError) -> int | Holder | None:
    """A lock file this user may not write: another user's, or one left under a umask of 022. A live
    holder (its flock is held) is named. A provably gone one (its flock is free; or, where a read-only
    file cannot be flocked, as on NFS, it names a dead pid on this host) is replaced by a fresh file,
    locked before it is renamed over the old one: the run's lock is never free in between, and a
    launcher that locked the old file finds it replaced (_acquire). None: the file was replaced
    meanwhile, look again. Anything else raises `denied`."""
    try:
        old = os.open(path.name, os.O_RDONLY | _OPEN, dir_fd=dir_fd)
    except OSError:
        raise denied from None
    try:
        _check_regular(old)
        taken = _try_lock(old)
        if taken is False:
            return _read_holder(old)
        if taken is None and not _gone(_read_holder(old)):
            raise denied
        if not _still_at(dir_fd, path.name, old):
            return None
        try:
            return _fresh(dir_fd, path, b"")
        except PermissionError:  # .locks does not let this user replace it (not writable, or sticky)
            raise denied from None
    finally:
        os.close(old)


def _gone(holder: Holder) -> bool:
    """The holder named in a lock file is a dead process of this host."""
    return holder.pid is not None and holder.host == socket.gethostname() and not pid_alive(holder.pid)


def _fresh(dir_fd: int, path: Path, content: bytes) -> int:
    """A new file at path, group-writable, locked by the returned descriptor and holding content
    before it appears there (a rename replaces what was there): no reader sees it empty or unlocked."""
    tmp = f"{path.name}.{secrets.token_hex(8)}.tmp"
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | _OPEN, FILE_MODE, dir_fd=dir_fd)
    try:
        os.fchmod(fd, FILE_MODE)
        _lock(fd, path)
        os.write(fd, content)
        os.rename(tmp, path.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise
    return fd


def _still_at(dir_fd: int, name: str, fd: int) -> bool:
    """The open file is still the one at name (not replaced or removed since it was opened)."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


def _read_holder(fd: int) -> Holder:
    try:
        doc = json.loads(os.pread(fd, 4096, 0))
        return Holder(int(doc["pid"]), str(doc["host"]))
    except (OSError, ValueError, TypeError, KeyError):
        return Holder(None, None)


def _try_lock(fd: int) -> bool | None:
    """Takes fd's flock without waiting: True taken, False held by another open file, None where it
    cannot be told (a file system without flock; NFS flocks only a file open for writing: EBADF)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError as e:
        if e.errno in (*_NO_FLOCK, errno.EBADF):
            return None
        raise
    return True


def _lock(fd: int, path: Path) -> bool:
    """Takes the flock without waiting: False when another open file holds it."""
    taken = _try_lock(fd)
    if taken is None:
        warnings.warn(f"{path.parent}: this file system does not support flock, so runs are not locked; "
                      "do not start a second launcher into this folder", stacklevel=5)
    return taken is not False


def _unavailable(path: Path, error: OSError, folder: bool = False) -> LockUnavailable:
    """Why `error` kept the lock at path from being taken, told from what is there: path is the lock
    file, or (folder) the folder it goes in; a path that cannot be looked at is its folder's problem."""
    try:
        st = os.lstat(path)
    except OSError:
        return _unavailable(path.parent, error, folder=True)
    owner, kind = owner_name(st.st_uid), _KINDS.get(stat.S_IFMT(st.st_mode), "something else")
    quoted, wanted = shlex.quote(str(path)), "a folder" if folder else "a file"
    if kind != wanted:
        rm = "rm -r" if kind == "a folder" else "rm"
        return LockUnavailable(str(path), f"is {kind}, not {'a folder' if folder else 'a lock file'}", owner,
                               f"remove it ({rm} {quoted}); benchsuite creates {wanted} there")
    strerror = error.strerror or str(error)
    if folder:
        return LockUnavailable(str(path), f"does not let this user create lock files in it ({strerror})", owner,
                               f"ask {owner} to make it group-writable for the team (chmod g+ws {quoted})")
    return LockUnavailable(str(path), f"cannot be written by this user ({strerror})", owner,
                           f"if no benchsuite of {owner} is running, remove it (rm {quoted}) or have it made "
                           f"group-writable (chmod g+w {quoted})")


# Multi-node jobs: node 0 decides each run (it alone takes the locks); the other nodes follow it.

NODE_WAIT_S = 600.0  # how long a node waits for a sign of another: as long as torchrun waits for a rendezvous
POLL_S = 0.2


def _job_files(out_dir: Path, rdzv_id: str, endpoint: str | None) -> Path:
    """DIR/.locks/job-HASH: the stem of one job's files (a job is its rendezvous id and endpoint)."""
    digest = hashlib.sha256(f"{rdzv_id}\n{endpoint}".encode()).hexdigest()[:16]
    return Path(out_dir) / LOCK_DIR / f"job-{digest}"


def _line(doc: dict) -> bytes:
    return json.dumps(doc).encode() + b"\n"


def _read_all(fd: int) -> bytes:
    chunks, offset = [], 0
    while chunk := os.pread(fd, 1 << 16, offset):
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def _docs(content: bytes) -> list[dict]:
    """The complete lines of a plan (a line still being written has no newline yet)."""
    try:
        docs = [json.loads(line) for line in content.split(b"\n")[:-1]]
    except ValueError:
        return []
    return [d for d in docs if isinstance(d, dict)]


def _live_content(path: Path) -> bytes | None:
    """What a file holds while a live launcher holds its flock; None when it is missing or its launcher
    is gone (the flock is free). Where flock cannot tell, the file is taken as live."""
    try:
        fd = os.open(path, os.O_RDWR | _OPEN)
    except OSError:
        return None
    try:
        return None if _try_lock(fd) else _read_all(fd)
    finally:
        os.close(fd)  # a flock taken to look is released at once


class Leader:
    """Node 0's side of a multi-node job. At the suite's start it waits (NODE_WAIT_S at most) for each
    other node's greeting: a file naming a random token, locked by that node's live launcher. Then it
    writes its plan, DIR/.locks/job-HASH.plan: the tokens, then one line per run as it decides it
    (tell: start, or which skip and why), and an end line when its suite ends. The plan stays locked
    while node 0 lives. Its token proves to a node that the plan is this job's, not one a job with
    the same --rdzv-id left; the lock tells it that node 0 died. The files stay for the next job."""

    def __init__(self, out_dir: Path, rdzv_id: str, endpoint: str | None, nnodes: int, wait_s: float = NODE_WAIT_S):
        stem = _job_files(out_dir, rdzv_id, endpoint)
        tokens = _greetings(stem, nnodes, wait_s)
        dir_fd = _locks_dir(stem.parent)
        try:
            header = {"tokens": tokens, "pid": os.getpid(), "host": socket.gethostname()}
            self._fd = _fresh(dir_fd, stem.with_suffix(".plan"), _line(header))
        finally:
            os.close(dir_fd)

    def tell(self, index: int, decision: dict) -> None:
        """Node 0's decision for the run at index of the plan (one line, one write)."""
        os.write(self._fd, _line({"index": index, **decision}))

    def close(self) -> None:
        """The suite ended (done, interrupted or failed): the other nodes stop waiting for decisions."""
        try:
            os.write(self._fd, _line({"end": True}))
        finally:
            os.close(self._fd)


def _greetings(stem: Path, nnodes: int, wait_s: float) -> dict[str, str]:
    """The tokens of nodes 1..nnodes-1 whose live launchers greeted, waiting wait_s at most for all."""
    tokens: dict[str, str] = {}
    deadline = time.monotonic() + wait_s
    while True:
        for rank in range(1, nnodes):
            content = None if str(rank) in tokens else _live_content(stem.with_suffix(f".node{rank}"))
            if content:
                tokens[str(rank)] = content.decode(errors="replace")
        if len(tokens) == nnodes - 1 or time.monotonic() >= deadline:
            return tokens
        time.sleep(POLL_S)


class Follower:
    """A node > 0's side of a multi-node job: greets node 0 with a fresh token, then hears node 0's
    decision for each run from its plan (Leader). It waits as long as node 0 lives; for wait_s where it
    cannot tell (no plan of this job yet, a file system without flock)."""

    def __init__(self, out_dir: Path, rdzv_id: str, endpoint: str | None, node_rank: int,
                 wait_s: float = NODE_WAIT_S):
        stem = _job_files(out_dir, rdzv_id, endpoint)
        self.plan = stem.with_suffix(".plan")
        self.wait_s = wait_s
        self._rank, self._token = str(node_rank), secrets.token_hex(16)
        dir_fd = _locks_dir(stem.parent)
        try:
            self._greeting = _fresh(dir_fd, stem.with_suffix(f".node{node_rank}"), self._token.encode())
        finally:
            os.close(dir_fd)

    def hear(self, index: int) -> dict | str:
        """Node 0's decision for the run at index of the plan, or why there is none (node 0 ended or died
        before deciding it, or gave no sign of life for wait_s)."""
        deadline, seen = time.monotonic() + self.wait_s, False
        while time.monotonic() < deadline:
            plan = self._read_plan()
            if plan is not None:
                seen, (docs, alive) = True, plan
                decision = next((d for d in docs if d.get("index") == index), None)
                if decision is not None:
                    return decision
                if any(d.get("end") for d in docs):
                    return "node 0 ended its suite before deciding this run"
                if alive is False:
                    return "node 0's launcher died before deciding this run"
                if alive:
                    deadline = time.monotonic() + self.wait_s
            time.sleep(POLL_S)
        if seen:
            return f"node 0 decided nothing for {self.wait_s:g} s"
        return (f"node 0's plan {self.plan} did not appear in {self.wait_s:g} s: start node 0 with the same "
                "results folder (on a file system every node shares), --rdzv-id and --rdzv-endpoint")

    def _read_plan(self) -> tuple[list[dict], bool | None] | None:
        """The plan's decisions and whether node 0 lives (None: cannot tell), when the plan is this job's
        (names this node's token). Liveness is looked at first: a dead node 0's plan read after it is final."""
        try:
            fd = os.open(self.plan, os.O_RDWR | _OPEN)
        except OSError:
            return None
        try:
            taken = _try_lock(fd)
            docs = _docs(_read_all(fd))
        finally:
            os.close(fd)
        tokens = docs[0].get("tokens") if docs else None
        if not isinstance(tokens, dict) or tokens.get(self._rank) != self._token:
            return None
        return docs[1:], None if taken is None else not taken

    def close(self) -> None:
        os.close(self._greeting)


@contextlib.contextmanager
def coordinate(out_dir: Path, rdzv_id: str, endpoint: str | None, nnodes: int,
               node_rank: int) -> Iterator[Leader | Follower | None]:
    """This launcher's side of a multi-node job for the block (None for a one-node job)."""
    if nnodes == 1:
        yield None
        return
    side = Leader(out_dir, rdzv_id, endpoint, nnodes) if node_rank == 0 else \
        Follower(out_dir, rdzv_id, endpoint, node_rank)
    try:
        yield side
    finally:
        side.close()
