"""One [[workload]] read from its table and the layers under it: keys merged, preset laid, sections built,
key rules applied and every rule that holds at any world size checked."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from benchsuite.config.key_rules import BuiltWorkload, apply_rules
from benchsuite.config.merging import Layers, apply_preset, merge_sections
from benchsuite.config.presets import Preset
from benchsuite.config.problems import Problems, qkey, show
from benchsuite.config.rules import check_workload
from benchsuite.record.sections import SECTIONS
from benchsuite.config.specs import read_section
from benchsuite.config.sweeps import sweep_lists

WORKLOAD_KEYS = {"name", "kind", "description", "sweep", *SECTIONS}


@dataclass
class WorkloadDraft:
    """One workload as read: its sections, where each key came from, its own sweep lists and its part of the
    problems (where it is written and the keys refused), which the checks after parsing read too."""

    name: str
    kind: str
    description: str
    sections: dict[str, Any]
    origins: dict[str, str]
    sweep: dict[str, list]
    problems: Problems


def _kind(raw: dict, preset: Preset | None, merged: dict, problems: Problems) -> str:
    """The workload's kind: given, else its preset's, else dense; a bad one is refused and the rest is
    checked as the file reads."""
    kind = raw.get("kind", preset.kind if preset else "dense")
    if kind not in ("dense", "moe"):
        problems.refuse("kind", f"must be 'dense' or 'moe', got {show(kind)}")
        return "moe" if "moe" in raw else "dense"
    if kind != "moe" and "moe" in raw:
        problems.add("moe", "a [moe] table needs kind = \"moe\"")
    elif kind != "moe" and preset and preset.kind == "moe":
        problems.add("kind", f"model.preset = {merged['model']['preset']!r} is a mixture of experts: set kind = "
                             f"\"moe\" (or leave kind out)")
    return kind


def _description(raw: dict, problems: Problems) -> str:
    description = raw.get("description", "")
    if not isinstance(description, str):
        problems.add("description", "expected a string")
        return ""
    return description


def read_workload(raw: dict, name: str, layers: Layers, problems: Problems) -> WorkloadDraft:
    """The workload `raw` (named `name`, its problems under problems.where) over the suite's layers; the
    suite-level values that were refused stay refused unless the workload replaces them."""
    for key in raw:
        if key not in WORKLOAD_KEYS:
            problems.add(qkey(key), f"unknown key; valid keys: {', '.join(sorted(WORKLOAD_KEYS))}")
    merged, origins = merge_sections(layers, raw)
    problems.refused |= {key for key in layers.refused if key not in origins}
    preset = apply_preset(merged, origins, problems)
    kind = _kind(raw, preset, merged, problems)
    description = _description(raw, problems)
    sections = {sec: read_section(cls, merged.get(sec, {}), sec, problems) for sec, cls in SECTIONS.items()
                if sec != "moe" or kind == "moe"}
    sweep = sweep_lists(raw.get("sweep"), problems)
    problems.refused -= {f"sweep.{key}" for key in sweep}  # its own list replaces a refused suite-level one
    apply_rules(BuiltWorkload(kind, sections, seed_swept="seed" in {**layers.sweep, **sweep}), origins, problems,
                layers.inherited)
    check_workload(sections, problems)
    return WorkloadDraft(name, kind, description, sections, origins, sweep, problems)
