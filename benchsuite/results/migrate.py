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

def steps_to_2() -> list[Upgrade]:
    """Version 1 → 2, in order: model FLOPs without recompute and hardware FLOPs / HFU (the ceiling
    ratio is rescaled first, then judged), the ceiling's method, threads per rank, GPU-only J/token,
    the typed precision policy. Each step lives beside the code that computes its field, imported
    here on first use (some import torch)."""
    from benchsuite.metrics.energy import upgrade_v1_energy_metrics
    from benchsuite.metrics.ceiling import upgrade_v1_ceiling
    from benchsuite.metrics.flops import upgrade_v1_flops
    from benchsuite.metrics.scaling import upgrade_v1_env
    from benchsuite.parallel.zero import upgrade_v1_precision_policy

    return [upgrade_v1_flops, upgrade_v1_ceiling, upgrade_v1_env, upgrade_v1_energy_metrics,
            upgrade_v1_precision_policy]


def update_to_2(rec: dict) -> dict:
    for step in steps_to_2():
        rec = step(rec)
    rec["schema_version"] = 2
    return rec


def upgrade_v2_repeat(rec: dict) -> dict:
    """A version-2 record as version 3 states it: a record written before `run --repeat` was the one
    measurement of its run, repeat 0 (its file name, the bare run key, is repeat 0's)."""
    rec.setdefault("repeat", 0)
    return rec


def steps_to_3() -> list[Upgrade]:
    """Version 2 → 3: the MoE keys and per-expert figures of dropless top-k routing, the dropless
    all-to-all's bytes per step, the repeat index of `run --repeat`."""
    from benchsuite.metrics.comm import upgrade_v2_comm
    from benchsuite.models.moe import upgrade_v2_moe

    return [upgrade_v2_moe, upgrade_v2_comm, upgrade_v2_repeat]


def update_to_3(rec: dict) -> dict:
    for step in steps_to_3():
        rec = step(rec)
    rec["schema_version"] = 3
    return rec


UPDATES: dict[int, Upgrade] = {2: update_to_2, 3: update_to_3}  # version reached -> the upgrade that reaches it


def migrate(rec: dict) -> dict:
    """rec (a valid record of version v <= SCHEMA_VERSION) upgraded to SCHEMA_VERSION."""
    for version in range(rec["schema_version"] + 1, SCHEMA_VERSION + 1):
        rec = UPDATES[version](rec)
    return rec
