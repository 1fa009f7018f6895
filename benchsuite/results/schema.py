"""The run record: one JSON document per run (DESIGN.md "Record"). Versioned so old
folders keep loading: a reader migrates older versions and skips newer ones."""

from __future__ import annotations

import datetime as dt

SCHEMA_VERSION = 1

REQUIRED_FIELDS = ("schema_version", "run_key", "suite", "workload", "status", "error", "started_at",
                   "duration_s", "config", "env", "metrics", "energy", "carbon", "steps")


def utc_now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def failed_record(run_key: str, config: dict, env: dict, error: dict, started_at: str, duration_s: float) -> dict:
    """A run that did not finish: every figure null, the error says what, where (rank) and why."""
    return {"schema_version": SCHEMA_VERSION, "run_key": run_key, "suite": config["suite"],
            "workload": config["workload"], "status": "failed", "error": error, "started_at": started_at,
            "duration_s": duration_s, "config": config, "env": env, "metrics": None, "energy": None,
            "carbon": None, "steps": []}


def check_record(rec: object) -> str | None:
    """None when rec can be loaded; else why not."""
    if not isinstance(rec, dict):
        return "not a JSON object"
    missing = [k for k in REQUIRED_FIELDS if k not in rec]
    if missing:
        return f"missing fields: {', '.join(missing)}"
    version = rec["schema_version"]
    if not isinstance(version, int) or version < 1:
        return f"bad schema_version {version!r}"
    if version > SCHEMA_VERSION:
        return f"schema_version {version} is newer than this benchsuite reads ({SCHEMA_VERSION}); upgrade benchsuite"
    if rec["status"] not in ("ok", "failed"):
        return f"bad status {rec['status']!r}"
    return None
