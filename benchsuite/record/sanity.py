"""Sanity guard: figures no real run can produce are flagged, never published silently.

A record whose numbers break physics or arithmetic (MFU above 1, throughput above what the
device peak allows, negative or wrapped energy, a step that took no time, a NaN loss) keeps
its status (the run did finish) but carries ``flags``: a list of ``{field, value, reason}``
that `benchsuite report` and the dashboard show beside the status. The worker attaches them
when it writes a record; the loader computes them for records written before this guard.
Scaling efficiency above 1.05 is a figure of several records: results/scaling.py flags it on the
DataFrame row where it computes it (scaling_flag).
"""

from __future__ import annotations

import math
from typing import Any, Callable

from benchsuite.record.values import dig

MFU_MAX = 1.0                 # model FLOP/s above the device's datasheet peak
MFU_VS_CEILING_MAX = 1.05     # above the matmul ceiling measured on the same device, past timing noise
MAX_DEVICE_W = 2000.0         # average power of one GPU, or one node's CPU or DRAM, over a window
SCALING_EFFICIENCY_MAX = 1.05  # N devices doing more than N times one device's work, past timing noise


def _num(v: Any) -> float | None:
    """v as a float when it is a number (bools are not), else None."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v)


def json_value(v: Any) -> Any:
    """A flag's value as JSON allows it: non-finite floats become the strings 'nan', 'inf', '-inf'."""
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    return v


def finite_or_none(obj: Any, other: Callable[[Any], Any] | None = None) -> Any:
    """A copy of obj as strict JSON takes it (records, the dashboard's figure data): every non-finite
    float None, numpy / pandas scalars Python numbers, tuples lists, keys text. Any other value is
    kept, or replaced by other(value) (the dashboard: its text)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): finite_or_none(v, other) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_or_none(v, other) for v in obj]
    if obj is None or isinstance(obj, (str, int)):
        return obj
    if hasattr(obj, "item"):  # numpy / pandas scalar
        return finite_or_none(obj.item(), other)
    return obj if other is None else other(obj)


def _flag(field: str, value: Any, reason: str) -> dict:
    return {"field": field, "value": json_value(value), "reason": reason}


def _metrics_flags(m: dict, world_size: int | None) -> list[dict]:
    flags = []
    mfu = _num(m.get("mfu"))
    if mfu is not None and (not math.isfinite(mfu) or mfu > MFU_MAX):
        flags.append(_flag("metrics.mfu", mfu, f"MFU {mfu:.3g} exceeds {MFU_MAX:g}: the device would be doing "
                                               "more FLOP/s than its datasheet peak"))
    elif mfu is not None and mfu < 0:
        flags.append(_flag("metrics.mfu", mfu, f"MFU {mfu:.3g} is negative: a step time or FLOP count is"
                                               " negative"))
    vs = _num(m.get("mfu_vs_ceiling"))
    if vs is not None and (not math.isfinite(vs) or vs > MFU_VS_CEILING_MAX):
        flags.append(_flag("metrics.mfu_vs_ceiling", vs,
                           f"the run achieved {vs:.3g} x the matmul ceiling measured on the same device (limit "
                           f"{MFU_VS_CEILING_MAX:g}): the ceiling measurement is unreliable (the device was busy "
                           "while it was timed), not the run's step time"))
    elif vs is not None and vs < 0:
        flags.append(_flag("metrics.mfu_vs_ceiling", vs, "a negative share of the matmul ceiling: a step time or "
                                                         "the ceiling is negative"))
    jpt = _num(dig(m, "energy", "j_per_token"))
    if jpt is not None and (not math.isfinite(jpt) or jpt < 0):
        flags.append(_flag("metrics.energy.j_per_token", jpt, "energy per token cannot be negative or unbounded: "
                                                              "an energy counter wrapped or was reset mid-window"))
    tps = _num(m.get("tokens_per_s"))
    per_token = _num(dig(m, "flops", "model_per_token"))
    peak_t = _num(m.get("peak_tflops"))
    if tps is not None and (not math.isfinite(tps) or tps <= 0):
        flags.append(_flag("metrics.tokens_per_s", tps, "throughput must be a positive finite number"))
    elif tps is not None and per_token and peak_t and world_size and world_size > 0:
        achieved = tps * per_token / world_size
        if achieved > peak_t * 1e12 * (1 + 1e-9):
            flags.append(_flag("metrics.tokens_per_s", tps,
                               f"{tps:,.0f} tokens/s x {per_token:.4g} model FLOPs/token over {world_size} "
                               f"device(s) is {achieved / 1e12:.4g} TFLOP/s per device, above the peak "
                               f"{peak_t:g} TFLOP/s"))
    st = m.get("step_time_s")
    for key in ("median", "p10"):
        v = _num(dig(st, key))
        if v is not None and (not math.isfinite(v) or v <= 0):
            flags.append(_flag(f"metrics.step_time_s.{key}", v, "a step cannot take zero, negative or "
                                                                "unbounded time: the timer is broken"))
            break
    return flags


def _energy_figure_flags(where: str, fig: dict, window_s: float | None) -> list[dict]:
    e = _num(fig.get("energy_j"))
    if e is None:
        return []
    if not math.isfinite(e) or e < 0:
        return [_flag(f"{where}.energy_j", e, "energy cannot be negative or unbounded: a counter wrapped or "
                                               "was reset mid-window")]
    w = _num(fig.get("avg_w"))
    if w is None and window_s:
        w = e / window_s
    if w is not None and w > MAX_DEVICE_W:
        return [_flag(f"{where}.avg_w", w, f"average power {w:,.0f} W exceeds {MAX_DEVICE_W:,.0f} W for one "
                                            "device: a counter wrapped or the window is wrong")]
    return []


def _energy_flags(energy: dict) -> list[dict]:
    flags = []
    for key in ("total_j", "gpu_j", "cpu_j", "dram_j"):
        v = _num(energy.get(key))
        if v is not None and (not math.isfinite(v) or v < 0):
            flags.append(_flag(f"energy.{key}", v, "energy cannot be negative or unbounded: a counter wrapped or "
                                                   "was reset mid-window"))
    window_s = _num(energy.get("window_s"))
    window_s = window_s if window_s and math.isfinite(window_s) and window_s > 0 else None
    for i, dev in enumerate(energy.get("per_device") or []):
        if isinstance(dev, dict):
            flags += _energy_figure_flags(f"energy.per_device[{i}]", dev, window_s)
    for i, node in enumerate(energy.get("per_node") or []):
        for part in ("cpu", "dram"):
            if isinstance(node, dict) and isinstance(node.get(part), dict):
                flags += _energy_figure_flags(f"energy.per_node[{i}].{part}", node[part], window_s)
    return flags


def _steps_flags(steps: list) -> list[dict]:
    flags = []
    rows = [s for s in steps if isinstance(s, dict)]
    for key, bad, why in (
            ("time_s", lambda v: not math.isfinite(v) or v <= 0, "a step cannot take zero, negative or unbounded time"),
            ("loss", lambda v: not math.isfinite(v), "the loss is not a finite number: training diverged "
                                                     "(or the figures are corrupt)")):
        hits = [(i, s[key]) for i, s in enumerate(rows) if _num(s.get(key)) is not None and bad(float(s[key]))]
        if hits:
            i, v = hits[0]
            step = rows[i].get("step", i)
            flags.append(_flag(f"steps[{i}].{key}", v, f"{why} ({len(hits)} of {len(rows)} steps, first at step "
                                                      f"{step})"))
    return flags


def sanity_flags(rec: dict) -> list[dict]:
    """Every physically impossible figure of an ok record, as {field, value, reason}; [] when sane."""
    if not isinstance(rec, dict) or rec.get("status") != "ok":
        return []
    world_size = _num(dig(rec, "config", "world_size"))
    flags = []
    if isinstance(rec.get("metrics"), dict):
        flags += _metrics_flags(rec["metrics"], int(world_size) if world_size else None)
    if isinstance(rec.get("energy"), dict):
        flags += _energy_flags(rec["energy"])
    if isinstance(rec.get("steps"), list):
        flags += _steps_flags(rec["steps"])
    return flags


def scaling_flag(efficiency: float, scaling: str, world_size: int, baseline: str) -> dict | None:
    """The flag of a superlinear scaling efficiency (computed across records, so flagged where it is
    computed: results/scaling.py, on a run's medians: results/model.py); None within
    SCALING_EFFICIENCY_MAX, and for 1 device (1-device runs of one config differ by noise, not scaling).
    Field: the DataFrame column."""
    if efficiency <= SCALING_EFFICIENCY_MAX or world_size <= 1:
        return None
    return _flag("scaling_efficiency", efficiency,
                 f"{scaling} scaling efficiency {efficiency:.0%} at {world_size} devices exceeds "
                 f"{SCALING_EFFICIENCY_MAX:.0%} against {baseline}: {world_size} devices cannot do more than "
                 f"{world_size} times the work of one; the runs did not get the same resources (threads, a "
                 "busy machine, clocks) or a timing is wrong")


def _valid_flag(f: Any) -> bool:
    return isinstance(f, dict) and isinstance(f.get("field"), str) and isinstance(f.get("reason"), str)


def with_flags(rec: dict) -> dict:
    """rec with `flags` set: the stored ones (when well formed) plus any this guard finds that they lack,
    so records written before the guard, or by an older one, are flagged on load too."""
    stored = rec.get("flags")
    flags = [f for f in stored if _valid_flag(f)] if isinstance(stored, list) else []
    seen = {f["field"] for f in flags}
    flags += [f for f in sanity_flags(rec) if f["field"] not in seen]
    rec["flags"] = flags
    return rec


def flag_summary(flags: list[dict]) -> str:
    """One line for a terminal or a tooltip: 'field: reason; field: reason'."""
    return "; ".join(f"{f['field']}: {f['reason']}" for f in flags if _valid_flag(f))
