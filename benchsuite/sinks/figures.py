"""What a tracker receives of a record: its figures (every finite number of its metrics, energy and carbon, under
the record's own dotted field names), its config and facts as parameters, and each measured step's loss,
time and throughput. The same names in every tracker, so a figure is found under the name the record gives it."""

from __future__ import annotations

import json
import math
from typing import Any

import msgspec

from benchsuite.record.types import Record

FIGURE_SECTIONS = ("metrics", "energy", "carbon")


def _numbers(value: Any, prefix: str) -> dict[str, float]:
    """Each finite number under value (nested tables walked, lists left out) by its dotted path."""
    if isinstance(value, dict):
        out = {}
        for key, inner in value.items():
            out.update(_numbers(inner, f"{prefix}.{key}"))
        return out
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return {prefix: float(value)}
    return {}


def figures(record: Record) -> dict[str, float]:
    """'metrics.tokens_per_s' → 35519.2, 'energy.gpu.joules' → …, 'duration_s' → …: the record's figures."""
    out = {}
    for section in FIGURE_SECTIONS:
        out.update(_numbers(msgspec.to_builtins(getattr(record, section)), section))
    if record.duration_s is not None:
        out["duration_s"] = float(record.duration_s)
    return out


def params(record: Record, path: str | None = None) -> dict[str, str]:
    """The run's config by dotted key ('config.model.layers' → '2', JSON for anything but text) and the facts
    that name the record: its run key, suite, workload, status, repeat and file."""
    out = {"run_key": record.run_key, "suite": record.suite, "workload": record.workload,
           "status": record.status.value, "repeat": str(record.repeat)}
    if path is not None:
        out["record"] = str(path)

    def walk(value: Any, prefix: str) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                walk(inner, f"{prefix}.{key}")
        elif value is not None:
            out[prefix] = value if isinstance(value, str) else json.dumps(value)

    walk(msgspec.to_builtins(record.config), "config")
    return out


def step_rows(record: Record) -> list[tuple[int, dict[str, float]]]:
    """(step, {'train.loss', 'train.step_time_s', 'train.tokens_per_s', 'train.val_loss'}) for each measured
    step, with the figures it has."""
    rows = []
    for s in record.steps:
        row = {"train.loss": s.loss, "train.step_time_s": s.time_s, "train.val_loss": s.val_loss,
               "train.tokens_per_s": s.tokens / s.time_s if s.tokens and s.time_s else None}
        rows.append((s.step, {k: float(v) for k, v in row.items() if v is not None and math.isfinite(v)}))
    return rows
