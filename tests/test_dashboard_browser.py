"""The published site in a real headless Chromium (Debian's /usr/bin/chromium, driven by
playwright-python): it opens from file:// with no network and no console errors, every plot
renders with the traces and points the fixture results call for, hostile names show as text
and run nothing, and the runs table sorts and filters. Writes test-artifacts/dashboard.png.

Skips, saying why, only where no Chromium is found; CI sets BENCHSUITE_REQUIRE_BROWSER=1
(and installs Chromium), so there a missing browser fails instead.
"""

from __future__ import annotations

import html
import os
import shutil
from pathlib import Path

import pytest

from dashboard import build_site

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "results"
ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"
HOSTILE = "<img src=x onerror=alert(1)>"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]


def _chromium() -> str | None:
    for candidate in (os.environ.get("BENCHSUITE_CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium"),
                      shutil.which("chromium-browser")):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def _unavailable(reason: str):
    if os.environ.get("BENCHSUITE_REQUIRE_BROWSER") == "1":
        pytest.fail(f"BENCHSUITE_REQUIRE_BROWSER=1 but {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("playwright (python) is not installed: pip install -e '.[test]'")
    exe = _chromium()
    if not exe:
        _unavailable("no Chromium found (apt-get install -y chromium, or set BENCHSUITE_CHROMIUM=/path/to/chrome)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, args=ARGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    return out, build_site(FIXTURES, out)


@pytest.fixture(scope="module")
def index(browser, site):
    """The index, opened once (each load parses plotly.js; the tests below share it)."""
    out, _ = site
    p = Page(browser, (out / "index.html").as_uri())
    yield p
    p.page.close()


class Page:
    """A page opened from disk, with everything it said, asked or fetched recorded."""

    def __init__(self, browser, url: str, width: int = 1400):
        self.errors, self.dialogs, self.requests = [], [], []
        self.page = browser.new_page(viewport={"width": width, "height": 900})
        self.page.on("console", lambda m: m.type in ("error", "warning") and self.errors.append(f"{m.type}: {m.text}"))
        self.page.on("pageerror", lambda e: self.errors.append(f"pageerror: {e}"))
        self.page.on("dialog", self._dialog)
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.goto(url)
        # every figure placeholder has become a drawn Plotly plot
        self.page.wait_for_function("""() => [...document.querySelectorAll('[data-figure]')].every(
            el => el.classList.contains('js-plotly-plot') && el.data && el.querySelector('.main-svg'))""",
                                    timeout=15000)

    def _dialog(self, d):
        self.dialogs.append(d.message)
        d.dismiss()

    def figures(self) -> dict:
        return self.page.evaluate("""() => Object.fromEntries([...document.querySelectorAll('.js-plotly-plot')]
            .map(el => [el.id, el.data.map(t => [t.name, (t.x || t.y || []).length])]))""")

    def check_clean(self):
        assert not self.errors, self.errors
        assert not self.dialogs, self.dialogs
        assert all(u.startswith("file://") for u in self.requests), [u for u in self.requests
                                                                     if not u.startswith("file://")]


def _names(pairs):
    return [[html.escape(n, quote=False), k] for n, k in pairs]


H = f"{HOSTILE} (moe/<b onmouseover=alert(3)>r</b>)"
EXPECTED_INDEX = {
    "fig-scaling-throughput": _names([("dense", 3), ("dense · ideal", 3), ("dense-tiny", 2),
                                      ("dense-tiny · ideal", 2), ("switch", 3), ("switch · ideal", 3), ("zero3", 3),
                                      ("zero3 · ideal", 3)]),
    "fig-scaling-efficiency": _names([("dense (weak)", 3), ("dense-tiny (weak)", 2), ("switch (weak)", 3),
                                      ("zero3 (strong)", 3)]),
    "fig-compare-tokens_per_s": _names([(H, 1), ("dense (dense)", 3), ("dense-tiny (dense)", 2),
                                        ("switch (moe/switch)", 3), ("zero3 (dense)", 3)]),
    "fig-compare-mfu": _names([(H, 1), ("dense (dense)", 3), ("switch (moe/switch)", 3), ("zero3 (dense)", 3)]),
    # the smoke runs: w1 from a harness with energy (estimated), w2 from one without
    **{f"fig-compare-{c}": _names([(H, 1), ("dense (dense)", 3), ("dense-tiny (dense)", 1), ("switch (moe/switch)", 3),
                                   ("zero3 (dense)", 3)]) for c in ("j_per_token", "gco2e_per_mtok")},
    "fig-compare-pareto": _names([("dense", 3), ("MoE (sparse)", 3), ("Pareto front", 1)]),
    "fig-energy-stacked": _names([("GPU · measured", 7), ("GPU · sampled", 3), ("CPU · measured", 3),
                                  ("CPU · estimated", 7), ("DRAM · measured", 3), ("DRAM · estimated", 1)]),
}


def test_index_opens_offline_and_draws_every_figure(index):
    p = index
    assert p.figures() == EXPECTED_INDEX
    assert p.page.evaluate("typeof Plotly.newPlot") == "function"
    ARTIFACTS.mkdir(exist_ok=True)
    p.page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)
    p.check_clean()


def test_hostile_names_show_as_text_and_run_nothing(browser, site, index):
    out, _ = site
    p = index
    body = p.page.inner_text("body")
    assert HOSTILE in body and '<script>alert("suite")</script>' in body
    assert "</script><script>alert('err')</script>" in body  # the failed run's error, as text
    legend = p.page.evaluate("[...document.querySelectorAll('#fig-compare-tokens_per_s .legendtext')]"
                             ".map(e => e.textContent)")
    assert any(t.startswith(HOSTILE) for t in legend), legend  # Plotly drew the name as characters
    assert p.page.evaluate("document.querySelectorAll('img, svg b, svg i, [onerror], [onload]').length") == 0
    run = Page(browser, (out / "runs" / "hostile-1.html").as_uri())
    text = run.page.inner_text("body")
    for s in (HOSTILE, "<img src=y onerror=alert(4)>", "</script><script>alert(5)</script>",
              "<i onclick=alert(6)>grid</i>"):
        assert s in text, s
    run.page.wait_for_timeout(200)  # a deferred handler would have fired by now
    p.check_clean()
    run.check_clean()
    run.page.close()


def test_runs_table_sorts_and_filters(index):
    p = index
    visible = "() => [...document.querySelectorAll('#runs-table tbody tr')].filter(r => !r.hidden).length"
    assert p.page.evaluate(visible) == 13
    p.page.fill("[data-filter-text]", "switch")
    assert p.page.evaluate(visible) == 4 and p.page.inner_text("[data-count]") == "4 of 13 runs"
    p.page.select_option("select[data-filter=status]", "failed")
    assert p.page.evaluate(visible) == 1
    assert "OutOfMemoryError" in p.page.inner_text("#runs-table tbody tr:not([hidden])")
    p.page.fill("[data-filter-text]", "")
    p.page.select_option("select[data-filter=status]", "")
    p.page.select_option("select[data-filter=kind]", "moe/switch")
    assert p.page.evaluate(visible) == 4
    p.page.select_option("select[data-filter=kind]", "")
    col = "(i) => [...document.querySelectorAll('#runs-table tbody tr')].map(r => r.cells[i].getAttribute('data-v'))"
    p.page.click("#runs-table th:has-text('tok/s')")
    tps = [float(v) if v else None for v in p.page.evaluate(col, 7)]
    nums = [v for v in tps if v is not None]
    assert nums == sorted(nums) and tps[-1] is None  # ascending, the failed run (no figure) last
    p.page.click("#runs-table th:has-text('tok/s')")
    nums = [float(v) for v in p.page.evaluate(col, 7) if v]
    assert nums == sorted(nums, reverse=True)
    p.check_clean()


EXPECTED_RUN = {
    "s000000000000002.html": {"fig-run-steps": [["step time", 20]],
                              "fig-run-loss": [["training loss", 20], ["validation loss", 4]],
                              "fig-run-ranks": [["median step time", 2]], "fig-run-experts": [["tokens routed", 8]],
                              "fig-run-memory": [["measured", 4], ["analytic", 4]]},
    "z000000000000004.html": {"fig-run-steps": [["step time", 20]], "fig-run-loss": [["training loss", 20]],
                              "fig-run-memory": [["measured", 4], ["analytic", 4]]},
    "s000000000000008.html": {},
    "ee7bbe62e331231c.html": {"fig-run-steps": [["step time", 10]], "fig-run-loss": [["training loss", 10]],
                              "fig-run-ranks": [["median step time", 1]],
                              "fig-run-memory": [["measured", 4], ["analytic", 4]]},
    "hostile-1.html": {"fig-run-steps": [["step time", 20]], "fig-run-loss": [["training loss", 20]],
                       "fig-run-ranks": [["median step time", 1]]},
}


def test_run_pages_open_clean(browser, site):
    """Full, failed, strong-scaling (no per-rank data), hostile and a real CPU record: between them
    every kind of missing section (each page load parses plotly.js, so not all 13)."""
    out, res = site
    for rel in res.pages[1:]:
        name = Path(rel).name
        if name not in EXPECTED_RUN:
            continue
        p = Page(browser, (out / rel).as_uri(), width=1200)
        assert p.figures() == EXPECTED_RUN[name], name
        text = p.page.inner_text("main")
        if name == "s000000000000008.html":
            assert "failed on rank 3: OutOfMemoryError" in text and "run failed" in text
        if name == "z000000000000004.html":
            assert "Per-rank step time: not measured" in text and "MoE expert load: not applicable" in text
        if name == "s000000000000002.html":
            ARTIFACTS.mkdir(exist_ok=True)
            p.page.screenshot(path=str(ARTIFACTS / "dashboard-run.png"), full_page=True)
        p.check_clean()
        p.page.close()
