"""The results folder's index (results/index.py): a read through it gives what reading every file gives,
warnings included; only new and changed files are decoded; a damaged, foreign or other code's index is
rebuilt; a folder that cannot be written to still reads; writers appending while readers read never give
a partial view."""

import errno
import json
import os
import shutil
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import msgspec
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import benchsuite
from benchsuite.record import SCHEMA_VERSION, write_record
from benchsuite.results import decoding, index, rows, store
from benchsuite.results.index import INDEX_DIR, index_path
from benchsuite.results.model import results_of
from benchsuite.results.store import load_records, record_files
from helpers import REPO
from helpers.records import make_record


@pytest.fixture(autouse=True)
def every_folder_indexed(monkeypatch):
    """The fixture folders are small: here every folder has its index, whatever its size (store.MIN_FILES)."""
    monkeypatch.setattr(store, "MIN_FILES", 0)


@pytest.fixture(autouse=True)
def trust_fresh_files(monkeypatch):
    """Files written by a test a moment ago: trusted by the index at once (the racy-file rule has its own
    test), so a second read is served from it."""
    monkeypatch.setattr(index, "RACY_NS", -1)


def counting(monkeypatch, module, name: str) -> list:
    """Calls of module.<name> (decoding.read_document: files decoded; rows.record_of_blob: records decoded from the
    index)."""
    calls, real = [], getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a: calls.append(a) or real(*a))
    return calls


READERS = (benchsuite.load, benchsuite.load_runs, benchsuite.load_steps)


def listed(folder) -> list[Path]:
    """The record files under folder (record_files lists them as text)."""
    return [Path(p) for p, _ in record_files(folder)]


def indexed(folder) -> list[str]:
    """The files the folder's index holds an entry of (its index file's and its delta's)."""
    return sorted(index.FolderIndex.read(folder).entries)


def read(folder, frames=False):
    """The records of folder, its results model (and with frames, load(), load_runs() and load_steps()), and
    every warning said, in order."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = load_records(folder)
        api = tuple(reader(folder) for reader in READERS) if frames else ()
    return loaded, results_of(loaded), api, [str(w.message) for w in caught]


def assert_same(a, b):
    (loaded_a, model_a, frames_a, warned_a), (loaded_b, model_b, frames_b, warned_b) = a, b
    assert loaded_a == loaded_b and warned_a == warned_b
    for x, y in [(model_a.df, model_b.df), (model_a.runs, model_b.runs), (model_a.per_seed, model_b.per_seed),
                 *zip(frames_a, frames_b)]:
        pd.testing.assert_frame_equal(x, y)
        assert x.equals(y)


def folder_with_bad_records(tmp_path, fixture: str):
    """A copy of a fixture folder, plus a truncated record, one of a newer schema, a copy of a record (one
    measurement: skipped) and one started at a non-UTC offset (kept as written, not as UTC)."""
    folder = tmp_path / fixture
    shutil.copytree(REPO / "tests/fixtures" / fixture, folder, ignore=shutil.ignore_patterns(INDEX_DIR))
    (folder / "truncated.json").write_text(json.dumps(make_record("t"))[:50])
    (folder / "future.json").write_text(json.dumps({**make_record("f"), "schema_version": SCHEMA_VERSION + 1}))
    sub = folder / "backup"
    sub.mkdir()
    elsewhere = write_record(folder, {**make_record("offset"), "started_at": "2026-03-01T09:00:00+02:00"})
    shutil.copy(elsewhere, sub / elsewhere.name)
    return folder


@pytest.mark.heavy  # in this process, a second or more: the full pass runs it, the fast tier does not
@pytest.mark.parametrize("fixture", ["results", "versions", "golden"])
def test_a_read_through_the_index_equals_reading_every_file_warnings_included(tmp_path, monkeypatch, fixture):
    folder = folder_with_bad_records(tmp_path, fixture)
    frames = fixture == "results"  # (the API's frames are the model's, typed: once is enough)
    uncached = read(folder, frames)  # no index yet: every file decoded (and the index written)
    assert index_path(folder).is_file()
    assert not [p for p in listed(folder) if INDEX_DIR in p.parts]  # never read as a record
    decoded = counting(monkeypatch, decoding, "read_document")
    cached = read(folder, frames)
    assert decoded == []  # every file, the damaged ones too, from the index
    assert_same(uncached, cached)
    warned = cached[3]
    for name in ("truncated.json", "future.json", "backup/"):  # said on every read, from the index too
        assert sum(name in w for w in warned) == (4 if frames else 1)  # load_records (, and each reader)
    offset = next(one.record for one in cached[0] if one.record.run_key == "offset")
    assert offset.started_at.isoformat() == "2026-03-01T09:00:00+02:00"


@pytest.mark.heavy  # in this process, a second or more: the full pass runs it, the fast tier does not
def test_a_warm_read_of_the_frames_decodes_no_record(tmp_path, monkeypatch):
    """load(), load_runs() and load_steps() read the rows and steps the index holds: no file is decoded, and
    no record either, and the frames are those of the first read (which decoded every file)."""
    folder = folder_with_bad_records(tmp_path, "results")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        first = [reader(folder) for reader in READERS]
        decoded, taken = counting(monkeypatch, decoding, "read_document"), counting(monkeypatch, rows, "record_of_blob")
        again = [reader(folder) for reader in READERS]
        assert decoded == [] and taken == []
        steps = sum(len(one.record.steps) for one in load_records(folder))
    for a, b in zip(first, again):
        pd.testing.assert_frame_equal(a, b)
    assert len(again[2]) == steps > 0


@pytest.mark.parametrize("fixture", ["results", "versions", "golden"])
def test_the_rows_are_made_from_the_records_plain_values(fixture):
    """A file's rows are made from the plain values the sanity guard judged (read_document), a record built in
    memory's from the record: the two are one value, so a folder read with or without its index, or as
    documents, gives one frame."""
    for p in sorted((REPO / "tests/fixtures" / fixture).glob("*.json")):
        try:
            rec, plain = decoding.read_document(p)
        except store.RecordError:
            continue
        assert plain == msgspec.to_builtins(rec), p.name


def test_only_new_and_changed_files_are_decoded_and_removed_ones_are_dropped(tmp_path, monkeypatch):
    for key in ("a", "b", "c"):
        write_record(tmp_path, make_record(key))
    load_records(tmp_path)
    decoded = counting(monkeypatch, decoding, "read_document")
    changed = write_record(tmp_path, make_record("b", tokens_per_s=250.0))  # replaced: a new file
    added = write_record(tmp_path, make_record("d"))
    (tmp_path / next(p.name for p in listed(tmp_path) if "__a.json" in p.name)).unlink()
    loaded = load_records(tmp_path)
    assert sorted(Path(p).name for (p,) in decoded) == sorted([changed.name, added.name])
    assert {one.record.run_key: one.record.metrics.tokens_per_s for one in loaded} == {"b": 250.0, "c": 100.0,
                                                                                      "d": 100.0}
    assert indexed(tmp_path) == sorted(p.name for p in listed(tmp_path))


@pytest.mark.heavy  # in this process, a second or more: the full pass runs it, the fast tier does not
def test_a_few_new_files_go_to_the_delta_and_more_or_a_removal_write_the_index_again(tmp_path, monkeypatch):
    """A new record is written to the delta file alone (the index file, its records' blobs and steps, is not
    read and written again); past DELTA_MIN (or a tenth of the index) new entries, or when a file the index
    file holds is removed, everything is one index file again; every read gives what a read of the files gives."""
    monkeypatch.setattr(index, "DELTA_MIN", 2)
    delta = tmp_path / INDEX_DIR / index.DELTA_FILE
    for key in ("a", "b", "c"):
        write_record(tmp_path, make_record(key))
    load_records(tmp_path)
    base = index_path(tmp_path).read_bytes()

    def same_as_the_files() -> None:
        cached = read(tmp_path)
        shutil.copytree(tmp_path, tmp_path.parent / "copy", ignore=shutil.ignore_patterns(INDEX_DIR))
        try:
            uncached = read(tmp_path.parent / "copy")
        finally:
            shutil.rmtree(tmp_path.parent / "copy")
        assert [one.record for one in cached[0]] == [one.record for one in uncached[0]]
        pd.testing.assert_frame_equal(cached[1].df.drop(columns="path"), uncached[1].df.drop(columns="path"))

    write_record(tmp_path, make_record("d"))
    same_as_the_files()
    assert index_path(tmp_path).read_bytes() == base and len(pq.read_table(delta)) == 1
    write_record(tmp_path, make_record("b", tokens_per_s=250.0))  # a changed file: its new entry in the delta
    same_as_the_files()
    assert index_path(tmp_path).read_bytes() == base and len(pq.read_table(delta)) == 2
    decoded = counting(monkeypatch, decoding, "read_document")
    load_records(tmp_path)
    assert decoded == []  # the delta's entries, over the index file's, serve the next read
    write_record(tmp_path, make_record("e"))  # three in the delta: past DELTA_MIN
    same_as_the_files()
    assert not delta.exists() and indexed(tmp_path) == sorted(p.name for p in listed(tmp_path))
    base = index_path(tmp_path).read_bytes()
    write_record(tmp_path, make_record("f"))
    load_records(tmp_path)
    assert delta.exists() and index_path(tmp_path).read_bytes() == base
    (tmp_path / next(p.name for p in listed(tmp_path) if "__a.json" in p.name)).unlink()
    same_as_the_files()
    assert not delta.exists() and indexed(tmp_path) == sorted(p.name for p in listed(tmp_path))


def test_a_file_changed_just_before_a_read_is_decoded_again(tmp_path, monkeypatch):
    """A file's clock ticks coarsely: one written within RACY_NS of a read may change again unseen by its size
    and times, so it is not trusted from the index until it has been still for RACY_NS."""
    monkeypatch.setattr(index, "RACY_NS", 60 * 10**9)
    write_record(tmp_path, make_record("a"))
    decoded = counting(monkeypatch, decoding, "read_document")
    load_records(tmp_path)
    load_records(tmp_path)
    assert len(decoded) == 2


def damage_garbage(path):
    path.write_bytes(b"PAR1 not really")


def damage_foreign(path):
    pq.write_table(pa.table({"x": [1, 2]}), path)  # a Parquet file, not an index


def damage_truncated(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def damage_record(path):
    table = pq.read_table(path)
    records = pa.array([b"\xc1"] * len(table), pa.binary())  # 0xc1: never valid msgpack
    pq.write_table(table.set_column(table.schema.get_field_index("record"), "record", records), path)


@pytest.mark.parametrize("damage", [damage_garbage, damage_foreign, damage_truncated, damage_record])
def test_a_damaged_or_foreign_index_is_rebuilt_with_one_warning(tmp_path, damage):
    for key in ("a", "b"):
        write_record(tmp_path, make_record(key))
    expected = load_records(tmp_path)
    damage(index_path(tmp_path))
    with pytest.warns(UserWarning, match="results index .* is damaged") as caught:
        assert load_records(tmp_path) == expected
    assert len(caught) == 1 and caught[0].filename == __file__  # said where the reader was called
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # rebuilt: read again without a word
        assert load_records(tmp_path) == expected
    assert indexed(tmp_path) == sorted(p.name for p in tmp_path.glob("*.json"))


def test_an_index_of_other_code_or_deleted_is_rebuilt_without_a_word(tmp_path, monkeypatch):
    write_record(tmp_path, make_record("a"))
    load_records(tmp_path)
    decoded = counting(monkeypatch, decoding, "read_document")
    monkeypatch.setattr(index, "code_version", lambda: "another-version")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_records(tmp_path)
        shutil.rmtree(tmp_path / INDEX_DIR)
        load_records(tmp_path)
    assert len(decoded) == 2
    meta = json.loads(pq.read_schema(index_path(tmp_path)).metadata[index.METADATA_KEY])
    assert meta["code"] == "another-version"


def test_a_folder_that_cannot_be_written_to_is_read_from_memory(tmp_path, monkeypatch):
    for key in ("a", "b"):
        write_record(tmp_path, make_record(key))
    expected = load_records(tmp_path)
    shutil.rmtree(tmp_path / INDEX_DIR)
    if os.geteuid() == 0:  # root writes anyway: the file system says no instead
        def refuse(*args, **kwargs):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))
        monkeypatch.setattr(index.Path, "mkdir", refuse)
    tmp_path.chmod(0o555)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert load_records(tmp_path) == expected
    finally:
        tmp_path.chmod(0o755)
    assert not (tmp_path / INDEX_DIR).exists()


@pytest.mark.heavy  # in this process, a second or more: the full pass runs it, the fast tier does not
def test_a_first_read_written_batch_by_batch_equals_one_whose_index_is_not_written(tmp_path, monkeypatch):
    """The rows of each batch of decoded files go to the index file as they are made, and their blobs are let
    go: the records are then those of a read whose index write fails at the end (each record read from its
    file) and of the warm read after it, and the index holds every file once."""
    monkeypatch.setattr(decoding, "BATCH", 2)
    folder = folder_with_bad_records(tmp_path, "results")
    real_replace = os.replace

    def refuse(src, dst):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(index.os, "replace", refuse)
    unwritten = read(folder)
    assert not index_path(folder).exists() and not list((folder / INDEX_DIR).glob("*.tmp"))
    monkeypatch.setattr(index.os, "replace", real_replace)
    written = read(folder)
    assert_same(unwritten, written)
    assert indexed(folder) == sorted(str(p.relative_to(folder)) for p in listed(folder))
    decoded = counting(monkeypatch, decoding, "read_document")
    assert_same(written, read(folder))
    assert decoded == []


@pytest.mark.procs  # worker processes decode most batches
def test_a_first_read_decoded_by_worker_processes_equals_one_decoded_here(tmp_path, monkeypatch):
    """Past POOL_MIN new files, batches go round robin to this process and to workers (here two: three cores
    said): the records, the model and every warning are those of a read that decodes every file here; so are
    they where the workers cannot start or stop at once (their batches then decoded here)."""
    monkeypatch.setattr(decoding, "BATCH", 2)
    monkeypatch.setattr(decoding, "POOL_MIN", 0)
    monkeypatch.setattr(decoding.os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    folder = folder_with_bad_records(tmp_path, "versions")
    batches = -(-len(record_files(folder)) // 2)
    here = counting(monkeypatch, decoding, "decoded_batch")
    pooled = read(folder)
    assert len(here) == -(-batches // 3)  # this process's third of the batches, the rest the workers'
    reads = []
    for worker in ("/nonexistent/python", "/bin/true", None):  # cannot start; stops at once; no workers at all
        shutil.rmtree(folder / INDEX_DIR)
        here.clear()
        if worker is None:
            monkeypatch.setattr(decoding, "POOL_MIN", 10**9)
        else:
            monkeypatch.setattr(decoding.sys, "executable", worker)
        reads.append(read(folder))
        assert len(here) == batches  # every batch decoded here
    for other in reads:
        assert_same(pooled, other)


def test_a_read_stopped_part_way_leaves_the_index_as_it_was(tmp_path, monkeypatch):
    """Interrupted after a batch of new files went to the new index file: the index is the one before, no
    temp file is left and its lock is free (the next read writes it)."""
    monkeypatch.setattr(decoding, "BATCH", 1)
    for key in ("a", "b", "c"):
        write_record(tmp_path, make_record(key))
    load_records(tmp_path)
    before = index_path(tmp_path).read_bytes()
    for key in ("d", "e", "f"):
        write_record(tmp_path, make_record(key))
    real, calls = decoding.read_document, []

    def interrupted(path):
        calls.append(path)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(path)

    monkeypatch.setattr(decoding, "read_document", interrupted)
    with pytest.raises(KeyboardInterrupt):
        load_records(tmp_path)
    assert index_path(tmp_path).read_bytes() == before
    assert sorted(p.name for p in (tmp_path / INDEX_DIR).iterdir()) == ["lock", index.INDEX_FILE]
    monkeypatch.setattr(decoding, "read_document", real)
    assert [one.record.run_key for one in load_records(tmp_path)] == list("abcdef")
    assert len(indexed(tmp_path)) == 6


def test_filters_keep_what_they_name_and_decode_nothing_else(tmp_path, monkeypatch):
    days = {"a1": ("a", "x", "2026-01-01T00:00:00+00:00"), "a2": ("a", "y", "2026-01-03T00:00:00+00:00"),
            "b1": ("b", "x", "2026-01-02T23:30:00-01:00"), "b2": ("b", "y", "2026-01-01T12:00:00+00:00")}
    for key, (suite, workload, started) in days.items():
        rec = make_record(key, workload=workload)
        rec["suite"] = rec["config"]["suite"] = suite
        write_record(tmp_path, {**rec, "started_at": started})
    cases = [({"suite": "a"}, {"a1", "a2"}), ({"workload": ["x"]}, {"a1", "b1"}),
             ({"since": "2026-01-03"}, {"a2", "b1"}), ({"suite": ("a", "b"), "workload": "y", "since": "2026-01-02"},
                                                       {"a2"})]
    for filters, keys in cases:  # no index: each file decoded, then filtered
        assert {one.record.run_key for one in load_records(tmp_path, only=store.Selection.of(**filters))} == keys
        shutil.rmtree(tmp_path / INDEX_DIR)
    load_records(tmp_path)
    decoded, taken = counting(monkeypatch, decoding, "read_document"), counting(monkeypatch, rows, "record_of_blob")
    for filters, keys in cases:
        taken.clear()
        assert {one.record.run_key for one in load_records(tmp_path, only=store.Selection.of(**filters))} == keys
        assert len(taken) == len(keys)  # only the records kept were decoded from the index
    assert decoded == []
    filters, keys = cases[-1]  # the API's frames: the records kept, and their runs
    assert set(benchsuite.load(tmp_path, **filters)["run_key"]) == keys
    assert list(benchsuite.load_runs(tmp_path, **filters)["workload"]) == ["y"]
    assert set(benchsuite.load_steps(tmp_path, **filters)["run_key"]) == keys


@pytest.mark.parametrize("filters, message", [({"suite": 3}, "suite: expected a name"),
                                              ({"workload": [None]}, "workload: expected a name"),
                                              ({"since": "last week"}, "since: expected an ISO 8601"),
                                              ({"since": 1.5}, "since: expected a date")])
def test_a_filter_of_the_wrong_kind_is_named(tmp_path, filters, message):
    with pytest.raises(TypeError, match=message):
        benchsuite.load(tmp_path, **filters)


def test_a_writer_appending_while_readers_read_never_gives_a_partial_view(tmp_path):
    """Readers (threads, each writing the index too) read while a writer appends: each read holds every record
    written before it began, in order, and none partial (a partial one would be skipped with a warning)."""
    n, written, failures = 25, [0], []

    def writer():
        for i in range(n):
            write_record(tmp_path, make_record(f"r{i:03d}", steps=200))
            written[0] = i + 1

    def reader():
        while written[0] < n:
            before = written[0]
            try:
                keys = [one.record.run_key for one in load_records(tmp_path)]
            except Exception as e:  # a warning too: the filter below turns them into errors
                failures.append(repr(e))
                return
            # (the record being written may be there already: renamed into place, its folder not yet synced)
            if keys != [f"r{i:03d}" for i in range(len(keys))] or not before <= len(keys) <= written[0] + 1:
                failures.append(f"read {len(keys)} records, {before}..{written[0]} written: {keys}")

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        threads = [threading.Thread(target=writer), *(threading.Thread(target=reader) for _ in range(2))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert failures == []
    assert [one.record.run_key for one in load_records(tmp_path)] == [f"r{i:03d}" for i in range(n)]


READER = """
import sys, warnings
warnings.simplefilter("error")
from benchsuite.results import decoding, index, rows, store
from benchsuite.results.store import load_records
index.RACY_NS = -1
store.MIN_FILES = 0
folder, n = sys.argv[1], int(sys.argv[2])
while True:
    keys = [one.record.run_key for one in load_records(folder)]
    assert keys == [f"r{i:03d}" for i in range(len(keys))], keys
    if len(keys) == n:
        break
"""

WRITER = """
import sys
from benchsuite.record import write_record
sys.path.insert(0, sys.argv[3])
from helpers.records import make_record
for i in range(int(sys.argv[2])):
    write_record(sys.argv[1], make_record(f"r{i:03d}", steps=200))
"""


@pytest.mark.procs
def test_processes_appending_and_reading_never_see_a_partial_view(tmp_path):
    """A writer process appends records while a reader process and this one read (both writing the index):
    every read is the records written before it, in order, whole."""
    n = 60
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), str(n), str(REPO / "tests")])
    reader = subprocess.Popen([sys.executable, "-c", READER, str(tmp_path), str(n)], stderr=subprocess.PIPE)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        while True:
            keys = [one.record.run_key for one in load_records(tmp_path)]
            assert keys == [f"r{i:03d}" for i in range(len(keys))]
            if writer.poll() is not None and len(keys) == n:
                break
    assert writer.wait(timeout=120) == 0
    assert reader.wait(timeout=120) == 0, reader.stderr.read().decode()[-2000:]
    decoded = listed(tmp_path)
    assert indexed(tmp_path) == sorted(p.name for p in decoded)


def test_a_small_folder_is_read_without_an_index(tmp_path, monkeypatch):
    """Below store.MIN_FILES record files an index costs more than it saves: none is written, none is read."""
    monkeypatch.setattr(store, "MIN_FILES", 3)
    for i in range(2):
        write_record(tmp_path, make_record(f"r{i}"))
    assert [one.record.run_key for one in load_records(tmp_path)] == ["r0", "r1"]
    assert not (tmp_path / INDEX_DIR).exists()
    write_record(tmp_path, make_record("r2"))
    assert len(load_records(tmp_path)) == 3 and index_path(tmp_path).is_file()
