"""Record fuzzing: real records with fields replaced by other types, NaN, huge numbers, deep nesting,
lists for objects (and random JSON documents) are written into a results folder and fed to every
reader verb (list, report, dashboard, export, carbon project). Each verb exits 0 (the bad file
skipped with one warning naming it) or 2, never with another exception, within a time bound.
Then the file-level cases: FIFO, symlinks, non-UTF-8, lone surrogates, huge files, folders.

Bounded: about 15 s of CPU for the module (no shrinking: a failure prints its whole input).
"""

from __future__ import annotations

import contextlib
import csv
import copy
import io
import json
import os
import shutil
import time
import warnings
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from msgspec.structs import replace

import benchsuite
from benchsuite import cli
from benchsuite.results.migrate import (update_to_2, update_to_3, update_to_4, update_to_5, update_to_6,
                                        update_to_7, update_to_8, update_to_9)
from benchsuite.record import SCHEMA_VERSION, RecordError, decode, to_dict
from benchsuite.record.io import MAX_RECORD_BYTES
from benchsuite.record.types import Record
from benchsuite.results.decoding import read_record
from benchsuite.results.store import load_records, ok_record_ids
from helpers import REPO, run_cli

FIXTURES = REPO / "tests" / "fixtures" / "results"
VERSIONS = REPO / "tests" / "fixtures" / "versions"  # real records of versions 3 and 4 (and 2, from a 3), tiny runs
SOURCES = [FIXTURES / name for name in ("make_dvs-switch-w2.json", "make_hostile.json", "make_dense-q.json",
                                        "make_dvs-switch-w8-failed.json", "make_zero-zero3-w2.json",
                                        "smoke__dense-tiny__w2n1-weak__6a7938ff8f2a1420.json")] \
    + sorted(VERSIONS.glob("*.json"))  # a record of every schema version
GOOD = "smoke__dense-tiny__w1n1-weak__ee7bbe62e331231c.json"  # an intact record beside the damaged one
FUZZ = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                phases=[Phase.explicit, Phase.generate],  # no shrinking: a failure prints its whole input
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
SECONDS_PER_VERB = 20.0
PER_FOLDER = 5  # damaged files per example: each verb reads them together, so one run of the verbs checks five


def _verbs(folder: Path, n: int) -> list[list[str]]:
    return [["list", str(folder), "--json"], ["report", str(folder)], ["report", str(folder), "--json"],
            ["dashboard", str(folder), "-o", str(folder.parent / f"site{n}")],
            ["export", str(folder), "-o", str(folder.parent / f"emissions{n}.csv")],
            ["carbon", "project", str(folder), "--tokens", "1e12"],
            ["carbon", "project", str(folder), "--tokens", "1e12", "--json"],
            ["compare", str(FIXTURES), str(folder), "--json"]]  # (one folder twice is refused, exit 2, unread)


def run_reader(argv: list[str]) -> tuple[int, list[str], str]:
    """cli.main in this process: (exit code, warning messages, stdout); any exception fails the test."""
    out, caught = io.StringIO(), []
    show = lambda message, *args, **kwargs: caught.append(str(message))  # noqa: E731 (the CLI's one-line display)
    with mock.patch.object(cli, "_show_warning", show), contextlib.redirect_stdout(out):
        t0 = time.monotonic()
        try:
            rc = cli.main(argv)
        except SystemExit as e:  # argparse
            rc = e.code
        elapsed = time.monotonic() - t0
    assert elapsed < SECONDS_PER_VERB, f"{argv[0]} took {elapsed:.1f} s"
    return rc, caught, out.getvalue()


def is_accepted(path: Path) -> bool:
    try:
        read_record(path)
        return True
    except RecordError:
        return False


def check_every_reader(folder: Path, bad: list[Path], n: int) -> list[str]:
    """Each damaged file either loads as a valid record or is skipped by every verb with one warning naming it."""
    accepted = [is_accepted(p) for p in bad]
    shown = "\n--- input ---\n".join(p.read_text(encoding="utf-8", errors="replace")[:3000] for p in bad)
    for argv in _verbs(folder, n):
        try:
            rc, messages, _ = run_reader(argv)
        except AssertionError:
            raise
        except Exception as e:  # a traceback: the bug this file exists to find
            pytest.fail(f"{' '.join(argv[:2])}: {type(e).__name__}: {e}\n--- input ---\n{shown}")
        assert rc in (0, 2), (argv, rc, shown[:4000])
        for path in (p for p, ok in zip(bad, accepted) if not ok):
            naming = [m for m in messages if path.name in m]
            assert len(naming) == 1, (argv, path.name, messages)
            assert naming[0].startswith(f"skipping {path}: ")
    for reader in (benchsuite.load, benchsuite.load_steps, ok_record_ids):  # the API and run's resume scan
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                reader(folder)
            except Exception as e:
                pytest.fail(f"{reader.__name__}: {type(e).__name__}: {e}\n--- input ---\n{shown}")
        if reader is not ok_record_ids:  # (run's scan is quiet: it never names files it did not write)
            for path in (p for p, ok in zip(bad, accepted) if not ok):
                assert sum(path.name in str(w.message) for w in caught) == 1, (reader.__name__, path.name)
    shutil.rmtree(folder.parent / f"site{n}", ignore_errors=True)  # 5 MiB each
    return ["accepted" if ok else "skipped" for ok in accepted]


# ----------------------------------------------------------------------------- mutations of real records

DEEP = "__deep__"


def _paths(node, prefix=()):
    """Key paths of a record, lists by their first items only (so steps do not crowd out the sections)."""
    items = node.items() if isinstance(node, dict) else enumerate(node[:2]) if isinstance(node, list) else ()
    for k, v in items:
        yield prefix + (k,)
        if len(prefix) < 6:
            yield from _paths(v, prefix + (k,))


def _parent(doc, path):
    for k in path[:-1]:
        doc = doc[k]
    return doc


WRONG = (st.sampled_from([None, "delete", DEEP, "NaN", "nan", "Infinity", "-inf", "", "x", "1.5", "\ud800", True,
                          False, 0, -1, 0.0, -0.0, 1e308, -1e308, 2**31, 2**63, 2**70, 10**400, [], {}, [None],
                          [1, "a"], ["only one"], {"a": 1}, {"a.b": 1}, {"moe.dropped_frac": "x"}, [[[]]],
                          {"type": 3}, [{"uuid": ["x"]}]])
         | st.floats(allow_nan=True, allow_infinity=True) | st.integers() | st.text(max_size=6)
         | st.lists(st.integers() | st.text(max_size=3) | st.none(), max_size=3))


def _serialize(doc, depth: int) -> str:
    """JSON as a careless writer might produce it: NaN/Infinity literals allowed, and each DEEP
    marker replaced by lists nested `depth` levels (too deep for json.dumps itself to write)."""
    text = json.dumps(doc, allow_nan=True, indent=1)
    return text.replace(json.dumps(DEEP), "[" * depth + "]" * depth)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    return {"root": tmp_path_factory.mktemp("records"), "n": 0}


def _fresh_folder(ws) -> tuple[Path, int]:
    ws["n"] += 1
    folder = ws["root"] / f"r{ws['n']}"
    folder.mkdir()
    shutil.copy(FIXTURES / GOOD, folder / GOOD)
    return folder, ws["n"]


def draw_damaged(data) -> str:
    """The text of a real record with one to three fields replaced, deleted or given a sibling."""
    source = data.draw(st.sampled_from(SOURCES), label="record")
    doc = json.loads(source.read_text())
    for _ in range(data.draw(st.integers(1, 3), label="mutations")):
        path = data.draw(st.sampled_from(list(_paths(doc))), label="path")
        parent, last = _parent(doc, path), path[-1]
        new = copy.deepcopy(data.draw(WRONG, label="value"))
        if new == "delete":
            del parent[last]
        elif data.draw(st.booleans(), label="add a sibling key instead") and isinstance(parent, dict):
            parent[data.draw(st.sampled_from(["extra", "tokens_per_s", "x.y", "ci95", "per_device"]))] = new
        else:
            parent[last] = new
    depth = data.draw(st.sampled_from([5, 40, 900, 5000]), label="depth of a deep value")
    return _serialize(doc, depth)


def write_damaged(folder: Path, texts: list[str]) -> list[Path]:
    paths = [folder / f"damaged{i}.json" for i in range(len(texts))]
    for path, text in zip(paths, texts):
        path.write_text(text, encoding="utf-8")
    return paths


@pytest.mark.heavy  # every reader (a dozen) over each damaged folder: 10-15 s
@settings(FUZZ, max_examples=60 // PER_FOLDER)
@given(data=st.data())
def test_mutated_real_records_are_read_or_skipped_by_every_reader(workspace, data):
    folder, n = _fresh_folder(workspace)
    check_every_reader(folder, write_damaged(folder, [draw_damaged(data) for _ in range(PER_FOLDER)]), n)


JSON_VALUES = st.recursive(st.none() | st.booleans() | st.floats(allow_nan=False) | st.integers() | st.text(max_size=4),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                                         max_size=3), max_leaves=8)
ENVELOPES = st.fixed_dictionaries(
    {"schema_version": st.sampled_from([1, SCHEMA_VERSION]) | JSON_VALUES, "run_key": JSON_VALUES,
     "status": st.sampled_from(["ok", "failed"]) | JSON_VALUES},
    optional={k: JSON_VALUES for k in ("suite", "workload", "error", "started_at", "duration_s", "config", "env",
                                       "metrics", "energy", "carbon", "steps", "flags")})


@pytest.mark.heavy  # (as above)
@settings(FUZZ, max_examples=30 // 10)
@given(docs=st.lists(ENVELOPES | JSON_VALUES, min_size=10, max_size=10))
def test_random_documents_are_skipped_by_every_reader(workspace, docs):
    folder, n = _fresh_folder(workspace)
    bad = write_damaged(folder, [json.dumps(doc) for doc in docs])
    assert check_every_reader(folder, bad, n) == ["skipped"] * len(docs)


def test_mutations_explored_both_outcomes(tmp_path):
    """The mutations are not degenerate: of 60 drawn as the property above draws them, most damaged
    records are refused and some still fit."""
    outcomes = {"accepted": 0, "skipped": 0}

    @FUZZ
    @given(data=st.data())
    def explore(data):
        (path,) = write_damaged(tmp_path, [draw_damaged(data)])
        outcomes["accepted" if is_accepted(path) else "skipped"] += 1

    explore()
    print("record fuzz outcomes:", outcomes)
    assert outcomes["skipped"] > 20 and outcomes["accepted"] > 2, outcomes


# ----------------------------------------------------------------------------- explicit cases


def _record_text(**changes) -> str:
    doc = json.loads((FIXTURES / GOOD).read_text())
    doc.update(changes)
    return json.dumps(doc)


def _only_good_loads(folder: Path, bad_name: str, reason: str) -> None:
    with pytest.warns(UserWarning) as caught:
        recs = load_records(folder)
    assert [r.path.name for r in recs] == [GOOD]
    naming = [str(w.message) for w in caught if bad_name in str(w.message)]
    assert len(naming) == 1 and reason in naming[0], [str(w.message) for w in caught]


@pytest.fixture
def folder(tmp_path):
    d = tmp_path / "results"
    d.mkdir()
    shutil.copy(FIXTURES / GOOD, d / GOOD)
    return d


@pytest.mark.procs
def test_a_fifo_in_the_folder_never_hangs_a_reader(folder):
    os.mkfifo(folder / "pipe.json")
    t0 = time.monotonic()
    res = run_cli("list", str(folder), "--json", timeout=120)  # the old loader blocked here forever
    assert res.returncode == 0, res.stderr
    assert [r["run_key"] for r in json.loads(res.stdout)] == ["ee7bbe62e331231c"]
    assert f"skipping {folder / 'pipe.json'}: a FIFO, not a record file" in res.stderr
    assert "Traceback" not in res.stderr and time.monotonic() - t0 < 60
    _only_good_loads(folder, "pipe.json", "a FIFO")


@pytest.mark.procs
def test_a_fifo_named_directly_is_refused_without_blocking(folder):
    os.mkfifo(folder / "pipe.json")
    res = run_cli("carbon", "project", str(folder / "pipe.json"), "--tokens", "1e9", timeout=120)
    assert res.returncode == 2 and "a FIFO, not a record file" in res.stderr, res.stderr


def test_a_symlink_out_of_the_folder_is_not_followed(folder, tmp_path):
    outside = tmp_path / "elsewhere.json"
    outside.write_text(_record_text(run_key="outside"))
    (folder / "link.json").symlink_to(outside)
    _only_good_loads(folder, "link.json", "a symlink pointing out of the results folder")


def test_a_symlink_inside_the_folder_to_a_record_loads_and_to_a_fifo_does_not(folder):
    (folder / "sub").mkdir()
    (folder / "sub" / "real.json").write_text(_record_text(run_key="inside"))
    (folder / "alias.json").symlink_to(folder / "sub" / "real.json")
    os.mkfifo(folder / "sub" / ".pipe")
    (folder / "pipe-link.json").symlink_to(folder / "sub" / ".pipe")
    with pytest.warns(UserWarning) as caught:
        keys = sorted(r.record.run_key for r in load_records(folder))
    messages = [str(w.message) for w in caught]
    assert any("pipe-link.json: a FIFO, not a record file" in m for m in messages), messages
    # the link and its target are one measurement: read once, not counted as two repeats
    assert keys == ["ee7bbe62e331231c", "inside"]
    assert any(f"skipping {folder / 'sub' / 'real.json'}: the same record as {folder / 'alias.json'}" in m
               for m in messages), messages


def test_a_device_named_like_a_record_is_not_opened(folder):
    (folder / "zero.json").symlink_to("/dev/zero")  # out of the folder, and a device
    _only_good_loads(folder, "zero.json", "a symlink pointing out of the results folder")


def test_non_utf8_bytes_are_named(folder):
    (folder / "latin1.json").write_bytes(_record_text(suite="cafX").encode().replace(b"cafX", b"caf\xe9"))
    _only_good_loads(folder, "latin1.json", "not UTF-8 text")


def test_a_lone_surrogate_escape_is_named_with_its_field(folder):
    (folder / "surrogate.json").write_text(_record_text(workload="\ud800x"), encoding="utf-8")  # json writes \\ud800
    assert "\\ud800" in (folder / "surrogate.json").read_text()
    _only_good_loads(folder, "surrogate.json", "workload: a lone surrogate (\\ud800)")
    site = folder.parent / "site"
    assert cli.main(["dashboard", str(folder), "-o", str(site)]) == 0  # the site is built without it


def test_a_100_mb_file_is_refused_by_its_size_without_reading_it(folder):
    big = folder / "huge.json"
    with open(big, "wb") as f:
        f.truncate(100 * 2**20)  # sparse: no disk used
    t0 = time.monotonic()
    _only_good_loads(folder, "huge.json", f"larger than a record can be ({MAX_RECORD_BYTES // 2**20} MiB)")
    assert time.monotonic() - t0 < 5


def test_a_folder_named_like_a_record_is_named_and_not_searched(folder):
    (folder / "x.json").mkdir()
    (folder / "x.json" / "inner.json").write_text(_record_text(run_key="inner"))
    _only_good_loads(folder, "x.json", "a directory, not a record file")


def test_deep_nesting_is_refused_not_a_recursion_error(folder):
    deep = _record_text(metrics="DEEP").replace('"DEEP"', "[" * 100_000 + "]" * 100_000)
    (folder / "deep.json").write_text(deep)
    (folder / "deep2.json").write_text(_record_text(env="DEEP").replace('"DEEP"', '{"a":' * 500 + "1" + "}" * 500))
    with pytest.warns(UserWarning) as caught:
        recs = load_records(folder)
    assert len(recs) == 1
    messages = [str(w.message) for w in caught]
    assert any("deep.json: nested too deeply to parse" in m for m in messages), messages
    assert any("deep2.json: env.a.a" in m and "nested deeper than 32 levels" in m for m in messages), messages
    assert cli.main(["report", str(folder)]) == 0  # the old loader let RecursionError escape here


@pytest.mark.parametrize("field, value, reason", [
    ("metrics.tokens_per_s", "fast", "metrics.tokens_per_s: expected `float | null`, got `str`"),
    ("metrics.step_time_s.ci95", [0.1], "metrics.step_time_s.ci95: expected `array` of length >= 2, got a list of 1"),
    ("metrics.moe", [1], "metrics (flops, moe, quality, energy), config or env.devices: cannot be upgraded to "
                         "schema version 2 (AttributeError"),  # a version-1 fixture: its upgrade reads metrics.moe
    ("config.world_size", 0, "config.world_size: expected `int` >= 1, got int 0"),
    ("energy.per_device", {"uuid": "x"}, "energy.per_device: expected `array | null`, got `object`"),
    ("steps", {"0": {}}, "steps: expected `array`, got `object`"),
    ("status", "maybe", "status: invalid enum value 'maybe'"),
    ("energy.total_j", 10**400, "energy.total_j: number out of range, got int 10000000000000000000… (401 digits)"),
    ("carbon.pue", None, "carbon.pue: expected `float`, got `null`"),  # carbon project multiplied by it
])
def test_wrong_types_are_named_with_the_field(folder, field, value, reason):
    doc = json.loads((FIXTURES / "make_dvs-switch-w2.json").read_text())
    *parents, last = field.split(".")
    node = doc
    for k in parents:
        node = node[k]
    node[last] = value
    (folder / "typed.json").write_text(json.dumps(doc))
    _only_good_loads(folder, "typed.json", reason)


def test_nan_and_out_of_range_literals_are_not_strict_json(folder):
    (folder / "nan.json").write_text(_record_text(duration_s="NAN").replace('"NAN"', "NaN"))
    (folder / "big.json").write_text(_record_text(duration_s="BIG").replace('"BIG"', "1e400"))
    with pytest.warns(UserWarning) as caught:
        assert len(load_records(folder)) == 1
    messages = " ".join(str(w.message) for w in caught)
    assert "NaN is not a JSON number" in messages and "number 1e400 is out of range" in messages


def test_run_resume_scan_survives_every_bad_file(folder):
    """The resume scan reads the same folder: stray files never stop it, and only ok records count."""
    os.mkfifo(folder / "pipe.json")
    (folder / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (folder / "typed.json").write_text(_record_text(run_key="typed", duration_s="slow"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # quiet: run does not warn about files it did not write
        assert ok_record_ids(folder) == {"ee7bbe62e331231c"}


# ----------------------------------------------------------------------------- versions


def test_schema_1_fixtures_load_through_the_chain_as_the_current_version():
    assert SCHEMA_VERSION == 9
    raw = {p.name: json.loads(p.read_text()) for p in FIXTURES.glob("*.json")}
    assert {d["schema_version"] for d in raw.values()} == {1}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        recs = load_records(FIXTURES)
    assert len(recs) == len(raw) and {r.record.schema_version for r in recs} == {SCHEMA_VERSION}
    for r in recs:  # exactly what the chain's steps make of the stored record, nothing else touched
        before = raw[r.path.name]
        chained = update_to_9(update_to_8(update_to_7(update_to_6(update_to_5(update_to_4(update_to_3(update_to_2(
            copy.deepcopy(before)))))))))
        assert {k: v for k, v in to_dict(r.record).items() if k != "flags"} == \
            {k: v for k, v in to_dict(decode(chained)).items() if k != "flags"}
        assert r.record.repeat == 0


def test_updates_run_in_order_before_the_types_check_their_output(folder, monkeypatch):
    from benchsuite.results import migrate

    seen = []
    monkeypatch.setitem(migrate.UPDATES, 2, lambda r: seen.append(2) or {**r, "schema_version": 2})
    monkeypatch.setitem(migrate.UPDATES, 3, lambda r: seen.append(3) or {**r, "schema_version": 3})
    monkeypatch.setitem(migrate.UPDATES, 4, lambda r: seen.append(4) or {**r, "schema_version": 4})
    monkeypatch.setitem(migrate.UPDATES, 5, lambda r: seen.append(5) or {**r, "schema_version": 5})
    monkeypatch.setitem(migrate.UPDATES, 6, lambda r: seen.append(6) or {**r, "schema_version": 6,
                                                                          "duration_s": "broken"})
    (folder / "v1.json").write_text(_record_text(run_key="v1"))
    with pytest.warns(UserWarning, match="v1.json: duration_s: expected `float | null`, got `str`"):
        recs = load_records(folder)
    assert seen == [2, 3, 4, 5, 6, 2, 3, 4, 5, 6] and len(recs) == 0  # GOOD is version 1 too: upgraded, broken, skipped


@pytest.mark.parametrize("field, value, named", [
    ("metrics", {"flops": {"model_per_token": "x"}, "tokens_per_s": 1.0}, "metrics (flops, moe, quality, energy)"),
    ("env", {"devices": "abc"}, "env.devices: cannot be upgraded to schema version 2"),
    ("started_at", "yesterday", "started_at: cannot be upgraded to schema version 4 (ValueError"),
    ("config", {"world_size": 1, "nodes": 1, "scaling": "weak", "moe": 7}, "metrics (flops, moe"),
])
def test_a_damaged_field_of_an_old_record_is_named_not_a_traceback(folder, field, value, named):
    """An upgrade step that meets a damaged field: the record is skipped with a warning naming the file,
    the field and the version, for every reader verb (list, report, export, compare, dashboard, load())."""
    (folder / "old.json").write_text(_record_text(**{field: value}))
    _only_good_loads(folder, "old.json", named)
    for verb in (["list"], ["report"], ["export", "--format", "codecarbon", "-o", str(folder.parent / "e.csv")],
                 ["compare", str(FIXTURES)], ["dashboard", "-o", str(folder.parent / "site")]):
        rc, warned, _ = run_reader([verb[0], str(folder), *verb[1:]])
        assert rc == 0 and any("old.json" in w for w in warned), (verb, warned)


# ----------------------------------------------------------------------------- copies, overflows, huge records


def test_a_copy_of_a_record_is_one_measurement_not_two_repeats(folder):
    (folder / "backup").mkdir()
    shutil.copy(folder / GOOD, folder / "backup" / "copy.json")  # a backup kept beside, read recursively
    (folder / "again.json").write_text(_record_text(started_at="2026-02-02T00:00:00+00:00"))  # a second measurement
    with pytest.warns(UserWarning) as caught:
        recs = load_records(folder)
    assert sorted(r.path.name for r in recs) == sorted(["again.json", "copy.json"])
    assert [str(w.message) for w in caught] == [
        f"skipping {folder / GOOD}: the same record as {folder / 'backup' / 'copy.json'} (run key ee7bbe62e331231c, "
        "repeat 0), one measurement, read once; remove one of the two files"]
    rc, _, out = run_reader(["report", str(folder), "--json"])
    assert rc == 0 and [r.get("repeats") for r in json.loads(out)["runs"]] == [2]  # the old loader counted 3


@pytest.mark.parametrize("field, value, reason", [  # the value is named, not only its type
    ("schema_version", -1, "schema_version: expected a positive integer, got int -1"),
    ("schema_version", 3.0, "schema_version: expected a positive integer, got float 3.0"),
    ("repeat", 2**40, "repeat: expected `int` <= 2147483647, got int 1099511627776"),
    ("config", {"world_size": 0, "nodes": 1, "scaling": "weak"}, "config.world_size: expected `int` >= 1, got int 0"),
])
def test_a_refused_number_is_shown_with_its_value(folder, field, value, reason):
    (folder / "typed.json").write_text(_record_text(**{field: value}))
    _only_good_loads(folder, "typed.json", reason)


def test_an_integer_past_pythons_digit_limit_is_out_of_range_without_pythons_advice(folder):
    (folder / "digits.json").write_text(_record_text(duration_s="N").replace('"N"', "1" * 5000))
    _only_good_loads(folder, "digits.json", "not valid JSON (number 11111111111111111111… of 5000 digits is out of "
                                            "range)")


def _overflowing(folder: Path, name: str, **changes) -> Path:
    doc = json.loads((FIXTURES / "make_dvs-switch-w2.json").read_text())
    for dotted, value in changes.items():
        *parents, last = dotted.split("__")
        node = doc
        for k in parents:
            node = node[k]
        node[last] = value
    (folder / name).write_text(json.dumps(doc))
    return folder


def test_figures_that_overflow_in_a_reader_are_never_a_traceback(folder, tmp_path):
    """Finite record figures whose arithmetic leaves float range: once a ValueError from json.dumps (carbon
    project, compare --json) and an OverflowError (export, a start time in year 9999)."""
    _overflowing(folder, "huge.json", metrics__energy__j_per_token=1e308, metrics__tokens_per_step=1e308,
                 started_at="9999-12-31T23:59:59+00:00")
    rc, _, out = run_reader(["carbon", "project", str(folder), "--tokens", "1e12", "--json"])
    rows = {r["run_keys"][0]: r for r in json.loads(out)}
    assert rc == 0 and "--tokens × the record's rates is beyond float range" in rows["s000000000000002"]["error"]
    rc, _, out = run_reader(["compare", str(FIXTURES), str(folder), "--json"])
    assert rc == 0 and json.loads(out)["runs"]
    rc, _, _ = run_reader(["export", str(folder), "-o", str(tmp_path / "e.csv")])
    rows = list(csv.DictReader((tmp_path / "e.csv").open()))
    assert rc == 0 and sorted(r["timestamp"] == "" for r in rows) == [False, True]  # year 10000: an empty cell


def test_compare_of_a_record_of_a_million_steps_reads_its_figures_not_its_steps():
    """The bootstrap over step times drew resamples × steps indices: 2000 × 650k steps (a 56 MB record) took
    30 GB and was killed. compare's units are the repeats' figures: a million steps cost nothing more than ten."""
    from benchsuite.results.compare import compare_run

    rec = read_record(FIXTURES / GOOD)
    huge = replace(rec, steps=[replace(rec.steps[0], time_s=0.01)] * 1_000_000)
    tiny = replace(rec, steps=rec.steps[:10])

    def side(rec: Record, speeds) -> list[Record]:
        return [replace(rec, repeat=i, metrics=replace(rec.metrics, tokens_per_s=rec.metrics.tokens_per_s * s))
                for i, s in enumerate(speeds)]

    def best_time(rec: Record):
        times, run = [], None
        for _ in range(3):
            t0 = time.perf_counter()
            run = compare_run(side(rec, [1.0, 1.01]), side(rec, [2.0, 2.02]))
            times.append(time.perf_counter() - t0)
        return min(times), run

    (t_huge, run), (t_tiny, _) = best_time(huge), best_time(tiny)
    tps = run.metrics[0]
    assert tps.ratio == pytest.approx(2.0) and tps.verdict.value == "better"
    assert tps.a == pytest.approx(rec.metrics.tokens_per_s * 1.005)  # the median of the two repeats
    assert t_huge < 20 * t_tiny, (t_huge, t_tiny)  # no work per step


def test_a_folder_that_cannot_be_listed_is_named_not_passed_over(folder, monkeypatch):
    """os.walk skipped an unreadable subfolder (chmod 000, another user's) in silence: its records were
    missing from every report with no word. (Simulated: the tests may run as root, whom chmod does not stop.)"""
    closed = folder / "closed"
    closed.mkdir()
    (closed / "x.json").write_text(_record_text(run_key="hidden"))
    scandir = os.scandir

    def denied(path="."):
        if Path(path) == closed:
            raise PermissionError(13, "Permission denied", str(path))
        return scandir(path)

    monkeypatch.setattr(os, "scandir", denied)
    _only_good_loads(folder, "closed", f"skipping {closed}: a folder that cannot be read (Permission denied); "
                                       "its records are not included")


def test_a_record_of_millions_of_tiny_items_is_refused_before_readers_walk_them(folder):
    """10M empty step objects fit in 30 MB (under the byte limit): list took 57 s and 2.5 GB on them, report
    76 s, compare more than 2 minutes. A list longer than any record holds is refused at once."""
    (folder / "many.json").write_text(_record_text(steps="S").replace('"S"', "[" + ",".join(["{}"] * 2_000_000) + "]"))
    t0 = time.monotonic()
    _only_good_loads(folder, "many.json", "steps: a list of 2,000,000 items, more than a record holds (1,000,000)")
    assert time.monotonic() - t0 < SECONDS_PER_VERB


def test_a_record_of_too_many_objects_in_all_is_refused(folder, monkeypatch):
    from benchsuite.record import codec

    monkeypatch.setattr(codec, "MAX_CONTAINERS", 1000)  # the steps of GOOD and a few sections fit
    (folder / "wide.json").write_text(_record_text(extra=[[{}] * 400] * 3))  # lists each short enough, 1200 in all
    _only_good_loads(folder, "wide.json", "more than 1,000 objects and lists, more than a record holds")


def test_a_deep_folder_tree_is_scanned_without_recursion_and_named_past_its_depth(folder, monkeypatch):
    """Folders 1,200 deep (past Python's recursion limit): the scan is iterative, a record up to 32 folders
    down is read, and the first folder deeper is named once with what to do."""
    import sys

    from benchsuite.results.store import MAX_FOLDER_DEPTH

    monkeypatch.chdir(folder)
    for depth in range(1200):  # one folder at a time, relative: no path too long for one system call
        os.mkdir("d")
        os.chdir("d")
        if depth == 10:
            shutil.copy(FIXTURES / "make_dvs-switch-w2.json", "shallow.json")
    Path("buried.json").write_text("{}")
    assert 1200 > sys.getrecursionlimit()
    try:
        with pytest.warns(UserWarning) as caught:
            recs = load_records(folder)
    finally:  # removed the same way, bottom up: shutil.rmtree (and pytest's clean-up with it) would recurse
        os.remove("buried.json")
        for _ in range(1200):
            os.chdir("..")
            for name in os.listdir("d"):
                os.remove(Path("d") / name) if name != "d" else None
            os.rmdir("d")
    assert sorted(r.path.name for r in recs) == sorted([GOOD, "shallow.json"])
    (message,) = [str(w.message) for w in caught]
    assert f"a folder nested more than {MAX_FOLDER_DEPTH} levels deep" in message and "/d" * 33 in message
