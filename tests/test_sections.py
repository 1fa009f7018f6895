"""One set of section types: a suite's tables, the resolved run and a record's config are the same classes
(record/sections.py), so a value a suite refuses is one a record refuses, under the same key, and an older
record's config reads as the run it ran (its nulls are the defaults)."""

from __future__ import annotations

import json
import math
import typing

import msgspec
import pytest

from benchsuite.config import SECTIONS, RunConfig, build_section
from benchsuite.record import SCHEMA_VERSION, RecordError, decode, to_dict
from benchsuite.record.types import Config
from benchsuite.results.identity import run_identity
from benchsuite.results.migrate import migrate
from benchsuite.results.store import load_records
from helpers import REPO
from helpers.records import make_record, records_of

# Values of every JSON type and of both signs, at and beside the usual bounds (0, 1, 2) and the literals.
CANDIDATES = [0, -1, 1, 2, 3, 0.5, 1.5, 1e-5, True, False, None, "", "bogus", "switch", "rmsnorm", "1f1b",
              math.inf, [1]]
FIELDS = [(sec, f) for sec, cls in SECTIONS.items() for f in msgspec.structs.fields(cls)]


def test_the_records_config_and_the_run_hold_the_suites_section_types():
    config, run = typing.get_type_hints(Config), typing.get_type_hints(RunConfig)
    for sec, cls in SECTIONS.items():
        assert config[sec] == cls | None
        assert run[sec] in (cls, cls | None)


def _record_refuses(sec: str, key: str, value) -> str | None:
    doc = make_record()
    doc["config"][sec] = {key: value}
    try:
        decode(doc)
    except RecordError as e:
        return str(e)
    return None


@pytest.mark.parametrize("sec, field", FIELDS, ids=[f"{s}.{f.name}" for s, f in FIELDS])
def test_a_value_a_suite_refuses_is_one_a_record_refuses_under_the_same_key(sec, field):
    judged = 0
    for value in CANDIDATES:
        problems: list[tuple[str, str]] = []
        build_section(SECTIONS[sec], {field.name: value}, sec, problems)
        record = _record_refuses(sec, field.name, value)
        assert (record is None) == (not problems), (value, problems, record)
        if record is not None:
            assert record.startswith(f"config.{sec}.{field.name}"), record
            judged += 1
    assert judged, "no candidate is refused: the field accepts anything"


def test_an_older_records_null_keys_read_as_the_defaults_so_its_run_is_a_new_runs():
    new = make_record()
    new["config"]["parallel"] = {"tensor": 1}
    old = json.loads(json.dumps(new))
    old["schema_version"] = 6
    old["config"]["parallel"] = {"tensor": 1, "pipeline": None, "schedule": None, "virtual_stages": None,
                                 "sequence_parallel": None, "zero": 0, "expert": 1, "microbatches": None}
    upgraded = decode(migrate(old))
    assert upgraded.config.parallel.pipeline == 1 and upgraded.config.parallel.schedule == "1f1b"
    assert run_identity(records_of([old])[0]) == run_identity(records_of([new])[0])


def test_a_record_naming_a_router_this_benchsuite_does_not_know_is_skipped_naming_the_key(tmp_path):
    doc = make_record()
    doc["config"]["kind"], doc["config"]["moe"] = "moe", {"router": "<b onmouseover=alert(3)>r</b>"}
    (tmp_path / "r.json").write_text(json.dumps(doc), encoding="utf-8")
    with pytest.warns(UserWarning, match=r"r\.json: config\.moe\.router: invalid enum value"):
        assert load_records(tmp_path) == []


OLDER = sorted((REPO / "tests" / "fixtures" / "versions").glob("*.json")) + sorted(
    p for p in (REPO / "tests" / "fixtures" / "results").glob("make_*.json") if "failed" not in p.name)


@pytest.mark.parametrize("path", OLDER, ids=[p.name for p in OLDER])
def test_an_upgraded_record_of_every_older_version_is_the_run_today_writes_for_its_config(path):
    """Issue: a baseline from before pipeline support never matched today's run of the same configuration
    ("differs by parallel.pipeline (null in A, 1 in B)"). Today's record of the config states every key."""
    doc = json.loads(path.read_text(encoding="utf-8"))
    assert doc["schema_version"] < SCHEMA_VERSION
    (old,) = records_of([doc])
    today = json.loads(json.dumps(to_dict(old)))
    today["config"] = RunConfig.from_record(old.config).to_dict()
    assert run_identity(old) == run_identity(records_of([today])[0])
    assert old.config.parallel.pipeline == 1 or "pipe" in path.name  # a key it never had is the default


def test_identities_hashed_from_a_readers_json_values_equal_those_of_the_typed_config_and_leave_them_whole():
    """A reader making rows hands the identities the config's JSON values it already has: the same hashes as
    from the typed config, and the values it handed are not changed (the row's config columns come from them)."""
    from benchsuite.results.identity import routing_identity
    from benchsuite.results.scaling import scaling_identity

    for one in load_records(REPO / "tests" / "fixtures" / "results"):
        rec = one.record
        plain = msgspec.to_builtins(rec.config)
        before = json.dumps(plain, sort_keys=True)
        assert run_identity(rec, plain) == run_identity(rec)
        assert routing_identity(rec, plain) == routing_identity(rec)
        assert scaling_identity(rec, plain) == scaling_identity(rec)
        assert json.dumps(plain, sort_keys=True) == before
