"""A results folder's index: what reading each record file gave (its row of the results model's columns,
its steps and the typed record, or why the file is not a record), kept beside the records so that a reader
decodes only the files that are new or changed since. The JSON records stay the source of truth; the index
is a cache that is never required: missing, unreadable, damaged or written by other code, it is rebuilt from
the records, and a folder that cannot be written to is read from memory as before.

One Parquet file, `<folder>/.benchsuite-index/records.parquet` (hidden: record_files never walks it), one
row per record file: the file's identity (relative path, size, mtime_ns, ctime_ns, inode), the reason the
file is skipped (when it is), and the record's row (results/rows.py: every column the results model reads,
typed by the record's types), its steps (a list of structs: flattened, the steps table of load_steps) and
the record itself (msgpack). A warm read reads the file columns and the rows, and builds the results
model's frame from the rows as they are: no record is decoded; the steps and the records are read from the
same file only for a reader that asks for them. Parquet through pyarrow rather than DuckDB: a reader reads
one file that a writer replaces atomically (temp file, os.replace), so any number of processes on a shared
file system read while one writes, with no database lock to wait on (a DuckDB file admits one writing
process and keeps readers of other processes out meanwhile), and a reader needs no query engine: it takes
every entry whose file is unchanged, and a filter (suite, workload, started_at) is judged on the row's
columns, so that a filtered load takes only the rows it keeps.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import secrets
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from benchsuite.atomic import umask
from benchsuite.record.types import SCHEMA_VERSION
from benchsuite.results.rows import RECORD, STEPS, Rows, table_schema, taken

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from filelock import FileLock

INDEX_DIR = ".benchsuite-index"  # hidden: record_files leaves out every name that starts with a dot
INDEX_FILE = "records.parquet"
FORMAT = 2  # this file's layout; any other is rebuilt quietly, as after an upgrade
# A folder of fewer record files is read without an index: reading 100 files takes about as long as reading
# their index (24 ms against 23 ms on the 2-core box), and writing one costs some 60 ms more.
MIN_FILES = 100
METADATA_KEY = b"benchsuite.index"
# A file changed within this long before it was read might change again with the same size and mtime (file
# times tick coarsely): such an entry is decoded again next time rather than trusted (git's racy-clean rule).
RACY_NS = 1_000_000_000
# The code that shapes an entry (the record's types, migrations, flags, the row): an index written by any
# other version of it is rebuilt.
SHAPING_CODE = ("benchsuite/record", "benchsuite/results/store.py", "benchsuite/results/migrate.py",
                "benchsuite/results/scaling.py", "benchsuite/results/identity.py", "benchsuite/results/rows.py",
                "benchsuite/results/index.py")
FILE_COLUMNS = ("file", "size", "mtime_ns", "ctime_ns", "ino")  # the file's path (relative) and identity
PROBLEM = "problem"  # why the file is not a record (its row, steps and record are null)
# Rows none of which a record lacks: null where there is no problem, the index is damaged.
REQUIRED = ("run_key", "status", "identity")
# The row's columns a read judges each file by (its filters, its record's id), read with the files' own; the
# rest of the row, for a reader of frames, when it asks.
JUDGED = ("suite", "workload", "started_at", "run_key", "repeat", "status", "identity")


@dataclass(frozen=True)
class FileKey:
    """What says a record file is the one read before: a rewrite (write_record's replace, an edit, a copy
    over it, a chmod) changes at least one of these."""

    size: int
    mtime_ns: int
    ctime_ns: int
    ino: int

    @classmethod
    def of(cls, st: os.stat_result) -> FileKey:
        return cls(st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


class IndexDamaged(Exception):
    """The index file cannot be read as one (a reader warns once and rebuilds it from the records)."""


@functools.cache
def source_digest(parts: tuple[str, ...], salt: str = "") -> str:
    """A digest of benchsuite's source files under `parts` (paths from the repository root, folders walked):
    what a cache beside the records (this index, the dashboard's pages) is trusted by only when unchanged."""
    root = Path(__file__).resolve().parents[2]
    h = hashlib.sha256(salt.encode())
    for part in parts:
        path = root / part
        for f in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            h.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def code_version() -> str:
    """A digest of the code that shapes an entry: an index is trusted only by the code that wrote it."""
    return source_digest(SHAPING_CODE, f"{FORMAT}/{SCHEMA_VERSION}")


def index_path(folder: Path) -> Path:
    return folder / INDEX_DIR / INDEX_FILE


@dataclass
class FolderIndex:
    """A folder's index as read (each file's key and row in `rows`) and the files decoded by this read."""

    folder: Path
    rows: Rows | None  # the index file's rows (None: no index, or one of other code or damaged)
    entries: dict[str, tuple[FileKey, int]]  # relative path -> the file's key, its row in `rows`
    problems: list[str | None] = field(default_factory=list)  # by row: why that file is not a record
    fresh: dict[str, tuple[FileKey, str | None]] = field(default_factory=dict)  # decoded now: why not a record
    changed: bool = False  # an entry was added, replaced or dropped: worth writing
    read_at_ns: int = field(default_factory=time.time_ns)  # before any file of this read was looked at
    _writer: pq.ParquetWriter | None = None  # the new index file, being written (append, write)
    _tmp: Path | None = None
    _lock: FileLock | None = None
    _failed: bool = False  # the new index file cannot be written this read

    @classmethod
    def read(cls, folder: Path) -> FolderIndex:
        """The folder's index; empty when there is none or it was written by other code, and empty with one
        warning when the file is damaged or not an index at all."""
        path = index_path(folder)
        index = cls(folder, None, {})
        try:
            index.rows, index.entries, index.problems = _read_entries(path, index.damaged)
        except OSError:  # none (yet, or removed), or not this user's to read: the records are read instead
            pass
        except IndexDamaged as e:
            _say_damaged(path, str(e))
            index.changed = True
        return index

    def damaged(self, why: str) -> None:
        """Part of the index found damaged after it was read (a record that does not decode): said once, and
        the file removed, so that the next read rebuilds it."""
        path = index_path(self.folder)
        _say_damaged(path, why)
        try:
            path.unlink()
        except OSError:
            pass

    def hit(self, rel: str, key: FileKey | None) -> int | None:
        """The row of this very file in `rows` (None: not in the index, or changed since)."""
        one = self.entries.get(rel)
        return one[1] if one is not None and key is not None and one[0] == key else None

    def put(self, rel: str, key: FileKey, problem: str | None) -> None:
        """A file decoded now (a record, or why it is not one); kept only when its key can be trusted next
        time: not changed in the last RACY_NS before this read began (a later change then lands on another
        tick of the file's clock)."""
        self.changed |= self.entries.pop(rel, None) is not None
        if self.read_at_ns - max(key.mtime_ns, key.ctime_ns) > RACY_NS:
            self.fresh[rel] = (key, problem)
            self.changed = True

    def keep_only(self, seen: set[str]) -> None:
        """Drop the entries of files no longer there."""
        gone = self.entries.keys() - seen
        for rel in gone:
            del self.entries[rel]
        self.changed |= bool(gone)

    def append(self, rows: Rows, rels: list[str]) -> bool:
        """Writes the rows of records decoded now (row i: the file rels[i]) that the index keeps (put), into
        the new index file, begun on the first. True when they are written: their blobs may be let go (a
        first read of 100,000 files would otherwise hold ~1.2 GB of them until the end)."""
        keep = [i for i, rel in enumerate(rels) if rel in self.fresh and self.fresh[rel][1] is None]
        return bool(keep) and self._part([rels[i] for i in keep], taken(rows.columns(table_schema().names), keep))

    def write(self) -> None:
        """Finishes the new index file (begun by append, or now): the entries kept from the index read and
        the files that are no records after the records appended, then replaces the index atomically
        (readers see the old one or the new one, whole). Written by one process at a time, under a lock:
        another writing it now, a folder that cannot be written to, a full disk: the index is left as it
        was, and nothing is said (the records were read). Written, the index is read back (`rows`,
        `entries`): its readers let go of the rows made by this read."""
        import pyarrow as pa

        names = table_schema().names
        kept = list(self.entries)  # (in the order of the index read: taken whole when none was dropped)
        skipped = sorted(rel for rel, (_, problem) in self.fresh.items() if problem is not None)
        if not (self._part(kept, taken(self.rows.columns(names), [self.entries[rel][1] for rel in kept]))
                if kept and self.rows is not None else self._begun()):
            return
        if skipped and not self._part(skipped, pa.table([pa.nulls(len(skipped), f.type) for f in table_schema()],
                                                        schema=table_schema())):
            return
        try:
            self._writer.close()
            os.replace(self._tmp, index_path(self.folder))
            self.rows, self.entries, self.problems = _read_entries(index_path(self.folder), self.damaged)
        except (OSError, IndexDamaged):
            pass
        finally:
            self._writer = None
            self.abort()
        self.fresh, self.changed = {}, False

    def abort(self) -> None:
        """The new index file, unfinished, removed and its lock let go (a read that stops part-way, or a
        write that fails)."""
        if self._writer is not None:
            try:
                self._writer.close()
            except (OSError, ValueError):
                pass
            self._writer = None
        if self._tmp is not None:
            self._tmp.unlink(missing_ok=True)
            self._tmp = None
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def _begun(self) -> bool:
        """The new index file open (a temp file beside the index, under the lock), or False where it cannot
        be (the lock held by another process, or no folder to write in) and will not be this read."""
        import pyarrow as pa
        import pyarrow.parquet as pq
        from filelock import FileLock, Timeout

        if self._writer is not None or self._failed:
            return self._writer is not None
        path = index_path(self.folder)
        try:
            path.parent.mkdir(exist_ok=True)
            self._lock = FileLock(path.parent / "lock", timeout=0, mode=0o666 & ~umask())  # the team's, as the records
            self._lock.acquire()
            for stale in path.parent.glob(f"{INDEX_FILE}.*.tmp"):  # left by a writer killed part-way (none now)
                stale.unlink(missing_ok=True)
            self._tmp = path.with_name(f"{INDEX_FILE}.{secrets.token_hex(8)}.tmp")
            meta = json.dumps({"format": FORMAT, "code": code_version()})
            # (a dictionary of each column's values is worth it for all but the records', steps' and paths': unique)
            repeated = [n for n in _schema().names if n not in (FILE_COLUMNS[0], STEPS, RECORD)]
            self._writer = pq.ParquetWriter(self._tmp, _schema().with_metadata({METADATA_KEY: meta}),
                                            compression="zstd", use_dictionary=repeated)
        except (OSError, Timeout, pa.ArrowException):
            self._failed = True
            self.abort()
        return self._writer is not None

    def _part(self, rels: list[str], rows: pa.Table) -> bool:
        """rels' entries (their files' keys and problems, and `rows`, theirs in order) written to the new index
        file; False where it is not written (and no longer will be)."""
        import pyarrow as pa

        if not self._begun():
            return False
        keys = [self.fresh[rel][0] if rel in self.fresh else self.entries[rel][0] for rel in rels]
        problems = [self.fresh[rel][1] if rel in self.fresh else self.problems[self.entries[rel][1]] for rel in rels]
        files = [pa.array(rels, pa.string()), *(pa.array([getattr(k, n) for k in keys], pa.int64())
                                                for n in FILE_COLUMNS[1:]), pa.array(problems, pa.string())]
        try:
            self._writer.write_table(pa.table([*files, *rows.columns], schema=_schema()))
        except (OSError, pa.ArrowException):
            self._failed = True
            self.abort()
            return False
        return True


def _say_damaged(path: Path, why: str) -> None:
    warnings.warn(f"the results index {path} is damaged ({why}); rebuilding it from the records "
                  "(the records are the source of truth: nothing is lost)", stacklevel=_outside_results())


def _outside_results() -> int:
    """The stack level of the nearest caller outside benchsuite.results: where the reader was called."""
    here = os.path.dirname(__file__)
    frame, level = sys._getframe(1), 1
    while frame is not None and os.path.dirname(frame.f_code.co_filename) == here:
        frame, level = frame.f_back, level + 1
    return level


@functools.cache
def _schema() -> pa.Schema:
    import pyarrow as pa

    files = [pa.field(FILE_COLUMNS[0], pa.string()), *(pa.field(n, pa.int64()) for n in FILE_COLUMNS[1:]),
             pa.field(PROBLEM, pa.string())]
    clash = {f.name for f in files} & set(table_schema().names)
    assert not clash, f"the index's file columns {clash} clash with the row's"
    return pa.schema([*files, *table_schema()])


def _read_entries(path: Path, damaged) -> tuple[Rows | None, dict[str, tuple[FileKey, int]], list[str | None]]:
    """The index file's rows (less the steps and records, read when asked for), its entries and their
    problems; none for an index of other code (rebuilt quietly). OSError when there is none (or it cannot be
    opened), IndexDamaged when the file is not a whole index."""
    with open(path, "rb") as f:  # OSError: none, or not readable
        data = f.read()
    return _entries_of(data, damaged)


def _entries_of(data: bytes, damaged) -> tuple[Rows | None, dict[str, tuple[FileKey, int]], list[str | None]]:
    """_read_entries of the index file's bytes."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    try:
        file = pq.ParquetFile(pa.BufferReader(data))
        schema = file.schema_arrow
    except (pa.ArrowException, OSError, ValueError) as e:
        raise IndexDamaged(f"not a Parquet file: {e}") from None
    try:
        meta = json.loads((schema.metadata or {})[METADATA_KEY])
        fmt, code = meta["format"], meta["code"]
    except (KeyError, TypeError, ValueError):
        raise IndexDamaged("a Parquet file that is not a benchsuite index") from None
    if (fmt, code) != (FORMAT, code_version()):
        return None, {}, []  # another benchsuite's (or another version of this one's): rebuilt, not an error
    if schema.remove_metadata() != _schema():
        raise IndexDamaged(f"columns {schema.names} of other types than an index's")
    try:
        table = file.read(columns=[*FILE_COLUMNS, PROBLEM, *(n for n in JUDGED if n not in REQUIRED), *REQUIRED])
    except (pa.ArrowException, OSError, ValueError) as e:
        raise IndexDamaged(f"a Parquet file that does not read: {e}") from None
    if any(table.column(name).null_count for name in FILE_COLUMNS):
        raise IndexDamaged("a file without its path, size or times")
    problems = table.column(PROBLEM)
    if any(pc.sum(pc.and_(problems.is_null(), table.column(n).is_null())).as_py() for n in REQUIRED):
        raise IndexDamaged("a record without its run key, status or identity")

    def more(names: list[str]) -> pa.Table:
        # the same file's bytes (the snapshot the rows came from), through ParquetFile: read_table's dataset
        # reader leaves an I/O thread that aborts the process at exit ("terminate called without an active
        # exception") when its columns are still held then
        return pq.ParquetFile(pa.BufferReader(data)).read(columns=names)

    cols = [table.column(name).to_pylist() for name in FILE_COLUMNS]
    entries = {rel: (FileKey(*key), at) for at, (rel, *key) in enumerate(zip(*cols))}
    return Rows(table.select(JUDGED), more, damaged), entries, problems.to_pylist()
