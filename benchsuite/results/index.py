"""A results folder's index: what reading each record file gave (its row of the results model's columns,
its steps and the typed record, or why the file is not a record), kept beside the records so that a reader
decodes only the files that are new or changed since. The JSON records stay the source of truth; the index
is a cache that is never required: missing, unreadable, damaged or written by other code, it is rebuilt from
the records, and a folder that cannot be written to is read from memory as before.

One Parquet file, `<folder>/.benchsuite-index/records.parquet` (hidden: record_files never walks it), one row per
record file: the file's identity (relative path, size, mtime_ns, ctime_ns, inode), the reason the file is skipped
(when it is), and the record's row (results/rows.py: every column the results model reads, typed by the record's
types), its steps (a list of structs: flattened, the steps table of load_steps), the record itself (msgpack) and its
summary (rows.Summary). A warm read reads the file columns and the rows, and builds the results model's frame from
the rows as they are: no record is decoded; the steps, the records and their summaries are read from the same file
only for a reader that asks for them. The files decoded since that file was written go to a second,
`records.delta.parquet`, whose entries are read over the first's: a new record costs a write of the few new entries,
not of every record's blob and steps again; past a tenth of the index (DELTA_MIN at least), or when a file the index
file holds is removed, the two are written again as one. Each entry is trusted only while its file's key is
unchanged, so a reader that pairs an index file with another's delta (a write between its two reads) decodes a few
files again, and reads nothing stale. Parquet through pyarrow rather than DuckDB: a reader reads files that a writer
replaces atomically (temp file, os.replace), so any number of processes on a shared file system read while one
writes, with no database lock to wait on (a DuckDB file admits one writing process and keeps readers of other
processes out meanwhile), and a reader needs no query engine: it takes every entry whose file is unchanged, and a
filter (suite, workload, started_at) is judged on the row's columns, so that a filtered load takes only the rows it
keeps.
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
from typing import TYPE_CHECKING, NamedTuple

from benchsuite.atomic import umask
from benchsuite.record.types import SCHEMA_VERSION
from benchsuite.results.rows import RECORD, STEPS, SUMMARY, Rows, table_schema, taken

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from filelock import FileLock

INDEX_DIR = ".benchsuite-index"  # hidden: record_files leaves out every name that starts with a dot
INDEX_FILE = "records.parquet"
# The files decoded since the index file was written, beside it (written alone while they are a few: a new
# record rewrites neither the index file nor anything in it); their entries over the index file's.
DELTA_FILE = "records.delta.parquet"
DELTA_SHARE = 10  # the delta holds up to this part of the index file's rows (and BATCH_ROWS at least) ...
DELTA_MIN = 1000  # ... then both are written again as one index file
FORMAT = 2  # this file's layout; any other is rebuilt quietly, as after an upgrade
# A folder of fewer record files is read without an index: reading 100 files takes about as long as reading
# their index (24 ms against 23 ms on the 2-core box), and writing one costs some 60 ms more.
MIN_FILES = 100
METADATA_KEY = b"benchsuite.index"
# Rows per row group of the files written, at least: a read decodes each of ~350 columns once per row group (a
# first read's batches of new records are gathered to this many before they are written).
ROW_GROUP = 10_000
# A file changed within this long before it was read might change again with the same size and mtime (file
# times tick coarsely): such an entry is decoded again next time rather than trusted (git's racy-clean rule).
RACY_NS = 1_000_000_000
# The code that shapes an entry (the record's types, migrations, flags, the row): an index written by any
# other version of it is rebuilt.
SHAPING_CODE = ("benchsuite/record", "benchsuite/results/decoding.py", "benchsuite/results/store.py",
                "benchsuite/results/migrate.py", "benchsuite/results/scaling.py", "benchsuite/results/identity.py",
                "benchsuite/results/rows.py", "benchsuite/results/index.py")
FILE_COLUMNS = ("file", "size", "mtime_ns", "ctime_ns", "ino")  # the file's path (relative) and identity
PROBLEM = "problem"  # why the file is not a record (its row, steps and record are null)
# Rows none of which a record lacks: null where there is no problem, the index is damaged.
REQUIRED = ("run_key", "status", "identity")
# The row's columns a read judges each file by (its filters, its record's id), read with the files' own; the
# rest of the row, for a reader of frames, when it asks.
JUDGED = ("suite", "workload", "started_at", "run_key", "repeat", "status", "identity")


class FileKey(NamedTuple):
    """What says a record file is the one read before: a rewrite (write_record's replace, an edit, a copy
    over it, a chmod) changes at least one of these. (A tuple: a warm read makes two of each file's.)"""

    size: int
    mtime_ns: int
    ctime_ns: int
    ino: int

    @classmethod
    def of(cls, st: os.stat_result) -> FileKey:
        return cls(st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


class Entry(NamedTuple):
    """What the index holds of one file: its key, and its row (row `at` of `rows`) or why it is no record."""

    key: FileKey
    rows: Rows
    at: int
    problem: str | None
    delta: bool  # from the delta file (else from the index file)


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
    """A folder's index as read (each file's entry: its key and row) and the files decoded by this read."""

    folder: Path
    entries: dict[str, Entry] = field(default_factory=dict)  # relative path -> its entry
    indexed: int = 0  # rows in the index file (beside the delta's)
    fresh: dict[str, tuple[FileKey, str | None]] = field(default_factory=dict)  # decoded now: why not a record
    changed: bool = False  # an entry was added, replaced or dropped: worth writing
    read_at_ns: int = field(default_factory=time.time_ns)  # before any file of this read was looked at
    _writer: pq.ParquetWriter | None = None  # the new index or delta file, being written (append, write)
    _tmp: Path | None = None
    _lock: FileLock | None = None
    _failed: bool = False  # the new file cannot be written this read
    _appended: int = 0  # rows appended to it
    _gathered: list = field(default_factory=list)  # its rows not written yet (Arrow tables)
    _dropped: bool = False  # an entry of the index file dropped (its file gone)

    @classmethod
    def read(cls, folder: Path) -> FolderIndex:
        """The folder's index: its index file's entries, and over them its delta's; none from a file that is
        missing or was written by other code, and none with one warning from a file that is damaged or not an
        index at all."""
        index = cls(folder)
        index._read_files()
        return index

    def _read_files(self) -> None:
        self.entries, self.indexed = {}, 0
        for name in (INDEX_FILE, DELTA_FILE):
            path = self.folder / INDEX_DIR / name
            try:
                # (the rows told of damage by the folder alone: no cycle of the index and its rows)
                rows, entries = _read_entries(path, functools.partial(_remove_damaged, self.folder),
                                              delta=name == DELTA_FILE)
            except OSError:  # none (yet, or removed), or not this user's to read: the records are read instead
                continue
            except IndexDamaged as e:
                _say_damaged(path, str(e))
                self.changed = True
                continue
            self.entries.update(entries)
            if name == INDEX_FILE and rows is not None:
                self.indexed = len(rows.table)

    def hit(self, rel: str, key: FileKey | None) -> Entry | None:
        """The entry of this very file (None: not in the index, or changed since)."""
        one = self.entries.get(rel)
        return one if one is not None and key is not None and one.key == key else None

    def put(self, rel: str, key: FileKey, problem: str | None) -> None:
        """A file decoded now (a record, or why it is not one); kept only when its key can be trusted next
        time: not changed in the last RACY_NS before this read began (a later change then lands on another
        tick of the file's clock)."""
        self.changed |= self.entries.pop(rel, None) is not None
        if self.read_at_ns - max(key.mtime_ns, key.ctime_ns) > RACY_NS:
            self.fresh[rel] = (key, problem)
            self.changed = True

    def keep_only(self, seen: set[str]) -> None:
        """Drop the entries of files no longer there (one of the index file's: it is written again whole)."""
        gone = self.entries.keys() - seen
        self._dropped |= any(not self.entries[rel].delta for rel in gone)
        for rel in gone:
            del self.entries[rel]
        self.changed |= bool(gone)

    def append(self, rows: Rows, rels: list[str]) -> bool:
        """Adds the rows of records decoded now (row i: the file rels[i]) that the index keeps (put) to the new
        index file, begun on the first (written ROW_GROUP rows at a time). True when the new file has them:
        the rows' own blobs may be let go (a first read of 100,000 files would otherwise hold ~1.2 GB of them
        until the end)."""
        keep = [i for i, rel in enumerate(rels) if rel in self.fresh and self.fresh[rel][1] is None]
        return bool(keep) and self._part([rels[i] for i in keep], taken(rows.columns(table_schema().names), keep))

    def write(self) -> None:
        """Finishes the new file (begun by append, or now) and puts it in place atomically (readers see the old
        one or the new one, whole): while the files decoded since the index file was written are few (up to
        a tenth of its rows, DELTA_MIN at least), the delta file, of those files and the ones decoded now;
        else the index file, of every entry, and the delta removed. Written by one process at a time, under
        a lock: another writing now, a folder that cannot be written to, a full disk: the index is left as it
        was, and nothing is said (the records were read). Written, the index is read back (`entries`): its
        readers let go of the rows made by this read."""
        import pyarrow as pa

        skipped = sorted(rel for rel, (_, problem) in self.fresh.items() if problem is not None)
        in_delta = [rel for rel, entry in self.entries.items() if entry.delta]
        as_delta = bool(self.indexed) and not self._dropped and \
            self._appended + len(in_delta) + len(skipped) <= max(DELTA_MIN, self.indexed // DELTA_SHARE)
        kept = in_delta if as_delta else list(self.entries)
        by_rows: dict[int, list[str]] = {}  # (the kept entries' rows taken from each table they are in at once)
        for rel in kept:
            by_rows.setdefault(id(self.entries[rel].rows), []).append(rel)
        names = table_schema().names
        if not self._begun():
            return
        for rels in by_rows.values():
            if not self._part(rels, taken(self.entries[rels[0]].rows.columns(names),
                                          [self.entries[rel].at for rel in rels])):
                return
        if skipped and not self._part(skipped, pa.table([pa.nulls(len(skipped), f.type) for f in table_schema()],
                                                        schema=table_schema())):
            return
        if not self._flush():
            return
        try:
            self._writer.close()
            os.replace(self._tmp, self.folder / INDEX_DIR / (DELTA_FILE if as_delta else INDEX_FILE))
            if not as_delta:
                (self.folder / INDEX_DIR / DELTA_FILE).unlink(missing_ok=True)
            self._read_files()
        except OSError:
            pass
        finally:
            self._writer = None
            self.abort()
        self.fresh, self.changed = {}, False

    def abort(self) -> None:
        """The new index file, unfinished, removed and its lock let go (a read that stops part-way, or a
        write that fails)."""
        self._gathered = []
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
            # (a dictionary of each column's values is worth it for all but the paths' and the blobs': unique)
            repeated = [n for n in _schema().names if n not in (FILE_COLUMNS[0], STEPS, RECORD, SUMMARY)]
            self._writer = pq.ParquetWriter(self._tmp, _schema().with_metadata({METADATA_KEY: meta}),
                                            compression="zstd", use_dictionary=repeated)
        except (OSError, Timeout, pa.ArrowException):
            self._failed = True
            self.abort()
        return self._writer is not None

    def _part(self, rels: list[str], rows: pa.Table) -> bool:
        """rels' entries (their files' keys and problems, and `rows`, theirs in order) added to the new index
        file (written a row group at a time: _flush); False where it is not written (and no longer will be)."""
        import pyarrow as pa

        if not self._begun():
            return False
        keys = [self.fresh[rel][0] if rel in self.fresh else self.entries[rel].key for rel in rels]
        problems = [self.fresh[rel][1] if rel in self.fresh else self.entries[rel].problem for rel in rels]
        files = [pa.array(rels, pa.string()), *(pa.array([getattr(k, n) for k in keys], pa.int64())
                                                for n in FILE_COLUMNS[1:]), pa.array(problems, pa.string())]
        self._gathered.append(pa.table([*files, *rows.columns], schema=_schema()))
        self._appended += len(rels)
        return sum(len(t) for t in self._gathered) < ROW_GROUP or self._flush()

    def _flush(self) -> bool:
        """The rows gathered written to the new file as one row group; False where it is not written (and no
        longer will be)."""
        import pyarrow as pa

        gathered, self._gathered = self._gathered, []
        try:
            if gathered:
                self._writer.write_table(pa.concat_tables(gathered))
        except (OSError, pa.ArrowException):
            self._failed = True
            self.abort()
            return False
        return True


def _remove_damaged(folder: Path, why: str) -> None:
    """Part of the folder's index found damaged after it was read (a record that does not decode): said once,
    and its files removed, so that the next read rebuilds it."""
    _say_damaged(index_path(folder), why)
    for name in (INDEX_FILE, DELTA_FILE):
        (folder / INDEX_DIR / name).unlink(missing_ok=True)


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


def _read_entries(path: Path, damaged, delta: bool = False) -> tuple[Rows | None, dict[str, Entry]]:
    """An index or delta file's rows (the columns each file is judged by; the rest read when asked for) and
    its entries; none for a file of other code (rebuilt quietly). OSError when there is none (or it cannot be
    opened), IndexDamaged when the file is not a whole index."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    with open(path, "rb") as f:  # OSError: none, or not readable
        data = f.read()
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
        return None, {}  # another benchsuite's (or another version of this one's): rebuilt, not an error
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
        return pq.ParquetFile(pa.BufferReader(data)).read(columns=names, use_threads=len(names) > 1)

    rows = Rows(table.select(JUDGED), more, damaged)
    rels, *keys, problems = (table.column(name).to_pylist() for name in (*FILE_COLUMNS, PROBLEM))
    return rows, {rel: Entry(key, rows, at, problem, delta)
                  for at, (rel, key, problem) in enumerate(zip(rels, map(FileKey, *keys), problems))}
