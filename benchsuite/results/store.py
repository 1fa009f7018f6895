"""Run records on disk: atomic writes, tolerant loading, one flat DataFrame."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import pandas as pd

from benchsuite.atomic import atomic_file
from benchsuite.metrics.scaling import add_scaling_efficiency, scaling_identity
from benchsuite.results.sanity import flag_summary, with_flags
from benchsuite.results.schema import check_record
from benchsuite.results.values import dig


def slug(text: str, limit: int = 40) -> str:
    """A file-name-safe form of a user-given name (the name itself stays in the record)."""
    s = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.")
    return (s or "x")[:limit]


def record_filename(rec: dict) -> str:
    cfg = rec["config"]
    return (f"{slug(rec['suite'])}__{slug(rec['workload'])}__w{cfg['world_size']}n{cfg['nodes']}"
            f"-{cfg['scaling']}__{rec['run_key']}.json")


def write_record(out_dir: str | Path, rec: dict) -> Path:
    """Written atomically: a reader sees the old record or the whole new one, never a partial
    record, even if this process is killed mid-write."""
    final = Path(out_dir) / record_filename(rec)
    data = json.dumps(rec, indent=1, sort_keys=True, allow_nan=False)
    try:
        with atomic_file(final, "w", encoding="utf-8") as f:
            f.write(data)
    except OSError as e:  # disk full, quota, file too large: name the record, keep the errno
        raise OSError(e.errno, f"cannot write record {final}: {e.strerror or e}") from e
    return final


def load_records(path: str | Path) -> list[dict]:
    """Every readable record under path (a folder, searched recursively, or one file).
    Unreadable, corrupt or newer-schema files are skipped with a warning naming them."""
    path = Path(path)
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*.json") if not p.name.startswith("."))
    records = []
    for p in files:
        try:
            rec = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            warnings.warn(f"skipping {p}: not a readable record ({e})", stacklevel=2)
            continue
        problem = check_record(rec)
        if problem:
            warnings.warn(f"skipping {p}: {problem}", stacklevel=2)
            continue
        rec["_path"] = str(p)
        records.append(with_flags(rec))  # records written before the sanity guard are flagged on load
    return records


def ok_run_keys(path: str | Path) -> set[str]:
    if not Path(path).exists():
        return set()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {r["run_key"] for r in load_records(path) if r["status"] == "ok"}


def _dotted(d: dict, prefix: str = ""):
    """(dotted key, value) for every leaf of nested dicts."""
    for k, v in d.items():
        if isinstance(v, dict) and v:
            yield from _dotted(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v


def flatten(rec: dict) -> dict:
    """One DataFrame row: identity and the headline figures under short names, and every
    scalar of metrics/energy/carbon under dotted names (metrics.flops.model_per_token, ...)."""
    cfg, m, err = rec["config"], rec.get("metrics") or {}, rec.get("error") or {}
    row = {
        "run_key": rec["run_key"], "suite": rec["suite"], "workload": rec["workload"], "status": rec["status"],
        "kind": cfg.get("kind"), "router": dig(cfg, "moe", "router"), "description": cfg.get("description", ""),
        "world_size": cfg["world_size"], "nodes": cfg["nodes"], "scaling": cfg["scaling"],
        "sweep_id": cfg.get("sweep_id"), "tensor": dig(cfg, "parallel", "tensor"),
        "zero": dig(cfg, "parallel", "zero"), "expert": dig(cfg, "parallel", "expert"),
        "started_at": rec["started_at"], "duration_s": rec["duration_s"],
        "error_type": err.get("type"), "error_message": err.get("message"), "error_rank": err.get("rank"),
        "tokens_per_s": m.get("tokens_per_s"), "mfu": m.get("mfu"),
        "step_time_median_s": dig(m, "step_time_s", "median"),
        "step_time_ci95_lo_s": (dig(m, "step_time_s", "ci95") or [None, None])[0],
        "step_time_ci95_hi_s": (dig(m, "step_time_s", "ci95") or [None, None])[1],
        "path": rec.get("_path"),
        # sanity guard (results/sanity.py): physically impossible figures, shown beside the status
        "flagged": bool(rec.get("flags")), "flags": list(rec.get("flags") or []),
        "flag_summary": flag_summary(rec.get("flags") or []) or None,
        **scaling_identity(rec),  # what a scaling baseline must share with this run (metrics/scaling.py)
    }
    quality = m.get("quality")
    if isinstance(quality, dict):  # to-target figures (metrics/quality.py) under short names
        for key in ("target_loss", "reached", "step", "tokens", "seconds", "model_flops", "energy_j", "co2e_g",
                    "reason", "best_val_loss", "final_val_loss", "eval_seconds", "eval_energy_j"):
            row[f"quality.{key}"] = quality.get(key)
    for section in ("metrics", "energy", "carbon"):
        for k, v in _dotted(rec.get(section) or {}):
            if v is None or isinstance(v, (int, float, str, bool)):
                row[f"{section}.{k}"] = v
    return row


def records_dataframe(path: str | Path) -> pd.DataFrame:
    """All records under path as one DataFrame, with scaling efficiency per sweep."""
    rows = [flatten(r) for r in load_records(path)]
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    return add_scaling_efficiency(df.sort_values(["suite", "workload", "world_size", "started_at"],
                                                 ignore_index=True))
