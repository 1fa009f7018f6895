"""Pages as small plug-ins over one SiteData (records + DataFrame), asv-publish style.

A summary page is a `Page(slug, title, render)`; `render(data)` returns a `PageSection`
(escaped HTML and the figures it places); the builder lays the summary sections out, in
this order, on index.html. `RUN_PAGE` renders one detail page per record. To add a view,
write a module with a `PAGE` and list it here; nothing else changes.
"""

from __future__ import annotations

from benchsuite.dashboard.page import Page


def summary_pages() -> list[Page]:
    from benchsuite.dashboard.pages import claims, compare, energy, overview, quality, scaling

    return [overview.PAGE, scaling.PAGE, compare.PAGE, quality.PAGE, energy.PAGE, claims.PAGE]
