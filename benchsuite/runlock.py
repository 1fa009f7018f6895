"""One launcher per run: an advisory lock per run key in the results folder.

Two `benchsuite run` of one suite into one folder (two shells, two Slurm jobs on a shared file
system) must not measure a run twice. The launcher that starts a run holds flock on
DIR/.locks/KEY.lock for the run's life; another launcher skips that run and names the holder.
The kernel (or the NFS server) releases a flock when its holder dies, however it dies, so a
stale lock is simply taken over; the pid and host written inside only tell a user who holds it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

LOCK_DIR = ".locks"
_NO_FLOCK = (errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOLCK)  # e.g. Lustre mounted without -o flock


@dataclass(frozen=True)
class Holder:
    """The launcher measuring a run (pid and host are unknown in the instant after it took the lock)."""

    pid: int | None
    host: str | None

    def __str__(self) -> str:
        if self.pid is None:
            return "another launcher"
        return f"pid {self.pid} on host {self.host}"


def lock_path(out_dir: str | Path, key: str) -> Path:
    return Path(out_dir) / LOCK_DIR / f"{key}.lock"


def _read_holder(fd: int) -> Holder:
    try:
        doc = json.loads(os.pread(fd, 4096, 0))
        return Holder(int(doc["pid"]), str(doc["host"]))
    except (OSError, ValueError, TypeError, KeyError):
        return Holder(None, None)


def _lock(fd: int, path: Path) -> bool:
    """Takes the flock without waiting: False when another open file holds it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError as e:
        if e.errno not in _NO_FLOCK:
            raise
        warnings.warn(f"{path.parent}: this file system does not support flock, so runs are not locked; "
                      "do not start a second launcher into this folder", stacklevel=4)
    return True


@contextlib.contextmanager
def claim(out_dir: str | Path, key: str) -> Iterator[Holder | None]:
    """Holds the run's lock for the block and yields None; when another launcher holds it,
    holds nothing and yields that launcher. The lock file is opened without following a
    symlink and is never inherited by the run's processes (O_CLOEXEC)."""
    path = lock_path(out_dir, key)
    path.parent.mkdir(exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    try:
        if not _lock(fd, path):
            yield _read_holder(fd)
            return
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname()}).encode(), 0)
        try:
            yield None
        finally:
            os.ftruncate(fd, 0)  # released: no holder named any more
    finally:
        os.close(fd)  # closing the descriptor releases the flock
