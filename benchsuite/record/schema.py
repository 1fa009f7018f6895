"""The record's JSON Schema, generated from the types (record/types.py) and shipped beside them as
record.schema.json, so that tools outside benchsuite can validate records. Closed: every object
refuses keys it does not declare.

    python -m benchsuite.record.schema > benchsuite/record/record.schema.json   # after changing the types
"""

from __future__ import annotations

import json
from pathlib import Path

import msgspec

from benchsuite.record.types import SCHEMA_VERSION, Record

SHIPPED = Path(__file__).with_name("record.schema.json")


def json_schema() -> dict:
    """JSON Schema (draft 2020-12) of a record of the current schema version."""
    schema = msgspec.json.schema(Record)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": f"benchsuite run record, schema_version {SCHEMA_VERSION}",
            "description": "One training run's measurement. A figure that was not measured is null, with its "
                           "reason beside it. Records of older versions are upgraded on load by benchsuite.",
            **schema}


def schema_text() -> str:
    return json.dumps(json_schema(), indent=1, sort_keys=True) + "\n"


if __name__ == "__main__":
    print(schema_text(), end="")
