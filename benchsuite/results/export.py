"""`benchsuite export --format codecarbon`: run records as codecarbon's emissions.csv, in its columns,
units and conventions, so codecarbon's own users can concatenate the file with theirs; `--format
footprint`: what codecarbon has no column for (the energy's bound, market-based, embodied and water),
one row per record keyed by the same run_id, so the two files join.

Onto an existing file the rows are appended in place under a lock (a team's shared CSV keeps its
mode, owner and symlink, and concurrent exports lose no row), each run once: a row's run_id is a
UUID of the record's run key, repeat and start time in UTC, so exporting again, from another time
zone, adds nothing.
"""

from __future__ import annotations

import csv
import dataclasses
import datetime as dt
import io
import os
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from filelock import FileLock, Timeout

from benchsuite.atomic import OutputError, atomic_file, hidden_name, umask
from benchsuite.energy.carbon import J_PER_KWH, country_name
from benchsuite.record.names import record_id
from benchsuite.record.types import (Carbon, CarbonConfig, Embodied, Energy, Interval, MarketBased, Record, Status,
                                     Water)
from benchsuite.record.values import ratio
from benchsuite.results.identity import run_identity, seed_of

CODECARBON_TIME_FORMAT = "%Y-%m-%dT%H:%M:%S"   # emissions_tracker.py, EmissionsData(timestamp=...)
CSV_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")   # OWASP CSV injection: cells a spreadsheet evaluates
RUN_ID_NAMESPACE = uuid.UUID("5d9c1f3e-6a0b-5c55-9b1e-2b7f0c0e9a11")  # benchsuite's run_id UUIDs (uuid5)
LOCK_TIMEOUT_S = 120.0  # another export holding the file's lock longer than this is named, not waited on


def run_id(rec: Record) -> str:
    """The stable key of a measurement (what codecarbon calls run_id): a UUID of its run key, repeat and
    start time in UTC. The same record exported twice, or from another time zone, has the same one."""
    started = rec.started_at.astimezone(dt.timezone.utc).isoformat()
    return str(uuid.uuid5(RUN_ID_NAMESPACE, f"{record_id(rec.run_key, rec.repeat)}@{started}"))


def codecarbon_columns() -> list[str]:
    """Column names of codecarbon's emissions.csv (output_methods/emissions_data.py)."""
    from codecarbon.output_methods.emissions_data import EmissionsData
    return [f.name for f in dataclasses.fields(EmissionsData)]


def _codecarbon_timestamp(started_at: dt.datetime, duration_s: float | None) -> str | None:
    """When the run ended, as codecarbon stamps a row when its tracker stops: local wall time of
    this host, "%Y-%m-%dT%H:%M:%S", no offset (datetime.now().strftime in emissions_tracker.py)."""
    try:
        end = started_at + dt.timedelta(seconds=duration_s or 0)
        return end.astimezone().strftime(CODECARBON_TIME_FORMAT)
    except (ValueError, OverflowError):  # a time past year 9999 (an empty cell)
        return None


def _facility_j(energy: Energy | None, pue: float) -> dict[str, float | None]:
    """Each part's joules × PUE, as codecarbon states energy (None: not measured)."""
    joules = (energy.cpu_j, energy.gpu_j, energy.dram_j, energy.total_j) if energy else (None,) * 4
    return {part: None if j is None else j * pue for part, j in zip(("cpu", "gpu", "dram", "total"), joules)}


def _hardware(rec: Record) -> dict[str, Any]:
    """codecarbon's gpu_model ('2 x NVIDIA H100') from the physical GPUs, each once by UUID, and its cpu_model."""
    env = rec.env
    devices = (rec.energy.per_device if rec.energy else None) or env.devices or []
    gpus = {d.uuid: d.name for d in devices if d.uuid and (d.type or "cuda") == "cuda"}
    cpu_models = sorted({d.name for d in env.devices or [] if d.type == "cpu"} - {None})
    return {"cpu_model": env.cpu_model or ", ".join(cpu_models) or None,
            "gpu_model": "".join(f"{n} x {name}" for name, n in Counter(gpus.values()).items() if name) or None}


def _place(config: CarbonConfig | None) -> dict[str, str | None]:
    """codecarbon's country and region columns from the run's [carbon] place."""
    country = ((config.country if config else None) or "").strip().upper() or None
    return {"country_name": country_name(country), "country_iso_code": country,
            "region": ((config.region if config else None) or "").lower() or None}


def to_codecarbon_rows(records: list[Record]) -> list[dict]:
    """One codecarbon-style row per ok record, in codecarbon's units and conventions: duration s,
    emissions kg CO2e, emissions_rate kg/s, *_power W, *_energy kWh, powers and energies
    multiplied by PUE as codecarbon does (so emissions / energy_consumed = intensity). Figures
    a run did not measure are left empty (None), not 0; durations and energies cover the energy window."""
    rows = []
    for rec in records:
        if rec.status != Status.OK:
            continue
        energy, carbon, env = rec.energy, rec.carbon, rec.env
        window = (energy.window_s if energy else None) or rec.duration_s
        facility_j = _facility_j(energy, carbon.pue if carbon else 1.0)
        co2e_kg = None if carbon is None or carbon.co2e_g is None else carbon.co2e_g / 1000.0
        row = {
            "timestamp": _codecarbon_timestamp(rec.started_at, rec.duration_s),
            "project_name": rec.suite,
            "run_id": run_id(rec),
            "experiment_id": experiment_id(rec),
            "duration": window,
            "emissions": co2e_kg,
            "emissions_rate": ratio(co2e_kg, window),
            "cpu_power": ratio(facility_j["cpu"], window),
            "gpu_power": ratio(facility_j["gpu"], window),
            "ram_power": ratio(facility_j["dram"], window),
            "cpu_energy": ratio(facility_j["cpu"], J_PER_KWH),
            "gpu_energy": ratio(facility_j["gpu"], J_PER_KWH),
            "ram_energy": ratio(facility_j["dram"], J_PER_KWH),
            "energy_consumed": ratio(facility_j["total"], J_PER_KWH),
            **_place(rec.config.carbon),
            "os": env.os,
            "python_version": env.python,
            "codecarbon_version": _codecarbon_version(),
            "cpu_count": env.cpu_count,
            "gpu_count": env.gpu_count,
            **_hardware(rec),
            "ram_total_size": env.ram_total_gb,
            "tracking_mode": "machine",
            "on_cloud": "N",
            "pue": carbon.pue if carbon else None,
        }
        rows.append({c: row.get(c) for c in codecarbon_columns()})
    return rows


FOOTPRINT_COLUMNS = [
    "run_id", "project_name", "experiment_id", "workload", "seed", "repeat", "routing", "duration",
    "energy_consumed", "energy_consumed_low", "energy_consumed_high", "energy_bound_flagged", "energy_bound_reason",
    "emissions", "emissions_low", "emissions_high",
    "market_intensity", "market_emissions", "embodied_emissions", "embodied_device_hours", "embodied_source",
    "water_onsite", "water_offsite",
]


def experiment_id(rec: Record) -> str:
    """'switch · 1d9bc72c73173873': the workload and the run's identity, which its seeds and repeats share, as an
    experiment's runs do; runs that differ by routing, threads or precision are separate experiments."""
    return f"{rec.workload} · {run_identity(rec)}"


def _kg(g: float | None) -> float | None:
    return None if g is None else g / 1000.0


def to_footprint_rows(records: list[Record]) -> list[dict]:
    """One row per ok record beside its emissions.csv row (same run_id), in codecarbon's units: energy kWh
    × PUE with the meters' low and high, location-based emissions kg with theirs, the market-based figure
    (kg, at its g/kWh: never added to emissions), embodied kg with its device-hours and source, water L.
    A section the record lacks reads as an empty one: its cells stay empty."""
    rows = []
    for rec in records:
        if rec.status != Status.OK:
            continue
        energy, carbon = rec.energy or Energy(), rec.carbon or Carbon()
        bound = energy.bounds.total if energy.bounds else None
        co2e, market = carbon.co2e_g_bound or Interval(), carbon.market or MarketBased()
        embodied, water = carbon.embodied or Embodied(), carbon.water or Water()

        def kwh(j: float | None) -> float | None:
            return None if j is None else j * carbon.pue / J_PER_KWH

        rows.append({
            "run_id": run_id(rec), "project_name": rec.suite, "experiment_id": experiment_id(rec),
            "workload": rec.workload, "seed": seed_of(rec), "repeat": rec.repeat,
            "routing": rec.config.moe.routing if rec.config.moe else None,
            "duration": energy.window_s or rec.duration_s,
            "energy_consumed": kwh(energy.total_j), "energy_consumed_low": kwh(bound.low_j if bound else None),
            "energy_consumed_high": kwh(bound.high_j if bound else None),
            "energy_bound_flagged": bound.exceeds if bound else None,
            "energy_bound_reason": bound.reason if bound else None,
            "emissions": _kg(carbon.co2e_g), "emissions_low": _kg(co2e.low), "emissions_high": _kg(co2e.high),
            "market_intensity": market.intensity_g_per_kwh, "market_emissions": _kg(market.co2e_g),
            "embodied_emissions": _kg(embodied.co2e_g), "embodied_device_hours": embodied.device_hours,
            "embodied_source": embodied.source, "water_onsite": water.onsite_l, "water_offsite": water.offsite_l,
        })
    return rows


@dataclass(frozen=True)
class CsvFormat:
    """A CSV an export writes: its header, its rows from records, and how a foreign header is named."""

    columns: Callable[[], list[str]]
    rows: Callable[[list[Record]], list[dict]]
    header_name: Callable[[], str]


CODECARBON = CsvFormat(codecarbon_columns, to_codecarbon_rows,
                       lambda: f"the emissions.csv header of codecarbon {_codecarbon_version()}")
FOOTPRINT = CsvFormat(lambda: list(FOOTPRINT_COLUMNS), to_footprint_rows,
                      lambda: "the footprint.csv header of this benchsuite")
FORMATS = {"codecarbon": CODECARBON, "footprint": FOOTPRINT}


class ExportError(Exception):
    """An export target that cannot take the file: the message names the path and the fix."""


@dataclass(frozen=True)
class CsvExport:
    path: Path
    rows_written: int
    appended: bool          # onto an existing codecarbon file, as codecarbon's FileOutput appends
    rows_already_there: int  # the same run_id already in that file: not written twice


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
    header: list[str]
    run_ids: set[str]
    ends_with_newline: bool


def _existing_csv(path: Path, columns: list[str], fmt: CsvFormat) -> _ExistingCsv | None:
    """An existing non-empty file of the format, else None. A file with other columns is refused:
    appending would misalign every value."""
    if not path.is_file() or path.stat().st_size == 0:   # empty: a new file, as codecarbon treats it
        return None
    try:
        with path.open(encoding="utf-8", newline="") as f:
            text = f.read()
        reader = csv.DictReader(io.StringIO(text, newline=""))
        header = list(reader.fieldnames or [])
        if sorted(header) != sorted(columns):   # codecarbon's FileOutput.has_valid_headers: any order
            raise ExportError(f"{path}: its header is not {fmt.header_name()} "
                              f"(missing: {_some(set(columns) - set(header))}; "
                              f"extra: {_some(set(header) - set(columns))}); export to another file with -o")
        run_ids = {r.get("run_id") for r in reader}
    except OSError as e:
        raise ExportError(f"{path}: cannot read ({e.strerror or e}); export to another file with -o") from None
    except (UnicodeDecodeError, csv.Error) as e:
        raise ExportError(f"{path}: not a readable CSV file ({e}); export to another file with -o") from None
    return _ExistingCsv(header, run_ids, text.endswith("\n"))


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


def write_csv(records: list[Record], path: str | Path, fmt: CsvFormat = CODECARBON) -> CsvExport:
    """emissions.csv in codecarbon's columns (or footprint.csv, with fmt=FOOTPRINT): a new file (header even
    when there are no rows), or the rows appended in place to an existing file of the format in its column
    order, as codecarbon does. Under a lock beside the file (.NAME.lock): concurrent exports wait their turn,
    and each row is written once."""
    path = Path(path)
    _check_target(path)
    target = Path(os.path.realpath(path))  # a symlinked team file: its target gets the rows, the link stays
    columns = fmt.columns()
    rows = [{c: spreadsheet_safe(v) for c, v in row.items()} for row in fmt.rows(records)]
    lock = FileLock(target.parent / hidden_name(target, ".lock"), mode=0o666 & ~umask())
    try:
        with lock.acquire(timeout=LOCK_TIMEOUT_S):
            existing = _existing_csv(target, columns, fmt)
            new = list({r["run_id"]: r for r in rows if not existing or r["run_id"] not in existing.run_ids}.values())
            if existing or target.exists():
                _append(target, existing, columns, new)
            else:
                with atomic_file(target, "w", encoding="utf-8", newline="") as f:
                    f.write(_csv_line(columns))
                    f.writelines(_csv_line([r[c] for c in columns]) for r in new)
    except Timeout:
        raise ExportError(f"{path}: another export has held {lock.lock_file} for {LOCK_TIMEOUT_S:g} s; "
                          "wait for it, or remove that file if no export is running") from None
    except OSError as e:  # the lock beside the file, the append, the new file: said as every failed write is
        raise ExportError(str(OutputError(path, e))) from None
    return CsvExport(path, len(new), existing is not None, len(rows) - len(new))


def _append(target: Path, existing: _ExistingCsv | None, columns: list[str], rows: list[dict]) -> None:
    """The rows appended to the file itself (its inode, mode and owner unchanged), in its column order; an
    empty file gets the header first. A failed write is undone: the file is cut back to its old length."""
    header = existing.header if existing else columns
    text = "" if existing is None or existing.ends_with_newline else os.linesep
    text += ("" if existing else _csv_line(header)) + "".join(_csv_line([r[c] for c in header]) for r in rows)
    data = text.encode("utf-8")
    fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        except OSError:
            os.ftruncate(fd, size)
            raise
    finally:
        os.close(fd)
