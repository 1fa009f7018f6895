"""Helpers for tests that drive a real `benchsuite run`: its run keys, its ranks' work folders, waiting
for a condition, and loading the records strictly (a partial or corrupt file fails the test)."""

from __future__ import annotations

import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

from benchsuite.config import load_suite
from benchsuite.results.store import Loaded, load_records

CLI = [sys.executable, "-m", "benchsuite.cli"]


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


def run_keys(suite_path: Path, environ=os.environ) -> list[str]:
    """The keys `benchsuite run` measures the suite's runs under here (the threads per rank it would give)."""
    from benchsuite.environment import hardware_identity
    from benchsuite.launch import key_of, thread_plan

    runs = load_suite(suite_path).runs
    hw, threads = hardware_identity(), thread_plan(runs, environ=environ)
    return [key_of(run, hw, threads[run.sweep_id]) for run in runs]


def workdirs(key: str) -> set[Path]:
    return set(Path(tempfile.gettempdir()).glob(f"benchsuite-{key}-*"))


def rank_started(key: str, rank: int, old: set[Path] = frozenset()) -> bool:
    """The rank wrote its pid file in a new work folder of the run (benchsuite-KEY-*): it is running."""
    return any((d / f"pid.{rank}").exists() for d in workdirs(key) - old)


def strict_load(out: Path) -> dict[str, Loaded]:
    """Records (with their files) by run key; a corrupt or partial record would warn, and here that fails the
    test."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        recs = load_records(out)
    assert not [p.name for p in out.glob("*.tmp") if not p.name.startswith(".")], "a visible partial file"
    return {one.record.run_key: one for one in recs}
