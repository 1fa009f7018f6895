"""Record files: a guarded read of untrusted bytes, and an atomic write that never replaces a record
of a newer schema (written by a newer benchsuite sharing the folder)."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from benchsuite.atomic import atomic_file
from benchsuite.record.codec import NewerRecordError, RecordError, as_record, file_bytes, parse, to_dict
from benchsuite.record.names import record_filename
from benchsuite.record.types import SCHEMA_VERSION, Record

MAX_RECORD_BYTES = 64 * 2**20  # a record is kilobytes to a few MiB (200k steps ~ 20 MiB); larger is not one


def file_kind(mode: int) -> str:
    for test, kind in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return kind
    return "not a regular file"


def read_bytes(path: Path) -> bytes:
    """At most MAX_RECORD_BYTES of a regular file. Opened non-blocking and without following a final
    symlink (the real path is opened), then checked again on the open descriptor: a FIFO swapped in
    meanwhile is refused, never waited on."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        try:
            fd = os.open(path, flags)
        except OSError as e:  # a symlink (ELOOP): its real path (realpath walks every part: only then)
            if e.errno != errno.ELOOP:
                raise
            fd = os.open(os.path.realpath(path), flags)
    except OSError as e:
        raise RecordError(f"cannot be read ({e.strerror or e})") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise RecordError(f"{file_kind(st.st_mode)}, not a record file")
        if st.st_size > MAX_RECORD_BYTES:
            raise RecordError(f"{st.st_size:,} bytes, larger than a record can be ({MAX_RECORD_BYTES // 2**20} MiB)")
        data = f.read(MAX_RECORD_BYTES + 1)
    if len(data) > MAX_RECORD_BYTES:
        raise RecordError(f"larger than a record can be ({MAX_RECORD_BYTES // 2**20} MiB)")
    return data


def newer_version_at(path: Path) -> int | None:
    """The schema version of the record file at path when it is newer than this benchsuite's, else None
    (no file, or one this benchsuite may replace)."""
    try:
        doc = parse(read_bytes(path))
    except RecordError:
        return None
    version = doc.get("schema_version") if isinstance(doc, dict) else None
    return version if type(version) is int and version > SCHEMA_VERSION else None


def write_record(out_dir: str | Path, rec: Record | dict) -> Path:
    """The typed record (a dict is checked by the types first: codec.as_record), written atomically: a
    reader sees the old record or the whole new one, never a partial record, even if this process is killed
    mid-write. A record of a newer schema at the same name is never replaced (NewerRecordError)."""
    doc = to_dict(as_record(rec))  # once: the file's name and its bytes
    final = Path(out_dir) / record_filename(doc)
    data = file_bytes(doc)
    newer = newer_version_at(final)
    if newer is not None:
        raise NewerRecordError(newer, final)
    try:
        with atomic_file(final, "wb") as f:
            f.write(data)
    except OSError as e:  # disk full, quota, file too large: name the record, keep the errno
        raise OSError(e.errno, f"cannot write record {final}: {e.strerror or e}") from e
    return final
