"""Every view's output on the fixture folder, held against the output it gave before the house was rebuilt
(tests/fixtures/views/): moving code must not move a figure or a name. A deliberate change to a view is
regenerated with BENCHSUITE_UPDATE_GOLDEN=1 and shows in the fixture's diff, where a reviewer reads it."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from benchsuite import cli

FIXTURES = Path(__file__).parent / "fixtures"
GOLDEN = FIXTURES / "views"
UPDATE = os.environ.get("BENCHSUITE_UPDATE_GOLDEN") == "1"

# verb → argv, run in a folder holding the fixture results as `results` (and a copy as `b`, for compare)
VIEWS = {
    "report.txt": ["report", "results"],
    "report.json": ["report", "results", "--json"],
    "list.txt": ["list", "results"],
    "list.json": ["list", "results", "--json"],
    "compare.txt": ["compare", "results", "b"],
    "compare.json": ["compare", "results", "b", "--json"],
    "project.json": ["carbon", "project", "results", "--tokens", "1e12", "--json"],
}
EXPORTS = {"emissions.csv": "codecarbon", "footprint.csv": "footprint"}


@pytest.fixture()
def folder(tmp_path, monkeypatch):
    shutil.copytree(FIXTURES / "results", tmp_path / "results")
    shutil.copytree(FIXTURES / "results", tmp_path / "b")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def held(name: str, text: str) -> None:
    path = GOLDEN / name
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    assert text == path.read_text(encoding="utf-8"), f"{name} differs from tests/fixtures/views/{name}"


@pytest.mark.parametrize("name", VIEWS)
def test_a_view_prints_what_it_printed_before(name, folder, capsys):
    cli.main(VIEWS[name])
    held(name, capsys.readouterr().out)


@pytest.mark.parametrize("name", EXPORTS)
def test_an_export_writes_what_it_wrote_before(name, folder):
    cli.main(["export", "results", "--format", EXPORTS[name], "-o", name])
    held(name, (folder / name).read_text(encoding="utf-8"))


def test_the_dashboard_builds_the_pages_it_built_before(folder):
    assert cli.main(["dashboard", "results", "-o", "site"]) == 0
    pages = sorted([folder / "site" / "index.html", *(folder / "site" / "runs").glob("*.html")])
    for page in pages:
        held(f"site/{page.relative_to(folder / 'site')}", page.read_text(encoding="utf-8"))
    if not UPDATE:
        assert sorted(p.relative_to(GOLDEN / "site") for p in (GOLDEN / "site").rglob("*.html")) == \
            [p.relative_to(folder / "site") for p in pages]
