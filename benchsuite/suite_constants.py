"""Figures that stay constant on a host while one suite runs (a device's matmul ceiling at a
precision, idle power), measured by the first run that needs them and reused by the later runs.

Measuring them in every run made each run seconds longer (the GPU ceiling alone takes 3 s) and
told nothing new. A reused figure says where it came from: the run that measured it and when.
The launcher makes one folder per suite and names it in each run's run.json; a figure is one JSON
file there, written atomically, so a run killed while measuring leaves nothing behind and the next
run measures afresh. A rank started without that folder (no launcher) measures every time.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from benchsuite.atomic import atomic_file
from benchsuite.record import utc_now
from benchsuite.record.names import digest


@dataclass(frozen=True)
class Reuse:
    """Where a reused figure came from."""

    run: str  # the record name of the run that measured it
    at: str  # when (UTC, ISO 8601)

    def label(self) -> str:
        return f"measured once for this suite by run {self.run} at {self.at}, reused"


@dataclass(frozen=True)
class SuiteConstants:
    """One suite's measured constants (folder None: nothing is kept, every call measures)."""

    folder: Path | None
    run: str  # the record name of the run asking, named as the measurer of what it measures

    def reuse_or_measure(self, kind: str, key: dict, measure: Callable[[], dict]) -> tuple[dict, Reuse | None]:
        """(figure, None) just measured, or (figure, where it came from) when an earlier run of the
        suite measured it under the same key (kind and key name everything the figure depends on)."""
        if self.folder is None:
            return measure(), None
        path = self.folder / f"{kind}-{digest(key)}.json"
        try:
            doc = json.loads(path.read_text())
            if doc["key"] == key:
                return doc["value"], Reuse(doc["run"], doc["at"])
        except (OSError, ValueError, KeyError, TypeError):  # not measured yet, or unreadable: measure
            pass
        value = measure()
        with atomic_file(path, "w", encoding="utf-8", durable=False) as f:
            json.dump({"key": key, "value": value, "run": self.run, "at": utc_now()}, f)
        return value, None


def ranks_on_this_node() -> int:
    """Ranks that share this node (torchrun's LOCAL_WORLD_SIZE): they measure at the same time, so a
    figure measured beside 7 other ranks is not the one measured alone."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", "1"))


NOT_SHARED = SuiteConstants(None, "")  # a rank outside a suite (tests, a direct call): it measures every figure
