"""`benchsuite schema`: the JSON Schema of a run record (closed, generated from the record's types)."""

from __future__ import annotations

import sys

from benchsuite.commands.common import JSON


def add_parser(sub) -> None:
    s = sub.add_parser("schema", parents=[JSON],
                       help="print the JSON Schema of a run record (to validate records with other tools)")
    s.set_defaults(fn=run)


def run(args) -> int:
    from benchsuite.record.schema import SHIPPED

    sys.stdout.write(SHIPPED.read_text(encoding="utf-8"))
    return 0
