"""Two results folders side by side (two commits, two clusters): runs matched by identity, the ratio
B/A of each headline figure with a 95 % interval over the runs' repeats, and a verdict per figure.

The units are runs, not steps. One run's steps agree to a percent or two, but two runs of one
config on one machine differ by several percent (clocks, placement, the allocator): an interval over
step times holds none of that spread and calls unchanged runs better or worse. So each side's
figure is the median over its ok records of the run (its repeats; with train.seed ignored, the median
over seeds of each seed's median, as the results model states a run's figure), and B/A's interval is Student's t on the logs with the run-to-run spread pooled over both
sides (stats.pooled_ratio): one run has about the same spread on two machines, and at 2 repeats a
side the pooled test covers 95 % where Welch's covers about 98 %.

A gate must not pass what it did not compare, nor what it cannot judge: a run that failed in B, or is
missing from B, is a regression; a figure with no interval (one repeat a side) is judged by the threshold
on its point ratio alone, as asv judges by its factor when it has no statistics, and says so; a row that
--ignore made of several configurations names them per side, as its label names pooled seeds; a folder
inside the other is left out of it (and said); estimated energy (a fixed power × time) is shown, never
judged; an energy ratio inside the meters' bound (energy/bounds.py) is "not
resolvable by the meters", whatever the repeats say.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path

from rich.markup import escape
from rich.table import Table

from benchsuite.record.kinds import source_kind
from benchsuite.record.values import dig, num
from benchsuite.record.names import digest
from benchsuite.record.sections import hashed
from benchsuite.record.types import Config, Error, Interval, PerWork, Record, Status
from benchsuite.results.identity import (SEED, SITE_SETTINGS, TEXT_ONLY, differing_keys, hardware_label,
                                         ignored_paths, seed_of, seeds_text, told_apart, without)
from benchsuite.results.stats import pooled_ratio, run_median
from benchsuite.results.store import load_records
from benchsuite.terminal import printable

DEFAULT_THRESHOLD = 0.05
METHOD = ("95 % interval: Student's t on the repeats' log figures, pooled run-to-run spread "
          "(scipy.stats.ttest_ind, equal_var=True); A, B: medians over each side's ok records")
ESTIMATED = "estimated energy (a fixed power × time): not judged"
NAMED = {"world_size", "nodes", "scaling"}  # config keys a run's label shows: never suggested for --ignore


class CompareError(Exception):
    """Two folders that cannot be compared (missing, not a folder, no record, the same folder)."""


class Verdict(str, Enum):
    BETTER = "better"
    WORSE = "worse"
    SAME = "no significant change"
    UNRESOLVABLE = "not resolvable by the meters"  # B/A lies inside the energy meters' bound
    UNAVAILABLE = "n/a"


@dataclass(frozen=True)
class Metric:
    name: str
    label: str
    figure: Callable[[Record], float | None]  # the figure as a record holds it
    higher_is_better: bool
    energy: bool = False  # from the energy reading: judged only when measured, and beyond the meters' bound


def per_work(rec: Record) -> PerWork:
    """The record's energy per unit of work; an empty section (every figure None) when it has none."""
    return rec.metrics.energy if rec.metrics and rec.metrics.energy else PerWork()


METRICS = (
    Metric("tokens_per_s", "tok/s", lambda r: r.metrics.tokens_per_s if r.metrics else None, True),
    Metric("mfu", "MFU", lambda r: r.metrics.mfu if r.metrics else None, True),
    Metric("j_per_token", "J/token", lambda r: per_work(r).j_per_token, False, energy=True),
    Metric("gco2e_per_mtok", "gCO2e/Mtok", lambda r: per_work(r).gco2e_per_mtok, False, energy=True),
)
LABELS = {m.name: m.label for m in METRICS}


@dataclass(frozen=True)
class MetricComparison:
    metric: str
    a: float | None  # median over A's records
    b: float | None
    ratio: float | None  # B / A, of the medians
    ci95: tuple[float, float] | None
    verdict: Verdict
    reason: str | None = None  # why the verdict is n/a or not resolvable, or why there is no interval
    estimated: bool = False  # energy from a fixed power × time on either side
    meter_bound: tuple[float, float | None] | None = None  # B/A as far as the energy meters can tell
    point_estimate: bool = False  # no interval: judged by the threshold on the ratio alone

    @property
    def basis(self) -> str | None:
        """'point estimate: <why no interval>' where the verdict rests on the ratio alone, else None."""
        return f"point estimate: {self.reason}" if self.point_estimate else None


@dataclass(frozen=True)
class RunComparison:
    run: str  # suite/workload w{world} n{nodes} {scaling} · seed(s) ...
    identity: str  # short hash of the identity config
    hardware_a: str
    hardware_b: str
    seeds_a: list[int]
    seeds_b: list[int]
    repeats_a: int  # ok records: the units of the interval
    repeats_b: int
    metrics: list[MetricComparison]
    configurations_a: int = 1  # configurations pooled on the side (more than one only under --ignore)
    configurations_b: int = 1
    ignored_values_a: dict[str, list] = field(default_factory=dict)  # each key differing in the row → its values
    ignored_values_b: dict[str, list] = field(default_factory=dict)
    pooled: list[str] = field(default_factory=list)  # 'pools 2 configurations on side A: model.layers = 1, 2'

    @property
    def worse(self) -> list[MetricComparison]:
        return [m for m in self.metrics if m.verdict is Verdict.WORSE]

    @property
    def regressed(self) -> bool:
        return bool(self.worse)


@dataclass(frozen=True)
class FailedRun:
    """A run with ok records in A whose identity in B has only failed records."""

    run: str
    identity: str
    error: str  # "<type>: <message>" of B's first failed record


@dataclass(frozen=True)
class UnmatchedRun:
    """A run of one folder whose identity the other folder has not at all (or only failed there)."""

    run: str
    identity: str
    hardware: str
    closest: str  # the nearest run of the other folder and the keys that differ, or why there is none


@dataclass(frozen=True)
class Comparison:
    a: str
    b: str
    threshold: float
    ignored: list[str]  # --ignore keys, left out of the match
    method: str
    runs: list[RunComparison]
    failed_in_b: list[FailedRun] = field(default_factory=list)
    only_a: list[UnmatchedRun] = field(default_factory=list)  # missing in B
    only_b: list[UnmatchedRun] = field(default_factory=list)
    left_out_a: list[str] = field(default_factory=list)  # B's folder, when it lies inside A's
    left_out_b: list[str] = field(default_factory=list)

    @property
    def regressions(self) -> list[str]:
        """What a gate fails on: a figure significantly worse, a run failed in B, a run missing in B."""
        return [r.run for r in self.runs if r.regressed] + [f.run for f in self.failed_in_b] \
            + [u.run for u in self.only_a]


@dataclass
class SideRun:
    """The records of one identity in one folder."""

    config: dict  # the identity config as JSON values (what must match)
    ok: list[Record] = field(default_factory=list)
    failed: list[Record] = field(default_factory=list)

    @property
    def records(self) -> list[Record]:
        return self.ok or self.failed


# ----------------------------------------------------------------------------- identity and labels


def identity_config(config: Config, ignored: Sequence[tuple[str, ...]] = ()) -> dict:
    """The resolved config less what is never measured (TEXT_ONLY), what a site chooses (SITE_SETTINGS)
    and the --ignore keys: what must match for two runs to compare. The seed stays unless ignored."""
    return without(config, (*TEXT_ONLY, *SITE_SETTINGS, *ignored))


def identity_key(config: Config, ignored: Sequence[tuple[str, ...]] = ()) -> str:
    """The hash of identity_config, as run keys hash a config (record.sections.hashed)."""
    return digest(hashed(identity_config(config, ignored)))


def seeds_of(records: list[Record]) -> list[int]:
    return sorted({seed_of(r) for r in records})


def seeds_label(seeds_a: list[int], seeds_b: list[int] | None = None) -> str:
    """'seed 1', 'seeds 0, 1', or 'seeds 0 → 1' when the two sides ran other seeds (--ignore train.seed)."""
    both = set(seeds_a) | set(seeds_b or ())
    text = seeds_text(seeds_a) + (f" → {seeds_text(seeds_b)}" if seeds_b is not None and seeds_b != seeds_a else "")
    return f"{'seeds' if len(both) > 1 else 'seed'} {text}"


def configurations(records: list[Record]) -> list[dict]:
    """The distinct configurations among records: identity configs less the seed (the label names seeds).
    More than one only where --ignore left keys out of the match."""
    seen: dict[str, dict] = {}
    for rec in records:
        cfg = identity_config(rec.config, (SEED,))
        seen.setdefault(digest(cfg), cfg)
    return list(seen.values())


def held_values(configs: list[dict], keys: list[str]) -> dict[str, list]:
    """Each key → the values the configs hold, each once, numbers in order before other values."""
    def order(v):
        number = isinstance(v, (int, float)) and not isinstance(v, bool)
        return (0, v, "") if number else (1, 0, json.dumps(v, sort_keys=True, default=str))
    return {k: sorted({order(v): v for v in (dig(c, *k.split(".")) for c in configs)}.values(), key=order)
            for k in keys}


def pooled_notes(row: dict[str, tuple[int, dict[str, list]]]) -> list[str]:
    """Per side ('A' → (configurations, values held)), 'pools 2 configurations on side A: model.layers = 1, 2',
    or 'one configuration on side B: …': a blend of configurations is said, never hidden in the figure."""
    notes = []
    for side, (n, values) in row.items():
        held = "; ".join(f"{k} = {', '.join(_json_text(v) for v in vs)}" for k, vs in values.items())
        notes.append(f"{f'pools {n} configurations' if n > 1 else 'one configuration'} on side {side}: {held}")
    return notes


def run_label(rec: Record, seeds_a: list[int], seeds_b: list[int] | None = None) -> str:
    """'suite/dense w2 n1 weak · seed 1': the run and the seed(s) its records ran."""
    cfg = rec.config
    return f"{rec.suite}/{rec.workload} w{cfg.world_size} n{cfg.nodes} {cfg.scaling} · " \
           + seeds_label(seeds_a, seeds_b)


# ----------------------------------------------------------------------------- one run


def figures(records: list[Record], metric: Metric) -> list[float | None]:
    return [num(metric.figure(r)) for r in records]


def estimated_energy(rec: Record) -> bool:
    """True when the record's energy was not read from a meter (record/kinds.py: its source is not metered)."""
    return not source_kind((rec.energy.source if rec.energy else None) or per_work(rec).energy_source).metered


def _median(records: list[Record], values: list[float | None]) -> float | None:
    """The side's figure as the results model states a run's: the median over seeds of each seed's median
    over its repeats (one seed: the median over the records)."""
    present = [(seed_of(r), v) for r, v in zip(records, values) if v is not None]
    return run_median(present) if present else None


def _missing(values: list[float | None], side: str) -> str | None:
    """'A', '1 of 3 records of A', or None when every record of the side has the figure."""
    gaps = sum(v is None for v in values)
    if not gaps:
        return None
    return side if gaps == len(values) else f"{gaps} of {len(values)} records of {side}"


Bound = tuple[float, float | None]  # (share below, share above) of a figure; above None: unbounded


def relative_bound(rec: Record) -> Bound | None:
    """A record's energy bound as its meters give it (bound_of). The relative bound of every energy figure is its
    J/token's (J/token and CO2e scale the same joules)."""
    energy = per_work(rec)
    bound = energy.j_per_token_bound or Interval()
    return bound_of(bound.low, bound.high, energy.j_per_token)


def bound_of(low, high, value) -> Bound | None:
    """(share below, share above) of an energy figure `value` its meters bound to [low, high] (energy/bounds.py);
    above is None when unbounded (a possibly missed counter wrap), and None when there is no bound. Plain values:
    a record's (relative_bound) or the results model's columns of it (results/verdicts.py)."""
    low, high, value = num(low), num(high), num(value)
    if low is None or not value:
        return None
    return 1 - low / value, None if high is None else high / value - 1


def widest_bound(bounds: Sequence[Bound | None]) -> Bound | None:
    """A side's bound: the widest among its records' (relative_bound); None when a record has none."""
    if not bounds or any(b is None for b in bounds):
        return None
    return max(lo for lo, _ in bounds), None if any(hi is None for _, hi in bounds) else max(hi for _, hi in bounds)


def meter_ratio(a: float, b: float, recs_a: list[Record], recs_b: list[Record]) -> Bound | None:
    """The range of B/A the meters allow over these records (bounded_ratio)."""
    return bounded_ratio(a, b, widest_bound([relative_bound(r) for r in recs_a]),
                         widest_bound([relative_bound(r) for r in recs_b]))


def bounded_ratio(a: float, b: float, bound_a: Bound | None, bound_b: Bound | None) -> Bound | None:
    """The range of B/A the meters allow: each side's figure moved to the far ends of its bound (widest_bound);
    None when a side has no bound."""
    if bound_a is None or bound_b is None:
        return None
    (a_lo, a_hi), (b_lo, b_hi) = bound_a, bound_b
    low = b * (1 - b_lo) / (a * (1 + a_hi)) if a_hi is not None else 0.0
    high = b * (1 + b_hi) / (a * (1 - a_lo)) if b_hi is not None and a_lo < 1 else None
    return low, high


def verdict(metric: Metric, ratio: float, ci95: tuple[float, float] | None, threshold: float) -> Verdict:
    """Significant when the interval excludes 1 and the change exceeds the threshold. With no interval (too
    few repeats) the threshold alone judges the ratio: a gate must not pass what it cannot judge."""
    if (ci95 is not None and ci95[0] <= 1 <= ci95[1]) or abs(ratio - 1) <= threshold:
        return Verdict.SAME
    return Verdict.BETTER if (ratio > 1) == metric.higher_is_better else Verdict.WORSE


def compare_metric(metric: Metric, recs_a: list[Record], recs_b: list[Record], threshold: float) -> MetricComparison:
    """One figure of one run: the sides' medians, B/A and its pooled-t interval, and the verdict."""
    values_a, values_b = figures(recs_a, metric), figures(recs_b, metric)
    a, b = _median(recs_a, values_a), _median(recs_b, values_b)
    missing = [m for m in (_missing(values_a, "A"), _missing(values_b, "B")) if m]
    if missing:
        return MetricComparison(metric.name, a, b, None, None, Verdict.UNAVAILABLE,
                                f"{metric.label} not recorded in {' and '.join(missing)}")
    interval = pooled_ratio(values_b, values_a)
    ratio = b / a if a and interval.point is not None else None  # (a value not positive: no ratio)
    ci95 = None if interval.lo is None else (interval.lo, interval.hi)
    estimated = metric.energy and any(estimated_energy(r) for r in (*recs_a, *recs_b))
    meters = meter_ratio(a, b, recs_a, recs_b) if metric.energy and not estimated and ratio is not None else None
    if meters is not None and meters[0] <= 1 and (meters[1] is None or 1 <= meters[1]):
        high = "unbounded" if meters[1] is None else f"{meters[1]:.3f}"
        return MetricComparison(metric.name, a, b, ratio, ci95, Verdict.UNRESOLVABLE,
                                f"B/A {ratio:.3f} lies within the meters' bound ({meters[0]:.3f}–{high}): "
                                f"the energy meters cannot tell these runs apart", meter_bound=meters)
    if estimated or ratio is None:  # (no ratio: a value not positive)
        return MetricComparison(metric.name, a, b, ratio, ci95, Verdict.UNAVAILABLE,
                                ESTIMATED if estimated else interval.reason, estimated, meters)
    return MetricComparison(metric.name, a, b, ratio, ci95, verdict(metric, ratio, ci95, threshold),
                            interval.reason, meter_bound=meters, point_estimate=ci95 is None)


def compare_run(recs_a: list[Record], recs_b: list[Record], threshold: float = DEFAULT_THRESHOLD,
                identity: str | None = None, name: str | None = None) -> RunComparison:
    """B against A for one run, given each side's ok records (its repeats, and seeds or configurations when
    pooled: the keys that differ among the row's configurations are named with each side's values)."""
    seeds_a, seeds_b = seeds_of(recs_a), seeds_of(recs_b)
    configs_a, configs_b = configurations(recs_a), configurations(recs_b)
    both = configs_a + configs_b
    keys = sorted({k for c in both[1:] for k in differing_keys(both[0], c)})
    values_a, values_b = held_values(configs_a, keys), held_values(configs_b, keys)
    pooled = pooled_notes({"A": (len(configs_a), values_a), "B": (len(configs_b), values_b)}) if keys else []
    return RunComparison(name or run_label(recs_a[0], seeds_a, seeds_b), identity or identity_key(recs_a[0].config),
                         hardware_label(recs_a), hardware_label(recs_b), seeds_a, seeds_b, len(recs_a),
                         len(recs_b), [compare_metric(m, recs_a, recs_b, threshold) for m in METRICS],
                         len(configs_a), len(configs_b), values_a, values_b, pooled)


# ----------------------------------------------------------------------------- two folders


def nested_folders(a: Path, b: Path) -> tuple[list[Path], list[Path]]:
    """(folders to leave out of A's scan, of B's): the other side's folder when it lies inside.
    Compared by real path, so a symlink or '..' does not hide it."""
    ra, rb = Path(os.path.realpath(a)), Path(os.path.realpath(b))
    if ra == rb:
        raise CompareError(f"{a} and {b} are the same folder ({ra}): compare takes two results folders, "
                           f"a baseline A and a folder B to judge against it")
    return ([b] if rb.is_relative_to(ra) else []), ([a] if ra.is_relative_to(rb) else [])


def check_folder(folder: Path) -> None:
    if not folder.is_dir():
        what = "not a folder: compare takes two results folders" if folder.exists() else "no such results folder"
        raise CompareError(f"{folder}: {what}")


SideKey = tuple[str, "int | None"]  # (identity key of the config, threads per rank)


def load_side(folder: str | Path, ignored: Sequence[tuple[str, ...]] = (),
              exclude: list[Path] | None = None) -> dict[SideKey, SideRun]:
    """(identity key, threads per rank) → the folder's records of that run, ok and failed apart (a run failed
    in B is a regression, so failed records are read too). One folder's runs at two thread counts are two
    runs (a CPU run's speed follows its threads), never pooled."""
    folder = Path(folder)
    check_folder(folder)
    side: dict[str, SideRun] = {}
    for one in load_records(folder, exclude=exclude):
        cfg = identity_config(one.record.config, ignored)
        key = (digest(hashed(cfg)), one.record.env.threads_per_rank)  # identity_key of the config just made
        run = side.setdefault(key, SideRun(cfg))
        (run.ok if one.record.status == Status.OK else run.failed).append(one.record)
    if not side:
        left_out = f" (left out: {', '.join(map(str, exclude))})" if exclude else ""
        raise CompareError(f"{folder}: no readable record under it{left_out}: nothing to compare")
    return side


def error_text(rec: Record) -> str:
    """'<type>: <message>' of a failed record, the message's first line, clipped."""
    err = rec.error or Error()
    message = (err.message or "").strip().split("\n")[0]
    message = message if len(message) <= 200 else message[:199] + "…"
    return f"{err.type or 'error'}: {message}" if message or err.type else "no error recorded"


def _json_text(value) -> str:
    """A config value as JSON text, clipped to 40 characters."""
    text = json.dumps(value, default=str)
    return text if len(text) <= 40 else text[:39] + "…"


def _value(config: dict, key: str) -> str:
    """A key's value in an identity config (JSON values, walked by the dotted key a user can --ignore)."""
    return _json_text(dig(config, *key.split(".")))


def closest_note(run: SideRun, other: dict[SideKey, SideRun], side: str) -> str:
    """Names the run of the other folder nearest to an unmatched one (same suite and workload, fewest
    differing keys), the keys that differ with their values, and the --ignore that compares across them;
    or, for the same config at other thread counts, those."""
    other_side = "B" if side == "A" else "A"
    rec = run.records[0]
    peers = [(differing_keys(run.config, o.config), run_label(o.records[0], seeds_of(o.records)), o.config, o)
             for o in other.values() if (o.records[0].suite, o.records[0].workload) == (rec.suite, rec.workload)]
    if not peers:
        return f"no run of {other_side} is of {rec.suite}/{rec.workload}"
    keys, name, config, nearest = min(peers, key=lambda p: (len(p[0]), p[1]))
    if not keys:
        return (f"{other_side} has this config at other threads per rank only ({hardware_label(nearest.records)}); "
                f"a config is matched across thread counts where each folder holds it at one")
    cfg_a, cfg_b = (run.config, config) if side == "A" else (config, run.config)
    diffs = ", ".join(f"{k} ({_value(cfg_a, k)} in A, {_value(cfg_b, k)} in B)" for k in keys)
    note = f"differs from {other_side}'s {name} {'only by' if len(keys) == 1 else f'by {len(keys)} keys:'} {diffs}"
    if NAMED.intersection(keys):  # another size or scaling is another run, never one to pool
        return note
    try:
        ignored_paths(keys)
    except ValueError:  # a key below a section's field: no option compares across it
        return note
    return f"{note}: --ignore {','.join(keys)} compares across {'it' if len(keys) == 1 else 'them'}"


def matched(side_a: dict[SideKey, SideRun], side_b: dict[SideKey, SideRun]) -> dict[SideKey, SideRun]:
    """B's runs keyed as the A runs they compare with: the same config at the same threads per rank; else,
    where a config is left with one thread count on each side (two machines, two core counts), those two,
    and the row's hardware names both."""
    left_a = [k for k in side_a if k not in side_b]
    left_b = [k for k in side_b if k not in side_a]
    renamed = {}
    for config in {c for c, _ in left_a} & {c for c, _ in left_b}:
        (mine, *more_a), (theirs, *more_b) = ([k for k in left if k[0] == config] for left in (left_a, left_b))
        if not more_a and not more_b:
            renamed[theirs] = mine
    return {renamed.get(k, k): run for k, run in side_b.items()}


def _unmatched(mine: dict[SideKey, SideRun], other: dict[SideKey, SideRun], keys, side: str) -> list[UnmatchedRun]:
    runs = []
    for k in keys:
        run = mine[k]
        note = (f"only failed records in {'B' if side == 'A' else 'A'} ({error_text(other[k].failed[0])})"
                if k in other else closest_note(run, other, side))
        runs.append(UnmatchedRun(run_label(run.records[0], seeds_of(run.records)), k[0], hardware_label(run.records),
                                 note))
    return sorted(runs, key=lambda u: (u.run, u.identity))


def compare_folders(a: str | Path, b: str | Path, threshold: float = DEFAULT_THRESHOLD,
                    ignore: list[str] | None = None) -> Comparison:
    """B against A, run by run. ignore: dotted config keys left out of the match (ValueError naming an
    unknown one); CompareError for folders that cannot be compared."""
    ignore = list(ignore or [])
    ignored = ignored_paths(ignore)
    check_folder(Path(a))
    check_folder(Path(b))
    out_a, out_b = nested_folders(Path(a), Path(b))
    side_a = load_side(a, ignored, out_a)
    side_b = matched(side_a, load_side(b, ignored, out_b))
    ok_a = {k for k, r in side_a.items() if r.ok}
    ok_b = {k for k, r in side_b.items() if r.ok}
    seeds_b = {k: seeds_of(side_b[k].ok) for k in ok_a & ok_b}
    label = told_apart({k: run_label(side_a[k].ok[0], seeds_of(side_a[k].ok), seeds_b.get(k)) for k in ok_a},
                       {k: {**side_a[k].config, "threads_per_rank": k[1]} for k in ok_a})  # the keys that differ
    runs = [compare_run(side_a[k].ok, side_b[k].ok, threshold, k[0], label[k])
            for k in sorted(ok_a & ok_b, key=label.get)]
    failed_in_b = sorted(ok_a & (side_b.keys() - ok_b), key=label.get)  # B holds only failed records of them
    failed = [FailedRun(label[k], k[0], error_text(side_b[k].failed[0])) for k in failed_in_b]
    return Comparison(str(a), str(b), threshold, ignore, METHOD, runs, failed,
                      _unmatched(side_a, side_b, ok_a - side_b.keys(), "A"),
                      _unmatched(side_b, side_a, ok_b - ok_a, "B"), [str(p) for p in out_a], [str(p) for p in out_b])


def comparison_doc(c: Comparison) -> dict:
    """The comparison as plain JSON-able data (verdicts as their text)."""
    doc = asdict(c)
    for run in doc["runs"]:
        for m in run["metrics"]:
            m["verdict"] = m["verdict"].value
    doc["regressions"] = c.regressions
    return doc


# ----------------------------------------------------------------------------- text


def left_out_lines(c: Comparison) -> list[str]:
    """'A (results): left out B's folder results/pr123 inside it': what a nested folder's scan skipped."""
    return [f"{side} ({folder}): left out {other}'s folder {p} inside it; its records count for {other} only"
            for side, folder, other, paths in (("A", c.a, "B", c.left_out_a), ("B", c.b, "A", c.left_out_b))
            for p in paths]


def _row_name(r: RunComparison) -> str:
    """The run's name, with the configurations it pools where --ignore pooled several."""
    return f"{r.run} ({'; '.join(r.pooled)})" if r.pooled else r.run


def _worse_text(r: RunComparison) -> str:
    """'tok/s worse (B/A 0.500), MFU worse (B/A 0.500); point estimate: <why no interval>': the figures a gate
    fails on, and the point estimate named once where no interval judged them."""
    worse = ", ".join(f"{LABELS[m.metric]} worse (B/A {m.ratio:.3f})" for m in r.worse)
    return "; ".join([worse, *dict.fromkeys(m.basis for m in r.worse if m.basis)])


def regression_lines(c: Comparison) -> list[str]:
    """One line per regression, naming the run (and the configurations it pools) and why: what a failing
    gate prints."""
    lines = [f"regression: {_row_name(r)}: {_worse_text(r)}" for r in c.runs if r.regressed]
    lines += [f"regression: {f.run} failed in B: {f.error}" for f in c.failed_in_b]
    lines += [f"regression: {u.run} missing in B ({c.b} holds no record of it); {u.closest}" for u in c.only_a]
    return lines


def _figure(v: float | None) -> str:
    if v is None:
        return "—"
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"


def _ratio(m: MetricComparison) -> str:
    if m.ratio is None:
        return "—"
    return f"{m.ratio:.3f} ({m.ci95[0]:.3f}–{m.ci95[1]:.3f})" if m.ci95 else f"{m.ratio:.3f}"


def comparison_table(c: Comparison) -> Table:
    """One row per (run, figure); every string from a record goes through printable."""
    ignoring = f"; matched ignoring {', '.join(c.ignored)}" if c.ignored else ""
    point = "; with no interval (one repeat a side), the change of B/A alone (point estimate)"
    table = Table(title=escape(printable(f"B / A: {c.b} vs {c.a}")), header_style="bold",
                  caption=escape(f"{c.method}; significant: the interval excludes 1 and the change exceeds "
                                 f"{c.threshold:.0%}{point}{ignoring}"))
    for header in ("run", "hardware A → B", "repeats A, B", "figure", "A", "B", "B/A (95% CI)", "verdict"):
        table.add_column(header, justify="right" if header in ("A", "B", "B/A (95% CI)") else "left",
                         no_wrap=header not in ("run", "hardware A → B", "verdict"))  # figures never split
    style = {Verdict.BETTER: "green", Verdict.WORSE: "red"}
    for run in c.runs:
        hardware = run.hardware_a if run.hardware_a == run.hardware_b else f"{run.hardware_a} → {run.hardware_b}"
        for i, m in enumerate(run.metrics):
            label = LABELS[m.metric] + (" (estimated)" if m.estimated else "")
            first = [[run.run, *run.pooled], hardware, f"{run.repeats_a}, {run.repeats_b}"] if i == 0 else ["", "", ""]
            cells = [*first, label, _figure(m.a), _figure(m.b), _ratio(m), verdict_text(m)]
            table.add_row(*[_safe(x) for x in cells], style=style.get(m.verdict))
        table.add_section()
    return table


def verdict_text(m: MetricComparison) -> str:
    """The verdict with why where it is n/a, not resolvable, or rests on the point estimate alone."""
    if m.verdict in (Verdict.UNAVAILABLE, Verdict.UNRESOLVABLE):
        return f"{m.verdict.value}: {m.reason}"
    return f"{m.verdict.value} ({m.basis})" if m.basis else m.verdict.value


def _safe(cell: str | list[str]) -> str:
    """A cell (or its lines) from record strings, shown as text: never markup, never a control character."""
    return "\n".join(escape(printable(x)) for x in ([cell] if isinstance(cell, str) else cell))
