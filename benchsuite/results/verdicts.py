"""Dense vs sparse over seeds: each workload's to-target figures with a 95 % interval, each sparse
workload's ratio to the dense one of its suite, and the papers' claims set beside those ratios.

One seed does not answer "is sparse cheaper than dense for the same quality": the tokens a run
needs to reach a validation loss move by ±20 % with the seed, more than dense and sparse differ.
So the runs of a workload that differ only by `train.seed` (one seed-free identity) are taken
together, one value per seed (repeats of one seed train alike: their median is that seed's value).

Intervals at small n. With three seeds a percentile bootstrap over seeds can draw only 10
distinct samples (and their median is one of the three values): its "95 %" interval is the range
of the data, and too narrow. We use Student's t on log values instead: the to-target figures are
positive and compared as ratios, log makes a ratio a difference, and exp(mean ± t·s/√n) of the
logs is an interval for the median of a log-normal spread (its geometric mean). The point shown
is the median over seeds. A ratio B/A is exp of Welch's t-interval on the difference of mean logs
(seeds of two workloads are not paired). n = 1 gives no interval, never a zero-width one.

Throughput and J/token keep their per-step intervals: the bootstrap of compare.py, over the seeds'
records and, within each, its step times. The to-target energy (and CO2e, energy × a constant)
has two sources of spread: the steps a seed needs (training dynamics) and the time and energy a
step takes (measurement). Each seed's to-target energy is one draw of both, so the spread of
those values over seeds holds both: its t-interval is the combined one, and the per-step J/token
interval beside it shows how much of that is measurement.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from enum import Enum

import numpy as np

from benchsuite.config import seed_free_identity
from benchsuite.results.compare import (DEFAULT_RESAMPLES, METRICS, Verdict, bootstrap_values, compare_run,
                                        point_value, step_sample)
from benchsuite.record.values import dig, num

METHOD = ("median over seeds; 95 % interval: Student's t on log values over seeds (ratios: Welch), "
          "as n is small; tok/s and J/token: bootstrap over seeds and step times")
ENERGY_SPREAD = ("to-target energy and CO2e: the t-interval over seeds holds both the seed-to-seed spread of "
                 "the steps needed and each run's per-step measurement spread (each seed's value is one draw of "
                 "both); the J/token interval beside it is the measurement part alone")
# (figure, record key under metrics.quality, label)
TO_TARGET = (("steps", "step", "steps"), ("tokens", "tokens", "tokens"), ("seconds", "seconds", "seconds"),
             ("model_flops", "model_flops", "model FLOPs"), ("energy_j", "energy_j", "energy J"),
             ("co2e_g", "co2e_g", "g CO2e"))
FINAL_LOSS = ("final_val_loss", "final_val_loss", "final val loss")
RECORD_KEY = {name: key for name, key, _ in TO_TARGET}
PER_STEP = ("tokens_per_s", "j_per_token")  # compare.METRICS names kept with their per-step interval
# Two-sided 97.5 % quantiles of Student's t (any statistics table, e.g. NIST/SEMATECH e-Handbook 1.3.6.7.2),
# by degrees of freedom; a df between two rows uses the smaller (a wider, conservative interval).
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
         10: 2.228, 12: 2.179, 15: 2.131, 20: 2.086, 25: 2.060, 30: 2.042, 40: 2.021, 60: 2.000,
         120: 1.980, math.inf: 1.960}


def t_quantile(df: float) -> float:
    """t_{0.975, df}, from the table row at or below df."""
    return T_975[max(k for k in T_975 if k <= max(df, 1))]


@dataclass(frozen=True)
class Interval:
    """A figure over seeds: the point (median over seeds, or a ratio) and its 95 % interval."""

    point: float | None
    lo: float | None
    hi: float | None
    n: int  # seeds (for a ratio: the smaller side's)
    reason: str | None = None  # why lo/hi (or the point) are null

    def contains(self, x: float) -> bool | None:
        return None if self.lo is None else self.lo <= x <= self.hi


def _none(n: int, reason: str, point: float | None = None) -> Interval:
    return Interval(point, None, None, n, reason)


def log_t_interval(values: list[float]) -> Interval:
    """Median of values; exp(mean ± t·s/√n) of their logs (positive values only)."""
    xs = np.array(values, dtype=float)
    n = xs.size
    if n == 0:
        return _none(0, "no value")
    point = float(np.median(xs))
    if np.any(xs <= 0):
        return _none(n, "a value is not positive: no log interval", point)
    if n == 1:
        return _none(1, "one seed: no interval (sweep train.seed)", point)
    logs = np.log(xs)
    half = t_quantile(n - 1) * logs.std(ddof=1) / math.sqrt(n)
    return Interval(point, float(np.exp(logs.mean() - half)), float(np.exp(logs.mean() + half)), n)


def ratio_interval(num_values: list[float], den_values: list[float]) -> Interval:
    """num/den: the ratio of medians, and exp of Welch's t-interval on mean(log num) − mean(log den)."""
    a, b = np.array(num_values, dtype=float), np.array(den_values, dtype=float)
    n = min(a.size, b.size)
    if n == 0:
        return _none(0, "no value on " + ("both sides" if a.size == b.size else "one side"))
    if np.any(a <= 0) or np.any(b <= 0):
        return _none(n, "a value is not positive: no ratio")
    point = float(np.median(a) / np.median(b))
    if a.size < 2 or b.size < 2:
        return _none(n, "one seed on a side: no interval (sweep train.seed)", point)
    la, lb = np.log(a), np.log(b)
    va, vb = la.var(ddof=1) / a.size, lb.var(ddof=1) / b.size
    se = math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va ** 2 / (a.size - 1) + vb ** 2 / (b.size - 1)) if se > 0 else math.inf
    diff, half = la.mean() - lb.mean(), t_quantile(df) * se
    return Interval(point, float(math.exp(diff - half)), float(math.exp(diff + half)), n)


@dataclass(frozen=True)
class SeedGroup:
    """The ok records of one workload that differ only by train.seed."""

    suite: str
    workload: str
    kind: str
    router: str | None
    identity: str  # seed-free identity (config.seed_free_identity)
    label: str  # workload, with its world size when the suite sweeps it
    records: list[dict]
    failed_seeds: list[int] = field(default_factory=list)

    @property
    def seeds(self) -> list[int]:
        return sorted({_seed(r) for r in self.records})

    def per_seed(self, key: str) -> dict[int, float | None]:
        """seed → the median over that seed's records (repeats) of metrics.quality.key (None if none has it)."""
        out = {}
        for seed in self.seeds:
            vals = [num(dig(r, "metrics", "quality", key)) for r in self.records if _seed(r) == seed]
            vals = [v for v in vals if v is not None]
            out[seed] = float(np.median(vals)) if vals else None
        return out

    def reached(self) -> dict[int, bool]:
        """seed → whether every record of the seed reached train.target_loss."""
        return {seed: all(dig(r, "metrics", "quality", "reached") is True for r in self.records if _seed(r) == seed)
                for seed in self.seeds}


def _seed(rec: dict) -> int:
    seed = dig(rec, "config", "train", "seed")
    return seed if isinstance(seed, int) else 0


def seed_groups(records: list[dict]) -> list[SeedGroup]:
    """Records with a quality section, grouped by suite, workload and seed-free identity; failed runs
    are counted (by seed) in the group of their config, never dropped silently."""
    groups: dict[tuple, dict] = {}
    for rec in records:
        cfg = rec.get("config") or {}
        key = (rec.get("suite"), rec.get("workload"), seed_free_identity(cfg))
        g = groups.setdefault(key, {"cfg": cfg, "ok": [], "failed": []})
        if rec.get("status") == "ok" and isinstance(dig(rec, "metrics", "quality"), dict):
            g["ok"].append(rec)
        elif rec.get("status") != "ok":
            g["failed"].append(_seed(rec))
    sizes: dict[tuple, set] = {}
    for (suite, workload, _), g in groups.items():
        sizes.setdefault((suite, workload), set()).add((g["cfg"].get("world_size"), g["cfg"].get("nodes")))
    out = []
    for (suite, workload, identity), g in sorted(groups.items(), key=lambda kv: tuple(map(str, kv[0]))):
        if not g["ok"]:
            continue
        cfg = g["cfg"]
        label = workload if len(sizes[(suite, workload)]) == 1 else f"{workload} w{cfg.get('world_size')}"
        out.append(SeedGroup(str(suite), str(workload), str(cfg.get("kind")), dig(cfg, "moe", "router"),
                             identity, label, g["ok"], sorted(set(g["failed"]) - {_seed(r) for r in g["ok"]})))
    return out


@dataclass(frozen=True)
class WorkloadSummary:
    suite: str
    workload: str
    label: str
    kind: str
    router: str | None
    seeds: list[int]
    reached: int  # seeds that reached the target
    not_reached: list[int]  # seeds that did not (their to-target figures are absent, not zero)
    failed: list[int]  # seeds whose run failed
    figures: dict[str, Interval]  # TO_TARGET figures over the seeds that reached, and the final val loss
    per_step: dict[str, Interval]  # tokens_per_s, j_per_token: bootstrap over seeds and steps

    @property
    def n(self) -> int:
        return len(self.seeds)


def per_step_interval(group: SeedGroup, metric_name: str, resamples: int = DEFAULT_RESAMPLES,
                      seed: int = 0) -> Interval:
    """compare.py's bootstrap over the group's records (seeds and their repeats) and their step times;
    n counts the seeds."""
    timed = _timed(group)
    samples = [step_sample(r) for r in timed]
    metric = next(m for m in METRICS if m.name == metric_name)
    if not samples or (metric.name != "tokens_per_s" and any(s.figures[metric.name] is None for s in samples)):
        return _none(_seed_count(timed), f"{metric.label} not recorded")
    boot = bootstrap_values(samples, resamples, np.random.default_rng(seed))[metric.name]
    return Interval(point_value(samples, metric), float(np.percentile(boot, 2.5)), float(np.percentile(boot, 97.5)),
                    _seed_count(timed))


def summarize(group: SeedGroup) -> WorkloadSummary:
    reached = group.reached()
    ok_seeds = [s for s, r in reached.items() if r]
    figures = {}
    for name, key, _ in TO_TARGET:
        values = [v for s, v in group.per_seed(key).items() if s in ok_seeds and v is not None]
        interval = log_t_interval(values)
        if not ok_seeds:
            interval = _none(0, f"no seed of {len(reached)} reached the target")
        figures[name] = interval
    final = [v for v in group.per_seed(FINAL_LOSS[1]).values() if v is not None]
    figures[FINAL_LOSS[0]] = log_t_interval(final)
    return WorkloadSummary(group.suite, group.workload, group.label, group.kind, group.router, group.seeds,
                           len(ok_seeds), [s for s, r in reached.items() if not r], group.failed_seeds, figures,
                           {m: per_step_interval(group, m) for m in PER_STEP})

class Ranking(str, Enum):
    LESS = "sparse less than dense"
    MORE = "sparse more than dense"
    NOT_SIGNIFICANT = "no significant difference"
    UNAVAILABLE = "n/a"


@dataclass(frozen=True)
class PairRatio:
    """One figure of a sparse workload over the dense one of its suite, with its interval."""

    suite: str
    sparse: str
    dense: str
    figure: str
    ratio: Interval
    ranking: Ranking

    @property
    def text(self) -> str:
        if self.ranking is Ranking.NOT_SIGNIFICANT:
            return f"no significant difference at {self.ratio.n} seeds"
        if self.ranking is Ranking.UNAVAILABLE:
            return self.ratio.reason or "n/a"
        return f"{self.sparse} {'lower' if self.ranking is Ranking.LESS else 'higher'}"


def rank(ratio: Interval) -> Ranking:
    """Ranked only where the interval excludes 1."""
    if ratio.lo is None:
        return Ranking.UNAVAILABLE
    if ratio.contains(1.0):
        return Ranking.NOT_SIGNIFICANT
    return Ranking.LESS if ratio.hi < 1 else Ranking.MORE


def _reached_values(group: SeedGroup, key: str) -> list[float]:
    reached = group.reached()
    return [v for s, v in group.per_seed(key).items() if reached[s] and v is not None]


def _final_values(group: SeedGroup) -> list[float]:
    return [v for v in group.per_seed(FINAL_LOSS[1]).values() if v is not None]


def _timed(group: SeedGroup) -> list[dict]:
    return [r for r in group.records if step_sample(r) is not None]


def _seed_count(records: list[dict]) -> int:
    """The seeds among records: an interval's n (the repeats of a seed are one seed)."""
    return len({_seed(r) for r in records})


def per_step_ratio(num_group: SeedGroup, den_group: SeedGroup, metric_name: str) -> Interval:
    """num/den of a per-step figure: compare.py's bootstrap ratio (threshold 0: the CI alone decides)."""
    a, b = _timed(den_group), _timed(num_group)
    n = min(_seed_count(a), _seed_count(b))
    if not a or not b:
        return _none(n, "no step times")
    m = next(x for x in compare_run(a, b, 0.0, DEFAULT_RESAMPLES, 0).metrics if x.metric == metric_name)
    if m.verdict is Verdict.UNAVAILABLE:
        return _none(n, m.reason)
    return Interval(m.ratio, m.ci95[0], m.ci95[1], n)


def pair_ratios(sparse: SeedGroup, dense: SeedGroup) -> list[PairRatio]:
    out = []
    for name, key, _ in TO_TARGET:
        out.append((name, ratio_interval(_reached_values(sparse, key), _reached_values(dense, key))))
    out.append((FINAL_LOSS[0], ratio_interval(_final_values(sparse), _final_values(dense))))
    out += [(m, per_step_ratio(sparse, dense, m)) for m in PER_STEP]
    return [PairRatio(sparse.suite, sparse.label, dense.label, name, r, rank(r)) for name, r in out]


def _layout(group: SeedGroup) -> tuple:
    cfg = group.records[0]["config"]
    return cfg.get("world_size"), cfg.get("nodes"), cfg.get("scaling")


def pairs(groups: list[SeedGroup]) -> list[PairRatio]:
    """Each sparse workload against each dense one of the same suite run on the same layout (grouped
    first: the time grows with the pairs, not with the square of the workloads)."""
    dense: dict[tuple, list[SeedGroup]] = {}
    for d in groups:
        if d.kind == "dense":
            dense.setdefault((d.suite, _layout(d)), []).append(d)
    return [p for s in groups if s.kind == "moe" for d in dense.get((s.suite, _layout(s)), [])
            for p in pair_ratios(s, d)]


# -- the papers' claims --------------------------------------------------------------------


class Consistency(str, Enum):
    CONSISTENT = "consistent"
    NOT_CONSISTENT = "not consistent"
    INCONCLUSIVE = "inconclusive"  # the interval straddles the claimed bound: the data carries no verdict
    NOT_TESTABLE = "not testable here"


@dataclass(frozen=True)
class Claim:
    """A published figure, as a ratio `numerator / denominator` of one figure of two workloads that
    must lie in `region` (bounds inclusive) for the claim to hold."""

    key: str
    text: str
    source: str
    numerator: str  # "dense" or a router name
    denominator: str
    figure: str  # a TO_TARGET name, or a PER_STEP one
    region: tuple[float, float]
    published: str
    paper_conditions: str
    inverse: bool = False  # report denominator / numerator (a speed-up), region in those terms
    same_flops: bool = False  # testable only when both have the same model FLOPs per token


EC = "Zhou et al. 2022, Mixture-of-Experts with Expert Choice Routing (NeurIPS)"
CLAIMS = (
    Claim("ec-steps", "expert choice reaches GShard top-2's quality in under half the steps", EC,
          "expert_choice", "gshard", "steps", (0.0, 0.5), "< 0.5× the steps (EC-CF2 vs GShard top-2)",
          "8B-activated / 64-expert decoders, capacity factor 2, TPU v4, perplexity on GLaM's corpus"),
    Claim("gshard-step", "a GShard top-2 step is about 20 % slower than expert choice's", EC,
          "expert_choice", "gshard", "tokens_per_s", (1.1, 1.3), "≈ 1.2× the step time (taken as 1.1–1.3)",
          "8B/64E models on TPU v4, expert-parallel all-to-all across chips"),
    Claim("sparse-energy", "large sparse models use under 1/10 of the energy of dense ones at similar quality",
          "Patterson et al. 2021, Carbon Emissions and Large Neural Network Training", "switch", "dense",
          "energy_j", (0.0, 0.1), "< 0.1× the energy",
          "GShard-600B and Switch-1.5T vs dense models (T5, GPT-3), TPU v3 vs V100 and their datacentres, "
          "whole training runs"),
    Claim("sparse-energy-gshard", "large sparse models use under 1/10 of the energy of dense ones at similar "
          "quality", "Patterson et al. 2021, Carbon Emissions and Large Neural Network Training", "gshard", "dense",
          "energy_j", (0.0, 0.1), "< 0.1× the energy",
          "GShard-600B and Switch-1.5T vs dense models (T5, GPT-3), TPU v3 vs V100 and their datacentres, "
          "whole training runs"),
    Claim("switch-speedup", "Switch's pre-training speed-up over dense at equal FLOPs",
          "Fedus et al. 2021, Switch Transformers (JMLR 2022)", "switch", "dense", "seconds", (1.0, 7.0),
          "up to 7× faster to the same quality (taken as > 1, ≤ 7)",
          "Switch-Base (128 experts) vs T5-Base, equal FLOPs per token, TPU v3, C4 span corruption",
          inverse=True, same_flops=True),
)


@dataclass(frozen=True)
class ClaimCheck:
    claim: Claim
    suite: str | None
    measured: Interval | None  # in the claim's terms (a speed-up when inverse)
    consistency: Consistency
    conditions: str  # what differs: scale, hardware, tokens
    reason: str | None = None  # why not testable / inconclusive


def _matches(group: SeedGroup, need: str) -> bool:
    return group.kind == "dense" if need == "dense" else group.router == need


def _need_label(need: str) -> str:
    return "a dense workload" if need == "dense" else f"a moe workload with router = {need!r}"


def judge(measured: Interval, region: tuple[float, float]) -> Consistency:
    """Consistent only if the whole interval lies in the claimed region, not consistent only if none of
    it does; an interval across a bound carries neither."""
    lo, hi = region
    if measured.lo is None:
        return Consistency.NOT_TESTABLE
    if lo <= measured.lo and measured.hi <= hi:
        return Consistency.CONSISTENT
    if measured.hi < lo or measured.lo > hi:
        return Consistency.NOT_CONSISTENT
    return Consistency.INCONCLUSIVE


def _measured_conditions(num_g: SeedGroup, den_g: SeedGroup) -> str:
    from benchsuite.results.compare import hardware_label

    def params(g: SeedGroup) -> str:
        p = num(dig(g.records[0], "metrics", "params", "total"))
        return "?" if p is None else f"{p / 1e6:.2g}M"

    experts = dig(num_g.records[0], "config", "moe", "experts") or dig(den_g.records[0], "config", "moe", "experts")
    tokens = [v for g in (num_g, den_g) for v in _reached_values(g, "tokens")]
    told = f"{np.median(tokens):.3g} tokens to target" if tokens else "target not reached"
    return (f"here: {params(num_g)} / {params(den_g)} parameters" + (f", {experts} experts" if experts else "")
            + f", {told}, {hardware_label(num_g.records + den_g.records)}")


def _flops_mismatch(a: SeedGroup, b: SeedGroup) -> str | None:
    fa, fb = (num(dig(g.records[0], "metrics", "flops", "model_per_token")) for g in (a, b))
    if fa is None or fb is None:
        return "model FLOPs per token not recorded"
    if abs(fa / fb - 1) > 0.05:
        return f"model FLOPs per token differ by {abs(fa / fb - 1):.0%} (the claim is at equal FLOPs)"
    return None


def check_claim(claim: Claim, groups: list[SeedGroup]) -> list[ClaimCheck]:
    """One check per suite that holds both workloads; one 'not testable here' naming what is missing
    when none does."""
    checks = []
    for suite in sorted({g.suite for g in groups}):
        in_suite = [g for g in groups if g.suite == suite]
        num_g = next((g for g in in_suite if _matches(g, claim.numerator)), None)
        den_g = next((g for g in in_suite if _matches(g, claim.denominator)), None)
        if num_g is None or den_g is None:
            continue
        conditions = _measured_conditions(num_g, den_g) + f"; paper: {claim.paper_conditions}"
        mismatch = _flops_mismatch(num_g, den_g) if claim.same_flops else None
        if mismatch:
            checks.append(ClaimCheck(claim, suite, None, Consistency.NOT_TESTABLE, conditions, mismatch))
            continue
        if claim.figure in PER_STEP:  # tok/s of numerator / denominator = step time of denominator / numerator
            measured = per_step_ratio(num_g, den_g, claim.figure)
        else:
            key = RECORD_KEY[claim.figure]
            a, b = _reached_values(num_g, key), _reached_values(den_g, key)
            measured = ratio_interval(b, a) if claim.inverse else ratio_interval(a, b)
        verdict = judge(measured, claim.region)
        reason = measured.reason
        if verdict is Consistency.INCONCLUSIVE:
            reason = f"the interval crosses the claimed bound at n = {measured.n} seeds"
        checks.append(ClaimCheck(claim, suite, measured, verdict, conditions, reason))
    if checks:
        return checks
    needs = (claim.numerator, claim.denominator)
    missing = [n for n in needs if not any(_matches(g, n) for g in groups)]
    reason = ("missing workload: " + ", ".join(_need_label(m) for m in missing) if missing else
              f"no suite holds both {' and '.join(_need_label(n) for n in needs)}")
    return [ClaimCheck(claim, None, None, Consistency.NOT_TESTABLE, f"paper: {claim.paper_conditions}", reason)]


@dataclass(frozen=True)
class Verdicts:
    workloads: list[WorkloadSummary]
    pairs: list[PairRatio]
    claims: list[ClaimCheck]
    method: str = METHOD
    energy_spread: str = ENERGY_SPREAD


def verdicts(records: list[dict]) -> Verdicts:
    """Every workload with a quality section, every sparse/dense pair, every claim."""
    groups = seed_groups(records)
    return Verdicts([summarize(g) for g in groups], pairs(groups),
                    [c for claim in CLAIMS for c in check_claim(claim, groups)])


def verdicts_doc(v: Verdicts) -> dict:
    """Plain JSON-able data (enums as their text, each pair's wording included)."""
    doc = asdict(v)
    for d, p in zip(doc["pairs"], v.pairs):
        d["text"] = p.text
    return json.loads(json.dumps(doc, default=str))
