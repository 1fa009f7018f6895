"""Classifications every layer and every view asks, each defined once at the bottom of the house:
how far each energy source can be trusted, what each MoE router is. A view that needs one of
these asks here; it never keeps a list of its own (two lists drift: one view called "sampled"
metered, another not measured)."""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass


class Source(enum.StrEnum):
    """How an energy figure was obtained, strongest first (SOURCES: what each says of its figure)."""
    MEASURED = "measured"
    SAMPLED = "sampled"
    ESTIMATED = "estimated"
    UNAVAILABLE = "unavailable"


@dataclass(frozen=True)
class SourceKind:
    """What an energy figure's source says about it (docs/explanation/energy.md: how each is obtained): compare
    and the verdicts judge only metered energy, and a view calls only measured energy measured. Each property
    holds for a source only if it holds for every stronger one."""

    source: Source
    figure: bool  # comes with a figure (unavailable: a reason instead)
    metered: bool  # read from a meter, not a model: an energy counter (NVML's, RAPL) or NVML's power samples
    measured: bool  # exact enough for a view to call "measured": an energy counter read at both window edges


# Strongest first: an aggregate is only as good as its weakest part.
SOURCES = {s.source: s for s in (
    SourceKind(Source.MEASURED, figure=True, metered=True, measured=True),
    # 20 ms power samples, integrated: the sensor sees a quarter of each period (energy/bounds.py)
    SourceKind(Source.SAMPLED, figure=True, metered=True, measured=False),
    SourceKind(Source.ESTIMATED, figure=True, metered=False, measured=False),  # codecarbon's power model × time
    SourceKind(Source.UNAVAILABLE, figure=False, metered=False, measured=False),
)}


def source_kind(source: str | None) -> SourceKind:
    """The kind of a record's energy source; a figure whose source is not stated has none."""
    return SOURCES[Source.UNAVAILABLE if source is None else Source(source)]


def weakness(source: str) -> int:
    """A source's place in SOURCES' order: 0 for the strongest."""
    return list(SOURCES).index(Source(source))


def weakest(sources: Iterable[str]) -> Source:
    """The least trustworthy of `sources` (unavailable when there are none)."""
    return max(map(Source, sources), key=weakness, default=Source.UNAVAILABLE)


@dataclass(frozen=True)
class RouterKind:
    """What an MoE router is, as every part of benchsuite needs to know it."""

    name: str
    k: int | None  # experts each token chooses (token_choice: its default top_k); None: experts choose tokens
    token_choice: bool  # tokens choose experts (a capacity drops tokens; capacity_factor = 0 is dropless)
    label: str  # how a person reads its name (the dashboard's family "MoE · label")


ROUTERS = {r.name: r for r in (
    RouterKind("switch", 1, True, "Switch"),
    RouterKind("gshard", 2, True, "GShard"),
    RouterKind("expert_choice", None, False, "Expert choice"),
    RouterKind("token_choice", 2, True, "Top-k"),
)}


def experts_choose(router: object) -> bool:
    """Whether a record's moe.router names a router whose experts choose their tokens; False for a token-choice
    router, for none, and for a name this benchsuite does not know."""
    kind = ROUTERS.get(router) if isinstance(router, str) else None
    return kind is not None and not kind.token_choice


@dataclass(frozen=True)
class FlagKind:
    """What a flag says of its figure, as every view words it: its heading, the advice, the report's mark."""

    name: str
    heading: str  # "⚠ Flagged: 2 figure(s) no real run can produce"
    advice: str
    mark: str  # the report's status mark, the dashboard's box (CSS class flags-<name>)
    value_label: str  # what the flag's value is ("" where the field names it)


FLAG_KINDS = {k.name: k for k in (
    FlagKind("impossible", "figure(s) no real run can produce",
             "The run finished, but treat these figures (and what is derived from them) as wrong until explained.",
             "⚠", ""),
    FlagKind("noisy", "noisy measurement",
             "Its repeats spread more than a figure should between identical runs: the median may not be the "
             "machine's speed. Rerun on a quiet machine, or with more steps.", "~", "tok/s CV between repeats"),
)}
NOISY_FIELDS = ("repeats",)  # the results model's run-level flag of repeats that spread (results/model.noisy_flag)


def flag_kind(flag: dict) -> FlagKind:
    """The kind of a flag (a record's, or one the results model adds to a run), from its field."""
    return FLAG_KINDS["noisy" if flag.get("field") in NOISY_FIELDS else "impossible"]


def flags_by_kind(flags: object) -> dict[FlagKind, list[dict]]:
    """A row's flags grouped by kind, in FLAG_KINDS' order (impossible figures first); kinds without a flag
    left out. Every view shows flags by this grouping."""
    flags = [f for f in flags or [] if isinstance(f, dict)]
    grouped = {kind: [f for f in flags if flag_kind(f) is kind] for kind in FLAG_KINDS.values()}
    return {kind: group for kind, group in grouped.items() if group}
