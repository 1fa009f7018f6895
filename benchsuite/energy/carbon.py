"""CO2e from energy: kWh x PUE x grid intensity (g CO2e/kWh), and the calculators built on it.

Intensity comes from an explicit value, else codecarbon's bundled offline data by
country (ISO 3166 alpha-3) and optional region, else codecarbon's world average.
The data files are read straight from the installed codecarbon package: no network,
no tracker. Every figure says where its intensity came from.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import json
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from benchsuite.atomic import atomic_file

J_PER_KWH = 3.6e6

# Used only if codecarbon's own file cannot be read. Same value and source as codecarbon's
# data/private_infra/carbon_intensity_per_source.json "world_average" (IEA, Global Energy
# & CO2 Status Report 2019), which codecarbon uses for countries it has no data for.
WORLD_AVERAGE_G_PER_KWH = 475.0

# 1 lb/MWh = 453.59237 g / 1000 kWh (EPA eGRID publishes lb/MWh; codecarbon core/units.py).
LBS_PER_MWH_TO_G_PER_KWH = 0.45359237

_GLOBAL_MIX = "data/private_infra/global_energy_mix.json"
_PER_SOURCE = "data/private_infra/carbon_intensity_per_source.json"
_USA = "data/private_infra/2023/usa_emissions.json"
_CAN = "data/private_infra/2023/canada_energy_mix.json"
_NORDIC = "data/private_infra/nordic_emissions.json"
_CHN = "data/private_infra/2023/china_provincial_emissions.json"
_NORDIC_PREFIX = {"SWE": "SE", "NOR": "NO", "FIN": "FI"}   # bidding zones, as codecarbon core/emissions.py
_CHINA_SUFFIX = re.compile(r"\s+(autonomous region|municipality|province|sheng|shi|zizhiqu)$")


@dataclass(frozen=True)
class Intensity:
    value_g_per_kwh: float
    source: str              # explicit | codecarbon:<file>:<ISO>[/<region>] | fallback:world_average
    note: str | None = None  # a warning or provenance the user should see


@functools.cache
def codecarbon_data(relpath: str) -> dict:
    """A JSON file bundled in the installed codecarbon package."""
    return json.loads(resources.files("codecarbon").joinpath(relpath).read_text(encoding="utf-8"))


def world_average(why: str) -> Intensity:
    try:
        data = codecarbon_data(_PER_SOURCE)
        value, cite = float(data["world_average"]), data.get("world_average_source", "codecarbon")
    except Exception:
        value, cite = WORLD_AVERAGE_G_PER_KWH, "IEA Global Energy & CO2 Status Report 2019 (codecarbon's value)"
    return Intensity(value, "fallback:world_average",
                     f"{why}; using codecarbon's world average {value:g} g/kWh ({cite})")


def _region_intensity(iso: str, region: str) -> tuple[float, str] | None:
    """(g/kWh, source) from codecarbon's regional files, or None when it has no such region."""
    r = " ".join(region.lower().split())
    if iso == "USA":
        entry = codecarbon_data(_USA).get(r)
        if entry:
            return entry["emissions"] * LBS_PER_MWH_TO_G_PER_KWH, f"codecarbon:usa_emissions:USA/{r}"
    elif iso == "CAN":
        mix = codecarbon_data(_CAN).get(r)
        if mix:
            from codecarbon.core.emissions import Emissions   # its fuel-mix conversion, not a copy
            rate = Emissions._region_energy_mix_to_emissions_rate(mix)
            return rate.kgs_per_kWh * 1000.0, f"codecarbon:canada_energy_mix:CAN/{r}"
    elif iso in _NORDIC_PREFIX:
        zone = r.upper()
        entry = codecarbon_data(_NORDIC)["data"].get(zone)
        if entry and zone.startswith(_NORDIC_PREFIX[iso]):
            return float(entry["emission_factor"]), f"codecarbon:nordic_emissions:{iso}/{zone}"
    elif iso == "CHN":
        name = _CHINA_SUFFIX.sub("", r)
        for code, entry in codecarbon_data(_CHN)["data"].items():
            if name in entry["names"]:
                return float(entry["emission_factor"]), f"codecarbon:china_provincial_emissions:CHN/{code}"
    return None


def lookup(intensity: float | None = None, country: str | None = None, region: str | None = None) -> Intensity:
    """Explicit value, else codecarbon's region/country figure, else its world average."""
    if intensity is not None:
        if intensity < 0:
            raise ValueError(f"intensity must be >= 0 g/kWh, got {intensity}")
        return Intensity(float(intensity), "explicit")
    if not country:
        return world_average("no country or intensity given")
    iso = country.strip().upper()
    note = None
    try:
        if region:
            found = _region_intensity(iso, region)
            if found:
                return Intensity(found[0], found[1])
            note = f"region {region!r} not in codecarbon's data for {iso}; country value used"
        mix = codecarbon_data(_GLOBAL_MIX).get(iso)
    except Exception as e:
        return world_average(f"codecarbon data unreadable ({type(e).__name__}: {e})")
    if mix is None:
        return world_average(f"country {iso!r} not in codecarbon's global_energy_mix.json "
                             f"(expects ISO 3166 alpha-3, e.g. FRA)")
    value = mix.get("carbon_intensity")
    if value is None:   # codecarbon derives it from the fuel mix in that case
        from codecarbon.core.emissions import Emissions
        value = Emissions._global_energy_mix_to_emissions_rate(mix).kgs_per_kWh * 1000.0
    provenance = f"{mix.get('country_name', iso)}, {mix.get('year', '?')}"
    return Intensity(float(value), f"codecarbon:global_energy_mix:{iso}",
                     f"{note}; {provenance}" if note else provenance)


def resolve_intensity(carbon_cfg) -> Intensity:
    """Intensity for a run's [carbon] section (CarbonConfig, or None for defaults)."""
    return lookup(getattr(carbon_cfg, "intensity_g_per_kwh", None),
                  getattr(carbon_cfg, "country", None), getattr(carbon_cfg, "region", None))


def co2e_g(energy_j: float | None, pue: float, intensity_g_per_kwh: float | None) -> float | None:
    """kWh x PUE x grid intensity; None when the energy or the intensity is unknown."""
    if energy_j is None or intensity_g_per_kwh is None:
        return None
    return energy_j / J_PER_KWH * pue * intensity_g_per_kwh


def carbon_section(energy_j: float | None, carbon_cfg, energy_source: str | None = None) -> dict[str, Any]:
    """The record's `carbon` section; co2e_g is None when the energy is None.
    PUE is always stated (default 1.0)."""
    it = resolve_intensity(carbon_cfg)
    pue = float(getattr(carbon_cfg, "pue", None) or 1.0)
    kwh = None if energy_j is None else energy_j / J_PER_KWH
    out = {
        "kwh": kwh,
        "pue": pue,
        "intensity_g_per_kwh": it.value_g_per_kwh,
        "intensity_source": it.source,
        "intensity_note": it.note,
        "co2e_g": co2e_g(energy_j, pue, it.value_g_per_kwh),
    }
    if energy_source is not None:
        out["energy_source"] = energy_source
    return out


def _check(**values: float) -> None:
    for name, v in values.items():
        if v is None or v < 0:
            raise ValueError(f"{name} must be a number >= 0, got {v!r}")


def estimate(chips: float, hours: float, watts: float, pue: float = 1.0, intensity: float | None = None,
             country: str | None = None, region: str | None = None) -> dict[str, Any]:
    """The plain calculator of published carbon accounting (Patterson et al. 2021):
    chips x hours x watts x PUE x intensity. energy_kwh is IT energy (before PUE),
    facility_kwh = energy_kwh x PUE, co2e_kg = facility_kwh x intensity / 1000."""
    _check(chips=chips, hours=hours, watts=watts)
    if pue < 1.0:
        raise ValueError(f"pue must be >= 1.0, got {pue}")
    it = lookup(intensity, country, region)
    energy_kwh = chips * hours * watts / 1000.0
    facility_kwh = energy_kwh * pue
    return {
        "chips": chips, "hours": hours, "watts": watts,
        "energy_kwh": energy_kwh, "facility_kwh": facility_kwh, "pue": pue,
        "intensity_g_per_kwh": it.value_g_per_kwh, "intensity_source": it.source, "intensity_note": it.note,
        "co2e_kg": facility_kwh * it.value_g_per_kwh / 1000.0,
    }


def project(tokens: float, devices: int, j_per_token: float, tokens_per_s_per_device: float,
            pue: float = 1.0, intensity: float | Intensity = WORLD_AVERAGE_G_PER_KWH) -> dict[str, Any]:
    """A full training run from measured rates: hours = tokens / (rate x devices);
    energy_kwh = tokens x J/token (IT energy); co2e_t = energy_kwh x PUE x intensity.
    Assumes J/token and per-device throughput stay as measured at the new device count."""
    _check(tokens=tokens, j_per_token=j_per_token)
    if not devices or devices < 1 or not tokens_per_s_per_device or tokens_per_s_per_device <= 0:
        raise ValueError("devices and tokens_per_s_per_device must be > 0")
    it = intensity if isinstance(intensity, Intensity) else Intensity(float(intensity), "explicit")
    energy_kwh = tokens * j_per_token / J_PER_KWH
    return {
        "tokens": tokens, "devices": devices, "j_per_token": j_per_token,
        "tokens_per_s_per_device": tokens_per_s_per_device,
        "hours": tokens / (tokens_per_s_per_device * devices) / 3600.0,
        "energy_kwh": energy_kwh, "facility_kwh": energy_kwh * pue, "pue": pue,
        "intensity_g_per_kwh": it.value_g_per_kwh, "intensity_source": it.source,
        "co2e_t": energy_kwh * pue * it.value_g_per_kwh / 1e6,
    }


def _div(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def derived_metrics(energy_section: dict, tokens: float | None, model_flops: float | None,
                    duration_s: float | None = None, devices: int | None = None,
                    carbon: dict | None = None) -> dict[str, Any]:
    """Efficiency per unit of work over the energy window; None where an input is missing.
    tokens and model_flops are totals over the window; avg_w_per_device is GPU energy only."""
    total = energy_section.get("total_j")
    duration_s = duration_s if duration_s is not None else energy_section.get("window_s")
    devices = devices if devices is not None else len(energy_section.get("per_device") or []) or None
    co2e_g = (carbon or {}).get("co2e_g")
    return {
        "j_per_token": _div(total, tokens),
        "j_per_pflop": _div(total, None if model_flops is None else model_flops / 1e15),
        "avg_w_per_device": _div(_div(energy_section.get("gpu_j"), duration_s), devices),
        "gco2e_per_mtok": _div(None if co2e_g is None else co2e_g * 1e6, tokens),
        "energy_source": energy_section.get("source", "unavailable"),
        "energy_includes": energy_section.get("total_includes", []),
    }


def project_from_record(record: dict, tokens: float, devices: int | None = None, pue: float | None = None,
                        intensity: float | Intensity | None = None) -> dict[str, Any]:
    """`project` with rates taken from a run record: J/token from metrics.energy.j_per_token
    when the worker stored it, else energy.total_j / (tokens_per_s x window_s); per-device
    rate = tokens_per_s / world_size. PUE and intensity default to the record's."""
    energy, carbon = record.get("energy") or {}, record.get("carbon") or {}
    metrics = record.get("metrics") or {}
    tps = metrics.get("tokens_per_s")
    world = (record.get("env") or {}).get("world_size") or (record.get("config") or {}).get("world_size")
    jpt = (metrics.get("energy") or {}).get("j_per_token")
    if jpt is None:
        jpt = _div(energy.get("total_j"), None if tps is None or energy.get("window_s") is None
                   else tps * energy["window_s"])
    if jpt is None or not tps or not world:
        raise ValueError("record lacks energy.total_j, metrics.tokens_per_s or world_size: cannot project")
    it = (intensity if isinstance(intensity, Intensity) else
          Intensity(float(intensity), "explicit") if intensity is not None else
          Intensity(carbon["intensity_g_per_kwh"], carbon.get("intensity_source", "record"))
          if carbon.get("intensity_g_per_kwh") is not None else world_average("record has no intensity"))
    out = project(tokens, devices or world, jpt, tps / world, pue if pue is not None else carbon.get("pue", 1.0), it)
    out.update(run_key=record.get("run_key"), energy_source=energy.get("source", "unavailable"),
               energy_includes=energy.get("total_includes", []))
    return out


# --------------------------------------------------------------------------- codecarbon export


def codecarbon_columns() -> list[str]:
    """Column names of codecarbon's emissions.csv (output_methods/emissions_data.py)."""
    from codecarbon.output_methods.emissions_data import EmissionsData
    return [f.name for f in dataclasses.fields(EmissionsData)]


def _kwh(j: float | None) -> float | None:
    return None if j is None else j / J_PER_KWH


def to_codecarbon_rows(records: list[dict]) -> list[dict]:
    """One codecarbon-style row per ok record. Units as codecarbon: duration s, emissions kg
    CO2e, emissions_rate kg/s, *_power W, *_energy kWh. Figures a run did not measure are
    left empty (None), not 0; durations and energies cover the energy window."""
    import codecarbon
    rows = []
    for rec in records:
        if rec.get("status") != "ok":
            continue
        energy, carbon = rec.get("energy") or {}, rec.get("carbon") or {}
        env, cfg = rec.get("env") or {}, (rec.get("config") or {})
        ccfg = cfg.get("carbon") or {}
        window = energy.get("window_s") or rec.get("duration_s")
        co2e_kg = None if carbon.get("co2e_g") is None else carbon["co2e_g"] / 1000.0
        gpus = {d.get("uuid"): d.get("name") for d in (energy.get("per_device") or env.get("devices") or [])
                if d.get("uuid") and d.get("type", "cuda") == "cuda"}          # physical GPUs, each once
        cpu_models = sorted({d.get("name") for d in env.get("devices") or [] if d.get("type") == "cpu"} - {None})
        country = ccfg.get("country")
        try:
            country_name = codecarbon_data(_GLOBAL_MIX).get((country or "").upper(), {}).get("country_name")
        except Exception:
            country_name = None
        row = {
            "timestamp": rec.get("started_at"),
            "project_name": rec.get("suite"),
            "run_id": rec.get("run_key"),
            "experiment_id": rec.get("workload"),
            "duration": window,
            "emissions": co2e_kg,
            "emissions_rate": _div(co2e_kg, window),
            "cpu_power": _div(energy.get("cpu_j"), window),
            "gpu_power": _div(energy.get("gpu_j"), window),
            "ram_power": _div(energy.get("dram_j"), window),
            "cpu_energy": _kwh(energy.get("cpu_j")),
            "gpu_energy": _kwh(energy.get("gpu_j")),
            "ram_energy": _kwh(energy.get("dram_j")),
            "energy_consumed": _kwh(energy.get("total_j")),
            "water_consumed": None,
            "country_name": country_name,
            "country_iso_code": country,
            "region": ccfg.get("region"),
            "cloud_provider": None,
            "cloud_region": None,
            "os": env.get("os"),
            "python_version": env.get("python"),
            "codecarbon_version": codecarbon.__version__,
            "cpu_count": env.get("cpu_count"),
            "cpu_model": env.get("cpu_model") or ", ".join(cpu_models) or None,
            "gpu_count": len(gpus) or None,
            "gpu_model": ", ".join(sorted(set(gpus.values()) - {None})) or None,
            "longitude": None,
            "latitude": None,
            "ram_total_size": env.get("ram_total_gb"),
            "tracking_mode": "machine",
            "on_cloud": "N",
            "pue": carbon.get("pue"),
        }
        columns = codecarbon_columns()
        rows.append({c: row.get(c) for c in columns})
    return rows


def write_codecarbon_csv(records: list[dict], path: str | Path) -> Path:
    """emissions.csv in codecarbon's column order (header even when there are no rows)."""
    path = Path(path)
    with atomic_file(path, "w", encoding="utf-8", newline="") as f:
        w = csv.DictWriter(f, fieldnames=codecarbon_columns())
        w.writeheader()
        w.writerows(to_codecarbon_rows(records))
    return path
