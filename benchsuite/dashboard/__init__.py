"""The published dashboard: a static, offline Plotly site built from a results folder.

Reads only benchsuite.results (records and the DataFrame); never runs a model.
`build_site(results_dir, site_dir)` is the whole API; `benchsuite dashboard` calls it.
"""

from benchsuite.dashboard.build import BuildResult, build_site

__all__ = ["BuildResult", "build_site"]
