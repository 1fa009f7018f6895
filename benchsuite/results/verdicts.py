"""Dense vs sparse over seeds: each run's figures with a 95 % interval over its seeds, each sparse run's
ratio to the dense one of its suite and layout (of its backbone, where the suite has one), and the papers'
claims set beside those ratios.

One seed does not answer "is sparse cheaper than dense for the same quality": the tokens a run
needs to reach a validation loss move by ±20 % with the seed, more than dense and sparse differ.
So a run is all its seeds (results/model.py: one identity), one value per seed (repeats of one
seed train alike: their median is that seed's value).

Intervals at small n (results/stats.py). With three seeds a percentile bootstrap over seeds can draw
only 10 distinct samples: its "95 %" interval is the range of the data, and too narrow. Student's t
on log values is used instead: the figures are positive and compared as ratios, log makes a ratio a
difference, and exp(mean ± t·s/√n) of the logs is an interval for the centre of a log-normal spread.
The point shown is the median over seeds. A ratio B/A is exp of Welch's t-interval on the difference
of mean logs (seeds of two workloads are not paired), with Welch–Satterthwaite's exact degrees of
freedom. n = 1 gives no interval, never a zero-width one.

Throughput and J/token are stated the same way, over the seeds' per-seed medians: the interval the
report's main table and the dashboard's bars show. The to-target energy (and CO2e) has two sources of
spread: the steps a seed needs and the time and energy a step takes. Each seed's value is one draw
of both, so the t-interval over seeds holds both, and the per-step J/token interval beside it shows
how much of that is measurement.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from enum import Enum
from functools import cached_property
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from benchsuite.record.columns import view_columns
from benchsuite.record.kinds import source_kind
from benchsuite.record.types import Record
from benchsuite.record.values import num, present
from benchsuite.results.compare import ESTIMATED, Bound, bound_of, bounded_ratio, relative_bound, widest_bound
from benchsuite.results.identity import hardware_label
from benchsuite.results.model import RecordList
from benchsuite.results.stats import ConfidenceInterval, log_t_interval, no_interval, welch_ratio

if TYPE_CHECKING:
    from benchsuite.results.model import Results

METHOD = ("median over seeds, each seed the median over its repeats; 95 % interval: Student's t on the log "
          "values over seeds; sparse ÷ dense: Welch's t on the log values (exact degrees of freedom)")
ENERGY_SPREAD = ("to-target energy and CO2e: the t-interval over seeds holds both the seed-to-seed spread of "
                 "the steps needed and each run's per-step measurement spread (each seed's value is one draw of "
                 "both); the J/token interval beside it is over the seeds' per-step figures")
# (figure, column of the results model, label)
TO_TARGET = (("steps", "quality.step", "steps"), ("tokens", "quality.tokens", "tokens"),
             ("seconds", "quality.seconds", "seconds"), ("model_flops", "quality.model_flops", "model FLOPs"),
             ("energy_j", "quality.energy_j", "energy J"), ("co2e_g", "quality.co2e_g", "g CO2e"))
FINAL_LOSS = ("final_val_loss", "quality.final_val_loss", "final val loss")
COLUMN = {name: column for name, column, _ in (*TO_TARGET, FINAL_LOSS)}
PER_STEP = ("tokens_per_s", "j_per_token")  # columns of the results model, per step
ENERGY_FIGURES = ("energy_j", "co2e_g", "j_per_token")  # on an estimate they follow time alone: shown, not ranked


# What the verdicts read of a run's records beyond its per-seed figures, as the results model's columns: the
# meters' bound on J/token (compare.relative_bound's low, high, value), whether a target was set, and the first
# record's router, parameters, experts and model FLOPs per token (one value for a whole run).
BOUND = view_columns("metrics.energy.j_per_token_bound.low", "metrics.energy.j_per_token_bound.high",
                     "metrics.energy.j_per_token")
TARGET = view_columns("metrics.quality.target_loss")[0]
ROUTER, PARAMS, EXPERTS, FLOPS = view_columns("config.moe.router", "metrics.params.total", "config.moe.experts",
                                              "metrics.flops.model_per_token")


@dataclass(frozen=True)
class RunRecordFacts:
    """A run's records as the verdicts read them (from the results model's columns: no record decoded)."""

    targeted: bool  # some record has a metrics.quality.target_loss
    meter_bound: Bound | None  # compare.widest_bound over its records' relative bounds
    params: float | None  # the first record's metrics.params.total
    experts: int | None  # its config.moe.experts
    model_flops_per_token: float | None  # its metrics.flops.model_per_token
    hardware: tuple[str, ...]  # what its records ran on (identity.hardware_label of each), each once, in order

    @classmethod
    def of_records(cls, records: Sequence[Record]) -> RunRecordFacts:
        """The same facts read from typed records (a group built from records, not from the results model)."""
        first = records[0] if records else None
        m = first.metrics if first else None
        moe = first.config.moe if first else None
        return cls(any(r.metrics and r.metrics.quality and r.metrics.quality.target_loss is not None for r in records),
                   widest_bound([relative_bound(r) for r in records]),
                   num(m.params.total) if m and m.params else None, moe.experts if moe else None,
                   num(m.flops.model_per_token) if m and m.flops else None,
                   tuple(dict.fromkeys(hardware_label([r]) for r in records)))


class RunRecords(RecordList):
    """A run's ok records in start order (as Results.run_records), each decoded when first read: the verdicts
    read the results model's columns, the dashboard's seed curves the records."""

    def summaries(self) -> list:
        """Each record's summary (store.Loaded.summary)."""
        return [one.summary() for one in self._loaded]


@dataclass(frozen=True)
class SeedGroup:
    """One run (a results-model identity): its per-seed medians, what the verdicts read of its records (facts),
    and its records."""

    suite: str
    workload: str
    kind: str
    router: str | None
    identity: str
    label: str  # the run's label (results/model.py)
    layout: tuple  # world size, nodes, scaling, hardware: what a dense run must share to be compared
    quality: bool  # the run evaluated (train.eval_every > 0)
    table: dict[int, dict]  # seed → the results model's per_seed row (medians over the seed's repeats)
    records: Sequence[Record]  # (RunRecords from the results model: decoded only when read)
    failed_seeds: list[int] = field(default_factory=list)
    energy_source: str | None = "measured"  # the run's energy.source
    backbone: tuple = ()  # its config.model's values (the results model's columns, in their order): what a sparse
    # run is compared with a dense one by
    run_facts: RunRecordFacts | None = field(default=None, repr=False, compare=False)  # None: read from the records
    _values: dict[str, list[float]] = field(default_factory=dict, repr=False, compare=False)

    @cached_property
    def facts(self) -> RunRecordFacts:
        return self.run_facts if self.run_facts is not None else RunRecordFacts.of_records(self.records)

    def summaries(self) -> list:
        """Its records' summaries (store.Loaded.summary; records built in memory: themselves, which read the
        same)."""
        return self.records.summaries() if isinstance(self.records, RunRecords) else list(self.records)

    @cached_property
    def seeds(self) -> list[int]:
        return sorted(self.table)

    def per_seed(self, column: str) -> dict[int, float | None]:
        """seed → the median over that seed's repeats of a column (None where none recorded it)."""
        return {s: num(self.table[s].get(column)) for s in self.seeds}

    def reached(self) -> dict[int, bool]:
        """seed → whether every record of the seed reached train.target_loss."""
        return dict(self._reached)

    @cached_property
    def _reached(self) -> dict[int, bool]:
        return {s: bool(self.table[s].get("reached")) for s in self.seeds}

    def values(self, column: str) -> list[float]:
        """The per-seed values of a column; a to-target figure only from the seeds that reached it (kept: a run
        is read once per pair it is in, and once per figure of its summary)."""
        values = self._values.get(column)
        if values is None:
            reached, table = self._reached, self.table
            to_target = column != FINAL_LOSS[1] and column.startswith("quality.")
            values = self._values[column] = [v for s in self.seeds if (v := num(table[s].get(column))) is not None
                                             and (reached[s] or not to_target)]
        return values


@dataclass(frozen=True)
class _OkRecords:
    """A run's ok records as the results model's rows hold them."""

    facts: RunRecordFacts
    router: str | None  # the first record's config.moe.router
    records: RunRecords


class _Row(NamedTuple):
    """The columns _ok_records reads of a record's row, in this order."""

    identity: str
    rec: int
    target: float
    low: float
    high: float
    value: float
    router: str | None
    params: float
    experts: int | None
    flops: float
    hardware: str


def _ok_records(results: Results) -> dict[str, _OkRecords]:
    """identity → its ok records' facts, router and records, from the results model's rows (one pass over plain
    values, no record decoded)."""
    columns = ["identity", "rec", TARGET, *BOUND, ROUTER, PARAMS, EXPERTS, FLOPS, "hardware_label"]
    ok = results.df.loc[results.df["status"] == "ok", ["started_at", *columns]]
    by_run: dict[str, list[_Row]] = {}
    ok = ok.sort_values("started_at", kind="stable")
    for row in map(_Row._make, zip(*(ok[c].tolist() for c in columns))):  # (a column at a time: see seed_groups)
        by_run.setdefault(row.identity, []).append(row)  # in start order, as Results.run_records
    out = {}
    for identity, rows in by_run.items():
        first = rows[0]
        facts = RunRecordFacts(any(present(r.target) for r in rows), widest_bound([bound_of(r.low, r.high, r.value)
                                                                             for r in rows]),
                         num(first.params), int(first.experts) if present(first.experts) else None, num(first.flops),
                         tuple(dict.fromkeys(r.hardware for r in rows)))
        out[identity] = _OkRecords(facts, first.router if isinstance(first.router, str) else None,
                                   RunRecords([results.loaded[int(r.rec)] for r in rows]))
    return out


def seed_groups(results: Results) -> list[SeedGroup]:
    """The ok runs of the results model, each with its seeds (read from its columns: no record decoded)."""
    groups = []
    model = [c for c in results.runs.columns if c.startswith("config.model.")]
    columns = ["identity", "suite", "workload", "kind", "label", "world_size", "nodes", "scaling", "scaling.hardware",
               "scaling.threads_per_rank", FINAL_LOSS[1], "failed_seeds", "energy.source"]
    ok_runs = results.ok_runs_of([*columns, *model])
    if ok_runs.empty:
        return groups
    runs = _ok_records(results)
    # the per-seed figures verdicts read, split by run once (a lookup per run in the whole table is slow)
    figures = [c for c in (*COLUMN.values(), *PER_STEP, "reached") if c in results.per_seed]
    tables: dict[str, dict[int, dict]] = {}
    per_seed = results.per_seed
    # (a column at a time: the frames' rows made into dicts by pandas cost several times more)
    for (identity, seed), *values in zip(per_seed.index, *(per_seed[c].tolist() for c in figures)):
        tables.setdefault(identity, {})[int(seed)] = dict(zip(figures, values))
    backbones = zip(*(ok_runs[c].tolist() for c in model)) if model else ((),) * len(ok_runs)
    shared: dict[tuple, tuple] = {}  # (runs share a handful of backbones: one tuple each, not one per run)
    for values, backbone in zip(zip(*(ok_runs[c].tolist() for c in columns)), backbones):
        row = dict(zip(columns, values))
        backbone = tuple(v if present(v) else None for v in backbone)  # (NaN never equals NaN)
        backbone = shared.setdefault(backbone, backbone)
        identity = row["identity"]
        run = runs[identity]
        groups.append(SeedGroup(str(row["suite"]), str(row["workload"]), str(row["kind"]), run.router, identity,
                                str(row["label"]),
                                (row["world_size"], row["nodes"], row["scaling"], row["scaling.hardware"],
                                 num(row["scaling.threads_per_rank"])),  # NaN (a GPU run) never equals NaN
                                present(row.get(FINAL_LOSS[1])), tables[identity], run.records,
                                list(row["failed_seeds"]),
                                row["energy.source"] if isinstance(row["energy.source"], str) else None,
                                backbone, run.facts))
    return groups


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
    figures: dict[str, ConfidenceInterval]  # TO_TARGET figures over the seeds that reached, and the final val loss
    per_step: dict[str, ConfidenceInterval]  # tokens_per_s, j_per_token over seeds

    @property
    def n(self) -> int:
        return len(self.seeds)


def summarize(group: SeedGroup) -> WorkloadSummary:
    reached = group.reached()
    ok_seeds = [s for s, r in reached.items() if r]
    figures = {}
    targeted = group.facts.targeted
    if group.quality and targeted:  # without a target there is no to-target figure to give, not a miss
        for name, column, _ in TO_TARGET:
            figures[name] = (log_t_interval(group.values(column)) if ok_seeds else
                             no_interval(0, f"no seed of {len(reached)} reached the target"))
    if group.quality:
        figures[FINAL_LOSS[0]] = log_t_interval(group.values(FINAL_LOSS[1]))
    return WorkloadSummary(group.suite, group.workload, group.label, group.kind, group.router, group.seeds,
                           len(ok_seeds), [s for s, r in reached.items() if not r] if group.quality and targeted else [],
                           group.failed_seeds, figures, {m: log_t_interval(group.values(m)) for m in PER_STEP})


class Ranking(str, Enum):
    LESS = "sparse less than dense"
    MORE = "sparse more than dense"
    NOT_SIGNIFICANT = "no significant difference"
    UNRESOLVABLE = "not resolvable by the meters"  # the ratio lies inside the energy meters' bounds
    UNAVAILABLE = "n/a"


@dataclass(frozen=True)
class PairRatio:
    """One figure of a sparse workload over the dense one of its suite, with its interval."""

    suite: str
    sparse: str
    dense: str
    figure: str
    ratio: ConfidenceInterval
    ranking: Ranking

    @property
    def text(self) -> str:
        if self.ranking is Ranking.NOT_SIGNIFICANT:
            return f"no significant difference at {self.ratio.n} seeds"
        if self.ranking in (Ranking.UNAVAILABLE, Ranking.UNRESOLVABLE):
            return self.ratio.reason or self.ranking.value
        return f"{self.sparse} {'lower' if self.ranking is Ranking.LESS else 'higher'}"


def rank(ratio: ConfidenceInterval) -> Ranking:
    """Ranked only where the interval excludes 1."""
    if ratio.lo is None:
        return Ranking.UNAVAILABLE
    if ratio.contains(1.0):
        return Ranking.NOT_SIGNIFICANT
    return Ranking.LESS if ratio.hi < 1 else Ranking.MORE


def per_step_ratio(num_group: SeedGroup, den_group: SeedGroup, column: str) -> ConfidenceInterval:
    """num/den of a per-step figure over seeds (Welch)."""
    return welch_ratio(num_group.values(column), den_group.values(column))


class PairFigure(NamedTuple):
    """One figure of a sparse run over a dense one, before its ratio is computed (pair_ratio computes it)."""

    sparse: SeedGroup
    dense: SeedGroup
    figure: str  # TO_TARGET's or FINAL_LOSS's name, or a PER_STEP column
    column: str  # its column of the results model

    @property
    def n(self) -> int:
        """The seeds its ratio is over: the smaller side's (stats' ConfidenceInterval.n), known without it."""
        return min(len(self.sparse.values(self.column)), len(self.dense.values(self.column)))


def pair_figures(sparse: SeedGroup, dense: SeedGroup) -> list[PairFigure]:
    """The figures a sparse run is compared on with a dense one: to target and the final loss where both evaluated,
    and the per-step figures."""
    names = [(name, column) for name, column, _ in (*TO_TARGET, FINAL_LOSS)] if sparse.quality and dense.quality \
        else []
    return [PairFigure(sparse, dense, name, column) for name, column in (*names, *((m, m) for m in PER_STEP))]


def pair_ratio(pair: PairFigure) -> PairRatio:
    """The figure's ratio over seeds (Welch), ranked where its interval excludes 1 and its energy can tell."""
    sparse, dense, name, column = pair
    r = welch_ratio(sparse.values(column), dense.values(column))
    ranking = rank(r)
    unmeasured = energy_not_measured(sparse, dense) if name in ENERGY_FIGURES else None
    if unmeasured:
        r, ranking = ConfidenceInterval(r.point, r.lo, r.hi, r.n, unmeasured), Ranking.UNAVAILABLE
    elif name in ENERGY_FIGURES and (why := unresolvable(r, sparse, dense)):
        r, ranking = ConfidenceInterval(r.point, r.lo, r.hi, r.n, why), Ranking.UNRESOLVABLE
    return PairRatio(sparse.suite, sparse.label, dense.label, name, r, ranking)


def unresolvable(ratio: ConfidenceInterval, sparse: SeedGroup, dense: SeedGroup) -> str | None:
    """Why an energy ratio cannot be told from 1 by the meters (compare.bounded_ratio: each side moved to the far
    ends of its bound, as compare.meter_ratio does over records), or None when it can or no bound is known."""
    meters = bounded_ratio(1.0, ratio.point, dense.facts.meter_bound, sparse.facts.meter_bound) if ratio.point \
        else None
    if meters is None or not (meters[0] <= 1 and (meters[1] is None or 1 <= meters[1])):
        return None
    high = "unbounded" if meters[1] is None else f"{meters[1]:.3f}"
    return (f"ratio {ratio.point:.3f} lies within the meters' bounds ({meters[0]:.3f}–{high}): the energy meters "
            f"cannot tell these runs apart")


def energy_not_measured(*groups: SeedGroup) -> str | None:
    """Why the runs' energy figures cannot be judged (an estimate, or no meter), or None when every run's
    energy was read from a meter."""
    kinds = {g.energy_source: source_kind(g.energy_source) for g in groups}
    if any(k.figure and not k.metered for k in kinds.values()):
        return ESTIMATED
    missing = sorted(str(s) for s, k in kinds.items() if not k.metered)
    return f"energy not measured (energy.source {', '.join(missing)})" if missing else None


def all_pair_figures(groups: list[SeedGroup]) -> list[PairFigure]:
    """Each sparse run against the dense runs of its suite run on the same layout and hardware that share its
    backbone (config.model: the dense model whose feed-forward layers it made experts, as Switch is set beside T5
    at equal FLOPs per token), or, where its suite has none of them, against each dense run of its suite and
    layout; figure by figure, their ratios not computed yet. Found by key: the time grows with the pairs, not with
    the square of the runs (a suite of 5,000 dense and 5,000 sparse workloads, each sparse one built on its own
    dense one, has 5,000 pairs)."""
    dense: dict[tuple, list[SeedGroup]] = {}
    same_backbone: dict[tuple, list[SeedGroup]] = {}
    for d in groups:
        if d.kind == "dense":
            dense.setdefault((d.suite, d.layout), []).append(d)
            same_backbone.setdefault((d.suite, d.layout, d.backbone), []).append(d)
    return [f for s in groups if s.kind == "moe"
            for d in same_backbone.get((s.suite, s.layout, s.backbone)) or dense.get((s.suite, s.layout), [])
            for f in pair_figures(s, d)]


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
    measured: ConfidenceInterval | None  # in the claim's terms (a speed-up when inverse)
    consistency: Consistency
    conditions: str  # what differs: scale, hardware, tokens
    reason: str | None = None  # why not testable / inconclusive


def _matches(group: SeedGroup, need: str) -> bool:
    return group.kind == "dense" if need == "dense" else group.router == need


def _need_label(need: str) -> str:
    return "a dense workload" if need == "dense" else f"a moe workload with router = {need!r}"


def judge(measured: ConfidenceInterval, region: tuple[float, float]) -> Consistency:
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
    def params(g: SeedGroup) -> str:
        p = g.facts.params
        return "?" if p is None else f"{p / 1e6:.2g}M"

    n_experts = num_g.facts.experts or den_g.facts.experts
    tokens = [v for g in (num_g, den_g) for v in g.values(COLUMN["tokens"])]
    told = f"{np.median(tokens):.3g} tokens to target" if tokens else "target not reached"
    return (f"here: {params(num_g)} / {params(den_g)} parameters" + (f", {n_experts} experts" if n_experts else "")
            + f", {told}, {'; '.join(dict.fromkeys([*num_g.facts.hardware, *den_g.facts.hardware]))}")


def _flops_mismatch(a: SeedGroup, b: SeedGroup) -> str | None:
    """What Switch's claim holds equal: the runs' model FLOPs per token."""
    fa, fb = a.facts.model_flops_per_token, b.facts.model_flops_per_token
    if fa is None or fb is None:
        return "model FLOPs per token not recorded"
    if abs(fa / fb - 1) > 0.05:
        return f"model FLOPs per token differ by {abs(fa / fb - 1):.0%} (the claim is at equal FLOPs)"
    return None


def check_claim(claim: Claim, groups: list[SeedGroup]) -> list[ClaimCheck]:
    """One check per suite that holds both workloads; one 'not testable here' naming what is missing
    when none does."""
    checks = []
    by_suite: dict[str, list[SeedGroup]] = {}
    for g in groups:
        by_suite.setdefault(g.suite, []).append(g)
    for suite, in_suite in sorted(by_suite.items()):
        num_g = next((g for g in in_suite if _matches(g, claim.numerator)), None)
        den_g = next((g for g in in_suite if _matches(g, claim.denominator)), None)
        if num_g is None or den_g is None:
            continue
        conditions = _measured_conditions(num_g, den_g) + f"; paper: {claim.paper_conditions}"
        mismatch = _flops_mismatch(num_g, den_g) if claim.same_flops else None
        if claim.figure in ENERGY_FIGURES:
            mismatch = mismatch or energy_not_measured(num_g, den_g)
        if mismatch:
            checks.append(ClaimCheck(claim, suite, None, Consistency.NOT_TESTABLE, conditions, mismatch))
            continue
        if claim.figure in PER_STEP:  # tok/s of numerator / denominator = step time of denominator / numerator
            measured = per_step_ratio(num_g, den_g, claim.figure)
        else:
            a, b = num_g.values(COLUMN[claim.figure]), den_g.values(COLUMN[claim.figure])
            measured = welch_ratio(b, a) if claim.inverse else welch_ratio(a, b)
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


class Verdicts:
    """Every run over its seeds (workloads), every sparse/dense pair, every claim: each computed when first read
    (`report` reads all three; the dashboard the pairs and claims), then kept."""

    method: str = METHOD
    energy_spread: str = ENERGY_SPREAD

    def __init__(self, groups: list[SeedGroup]):
        self.groups = groups

    @cached_property
    def workloads(self) -> list[WorkloadSummary]:
        return [summarize(g) for g in self.groups]

    @cached_property
    def pair_figures(self) -> list[PairFigure]:
        """Every pair's figures (all_pair_figures), their ratios computed when read (pairs, pairs_over_seeds)."""
        return all_pair_figures(self.groups)

    @cached_property
    def pairs(self) -> list[PairRatio]:
        return [pair_ratio(f) for f in self.pair_figures]

    def pairs_over_seeds(self, limit: int) -> list[PairRatio]:
        """The first `limit` of `pairs` over two or more seeds a side (those with an interval), computing only
        those (a page that shows them need not compute thousands of ratios of one seed)."""
        shown = []
        for f in self.pair_figures:
            if len(shown) == limit:
                break
            if len(f.sparse.seeds) > 1 and len(f.dense.seeds) > 1 and f.n >= 2:  # (one seed a side: n = 1)
                shown.append(pair_ratio(f))
        return shown

    @cached_property
    def claims(self) -> list[ClaimCheck]:
        return [c for claim in CLAIMS for c in check_claim(claim, self.groups)]


def verdicts(results: Results) -> Verdicts:
    """Every ok run over its seeds, every sparse/dense pair, every claim (computed once per command: `report` and the dashboard keep it)."""
    return verdicts_of(seed_groups(results))


def verdicts_of(groups: list[SeedGroup]) -> Verdicts:
    """The verdicts of runs already grouped by seed (the dashboard's pages share one grouping)."""
    return Verdicts(groups)


def verdicts_doc(v: Verdicts) -> dict:
    """Plain JSON-able data (enums as their text, each pair's wording included); the runs' summaries and the pairs
    made one at a time as they are read (iterators: `report --json` writes each as it comes, so 100,000 runs'
    summaries are never all held at once)."""
    return {"workloads": (_plain(asdict(summarize(g))) for g in v.groups),
            "pairs": (_plain(asdict(p) | {"text": p.text}) for p in map(pair_ratio, v.pair_figures)),
            "claims": [_plain(asdict(c)) for c in v.claims], "method": v.method, "energy_spread": v.energy_spread}


def _plain(doc: dict) -> dict:
    """doc as JSON values alone: enums their text, anything else JSON has no type for its text."""
    return json.loads(json.dumps(doc, default=str))
