"""Atomic file writes: a reader sees the old file or the whole new one, never a partial file.

Temp file in the same folder, fsync, rename, fsync the folder, so even a process killed
mid-write (or a power loss after return) leaves no half-written output.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def umask() -> int:
    """The process's umask (reading it means setting it: set back at once)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_file(path: str | Path, mode: str = "wb", encoding: str | None = None, newline: str | None = None,
                durable: bool = True):
    """An open file whose content appears at `path` only when the block completes.

    The file gets the permissions a plain open() would give (mkstemp's are 0600), so results
    on a shared file system stay readable by the team. durable=False skips the fsyncs, for
    output that is cheap to rebuild (dashboard pages): still never partial, but a power loss
    may lose the newest version.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode, encoding=encoding, newline=newline) as f:
            yield f
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if not durable:
        return
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
