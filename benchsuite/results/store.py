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
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from benchsuite.record.codec import RecordError, decode, parse, to_dict
from benchsuite.record.columns import field_columns
from benchsuite.record.io import file_kind, read_bytes
from benchsuite.record.names import record_id
from benchsuite.record.sanity import flag_summary, with_flags
from benchsuite.record.types import Flag, Record
from benchsuite.results.index import MIN_FILES, Entry, FileKey, FolderIndex, IndexDamaged, record_blob, record_of
from benchsuite.results.migrate import migrate
from benchsuite.results.scaling import scaling_identity

if TYPE_CHECKING:  # pandas loads on first use: a rank writes its record without it
    import pandas as pd

MAX_FOLDER_DEPTH = 32  # results/<suite>/<commit>/... is a few levels; deeper is a loop or damage, said, not walked


def _entry_problem(path: Path, root: Path) -> str | None:
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


def record_files(path: Path, exclude: list[Path] | None = None) -> list[tuple[Path, str | None]]:
    """(file, None) for every *.json under the folder (hidden names left out, symlinked folders not
    followed), or (entry, why not) for one that is not a regular file, for a folder that cannot be
    listed (permission denied) and for one nested deeper than MAX_FOLDER_DEPTH. Iterative: a deep tree
    costs no recursion. The subtrees of the folders in exclude are not searched (compare's B inside A)."""
    root = Path(os.path.realpath(path))
    skipped = {os.path.realpath(p) for p in exclude or ()}
    found: list[Path] = []
    refused: list[tuple[Path, str]] = []
    stack = [(Path(path), 0)]
    while stack:
        folder, depth = stack.pop()
        try:
            with os.scandir(folder) as it:
                entries = list(it)
        except OSError as e:
            refused.append((folder, f"a folder that cannot be read ({e.strerror or e}); its records are not included"))
            continue
        for entry in entries:
            if entry.name.startswith("."):
                continue
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
            except OSError:
                is_dir = False
            if is_dir and entry.name.endswith(".json"):
                found.append(Path(entry.path))  # a folder named like a record: said, not searched
            elif is_dir and skipped and os.path.realpath(entry.path) in skipped:
                continue
            elif is_dir and depth >= MAX_FOLDER_DEPTH:
                refused.append((Path(entry.path), f"a folder nested more than {MAX_FOLDER_DEPTH} levels deep; "
                                                  "its records are not included (move them up)"))
            elif is_dir:
                stack.append((Path(entry.path), depth + 1))
            elif entry.name.endswith(".json"):
                found.append(Path(entry.path))
    result = []
    for p in sorted(found, key=lambda p: p.parts):  # Path's own order, without its per-comparison cost
        try:
            result.append((p, _entry_problem(p, root)))
        except OSError as e:  # removed meanwhile, permission denied
            result.append((p, f"cannot be read ({e.strerror or e})"))
    return result + sorted(refused)


@dataclass(frozen=True)
class Loaded:
    """A record as a reader has it: the typed record, and the file it was read from (None: built in memory)."""

    record: Record
    path: Path | None = None
    row: dict | None = field(default=None, compare=False, repr=False)  # its flatten() row, when already made


def typed(doc: dict) -> Record:
    """A record document (a file's, or one built in memory) as the types: upgraded to the current schema
    version, decoded (RecordError names the field that does not fit), then flagged by the sanity guard, which
    judges only what the types accepted (records written before the guard, or by an older one, are flagged
    on load too)."""
    rec = decode(migrate(doc))
    flags = with_flags(to_dict(rec))["flags"]
    return msgspec.structs.replace(rec, flags=msgspec.convert(flags, list[Flag]))


def read_record(path: Path) -> Record:
    """One record file as the types (typed); RecordError says why not."""
    return typed(parse(read_bytes(path)))


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
    entries = record_files(path, exclude) if folder else [(path, None)]
    index = FolderIndex.read(path) if folder and len(entries) >= MIN_FILES else None
    records: list[Loaded] = []
    seen: dict[str, list[Loaded]] = {}  # record id -> the records of that id read so far
    files: set[str] = set()  # the files' paths relative to the folder, as the index names them
    for p, problem in entries:
        try:
            if problem:
                raise RecordError(problem)
            rel = _relative(p, path) if index is not None else None
            files.add(rel)
            one = _read(p, rel, index, only)
            if one is None:  # left out by `only`
                continue
            same_id = seen.setdefault(record_id(one.record.run_key, one.record.repeat), [])
            check_not_a_copy(one, same_id)
        except RecordError as e:
            warnings.warn(f"skipping {p}: {e}", stacklevel=3)  # (the caller of load_records)
            continue
        same_id.append(one)
        records.append(one)
    if index is not None:
        if not exclude:  # (files under an excluded folder are still there: their entries stay)
            index.keep_only(files)
        if index.changed:
            index.write()
    return records


def _relative(p: Path, folder: Path) -> str:
    """p (a path record_files found under folder) relative to it, as text: the index's name for the file."""
    text, prefix = str(p), os.path.join(str(folder), "")
    return text[len(prefix):] if text.startswith(prefix) and os.sep == "/" else p.relative_to(folder).as_posix()


def _read(p: Path, rel: str | None, index: FolderIndex | None, only: Selection | None) -> Loaded | None:
    """The record at p (None: left out by `only`): from the index when it holds this very file (rel: its name
    there), else read and decoded, and put in the index. RecordError: why it is not a record (the index
    keeps that too)."""
    key = _key(p) if index is not None else None
    hit = index.hit(rel, key) if index is not None else None
    if hit is not None:
        if hit.problem is not None:
            raise RecordError(hit.problem)
        if only is not None and not only.admits(hit.suite, hit.workload, hit.started_at):
            return None
        try:
            return Loaded(record_of(hit.record), p, index.row_of(hit.row) if hit.row else None)
        except IndexDamaged as e:  # said once a read; the entry is made again from the file
            index.drop_damaged(rel, str(e))
    try:
        one = Loaded(read_record(p), p)
    except RecordError as e:
        if key is not None:
            index.put(rel, Entry(key, problem=str(e)))
        raise
    if key is not None:
        rec, row = one.record, flatten(one)
        index.put(rel, Entry(key, None, record_blob(rec), index.row_blob(row), rec.suite, rec.workload,
                             row["started_at"]))
        one = Loaded(rec, p, row)
    if only is not None and not only.admits(one.record.suite, one.record.workload, one.record.started_at):
        return None
    return one


def _key(p: Path) -> FileKey | None:
    """The file's identity, its target's for a symlink (None when it cannot be looked at: read as is)."""
    try:
        return FileKey.of(os.stat(p))
    except OSError:
        return None


def check_not_a_copy(one: Loaded, same_id: list[Loaded]) -> None:
    """A record identical to one already read (a copy or a link to it, e.g. a backup in a subfolder) is
    one measurement: read twice it would count as two repeats in every median. Two measurements of
    one run differ (their start time, their steps) even when they share a run key and repeat index."""
    for other in same_id:
        if other.record == one.record:
            raise RecordError(f"the same record as {other.path} (run key {one.record.run_key}, repeat "
                              f"{one.record.repeat}), one measurement, read once; remove one of the two files")


def ok_record_ids(path: str | Path) -> set[str]:
    """The record ids (record_id: run key and repeat) recorded ok, for resume. Files this run did not
    write are skipped quietly: they never stop a suite (the readers name them)."""
    if not Path(path).exists():
        return set()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {record_id(r.record.run_key, r.record.repeat) for r in load_records(path) if r.record.status == "ok"}


def flatten(one: Loaded) -> dict:
    """One DataFrame row: identity and the headline figures under short names, and every scalar field of
    the record's types under its dotted name (metrics.flops.model_per_token, config.parallel.zero, ...), as
    JSON has it (times as text): the same columns whatever the record holds (record/columns.py)."""
    if one.row is not None:  # made when the record was read (or kept in the index): only its file is new
        return dict(one.row, path=str(one.path) if one.path else None)
    rec = one.record
    cfg, m, err = rec.config, rec.metrics, rec.error
    ci95 = (m.step_time_s.ci95 if m and m.step_time_s else None) or [None, None]
    doc = msgspec.to_builtins(rec)
    row = {
        "run_key": rec.run_key, "suite": rec.suite, "workload": rec.workload, "status": str(rec.status),
        "repeat": rec.repeat,  # repeats of a run share its run key (results/model.py groups them)
        "kind": doc["config"]["kind"], "router": cfg.moe.router if cfg.moe else None,
        "description": cfg.description or "", "world_size": cfg.world_size, "nodes": cfg.nodes,
        "scaling": str(cfg.scaling), "sweep_id": cfg.sweep_id,
        "tensor": cfg.parallel.tensor if cfg.parallel else None, "zero": cfg.parallel.zero if cfg.parallel else None,
        "expert": cfg.parallel.expert if cfg.parallel else None,
        "started_at": doc["started_at"], "duration_s": rec.duration_s,
        "error_type": err.type if err else None, "error_message": err.message if err else None,
        "error_rank": err.rank if err else None,
        "tokens_per_s": m.tokens_per_s if m else None, "mfu": m.mfu if m else None,
        "step_time_median_s": m.step_time_s.median if m and m.step_time_s else None,
        "step_time_ci95_lo_s": ci95[0], "step_time_ci95_hi_s": ci95[1],
        "path": str(one.path) if one.path else None,
        # sanity guard (record/sanity.py): physically impossible figures, shown beside the status
        "flagged": bool(rec.flags), "flags": doc["flags"], "flag_summary": flag_summary(doc["flags"]) or None,
        **scaling_identity(rec),  # what a scaling baseline must share with this run (results/scaling.py)
    }
    quality = doc["metrics"]["quality"] if m and m.quality else {}
    for key in ("target_loss", "reached", "step", "tokens", "seconds", "model_flops", "energy_j", "co2e_g",
                "reason", "best_val_loss", "final_val_loss", "eval_seconds", "eval_energy_j"):
        row[f"quality.{key}"] = quality.get(key)  # to-target figures (metrics/quality.py) under short names
    fields: dict = {}
    _field_values(doc, _FIELD_TREE, fields)
    for path in _FIELD_PATHS:  # every scalar field the record's types declare, by its dotted path
        if path not in row:  # (a short name above, `repeat`: its value as the readers need it)
            row[path] = fields[path]
    return row


def _field_values(doc: dict | None, tree: dict, out: dict) -> None:
    """Each leaf of tree (its dotted path) with the value at that path of doc, None where doc has none: one
    walk of the document's sections, not one per field."""
    for key, sub in tree.items():
        v = doc.get(key) if doc is not None else None
        if isinstance(sub, str):
            out[sub] = v
        else:
            _field_values(v if isinstance(v, dict) else None, sub, out)


def _field_tree(paths: list[str]) -> dict:
    """The dotted paths as nested keys, each leaf its path ({"config": {"nodes": "config.nodes", ...}})."""
    tree: dict = {}
    for path in paths:
        *parents, leaf = path.split(".")
        node = tree
        for k in parents:
            node = node.setdefault(k, {})
        node[leaf] = path
    return tree


_FIELD_PATHS = field_columns()
_FIELD_TREE = _field_tree(_FIELD_PATHS)


# Figures the DataFrame does arithmetic on (scaling efficiency, report cells): float columns, NaN
# where a record has null, even when every record has null (object columns of None would not divide).
FIGURES = ("duration_s", "tokens_per_s", "mfu", "step_time_median_s", "step_time_ci95_lo_s", "step_time_ci95_hi_s")


def rows_dataframe(rows: list[dict]) -> pd.DataFrame:
    """flatten() rows as one DataFrame, sorted by suite, workload, world size and start."""
    import pandas as pd

    df = pd.DataFrame(rows)
    if df.empty:
        return df
    df = df.astype({c: float for c in FIGURES})
    return df.sort_values(["suite", "workload", "world_size", "started_at"], ignore_index=True)


def dataframe_of(records: list[Loaded]) -> pd.DataFrame:
    """Records already loaded (load_records) as one DataFrame, one row per record (the results model,
    results/model.py, groups them into runs). Column `rec` is each row's index in `records`."""
    with cyclic_gc_paused():
        return rows_dataframe([{**flatten(r), "rec": i} for i, r in enumerate(records)])
