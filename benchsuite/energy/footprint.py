"""The carbon a team reports beside the location-based CO2e: market-based Scope 2, embodied Scope 3 and
water. Each part is its own figure with its source; none is ever added to another (the GHG Protocol
reports location- and market-based Scope 2 side by side, and Scope 3 apart from Scope 2).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

J_PER_KWH = 3.6e6
HOURS_PER_YEAR = 8760.0

# A GPU's share of its server's manufacturing emissions, when the user gives none: 2,500 kg CO2e per
# HPE Apollo 6500 Gen10 Plus node of 8 GPUs, as Luccioni et al. 2022 used for BLOOM (section 4.1).
DEFAULT_GPU_EMBODIED_KG = 2500.0 / 8
DEFAULT_GPU_EMBODIED_SOURCE = ("default: a GPU's share of its server, 2,500 kg CO2e per 8-GPU HPE Apollo 6500 "
                               "Gen10 Plus node (Luccioni et al. 2022, BLOOM)")


@dataclass(frozen=True)
class Usage:
    """What the parts are computed from: IT energy, the PUE, and the devices and hours that drew it."""

    energy_j: float | None
    pue: float
    devices: int | None
    hours: float | None
    gpus: bool  # the devices are GPUs (a CPU host has no default embodied figure)


def market_based(usage: Usage, cfg) -> dict[str, Any]:
    """The energy at the user's contractual factor (carbon.market_intensity_g_per_kwh), × PUE like the
    location-based figure; null with the fix when no factor is given."""
    factor = getattr(cfg, "market_intensity_g_per_kwh", None)
    if factor is None:
        return {"reason": "no contractual factor: set carbon.market_intensity_g_per_kwh (g CO2e/kWh from your "
                          "supplier's contract or certificates)"}
    co2e = None if usage.energy_j is None else usage.energy_j / J_PER_KWH * usage.pue * factor
    return {"intensity_g_per_kwh": float(factor), "co2e_g": co2e, "source": "carbon.market_intensity_g_per_kwh",
            "reason": None if co2e is not None else "no energy figure"}


def embodied(usage: Usage, cfg) -> dict[str, Any]:
    """Manufacturing emissions per device × the share of its service life used: kg × device-hours /
    (lifetime × 8,760 h). The user's figure, else a GPU's documented default; none for a CPU host."""
    kg = getattr(cfg, "embodied_kg_per_device", None)
    source = "carbon.embodied_kg_per_device"
    if kg is None and usage.gpus:
        kg, source = DEFAULT_GPU_EMBODIED_KG, DEFAULT_GPU_EMBODIED_SOURCE
    lifetime = float(getattr(cfg, "device_lifetime_years", None) or 5.0)
    if kg is None:
        return {"lifetime_years": lifetime, "reason": "no default for a CPU host: set carbon.embodied_kg_per_device "
                                                      "(the host's manufacturing CO2e, e.g. its product carbon footprint)"}
    out = {"kg_per_device": float(kg), "lifetime_years": lifetime, "devices": usage.devices, "source": source}
    if not usage.devices or usage.hours is None:
        return {**out, "reason": "no device count or window: nothing to amortise over"}
    device_hours = usage.devices * usage.hours
    return {**out, "device_hours": device_hours, "co2e_g": kg * 1000.0 * device_hours / (lifetime * HOURS_PER_YEAR)}


def water(usage: Usage, cfg) -> dict[str, Any]:
    """On-site litres = IT kWh × WUE; off-site = IT kWh × PUE × the grid's litres per kWh (Li et al. 2023,
    "Making AI less thirsty"). No default: published factors vary by an order of magnitude by site and grid."""
    wue, grid = getattr(cfg, "wue_l_per_kwh", None), getattr(cfg, "water_intensity_l_per_kwh", None)
    kwh = None if usage.energy_j is None else usage.energy_j / J_PER_KWH
    missing = [k for k, v in (("carbon.wue_l_per_kwh", wue), ("carbon.water_intensity_l_per_kwh", grid)) if v is None]
    reason = (f"set {' and '.join(missing)}: no default, published factors vary by an order of magnitude by site "
              f"and grid" if missing else None) or (None if kwh is not None else "no energy figure")
    return {"wue_l_per_kwh": wue, "onsite_l": None if wue is None or kwh is None else kwh * wue,
            "grid_l_per_kwh": grid, "offsite_l": None if grid is None or kwh is None else kwh * usage.pue * grid,
            "reason": reason}


def parts(usage: Usage, cfg) -> dict[str, Any]:
    """The carbon section's market, embodied and water parts."""
    return {"market": market_based(usage, cfg), "embodied": embodied(usage, cfg), "water": water(usage, cfg)}
