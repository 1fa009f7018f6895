"""Pages as small plug-ins over one SiteData (records + DataFrame), asv-publish style.

A summary page is a `Page(slug, title, render)`; `render(data)` returns a `Section`
(escaped HTML and the figures it places); the builder lays the summary sections out, in
this order, on index.html. `RUN_PAGE` renders one detail page per record. To add a view,
write a module with a `PAGE` and list it here; nothing else changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from dashboard.data import SiteData
from dashboard.render import Section


@dataclass(frozen=True)
class Page:
    slug: str
    title: str
    render: Callable[[SiteData], Section]


def summary_pages() -> list[Page]:
    from dashboard.pages import claims, compare, energy, overview, quality, scaling

    return [overview.PAGE, scaling.PAGE, compare.PAGE, quality.PAGE, energy.PAGE, claims.PAGE]


DENSE_COLORS = ["#1f77b4", "#17becf", "#2ca02c", "#3b5bdb", "#0b7285", "#5c940d", "#4c6ef5", "#74c0fc"]
MOE_COLORS = ["#ff7f0e", "#d62728", "#9467bd", "#e377c2", "#8c564b", "#f08c00", "#c2255c", "#7048e8"]


def series_colors(df) -> dict[str, str]:
    """A colour per series: dense in blues and greens, MoE in warm colours and purples."""
    colors, counts = {}, {"dense": 0, "moe": 0}
    for series, kind in df[["series", "kind"]].drop_duplicates("series").itertuples(index=False):
        family = "moe" if kind == "moe" else "dense"
        palette = MOE_COLORS if family == "moe" else DENSE_COLORS
        colors[series] = palette[counts[family] % len(palette)]
        counts[family] += 1
    return colors
