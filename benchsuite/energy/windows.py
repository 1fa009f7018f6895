"""One rank's energy windows summed into one: how the training segments between evaluations
(metrics/quality.py) make the record's energy section, training only, the evaluation windows left out.

Pure, over `WindowResult.to_dict()`s: the result has the same shape, so attribution reads it as
it reads any window.
"""

from __future__ import annotations

from benchsuite.energy.common import sum_or_none
from benchsuite.record.kinds import weakest
from benchsuite.record.types import Source


def _combine_figure(figs: list[dict], window_s: float) -> dict:
    energy = sum_or_none(f.get("energy_j") for f in figs)
    reasons = []
    for f in figs:
        if f.get("reason") and f["reason"] not in reasons:
            reasons.append(f["reason"])
    idle = figs[0].get("idle_w") if figs else None
    return {
        "energy_j": energy,
        "source": weakest(f["source"] for f in figs) if energy is not None else Source.UNAVAILABLE,
        "reason": "; ".join(reasons) or None,
        "sampled_energy_j": sum_or_none(f.get("sampled_energy_j") for f in figs),
        "avg_w": energy / window_s if energy is not None and window_s > 0 else None,
        "idle_w": idle,
        "above_idle_j": sum_or_none(f.get("above_idle_j") for f in figs) if idle is not None else None,
        "detail": _combine_detail(figs),
    }


def _combine_detail(figs: list[dict]) -> dict:
    """What the bound of the summed figure needs (energy/bounds.py): the window count (each has two
    edges), the latest edge, the samples' whole range, the smallest counter range."""
    details = [f.get("detail") or {} for f in figs]
    out = {k: v for k, v in details[0].items() if k in ("power_api", "rapl_zones", "cpu_max_w")}
    out["windows"] = sum(int(d.get("windows") or 1) for d in details)
    for key, pick in (("counter_edge_s", max), ("sample_min_w", min), ("sample_max_w", max), ("rapl_range_j", min)):
        values = [d.get(key) for d in details]
        if values and None not in values:
            out[key] = pick(values)
    return out


def combine_windows(windows: list[dict], name: str = "measure", min_window_s: float | None = None) -> dict:
    """One rank's windows (``WindowResult.to_dict()``) as one window of the same shape: energies,
    durations and above-idle energies summed, a figure None (unavailable) unless every window has it,
    the weakest source. This is how the training segments between evaluations make the record's
    energy section: training only, the evaluation windows left out. short_window is set when any
    window was short (each edge of a short window costs the counter's resolution)."""
    if not windows:
        raise ValueError("combine_windows needs at least one window")
    window_s = sum(w["window_s"] for w in windows)
    gpus = []
    for i, dev in enumerate(windows[0]["gpus"]):
        figs = [w["gpus"][i]["figure"] for w in windows]
        gpus.append({**{k: v for k, v in dev.items() if k != "figure"}, "figure": _combine_figure(figs, window_s)})
    reasons = []
    for w in windows:
        for r in w.get("reasons", []):
            if not r.startswith("window ") and r not in reasons:  # per-window "shorter than" notes summarised below
                reasons.append(r)
    short = [w for w in windows if w.get("short_window")]
    if short:
        limit = f" min_window_s {min_window_s} s" if min_window_s is not None else " min_window_s"
        reasons.append(f"{len(short)} of {len(windows)} windows summed into {name!r} were shorter than{limit}: "
                       f"energy counters (NVML) update about every 100 ms; evaluate less often or train longer")
    return {"name": name, "rank": windows[0]["rank"], "host": windows[0]["host"], "window_s": window_s,
            "short_window": bool(short), "gpus": gpus,
            "cpu": _combine_figure([w["cpu"] for w in windows], window_s),
            "dram": _combine_figure([w["dram"] for w in windows], window_s), "reasons": reasons}
