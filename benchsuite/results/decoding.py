"""Record files into the types, and a folder's new files into rows a batch at a time, here or beside this process.

One file: read, upgraded to the current schema, decoded and flagged by the sanity guard (read_document). A first
read of a large folder decodes every file and makes its rows (rows.rows_table), about 0.35 ms a file on one core
of the 2-core box: past POOL_MIN files, its batches go round robin to this process and to worker processes, one
per further core. A worker is a fresh interpreter (WORKER) that imports this module from where the reader did:
nothing of the caller's is forked (its threads) or imported again (a script's unguarded top level, which a
spawned multiprocessing worker would run). It reads its batches' paths (stdin), then writes each batch back, in
order, as its files' problems, its rows and its records' blobs as Arrow IPC. A worker that cannot start or stops leaves its batches
to this process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING

import msgspec

from benchsuite.record.codec import RecordError, decode, decode_current, parse, to_dict
from benchsuite.record.io import read_bytes
from benchsuite.record.sanity import with_flags
from benchsuite.record.types import Flag, Record
from benchsuite.results.migrate import migrate
from benchsuite.results.rows import RECORD, rows_table, table_schema

if TYPE_CHECKING:
    import pyarrow as pa

BATCH = 1000  # files decoded before their rows are made: a first read of 100,000 files holds this many at once
POOL_MIN = 2 * BATCH  # files to decode, from which workers help (one starts in ~0.3 s: a batch's time)
MAX_DECODERS = 8  # this process and its workers: past it the reader's own work is the longer part

# A worker's program: this module, imported from where the reader imported it (its sys.path, not the folder it
# starts in), serving its batches.
WORKER = ("import json, sys; sys.path[:] = json.loads(sys.argv[1]); "
          "from benchsuite.results.decoding import serve; serve()")
Batch = tuple[list[str | None], "pa.Table"]  # each file's problem (None: decoded), the decoded ones' rows in order


def typed(doc: dict) -> Record:
    """A record document (a file's, or one built in memory) as the types: upgraded to the current schema
    version, decoded (RecordError names the field that does not fit), then flagged by the sanity guard, which
    judges only what the types accepted (records written before the guard, or by an older one, are flagged
    on load too)."""
    return typed_document(doc)[0]


def typed_document(doc: dict) -> tuple[Record, dict]:
    """typed(doc), and the record as plain JSON values (msgspec.to_builtins of it: the sanity guard made it
    to judge the record, and a folder's rows are made from it: rows.rows_table)."""
    return flagged(decode(migrate(doc)))


def flagged(rec: Record) -> tuple[Record, dict]:
    """The typed record flagged by the sanity guard, and as plain JSON values (typed_document)."""
    plain = with_flags(to_dict(rec))
    rec = msgspec.structs.replace(rec, flags=msgspec.convert(plain["flags"], list[Flag]))
    plain["flags"] = msgspec.to_builtins(rec.flags)  # as the types hold them
    return rec, plain


def read_record(path: Path) -> Record:
    """One record file as the types (typed); RecordError says why not."""
    return read_document(path)[0]


def read_document(path: Path) -> tuple[Record, dict]:
    """One record file as the types and as plain JSON values (typed_document); RecordError says why not."""
    data = read_bytes(path)
    rec = decode_current(data)
    return flagged(rec) if rec is not None else typed_document(parse(data))


def decoded_batch(paths: list[Path]) -> Batch:
    """The files decoded, and the rows of those that are records (the typed records let go: the rows hold
    them, decoded again when asked for)."""
    problems, records, plain = [], [], []
    for p in paths:
        try:
            rec, doc = read_document(p)
        except RecordError as e:
            problems.append(str(e))
            continue
        problems.append(None)
        records.append(rec)
        plain.append(doc)
    return problems, rows_table(records, plain)


def decoded_batches(paths: list[Path]) -> Iterator[Batch]:
    """paths decoded BATCH at a time, in order; past POOL_MIN of them, with workers beside this process (each
    a batch ahead of the reader at most: its pipe holds the rest back)."""
    batches = [paths[i:i + BATCH] for i in range(0, len(paths), BATCH)]
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    decoders = min(cores, MAX_DECODERS, len(batches)) if len(paths) >= POOL_MIN else 1
    workers = [_Worker.start(batches[k::decoders]) for k in range(1, decoders)]
    try:
        for i, batch in enumerate(batches):
            worker = workers[i % decoders - 1] if i % decoders else None
            done = worker.next_batch() if worker is not None else None
            yield done if done is not None else decoded_batch(batch)
    finally:
        for worker in workers:
            worker.stop()


class _Worker:
    """A decoding process and the pipes to it; None from next_batch once it has failed (its batches then
    decoded by the reader)."""

    def __init__(self, process: subprocess.Popen | None):
        self.process = process

    @classmethod
    def start(cls, batches: list[list[Path]]) -> _Worker:
        try:
            with tempfile.TemporaryFile() as paths:  # (a file, not a pipe: nothing waits for the worker to start)
                paths.write(msgspec.json.encode([[str(p) for p in batch] for batch in batches]))
                paths.seek(0)
                return cls(subprocess.Popen([sys.executable, "-c", WORKER, msgspec.json.encode(sys.path).decode()],
                                            stdin=paths, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL))
        except (OSError, ValueError):
            return cls(None)

    def next_batch(self) -> Batch | None:
        import pyarrow as pa

        if self.process is None:
            return None
        try:
            problems = msgspec.json.decode(_frame(self.process.stdout), type=list[str | None])
            rest, records = (pa.ipc.open_stream(_frame(self.process.stdout)).read_all() for _ in range(2))
            return problems, rest.add_column(table_schema().get_field_index(RECORD), RECORD, records.column(RECORD))
        except (OSError, EOFError, msgspec.DecodeError, pa.ArrowException):
            self.stop()
            return None

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process.stdout.close()
            self.process = None


def _frame(stream: IO[bytes]) -> bytes:
    """One length-prefixed frame (8 bytes, little-endian) of a worker's output."""
    head = stream.read(8)
    size = int.from_bytes(head, "little") if len(head) == 8 else -1
    body = stream.read(size) if size >= 0 else b""
    if size < 0 or len(body) != size:
        raise EOFError("a decoding worker stopped part-way")
    return body


def _write_frame(stream: IO[bytes], body: bytes | memoryview) -> None:
    stream.write(len(body).to_bytes(8, "little"))
    stream.write(body)


def serve() -> None:
    """A worker: its batches' paths from stdin, each batch's problems and rows to stdout, in order."""
    import gc

    import pyarrow as pa

    gc.disable()  # (no reference cycle among a record's values: the collector would rescan them for nothing)
    out = sys.stdout.buffer
    for batch in msgspec.json.decode(sys.stdin.buffer.read(), type=list[list[str]]):
        problems, table = decoded_batch([Path(p) for p in batch])
        _write_frame(out, msgspec.json.encode(problems))
        # the records' blobs apart from the rest: each part is one buffer where it is read, and the blobs, let go
        # once the index file has them, are then freed (not held by the rows beside them)
        for part in (table.drop_columns([RECORD]), table.select([RECORD])):
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, part.schema) as writer:
                writer.write_table(part)
            _write_frame(out, sink.getvalue())
        out.flush()
