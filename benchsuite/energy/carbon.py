"""CO2e from energy: kWh x PUE x grid intensity (g CO2e/kWh), and the calculators built on it.

Intensity comes from an explicit value, else codecarbon's bundled offline data by
country (ISO 3166 alpha-3) and optional region, else (no country given) codecarbon's world
average. A country or region that data does not hold is bad input, never the world average.
The data files are read straight from the installed codecarbon package: no network,
no tracker. Every figure says where its intensity came from.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from importlib import resources
from typing import Any

from benchsuite.config import CarbonConfig
from benchsuite.energy import footprint
from benchsuite.energy.bounds import scaled
from benchsuite.energy.footprint import Usage
from benchsuite.record.sanity import sanity_flags
from benchsuite.record.values import ratio

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


def country_name(iso: str | None) -> str | None:
    """The country's name in codecarbon's offline data (None when it has none or cannot be read)."""
    try:
        return codecarbon_data(_GLOBAL_MIX).get(iso or "", {}).get("country_name")
    except (OSError, ValueError):
        return None


def world_average(why: str) -> Intensity:
    try:
        data = codecarbon_data(_PER_SOURCE)
        value, cite = float(data["world_average"]), data.get("world_average_source", "codecarbon")
    except Exception:
        value, cite = WORLD_AVERAGE_G_PER_KWH, "IEA Global Energy & CO2 Status Report 2019 (codecarbon's value)"
    return Intensity(value, "fallback:world_average",
                     f"{why}; using codecarbon's world average {value:g} g/kWh ({cite})")


def _region_key(iso: str, region: str) -> str:
    """A region as codecarbon's files spell it: lower case (bidding zones upper case), Chinese
    provinces without "province", "municipality", ..."""
    r = " ".join(region.lower().split())
    if iso in _NORDIC_PREFIX:
        return r.upper()
    return _CHINA_SUFFIX.sub("", r) if iso == "CHN" else r


@functools.cache
def _regions(iso: str) -> dict[str, tuple[float, str]]:
    """{region key: (g/kWh, source)} from codecarbon's regional files; {} for a country it has none for."""
    if iso == "USA":
        return {name: (entry["emissions"] * LBS_PER_MWH_TO_G_PER_KWH, f"codecarbon:usa_emissions:USA/{name}")
                for name, entry in codecarbon_data(_USA).items() if not name.startswith("_")}
    if iso == "CAN":
        from codecarbon.core.emissions import Emissions   # its fuel-mix conversion, not a copy
        return {name: (Emissions._region_energy_mix_to_emissions_rate(mix).kgs_per_kWh * 1000.0,
                       f"codecarbon:canada_energy_mix:CAN/{name}")
                for name, mix in codecarbon_data(_CAN).items() if not name.startswith("_")}
    if iso in _NORDIC_PREFIX:
        return {zone: (float(entry["emission_factor"]), f"codecarbon:nordic_emissions:{iso}/{zone}")
                for zone, entry in codecarbon_data(_NORDIC)["data"].items() if zone.startswith(_NORDIC_PREFIX[iso])}
    if iso == "CHN":
        return {name: (float(entry["emission_factor"]), f"codecarbon:china_provincial_emissions:CHN/{code}")
                for code, entry in codecarbon_data(_CHN)["data"].items() for name in entry["names"]}
    return {}


def _known_alpha3(value: str) -> str | None:
    """The ISO 3166 alpha-3 code a user most likely meant by value (an alpha-2 code, a name), or None."""
    import pycountry

    try:
        return pycountry.countries.lookup(value.strip()).alpha_3
    except LookupError:
        return None


def place_problems(country: str | None, region: str | None) -> list[tuple[str, str]]:
    """(field, reason) for each of country/region that codecarbon's offline data does not hold;
    [] when both are fine or absent. Checked before anything runs: a mistyped place must not
    silently become the world average."""
    if not country:
        return [("region", f"{region!r} needs a country (ISO 3166 alpha-3, e.g. USA)")] if region else []
    iso = country.strip().upper()
    try:
        known = codecarbon_data(_GLOBAL_MIX)
        regions = _regions(iso) if region and iso in known else {}
    except (OSError, ValueError, KeyError, TypeError, ImportError) as e:
        return [("country", f"codecarbon's offline data is unreadable ({type(e).__name__}: {e}); "
                            "give intensity_g_per_kwh instead")]
    if iso not in known:
        meant = _known_alpha3(country)
        if meant is None:
            return [("country", f"{country}: not an ISO 3166 country; give its alpha-3 code, e.g. FRA")]
        no_data = f"codecarbon's offline data has no figure for {meant}: give intensity_g_per_kwh instead"
        if meant == iso:
            return [("country", f"{country}: {no_data}")]
        hint = "" if meant in known else f" ({no_data})"
        return [("country", f"{country}: not an ISO 3166 alpha-3 code; did you mean {meant}?{hint}")]
    if not region or _region_key(iso, region) in regions:
        return []
    if not regions:
        return [("region", f"{region!r}: codecarbon has no regional data for {iso} (it has regions for "
                           "USA, CAN, SWE, NOR, FIN, CHN); drop region to use the country figure")]
    names = sorted(regions)
    shown = ", ".join(names[:12]) + (f", ... ({len(names)} in all)" if len(names) > 12 else "")
    return [("region", f"{region!r} not in codecarbon's data for {iso}; valid: {shown}")]


def lookup(intensity: float | None = None, country: str | None = None, region: str | None = None) -> Intensity:
    """Explicit value, else codecarbon's region/country figure, else (no country given) its world
    average. A country or region codecarbon does not hold is a ValueError naming the fix."""
    problems = place_problems(country, region)
    if problems:
        raise ValueError("; ".join(f"{field}: {reason}" for field, reason in problems))
    if intensity is not None:
        if intensity < 0:
            raise ValueError(f"intensity must be >= 0 g/kWh, got {intensity}")
        return Intensity(float(intensity), "explicit")
    if not country:
        return world_average("no country or intensity given")
    iso = country.strip().upper()
    if region:
        value, source = _regions(iso)[_region_key(iso, region)]
        return Intensity(value, source)
    mix = codecarbon_data(_GLOBAL_MIX)[iso]
    value = mix.get("carbon_intensity")
    if value is None:   # codecarbon derives it from the fuel mix in that case
        from codecarbon.core.emissions import Emissions
        value = Emissions._global_energy_mix_to_emissions_rate(mix).kgs_per_kWh * 1000.0
    return Intensity(float(value), f"codecarbon:global_energy_mix:{iso}",
                     f"{mix.get('country_name', iso)}, {mix.get('year', '?')}")


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


def usage_of(energy: dict[str, Any], pue: float) -> Usage:
    """What the footprint parts read of a record's energy section: the energy window's GPUs (each once, whatever
    its figure's source: a device's share of its manufacture does not depend on how its energy was read), else
    the nodes (a CPU host is the device), over the energy window."""
    gpus = len(energy.get("per_device") or [])
    window_s = energy.get("window_s")
    return Usage(energy.get("total_j"), pue, gpus or len(energy.get("per_node") or []) or None,
                 None if window_s is None else window_s / 3600.0, gpus > 0)


def record_carbon(energy: dict[str, Any], carbon_cfg) -> dict[str, Any]:
    """The record's `carbon` section from its `energy` section: the location-based CO2e with the bound its
    energy carries (energy/bounds.py), and beside it the market-based, embodied and water parts."""
    out = carbon_section(energy.get("total_j"), carbon_cfg, energy_source=energy.get("source"))
    out["co2e_g_bound"] = scaled((energy.get("bounds") or {}).get("total"), energy.get("total_j"), out["co2e_g"])
    out.update(footprint.parts(usage_of(energy, out["pue"]), carbon_cfg))
    return out


def parts_config(record_carbon_cfg: dict, given: dict):
    """The [carbon] keys the parts read: a record's, with the caller's values (not None) over them."""
    known = {k: v for k, v in record_carbon_cfg.items() if k in CarbonConfig.LATER and v is not None}
    return CarbonConfig(**{**known, **{k: v for k, v in given.items() if v is not None}})


def _check(**values: float) -> None:
    for name, v in values.items():
        if v is None or v < 0:
            raise ValueError(f"{name} must be a number >= 0, got {v!r}")


def estimate(chips: float, hours: float, watts: float, pue: float = 1.0, intensity: float | None = None,
             country: str | None = None, region: str | None = None, parts_cfg=None) -> dict[str, Any]:
    """The plain calculator of published carbon accounting (Patterson et al. 2021):
    chips x hours x watts x PUE x intensity, in SI units as every JSON figure: energy_j is IT energy (before
    PUE), facility_j = energy_j x PUE, co2e_g = facility kWh x intensity. Beside it, never added,
    the market-based, embodied (chips are accelerators) and water parts of `parts_cfg` ([carbon] keys)."""
    _check(chips=chips, hours=hours, watts=watts)
    if pue < 1.0:
        raise ValueError(f"pue must be >= 1.0, got {pue}")
    it = lookup(intensity, country, region)
    energy_j = chips * hours * 3600.0 * watts
    return {
        "chips": chips, "hours": hours, "watts": watts,
        "energy_j": energy_j, "facility_j": energy_j * pue, "pue": pue,
        "intensity_g_per_kwh": it.value_g_per_kwh, "intensity_source": it.source, "intensity_note": it.note,
        "co2e_g": energy_j * pue / J_PER_KWH * it.value_g_per_kwh,
        **footprint.parts(Usage(energy_j, pue, chips, hours, gpus=True), parts_cfg),
    }


def project(tokens: float, devices: int, j_per_token: float, tokens_per_s_per_device: float,
            pue: float = 1.0, intensity: float | Intensity = WORLD_AVERAGE_G_PER_KWH, parts_cfg=None,
            gpus: bool = True) -> dict[str, Any]:
    """A full training run from measured rates, in SI units: duration_s = tokens / (rate x devices);
    energy_j = tokens x J/token (IT energy); co2e_g = energy (kWh) x PUE x intensity.
    Assumes J/token and per-device throughput stay as measured at the new device count. Beside it, never
    added, the market-based, embodied and water parts of `parts_cfg` ([carbon] keys) over those hours."""
    _check(tokens=tokens, j_per_token=j_per_token)
    if not devices or devices < 1 or not tokens_per_s_per_device or tokens_per_s_per_device <= 0:
        raise ValueError("devices and tokens_per_s_per_device must be > 0")
    it = intensity if isinstance(intensity, Intensity) else Intensity(float(intensity), "explicit")
    energy_j = tokens * j_per_token
    seconds = tokens / (tokens_per_s_per_device * devices)
    return {
        "tokens": tokens, "devices": devices, "j_per_token": j_per_token,
        "tokens_per_s_per_device": tokens_per_s_per_device,
        "duration_s": seconds,
        "energy_j": energy_j, "facility_j": energy_j * pue, "pue": pue,
        "intensity_g_per_kwh": it.value_g_per_kwh, "intensity_source": it.source,
        "co2e_g": energy_j * pue / J_PER_KWH * it.value_g_per_kwh,
        **footprint.parts(Usage(energy_j, pue, devices, seconds / 3600.0, gpus), parts_cfg),
    }


def _projection_inputs(pue_given: bool, intensity_given: bool) -> tuple[str, ...]:
    """The record fields a projection reads (prefixes of flagged fields): the energy, the rates, and the
    record's PUE and intensity unless the caller gives its own."""
    return ("energy.", "metrics.energy.j_per_token", "metrics.tokens_per_s",
            *(() if pue_given else ("carbon.pue",)), *(() if intensity_given else ("carbon.intensity_g_per_kwh",)))


def project_from_record(record: dict, tokens: float, devices: int | None = None, pue: float | None = None,
                        intensity: float | Intensity | None = None, parts: dict | None = None) -> dict[str, Any]:
    """`project` with rates taken from a run record: J/token from metrics.energy.j_per_token
    when the worker stored it, else energy.total_j / (tokens_per_s x window_s); the per-device rate is the
    record's metrics.tokens_per_s_per_device. PUE, intensity and the parts' [carbon] keys (`parts` overrides
    them by key) default to the record's. A record whose
    inputs the sanity guard flagged (record/sanity.py) is refused with the flag's reason: a projection
    scales a wrong figure by millions of tokens. (A record read by a reader carries its flags, judged on
    reading; a document without any is judged here.)"""
    inputs = _projection_inputs(pue is not None, intensity is not None)
    judged = record.get("flags")
    flags = [f for f in (judged if isinstance(judged, list) else sanity_flags(record)) if isinstance(f, dict)
             and str(f.get("field", "")).startswith(inputs)]
    if flags:
        raise ValueError(f"flagged input {flags[0]['field']} = {flags[0].get('value')}: {flags[0].get('reason')}; "
                         "a projection from it would be wrong")
    energy, carbon = record.get("energy") or {}, record.get("carbon") or {}
    metrics = record.get("metrics") or {}
    tps, per_device = metrics.get("tokens_per_s"), metrics.get("tokens_per_s_per_device")
    world = (record.get("env") or {}).get("world_size") or (record.get("config") or {}).get("world_size")
    jpt = (metrics.get("energy") or {}).get("j_per_token")
    if jpt is None:
        jpt = ratio(energy.get("total_j"), None if tps is None or energy.get("window_s") is None
                   else tps * energy["window_s"])
    if jpt is None or not tps or not per_device or not world:
        raise ValueError("record lacks energy.total_j, metrics.tokens_per_s, metrics.tokens_per_s_per_device or "
                         "world_size: cannot project")
    it = (intensity if isinstance(intensity, Intensity) else
          Intensity(float(intensity), "explicit") if intensity is not None else
          Intensity(carbon["intensity_g_per_kwh"], carbon.get("intensity_source") or "record")
          if carbon.get("intensity_g_per_kwh") is not None else world_average("record has no intensity"))
    pue = pue if pue is not None else carbon.get("pue") or 1.0
    parts_cfg = parts_config((record.get("config") or {}).get("carbon") or {}, parts or {})
    out = project(tokens, devices or world, jpt, per_device, pue, it, parts_cfg, gpus=bool(energy.get("per_device")))
    bound = (energy.get("bounds") or {}).get("total") or {}
    out.update(run_key=record.get("run_key"), energy_source=energy.get("source") or "unavailable",
               energy_includes=energy.get("total_includes") or [], energy_bound_share=bound.get("share"),
               energy_bound_reason=bound.get("reason") if bound.get("exceeds") else None)
    return out
