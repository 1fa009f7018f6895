"""One name, colour and marker per model family (dense, or an MoE router), used by every page.

A family comes from the record's `kind` and its `moe` config: the router, spelt any way a config or
an older record spells it (`expert_choice`, `expert-choice`, `Expert Choice`); a token-choice router
(record/kinds.ROUTERS) with capacity_factor = 0 is the dropless family, and any MoE with
shared experts the shared-experts family (their routing and cost differ from the capacity routers'
by design). The same family gets the same display name, colour and marker on every page. Series of
one family (several workloads) differ by line dash or bar pattern, never by a colour that could be
another family's.
"""

from __future__ import annotations

from dataclasses import dataclass

from benchsuite.record.kinds import ROUTERS
from benchsuite.record.values import num, present


@dataclass(frozen=True)
class Style:
    name: str    # display name: "dense", "MoE · Switch"
    color: str
    symbol: str  # Plotly marker symbol


DENSE = "dense"
USER = "user"  # a record of the user's own loop (benchsuite.measure): a model benchsuite did not build
DROPLESS = "dropless"
SHARED = "shared_experts"
# Each router's colour and marker (colour-blind-safe hues, no colour or marker used twice); its family's name
# is its label (record/kinds.ROUTERS).
ROUTER_LOOKS = {"switch": ("#e8590c", "diamond"), "gshard": ("#2f9e44", "square"),
                "expert_choice": ("#9c36b5", "triangle-up"), "token_choice": ("#1098ad", "hexagon")}
KNOWN = {
    DENSE: Style("dense", "#1f77b4", "circle"),
    **{name: Style(f"MoE · {ROUTERS[name].label}", *look) for name, look in ROUTER_LOOKS.items()},
    DROPLESS: Style("MoE · Dropless top-k", "#c2255c", "star"),
    SHARED: Style("MoE · Shared experts", "#8c564b", "pentagon"),
    USER: Style("your loop", "#868e96", "circle-open"),
}
# Routers the suite does not know (hand-edited or newer records), in order of first need.
SPARE = [("#5c940d", "cross"), ("#e67700", "x"), ("#495057", "triangle-down"), ("#364fc7", "hourglass"),
         ("#a61e4d", "bowtie")]
DASHES = ["solid", "dash", "dot", "dashdot", "longdash", "longdashdot"]
PATTERNS = ["", "/", ".", "x", "\\", "-", "|", "+"]


def family(kind, router, capacity_factor=None, shared_experts=None) -> str:
    """The family key of a record: "dense"; "user" for the user's own loop; "shared_experts" with shared
    experts; "dropless" for a token-choice router with capacity_factor 0; else its router normalised
    (lower case, `_` for `-` and spaces). capacity_factor and shared_experts as the record's config.moe
    has them (None when absent)."""
    if str(kind).strip().lower() == USER:
        return USER
    if str(kind).strip().lower() != "moe":
        return DENSE
    if (num(shared_experts) or 0) > 0:
        return SHARED
    key = router_name(router)
    if key in ROUTERS and ROUTERS[key].token_choice and num(capacity_factor) == 0:
        return DROPLESS
    return key or "unknown"


def router_name(router) -> str:
    """A router as benchsuite.config names it, from any spelling a record has (lower case, `_` for `-` and
    spaces); "" for none."""
    return "_".join(str(router).strip().lower().replace("-", " ").split()) if present(router) else ""


class Families:
    """The style of every family in one results set: known ones fixed, unknown ones from SPARE in
    sorted order (so a rebuild gives the same colours)."""

    def __init__(self, keys):
        unknown = sorted({k for k in keys if k not in KNOWN})
        self.styles = dict(KNOWN)
        for i, key in enumerate(unknown):
            color, symbol = SPARE[i % len(SPARE)]
            self.styles[key] = Style(f"MoE · {key.replace('_', ' ')}", color, symbol)

    def __getitem__(self, key: str) -> Style:
        return self.styles[key]


@dataclass(frozen=True)
class SeriesStyle:
    """A series (one sweep) drawn in its family's colour and marker, told from the family's other
    series by its dash (lines) or pattern (bars)."""
    family: Style
    dash: str
    pattern: str

    @property
    def color(self) -> str:
        return self.family.color

    @property
    def symbol(self) -> str:
        return self.family.symbol


def series_styles(df) -> dict[str, SeriesStyle]:
    """Every series of a site DataFrame (columns `series`, `family`), in sorted order within its family."""
    pairs = df[["series", "family"]].drop_duplicates("series").sort_values("series")
    families = Families(pairs["family"])
    out, seen = {}, {}
    for name, key in pairs.itertuples(index=False):
        n = seen[key] = seen.get(key, -1) + 1
        out[name] = SeriesStyle(families[key], DASHES[n % len(DASHES)], PATTERNS[n % len(PATTERNS)])
    return out


def trace_styles(df, by_family: bool) -> dict[str, SeriesStyle]:
    """Styles keyed by what a summary figure draws a trace per: the family's display name (`kind_label`,
    dense first, then the known routers, then the others) or the series."""
    if not by_family:
        return series_styles(df)
    keys = set(df["family"].unique())
    families = Families(keys)
    return {families[k].name: SeriesStyle(families[k], DASHES[0], PATTERNS[0]) for k in families.styles if k in keys}
