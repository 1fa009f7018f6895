"""A record's row, built for many records at once as Arrow columns typed by the record's types.

The row is what the results model reads of a record: the short names the views use (suite, world_size,
tokens_per_s, ...), its run identity and seed (results/identity.py), its flags, what a scaling baseline
must share (results/scaling.py), the to-target figures under `quality.*`, and every scalar field of the
types by its dotted path (record/columns.py). Beside the row: the record's measured steps (a list per
record), the record itself (msgpack), for the readers that need the typed record, and its summary (msgpack of
the parts of it that summary views read beyond the columns: Summary), a small part of the record.

The folder's index (results/index.py) keeps these columns as they are, so a warm read builds the results
model's frame from them without decoding a record; a record read from its file gets its columns here,
the same way, so a read through the index and one without it give equal frames.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

import msgspec

from benchsuite.record.columns import field_columns
from benchsuite.record.sanity import flag_summary
from benchsuite.record.types import MoEMetrics, Quality, Record, Step
from benchsuite.results.identity import hardware_label, routing_identity, run_identity, seed_of
from benchsuite.results.scaling import scaling_identity

if TYPE_CHECKING:  # pyarrow loads with the readers; a rank writing its record never needs it
    import pyarrow as pa

# The row's short names, each the field whose value and type it has (record/columns.py), in the row's order.
SHORT = {"run_key": "run_key", "suite": "suite", "workload": "workload", "status": "status", "repeat": "repeat",
         "kind": "config.kind", "router": "config.moe.router", "description": "config.description",
         "world_size": "config.world_size", "nodes": "config.nodes", "scaling": "config.scaling",
         "sweep_id": "config.sweep_id", "tensor": "config.parallel.tensor", "zero": "config.parallel.zero",
         "expert": "config.parallel.expert", "started_at": "started_at", "duration_s": "duration_s",
         "error_type": "error.type", "error_message": "error.message", "error_rank": "error.rank",
         "tokens_per_s": "metrics.tokens_per_s", "mfu": "metrics.mfu",
         "step_time_median_s": "metrics.step_time_s.median"}
# The to-target figures (metrics/quality.py) under short names: quality.<key> is metrics.quality.<key>.
QUALITY = ("target_loss", "reached", "step", "tokens", "seconds", "model_flops", "energy_j", "co2e_g", "reason",
           "best_val_loss", "final_val_loss", "eval_seconds", "eval_energy_j")
RECORD, STEPS, SUMMARY = "record", "steps", "summary"  # the record (msgpack of its builtins), its steps and its
# summary (Summary), beside the row

_ARROW = {"float64": "float64", "Int64": "int64", "boolean": "bool_", "category": "string", "string": "string",
          "datetime64[ns, UTC]": "string"}  # pandas dtype of a field -> Arrow type (times stay RFC 3339 text)
_ENCODER = msgspec.msgpack.Encoder()


def _arrow(dtype: str) -> pa.DataType:
    import pyarrow as pa

    return getattr(pa, _ARROW[dtype])()


def _computed() -> dict[str, str]:
    """The row's columns computed from the whole record, with their pandas dtype."""
    return {"step_time_ci95_lo_s": "float64", "step_time_ci95_hi_s": "float64", "flagged": "boolean",
            "flags": "string",  # JSON text of the record's flags (a list of {field, value, reason})
            "flag_summary": "string", "scaling.config": "string", "scaling.hardware": "string",
            "scaling.threads_per_rank": field_columns()["env.threads_per_rank"].dtype, "identity": "string",
            "routing_identity": "string", "seed": field_columns()["config.train.seed"].dtype,
            "hardware_label": "string"}  # '2× NVIDIA H100 80GB HBM3, 2 threads per rank' (identity.hardware_label)


@functools.cache
def row_schema() -> pa.Schema:
    """The row's columns and their Arrow types: the short names, the computed columns, quality.*, then every
    scalar field of the types not already under a short name."""
    import pyarrow as pa

    fields = field_columns()
    names = {**{name: fields[path].dtype for name, path in SHORT.items()}, **_computed(),
             **{f"quality.{key}": fields[f"metrics.quality.{key}"].dtype for key in QUALITY}}
    names |= {path: f.dtype for path, f in fields.items() if path not in names}
    return pa.schema([(name, _arrow(dtype)) for name, dtype in names.items()])


@functools.cache
def _record_type() -> pa.StructType:
    """The record's scalar fields as nested Arrow structs: a document converts into it in one call (lists and
    maps, which no column holds, are left out)."""
    import pyarrow as pa

    tree: dict = {}
    for path, f in field_columns().items():
        *parents, leaf = path.split(".")
        node = tree
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = _arrow(f.dtype)

    def struct(node: dict) -> pa.StructType:
        return pa.struct([(k, struct(v) if isinstance(v, dict) else v) for k, v in node.items()])

    return struct(tree)


@functools.cache
def steps_type() -> pa.DataType:
    """A record's steps: a list of structs of Step's fields (their Arrow types from the types' own)."""
    import msgspec.inspect as mi
    import pyarrow as pa

    def arrow(t: mi.Type) -> pa.DataType:
        t = next(x for x in t.types if not isinstance(x, mi.NoneType)) if isinstance(t, mi.UnionType) else t
        t = t.type if isinstance(t, mi.Metadata) else t
        return pa.int64() if isinstance(t, mi.IntType) else pa.float64()

    return pa.list_(pa.struct([(f.name, arrow(f.type)) for f in mi.type_info(Step).fields]))


def table_schema() -> pa.Schema:
    """The row, then the steps, the record and its summary."""
    import pyarrow as pa

    return row_schema().append(pa.field(STEPS, steps_type())).append(pa.field(RECORD, pa.binary())).append(
        pa.field(SUMMARY, pa.binary()))


def rows_table(records: list[Record], plain: list[dict] | None = None) -> pa.Table:
    """The records' rows, steps and blobs (table_schema), one row per record, in their order. plain: each
    record as msgspec.to_builtins gives it, when the reader has it already."""
    import pyarrow as pa

    docs = plain if plain is not None else [msgspec.to_builtins(rec) for rec in records]
    flat = _flat(pa.array(docs, type=_record_type()))
    own: dict[str, list] = {name: [] for name in _computed()}
    for rec, doc in zip(records, docs):
        config = doc["config"]  # (its JSON values already made: the identities hash them, not a second copy)
        ci95 = (rec.metrics.step_time_s.ci95 if rec.metrics and rec.metrics.step_time_s else None) or [None, None]
        values = {"step_time_ci95_lo_s": ci95[0], "step_time_ci95_hi_s": ci95[1], "flagged": bool(rec.flags),
                  "flags": msgspec.json.encode(doc["flags"]).decode(),
                  "flag_summary": flag_summary(doc["flags"]) or None, **scaling_identity(rec, config),
                  "identity": run_identity(rec, config), "routing_identity": routing_identity(rec, config),
                  "seed": seed_of(rec), "hardware_label": hardware_label([rec])}
        for name, column in own.items():
            column.append(values[name])
    schema = row_schema()
    columns = {**{name: flat[path] for name, path in SHORT.items()},
               **{name: pa.array(values, schema.field(name).type) for name, values in own.items()},
               **{f"quality.{key}": flat[f"metrics.quality.{key}"] for key in QUALITY}}
    columns["description"] = columns["description"].fill_null("")  # a run without one says nothing, not null
    columns |= {path: array for path, array in flat.items() if path not in columns}
    return pa.table([*(columns[name] for name in schema.names),
                     pa.array([doc["steps"] for doc in docs], steps_type()),
                     pa.array([record_blob(doc) for doc in docs], pa.binary()),
                     pa.array([summary_blob(doc) for doc in docs], pa.binary())], schema=table_schema())


def _flat(array: pa.StructArray, prefix: str = "") -> dict[str, pa.Array]:
    """Each scalar leaf of nested structs by its dotted path (null where a section above it is null)."""
    import pyarrow as pa

    out: dict[str, pa.Array] = {}
    for f, child in zip(array.type, array.flatten()):
        if pa.types.is_struct(f.type):
            out |= _flat(child, f"{prefix}{f.name}.")
        else:
            out[f"{prefix}{f.name}"] = child
    return out


def taken(table: pa.Table, positions: list[int]) -> pa.Table:
    """The rows at positions, in that order: the table as it is when they are all of it in order; its slices
    put end to end when the positions are a few runs of consecutive rows (an index with a few new entries in
    its delta: no row copied); else its chunks made one and taken (a take across many chunks costs far more)."""
    import numpy as np
    import pyarrow as pa

    at = np.asarray(positions, dtype=np.int64)
    if len(at) == 0:
        return table.slice(0, 0)
    if len(at) == len(table) and at[0] == 0 and (np.diff(at) == 1).all():
        return table
    starts = np.flatnonzero(np.diff(at, prepend=at[0] - 2) != 1)
    if len(starts) <= max(1, len(at) // SLICED):
        ends = np.append(starts[1:], len(at))
        return pa.concat_tables([table.slice(int(at[a]), int(b - a)) for a, b in zip(starts, ends)])
    return table.combine_chunks().take(pa.array(at, pa.int64()))


SLICED = 100  # rows per run of consecutive positions, on average, above which they are sliced, not taken


class Rows:
    """Records' rows as one Arrow table (table_schema's columns). `more` reads columns not read yet (an index
    reads the columns each file is judged by first, the rows for a reader of frames, the steps and the records
    only for a reader that asks for them); `damaged` is told, once, of a record that does not decode."""

    def __init__(self, table: pa.Table, more: Callable[[list[str]], pa.Table] | None = None,
                 damaged: Callable[[str], None] | None = None):
        self.table, self._more, self._damaged, self._said = table, more, damaged, False
        self._blobs: dict[str, tuple] = {}  # a blob column's chunks as (ends, [(offsets, data, nulls)])
        self._records_gone = False  # the records' blobs let go (let_go_records)

    def columns(self, names: list[str]) -> pa.Table:
        """These columns, those not read yet read at once."""
        missing = [n for n in names if self.table.schema.get_field_index(n) < 0]
        if missing and self._more is not None:
            more = self._more(missing)
            for n in missing:
                self.table = self.table.append_column(n, more.column(n))
        return self.table.select(names)

    def column(self, name: str) -> pa.ChunkedArray:
        return self.columns([name]).column(name)

    def let_go(self, names: list[str]) -> None:
        """Columns a reader has taken what it needs from, let go where they can be read again (`more`): the
        index's rows of a large folder are hundreds of MB beside the DataFrame made of them."""
        if self._more is not None:
            self.table = self.table.drop_columns([n for n in names if self.table.schema.get_field_index(n) >= 0])

    def let_go_records(self) -> None:
        """The records' blobs let go where the index file holds them and nothing here reads them back (rows
        made by a read, appended to the index being written): a record asked for meanwhile is read from its
        file (store.Loaded.record)."""
        self.table = self.table.drop_columns([RECORD])
        self._blobs.pop(RECORD, None)
        self._records_gone = True

    def record(self, at: int) -> Record | None:
        """The record of row `at`; None when its blob does not decode, or is let go (the reader reads its
        file instead)."""
        if self._records_gone:
            return None
        try:
            return record_of_blob(self.blob(at))
        except (msgspec.DecodeError, msgspec.ValidationError, TypeError) as e:
            if not self._said and self._damaged is not None:
                self._said = True
                self._damaged(f"a record that does not decode ({e})")
            return None

    def summary(self, at: int) -> Summary | None:
        """The summary of row `at` (Summary); None when its blob does not decode (the reader reads the record)."""
        blob = self.blob(at, SUMMARY)
        try:
            return _SUMMARY.decode(blob) if blob is not None else None
        except (msgspec.DecodeError, msgspec.ValidationError):
            return None

    def blob(self, at: int, column: str = RECORD) -> memoryview | None:
        """Row `at`'s record blob (or its summary's), a view of the column's own buffer (no copy: a reader of
        every record of a large folder would otherwise copy each)."""
        if self._records_gone and column == RECORD:
            return None
        if column not in self._blobs:
            import numpy as np

            chunks = [c for c in self.column(column).chunks if len(c)]
            self._blobs[column] = (np.cumsum([len(c) for c in chunks]),
                                   [(np.frombuffer(c.buffers()[1], np.int32, len(c) + 1, c.offset * 4),
                                     memoryview(c.buffers()[2]) if c.buffers()[2] is not None else memoryview(b""),
                                     c.is_null()) for c in chunks])
        ends, chunks = self._blobs[column]
        k = int(ends.searchsorted(at, side="right"))
        offsets, data, null = chunks[k]
        i = at - (int(ends[k - 1]) if k else 0)
        return None if null[i].as_py() else data[offsets[i]:offsets[i + 1]]


def record_blob(plain: dict) -> bytes:
    """A record's blob: msgpack of its plain JSON values (msgspec.to_builtins of the flagged typed record), one
    record one blob, whichever file or index it was read from."""
    return _ENCODER.encode(plain)


class _SummaryMetrics(msgspec.Struct, gc=False):
    quality: Quality | None = None
    moe: MoEMetrics | None = None


class Summary(msgspec.Struct, gc=False):
    """What summary views read of a record beyond its row's columns (its quality curve, its experts' load), under
    the record's own names and types, so that a typed record reads the same: its own blob beside the record's
    (a tenth of its size or less: the summary pages of 10,000 records read it, not every record)."""
    metrics: _SummaryMetrics | None = None


def summary_blob(plain: dict) -> bytes:
    """A record's summary blob: msgpack of the parts of its plain values that Summary reads."""
    metrics = plain.get("metrics")
    return _ENCODER.encode({"metrics": None if metrics is None else
                            {"quality": metrics.get("quality"), "moe": metrics.get("moe")}})


def record_of_blob(blob: bytes | memoryview) -> Record:
    """A record from its msgpack blob (times are RFC 3339 text with their own offset: the record read back is
    the one read from the file)."""
    return _RECORD.decode(blob)


_RECORD = msgspec.msgpack.Decoder(Record)
_SUMMARY = msgspec.msgpack.Decoder(Summary)
