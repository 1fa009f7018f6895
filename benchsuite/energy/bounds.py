"""How far an energy figure can be from the truth: an interval and its parts, each with its source.

Pure, over the record's figure dicts (energy.per_device[i], energy.per_node[i].cpu / .dram), so the
worker, `benchsuite.measure()` and the migration of an older record (which holds every input) compute
the same bound. Each part is a half-width in joules; the interval is the figure ± their sum (the parts
are added, not combined in quadrature: the sensor's calibration error is systematic, not random).

A part the vendor states no figure for (RAPL's accuracy) is named with j = null: the bound then
covers what is known and says what it leaves out.
"""

from __future__ import annotations

from typing import Any

from benchsuite.energy.common import sum_or_none
from benchsuite.record.kinds import source_kind
from benchsuite.record.types import MAX_DEVICE_W

# The share of its figure beyond which a bound is flagged: two runs closer than this cannot be told
# apart by the meters (the field compares configurations a few percent apart).
BOUND_SHARE = 0.02

SHARE_REASON = "the meters' bound is"
SHORT_REASON = ("a window was shorter than energy.min_window_s (energy.short_window): the counters, updated about "
                "every 100 ms, cannot resolve it")

# NVML's total-energy counter: millijoules, advanced about every 100 ms (10 updates/s measured on an
# H200, benchmarks/NOTES.md). A window edge read between updates is up to one period stale.
NVML_UPDATE_S = 0.1
NVML_RESOLUTION_J = 1e-3
# nvidia-smi --help-query-gpu, power.draw: "accurate to within +/- 5 watts" (the sensor the counter
# integrates, so it bounds both the counter and sampled power).
NVML_ACCURACY_W = 5.0
ACCURACY_SOURCE = "NVIDIA nvidia-smi documentation, power.draw: accurate to within ±5 W"
# Yang, Adamek, Armour 2024 ("Part-time power measurements: nvidia-smi's lack of attention", SC24): on
# A100 and H100 the power sensor averages 25 % of each period; the other 75 % is never seen.
SAMPLED_COVERAGE = 0.25
COVERAGE_SOURCE = ("Yang et al. 2024 (SC24): A100/H100 power readings cover 25 % of the runtime; assumed for "
                   "every GPU")
# RAPL: the energy status counter advances about every 1 ms (Intel SDM vol. 3B, 15.10.3), in units of
# 1/2^14 J = 61 µJ by default (MSR_RAPL_POWER_UNIT); sysfs exposes microjoules.
RAPL_UPDATE_S = 1e-3
RAPL_RESOLUTION_J = 2.0 ** -14
# codecarbon's CPU model spans 10 % of TDP (idle) to TDP (full load): the true draw lies in that range
# (codecarbon external/hardware.py); its RAM model (5 W per DIMM) has no stated error.
ESTIMATE_IDLE_SHARE = 0.1
RAM_ESTIMATE_SHARE = 0.5


def _part(name: str, j: float | None, basis: str) -> dict[str, Any]:
    return {"part": name, "j": j, "basis": basis}


def _edges_part(windows: int, edge_s: float, how: str) -> dict[str, Any]:
    """A window's two edges are read late by up to edge_s each; the errors have opposite signs (the start's
    adds energy, the end's drops it), so a window is off by at most edge_s at the highest draw a device
    can have (record/types.py MAX_DEVICE_W), whatever its power did at the edges."""
    return _part("counter edges", windows * edge_s * MAX_DEVICE_W,
                 f"{windows} window(s), each edge {how}: at most {edge_s:.2g} s × {MAX_DEVICE_W:g} W per window")


def _windows(figure: dict) -> int:
    """Windows summed into a figure (energy/windows.py keeps the count), each with two edges."""
    return int((figure.get("detail") or {}).get("windows") or 1)


def nvml_parts(figure: dict, window_s: float) -> list[dict[str, Any]]:
    """The parts of an NVML figure's bound: counter edges, resolution and sensor accuracy for a counter
    (with sampled power beside it, their disagreement); accuracy and part-time sampling without one."""
    energy, avg_w = figure["energy_j"], figure.get("avg_w") or figure["energy_j"] / window_s
    detail, windows = figure.get("detail") or {}, _windows(figure)
    parts = [_part("sensor accuracy", NVML_ACCURACY_W * window_s, f"±{NVML_ACCURACY_W:g} W × {window_s:.3g} s "
                   f"({ACCURACY_SOURCE})")]
    if source_kind(figure["source"]).measured:  # NVML's energy counter
        edge_s = detail.get("counter_edge_s")
        if edge_s is None:
            edge_s, how = NVML_UPDATE_S, f"read up to one update ({NVML_UPDATE_S:g} s) late"
        else:
            how = f"aligned to a counter update, read within {edge_s:.2g} s of it"
        parts.append(_edges_part(windows, edge_s, how))
        parts.append(_part("counter resolution", 2 * windows * NVML_RESOLUTION_J,
                           f"{NVML_RESOLUTION_J * 1e3:g} mJ per edge"))
        if figure.get("sampled_energy_j") is not None:
            parts.append(_part("sampled vs counter", abs(figure["sampled_energy_j"] - energy),
                               "integrated power samples beside the counter over the same window"))
        return parts
    low_w, high_w = detail.get("sample_min_w"), detail.get("sample_max_w")
    if low_w is None or high_w is None:
        spread, how = avg_w, "sample range not recorded: taken as the average power"
    else:
        spread, how = high_w - low_w, f"samples ranged {low_w:.4g}–{high_w:.4g} W"
    parts.append(_part("part-time sampling", (1 - SAMPLED_COVERAGE) * spread * window_s,
                       f"the unseen {1 - SAMPLED_COVERAGE:.0%} of the time may draw anywhere in the samples' range "
                       f"({how}; {COVERAGE_SOURCE})"))
    return parts


def rapl_parts(figure: dict) -> list[dict[str, Any]]:
    """RAPL's counter: its update period and unit at each edge; a possibly missed wrap; no stated accuracy."""
    windows = _windows(figure)
    parts = [_edges_part(windows, RAPL_UPDATE_S, f"read up to one update ({RAPL_UPDATE_S * 1e3:g} ms) late "
                                               f"(Intel SDM 15.10.3)"),
             _part("counter resolution", 2 * windows * RAPL_RESOLUTION_J, "61 µJ per edge (default RAPL energy unit)"),
             _part("sensor accuracy", None, "Intel and AMD state no accuracy for RAPL: not in the bound")]
    range_j = (figure.get("detail") or {}).get("rapl_range_j")
    if range_j is not None and figure["energy_j"] >= range_j / 2:
        parts.append(_part("counter wrap", None, f"the window drew {figure['energy_j']:.4g} J, at least half the "
                           f"counter's {range_j:.4g} J range between reads: a wrap may have been missed"))
    return parts


def estimate_parts(figure: dict, window_s: float, key: str) -> list[dict[str, Any]]:
    """codecarbon's estimate: its model's whole range (CPU), or ±50 % (RAM; an assumption)."""
    detail, energy = figure.get("detail") or {}, figure["energy_j"]
    if key == "cpu" and detail.get("cpu_max_w") is not None:
        low, high = ESTIMATE_IDLE_SHARE * detail["cpu_max_w"] * window_s, detail["cpu_max_w"] * window_s
        return [_part("estimate model", max(energy - low, high - energy, 0.0),
                      f"codecarbon's CPU model spans {ESTIMATE_IDLE_SHARE:.0%} of TDP to TDP "
                      f"({detail['cpu_max_w']:.4g} W); the true draw may lie anywhere in it")]
    return [_part("estimate model", RAM_ESTIMATE_SHARE * energy,
                  f"±{RAM_ESTIMATE_SHARE:.0%}: codecarbon's model ({key}) states no error; benchsuite's assumption")]


def figure_bound(figure: dict, window_s: float | None, key: str, short: bool = False) -> dict[str, Any] | None:
    """The bound of one figure (key "gpu", "cpu" or "dram"), or None when the figure is unavailable or its
    source not stated. short: a window was shorter than energy.min_window_s (energy.short_window)."""
    energy, kind = figure.get("energy_j"), source_kind(figure.get("source"))
    if energy is None or not window_s or not kind.figure:
        return None  # no figure, or one whose source is not stated
    if not kind.metered:
        parts = estimate_parts(figure, window_s, key)
    elif key == "gpu":
        parts = nvml_parts(figure, window_s)
    else:
        parts = rapl_parts(figure)
    return interval(energy, parts, short)


def interval(energy: float, parts: list[dict[str, Any]], short: bool) -> dict[str, Any]:
    """figure ± the sum of the parts' half-widths; flagged when that exceeds BOUND_SHARE of the figure,
    when a part could not be quantified in a way that may hide an error (a missed wrap), or when a
    window was shorter than energy.min_window_s."""
    half = sum(p["j"] for p in parts if p["j"] is not None)
    unbounded = [p for p in parts if p["part"] == "counter wrap"]
    share = half / energy if energy > 0 else None
    reasons = []
    if unbounded:
        reasons.append(unbounded[0]["basis"])
    if share is None or share > BOUND_SHARE:
        reasons.append(f"{SHARE_REASON} ±{share:.1%} of the figure, above {BOUND_SHARE:.0%}" if share is not None
                       else "a zero figure has no relative bound")
    if short:
        reasons.append(SHORT_REASON)
    return {"low_j": max(energy - half, 0.0), "high_j": None if unbounded else energy + half, "share": share,
            "parts": parts, "exceeds": bool(reasons), "reason": "; ".join(reasons) or None}


def _summed(bounds: list[dict | None], energy: float | None) -> dict[str, Any] | None:
    """A sum of figures' bounds: lows and highs added (no partial sums), flagged when any part is."""
    if energy is None or not bounds or any(b is None for b in bounds):
        return None
    high = sum_or_none(b["high_j"] for b in bounds)
    low = sum(b["low_j"] for b in bounds)
    half = max(energy - low, (high - energy) if high is not None else 0.0)
    share = half / energy if energy > 0 else None
    # its own share, then what its parts say besides theirs (a short window, a possible wrap), each once
    reasons = [f"{SHARE_REASON} ±{share:.1%} of the figure, above {BOUND_SHARE:.0%}"] \
        if share is not None and share > BOUND_SHARE else []
    reasons += dict.fromkeys(r for b in bounds for r in (b["reason"] or "").split("; ")
                             if r and not r.startswith(SHARE_REASON) and r not in reasons)
    merged: dict[str, dict] = {}
    for p in (p for b in bounds for p in b["parts"]):  # one line per kind of part: the sum over devices and nodes
        m = merged.setdefault(p["part"], {"part": p["part"], "j": 0.0, "basis": p["basis"]})
        m["j"] = None if m["j"] is None or p["j"] is None else m["j"] + p["j"]
    return {"low_j": low, "high_j": high, "share": share, "parts": list(merged.values()),
            "exceeds": bool(reasons) or any(b["exceeds"] for b in bounds), "reason": "; ".join(reasons) or None}


def add_bounds(energy: dict[str, Any]) -> dict[str, Any]:
    """The record's `energy` section with a bound on every figure: each device's and each node's part
    (`bound`), and the section's gpu, cpu, dram and total (`bounds`). Reads only the section itself."""
    window_s, short = energy.get("window_s"), bool(energy.get("short_window"))
    for dev in energy.get("per_device") or []:
        dev["bound"] = figure_bound(dev, window_s, "gpu", short)
    for node in energy.get("per_node") or []:
        for key in ("cpu", "dram"):
            if node.get(key):
                node[key]["bound"] = figure_bound(node[key], window_s, key, short)
    by_part = {"gpu": [d.get("bound") for d in energy.get("per_device") or []],
               "cpu": [(n.get("cpu") or {}).get("bound") for n in energy.get("per_node") or []],
               "dram": [(n.get("dram") or {}).get("bound") for n in energy.get("per_node") or []]}
    bounds = {k: _summed(by_part[k], energy.get(f"{k}_j")) for k in by_part}
    included = energy.get("total_includes") or []
    bounds["total"] = _summed([bounds[k] for k in included], energy.get("total_j"))
    energy["bounds"] = bounds
    return energy


def to_target_bound(energy: dict[str, Any], to_target_j: float | None) -> dict[str, float | None] | None:
    """The to-target energy's bound (metrics.quality.energy_bound): a share of the training windows the
    record's energy sums, given the relative bound of that whole (its parts grow with the window's length,
    its edges with the count of windows: the share of the whole is the closest single figure)."""
    return scaled((energy.get("bounds") or {}).get("total"), energy.get("total_j"), to_target_j)


def scaled(bound: dict | None, energy_j: float | None, value: float | None) -> dict[str, float | None] | None:
    """{low, high} of a figure proportional to an energy (J/token, CO2e): the energy's bound scaled by
    value / energy; None where either is unknown."""
    if bound is None or value is None or not energy_j:
        return None
    k = value / energy_j
    return {"low": bound["low_j"] * k, "high": None if bound["high_j"] is None else bound["high_j"] * k}
