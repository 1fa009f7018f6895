"""What a tracker receives of a record: its figures (every finite number of its metrics, energy and carbon, under
the record's own dotted field names), its config and facts as parameters, and each measured step's loss,
time and throughput. The same names in every tracker, so a figure is found under the name the record gives it."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

import msgspec

from benchsuite.record.types import Record

FIGURE_SECTIONS = ("metrics", "energy", "carbon")


def _leaves(value: Any, prefix: str) -> Iterator[tuple[str, Any]]:
    """(dotted path, value) of each leaf under value: nested tables walked, anything else a leaf."""
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from _leaves(inner, f"{prefix}.{key}")
    else:
        yield prefix, value


def figures(record: Record) -> dict[str, float]:
    """'metrics.tokens_per_s' → 35519.2, 'energy.gpu.joules' → …, 'duration_s' → …: the record's figures."""
    out = {}
    for section in FIGURE_SECTIONS:
        out.update({path: float(v) for path, v in _leaves(msgspec.to_builtins(getattr(record, section)), section)
                    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)})
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
    out.update({path: v if isinstance(v, str) else json.dumps(v)
                for path, v in _leaves(msgspec.to_builtins(record.config), "config") if v is not None})
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
