"""The record layer: one typed definition (record/types.py) from which the shipped JSON Schema, the
DataFrame's columns and the encoder derive; closed to unknown keys; a newer benchsuite's record never
replaced; every upgrade step in results/migrate.py; the layer imports nothing above it."""

from __future__ import annotations

import ast
import contextlib
import copy
import io
import json
from pathlib import Path

import pytest

from benchsuite import cli
from benchsuite.record import (SCHEMA_VERSION, NewerRecordError, RecordError, as_record, encode, record_filename,
                               to_dict, write_record)
from benchsuite.record.columns import field_columns
from benchsuite.record.schema import SHIPPED, schema_text
from benchsuite.results.api import COLUMNS
from benchsuite.results.store import flatten, load_records, loaded
from helpers import REPO

jsonschema = pytest.importorskip("jsonschema")  # test-only (pyproject's [test]); absent on the GPU image

VERSIONS = REPO / "tests" / "fixtures" / "versions"
FIXTURES = REPO / "tests" / "fixtures" / "results"
PACKAGE = REPO / "benchsuite"


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft202012Validator:
    """The shipped schema, checked against the Draft 2020-12 meta-schema once for the module (~0.6 s)."""
    schema = json.loads(SHIPPED.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def _loaded(folder: Path) -> list[dict]:
    """The folder's records as the loader reads them, as the JSON documents the schema describes."""
    return [to_dict(one.record) for one in load_records(folder)]


def test_the_shipped_json_schema_is_the_one_the_types_generate():
    assert SHIPPED.read_text() == schema_text(), \
        "record/types.py changed: run python -m benchsuite.record.schema > benchsuite/record/record.schema.json"


def test_schema_verb_prints_the_shipped_schema():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["schema"]) == 0
    assert json.loads(out.getvalue()) == json.loads(SHIPPED.read_text())


def _current(name: str) -> dict:
    """A stored record of the previous schema version, upgraded to the current one as the loader does."""
    from benchsuite.results.migrate import migrate

    return migrate(json.loads((VERSIONS / name).read_text()))


def test_records_of_every_version_validate_against_the_schema_once_loaded(validator):
    """Version 4 files as written; versions 1 to 3 after the upgrade chain; each one a real record."""
    v = validator
    raw = [json.loads(p.read_text()) for p in VERSIONS.glob("*.json")]
    assert {r["schema_version"] for r in raw} == {2, 3, 4}
    for r in raw:
        if r["schema_version"] == SCHEMA_VERSION:
            assert not list(v.iter_errors(r)), r["workload"]
    loaded = _loaded(VERSIONS) + _loaded(FIXTURES)  # the fixtures are version 1
    assert len(loaded) == len(raw) + len(list(FIXTURES.glob("*.json")))
    for r in loaded:
        errors = list(v.iter_errors(r))
        assert not errors, (r["workload"], errors[0].message, list(errors[0].absolute_path))


@pytest.mark.parametrize("where", [(), ("metrics",), ("metrics", "moe"), ("energy", "per_node", 0, "cpu"),
                                   ("config", "train"), ("steps", 0)])
def test_a_key_the_types_do_not_declare_is_refused_by_the_schema_and_the_writer(tmp_path, where, validator):
    rec = _current("v4-dropless.json")
    node = rec
    for k in where:
        node = node[k]
    node["surprise"] = 1.0
    assert list(validator.iter_errors(rec))
    with pytest.raises(RecordError, match="unknown field `surprise`"):
        write_record(tmp_path, rec)
    assert not list(tmp_path.iterdir())


def test_a_value_of_the_wrong_type_is_refused_by_the_writer_naming_it():
    rec = _current("v4-pipe.json")
    rec["metrics"]["pipeline"]["stages"] = "two"
    with pytest.raises(RecordError, match=r"metrics.pipeline.stages: expected `int \| null`, got `str`"):
        encode(rec)


def test_the_writer_takes_the_typed_record_and_writes_the_file_its_plain_values_give(tmp_path):
    rec = _current("v4-dropless.json")
    typed = as_record(rec)
    assert as_record(typed) is typed and encode(typed) == encode(rec)
    path = write_record(tmp_path, typed)
    assert path.name == record_filename(rec) and path.read_bytes() == encode(rec)
    text = path.read_text(encoding="utf-8")
    assert text == json.dumps(json.loads(text), indent=1, sort_keys=True, ensure_ascii=False)


def test_a_newer_benchsuites_record_is_never_replaced(tmp_path):
    rec = _current("v4-zero3.json")
    newer = {**copy.deepcopy(rec), "schema_version": SCHEMA_VERSION + 1, "figure_we_do_not_know": 1}
    path = tmp_path / record_filename(rec)
    path.write_text(json.dumps(newer))
    with pytest.raises(NewerRecordError) as e:
        write_record(tmp_path, rec)
    assert f"schema_version {SCHEMA_VERSION + 1}" in str(e.value) and f"writes {SCHEMA_VERSION}" in str(e.value)
    assert json.loads(path.read_text()) == newer
    with pytest.warns(UserWarning, match=f"schema_version {SCHEMA_VERSION + 1} is newer than this benchsuite reads"):
        assert load_records(tmp_path) == []


def test_run_exits_2_before_measuring_over_a_newer_record(tmp_path, tiny_suite, capsys):
    from benchsuite.config import load_suite
    from benchsuite.environment import hardware_identity
    from benchsuite.launch import key_of, record_path, thread_plan

    suite = tiny_suite()
    (run,) = load_suite(suite).runs
    out = tmp_path / "out"
    out.mkdir()
    path = record_path(out, run, key_of(run, hardware_identity(), thread_plan([run])[run.sweep_id]))
    path.write_text(json.dumps({"schema_version": SCHEMA_VERSION + 3, "status": "ok"}))
    assert cli.main(["run", str(suite), "--out", str(out)]) == 2
    said = capsys.readouterr().err
    assert path.name in said and f"schema_version {SCHEMA_VERSION + 3}" in said
    assert f"writes {SCHEMA_VERSION}" in said
    assert json.loads(path.read_text())["schema_version"] == SCHEMA_VERSION + 3
    assert not (out / "logs").exists()  # nothing launched


def test_every_scalar_field_of_the_types_is_a_column():
    (rec,) = loaded([_current("v4-dropless.json")])
    row = flatten(rec)
    fields = field_columns()
    assert set(fields) <= set(row)
    assert row["config.moe.shared_experts"] == 1 and row["metrics.moe.dropped_frac"] == 0.0
    assert fields["energy.source"].categories == ("measured", "sampled", "estimated", "unavailable")
    assert fields["config.scaling"].categories == ("weak", "strong")
    for c in COLUMNS:  # load()'s columns: a field of the types, or a figure the DataFrame computes
        assert c.dtype is not None or c.source in fields, c.name


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_the_record_layer_imports_nothing_above_it_and_nothing_below_imports_results():
    for path in (PACKAGE / "record").glob("*.py"):
        ours = {n for n in _imports(path) if n.split(".")[0] in ("benchsuite", "torch", "pandas", "numpy")}
        assert ours <= {"benchsuite.atomic"} | {n for n in ours if n.startswith("benchsuite.record")}, path.name
    for package in ("metrics", "energy", "parallel", "models"):
        for path in (PACKAGE / package).glob("*.py"):
            assert not any(n.startswith("benchsuite.results") for n in _imports(path)), path


def test_every_upgrade_step_lives_in_the_migration_module():
    steps = [(path, node.name) for path in PACKAGE.rglob("*.py") for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.FunctionDef) and node.name.startswith(("upgrade_v", "update_to_"))]
    assert steps and {p.relative_to(PACKAGE).as_posix() for p, _ in steps} == {"results/migrate.py"}


def test_a_view_column_that_names_no_field_of_the_types_fails_when_declared():
    from benchsuite.record.columns import view_columns

    assert view_columns("metrics.moe.dropped_frac", "tokens_per_s", "label") == ("metrics.moe.dropped_frac",
                                                                                 "tokens_per_s", "label")
    with pytest.raises(KeyError, match="metrics.moe.droped_frac: not a scalar field"):
        view_columns("metrics.moe.droped_frac")
