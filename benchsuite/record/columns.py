"""The record's scalar fields as DataFrame columns, derived from the types: every field the types
declare that holds one value (not a list or a map), by its dotted path, with the pandas dtype its
type gives. The results DataFrame (results/store.flatten) has a column for each; `load()` takes its
columns' dtypes from here (results/api.py), so a figure added to the types is a column everywhere.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import msgspec.inspect as mi

from benchsuite.record.types import Record


@dataclass(frozen=True)
class FieldColumn:
    path: str  # dotted: metrics.step_time_s.median
    dtype: str  # a pandas dtype name
    categories: tuple[str, ...] = ()  # for "category": the values the types allow


def _scalar(t: mi.Type) -> mi.Type | None:
    """The one scalar type a field holds (unwrapping Optional and constraints), or None for a container."""
    if isinstance(t, mi.UnionType):
        kinds = [x for x in t.types if not isinstance(x, mi.NoneType)]
        return _scalar(kinds[0]) if len(kinds) == 1 else None
    if isinstance(t, mi.Metadata):
        return _scalar(t.type)
    return t if isinstance(t, (mi.FloatType, mi.IntType, mi.StrType, mi.BoolType, mi.EnumType, mi.LiteralType,
                               mi.DateTimeType)) else None


def _struct(t: mi.Type) -> mi.StructType | None:
    if isinstance(t, mi.UnionType):
        structs = [x for x in t.types if isinstance(x, mi.StructType)]
        return structs[0] if len(structs) == 1 else None
    return t if isinstance(t, mi.StructType) else None


def _dtype(t: mi.Type) -> tuple[str, tuple[str, ...]]:
    if isinstance(t, mi.FloatType):
        return "float64", ()
    if isinstance(t, mi.IntType):
        return "Int64", ()
    if isinstance(t, mi.BoolType):
        return "boolean", ()
    if isinstance(t, mi.DateTimeType):
        return "datetime64[ns, UTC]", ()
    if isinstance(t, mi.EnumType):
        return "category", tuple(str(m.value) for m in t.cls)
    if isinstance(t, mi.LiteralType) and all(isinstance(v, str) for v in t.values):
        return "category", tuple(t.values)
    if isinstance(t, mi.LiteralType):
        return "Int64", ()
    return "string", ()


@functools.cache
def record_type_info() -> mi.StructType:
    """The record's types as msgspec describes them (some 20 ms to make: made once)."""
    return mi.type_info(Record)


@functools.cache
def field_columns() -> dict[str, FieldColumn]:
    """Every scalar field of the record by dotted path, in the types' order."""
    out: dict[str, FieldColumn] = {}
    stack: list[tuple[str, mi.StructType]] = [("", record_type_info())]
    while stack:
        prefix, struct = stack.pop(0)
        for f in struct.fields:
            path = f"{prefix}{f.name}"
            scalar, inner = _scalar(f.type), _struct(f.type)
            if scalar is not None:
                out[path] = FieldColumn(path, *_dtype(scalar))
            elif inner is not None:
                stack.append((f"{path}.", inner))
    return out


def field_column(path: str) -> FieldColumn:
    """The column of one scalar field; KeyError naming the path for one the types do not declare."""
    try:
        return field_columns()[path]
    except KeyError:
        raise KeyError(f"{path}: not a scalar field of the record types (record/types.py)") from None


def _description(t: mi.Type) -> str | None:
    if isinstance(t, mi.UnionType):
        return next((d for d in map(_description, t.types) if d), None)
    if isinstance(t, mi.Metadata):
        return (t.extra_json_schema or {}).get("description") or _description(t.type)
    return None


@functools.cache
def described(path: str) -> str:
    """A field's definition, stated once on its type (the JSON Schema's description): what a view labels the
    figure with, its aggregation included. KeyError naming a path the types do not declare or describe."""
    t: mi.Type = record_type_info()
    for name in path.split("."):
        inner = _struct(t)
        field = next((f for f in inner.fields if f.name == name), None) if inner else None
        if field is None:
            raise KeyError(f"{path}: not a field of the record types (record/types.py)")
        t = field.type
    text = _description(t)
    if not text:
        raise KeyError(f"{path}: the record types give it no description (record/types.py)")
    return text


def view_columns(*columns: str) -> tuple[str, ...]:
    """The columns a view declares, checked when its module is imported: a name under one of the record's
    sections (metrics., energy., config., ...) must be a scalar field of the types, so a renamed or
    mistyped field fails at import, naming it, not as an empty column. Other names are the results
    model's own columns (tokens_per_s, label, scaling_efficiency, ...)."""
    sections = {f.name for f in record_type_info().fields}
    for column in columns:
        if column.partition(".")[0] in sections and "." in column:
            field_column(column)
    return columns
