"""One name, colour and marker per model family (dense, or an MoE router), used by every page.

A family comes from the record's `kind` and `moe.router` alone, spelt any way a config or an older
record spells it (`expert_choice`, `expert-choice`, `Expert Choice`): the same router gets the same
display name, colour and marker on every page. Series of one family (several workloads) differ by
line dash or bar pattern, never by a colour that could be another family's.
"""

from __future__ import annotations

from dataclasses import dataclass

from benchsuite.results.values import present


@dataclass(frozen=True)
class Style:
    name: str    # display name: "dense", "MoE · Switch"
    color: str
    symbol: str  # Plotly marker symbol


DENSE = "dense"
# The routers benchsuite.config accepts, with names a reader knows them by (colour-blind-safe hues).
KNOWN = {
    DENSE: Style("dense", "#1f77b4", "circle"),
    "switch": Style("MoE · Switch", "#e8590c", "diamond"),
    "gshard": Style("MoE · GShard", "#2f9e44", "square"),
    "expert_choice": Style("MoE · Expert choice", "#9c36b5", "triangle-up"),
}
# Routers the suite does not know (hand-edited or newer records), in order of first need.
SPARE = [("#c2255c", "x"), ("#8c564b", "star"), ("#1098ad", "hexagon"), ("#5c940d", "cross"),
         ("#e67700", "pentagon"), ("#495057", "triangle-down"), ("#364fc7", "hourglass"), ("#a61e4d", "bowtie")]
DASHES = ["solid", "dash", "dot", "dashdot", "longdash", "longdashdot"]
PATTERNS = ["", "/", ".", "x", "\\", "-", "|", "+"]


def family(kind, router) -> str:
    """The family key of a record: "dense", or its router normalised (lower case, `_` for `-` and spaces)."""
    if str(kind).strip().lower() != "moe":
        return DENSE
    key = "_".join(str(router).strip().lower().replace("-", " ").split()) if present(router) else ""
    return key or "unknown"


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
    keys = set(df["family"])
    families = Families(keys)
    return {families[k].name: SeriesStyle(families[k], DASHES[0], PATTERNS[0]) for k in families.styles if k in keys}
