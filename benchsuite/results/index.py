"""A results folder's index: what reading each record file gave (the typed record and its DataFrame row, or
why the file is not a record), kept beside the records so that a reader decodes only the files that are
new or changed since. The JSON records stay the source of truth; the index is a cache that is never
required: missing, unreadable, damaged or written by other code, it is rebuilt from the records, and a
folder that cannot be written to is read from memory as before.

One Parquet file, `<folder>/.benchsuite-index/records.parquet` (hidden: record_files never walks it), one
row per record file: the file's identity (relative path, size, mtime_ns, ctime_ns, inode), the columns a
filter reads (suite, workload, started_at), the reason the file is skipped (when it is), and the record
and its row as msgpack. Parquet through pyarrow rather than DuckDB: a reader reads one file that a writer
replaces atomically (temp file, os.replace), so any number of processes on a shared file system read while
one writes, with no database lock to wait on (a DuckDB file admits one writing process and keeps readers
of other processes out meanwhile), and a reader needs no query engine: it takes every entry whose file is
unchanged, and a filter (suite, workload, started_at) is judged on the small columns, so that a filtered
load decodes only the records it keeps. On 10,000 records the index is a few MB for 160 MB of JSON.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from benchsuite.atomic import atomic_file, umask
from benchsuite.record.types import SCHEMA_VERSION, Record

INDEX_DIR = ".benchsuite-index"  # hidden: record_files leaves out every name that starts with a dot
INDEX_FILE = "records.parquet"
FORMAT = 1  # this file's layout; any other is rebuilt quietly, as after an upgrade
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
                "benchsuite/results/scaling.py", "benchsuite/results/identity.py", "benchsuite/results/index.py")


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


@dataclass
class Entry:
    """What reading one record file gave: the record (msgpack of its builtins) and its flatten() row (msgpack
    of the values in the index's column order), or `problem`, the reason it is skipped (warned on every
    read, as the file itself would be). suite, workload and started_at are the filters' columns."""

    key: FileKey
    problem: str | None = None
    record: bytes | None = None
    row: bytes | None = None
    suite: str | None = None
    workload: str | None = None
    started_at: str | None = None


class IndexDamaged(Exception):
    """The index file cannot be read as one (a reader warns once and rebuilds it from the records)."""


_ENCODER = msgspec.msgpack.Encoder()
_RECORD = msgspec.msgpack.Decoder(Record)
_VALUES = msgspec.msgpack.Decoder(list)


def record_blob(rec: Record) -> bytes:
    """The record as msgpack of its builtins: times stay RFC 3339 text with their own offset (msgpack's
    timestamp would bring them back in UTC), so the record read back is the one read from the file."""
    return _ENCODER.encode(msgspec.to_builtins(rec))


def record_of(blob: bytes | None) -> Record:
    if blob is None:
        raise IndexDamaged("an entry with neither a record nor a reason")
    try:
        return _RECORD.decode(blob)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise IndexDamaged(f"a record that does not decode ({e})") from None


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
    """A folder's index as read (entries by path relative to the folder) and as it will be written."""

    folder: Path
    columns: tuple[str, ...] | None  # the flatten() rows' columns (None: no row yet)
    entries: dict[str, Entry]
    changed: bool = False  # an entry was added, replaced or dropped: worth writing
    read_at_ns: int = field(default_factory=time.time_ns)  # before any file of this read was looked at
    damage_said: bool = False

    @classmethod
    def read(cls, folder: Path) -> FolderIndex:
        """The folder's index; empty when there is none or it was written by other code, and empty with one
        warning when the file is damaged or not an index at all."""
        path = index_path(folder)
        try:
            columns, entries = _read_entries(path)
        except OSError:  # none (yet, or removed), or not this user's to read: the records are read instead
            columns, entries = None, {}
        except IndexDamaged as e:
            _say_damaged(path, str(e), stacklevel=5)  # (load_records' caller)
            return cls(folder, None, {}, changed=True, damage_said=True)
        return cls(folder, columns, entries)

    def row_blob(self, row: dict) -> bytes | None:
        """A flatten() row as its values in the index's column order (the names are in the file once); None
        (the row is made again when read) for a row of other columns."""
        if self.columns is None:
            self.columns = tuple(row)
        return _ENCODER.encode(list(row.values())) if tuple(row) == self.columns else None

    def row_of(self, blob: bytes) -> dict:
        try:
            values = _VALUES.decode(blob)
        except msgspec.DecodeError as e:
            raise IndexDamaged(f"a row that does not decode ({e})") from None
        if self.columns is None or len(values) != len(self.columns):
            raise IndexDamaged(f"a row of {len(values)} values for {len(self.columns or ())} columns")
        return dict(zip(self.columns, values))

    def drop_damaged(self, rel: str, why: str) -> None:
        """An entry that does not decode: dropped (the file is read instead), the damage said once."""
        if not self.damage_said:
            _say_damaged(index_path(self.folder), why, stacklevel=6)  # (load_records' caller)
            self.damage_said = True
        del self.entries[rel]
        self.changed = True

    def hit(self, rel: str, key: FileKey | None) -> Entry | None:
        one = self.entries.get(rel)
        return one if one is not None and key is not None and one.key == key else None

    def put(self, rel: str, entry: Entry) -> None:
        """A file decoded now; kept only when its key can be trusted next time: not changed in the last
        RACY_NS before this read began (a later change then lands on another tick of the file's clock)."""
        if self.read_at_ns - max(entry.key.mtime_ns, entry.key.ctime_ns) > RACY_NS:
            self.entries[rel] = entry
            self.changed = True
        elif self.entries.pop(rel, None) is not None:
            self.changed = True

    def keep_only(self, seen: set[str]) -> None:
        """Drop the entries of files no longer there."""
        gone = self.entries.keys() - seen
        for rel in gone:
            del self.entries[rel]
        self.changed |= bool(gone)

    def write(self) -> None:
        """Replace the index file atomically (readers see the old one or the new one, whole), under a lock
        that one writer at a time holds: another process writing it now, a folder that cannot be written
        to, a full disk: the index is left as it is, and nothing is said (the records were read)."""
        from filelock import FileLock, Timeout

        path = index_path(self.folder)
        try:
            path.parent.mkdir(exist_ok=True)
            with FileLock(path.parent / "lock", timeout=0, mode=0o666 & ~umask()):  # the team's, as the records
                with atomic_file(path, "wb", durable=False) as f:
                    f.write(_parquet_bytes(self.entries, self.columns or ()))
        except (OSError, Timeout):
            return
        self.changed = False


def _say_damaged(path: Path, why: str, stacklevel: int) -> None:
    warnings.warn(f"the results index {path} is damaged ({why}); rebuilding it from the records "
                  "(the records are the source of truth: nothing is lost)", stacklevel=stacklevel)


_FILE_COLUMNS = ("path", "size", "mtime_ns", "ctime_ns", "ino")
_VALUE_COLUMNS = ("problem", "suite", "workload", "started_at", "record", "row")


def _schema():
    import pyarrow as pa

    return pa.schema([("path", pa.string()), *((name, pa.int64()) for name in _FILE_COLUMNS[1:]),
                      *((name, pa.string()) for name in _VALUE_COLUMNS[:4]),
                      *((name, pa.binary()) for name in _VALUE_COLUMNS[4:])])


def _parquet_bytes(entries: dict[str, Entry], columns: tuple[str, ...]) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rels = sorted(entries)
    ones = [entries[r] for r in rels]
    values = {"path": rels, **{name: [getattr(e.key, name) for e in ones] for name in _FILE_COLUMNS[1:]},
              **{name: [getattr(e, name) for e in ones] for name in _VALUE_COLUMNS}}
    table = pa.Table.from_pydict(values, schema=_schema())
    meta = {"format": FORMAT, "code": code_version(), "columns": list(columns)}
    table = table.replace_schema_metadata({METADATA_KEY: json.dumps(meta).encode()})
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd")
    return sink.getvalue().to_pybytes()


def _read_entries(path: Path) -> tuple[tuple[str, ...] | None, dict[str, Entry]]:
    """The index file's row columns and entries; none for an index of other code (rebuilt quietly).
    OSError when there is none (or it cannot be opened), IndexDamaged when the file is not a whole index."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    with open(path, "rb") as f:  # OSError: none, or not readable
        data = f.read()
    try:
        table = pq.read_table(pa.BufferReader(data))
    except (pa.ArrowException, OSError, ValueError) as e:
        raise IndexDamaged(f"not a Parquet file: {e}") from None
    try:
        meta = json.loads((table.schema.metadata or {})[METADATA_KEY])
        fmt, code, stored = meta["format"], meta["code"], tuple(meta["columns"])
    except (KeyError, TypeError, ValueError):
        raise IndexDamaged("a Parquet file that is not a benchsuite index") from None
    if (fmt, code) != (FORMAT, code_version()):
        return None, {}  # another benchsuite's (or another version of this one's): rebuilt, not an error
    if table.schema.remove_metadata() != _schema():
        raise IndexDamaged(f"columns {table.schema.names} of other types than an index's")
    if any(table.column(name).null_count for name in _FILE_COLUMNS):
        raise IndexDamaged("a file without its path, size or times")
    cols = {name: table.column(name).to_pylist() for name in (*_FILE_COLUMNS, *_VALUE_COLUMNS)}
    keys = [FileKey(*k) for k in zip(*(cols[name] for name in _FILE_COLUMNS[1:]))]
    return stored or None, {rel: Entry(key, **dict(zip(_VALUE_COLUMNS, values))) for rel, key, values in
                            zip(cols["path"], keys, zip(*(cols[name] for name in _VALUE_COLUMNS)))}
