"""CO2e from energy: kWh x PUE x grid intensity (g CO2e/kWh), and the calculators built on it.

Intensity comes from an explicit value, else codecarbon's bundled offline data by
country (ISO 3166 alpha-3) and optional region, else (no country given) codecarbon's world
average. A country or region that data does not hold is bad input, never the world average.
The data files are read straight from the installed codecarbon package: no network,
no tracker. Every figure says where its intensity came from.
"""

from __future__ import annotations

import csv
import dataclasses
import datetime as dt
import functools
import io
import json
import os
import re
from collections import Counter
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from benchsuite.atomic import atomic_file

J_PER_KWH = 3.6e6
CODECARBON_TIME_FORMAT = "%Y-%m-%dT%H:%M:%S"   # emissions_tracker.py, EmissionsData(timestamp=...)
CSV_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")   # OWASP CSV injection: cells a spreadsheet evaluates

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
    return {
        "j_per_token": _div(total, tokens),
        "gpu_j_per_token": gpu_per_token,
        "gpu_j_per_token_reason": gpu_reason,
        "gpu_energy_source": (energy_section.get("sources") or {}).get("gpu", "unavailable"),
        "j_per_pflop": _div(total, None if model_flops is None else model_flops / 1e15),
        "avg_w_per_device": _div(_div(energy_section.get("gpu_j"), duration_s), devices),
        "gco2e_per_mtok": _div(None if co2e_g is None else co2e_g * 1e6, tokens),
        "energy_source": energy_section.get("source", "unavailable"),
        "energy_includes": energy_section.get("total_includes", []),
    }


def upgrade_v1_energy_metrics(rec: dict) -> dict:
    """A copy of a version-1 record whose metrics.energy gains gpu_j_per_token (+ reason, source) from its own
    energy.gpu_j over the measured tokens (tokens_per_step x measured steps, as the worker counts)."""
    derived = (rec.get("metrics") or {}).get("energy")
    if not isinstance(derived, dict) or "gpu_j_per_token" in derived:
        return rec
    energy = rec.get("energy") or {}
    per_step = rec["metrics"].get("tokens_per_step")
    tokens = per_step * len(rec.get("steps") or []) if per_step else None
    value, reason = gpu_j_per_token(energy, tokens)
    derived = {**derived, "gpu_j_per_token": value, "gpu_j_per_token_reason": reason,
               "gpu_energy_source": (energy.get("sources") or {}).get("gpu", "unavailable")}
    return {**rec, "metrics": {**rec["metrics"], "energy": derived}}


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


def _codecarbon_timestamp(started_at: Any, duration_s: Any) -> str | None:
    """When the run ended, as codecarbon stamps a row when its tracker stops: local wall time of
    this host, "%Y-%m-%dT%H:%M:%S", no offset (datetime.now().strftime in emissions_tracker.py)."""
    try:
        start = dt.datetime.fromisoformat(started_at)
    except (TypeError, ValueError):
        return None
    if start.tzinfo is None:   # records stamp UTC (results/schema.py utc_now)
        start = start.replace(tzinfo=dt.timezone.utc)
    end = start + dt.timedelta(seconds=duration_s if isinstance(duration_s, (int, float)) else 0)
    return end.astimezone().strftime(CODECARBON_TIME_FORMAT)


def to_codecarbon_rows(records: list[dict]) -> list[dict]:
    """One codecarbon-style row per ok record, in codecarbon's units and conventions: duration s,
    emissions kg CO2e, emissions_rate kg/s, *_power W, *_energy kWh, powers and energies
    multiplied by PUE as codecarbon does (so emissions / energy_consumed = intensity). Figures
    a run did not measure are left empty (None), not 0; durations and energies cover the energy window."""
    rows = []
    for rec in records:
        if rec.get("status") != "ok":
            continue
        energy, carbon = rec.get("energy") or {}, rec.get("carbon") or {}
        env, cfg = rec.get("env") or {}, (rec.get("config") or {})
        ccfg = cfg.get("carbon") or {}
        pue = carbon.get("pue") or 1.0
        window = energy.get("window_s") or rec.get("duration_s")
        facility_j = {k: None if energy.get(f"{k}_j") is None else energy[f"{k}_j"] * pue
                      for k in ("cpu", "gpu", "dram", "total")}
        co2e_kg = None if carbon.get("co2e_g") is None else carbon["co2e_g"] / 1000.0
        gpus = {d.get("uuid"): d.get("name") for d in (energy.get("per_device") or env.get("devices") or [])
                if d.get("uuid") and d.get("type", "cuda") == "cuda"}          # physical GPUs, each once
        cpu_models = sorted({d.get("name") for d in env.get("devices") or [] if d.get("type") == "cpu"} - {None})
        country = (ccfg.get("country") or "").strip().upper() or None
        try:
            country_name = codecarbon_data(_GLOBAL_MIX).get(country or "", {}).get("country_name")
        except (OSError, ValueError):
            country_name = None
        row = {
            "timestamp": _codecarbon_timestamp(rec.get("started_at"), rec.get("duration_s")),
            "project_name": rec.get("suite"),
            "run_id": rec.get("run_key"),
            "experiment_id": rec.get("workload"),
            "duration": window,
            "emissions": co2e_kg,
            "emissions_rate": _div(co2e_kg, window),
            "cpu_power": _div(facility_j["cpu"], window),
            "gpu_power": _div(facility_j["gpu"], window),
            "ram_power": _div(facility_j["dram"], window),
            "cpu_energy": _div(facility_j["cpu"], J_PER_KWH),
            "gpu_energy": _div(facility_j["gpu"], J_PER_KWH),
            "ram_energy": _div(facility_j["dram"], J_PER_KWH),
            "energy_consumed": _div(facility_j["total"], J_PER_KWH),
            "country_name": country_name,
            "country_iso_code": country,
            "region": (ccfg.get("region") or "").lower() or None,
            "os": env.get("os"),
            "python_version": env.get("python"),
            "codecarbon_version": _codecarbon_version(),
            "cpu_count": env.get("cpu_count"),
            "cpu_model": env.get("cpu_model") or ", ".join(cpu_models) or None,
            "gpu_count": env.get("gpu_count"),
            "gpu_model": "".join(f"{n} x {name}" for name, n in Counter(gpus.values()).items() if name) or None,
            "ram_total_size": env.get("ram_total_gb"),
            "tracking_mode": "machine",
            "on_cloud": "N",
            "pue": carbon.get("pue"),
        }
        rows.append({c: row.get(c) for c in codecarbon_columns()})
    return rows


class ExportError(Exception):
    """An export target that cannot take the file: the message names the path and the fix."""


@dataclass(frozen=True)
class CsvExport:
    path: Path
    rows_written: int
    appended: bool          # onto an existing codecarbon file, as codecarbon's FileOutput appends
    rows_already_there: int  # same run_id and timestamp already in that file: not written twice


def spreadsheet_safe(value: Any) -> Any:
    """A cell a spreadsheet will not evaluate (OWASP CSV injection): text starting with = + - @
    tab or CR gets a leading single quote; numbers, negative ones included, stay numbers."""
    return "'" + value if isinstance(value, str) and value.startswith(CSV_FORMULA_START) else value


def _check_target(path: Path) -> None:
    """An output path the CSV can be written at: in an existing folder, not at a folder or a FIFO."""
    for parent in path.parents:
        if parent.exists() and not parent.is_dir():
            raise ExportError(f"{path}: {parent} is a file, not a folder; choose an output path in a folder")
    if not path.parent.is_dir():
        raise ExportError(f"{path}: folder {path.parent} does not exist; create it first")
    if path.is_dir():
        raise ExportError(f"{path} is a folder; name the .csv file to write, e.g. {path / 'emissions.csv'}")
    if path.exists() and not path.is_file():
        raise ExportError(f"{path} is not a regular file; choose another output path")


@dataclass(frozen=True)
class _ExistingCsv:
    text: str
    header: list[str]
    keys: set[tuple[str | None, str | None]]   # (run_id, timestamp) of its rows


def _existing_csv(path: Path, columns: list[str]) -> _ExistingCsv | None:
    """An existing non-empty codecarbon file, else None. A file with other columns is refused:
    appending would misalign every value."""
    if not path.is_file() or path.stat().st_size == 0:   # empty: a new file, as codecarbon treats it
        return None
    try:
        with path.open(encoding="utf-8", newline="") as f:
            text = f.read()
        reader = csv.DictReader(io.StringIO(text, newline=""))
        header = list(reader.fieldnames or [])
        if sorted(header) != sorted(columns):   # codecarbon's FileOutput.has_valid_headers: any order
            raise ExportError(f"{path}: its header is not the emissions.csv header of codecarbon "
                              f"{_codecarbon_version()} (missing: {_some(set(columns) - set(header))}; "
                              f"extra: {_some(set(header) - set(columns))}); export to another file with -o")
        keys = {(r.get("run_id"), r.get("timestamp")) for r in reader}
    except OSError as e:
        raise ExportError(f"{path}: cannot read ({e.strerror or e}); export to another file with -o") from None
    except (UnicodeDecodeError, csv.Error) as e:
        raise ExportError(f"{path}: not a readable CSV file ({e}); export to another file with -o") from None
    return _ExistingCsv(text, header, keys)


def _some(names: set[str], shown: int = 5) -> str:
    listed = ", ".join(sorted(names)[:shown]) or "-"
    return listed + (f" and {len(names) - shown} more" if len(names) > shown else "")


def _csv_line(cells: list[Any]) -> str:
    """One CSV line ending in os.linesep, as pandas' to_csv (codecarbon's writer) ends lines. Quoted
    as if lines ended in CR LF, so that a CR inside a cell is quoted too (csv quotes only the
    characters of its line terminator) and cannot split the row for a reader."""
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\r\n").writerow(cells)
    return buf.getvalue()[:-2] + os.linesep


def _codecarbon_version() -> str:
    import codecarbon
    return codecarbon.__version__


def write_codecarbon_csv(records: list[dict], path: str | Path) -> CsvExport:
    """emissions.csv in codecarbon's columns: a new file (header even when there are no rows), or
    the rows appended to an existing codecarbon file in its column order, as codecarbon does.
    Written atomically: a reader sees the old file or the whole new one."""
    path = Path(path)
    columns = codecarbon_columns()
    _check_target(path)
    existing = _existing_csv(path, columns)
    rows = [{c: spreadsheet_safe(v) for c, v in row.items()} for row in to_codecarbon_rows(records)]
    new = [r for r in rows if not existing or (r["run_id"], r["timestamp"]) not in existing.keys]
    header = existing.header if existing else columns
    try:
        with atomic_file(path, "w", encoding="utf-8", newline="") as f:
            if existing:
                f.write(existing.text if existing.text.endswith("\n") else existing.text + os.linesep)
            else:
                f.write(_csv_line(header))
            f.writelines(_csv_line([r[c] for c in header]) for r in new)
    except OSError as e:
        raise ExportError(f"{path}: cannot write ({e.strerror or e})") from None
    return CsvExport(path, len(new), existing is not None, len(rows) - len(new))
