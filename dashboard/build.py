"""The publish step: a results folder in, a static site out (asv `publish` style).

    SITE/index.html          summary pages (overview, scaling, dense vs sparse, dense vs sparse at equal
                             quality, energy) as sections
    SITE/runs/<run_key>.html one page per record
    SITE/assets/             plotly.min.js (from the installed plotly package, once), theme.js,
                             dashboard.css, dashboard.js, runs.js (the runs table's rows)

The site opens from disk with no network: no CDN, no fetch; every figure is a Plotly JSON
spec built in Python and embedded in its page, drawn by Plotly.newPlot.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from benchsuite.atomic import atomic_file
from dashboard import data as sitedata
from dashboard.pages import run as run_page
from dashboard.pages import summary_pages
from dashboard.render import TEMPLATE_LAYOUT, Figure, esc, page_html, script_json

ASSETS = Path(__file__).resolve().parent / "assets"


@dataclass
class BuildResult:
    index: Path
    records: int
    pages: list[str] = field(default_factory=list)  # relative to the site folder
    bytes: int = 0

    def to_json(self) -> dict:
        return {"index": str(self.index), "records": self.records, "pages": self.pages, "bytes": self.bytes}


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
    template["layout"] = _merge(template.get("layout", {}), TEMPLATE_LAYOUT)
    size += _write(assets / "theme.js", f"window.BENCHSUITE_TEMPLATE = {script_json(template)};\n")
    for name in ("dashboard.css", "dashboard.js"):
        size += _write(assets / name, (ASSETS / name).read_text(encoding="utf-8"))
    return size


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _validate(figures: list[Figure]) -> None:
    import plotly.graph_objects as go

    for f in figures:
        go.Figure(f.spec())  # raises ValueError naming the bad property


NAV = [("Runs", "#overview"), ("Scaling", "#scaling"), ("Dense vs sparse", "#compare"),
       ("Equal quality", "#quality"), ("Energy and carbon", "#energy")]


def build_site(results, out, *, validate: bool = False) -> BuildResult:
    """Build the site for `results` (a folder, or a list of records) into `out`.
    validate=True checks every figure against Plotly's schema (slower; the tests use it)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    data = sitedata.load(results)
    size = write_assets(out)
    pages = []

    sections = [p.render(data) for p in summary_pages()]
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
    run_nav = [(t, f"../index.html{h}") for t, h in NAV]
    written = set()
    for row in data.df.to_dict("records") if not data.df.empty else []:
        section = run_page.render(row, data.record(row))
        if validate:
            _validate(section.figures)
        size += _write(out / row["page"], page_html(section.title, section.html, section.figures, "../", run_nav,
                                                    f"{row['suite']} · {row['status']}"))
        pages.append(row["page"])
        written.add(Path(row["page"]).name)
    data_files = [d for s in sections for d in s.data_files]
    for d in data_files:  # the runs table's rows: after the run pages they link, before the index
        size += _write(out / d.path, d.js())
    size += _write(out / "index.html", page_html("Training cost: dense vs sparse", body, figures, "", NAV,
                                                 subtitle, data_files))
    pages.insert(0, "index.html")
    for stale in runs.glob("*.html"):  # pages of records no longer in the results
        if stale.name not in written:
            stale.unlink()
    return BuildResult(index=(out / "index.html").resolve(), records=len(data.records), pages=pages, bytes=size)
