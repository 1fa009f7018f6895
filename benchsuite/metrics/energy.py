"""The record's metrics.energy: energy per unit of work (J/token, J/PFLOP, W per device, g CO2e per
million tokens) over the energy window, None with a reason where an input is missing.
"""

from __future__ import annotations

from typing import Any

from benchsuite.energy.bounds import scaled
from benchsuite.record.values import ratio


def gpu_j_per_token(energy_section: dict, tokens: float | None) -> tuple[float | None, str | None]:
    """GPU energy alone per token (what an NVML-only figure compares with), and why it is None when it is."""
    gpu_j = energy_section.get("gpu_j")
    if gpu_j is None:
        devices = energy_section.get("per_device") or []
        why = "; ".join(dict.fromkeys(d.get("reason") or "no reading" for d in devices if d.get("energy_j") is None))
        return None, f"GPU energy unavailable: {why}" if devices else "no GPU in this run"
    if not tokens:
        return None, "no tokens counted in the energy window"
    return gpu_j / tokens, None


def derived_metrics(energy_section: dict, tokens: float | None, model_flops: float | None,
                    duration_s: float | None = None, devices: int | None = None,
                    carbon: dict | None = None) -> dict[str, Any]:
    """Efficiency per unit of work over the energy window; None where an input is missing.
    tokens and model_flops are totals over the window; avg_w_per_device and gpu_j_per_token
    are GPU energy only, j_per_token is total_j (GPU + CPU + DRAM, as total_includes says)."""
    total = energy_section.get("total_j")
    duration_s = duration_s if duration_s is not None else energy_section.get("window_s")
    devices = devices if devices is not None else len(energy_section.get("per_device") or []) or None
    co2e_g = (carbon or {}).get("co2e_g")
    gpu_per_token, gpu_reason = gpu_j_per_token(energy_section, tokens)
    per_token = ratio(total, tokens)
    bounds = energy_section.get("bounds") or {}
    return {
        "j_per_token": per_token,
        "j_per_token_bound": scaled(bounds.get("total"), total, per_token),
        "gpu_j_per_token": gpu_per_token,
        "gpu_j_per_token_bound": scaled(bounds.get("gpu"), energy_section.get("gpu_j"), gpu_per_token),
        "gpu_j_per_token_reason": gpu_reason,
        "gpu_energy_source": (energy_section.get("sources") or {}).get("gpu", "unavailable"),
        "j_per_pflop": ratio(total, None if model_flops is None else model_flops / 1e15),
        "avg_w_per_device": ratio(ratio(energy_section.get("gpu_j"), duration_s), devices),
        "gco2e_per_mtok": ratio(None if co2e_g is None else co2e_g * 1e6, tokens),
        "energy_source": energy_section.get("source", "unavailable"),
        "energy_includes": energy_section.get("total_includes", []),
    }
