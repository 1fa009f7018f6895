"""Two results folders side by side (two commits, two clusters): runs matched by their workload,
the ratio B/A of each headline figure with a bootstrap 95 % CI, and a verdict per figure.

Every figure of a run is a function of its median step time m: tokens/s = tokens per step / m;
MFU scales as 1/m (model FLOPs and peak are fixed); J/token and gCO2e/Mtok scale as m (the run's
measured average power held fixed). Resampling the step times (and, with repeats, the records)
therefore gives the spread of all four at once.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path

import numpy as np
from rich.markup import escape
from rich.table import Table

from benchsuite.results.store import load_records
from benchsuite.record.values import dig, num
from benchsuite.terminal import printable

DEFAULT_THRESHOLD = 0.05
DEFAULT_RESAMPLES = 2000
BOOTSTRAP_BLOCK = 1 << 20  # step indices drawn at once (8 MiB): bounds compare's memory whatever a record holds
EXACT_DRAW_STEPS = 10_000  # up to this many steps each resample draws its n indices (about a second in all)
# Resolved-config fields that say nothing about the workload: its description, the kill limit,
# and the site's measurement settings and grid (two clusters in two countries run one workload).
NOT_IDENTITY = (("description",), ("train", "timeout_s"), ("energy",), ("carbon",))


class CompareError(Exception):
    """A folder that cannot be compared (missing, not a folder, no ok record)."""


class Verdict(str, Enum):
    BETTER = "better"
    WORSE = "worse"
    SAME = "no significant change"
    UNAVAILABLE = "n/a"


@dataclass(frozen=True)
class Metric:
    name: str
    label: str
    record_path: tuple[str, ...]  # where the record holds the figure (tokens/s is recomputed from the steps)
    higher_is_better: bool
    step_time_power: int  # the figure ∝ m ** power, m the median step time


METRICS = (
    Metric("tokens_per_s", "tok/s", ("metrics", "tokens_per_s"), True, -1),
    Metric("mfu", "MFU", ("metrics", "mfu"), True, -1),
    Metric("j_per_token", "J/token", ("metrics", "energy", "j_per_token"), False, 1),
    Metric("gco2e_per_mtok", "gCO2e/Mtok", ("metrics", "energy", "gco2e_per_mtok"), False, 1),
)


@dataclass(frozen=True)
class MetricComparison:
    metric: str
    a: float | None
    b: float | None
    ratio: float | None  # B / A
    ci95: tuple[float, float] | None
    verdict: Verdict
    reason: str | None = None  # why the verdict is n/a


@dataclass(frozen=True)
class RunComparison:
    run: str  # suite/workload w{world} n{nodes} {scaling}
    identity: str  # short hash of the identity config
    hardware_a: str
    hardware_b: str
    repeats_a: int
    repeats_b: int
    metrics: list[MetricComparison]

    @property
    def regressed(self) -> bool:
        return any(m.verdict is Verdict.WORSE for m in self.metrics)


@dataclass(frozen=True)
class UnmatchedRun:
    """A run of one folder whose config no run of the other folder has."""

    run: str
    identity: str
    hardware: str


@dataclass(frozen=True)
class Comparison:
    a: str
    b: str
    threshold: float
    resamples: int
    seed: int
    runs: list[RunComparison]
    only_a: list[UnmatchedRun] = field(default_factory=list)
    only_b: list[UnmatchedRun] = field(default_factory=list)

    @property
    def regressions(self) -> list[RunComparison]:
        return [r for r in self.runs if r.regressed]


@dataclass(frozen=True)
class Sample:
    """One ok record reduced to what the comparison needs."""

    step_times: np.ndarray
    tokens_per_step: float
    reference_median_s: float  # the median step time the record's figures were computed at
    figures: dict[str, float | None]  # metric name → the record's figure

    def value(self, metric: Metric, median_s):
        """The metric at median step time median_s (a float or an array of them)."""
        if metric.name == "tokens_per_s":
            return self.tokens_per_step / median_s
        figure = self.figures[metric.name]
        return figure * (median_s / self.reference_median_s) ** metric.step_time_power


def identity_config(config: dict) -> dict:
    """The resolved config without the fields in NOT_IDENTITY: what must match for two runs to compare."""
    cfg = json.loads(json.dumps(config))
    for path in NOT_IDENTITY:
        parent = dig(cfg, *path[:-1]) if len(path) > 1 else cfg
        if isinstance(parent, dict):
            parent.pop(path[-1], None)
    return cfg


def identity_key(config: dict) -> str:
    return hashlib.sha256(json.dumps(identity_config(config), sort_keys=True).encode()).hexdigest()[:12]


def run_label(rec: dict) -> str:
    cfg = rec["config"]
    return f"{rec['suite']}/{rec['workload']} w{cfg['world_size']} n{cfg['nodes']} {cfg['scaling']}"


def hardware_label(records: list[dict]) -> str:
    """'2× NVIDIA H100 80GB HBM3' from each record's devices; records on different hardware
    (one config run on two machines, in one folder) are all named, joined by '; '."""
    labels = []
    for rec in records:
        names = Counter(str(dev.get("name")) for dev in dig(rec, "env", "devices") or [])
        label = " + ".join(f"{n}× {name}" for name, n in names.items()) or "unknown"
        if label not in labels:
            labels.append(label)
    return "; ".join(labels)


def step_sample(rec: dict) -> Sample | None:
    """An ok record as the bootstrap needs it (its step times), or None when it has none."""
    times = np.array([t for t in (num(s.get("time_s")) for s in rec.get("steps") or []) if t is not None and t > 0])
    if times.size == 0:
        return None
    tokens = num(dig(rec, "metrics", "tokens_per_step")) or num((rec["steps"][0] or {}).get("tokens"))
    reference = num(dig(rec, "metrics", "step_time_s", "median")) or float(np.median(times))
    figures = {m.name: num(dig(rec, *m.record_path)) for m in METRICS}
    return Sample(times, tokens, reference, figures) if tokens else None


def load_side(folder: str | Path) -> dict[str, list[dict]]:
    """identity key → that folder's ok records with step times (several: repeats)."""
    folder = Path(folder)
    if not folder.is_dir():
        what = "not a folder: compare takes two results folders" if folder.exists() else "no such results folder"
        raise CompareError(f"{folder}: {what}")
    groups: dict[str, list[dict]] = {}
    for rec in load_records(folder):
        if rec["status"] == "ok" and step_sample(rec) is not None:
            groups.setdefault(identity_key(rec["config"]), []).append(rec)
    if not groups:
        raise CompareError(f"{folder}: no ok record with step times to compare")
    return groups


def bootstrap_values(samples: list[Sample], resamples: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """metric name → `resamples` bootstrap values of the side's figure (the median over repeats).

    With one record: its steps resampled with replacement. With R repeats: R records drawn with
    replacement, then each drawn record's steps resampled, independently per draw. Only the drawn
    records' medians are drawn (resamples × R of them, grouped by record): time linear in R."""
    r = len(samples)
    chosen = rng.integers(0, r, size=(resamples, r)) if r > 1 else np.zeros((resamples, 1), dtype=int)
    flat = chosen.ravel()
    order = np.argsort(flat, kind="stable")
    slots = np.split(order, np.cumsum(np.bincount(flat, minlength=r))[:-1])  # slots[j]: the draws of record j
    medians = np.empty(flat.size)  # medians[i]: a resampled median of record flat[i]
    for j, s in enumerate(samples):
        medians[slots[j]] = resampled_medians(s.step_times, slots[j].size, rng)
    out = {}
    for metric in METRICS:
        values = np.full(flat.size, np.nan)
        for j, s in enumerate(samples):
            if _has(s, metric):
                values[slots[j]] = s.value(metric, medians[slots[j]])
        out[metric.name] = np.median(values.reshape(chosen.shape), axis=1)
    return out


def resampled_medians(times: np.ndarray, count: int, rng: np.random.Generator) -> np.ndarray:
    """`count` medians of times resampled with replacement: the draws of one
    rng.integers(size=(count, n)) call, made in blocks of at most BOOTSTRAP_BLOCK indices, so a record of a
    million steps needs megabytes, not the tens of GB of drawing them at once. Past EXACT_DRAW_STEPS steps
    the medians are drawn directly (order_statistic_medians): seconds, not minutes."""
    n = times.size
    if n > EXACT_DRAW_STEPS:
        return order_statistic_medians(np.sort(times), (count,), rng)
    out = np.empty(count)
    rows = max(1, BOOTSTRAP_BLOCK // n)
    for start in range(0, count, rows):
        stop = min(count, start + rows)
        out[start:stop] = np.median(times[rng.integers(0, n, size=(stop - start, n))], axis=1)
    return out


def order_statistic_medians(sorted_times: np.ndarray, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Medians of resamples with replacement, each drawn in O(1) with the same distribution as drawing
    n indices: the k-th smallest of n uniform indices is floor(n·U_(k)), U_(k) ~ Beta(k, n−k+1) the k-th
    smallest of n uniforms, and sorted values map it to the k-th smallest value. For even n the next one
    is U_(k) + (1 − U_(k))·Beta(1, n−k) (the least of the n − k uniforms above U_(k))."""
    n = sorted_times.size
    k = (n + 1) // 2  # the (lower) middle, counted from 1
    u = rng.beta(k, n - k + 1, size=shape)
    lower = sorted_times[np.minimum((u * n).astype(np.int64), n - 1)]
    if n % 2:
        return lower
    v = u + (1 - u) * rng.beta(1, n - k, size=shape)
    return (lower + sorted_times[np.minimum((v * n).astype(np.int64), n - 1)]) / 2


def _has(s: Sample, metric: Metric) -> bool:
    return metric.name == "tokens_per_s" or s.figures[metric.name] is not None


def point_value(samples: list[Sample], metric: Metric) -> float | None:
    """The side's figure: median over repeats of each record's figure at its median step time."""
    if not all(_has(s, metric) for s in samples):
        return None
    return float(np.median([s.value(metric, float(np.median(s.step_times))) for s in samples]))


def verdict(metric: Metric, ratio: float, ci95: tuple[float, float], threshold: float) -> Verdict:
    """Significant when the CI excludes 1 and the change exceeds the threshold."""
    if ci95[0] <= 1 <= ci95[1] or abs(ratio - 1) <= threshold:
        return Verdict.SAME
    return Verdict.BETTER if (ratio > 1) == metric.higher_is_better else Verdict.WORSE


def compare_run(recs_a: list[dict], recs_b: list[dict], threshold: float, resamples: int, seed: int) -> RunComparison:
    samples_a, samples_b = [step_sample(r) for r in recs_a], [step_sample(r) for r in recs_b]
    # One stream per side, seeded per run: a row never depends on the other runs in the folders.
    boot_a = bootstrap_values(samples_a, resamples, np.random.default_rng([seed, 0]))
    boot_b = bootstrap_values(samples_b, resamples, np.random.default_rng([seed, 1]))
    rows = []
    for metric in METRICS:
        a, b = point_value(samples_a, metric), point_value(samples_b, metric)
        if a is None or b is None or a == 0:
            missing = " and ".join(side for side, v in (("A", a), ("B", b)) if v is None) or "A (zero)"
            rows.append(MetricComparison(metric.name, a, b, None, None, Verdict.UNAVAILABLE,
                                         f"{metric.label} not recorded in {missing}"))
            continue
        ratios = boot_b[metric.name] / boot_a[metric.name]
        ci95 = (float(np.percentile(ratios, 2.5)), float(np.percentile(ratios, 97.5)))
        ratio = b / a
        rows.append(MetricComparison(metric.name, a, b, ratio, ci95, verdict(metric, ratio, ci95, threshold)))
    return RunComparison(run_label(recs_a[0]), identity_key(recs_a[0]["config"]), hardware_label(recs_a),
                         hardware_label(recs_b), len(recs_a), len(recs_b), rows)


def compare_folders(a: str | Path, b: str | Path, threshold: float = DEFAULT_THRESHOLD,
                    resamples: int = DEFAULT_RESAMPLES, seed: int = 0) -> Comparison:
    side_a, side_b = load_side(a), load_side(b)
    matched = sorted(side_a.keys() & side_b.keys(), key=lambda k: run_label(side_a[k][0]))
    runs = [compare_run(side_a[k], side_b[k], threshold, resamples, seed) for k in matched]
    return Comparison(str(a), str(b), threshold, resamples, seed, runs, _unmatched(side_a, side_b),
                      _unmatched(side_b, side_a))


def _unmatched(side: dict[str, list[dict]], other: dict[str, list[dict]]) -> list[UnmatchedRun]:
    runs = [UnmatchedRun(run_label(side[k][0]), k, hardware_label(side[k])) for k in side.keys() - other.keys()]
    return sorted(runs, key=lambda u: (u.run, u.identity))


def comparison_doc(c: Comparison) -> dict:
    """The comparison as plain JSON-able data (verdicts as their text)."""
    doc = asdict(c)
    doc["regressions"] = [r.run for r in c.regressions]
    return doc


def _figure(v: float | None) -> str:
    if v is None:
        return "—"
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"


def comparison_table(c: Comparison) -> Table:
    """One row per (run, figure); every string from a record goes through printable."""
    table = Table(title=escape(printable(f"B / A: {c.b} vs {c.a}")), header_style="bold",
                  caption=f"95 % bootstrap CI ({c.resamples} resamples, seed {c.seed}); "
                          f"significant: CI excludes 1 and the change exceeds {c.threshold:.0%}")
    for header in ("run", "hardware A → B", "figure", "A", "B", "B/A (95% CI)", "verdict"):
        table.add_column(header, justify="right" if header in ("A", "B", "B/A (95% CI)") else "left")
    style = {Verdict.BETTER: "green", Verdict.WORSE: "red"}
    for run in c.runs:
        hardware = run.hardware_a if run.hardware_a == run.hardware_b else f"{run.hardware_a} → {run.hardware_b}"
        for i, m in enumerate(run.metrics):
            label = next(x.label for x in METRICS if x.name == m.metric)
            ratio = (f"{m.ratio:.3f} ({m.ci95[0]:.3f}–{m.ci95[1]:.3f})" if m.ratio is not None else "—")
            cells = [run.run if i == 0 else "", hardware if i == 0 else "", label, _figure(m.a), _figure(m.b),
                     ratio, m.reason if m.verdict is Verdict.UNAVAILABLE else m.verdict.value]
            table.add_row(*[escape(printable(x)) for x in cells], style=style.get(m.verdict))
        table.add_section()
    return table
