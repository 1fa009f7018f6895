"""What a record is called: its id among the repeats of its run, and its file name."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any


def digest(value: Any, length: int = 16) -> str:
    """A short content hash of a JSON value (keys sorted): run keys, identities, cached figures' names."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:length]


def slug(text: str, limit: int = 40) -> str:
    """A file-name-safe form of a user-given name (the name itself stays in the record)."""
    s = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.")
    return (s or "x")[:limit]


def record_id(run_key: str, repeat: int) -> str:
    """What tells a record from the other repeats of its run (file, lock and resume names): the run
    key, with -rN for repeat N >= 1. Repeat 0 is the bare run key, as records were named before repeats."""
    return run_key if repeat == 0 else f"{run_key}-r{repeat}"


def repeat_of(rec: dict) -> int:
    """The record's repeat index; 0 for a record written before repeats (it has no `repeat` field)."""
    return rec.get("repeat") or 0


def record_filename(rec: dict) -> str:
    """suite__workload__w2n1-weak-seed1__<run key>-r1.json: the run, its seed and its repeat (the logs
    of its ranks are named after it)."""
    cfg = rec["config"]
    seed = (cfg.get("train") or {}).get("seed")
    return (f"{slug(rec['suite'])}__{slug(rec['workload'])}__w{cfg['world_size']}n{cfg['nodes']}"
            f"-{cfg['scaling']}-seed{seed if isinstance(seed, int) else 0}"
            f"__{record_id(rec['run_key'], repeat_of(rec))}.json")


def record_name(base: str, seed: int, repeat: int) -> str:
    """'dense · w2 · seed 1 · repeat 0': a record named by its run, seed and repeat."""
    return f"{base} · seed {seed} · repeat {repeat}"
