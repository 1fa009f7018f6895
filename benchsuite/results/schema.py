"""The run record: one JSON document per run (DESIGN.md "Record"), and its typed schema.

Versioned so old folders keep loading: a reader upgrades older versions (results/migrate.py)
and skips newer ones. The schema checks types, not just presence, of every field a reader
relies on (the store's DataFrame, the report, the dashboard, the codecarbon export, carbon
projections): numbers are finite numbers or null, lists are lists, sections are objects of
the expected shape. Keys a section does not name are allowed (a newer writer of the same
version may add figures); a known field is one line in the tables below.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

SCHEMA_VERSION = 3
STATUSES = ("ok", "failed")

REQUIRED_FIELDS = ("schema_version", "run_key", "suite", "workload", "status", "error", "started_at",
                   "duration_s", "config", "env", "metrics", "energy", "carbon", "steps")


class RecordError(ValueError):
    """A document that is not a loadable record; the message names the field and the reason."""


def utc_now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def failed_record(run_key: str, config: dict, env: dict, error: dict, started_at: str, duration_s: float,
                  repeat: int = 0) -> dict:
    """A run that did not finish: every figure null, the error says what, where (rank) and why."""
    return {"schema_version": SCHEMA_VERSION, "run_key": run_key, "repeat": repeat, "suite": config["suite"],
            "workload": config["workload"], "status": "failed", "error": error, "started_at": started_at,
            "duration_s": duration_s, "config": config, "env": env, "metrics": None, "energy": None,
            "carbon": None, "steps": []}


# ----------------------------------------------------------------------------- value types

Check = Callable[[Any, str], None]  # raises RecordError naming `where` when the value does not fit


def json_type(v: Any) -> str:
    """A value's type as a record's reader sees it (JSON names: null, bool, int, float, str, list, object)."""
    if v is None:
        return "null"
    if isinstance(v, dict):
        return "object"
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if type(v) is int and not _is_finite_number(v):
        return "an int out of float range"
    return type(v).__name__


def _fail(where: str, expected: str, v: Any) -> None:
    """The type, and a number's value too: "expected an integer >= 0, got int -1" says what is wrong."""
    shown = repr(v) if type(v) in (int, float) and _is_finite_number(v) else ""
    shown = f" {shown[:20]}… ({len(shown)} digits)" if len(shown) > 24 else f" {shown}" if shown else ""
    raise RecordError(f"{where}: expected {expected}, got {json_type(v)}{shown}")


def _is_finite_number(v: Any) -> bool:
    """int or float, not bool, finite, and within float range (readers do float arithmetic on it)."""
    if type(v) not in (int, float):
        return False
    try:
        return math.isfinite(float(v))
    except OverflowError:
        return False


def number(v: Any, where: str) -> None:
    if v is not None and not _is_finite_number(v):
        _fail(where, "a finite number or null", v)


def integer(v: Any, where: str) -> None:
    if v is not None and not (type(v) is int and _is_finite_number(v)):
        _fail(where, "an integer or null", v)


def count(v: Any, where: str) -> None:
    """A positive integer that is never null (world size, nodes): records are grouped and named by it."""
    if not (type(v) is int and 1 <= v < 2**31):
        _fail(where, "a positive integer", v)


def index(v: Any, where: str) -> None:
    """A non-negative integer that is never null (a repeat's index): records are named by it."""
    if not (type(v) is int and 0 <= v < 2**31):
        _fail(where, "an integer >= 0", v)


def pue(v: Any, where: str) -> None:
    """Power usage effectiveness: always stated (default 1.0), never below 1."""
    if not (_is_finite_number(v) and v >= 1):
        _fail(where, "a finite number >= 1", v)


def text(v: Any, where: str) -> None:
    if v is not None and not isinstance(v, str):
        _fail(where, "a string or null", v)


def string(v: Any, where: str) -> None:
    if not isinstance(v, str):
        _fail(where, "a string", v)


def boolean(v: Any, where: str) -> None:
    if v is not None and not isinstance(v, bool):
        _fail(where, "true, false or null", v)


def anything(v: Any, where: str) -> None:
    """A field readers only pass through (still bounded by the loader's depth and text checks)."""


def one_of(*values: str) -> Check:
    def check(v: Any, where: str) -> None:
        if not (isinstance(v, str) and v in values):
            raise RecordError(f"{where}: expected one of {', '.join(values)}, got {v!r:.60}")
    return check


@dataclass(frozen=True)
class ListOf:
    """A list whose items each pass `item`; `length`, where set, is its exact length (ci95: [lo, hi])."""
    item: Check
    length: int | None = None
    nullable: bool = True

    def __call__(self, v: Any, where: str) -> None:
        if v is None and self.nullable:
            return
        if not isinstance(v, list):
            _fail(where, "a list" + (" or null" if self.nullable else ""), v)
        if self.length is not None and len(v) != self.length:
            raise RecordError(f"{where}: expected a list of {self.length} items, got {len(v)}")
        for i, x in enumerate(v):
            self.item(x, f"{where}[{i}]")


@dataclass(frozen=True)
class Obj:
    """An object: the named fields, where present, pass their checks; `required` must be present."""
    fields: dict[str, Check]
    required: tuple[str, ...] = ()
    nullable: bool = True

    def __call__(self, v: Any, where: str) -> None:
        if v is None and self.nullable:
            return
        if not isinstance(v, dict):
            _fail(where, "an object" + (" or null" if self.nullable else ""), v)
        missing = [k for k in self.required if k not in v]
        if missing:
            raise RecordError(f"{where or 'record'}: missing {', '.join(missing)}")
        for key, check in self.fields.items():
            if key in v:
                check(v[key], f"{where}.{key}" if where else key)


def numbers_by_name(v: Any, where: str) -> None:
    """An object of figures keyed by free names (bytes per collective kind, ...)."""
    Obj({})(v, where)
    for key, x in (v or {}).items():
        number(x, f"{where}.{key}")


# ----------------------------------------------------------------------------- the record

NUMBERS = ListOf(number)
TEXTS = ListOf(string)

ERROR = Obj({"type": text, "message": text, "rank": integer, "traceback": text, "log": text})

CONFIG = Obj({
    "suite": text, "workload": text, "kind": text, "description": text, "sweep_id": text,
    "world_size": count, "nodes": count, "scaling": string,
    "parallel": Obj({"tensor": integer, "zero": integer, "expert": integer}),
    "moe": Obj({"router": text, "experts": integer, "every": integer, "capacity_factor": number,
                "expert_hidden": integer, "aux_loss_coef": number, "z_loss_coef": number, "top_k": integer,
                "min_capacity": integer, "shared_experts": integer, "score": text}),
    "model": Obj({"layers": integer, "hidden": integer, "heads": integer, "ffn_hidden": integer, "vocab": integer,
                  "seq_len": integer, "activation": text}),
    "train": Obj({"micro_batch": integer, "steps": integer, "warmup_steps": integer, "grad_accum": integer,
                  "lr": number, "seed": integer, "eval_every": integer, "target_loss": number, "timeout_s": number,
                  "precision": text, "recompute": text, "data": text, "compile": boolean}),
    "energy": Obj({"idle_baseline_s": number, "min_window_s": number}),
    "carbon": Obj({"pue": pue, "intensity_g_per_kwh": number, "country": text, "region": text}),
}, required=("world_size", "nodes", "scaling"), nullable=False)

DEVICE = Obj({"rank": integer, "node_rank": integer, "host": text, "type": text, "name": text, "uuid": text,
              "index": integer, "cpu_threads": integer})
ENV = Obj({
    "hosts": TEXTS, "nodes": integer, "world_size": integer, "backend": text,
    "devices": ListOf(DEVICE), "torch": text, "cuda": text, "nccl": text, "driver": text, "python": text,
    "git_commit": text, "os": text, "cpu_count": integer, "cpu_model": text, "ram_total_gb": number,
    "hardware": Obj({}),
}, nullable=False)

STEP_TIME = Obj({"median": number, "p10": number, "p90": number, "n": integer, "ci95": ListOf(number, length=2)})
PER_WORK = Obj({"j_per_token": number, "j_per_pflop": number, "avg_w_per_device": number, "gco2e_per_mtok": number,
                "energy_source": text, "energy_includes": TEXTS})
MEMORY_PARTS = Obj({"params": number, "grads": number, "optimizer": number, "total": number})
MEMORY = Obj({
    "peak_allocated_bytes": number, "peak_reserved_bytes": number, "source": text,
    "per_rank": ListOf(Obj({"peak_allocated_bytes": number, "peak_reserved_bytes": number,
                            "peak_rss_bytes": number, "source": text})),
    "model_state_bytes": Obj({"measured": MEMORY_PARTS, "analytic": MEMORY_PARTS, "formula": text, "method": text,
                              "K": number, "N": number, "ratio": number}),
    "activation_estimate_bytes": Obj({"none": number, "selective": number, "full": number}),
})
MOE = Obj({"dropped_frac": number, "padding_frac": number, "load_max_over_mean": number, "aux_loss": number,
           "z_loss": number, "all_to_all_share": number, "expert_impl": text, "source": text, "upgraded_from": text,
           "expert_load": ListOf(NUMBERS), "tokens_per_expert": ListOf(NUMBERS),  # [MoE layer][expert]
           "tokens_per_expert_max": number, "tokens_per_expert_mean": number,
           "imbalance_by_step": NUMBERS, "imbalance_mean": number, "imbalance_max": number})
QUALITY = Obj({
    **{k: number for k in ("target_loss", "step", "tokens", "seconds", "model_flops", "energy_j", "co2e_g",
                           "best_val_loss", "final_val_loss", "initial_val_loss", "eval_seconds", "eval_energy_j",
                           "best_step", "reached_step", "eval_count", "eval_every", "eval_tokens", "eval_rows")},
    "reached": boolean, "reason": text, "energy_reason": text, "energy_source": text,
    "curve": ListOf(Obj({k: number for k in ("step", "tokens", "seconds", "val_loss", "energy_j", "model_flops")})),
})
COMM = Obj({"total_bytes_per_step": number, "paper_bytes_per_step": number, "ratio": number, "paper_formula": text,
            "method": text, "bytes_per_step_by_kind": numbers_by_name, "per_rank_total_bytes": NUMBERS,
            "all_to_all_bytes_by_step": Obj({"mean": number, "min": number, "max": number, "per_rank_mean": NUMBERS,
                                             "steps": integer, "source": text}),
            "all_to_all_bytes_by_step_reason": text})
METRICS = Obj({
    **{k: number for k in ("tokens_per_s", "tokens_per_step", "mfu", "mfu_vs_ceiling", "tflops_per_device",
                           "matmul_ceiling_tflops", "peak_tflops",
                           "j_per_token", "j_per_pflop", "avg_w_per_device", "gco2e_per_mtok")},
    "peak_source": text, "precision": text, "speed_valid": boolean,
    "step_time_s": STEP_TIME,
    "flops": Obj({"model_per_token": number, "executed_per_token": number, "counted_per_token": number,
                  "counted_source": text}),
    "params": Obj({"total": number, "active": number, "non_embedding": number}),
    "per_rank": Obj({"step_time_median_s": NUMBERS, "straggler_ratio": number}),
    "memory": MEMORY, "moe": MOE, "quality": QUALITY, "comm": COMM,
    "energy": PER_WORK, "derived": PER_WORK, "implementation": Obj({}),
})

PART_ENERGY = Obj({"energy_j": number, "avg_w": number, "idle_w": number, "above_idle_j": number,
                   "sampled_energy_j": number, "source": text, "reason": text, "reading_rank": integer})
ENERGY = Obj({
    **{k: number for k in ("gpu_j", "cpu_j", "dram_j", "total_j", "window_s", "idle_w", "above_idle_j")},
    "source": text, "sources": Obj({"gpu": text, "cpu": text, "dram": text}), "total_includes": TEXTS,
    "short_window": boolean, "reasons": TEXTS,
    "per_device": ListOf(Obj({"uuid": text, "name": text, "host": text, "type": text, "ranks": ListOf(integer),
                              "energy_j": number, "avg_w": number, "source": text, "reason": text,
                              "reading_rank": integer})),
    "per_node": ListOf(Obj({"host": text, "ranks": ListOf(integer), "cpu": PART_ENERGY, "dram": PART_ENERGY})),
})
CARBON = Obj({"kwh": number, "pue": pue, "intensity_g_per_kwh": number, "co2e_g": number,
              "intensity_source": text, "intensity_note": text, "energy_source": text})
STEP = Obj({"step": number, "time_s": number, "loss": number, "val_loss": number, "tokens": number}, nullable=False)

RECORD = Obj({
    "schema_version": integer, "run_key": string, "suite": string, "workload": string, "status": one_of(*STATUSES),
    "repeat": index,  # optional (absent: 0), see below
    "error": ERROR, "started_at": string, "duration_s": number, "config": CONFIG, "env": ENV,
    "metrics": METRICS, "energy": ENERGY, "carbon": CARBON, "steps": ListOf(STEP, nullable=False),
    "flags": anything,  # re-derived on load by the sanity guard, which keeps only well-formed stored flags
}, required=REQUIRED_FIELDS, nullable=False)
# `repeat` (optional; absent: 0): which measurement of its run the record is, 0 to N-1 of `run --repeat N`.
# Repeats share the run key (one run identity) and are told apart by it (results/store.record_id).


def check_version(rec: Any) -> int:
    """The record's schema_version, when this benchsuite can read (or upgrade) it."""
    if not isinstance(rec, dict):
        raise RecordError(f"not a JSON object (got {json_type(rec)})")
    version = rec.get("schema_version")
    if type(version) is not int or version < 1:
        _fail("schema_version", "a positive integer", version)
    if version > SCHEMA_VERSION:
        raise RecordError(f"schema_version {version} is newer than this benchsuite reads ({SCHEMA_VERSION}); "
                          "upgrade benchsuite")
    return version


def validate(rec: Any) -> None:
    """Raises RecordError naming the first field whose type or shape does not fit the schema."""
    check_version(rec)
    RECORD(rec, "")


def check_record(rec: Any) -> str | None:
    """None when rec is a valid record of a version this benchsuite reads; else why not."""
    try:
        validate(rec)
    except RecordError as e:
        return str(e)
    return None
