"""How a workload's keys are laid, key by key: the suite's own [energy]/[carbon] under [defaults] under a
preset under the workload's own tables; and which inherited keys took effect in some workload."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from benchsuite.config.presets import Preset, lookup
from benchsuite.config.problems import Problems, qkey
from benchsuite.config.specs import read_section
from benchsuite.config.sweeps import sweep_lists
from benchsuite.record.sections import SECTIONS, CarbonConfig, EnergyConfig


def inherited_path(key: str, origin: str) -> str:
    """Where a key a workload inherits is written: [defaults] or the suite's own [energy]/[carbon]."""
    return f"defaults.{key}" if origin == "defaults" else key


@dataclass
class Inherited:
    """The keys of [defaults] and of the suite's [energy]/[carbon] ("defaults.train.lr", "carbon.pue" ->
    "section.key"), which of them took effect in some workload (or were refused there: told once), and
    why each other one did not."""

    given: dict[str, str]
    used: set[str] = field(default_factory=set)
    unused_because: dict[str, tuple[int, str]] = field(default_factory=dict)  # path -> (how specific, reason)

    def unused(self, path: str, reason: str, specific: int = 0) -> None:
        """Why `path` took no effect in one workload. The most specific reason is told, whatever the order of the
        workloads: "needs moe.balance = aux_free" from an MoE workload over "needs kind = moe" from a dense one."""
        if specific > self.unused_because.get(path, (-1, ""))[0]:
            self.unused_because[path] = (specific, reason)

    def report(self, problems: Problems) -> None:
        """Refuse each inherited key that took effect in no workload: it changes nothing."""
        for path, key in self.given.items():
            if path in self.used:
                continue
            where = "[defaults]" if path.startswith("defaults.") else f"[{key.partition('.')[0]}]"
            reason = self.unused_because.get(path, (0, f"every workload sets its own {key}"))[1]
            problems.refuse(path, f"{reason}, so it changes nothing; remove it from {where}")


@dataclass
class Layers:
    """What every workload of a suite is laid over, read once: [defaults], the accepted keys of the suite's own
    [energy]/[carbon] and its [sweep] lists; the suite-level keys refused ("carbon.pue", "sweep.nodes") and the
    [defaults] keys no workload can read (a section that is not a table); the inherited keys' bookkeeping, and
    the suite's [carbon] as built (preflight reads its places)."""

    defaults: dict[str, Any]
    suite_level: dict[str, dict[str, Any]]
    sweep: dict[str, list]
    refused: set[str]
    unreadable: set[str]
    inherited: Inherited
    carbon: CarbonConfig


def _read_defaults(defaults: Any, problems: Problems) -> tuple[dict[str, Any], set[str]]:
    """[defaults] and the keys of each of its sections that is not a table (unknown to every workload)."""
    if not isinstance(defaults, dict):
        problems.add("defaults", "expected a table")
        return {}, {f"{sec}.{f.name}" for sec, cls in SECTIONS.items() for f in msgspec.structs.fields(cls)}
    unreadable = set()
    for key, v in defaults.items():
        if key not in SECTIONS:
            problems.add(f"defaults.{qkey(key)}", f"unknown key; valid keys: {', '.join(SECTIONS)}")
        elif not isinstance(v, dict):
            problems.add(f"defaults.{key}", "expected a table")
            unreadable |= {f"{key}.{f.name}" for f in msgspec.structs.fields(SECTIONS[key])}
    return defaults, unreadable


def _read_suite_sections(doc: dict, problems: Problems) -> tuple[dict[str, dict[str, Any]], CarbonConfig]:
    """The accepted keys of the suite's own [energy]/[carbon] (a refused one is remembered as refused in
    problems), and its [carbon] as built."""
    accepted, built = {}, {}
    for sec, cls in (("energy", EnergyConfig), ("carbon", CarbonConfig)):
        raw = doc.get(sec, {})
        built[sec] = read_section(cls, raw, sec, problems)
        if isinstance(raw, dict):
            accepted[sec] = {key: getattr(built[sec], key) for key in raw
                             if problems.known(f"{sec}.{key}") and key in cls.__struct_fields__}
    return accepted, built["carbon"]


def read_layers(doc: dict, problems: Problems) -> Layers:
    """[defaults], the suite's own [energy]/[carbon] and [sweep], each checked once for every workload."""
    defaults, unreadable = _read_defaults(doc.get("defaults", {}), problems)
    suite_level, carbon = _read_suite_sections(doc, problems)
    inherited = Inherited({f"{sec}.{key}": f"{sec}.{key}" for sec, table in suite_level.items() for key in table}
                          | {f"defaults.{sec}.{key}": f"{sec}.{key}" for sec, table in defaults.items()
                             if sec in SECTIONS and isinstance(table, dict) for key in table
                             if key in SECTIONS[sec].__struct_fields__})
    sweep = sweep_lists(doc.get("sweep"), problems)
    return Layers(defaults, suite_level, sweep, set(problems.refused), unreadable, inherited, carbon)


def merge_sections(layers: Layers, workload: dict) -> tuple[dict, dict[str, str]]:
    """Each section of a workload, key by key: the suite's [energy]/[carbon] under [defaults] under the
    workload's own table; and where each "section.key" came from ("suite", "defaults" or "workload"). A
    suite's values are scalars, so nothing deeper is merged or copied (walking a pathological file's nesting
    could exhaust the stack)."""
    out, origins = {}, {}
    for sec in SECTIONS:
        if sec in workload and not isinstance(workload[sec], dict):
            out[sec] = workload[sec]  # refused by build_section, naming the workload's key
            continue
        tables = (("suite", layers.suite_level.get(sec)), ("defaults", layers.defaults.get(sec)),
                  ("workload", workload.get(sec)))
        given = [(origin, table) for origin, table in tables if isinstance(table, dict)]
        if given:
            out[sec] = {}
        for origin, table in given:
            out[sec].update(table)
            origins.update({f"{sec}.{key}": origin for key in table})
    return out, origins


def apply_preset(merged: dict, origins: dict[str, str], problems: Problems) -> Preset | None:
    """The preset model.preset names, laid under the keys given beside it (in the workload or [defaults]),
    its [moe] too; origins get "preset" for the keys it gives. None without one (or with an unknown one,
    refused naming the presets there are)."""
    model = merged.get("model")
    name = model.get("preset") if isinstance(model, dict) else None
    if not isinstance(name, str):
        return None  # no preset, or a value build_section refuses
    preset, problem = lookup(name)
    if problem:
        problems.refuse("model.preset", problem)
        return None
    for sec, values in (("model", preset.model), ("moe", preset.moe)):
        if not values or not isinstance(merged.get(sec, {}), dict):
            continue  # nothing to lay, or a section that is not a table (refused by build_section)
        given = merged.get(sec, {})
        merged[sec] = {**values, **given}
        origins.update({f"{sec}.{key}": "preset" for key in values if key not in given})
    return preset
