"""Sanity guard: figures no real run can produce are flagged, never published silently.

One rule: every figure with a physical sign or bound declares it in its record type (record/types.py
`Bound`: energy, power, CO2e, grid intensity, FLOPs, MFU and HFU in [0, 1], fractions in [0, 1],
losses, times, bytes), and each value outside it is flagged; two figures of several fields add to it
(throughput above what the device peak allows, power implied by energy over the window). A record
whose numbers break physics or arithmetic keeps its status (the run did finish) but carries ``flags``: a list of ``{field, value, reason}``
that `benchsuite report` and the dashboard show beside the status. The worker attaches them
when it writes a record; the loader computes them for records written before this guard.
Scaling efficiency above 1.05 is a figure of several records: results/scaling.py flags it on the
DataFrame row where it computes it (scaling_flag).
"""

from __future__ import annotations

import functools
import math
import re
import sys
from dataclasses import dataclass
from types import UnionType
from typing import Annotated, Any, Callable, Union, get_args, get_origin, get_type_hints

import msgspec

from benchsuite.record.types import MAX_DEVICE_W, Bound, Record
from benchsuite.record.values import dig

MAX_DROPPED_FRAC = 0.10  # MoE assignments dropped over capacity before a run's speed is no longer the model's
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


_NUMBER = (float, int)  # a bool's class is bool: never a figure
Check = Callable[[Any], "list[dict] | None"]  # a value -> its flags (fields relative to it), None when sane


@dataclass(frozen=True)
class _Leaf:
    """A Bound as two thresholds: `low <= v <= high` holds exactly for a finite figure inside the range
    (nextafter makes "above low" inclusive; a relative 1e-9 of slack absorbs rounding)."""

    bound: Bound
    low: float
    high: float

    @classmethod
    def of(cls, b: Bound) -> _Leaf:
        low = -sys.float_info.max if b.low is None else (
            math.nextafter(b.low, math.inf) if b.above_low else b.low - 1e-9 * max(1.0, abs(b.low)))
        high = sys.float_info.max if b.high is None else b.high + 1e-9 * max(1.0, abs(b.high))
        return cls(b, low, high)

    def flag(self, v: float, field: str) -> dict:
        b, v = self.bound, float(v)
        if not math.isfinite(v):
            broken = f"{b.label} is not a finite number"
        elif v < self.low:
            broken = f"{b.label} {v:.4g} is {'not above' if b.above_low else 'below'} {b.low:g}"
        else:
            broken = f"{b.label} {v:.4g} exceeds {b.high:g}"
        return _flag(field, v, f"{broken}: {b.why}")


def _prefixed(prefix: str, flag: dict) -> dict:
    rest = flag["field"]
    flag["field"] = prefix if not rest else prefix + rest if rest.startswith("[") else f"{prefix}.{rest}"
    return flag


def _struct_check(leaves: list[tuple[str, _Leaf]], nested: list[tuple[str, Check]]) -> Check:
    def check(value):
        if value.__class__ is not dict:
            return None
        out = None
        for name, leaf in leaves:
            v = value.get(name)
            if v.__class__ in _NUMBER and not leaf.low <= v <= leaf.high:
                out = (out or []) + [leaf.flag(v, name)]
        for name, child in nested:
            v = value.get(name)
            found = None if v is None else child(v)
            if found:
                out = (out or []) + [_prefixed(name, f) for f in found]
        return out

    check.leaves = None if nested else leaves  # a struct of figures alone: a list of them is checked in one loop
    return check


def _item(key) -> str:
    return f"[{key}]" if key.__class__ is int else str(key)


def _items_check(child: _Leaf | Check) -> Check:
    """Every item of a list (field[i]) or a dict (field.key); one flag per field across the items."""
    leaves = getattr(child, "leaves", None)
    bounds = [(name, leaf.low, leaf.high) for name, leaf in leaves] if leaves else None

    def check(value):
        if value.__class__ is list:
            pairs = enumerate(value)
        elif value.__class__ is dict:
            pairs = value.items()
        else:
            return None
        found = []
        if isinstance(child, _Leaf):
            found += [child.flag(v, _item(key)) for key, v in pairs
                      if v.__class__ in _NUMBER and not child.low <= v <= child.high]
        elif bounds is not None:  # (a list of steps: a call per step would be most of a record's check)
            for key, v in pairs:
                if v.__class__ is dict:
                    for name, low, high in bounds:
                        x = v.get(name)
                        if x.__class__ in _NUMBER and not low <= x <= high:
                            found += [_prefixed(_item(key), f) for f in child(v)]
                            break
        else:
            for key, v in pairs:
                found += [_prefixed(_item(key), f) for f in (None if v is None else child(v)) or ()]
        return _first_of_each(found, len(value)) if found else None

    return check


def _compile(tp: Any) -> _Leaf | Check | None:
    """What the rule checks in a value of type tp, from the Bounds its annotations declare (None: nothing)."""
    origin, args = get_origin(tp), get_args(tp)
    if origin is Annotated:
        bound = next((m for m in args[1:] if isinstance(m, Bound)), None)
        return _Leaf.of(bound) if bound is not None else _compile(args[0])
    if origin in (Union, UnionType):
        return next((c for c in map(_compile, args) if c is not None), None)
    if origin in (list, dict):
        inner = _compile(args[-1])
        return None if inner is None else _items_check(inner)
    if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
        children = {name: _compile(hint) for name, hint in get_type_hints(tp, include_extras=True).items()}
        return _struct_check([(n, c) for n, c in children.items() if isinstance(c, _Leaf)],
                             [(n, c) for n, c in children.items() if c is not None and not isinstance(c, _Leaf)])
    return None


@functools.cache
def _record_check() -> Check:
    return _compile(Record)


def _first_of_each(found: list[dict], n: int) -> list[dict]:
    """One flag per field across a list's items (the first), counting the items that break it: a diverged run
    has one flag for its losses, not one per step."""
    by_field: dict[str, list[dict]] = {}
    for f in found:
        by_field.setdefault(re.sub(r"\[\d+\]", "[]", f["field"]), []).append(f)
    out = []
    for flags in by_field.values():
        first = flags[0]
        if len(flags) > 1:
            first = {**first, "reason": f"{first['reason']} ({len(flags)} of {n} items; the first shown)"}
        out.append(first)
    return out


def _throughput_flags(m: dict, world_size: int | None) -> list[dict]:
    """Throughput that implies more FLOP/s per device than the device's peak."""
    tps, per_token, peak_t = _num(m.get("tokens_per_s")), _num(dig(m, "flops", "model_per_token")), \
        _num(m.get("peak_tflops"))
    if not (tps and per_token and peak_t and world_size) or min(tps, per_token, peak_t) <= 0 or \
            not math.isfinite(tps * per_token):
        return []
    achieved = tps * per_token / world_size
    if achieved <= peak_t * 1e12 * (1 + 1e-9):
        return []
    return [_flag("metrics.tokens_per_s", tps,
                  f"{tps:,.0f} tokens/s x {per_token:.4g} model FLOPs/token over {world_size} device(s) is "
                  f"{achieved / 1e12:.4g} TFLOP/s per device, above the peak {peak_t:g} TFLOP/s")]


def _implied_power_flags(energy: dict) -> list[dict]:
    """A device's energy over the window that implies more than MAX_DEVICE_W where no average power is stored."""
    window_s = _num(energy.get("window_s"))
    if not window_s or not math.isfinite(window_s) or window_s <= 0:
        return []
    flags = []
    for i, dev in enumerate(energy.get("per_device") or []):
        e = _num(dev.get("energy_j")) if isinstance(dev, dict) else None
        if e is not None and _num(dev.get("avg_w")) is None and math.isfinite(e) and e / window_s > MAX_DEVICE_W:
            flags.append(_flag(f"energy.per_device[{i}].avg_w", e / window_s,
                               f"average power {e / window_s:,.0f} W (energy over the window) exceeds "
                               f"{MAX_DEVICE_W:,.0f} W for one device: a counter wrapped or the window is wrong"))
    return flags


def _dropped_flags(metrics: dict) -> list[dict]:
    """An MoE run whose routers dropped more than MAX_DROPPED_FRAC of the assignments: the dropped tokens
    skipped their experts, so its speed is not the model's and it is no like-for-like comparison."""
    dropped = _num(dig(metrics, "moe", "dropped_frac"))
    if dropped is None or not MAX_DROPPED_FRAC < dropped <= 1:
        return []
    return [_flag("metrics.moe.dropped_frac", dropped,
                  f"{dropped:.0%} of the token assignments were dropped (over the experts' capacity, above "
                  f"{MAX_DROPPED_FRAC:.0%}): they skipped their experts, so the run's tok/s and FLOP/s are not the "
                  f"model's; compare it only with runs that drop as much, or raise moe.capacity_factor (0: dropless)")]


def sanity_flags(rec: dict) -> list[dict]:
    """Every figure of an ok record outside its physical range (the Bound its record type declares:
    energy, power, CO2e, FLOPs, MFU and HFU, fractions, losses, times), plus throughput above the device's
    peak and power implied by energy over the window; each {field, value, reason}; [] when sane."""
    if not isinstance(rec, dict) or rec.get("status") != "ok":
        return []
    flags: list[dict] = _record_check()(rec) or []
    world_size = _num(dig(rec, "config", "world_size"))
    if isinstance(rec.get("metrics"), dict) and not any(f["field"] == "metrics.tokens_per_s" for f in flags):
        flags += _throughput_flags(rec["metrics"], int(world_size) if world_size else None)
    if isinstance(rec.get("metrics"), dict) and not any(f["field"] == "metrics.moe.dropped_frac" for f in flags):
        flags += _dropped_flags(rec["metrics"])
    if isinstance(rec.get("energy"), dict):
        seen = {f["field"] for f in flags}
        flags += [f for f in _implied_power_flags(rec["energy"]) if f["field"] not in seen]
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
