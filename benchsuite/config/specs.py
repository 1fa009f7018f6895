"""A section built from a file's table, each refused value worded for a person.

A section is a msgspec struct whose field types state what each key accepts (record/sections.py, predict's
system file): msgspec judges a value against its field's type, as it judges a record's, and this module says
why a refused value is wrong (its type, its range, its choices) and, where the type gives one, the fix.
"""

from __future__ import annotations

import math
import types
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import msgspec

from benchsuite.config.problems import Problems, qkey, show
from benchsuite.record.scalars import INT_MAX, INT_MIN


def type_parts(t: Any) -> tuple[list[Any], list[Any]]:
    """The plain options of a field type (int, float, str, bool, None, or a Literal) and its annotations
    (msgspec's Meta constraints, and any other a type carries, e.g. a record field's Bound)."""
    if get_origin(t) is Annotated:
        base, *extras = get_args(t)
        options, inner = type_parts(base)
        return options, inner + list(extras)
    if get_origin(t) in (Union, types.UnionType):
        options, extras = [], []
        for arg in get_args(t):
            o, e = type_parts(arg)
            options += o
            extras += e
        return options, extras
    return [t], []


def _metas(t: Any) -> tuple[list[Any], list[msgspec.Meta]]:
    options, extras = type_parts(t)
    return options, [e for e in extras if isinstance(e, msgspec.Meta)]


def doc_of(field: msgspec.structs.FieldInfo) -> str:
    """A field's doc: the description its type carries ("" where none)."""
    return " ".join(m.description for m in _metas(field.type)[1] if m.description)


def _type_name(opt: Any) -> str:
    return type(get_args(opt)[0]).__name__ if get_origin(opt) is Literal else getattr(opt, "__name__", str(opt))


def _type_problem(options: list[Any], v: Any) -> str | None:
    """None when v is of one of the options' types (a Literal's values are judged by _value_problem)."""
    for opt in options:
        if get_origin(opt) is Literal:
            opt = type(get_args(opt)[0])
        if opt is type(None) and v is None:
            return None
        if opt is bool and isinstance(v, bool):
            return None
        if opt is int and isinstance(v, int) and not isinstance(v, bool):
            return None if INT_MIN <= v <= INT_MAX else "out of range: TOML integers are 64-bit"
        if opt is float and isinstance(v, (int, float)) and not isinstance(v, bool):
            if isinstance(v, int) and not INT_MIN <= v <= INT_MAX:
                return "out of range: TOML integers are 64-bit"
            if isinstance(v, float) and not math.isfinite(v):
                return "must be a finite number"
            return None
        if opt is str and isinstance(v, str):
            return None
    names = dict.fromkeys(_type_name(opt) for opt in options if opt is not type(None))
    return f"expected {' or '.join(names)}, got {type(v).__name__} {show(v)}"


def _value_problem(options: list[Any], metas: list[msgspec.Meta], v: Any) -> str:
    """Why a value of the right type is refused: the choices it is not among, or the bound it crosses."""
    for opt in options:
        if get_origin(opt) is Literal:
            return f"must be one of {', '.join(map(repr, get_args(opt)))}"
    fix = next((m.extra["fix"] for m in metas if m.extra and "fix" in m.extra), None)
    for m in metas:
        for bound, op, holds in (("gt", ">", lambda b: v > b), ("ge", ">=", lambda b: v >= b),
                                 ("lt", "<", lambda b: v < b), ("le", "<=", lambda b: v <= b)):
            b = getattr(m, bound)
            if b is not None and not holds(b):
                return f"must be {op} {b}" + (f": {fix}" if fix else "")
    return "not a valid value"


def value_problem(field: msgspec.structs.FieldInfo, v: Any) -> str | None:
    """Why `v` is not a valid value of `field` (None when it is), judged by msgspec against the field's type."""
    return type_problem(field.type, v)


def type_problem(value_type: Any, v: Any) -> str | None:
    """Why `v` is not a valid value of `value_type` (a field's type, e.g. PositiveInt | None), None when it is:
    the one judgement of a suite's keys, a system file's and measure()'s arguments."""
    options, metas = _metas(value_type)
    err = _type_problem(options, v)
    if err is not None:
        return err
    try:
        msgspec.convert(v, value_type)
    except msgspec.ValidationError:
        return _value_problem(options, metas, v)
    return None


def build_section(cls: type, raw: Any, where: str, problems: list[tuple[str, str]]) -> tuple[Any, set[str]]:
    """The section `cls` built from the valid values of `raw` (defaults for the rest), and the keys whose
    value was refused (each problem appended to `problems` under `where`): the checks that read a refused
    key are skipped, so no problem is reported about a default the user never chose."""
    known = {f.name: f for f in msgspec.structs.fields(cls)}
    if not isinstance(raw, dict):
        problems.append((where, f"expected a table, got {type(raw).__name__}"))
        return cls(), set(known)
    values, refused = {}, set()
    for key, v in raw.items():
        if key not in known:
            problems.append((f"{where}.{qkey(key)}", f"unknown key; valid keys: {', '.join(known)}"))
            continue
        err = value_problem(known[key], v)
        if err:
            problems.append((f"{where}.{key}", err))
            refused.add(key)
        else:
            values[key] = msgspec.convert(v, known[key].type)  # an int given for a float key becomes a float
    return cls(**values), refused


def read_section(cls: type, raw: Any, sec: str, problems: Problems) -> Any:
    """build_section for one part of the file: its problems under the part's path, its refused keys
    remembered as "sec.key"."""
    section, bad = build_section(cls, raw, problems.path(sec), problems.found)
    problems.refused |= {f"{sec}.{key}" for key in bad}
    return section
