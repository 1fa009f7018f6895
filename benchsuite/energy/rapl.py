"""CPU package and DRAM energy from Linux RAPL (powercap sysfs).

Zones: /sys/class/powercap/intel-rapl:N (name "package-N") and their subzones
intel-rapl:N:M (name "dram"; "core"/"uncore" are parts of the package, so skipped).
Each `energy_uj` is a counter that wraps at `max_energy_range_uj`. Since Linux 5.10
energy_uj is readable by root only (CVE-2020-8694, "Platypus"), hence the common
"permission denied": the monitor then falls back to codecarbon's estimate.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from benchsuite.energy.common import EnergyError, Reading
from benchsuite.record.types import Source


@dataclass(frozen=True)
class Zone:
    path: Path
    name: str
    kind: str               # "package" | "dram"
    max_range_uj: int | None


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except PermissionError as e:
        raise EnergyError(f"permission denied reading {path} (root-only since Linux 5.10, "
                          f"CVE-2020-8694)") from e
    except OSError as e:
        raise EnergyError(f"cannot read {path}: {e}") from e


def find_zones(root: str | Path) -> list[Zone]:
    """Package zones and their dram subzones under `root` (psys/core/uncore skipped)."""
    root = Path(root)
    if not root.is_dir():
        raise EnergyError(f"{root} does not exist (no powercap / RAPL on this machine)")
    dirs = {p.name: p for p in root.glob("intel-rapl:*")}                 # real sysfs: flat symlinks
    dirs.update({p.name: p for p in root.glob("intel-rapl:*/intel-rapl:*:*")})   # nested form
    zones = []
    for zone_id, path in sorted(dirs.items()):
        name = _read(path / "name")
        if zone_id.count(":") == 1 and name.startswith("package"):
            kind = "package"
        elif zone_id.count(":") == 2 and name == "dram":
            kind = "dram"
        else:
            continue
        try:
            max_range = int(_read(path / "max_energy_range_uj"))
        except (EnergyError, ValueError):
            max_range = None
        zones.append(Zone(path, name, kind, max_range))
    if not any(z.kind == "package" for z in zones):
        raise EnergyError(f"no RAPL package zone under {root}")
    return zones


class RaplSensor:
    """Counters are unwrapped on every read (each begin/end of any window), so a window
    is exact as long as no gap between reads exceeds one wrap period
    (max_energy_range_uj / power: about 15 min for a 262 kJ range at 300 W)."""

    def __init__(self, root: str | Path = "/sys/class/powercap"):
        self.zones = find_zones(root)
        self.has_dram = any(z.kind == "dram" for z in self.zones)
        self._last = {z.path: self._raw(z) for z in self.zones}     # raises when unreadable
        self._total_uj = {z.path: 0 for z in self.zones}
        self._open: dict[str, tuple[float, dict[Path, int]]] = {}

    @staticmethod
    def _raw(z: Zone) -> int:
        text = _read(z.path / "energy_uj")
        try:
            return int(text)
        except ValueError as e:
            raise EnergyError(f"{z.path / 'energy_uj'}: not an integer: {text!r}") from e

    def poll(self) -> dict[Path, int]:
        """Unwrapped microjoules per zone since this sensor was built."""
        for z in self.zones:
            raw = self._raw(z)
            delta = raw - self._last[z.path]
            if delta < 0:                       # the counter wrapped
                if z.max_range_uj is None:
                    raise EnergyError(f"{z.path} wrapped but max_energy_range_uj is unreadable")
                delta += z.max_range_uj
            self._total_uj[z.path] += delta
            self._last[z.path] = raw
        return dict(self._total_uj)

    def begin(self, name: str) -> None:
        self._open[name] = (time.monotonic(), self.poll())

    def end(self, name: str) -> dict[str, Reading]:
        _, start = self._open.pop(name)
        now = self.poll()

        def total(kind: str) -> float:
            return sum(now[z.path] - start[z.path] for z in self.zones if z.kind == kind) / 1e6

        def detail(kind: str) -> dict:
            """The zones read, and the smallest counter range (J) among them: a window drawing half of it
            between reads may hide a wrap (energy/bounds.py)."""
            zones = [z for z in self.zones if z.kind == kind]
            ranges = [z.max_range_uj / 1e6 for z in zones if z.max_range_uj]
            return {"rapl_zones": [z.name for z in zones], "rapl_range_j": min(ranges) if ranges else None}

        cpu = Reading(total("package"), Source.MEASURED, detail=detail("package"))
        dram = (Reading(total("dram"), Source.MEASURED, detail=detail("dram")) if self.has_dram else
                Reading.unavailable("no RAPL dram zone (common on client and AMD CPUs)"))
        return {"cpu": cpu, "dram": dram}
