"""Upgrading records of older schema versions, as asv's results.py does: one `update_to_N`
per version, applied in order on load, so a reader only ever sees the current version.

A version's upgrade is a list of small step functions, each `step(rec) -> rec`, each owning
one part of the record it changed (a renamed field, a new section with its null default).
A step receives a record that passed the current schema's type checks (fields it adds are
optional there), and its result is checked again.
"""

from __future__ import annotations

from collections.abc import Callable

from benchsuite.results.schema import SCHEMA_VERSION

Upgrade = Callable[[dict], dict]

# Version 1 → 2: the record's layout is unchanged; field upgrades of version 2 join this list.
STEPS_TO_2: list[Upgrade] = []


def update_to_2(rec: dict) -> dict:
    for step in STEPS_TO_2:
        rec = step(rec)
    rec["schema_version"] = 2
    return rec


UPDATES: dict[int, Upgrade] = {2: update_to_2}  # version reached -> the upgrade that reaches it


def migrate(rec: dict) -> dict:
    """rec (a valid record of version v <= SCHEMA_VERSION) upgraded to SCHEMA_VERSION."""
    for version in range(rec["schema_version"] + 1, SCHEMA_VERSION + 1):
        rec = UPDATES[version](rec)
    return rec
