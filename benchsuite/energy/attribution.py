"""The record's `energy` section from every rank's window: each GPU once, each node once, no partial sums.

Pure: the worker all_gathers each rank's `WindowResult.to_dict()` and passes the list here.
"""

from __future__ import annotations

from typing import Any

from benchsuite.energy.bounds import add_bounds
from benchsuite.energy.common import sum_or_none
from benchsuite.record.kinds import weakest, weakness
from benchsuite.record.types import Source


def _pick(readings: list[tuple[int, dict]]) -> tuple[int, dict]:
    """One rank's reading for a shared device/node: the best source, then the lowest rank."""
    return min(readings, key=lambda rf: (weakness(rf[1]["source"]), rf[0]))


def _pick_device(readings: list[tuple[int, dict]]) -> tuple[int, dict]:
    rank, _ = _pick([(rk, d["figure"]) for rk, d in readings])
    return rank, next(d for rk, d in readings if rk == rank)


class _Reasons(list):
    """Why figures are missing, each said once, in the order met."""

    def note(self, text: str | None) -> None:
        if text and text not in self:
            self.append(text)


def attribute_energy(per_rank: list[dict[str, Any]]) -> dict[str, Any]:
    """The record's `energy` section from every rank's `WindowResult.to_dict()` (one window).

    Each physical GPU counts once (grouped by UUID, also when ranks share one), each
    node's CPU/DRAM once (grouped by host), and nodes are summed. gpu_j / cpu_j / dram_j
    are None unless every device / node has a figure, so no field holds a partial sum.
    total_j = sum of the available figures among gpu_j, cpu_j, dram_j -- listed in
    `total_includes` -- and None when none is available; `source` is the weakest source
    among them, `sources` gives each one's. Every figure carries its bound (energy/bounds.py).
    """
    ranks = sorted(per_rank, key=lambda r: r["rank"])
    reasons = _Reasons()
    for r in ranks:
        for t in r.get("reasons", []):
            reasons.note(t)
    windows = {r["rank"]: r["window_s"] for r in ranks}
    per_device = _devices(ranks, windows, reasons)
    per_node = _nodes(ranks, windows, reasons)
    return add_bounds({**_totals({"gpu": per_device, "cpu": [n["cpu"] for n in per_node],
                                  "dram": [n["dram"] for n in per_node]}),
                       "window_s": max(windows.values()) if windows else None,
                       "short_window": any(r.get("short_window") for r in ranks),
                       "per_device": per_device, "per_node": per_node, "reasons": list(reasons)})


def _figure(f: dict, window_s: float | None) -> dict:
    """A reading as the record holds it, its average power from the reading rank's window where the meter
    gave none."""
    out = _flat(f)
    if out["avg_w"] is None and f["energy_j"] is not None and window_s:
        out["avg_w"] = f["energy_j"] / window_s
    return out


def _devices(ranks: list[dict], windows: dict[int, float], reasons: _Reasons) -> list[dict]:
    """Each physical GPU once (by UUID), read by the rank with the best source, then the lowest rank."""
    by_uuid: dict[str, list[tuple[int, dict]]] = {}
    for r in ranks:
        for d in r["gpus"]:
            by_uuid.setdefault(d["uuid"], []).append((r["rank"], d))
    per_device = []
    for uuid, readings in by_uuid.items():
        rank, dev = _pick_device(readings)
        host = next(r["host"] for r in ranks if r["rank"] == rank)
        per_device.append({"uuid": uuid, "name": dev["name"], "host": host, "cuda_index": dev["cuda_index"],
                           "ranks": sorted(rk for rk, _ in readings), "reading_rank": rank,
                           **_figure(dev["figure"], windows[rank])})
        if dev["figure"]["energy_j"] is None:
            reasons.note(f"GPU {uuid} on {host}: {dev['figure']['reason']}")
    return per_device


def _nodes(ranks: list[dict], windows: dict[int, float], reasons: _Reasons) -> list[dict]:
    """Each node's CPU and DRAM once (by host), each read by the rank with the best source."""
    by_host: dict[str, list[tuple[int, dict]]] = {}
    for r in ranks:
        by_host.setdefault(r["host"], []).append((r["rank"], r))
    per_node = []
    for host, readings in by_host.items():
        entry = {"host": host, "ranks": sorted(rk for rk, _ in readings)}
        for key in ("cpu", "dram"):
            rank, f = _pick([(rk, r[key]) for rk, r in readings])
            entry[key] = {"reading_rank": rank, **_figure(f, windows[rank])}
            if f["energy_j"] is None:
                reasons.note(f"{key} on {host}: {f['reason']}")
        per_node.append(entry)
    return per_node


def _totals(parts: dict[str, list[dict]]) -> dict[str, Any]:
    """Each part's sum (None unless every device or node has a figure), the total of those there are, the
    weakest source, and the idle power and energy above it."""
    totals = {k: sum_or_none([f["energy_j"] for f in fs]) for k, fs in parts.items()}
    sources = {k: weakest(f["source"] for f in fs) if totals[k] is not None else Source.UNAVAILABLE
               for k, fs in parts.items()}
    included = [k for k in ("gpu", "cpu", "dram") if totals[k] is not None]
    idle_parts = {k: sum_or_none([f["idle_w"] for f in parts[k]]) for k in included}
    above_parts = {k: sum_or_none([f["above_idle_j"] for f in parts[k]]) for k in included}
    return {
        "gpu_j": totals["gpu"], "cpu_j": totals["cpu"], "dram_j": totals["dram"],
        "total_j": sum(totals[k] for k in included) if included else None,
        "total_includes": included,
        "source": weakest(sources[k] for k in included) if included else Source.UNAVAILABLE,
        "sources": sources,
        "idle_w": sum_or_none(list(idle_parts.values())) if included else None,
        "above_idle_j": sum_or_none(list(above_parts.values())) if included else None,
        "idle_w_parts": idle_parts,
    }


def _flat(f: dict) -> dict:
    """A figure dict for the record (detail kept; unit-named fields first)."""
    keys = ("energy_j", "source", "avg_w", "reason", "sampled_energy_j", "idle_w", "above_idle_j", "detail")
    return {k: f.get(k) for k in keys}
