"""A minimal valid record, for tests of the readers (store, report, dashboard, sanity flags), built through
the record's types as the worker's are: as a document (to write, or to change by hand) and as the typed
records a reader holds."""

import json

from benchsuite.record import SCHEMA_VERSION, decode, to_dict
from benchsuite.record.types import Record
from benchsuite.results.store import loaded


def typed(doc: dict) -> dict:
    """doc as the record's types state it: checked, every declared field present (null where not given)."""
    return to_dict(decode(doc))


def records_of(docs: list[dict]) -> list[Record]:
    """Documents built in memory as a reader holds them: upgraded, flagged and typed, as the loader reads a
    folder's files (store.loaded)."""
    return [one.record for one in loaded(docs)]


def make_record(run_key="k1", workload="w", status="ok", world_size=1, tokens_per_s=100.0, step=1.0,
                scaling="weak", steps=3):
    return typed({
        "schema_version": SCHEMA_VERSION, "run_key": run_key, "suite": "s", "workload": workload,
        "status": status, "error": None if status == "ok" else {"type": "X", "message": "boom", "rank": 1},
        "started_at": "2026-01-01T00:00:00+00:00", "duration_s": 1.0,
        "config": {"suite": "s", "workload": workload, "kind": "dense", "world_size": world_size, "nodes": 1,
                   "scaling": scaling, "sweep_id": f"s/{workload}/{scaling}"},
        "env": {}, "metrics": {"tokens_per_s": tokens_per_s, "tokens_per_s_per_device": tokens_per_s / world_size,
                               "mfu": None, "step_time_s": {"median": step, "p10": step, "p90": step, "ci95": [step, step]}}
        if status == "ok" else None,
        "energy": None, "carbon": None, "steps": [{"step": i, "time_s": step} for i in range(steps)],
    })


def schema_problems(records: list[dict]) -> list[tuple]:
    """(workload, message, path) of each record the shipped JSON Schema refuses (jsonschema: test-only)."""
    import jsonschema

    from benchsuite.record.schema import SHIPPED

    validator = jsonschema.Draft202012Validator(json.loads(SHIPPED.read_text()))
    return [(rec["workload"], e.message[:300], list(e.absolute_path))
            for rec in records for e in list(validator.iter_errors(rec))[:1]]
