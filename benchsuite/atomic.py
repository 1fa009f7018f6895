"""Atomic file writes: a reader sees the old file or the whole new one, never a partial file.

Temp file in the same folder, fsync, rename, fsync the folder, so even a process killed
mid-write (or a power loss after return) leaves no half-written output.

Every file a verb writes goes through here, so every failed write (disk full, quota, the file-size
limit of `ulimit -f`, a name too long, no permission, a read-only file system) ends the same way: an
OutputError naming the final path, with what to do, and the temp file removed. (Past `ulimit -f` the
write fails with EFBIG: Python ignores SIGXFSZ, which would otherwise kill the process with no word.)
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import secrets
from pathlib import Path

# What to do, by errno; any other failure gets DEFAULT_FIX.
FIXES = {
    errno.ENOSPC: "free space on that file system, or write elsewhere, then rerun",
    errno.EDQUOT: "free space under your disk quota, or write elsewhere, then rerun",
    errno.EFBIG: "the file is larger than this process may write (ulimit -f) or the file system holds; "
                 "raise the limit, or write elsewhere, then rerun",
    errno.ENAMETOOLONG: "give a shorter file name or path",
    errno.EACCES: "choose a folder you may write to",
    errno.EPERM: "choose a folder you may write to",
    errno.EROFS: "the file system is mounted read-only; write elsewhere",
    errno.EPIPE: "the program reading the output stopped reading it",
}
DEFAULT_FIX = "check the disk, or write elsewhere, then rerun"


class OutputError(OSError):
    """A file of a verb's output could not be written. Names the final path (never the temp file), keeps
    the errno, and says what to do; the CLI shows it as one line, exit code 2."""

    def __init__(self, path: str | Path, error: OSError):
        super().__init__(error.errno, error.strerror or str(error), str(path))

    def __str__(self) -> str:
        return f"cannot write {self.filename}: {self.strerror}; {FIXES.get(self.errno, DEFAULT_FIX)}"


@contextlib.contextmanager
def naming(path: str | Path):
    """An OSError raised inside becomes an OutputError naming `path`: the output it was writing."""
    try:
        yield
    except OSError as e:
        raise OutputError(path, e) from None


def umask() -> int:
    """The process's umask (reading it means setting it: set back at once)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def hidden_name(path: Path, suffix: str) -> str:
    """'.NAME' + suffix, for a file kept beside `path` (its temp file, its lock). NAME is cut, by whole
    characters, so that the whole fits the folder's NAME_MAX bytes: any legal final name has one."""
    room = os.pathconf(path.parent, "PC_NAME_MAX") - len(os.fsencode("." + suffix))
    name = path.name
    while len(os.fsencode(name)) > room:
        name = name[:-1]
    return f".{name}{suffix}"


class _TempFile(io.FileIO):
    """The temp file's raw writes, through which every buffered layer writes: a failure is an OutputError
    naming the final path (a read of the verb's inputs failing in the same block is left as it is).
    Written with os.write, as export's append is: one call for a test to fail with ENOSPC."""

    def __init__(self, fd: int, final: Path):
        super().__init__(fd, "w")
        self.final = final

    def write(self, data) -> int:
        with naming(self.final):
            return os.write(self.fileno(), data)


def _create_temp(path: Path) -> tuple[int, Path]:
    """A new hidden temp file beside `path` (O_EXCL: never another's), with the permissions a plain
    open() gives, so results on a shared file system stay readable by the team."""
    if len(os.fsencode(path.name)) > os.pathconf(path.parent, "PC_NAME_MAX"):  # before the work, not at the rename
        raise OSError(errno.ENAMETOOLONG, os.strerror(errno.ENAMETOOLONG))
    tmp = path.parent / hidden_name(path, f".{secrets.token_hex(8)}.tmp")
    return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666), tmp


@contextlib.contextmanager
def atomic_file(path: str | Path, mode: str = "wb", encoding: str | None = None, newline: str | None = None,
                durable: bool = True):
    """An open file ("wb" or "w") whose content appears at `path` only when the block completes.

    A failed write raises OutputError naming `path`, and no temp file is left. durable=False skips the
    fsyncs, for output that is cheap to rebuild (dashboard pages): still never partial, but a power
    loss may lose the newest version.
    """
    path = Path(path)
    with naming(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = _create_temp(path)
    try:
        with io.BufferedWriter(_TempFile(fd, path)) as buffered:
            f = buffered if "b" in mode else io.TextIOWrapper(buffered, encoding=encoding, newline=newline)
            yield f
            f.flush()
            if durable:
                with naming(path):
                    os.fsync(fd)
        with naming(path):
            os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        with naming(path):
            dir_fd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
