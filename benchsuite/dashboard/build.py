"""The publish step: a results folder in, a static site out (asv `publish` style).

    SITE/index.html          summary pages (overview, scaling, dense vs sparse, dense vs sparse at equal
                             quality, energy) as sections
    SITE/runs/<run_key>.html one page per record
    SITE/assets/             plotly.min.js (from the installed plotly package, once), theme.js,
                             dashboard.css, dashboard.js, runs.js (the runs table's rows)
    SITE/.benchsuite-manifest.json  the files the last build wrote: a rebuild removes only those
                             it no longer needs, and never overwrites a file it did not write;
                             and each run page's fingerprint: a rebuild renders again only the
                             pages whose inputs changed (a team's folder gains a few records a day)

The site opens from disk with no network: no CDN, no fetch; every figure is a Plotly JSON
spec built in Python and embedded in its page, drawn by Plotly.newPlot.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from benchsuite.atomic import atomic_file
from benchsuite.record.names import digest
from benchsuite.results.frames import rows_of
from benchsuite.results.index import source_digest
from benchsuite.results.predicted import beside
from benchsuite.results.store import cyclic_gc_paused
import benchsuite.dashboard.data as sitedata
from benchsuite.dashboard.pages import run as run_page
from benchsuite.dashboard.pages import summary_pages
from benchsuite.dashboard.render import TEMPLATE_LAYOUT, Figure, esc, merge, page_html, script_json

ASSETS = Path(__file__).resolve().parent / "assets"
ASSET_FILES = ("plotly.min.js", "plotly.version", "theme.js", "dashboard.css", "dashboard.js")
MANIFEST = ".benchsuite-manifest.json"
# What a build can write (relative to the site); a manifest entry of any other form is ignored.
SITE_FILE = re.compile(r"index\.html|assets/\w[\w.-]*|runs/\w[\w.-]*\.html")


class SiteError(ValueError):
    """The site folder holds a file the build would overwrite but did not write itself."""


@dataclass
class BuildResult:
    index: Path
    records: int
    pages: list[str] = field(default_factory=list)  # relative to the site folder
    bytes: int = 0


def _write(path: Path, text: str) -> int:
    """Never a partial page, even if the build is killed (no fsync: a site is cheap to rebuild)."""
    raw = text.encode("utf-8")
    with atomic_file(path, durable=False) as f:
        f.write(raw)
    return len(raw)


def write_assets(site: Path) -> int:
    """plotly.js from the installed plotly package (never a CDN), the Plotly template as a
    script (built from Python's plotly, shared by every page), and the page CSS / JS."""
    import plotly
    import plotly.io as pio
    from plotly.offline import get_plotlyjs

    assets = site / "assets"
    assets.mkdir(parents=True, exist_ok=True)
    size = 0
    js = assets / "plotly.min.js"
    stamp = assets / "plotly.version"
    if not (js.exists() and stamp.exists() and stamp.read_text() == plotly.__version__):
        _write(js, get_plotlyjs())
        _write(stamp, plotly.__version__)
    size += js.stat().st_size
    template = pio.templates["plotly_white"].to_plotly_json()
    template["layout"] = merge(template.get("layout", {}), TEMPLATE_LAYOUT)
    size += _write(assets / "theme.js", f"window.BENCHSUITE_TEMPLATE = {script_json(template)};\n")
    for name in ("dashboard.css", "dashboard.js"):
        size += _write(assets / name, (ASSETS / name).read_text(encoding="utf-8"))
    return size


def _validate(figures: list[Figure]) -> None:
    import plotly.graph_objects as go

    for f in figures:
        go.Figure(f.spec())  # raises ValueError naming the bad property


def _manifest(site: Path) -> dict:
    """The manifest as written, {} when it is missing, not a regular file (a FIFO would block the read),
    unreadable or not an object."""
    path = site / MANIFEST
    if not path.is_file():
        return {}
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return {}
    return doc if isinstance(doc, dict) else {}


def read_manifest(site: Path) -> set[str]:
    """The files earlier builds wrote (none where the manifest cannot be read)."""
    files = _manifest(site).get("files")
    return {f for f in files if isinstance(f, str) and SITE_FILE.fullmatch(f)} if isinstance(files, list) else set()


def read_fingerprints(site: Path) -> dict[str, str]:
    """Each run page's fingerprint as the last build wrote it (page_fingerprint)."""
    pages = _manifest(site).get("pages")
    return {k: v for k, v in pages.items() if isinstance(k, str) and isinstance(v, str)} \
        if isinstance(pages, dict) else {}


def page_fingerprint(row: dict, record: bytes | memoryview, prediction) -> str:
    """What a run page shows is a function of these alone: its row of the results model, its record (its bytes:
    SiteData.record_bytes), its prediction and the code; equal fingerprints, equal pages."""
    shown = {k: v for k, v in row.items() if k != "rec"}  # (its place in the folder's list: shown nowhere)
    h = hashlib.sha256(source_digest(("benchsuite",)).encode())  # a page rendered by other code is rendered again
    # (msgspec: json.dumps is 10× slower; any value it cannot encode, by its text)
    h.update(msgspec.json.encode(shown, order="sorted", enc_hook=str))
    h.update(record)
    h.update(msgspec.json.encode(prediction.to_dict() if prediction is not None else None, enc_hook=str))
    return h.hexdigest()[:16]


def owned_files(site: Path, files: set[str]) -> set[str]:
    """What earlier builds wrote: the manifest's list. A site built before the manifest existed (it has
    assets/plotly.version, which only this build writes) owns the files this build rewrites, no more."""
    if not (site / MANIFEST).exists() and (site / "assets" / "plotly.version").is_file():
        return {f for f in files if (site / f).is_file()}
    return read_manifest(site)


def write_manifest(site: Path, files: set[str], pages: dict[str, str] | None = None) -> None:
    _write(site / MANIFEST, json.dumps({"written_by": "benchsuite dashboard", "files": sorted(files),
                                        "pages": dict(sorted((pages or {}).items()))}, indent=1))


def check_ownership(site: Path, files: set[str], owned: set[str]) -> None:
    """Refuse to overwrite a file of `files` that exists but no earlier build wrote (a user's)."""
    foreign = sorted(f for f in files - owned if (site / f).exists() or (site / f).is_symlink())
    if foreign:
        more = f" and {len(foreign) - 1} more" if len(foreign) > 1 else ""
        raise SiteError(f"{site / foreign[0]}{more}: exists and was not written by an earlier build of this site "
                        f"(not in {MANIFEST}); give a new or empty site folder, or move the file away")


def file_sizes(folder: Path) -> dict[str, int]:
    """The regular files in folder (a link followed, as Path.is_file does) by name, with their sizes: one listing,
    not a stat or two for each of 10,000 pages."""
    sizes = {}
    with os.scandir(folder) as entries:
        for entry in entries:
            try:
                if entry.is_file():
                    sizes[entry.name] = entry.stat().st_size
            except OSError:  # gone meanwhile, or a link to nothing: not there
                continue
    return sizes


def remove_stale(site: Path, files: set[str]) -> None:
    """Files an earlier build wrote that this one did not (pages of records no longer there)."""
    for f in sorted(files):
        path = site / f
        if path.is_symlink() or path.is_file():
            path.unlink()


NAV = [("Runs", "#overview"), ("Scaling", "#scaling"), ("Dense vs sparse", "#compare"),
       ("Equal quality", "#quality"), ("Energy and carbon", "#energy"), ("Claims", "#claims")]


def build_site(results, out, *, validate: bool = False, system=None) -> BuildResult:
    """Build the site for `results` (a folder, or a list of record documents: data.load) into `out`.
    validate=True checks every figure against Plotly's schema (slower; the tests use it); system: a
    benchsuite.predict system, whose predictions run pages show beside the measured step time.
    The cyclic collector is paused throughout: the pages make millions of small strings and dicts, none in
    a cycle, and each collection would rescan every record held (a build time superlinear in the records)."""
    with cyclic_gc_paused():
        return _build(results, Path(out), validate, system)


def _build(results, out: Path, validate: bool, system) -> BuildResult:
    out.mkdir(parents=True, exist_ok=True)
    data = sitedata.load(results)
    predicted = {b.identity: b for b in beside(data.results, system)} if system is not None else {}
    sections = [p.render(data) for p in summary_pages()]
    data_files = [d for s in sections for d in s.data_files]
    files = {"index.html", *(f"assets/{a}" for a in ASSET_FILES), *(d.path for d in data_files),
             *([] if data.df.empty else data.df["page"].tolist())}
    owned = owned_files(out, files)
    check_ownership(out, files, owned)
    before = read_fingerprints(out)
    write_manifest(out, owned | files)  # first: a build stopped part-way still owns what it wrote (and no page
    # is trusted to be current until the build ends)
    size = write_assets(out)
    pages = []

    figures = [f for s in sections for f in s.figures]
    if validate:
        _validate(figures)
    body = "".join(f'<section id="{esc(s.slug)}"><h2>{esc(s.title)}</h2>{s.html}</section>' for s in sections)
    n_ok = int((data.df["status"] == "ok").sum()) if not data.df.empty else 0
    subtitle = (f"{len(data.records)} runs ({n_ok} ok, {len(data.records) - n_ok} failed)"
                + (f" from {data.source}" if data.source else ""))

    # Run pages first, the index last: a build stopped part-way leaves the previous index, whose
    # links all still resolve, instead of a new index linking pages not yet written.
    runs = out / "runs"
    runs.mkdir(exist_ok=True)
    there = file_sizes(runs)
    run_nav = [(t, f"../index.html{h}") for t, h in NAV]
    fingerprints = {}
    for row in rows_of(data.df, run_page.ROW_COLUMNS):
        prediction = predicted.get(row["identity"])
        fingerprints[row["page"]] = key = page_fingerprint(row, data.record_bytes(row), prediction)
        pages.append(row["page"])
        name = row["page"][len("runs/"):]
        if before.get(row["page"]) == key and name in there and not validate:
            size += there[name]
            continue  # the page this build would write is the one there (its record never decoded)
        section = run_page.render(row, data.record(row), prediction)
        if validate:
            _validate(section.figures)
        size += _write(out / row["page"], page_html(section.title, section.html, section.figures, "../", run_nav,
                                                    f"{row['suite']} · {row['status']}"))
    for d in data_files:  # the runs table's rows: after the run pages they link, before the index
        size += _write(out / d.path, d.js())
    size += _write(out / "index.html", page_html("Training cost: dense vs sparse", body, figures, "", NAV,
                                                 subtitle, data_files))
    pages.insert(0, "index.html")
    remove_stale(out, owned - files)
    write_manifest(out, files, fingerprints)
    return BuildResult(index=(out / "index.html").resolve(), records=len(data.records), pages=pages, bytes=size)
