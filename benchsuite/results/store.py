"""Run records on disk: atomic writes, loading that checks every file (results/schema.py) before a
reader sees it, one flat DataFrame."""

from __future__ import annotations

import json
import math
import os
import re
import stat
import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from benchsuite.atomic import atomic_file
from benchsuite.metrics.scaling import add_scaling_efficiency, scaling_identity
from benchsuite.results.sanity import flag_summary, with_flags
from benchsuite.results.migrate import migrate
from benchsuite.results.schema import SCHEMA_VERSION, RecordError, validate
from benchsuite.results.values import dig

if TYPE_CHECKING:  # pandas loads on first use: a rank writes its record without it
    import pandas as pd


def slug(text: str, limit: int = 40) -> str:
    """A file-name-safe form of a user-given name (the name itself stays in the record)."""
    s = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.")
    return (s or "x")[:limit]


def record_id(run_key: str, repeat: int) -> str:
    """What tells a record from the other repeats of its run (file, lock and resume names): the run
    key, with -rN for repeat N >= 1. Repeat 0 is the bare run key, as records were named before repeats."""
    return run_key if repeat == 0 else f"{run_key}-r{repeat}"


def repeat_of(rec: dict) -> int:
    """The record's repeat index; 0 for a record written before repeats (it has no `repeat` field)."""
    return rec.get("repeat") or 0


def record_filename(rec: dict) -> str:
    cfg = rec["config"]
    return (f"{slug(rec['suite'])}__{slug(rec['workload'])}__w{cfg['world_size']}n{cfg['nodes']}"
            f"-{cfg['scaling']}__{record_id(rec['run_key'], repeat_of(rec))}.json")


def write_record(out_dir: str | Path, rec: dict) -> Path:
    """Written atomically: a reader sees the old record or the whole new one, never a partial
    record, even if this process is killed mid-write."""
    final = Path(out_dir) / record_filename(rec)
    data = json.dumps(rec, indent=1, sort_keys=True, allow_nan=False)
    try:
        with atomic_file(final, "w", encoding="utf-8") as f:
            f.write(data)
    except OSError as e:  # disk full, quota, file too large: name the record, keep the errno
        raise OSError(e.errno, f"cannot write record {final}: {e.strerror or e}") from e
    return final


MAX_RECORD_BYTES = 64 * 2**20  # a record is kilobytes to a few MiB (200k steps ~ 20 MiB); larger is not one
MAX_DEPTH = 32                 # a record nests about 6 deep; far deeper is damage (and recursion for readers)
MAX_LIST_ITEMS = 1_000_000     # its longest list is `steps` (under 1M real steps fit in MAX_RECORD_BYTES); a list
                               # of 10M empty objects fits in 30 MB and would keep every reader busy for minutes
MAX_CONTAINERS = 2 * MAX_LIST_ITEMS  # objects and lists in all: the steps' and everything else's
FLATTENED = ("metrics", "energy", "carbon")  # sections flatten() turns into dotted column names
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")  # how a lone surrogate gets into UTF-8 JSON text


def _file_kind(mode: int) -> str:
    for test, kind in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return kind
    return "not a regular file"


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
        return f"{_file_kind(st.st_mode)}, not a record file"
    return None


def record_files(path: Path) -> list[tuple[Path, str | None]]:
    """(file, None) for every *.json under the folder (recursively, hidden names left out, symlinked
    folders not followed), or (entry, why not) for one that is not a regular file in the folder and for
    a folder that cannot be listed (permission denied)."""
    root = Path(os.path.realpath(path))
    found, unreadable = [], []  # os.walk would pass over a folder it cannot list without a word
    for folder, dirs, files in os.walk(path, onerror=unreadable.append, followlinks=False):
        for name in [d for d in dirs if d.endswith(".json") and not d.startswith(".")]:
            dirs.remove(name)  # a folder named like a record: said, not searched
            found.append(Path(folder) / name)
        found += [Path(folder) / f for f in files if f.endswith(".json") and not f.startswith(".")]
    entries = []
    for p in sorted(found):
        try:
            entries.append((p, _entry_problem(p, root)))
        except OSError as e:  # removed meanwhile, permission denied
            entries.append((p, f"cannot be read ({e.strerror or e})"))
    entries += [(Path(e.filename), f"a folder that cannot be read ({e.strerror or e}); its records are not "
                                   "included") for e in unreadable]
    return entries


def _read_bytes(path: Path) -> bytes:
    """At most MAX_RECORD_BYTES of a regular file. Opened non-blocking and without following a final
    symlink (the real path is opened), then checked again on the open descriptor: a FIFO swapped in
    meanwhile is refused, never waited on."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(os.path.realpath(path), flags)
    except OSError as e:
        raise RecordError(f"cannot be read ({e.strerror or e})") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise RecordError(f"{_file_kind(st.st_mode)}, not a record file")
        if st.st_size > MAX_RECORD_BYTES:
            raise RecordError(f"{st.st_size:,} bytes, larger than a record can be ({MAX_RECORD_BYTES // 2**20} MiB)")
        data = f.read(MAX_RECORD_BYTES + 1)
    if len(data) > MAX_RECORD_BYTES:
        raise RecordError(f"larger than a record can be ({MAX_RECORD_BYTES // 2**20} MiB)")
    return data


def _strict_float(s: str) -> float:
    v = float(s)
    if not math.isfinite(v):
        raise ValueError(f"number {s[:40]} is out of range")
    return v


def _strict_int(s: str) -> int:
    """An integer literal; one past Python's conversion limit is out of range, named as such (Python's
    own message would suggest sys.set_int_max_str_digits). Shorter ones beyond float range: the schema's."""
    if 0 < sys.get_int_max_str_digits() < len(s.lstrip("-")):  # 0: no limit set
        raise ValueError(f"number {s[:20]}… of {len(s)} digits is out of range")
    return int(s)


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number (records are strict JSON)")


def parse_record(data: bytes) -> object:
    """Strict JSON in UTF-8: no NaN/Infinity, no number out of float range, no lone surrogate."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RecordError(f"not UTF-8 text (byte {e.start}: {e.reason})") from None
    try:
        doc = json.loads(text, parse_float=_strict_float, parse_int=_strict_int, parse_constant=_no_constant)
    except RecursionError:
        raise RecordError("nested too deeply to parse") from None
    except ValueError as e:  # JSONDecodeError, the strictness above
        raise RecordError(f"not valid JSON ({e})") from None
    if _SURROGATE_ESCAPE.search(text):  # rare: only then is every string looked at
        check_surrogates(doc)
    return doc


def _name(path: str, key) -> str:
    return f"{path}.{key}" if path else str(key)


def check_nesting(doc: object) -> None:
    """What the schema's types do not see, over the whole document: nesting depth (readers recurse), list
    lengths and the number of objects and lists (readers walk them one by one), and dots in the key names
    of the sections flatten() turns into dotted column names. Names are built only for the error (a record
    may hold a million containers)."""
    # (container, depth, in a flattened section, (parent entry, key)); a bare scalar has nothing nested
    stack = [(doc, 0, False, None)] if isinstance(doc, (dict, list)) else []
    seen = 0
    while stack:
        entry = stack.pop()
        seen += 1
        if seen > MAX_CONTAINERS:
            raise RecordError(f"more than {MAX_CONTAINERS:,} objects and lists, more than a record holds")
        v, depth, flat, _ = entry
        if depth > MAX_DEPTH:
            raise RecordError(f"{_where(entry)}: nested deeper than {MAX_DEPTH} levels")
        if isinstance(v, list) and len(v) > MAX_LIST_ITEMS:
            raise RecordError(f"{_where(entry) or 'the document'}: a list of {len(v):,} items, more than a record "
                              f"holds ({MAX_LIST_ITEMS:,})")
        items = v.items() if isinstance(v, dict) else enumerate(v)
        for k, x in items:
            if flat and isinstance(k, str) and "." in k:
                raise RecordError(f"{_where((x, 0, flat, (entry, k)))}: a '.' in a key is reserved for nested names")
            if isinstance(x, (dict, list)):
                stack.append((x, depth + 1, flat or (depth == 0 and k in FLATTENED), (entry, k)))


def _where(entry) -> str:
    """The dotted name of a check_nesting entry: metrics.memory.per_rank[0]."""
    parts = []
    while entry[3] is not None:
        entry, key = entry[3]
        parts.append(f"[{key}]" if isinstance(key, int) else f".{key}")
    return "".join(reversed(parts)).lstrip(".")


def check_surrogates(doc: object) -> None:
    """A lone surrogate (a \\ud800 escape) in any string or key: no file, page or terminal can encode it."""
    stack = [(doc, "")]
    while stack:
        v, where = stack.pop()
        if isinstance(v, str):
            _check_text(v, where)
        elif isinstance(v, dict):
            for k, x in v.items():
                _check_text(k, where or "record keys")
                stack.append((x, _name(where, k)))
        elif isinstance(v, list):
            stack += [(x, f"{where}[{i}]") for i, x in enumerate(v)]


def _check_text(s: str, where: str) -> None:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        raise RecordError(f"{where}: a lone surrogate (\\u{ord(s[e.start]):04x}) is not text") from None


def read_record(path: Path) -> dict:
    """One record file, checked and upgraded to the current schema version; RecordError says why not."""
    doc = parse_record(_read_bytes(path))
    check_nesting(doc)
    validate(doc)
    if doc["schema_version"] < SCHEMA_VERSION:
        doc = migrate(doc)
        validate(doc)
    return doc


def load_records(path: str | Path) -> list[dict]:
    """Every readable record under path (a folder, searched recursively, or one file).
    Anything else — not a regular file, a symlink out of the folder, too large, not UTF-8 JSON,
    a field of the wrong type, a newer schema — is skipped with one warning naming it and why."""
    path = Path(path)
    entries = record_files(path) if path.is_dir() else [(path, None)]
    records = []
    seen: dict[str, list[tuple[dict, Path]]] = {}  # record id -> (record, file) read so far
    for p, problem in entries:
        try:
            if problem:
                raise RecordError(problem)
            rec = with_flags(read_record(p))  # records written before the sanity guard are flagged on load
            same_id = seen.setdefault(record_id(rec["run_key"], repeat_of(rec)), [])
            check_not_a_copy(rec, same_id)
        except RecordError as e:
            warnings.warn(f"skipping {p}: {e}", stacklevel=2)
            continue
        same_id.append((rec, p))
        rec["_path"] = str(p)
        records.append(rec)
    return records


def check_not_a_copy(rec: dict, same_id: list[tuple[dict, Path]]) -> None:
    """A record identical to one already read (a copy or a link to it, e.g. a backup in a subfolder) is
    one measurement: read twice it would count as two repeats in every median. Two measurements of
    one run differ (their start time, their steps) even when they share a run key and repeat index."""
    for other, where in same_id:
        if {k: v for k, v in other.items() if k != "_path"} == rec:
            raise RecordError(f"the same record as {where} (run key {rec['run_key']}, repeat {repeat_of(rec)}), "
                              f"one measurement, read once; remove one of the two files")


def ok_record_ids(path: str | Path) -> set[str]:
    """The record ids (record_id: run key and repeat) recorded ok, for resume. Files this run did not
    write are skipped quietly: they never stop a suite (the readers name them)."""
    if not Path(path).exists():
        return set()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {record_id(r["run_key"], repeat_of(r)) for r in load_records(path) if r["status"] == "ok"}


def _dotted(d: dict, prefix: str = ""):
    """(dotted key, value) for every leaf of nested dicts."""
    for k, v in d.items():
        if isinstance(v, dict) and v:
            yield from _dotted(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v


def flatten(rec: dict) -> dict:
    """One DataFrame row: identity and the headline figures under short names, and every
    scalar of metrics/energy/carbon under dotted names (metrics.flops.model_per_token, ...)."""
    cfg, m, err = rec["config"], rec.get("metrics") or {}, rec.get("error") or {}
    row = {
        "run_key": rec["run_key"], "suite": rec["suite"], "workload": rec["workload"], "status": rec["status"],
        "repeat": repeat_of(rec),  # repeats of a run share its run key (results/report.combine_repeats)
        "kind": cfg.get("kind"), "router": dig(cfg, "moe", "router"), "description": cfg.get("description", ""),
        "world_size": cfg["world_size"], "nodes": cfg["nodes"], "scaling": cfg["scaling"],
        "sweep_id": cfg.get("sweep_id"), "tensor": dig(cfg, "parallel", "tensor"),
        "zero": dig(cfg, "parallel", "zero"), "expert": dig(cfg, "parallel", "expert"),
        "started_at": rec["started_at"], "duration_s": rec["duration_s"],
        "error_type": err.get("type"), "error_message": err.get("message"), "error_rank": err.get("rank"),
        "tokens_per_s": m.get("tokens_per_s"), "mfu": m.get("mfu"),
        "step_time_median_s": dig(m, "step_time_s", "median"),
        "step_time_ci95_lo_s": (dig(m, "step_time_s", "ci95") or [None, None])[0],
        "step_time_ci95_hi_s": (dig(m, "step_time_s", "ci95") or [None, None])[1],
        "path": rec.get("_path"),
        # sanity guard (results/sanity.py): physically impossible figures, shown beside the status
        "flagged": bool(rec.get("flags")), "flags": list(rec.get("flags") or []),
        "flag_summary": flag_summary(rec.get("flags") or []) or None,
        **scaling_identity(rec),  # what a scaling baseline must share with this run (metrics/scaling.py)
    }
    quality = m.get("quality")
    if isinstance(quality, dict):  # to-target figures (metrics/quality.py) under short names
        for key in ("target_loss", "reached", "step", "tokens", "seconds", "model_flops", "energy_j", "co2e_g",
                    "reason", "best_val_loss", "final_val_loss", "eval_seconds", "eval_energy_j"):
            row[f"quality.{key}"] = quality.get(key)
    for section in ("metrics", "energy", "carbon"):
        for k, v in _dotted(rec.get(section) or {}):
            if v is None or isinstance(v, (int, float, str, bool)):
                row[f"{section}.{k}"] = v
    return row


# Figures the DataFrame does arithmetic on (scaling efficiency, report cells): float columns, NaN
# where a record has null, even when every record has null (object columns of None would not divide).
FIGURES = ("duration_s", "tokens_per_s", "mfu", "step_time_median_s", "step_time_ci95_lo_s", "step_time_ci95_hi_s")


def rows_dataframe(rows: list[dict]) -> pd.DataFrame:
    """flatten() rows as one DataFrame in reading order, with scaling efficiency per sweep."""
    import pandas as pd

    df = pd.DataFrame(rows)
    if df.empty:
        return df
    df = df.astype({c: float for c in FIGURES})
    return add_scaling_efficiency(df.sort_values(["suite", "workload", "world_size", "started_at"],
                                                 ignore_index=True))


def records_dataframe(path: str | Path) -> pd.DataFrame:
    """All records under path as one DataFrame, with scaling efficiency per sweep."""
    return dataframe_of(load_records(path))


def dataframe_of(records: list[dict]) -> pd.DataFrame:
    """Records already loaded (load_records) as one DataFrame, with scaling efficiency per sweep.
    Rows are sorted (rows_dataframe); column `rec` is each row's index in `records`."""
    return rows_dataframe([{**flatten(r), "rec": i} for i, r in enumerate(records)])
