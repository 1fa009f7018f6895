"""Results folders: one scan of a folder for every verb, each file read through the record layer
(parse, migrate, decode: record/codec.py, results/migrate.py), and one flat DataFrame.

The scan is iterative and bounded in depth, and costs time linear in the number of files; every file
that is not a readable record is skipped with one warning naming it and the field or reason. What each
file gave is kept in the folder's index (results/index.py): a file unchanged since is not decoded again.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import gc
import os
import stat
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from benchsuite.record.codec import RecordError
from benchsuite.record.io import file_kind
from benchsuite.record.names import record_id
from benchsuite.record.types import Record
from benchsuite.results.decoding import decoded_batches, read_record, typed
from benchsuite.results.index import MIN_FILES, Entry, FileKey, FolderIndex
from benchsuite.results.rows import Rows, Summary, record_blob, row_schema, rows_table, table_schema, taken

if TYPE_CHECKING:  # pandas and pyarrow load on first use: a rank writes its record without them
    import pandas as pd
    import pyarrow as pa

MAX_FOLDER_DEPTH = 32  # results/<suite>/<commit>/... is a few levels; deeper is a loop or damage, said, not walked


def _entry_problem(path: str, root: Path) -> str | None:
    """Why the folder entry at path is not a record file to open (None when it is one). Checked with
    lstat before anything is opened: a FIFO or device is never opened, a symlink never leads out."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        target = Path(os.path.realpath(path))
        if not target.is_relative_to(root):
            return f"a symlink pointing out of the results folder (to {target})"
        try:
            st = os.stat(path)
        except OSError as e:
            return f"a broken symlink ({e.strerror or e})"
    if not stat.S_ISREG(st.st_mode):
        return f"{file_kind(st.st_mode)}, not a record file"
    return None


def _prefix(folder: str) -> str:
    """What a folder's entries' paths begin with, as str(Path(folder) / name) writes them (the folder as
    str(Path) writes it; '.' adds nothing): made without Path's parsing, 100,000 records listed in a fraction
    of the time."""
    return "" if folder == "." else os.path.join(folder, "")


def _listed(folder: str, depth: int) -> Iterator[tuple[os.DirEntry, str, int]]:
    """A folder's entries, hidden names left out, by name, each with its path and depth: a tree walked in
    Path's order, sorted a folder at a time (OSError where the folder cannot be listed)."""
    with os.scandir(folder) as it:
        entries = sorted((e for e in it if not e.name.startswith(".")), key=lambda e: e.name)
    prefix = _prefix(folder)
    return ((e, prefix + e.name, depth) for e in entries)


def record_files(path: Path, exclude: list[Path] | None = None) -> list[tuple[str, str | None]]:
    """(file, None) for every *.json under the folder (hidden names left out, symlinked folders not
    followed), or (entry, why not) for one that is not a regular file, for a folder that cannot be
    listed (permission denied) and for one nested deeper than MAX_FOLDER_DEPTH; each path as text, as
    str(Path) writes it, in Path's order. Iterative: a deep tree costs no recursion. The subtrees of the
    folders in exclude are not searched (compare's B inside A)."""
    root = Path(os.path.realpath(path))
    skipped = {os.path.realpath(p) for p in exclude or ()}
    found: list[tuple[str, bool]] = []  # (a file, whether it is to be looked at: not a regular file, as listed)
    refused: list[tuple[str, str]] = []
    stack: list[Iterator[tuple[os.DirEntry, str, int]]] = []

    def descend(folder: str, depth: int) -> None:
        try:
            stack.append(_listed(folder, depth))
        except OSError as e:
            refused.append((folder, f"a folder that cannot be read ({e.strerror or e}); its records are not included"))

    descend(str(Path(path)), 0)
    while stack:
        item = next(stack[-1], None)
        if item is None:  # the folder walked
            stack.pop()
            continue
        entry, p, depth = item
        try:
            is_dir = entry.is_dir(follow_symlinks=False)
        except OSError:
            is_dir = False
        if is_dir and entry.name.endswith(".json"):
            found.append((p, True))  # a folder named like a record: said, not searched
        elif is_dir and skipped and os.path.realpath(p) in skipped:
            continue
        elif is_dir and depth >= MAX_FOLDER_DEPTH:
            refused.append((p, f"a folder nested more than {MAX_FOLDER_DEPTH} levels deep; its records are not "
                               "included (move them up)"))
        elif is_dir:
            descend(p, depth + 1)
        elif entry.name.endswith(".json"):
            try:  # (a regular file, as the folder's listing says: not looked at again)
                regular = entry.is_file(follow_symlinks=False)
            except OSError:
                regular = False
            found.append((p, not regular))
    result = []
    for p, odd in found:
        if odd:
            try:
                result.append((p, _entry_problem(p, root)))
            except OSError as e:  # removed meanwhile, permission denied
                result.append((p, f"cannot be read ({e.strerror or e})"))
        else:
            result.append((p, None))
    return result + sorted(refused, key=lambda r: r[0].split(os.sep))  # (Path's order)


class Loaded:
    """A record as a reader has it: the typed record, the file it was read from (None: built in memory), and
    its row (rows.py) where one was made already: row `at` of `rows` (an index's, or those of the records
    decoded by this read). A record taken from the index is decoded when first asked for: a reader of the
    rows alone (load(), load_runs(), load_steps()) decodes none."""

    __slots__ = ("_record", "_path", "rows", "at")

    def __init__(self, record: Record | None, path: Path | str | None = None, rows: Rows | None = None,
                 at: int = -1):
        self._record, self._path, self.rows, self.at = record, path, rows, at

    @property
    def path(self) -> Path | None:
        """The file, a Path made when first asked for (a folder's files are listed as text: record_files)."""
        if isinstance(self._path, str):
            self._path = Path(self._path)
        return self._path

    @property
    def record(self) -> Record:
        if self._record is None:
            # a record in the index that does not decode (the index says so once): its file read instead
            self._record = self.rows.record(self.at) or read_record(self.path)
        return self._record

    def blob(self) -> bytes | memoryview:
        """The record's blob (rows.record_blob): its rows' where they hold it (nothing decoded), else made from
        the typed record (the same bytes)."""
        held = self.rows.blob(self.at) if self.rows is not None else None
        return held if held is not None else record_blob(msgspec.to_builtins(self.record))

    def summary(self) -> Summary | Record:
        """What summary views read of the record beyond its row (rows.Summary): decoded alone from its own small
        blob where its rows hold one (nothing else of the record read); else, or where that blob does not
        decode, the record (which reads the same)."""
        held = self.rows.summary(self.at) if self.rows is not None else None
        return held if held is not None else self.record

    def same_record(self, other: Loaded) -> bool:
        """Whether two loaded records are one record: their blobs compared where both are in rows and not
        decoded yet (one record is one blob: rows.rows_table), else the records."""
        if self._record is None and other._record is None:
            mine, theirs = self.rows.blob(self.at), other.rows.blob(other.at)
            if mine is not None and theirs is not None:
                return mine == theirs
        return self.record == other.record

    def __eq__(self, other) -> bool:
        return isinstance(other, Loaded) and (self.path, self.record) == (other.path, other.record)

    __hash__ = None

    def __repr__(self) -> str:
        return f"Loaded({self.record!r}, {self.path!r})"


def loaded(docs: list[dict]) -> list[Loaded]:
    """Record documents built in memory (a test, `benchsuite.dashboard.load(records)`), read as a folder's
    files are: each a copy, upgraded, flagged and typed."""
    return [Loaded(typed(msgspec.json.decode(msgspec.json.encode(doc)))) for doc in docs]


@contextlib.contextmanager
def cyclic_gc_paused():
    """Reading a folder makes thousands of small dicts and lists per record, none in a reference cycle:
    the cyclic collector would rescan the whole growing heap again and again (time superlinear in the
    number of records). Paused for the read, as it was before after it."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@dataclass(frozen=True)
class Selection:
    """Which records a reader keeps (load_records' `only`): None keeps any. Records the folder's index
    already knows are left out before they are decoded."""

    suites: frozenset[str] | None = None
    workloads: frozenset[str] | None = None
    since: dt.datetime | None = None  # started at or after (a time without an offset is UTC)

    @classmethod
    def of(cls, suite: str | Iterable[str] | None = None, workload: str | Iterable[str] | None = None,
           since: str | dt.date | None = None) -> Selection | None:
        """The selection of a reader's arguments (None when none is given); a value of the wrong type is a
        TypeError naming the argument and what it takes."""
        if suite is None and workload is None and since is None:
            return None
        return cls(_names("suite", suite), _names("workload", workload), _time("since", since))

    def admits(self, suite: str | None, workload: str | None, started_at: str | dt.datetime | None) -> bool:
        if self.suites is not None and suite not in self.suites:
            return False
        if self.workloads is not None and workload not in self.workloads:
            return False
        if self.since is not None:
            t = dt.datetime.fromisoformat(started_at) if isinstance(started_at, str) else started_at
            return t is not None and t >= self.since
        return True


def _names(what: str, value: str | Iterable[str] | None) -> frozenset[str] | None:
    if value is None:
        return None
    names = (value,) if isinstance(value, str) else tuple(value) if isinstance(value, Iterable) else None
    if names is None or not all(isinstance(n, str) for n in names):
        raise TypeError(f"{what}: expected a name or a list of names, got {value!r}")
    return frozenset(names)


def _time(what: str, value: str | dt.date | None) -> dt.datetime | None:
    if value is None:
        return None
    try:
        t = dt.datetime.fromisoformat(value) if isinstance(value, str) else value
    except ValueError:
        raise TypeError(f"{what}: expected an ISO 8601 date or time such as 2026-11-30, got {value!r}") from None
    if isinstance(t, dt.date) and not isinstance(t, dt.datetime):
        t = dt.datetime.combine(t, dt.time())
    if not isinstance(t, dt.datetime):
        raise TypeError(f"{what}: expected a date, a datetime or ISO 8601 text, got {value!r}")
    return t if t.tzinfo else t.replace(tzinfo=dt.timezone.utc)


def load_records(path: str | Path, exclude: list[str | Path] | None = None,
                 only: Selection | None = None) -> list[Loaded]:
    """Every readable record under path (a folder, searched recursively, or one file), less the
    subtrees of the folders in exclude, and less those `only` leaves out. Anything else — not a regular
    file, a symlink out of the folder, too large, not UTF-8 JSON, a field of the wrong type, a newer
    schema — is skipped with one warning naming it and why, on every read (from the index too)."""
    with cyclic_gc_paused():
        return _load_records(Path(path), [Path(p) for p in exclude or ()], only)


def _load_records(path: Path, exclude: list[Path], only: Selection | None) -> list[Loaded]:
    folder = path.is_dir()
    entries = record_files(path, exclude) if folder else [(str(path), None)]
    index = FolderIndex.read(path) if folder and len(entries) >= MIN_FILES else None
    records: list[Loaded] = []
    seen: dict[str, list[Loaded]] = {}  # record id -> the records of that id read so far
    files: list[tuple[str, str | None, str | None, Entry | None]] = []  # (file, why not a record, name, entry)
    new: list[tuple[str, str, FileKey | None]] = []  # the files the index has no entry for: decoded now
    prefix = _prefix(str(path))
    for p, problem in entries:
        rel = _relative(p, path, prefix) if index is not None and not problem else None
        key = _key(p) if rel is not None else None
        entry = index.hit(rel, key) if rel is not None else None
        files.append((p, problem, rel, entry))
        if rel is not None and entry is None:
            new.append((p, rel, key))
    decoded: dict[str, Loaded] = {}  # the files decoded now, by relative path (with an index)
    ids = _RowIds()
    fresh = _decoded_now(new, index)
    try:
        for p, problem, rel, entry in files:
            try:
                if problem:
                    raise RecordError(problem)
                if index is None:  # a few files: each decoded, the typed record kept
                    one = Loaded(read_record(p), p)
                    ident = (one.record.run_key, one.record.repeat)
                    if only is not None and not only.admits(one.record.suite, one.record.workload,
                                                            one.record.started_at):
                        continue
                else:  # the index's entry of this very file, or the one made now: its row
                    now = entry is None
                    if now:
                        entry = next(fresh)
                    if entry.problem is not None:
                        raise RecordError(entry.problem)
                    if only is not None and not only.admits(*ids.filtered(entry.rows, entry.at)):
                        continue
                    one = Loaded(None, p, entry.rows, entry.at)
                    if now:
                        decoded[rel] = one
                    ident = ids.run_key_and_repeat(entry.rows, entry.at)
                same_id = seen.setdefault(record_id(*ident), [])
                check_not_a_copy(one, same_id, *ident)
            except RecordError as e:
                warnings.warn(f"skipping {p}: {e}", stacklevel=3)  # (the caller of load_records)
                continue
            same_id.append(one)
            records.append(one)
    except BaseException:  # (a read stopped part-way: the index left as it was)
        if index is not None:
            index.abort()
        raise
    finally:
        fresh.close()  # (its workers stopped, where it has any)
    if index is not None:
        if not exclude:  # (files under an excluded folder are still there: their entries stay)
            index.keep_only({rel for _, _, rel, _ in files if rel is not None})
        if index.changed:
            index.write()
            for rel, one in decoded.items():  # written: each row read from the index, the rows made let go
                if rel in index.entries:
                    one.rows, one.at = index.entries[rel].rows, index.entries[rel].at
    return records


class _RowIds:
    """The columns of rows a read judges each file by (its filters, its record's id), read once per table: each
    row's values as one tuple."""

    def __init__(self):
        self._tuples: dict[tuple[int, tuple[str, ...]], list[tuple]] = {}  # (id of the rows, columns) -> rows' values

    def _values(self, rows: Rows, at: int, names: tuple[str, ...]) -> tuple:
        key = (id(rows), names)
        values = self._tuples.get(key)
        if values is None:
            values = self._tuples[key] = list(zip(*(rows.column(name).to_pylist() for name in names)))
        return values[at]

    def filtered(self, rows: Rows, at: int) -> tuple:
        return self._values(rows, at, ("suite", "workload", "started_at"))

    def run_key_and_repeat(self, rows: Rows, at: int) -> tuple[str, int]:
        return self._values(rows, at, ("run_key", "repeat"))


def _with_rows(ones: list[Loaded]) -> Rows:
    """Makes the rows of records decoded now at once (rows.rows_table), each Loaded pointed at its own."""
    fresh = Rows(rows_table([one.record for one in ones]))
    for at, one in enumerate(ones):
        one.rows, one.at = fresh, at
    return fresh


def _decoded_now(files: list[tuple[str, str, FileKey | None]], index: FolderIndex) -> Iterator[Entry]:
    """Each file decoded (decoding.decoded_batches), in order, as an entry: why it is not a record, or its row
    (the typed records let go: their rows hold them). Each is put in the index (when its key is known), and
    each batch's rows appended to the index being written, their blobs let go once its file has them."""
    done = 0
    for problems, table in decoded_batches([p for p, _, _ in files]):
        rows, batch, done = Rows(table), files[done:done + len(problems)], done + len(problems)
        for (_, rel, key), problem in zip(batch, problems):
            if key is not None:
                index.put(rel, key, problem)
        if index.append(rows, [rel for (_, rel, _), problem in zip(batch, problems) if problem is None]):
            rows.let_go_records()
        at = 0
        for (_, _, key), problem in zip(batch, problems):
            yield Entry(key, rows if problem is None else None, at if problem is None else -1, problem, False)
            at += problem is None


def _relative(p: str, folder: Path, prefix: str) -> str:
    """p (a path record_files listed under folder) relative to it: the index's name for the file. prefix: the
    folder's path as record_files joins its entries to it (_prefix)."""
    return p[len(prefix):] if p.startswith(prefix) and os.sep == "/" else Path(p).relative_to(folder).as_posix()


def _key(p: str) -> FileKey | None:
    """The file's identity, its target's for a symlink (None when it cannot be looked at: read as is)."""
    try:
        return FileKey.of(os.stat(p))
    except OSError:
        return None


def check_not_a_copy(one: Loaded, same_id: list[Loaded], run_key: str, repeat: int) -> None:
    """A record identical to one already read (a copy or a link to it, e.g. a backup in a subfolder) is
    one measurement: read twice it would count as two repeats in every median. Two measurements of
    one run differ (their start time, their steps) even when they share a run key and repeat index."""
    for other in same_id:
        if other.same_record(one):
            raise RecordError(f"the same record as {other.path} (run key {run_key}, repeat {repeat}), one "
                              "measurement, read once; remove one of the two files")


def ok_record_ids(path: str | Path) -> set[str]:
    """The record ids (record_id: run key and repeat) recorded ok, for resume. Files this run did not
    write are skipped quietly: they never stop a suite (the readers name them)."""
    if not Path(path).exists():
        return set()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded = load_records(path)
    ids = row_columns(loaded, ["run_key", "repeat", "status"]).to_pydict()  # (the rows' columns: no record decoded)
    return {record_id(key, repeat) for key, repeat, status in zip(ids["run_key"], ids["repeat"], ids["status"])
            if status == "ok"}


def flatten(one: Loaded) -> dict:
    """One record's row of the results DataFrame (rows.py: every scalar field of the types under its dotted
    path, the short names, identity, flags, and its file)."""
    row = dataframe_of([one]).iloc[0].to_dict()
    del row["rec"]
    return row


# Figures the DataFrame does arithmetic on (scaling efficiency, report cells): float columns, NaN
# where a record has null, even when every record has null (object columns of None would not divide).
FIGURES = ("duration_s", "tokens_per_s", "mfu", "step_time_median_s", "step_time_ci95_lo_s", "step_time_ci95_hi_s")


def row_columns(records: list[Loaded], names: list[str]) -> pa.Table:
    """Columns of the records' rows (rows.table_schema), one row per record in their order: taken from the
    tables the rows are in (an index's: nothing is decoded), made for the records that have none yet."""
    if not records:
        return table_schema().empty_table().select(names)
    parts, positions = _row_sources(records)
    return _taken(parts, names, positions)


def _row_sources(records: list[Loaded]) -> tuple[list[Rows], list[int]]:
    """The tables the records' rows are in (rows made now for the records that have none), and each record's
    row in those tables put end to end."""
    tables: dict[int, tuple[int, Rows]] = {}  # id(rows) -> (its offset in the tables put end to end, rows)
    rowless = [one for one in records if one.rows is None]
    if rowless:
        _with_rows(rowless)
    offset, positions = 0, []
    for one in records:
        if id(one.rows) not in tables:
            tables[id(one.rows)] = (offset, one.rows)
            offset += len(one.rows.table)
        positions.append(tables[id(one.rows)][0] + one.at)
    return [rows for _, rows in tables.values()], positions


def _taken(parts: list[Rows], names: list[str], positions) -> pa.Table:
    import pyarrow as pa

    tables = [rows.columns(names) for rows in parts]
    return taken(tables[0] if len(tables) == 1 else pa.concat_tables(tables), positions)


def dataframe_of(records: list[Loaded], columns: list[str] | None = None) -> pd.DataFrame:
    """Records already loaded (load_records) as one DataFrame, one row per record (the results model,
    results/model.py, groups them into runs), sorted by suite, workload, world size and start. Column `rec`
    is each row's index in `records`. columns: only these of the row (and ORDER's), for a reader that needs
    no figures (a frame of every column is ~400 wide)."""
    if not records:
        import pandas as pd

        return pd.DataFrame()
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    from pandas.errors import PerformanceWarning

    names = row_schema().names if columns is None else list(dict.fromkeys([*ORDER, *columns]))
    with cyclic_gc_paused():
        parts, positions = _row_sources(records)
        # sorted before it is a DataFrame, on the sort's columns alone: then one take of each column in Arrow,
        # from the rows where they are (an index's rows are in the order their files were written)
        order = pc.sort_indices(_taken(parts, list(ORDER), positions), [(c, "ascending") for c in ORDER])
        table = _taken(parts, names, np.asarray(positions)[order.to_numpy()])
        paths = pa.array([os.fspath(one._path) if one._path else None for one in records], pa.string())
        table = table.append_column("path", paths.take(order)).append_column("rec", order.cast(pa.int64()))
        for rows in {id(one.rows): one.rows for one in records}.values():
            rows.let_go(names)
        at = table.schema.get_field_index("flags")
        flags = [msgspec.json.decode(f) for f in table.column("flags").to_pylist()] if at >= 0 else None
        # (self_destruct: each column's Arrow memory let go as it is converted, not held beside the whole frame)
        df = (table.drop_columns(["flags"]) if at >= 0 else table).to_pandas(self_destruct=True, split_blocks=True)
        del table
        if flags is not None:
            with warnings.catch_warnings():  # a block per column (split_blocks) is "fragmented": as intended here
                warnings.simplefilter("ignore", PerformanceWarning)
                df.insert(at, "flags", flags)
        return df.astype({c: float for c in FIGURES if c in df})


ORDER = ("suite", "workload", "world_size", "started_at")  # the DataFrame's rows, sorted (nulls last)
