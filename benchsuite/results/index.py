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
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from benchsuite.atomic import atomic_file, umask
from benchsuite.record.types import SCHEMA_VERSION
from benchsuite.results.rows import RECORD, STEPS, Rows, table_schema, taken

if TYPE_CHECKING:
    import pyarrow as pa

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

    def write(self, fresh: dict[str, tuple[Rows, int]]) -> None:
        """Replace the index file atomically (readers see the old one or the new one, whole), under a lock
        that one writer at a time holds: another process writing it now, a folder that cannot be written
        to, a full disk: the index is left as it is, and nothing is said (the records were read). fresh: the
        row of each record decoded now (its Rows, the row there). Written, the index is read from what was
        written (`rows`, `entries`): its readers let go of the rows made by this read (and of the records'
        blobs, hundreds of MB for a first read of a large folder)."""
        from filelock import FileLock, Timeout

        path = index_path(self.folder)
        try:
            path.parent.mkdir(exist_ok=True)
            with FileLock(path.parent / "lock", timeout=0, mode=0o666 & ~umask()):  # the team's, as the records
                data = self._parquet_bytes(fresh)
                with atomic_file(path, "wb", durable=False) as f:
                    f.write(data)
        except (OSError, Timeout):
            return
        self.rows, self.entries, self.problems = _entries_of(data, self.damaged)
        self.fresh, self.changed = {}, False

    def _parquet_bytes(self, fresh: dict[str, tuple[Rows, int]]) -> bytes:
        """Every entry, kept and fresh, as the index file: the rows taken from the tables they are in."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        schema = table_schema()
        skipped = sorted(rel for rel, (_, problem) in self.fresh.items() if problem is not None)
        sources = [(rel, self.rows, at) for rel, (_, at) in self.entries.items()]
        sources += [(rel, *fresh[rel]) for rel, (_, problem) in self.fresh.items() if problem is None]
        tables: dict[int, tuple[int, Rows | None]] = {}  # id(rows) -> its first row in the tables end to end
        offset = 0
        for _, rows, _ in sources:
            if id(rows) not in tables:
                tables[id(rows)] = (offset, rows)
                offset += len(rows.table)
        where = {rel: tables[id(rows)][0] + at for rel, rows, at in sources}
        where |= {rel: offset + i for i, rel in enumerate(skipped)}
        parts = [pa.table(rows.columns(schema.names).columns, schema=schema) for _, rows in tables.values()]
        parts.append(pa.table([pa.nulls(len(skipped), f.type) for f in schema], schema=schema))
        rels = sorted(where)
        keys = {rel: key for rel, (key, _) in self.entries.items()} | {rel: key for rel, (key, _) in self.fresh.items()}
        problem = {rel: why for rel, (_, why) in self.fresh.items() if why is not None}
        problem |= {rel: self.problems[at] for rel, (_, at) in self.entries.items() if self.problems[at]}
        rows = taken(pa.concat_tables(parts), [where[rel] for rel in rels])
        files = [pa.array(rels, pa.string()), *(pa.array([getattr(keys[r], n) for r in rels], pa.int64())
                                                for n in FILE_COLUMNS[1:]),
                 pa.array([problem.get(r) for r in rels], pa.string())]
        table = pa.table([*files, *rows.columns], schema=_schema())
        meta = {"format": FORMAT, "code": code_version()}
        table = table.replace_schema_metadata({METADATA_KEY: json.dumps(meta).encode()})
        sink = pa.BufferOutputStream()
        # (a dictionary of each column's values is worth it for all but the records', steps' and paths': unique)
        pq.write_table(table, sink, compression="zstd", use_dictionary=[n for n in table.column_names
                                                                       if n not in (FILE_COLUMNS[0], STEPS, RECORD)])
        return sink.getvalue().to_pybytes()


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
