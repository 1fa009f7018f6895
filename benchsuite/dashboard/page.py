"""A summary page of the dashboard: `Page(slug, title, render)`, `render(data) -> PageSection`
(dashboard/pages/ lists them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from benchsuite.dashboard.data import SiteData
from benchsuite.dashboard.render import PageSection


@dataclass(frozen=True)
class Page:
    slug: str
    title: str
    render: Callable[[SiteData], PageSection]
