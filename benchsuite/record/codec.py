"""Records to and from JSON: strict parsing of untrusted bytes, decoding into the types, encoding
the typed record (record.Record) the assembler builds.

Reading is in three steps, so that an older record is upgraded before anything judges it:
parse (strict JSON, bounded size and nesting) -> results.migrate (raw dict, each update_to_N) ->
decode (the types: every field's type, range and name, closed). Every failure is a RecordError
whose message names the field.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
import sys
from typing import Any

import msgspec

from benchsuite.record.types import SCHEMA_VERSION, Record

MAX_DEPTH = 32                 # a record nests about 6 deep; far deeper is damage (and recursion for readers)
MAX_LIST_ITEMS = 1_000_000     # its longest list is `steps` (under 1M real steps fit in a record file); a list
                               # of 10M empty objects fits in 30 MB and would keep every reader busy for minutes
MAX_CONTAINERS = 2 * MAX_LIST_ITEMS  # objects and lists in all: the steps' and everything else's
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")  # how a lone surrogate gets into UTF-8 JSON text
_AT = re.compile(r"^(.*?) - at `\$\.?(.*)`$", re.S)


class RecordError(ValueError):
    """A document that is not a loadable record; the message names the field and the reason."""


class NewerRecordError(RecordError):
    """A record of a schema version this benchsuite does not know: never read as if it did, never replaced."""

    def __init__(self, version: int, path: object = None):
        self.version, self.path = version, path
        if path is None:
            super().__init__(f"schema_version {version} is newer than this benchsuite reads ({SCHEMA_VERSION}); "
                             "upgrade benchsuite")
        else:
            super().__init__(f"{path}: a record of schema_version {version}, written by a newer benchsuite (this one "
                             f"reads and writes {SCHEMA_VERSION}); it is never overwritten or resumed over: upgrade "
                             "benchsuite, or give another --out")


def utc_now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def json_type(v: Any) -> str:
    """A value's type as a record's reader sees it (JSON names: null, bool, int, float, str, list, object)."""
    if v is None:
        return "null"
    if isinstance(v, dict):
        return "object"
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return type(v).__name__


def check_version(doc: Any) -> int:
    """The document's schema_version, when this benchsuite can read (or upgrade) it."""
    if not isinstance(doc, dict):
        raise RecordError(f"not a JSON object (got {json_type(doc)})")
    version = doc.get("schema_version")
    if type(version) is not int or not 1 <= version < 2**31:
        raise RecordError(f"schema_version: expected a positive integer, got {shown(version)}")
    if version > SCHEMA_VERSION:
        raise NewerRecordError(version)
    return version


# ----------------------------------------------------------------------------- parse

def _strict_float(s: str) -> float:
    v = float(s)
    if not math.isfinite(v):
        raise ValueError(f"number {s[:40]} is out of range")
    return v


def _strict_int(s: str) -> int:
    """An integer literal; one past Python's conversion limit is out of range, named as such (Python's
    own message would suggest sys.set_int_max_str_digits). Shorter ones beyond range: the types'."""
    if 0 < sys.get_int_max_str_digits() < len(s.lstrip("-")):  # 0: no limit set
        raise ValueError(f"number {s[:20]}… of {len(s)} digits is out of range")
    return int(s)


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number (records are strict JSON)")


def parse(data: bytes) -> object:
    """Strict JSON in UTF-8: no NaN/Infinity, no number out of float range, no lone surrogate, and
    nesting and sizes a record can have (check_nesting).

    msgspec parses first (about 10× the standard library): it refuses what strict JSON refuses (NaN, numbers
    out of range, invalid UTF-8, lone surrogates), and a document it refuses goes through the standard
    library's parse, whose error names the problem. A current-version document under 2 MB needs no walk of
    its containers: no list in it can reach MAX_LIST_ITEMS, nor its containers MAX_CONTAINERS, and the
    closed types refuse any deep nesting before a reader sees it (older ones go through the migrations'
    steps first, so they are walked)."""
    try:
        doc = msgspec.json.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return _parse_slowly(data)
    if not (len(data) < 2 * MAX_LIST_ITEMS and isinstance(doc, dict) and doc.get("schema_version") == SCHEMA_VERSION
            and type(doc.get("schema_version")) is int):
        check_nesting(doc)
    return doc


def decode_current(data: bytes) -> Record | None:
    """A current-version record file's bytes straight into the types: one pass where parse, the migrations
    (none for the current version) and decode make three (about half the time of a read). None for anything
    else, which the three steps read, and refuse with their messages: an older or newer version, a document
    the types or strict JSON refuse, one of 2 MB or more (parse walks its containers)."""
    if len(data) >= 2 * MAX_LIST_ITEMS:
        return None
    try:
        return _CURRENT.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return None


_CURRENT = msgspec.json.Decoder(Record)  # (its schema_version is the current one alone: record/types.py)


def _parse_slowly(data: bytes) -> object:
    """The standard library's strict parse, for a document msgspec refused: its errors name the problem."""
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
    check_nesting(doc)
    return doc


def check_nesting(doc: object) -> None:
    """What the types do not see, over the whole document, before a migration walks it: nesting depth,
    list lengths and the number of objects and lists. Names are built only for the error (a record
    may hold a million containers)."""
    stack = [(doc, 0, None)] if isinstance(doc, (dict, list)) else []  # (container, depth, (parent, key))
    seen = 0
    while stack:
        entry = stack.pop()
        seen += 1
        if seen > MAX_CONTAINERS:
            raise RecordError(f"more than {MAX_CONTAINERS:,} objects and lists, more than a record holds")
        v, depth, _ = entry
        if depth > MAX_DEPTH:
            raise RecordError(f"{_where(entry)}: nested deeper than {MAX_DEPTH} levels")
        if isinstance(v, list) and len(v) > MAX_LIST_ITEMS:
            raise RecordError(f"{_where(entry) or 'the document'}: a list of {len(v):,} items, more than a record "
                              f"holds ({MAX_LIST_ITEMS:,})")
        items = v.items() if isinstance(v, dict) else enumerate(v)
        stack.extend((x, depth + 1, (entry, k)) for k, x in items if isinstance(x, (dict, list)))


def _where(entry) -> str:
    """The dotted name of a check_nesting entry: metrics.memory.per_rank[0]."""
    parts = []
    while entry[2] is not None:
        entry, key = entry[2]
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
                stack.append((x, f"{where}.{k}" if where else str(k)))
        elif isinstance(v, list):
            stack += [(x, f"{where}[{i}]") for i, x in enumerate(v)]


def _check_text(s: str, where: str) -> None:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        raise RecordError(f"{where}: a lone surrogate (\\u{ord(s[e.start]):04x}) is not text") from None


# ----------------------------------------------------------------------------- decode / encode

def _record_error(e: msgspec.ValidationError, doc: object) -> RecordError:
    """msgspec's "Expected `int` >= 1 - at `$.config.world_size`" as "config.world_size: expected `int` >= 1,
    got int 0": the field first, and the value where msgspec names only its type or nothing."""
    text = str(e)
    m = _AT.match(text)
    what, where = (m.group(1), m.group(2)) if m else (text, "")
    what = what[:1].lower() + what[1:]
    if ", got" not in what and "'" not in what:  # (an enum's message quotes the value)
        what += f", got {shown(_value_at(doc, where))}"
    return RecordError(f"{where or 'record'}: {what}")


def shown(v: Any) -> str:
    """A value's type, and a number's value too: "int -1", "float 3.0", "int 1000000… (401 digits)"."""
    if isinstance(v, list):
        return f"a list of {len(v)}"
    if type(v) not in (int, float) or (isinstance(v, float) and not math.isfinite(v)):
        return json_type(v)
    digits = repr(v)
    return f"{json_type(v)} {digits[:20]}… ({len(digits)} digits)" if len(digits) > 24 else f"{json_type(v)} {digits}"


def _value_at(doc: object, where: str) -> Any:
    """The value at msgspec's path (config.world_size, steps[3].time_s) in the document."""
    for key, index in re.findall(r"(?:^|\.)([^.\[]+)|\[(\d+)\]", where):
        try:
            doc = doc[int(index)] if index else doc[key]
        except (KeyError, IndexError, TypeError):
            return None
    return doc


def decode(doc: object) -> Record:
    """A migrated document as the typed record; RecordError names the first field that does not fit."""
    check_version(doc)
    try:
        return msgspec.convert(doc, Record, strict=True)
    except msgspec.ValidationError as e:
        raise _record_error(e, doc) from None


def to_dict(rec: Record) -> dict:
    """The typed record as plain JSON values, every declared field present (null where not measured)."""
    return msgspec.to_builtins(rec)


def validate(doc: object) -> None:
    """Raises RecordError naming the first field of a current-version document that the types refuse."""
    decode(doc)


def as_record(rec: Record | dict) -> Record:
    """A record as the types state it. A dict (what the assembler builds, the launcher's failed record, a
    record read back and flagged) is checked by them: a key they do not declare, or a value of the wrong
    type, is a RecordError naming the field (a bug: tests catch it)."""
    if isinstance(rec, Record):
        return rec
    try:  # as JSON sees it first: tuples are lists, str subclasses (torch's version) plain text
        plain = json.loads(json.dumps(rec, allow_nan=False))
    except (TypeError, ValueError) as e:
        raise RecordError(f"not JSON: {e}") from None
    return decode(plain)


def encode(rec: Record | dict) -> bytes:
    """The record's file: strict JSON of every declared field, keys sorted, indented by one, text as UTF-8."""
    return file_bytes(to_dict(as_record(rec)))


def file_bytes(doc: dict) -> bytes:
    """A typed record's JSON values (to_dict) as its file's bytes."""
    return json.dumps(doc, indent=1, sort_keys=True, allow_nan=False, ensure_ascii=False).encode("utf-8")


def failed_record(run_key: str, config: dict, env: dict, error: dict, started_at: str, duration_s: float,
                  repeat: int = 0) -> dict:
    """A run that did not finish: every figure null, the error says what, where (rank) and why."""
    return {"schema_version": SCHEMA_VERSION, "run_key": run_key, "repeat": repeat, "suite": config["suite"],
            "workload": config["workload"], "status": "failed", "error": error, "started_at": started_at,
            "duration_s": duration_s, "config": config, "env": env, "metrics": None, "energy": None,
            "carbon": None, "steps": []}
