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

from benchsuite.dashboard import build_site

pytestmark = pytest.mark.procs  # every test here launches processes

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


H = f"{HOSTILE} (MoE · Top-k)"
# the runs with metrics.quality after the hostile one; switch-q last (the energy panel has no trace for it)
QUALITY_RUNS = [("dense · w1 (dense)", 5), ("dense · w2 (dense)", 5), ("dense · w4 (dense)", 5),
                ("dense-q (dense)", 6), ("gshard-q (MoE · GShard)", 6),
                ("switch · w1 (MoE · Switch)", 5), ("switch · w2 (MoE · Switch)", 5),
                ("switch · w4 (MoE · Switch)", 5), ("switch-q (MoE · Switch)", 6)]
EXPECTED_INDEX = {
    "fig-scaling-throughput": _names([("dense", 3), ("dense · ideal", 3), ("dense-tiny", 2),
                                      ("dense-tiny · ideal", 2), ("switch", 3), ("switch · ideal", 3), ("zero3", 3),
                                      ("zero3 · ideal", 3)]),
    # dense-tiny's smoke runs had 2 threads at world 1 and 1 per rank at world 2: no fair baseline for w2
    "fig-scaling-efficiency": _names([("dense (weak)", 3), ("dense-tiny (weak)", 1), ("switch (weak)", 3),
                                      ("zero3 (strong)", 3)]),
    "fig-compare-tokens_per_s": _names([(H, 1), ("dense (dense)", 3), ("dense-q (dense)", 1), ("dense-tiny (dense)", 2),
                                        ("gshard-q (MoE · GShard)", 1), ("switch (MoE · Switch)", 3),
                                        ("switch-q (MoE · Switch)", 1), ("zero3 (dense)", 3)]),
    # the hostile record's device is no device of the peak table: no MFU
    "fig-compare-mfu": _names([("dense (dense)", 3), ("dense-q (dense)", 1), ("gshard-q (MoE · GShard)", 1),
                               ("switch (MoE · Switch)", 3), ("switch-q (MoE · Switch)", 1), ("zero3 (dense)", 3)]),
    # the smoke runs: w1 from a harness with energy (estimated), w2 from one without; switch-q: no energy meter
    **{f"fig-compare-{c}": _names([(H, 1), ("dense (dense)", 3), ("dense-q (dense)", 1), ("dense-tiny (dense)", 1),
                                   ("gshard-q (MoE · GShard)", 1), ("switch (MoE · Switch)", 3), ("zero3 (dense)", 3)])
       for c in ("j_per_token", "gco2e_per_mtok")},
    # a trace (colour and marker) per model family
    "fig-compare-pareto": _names([("dense", 4), ("MoE · Switch", 3), ("MoE · GShard", 1),
                                  ("MoE · Top-k", 1), ("Pareto front", 2)]),
    # three panels (tokens, energy, model FLOPs), a trace per run in each: 5 evaluations (eval_every 5 over
    # 20 steps) or 6 (every 4); switch-q has no energy meter, so no trace in the energy panel
    "fig-quality-curves": _names([(H, 5), *QUALITY_RUNS, (H, 5), *QUALITY_RUNS[:-1], (H, 5), *QUALITY_RUNS]),
    # one bar per run and panel (tokens, seconds, kWh, g CO2e); not-reached runs are null there, not 0
    "fig-quality-target": [["Tokens", 10], ["Time (s)", 10], ["Energy (kWh)", 10], ["CO2e (g)", 10]],
    # the quality fixtures' claims: the energy claims are not testable on estimated energy (a fixed power ×
    # time), so one claim range (a 2-point segment) and its measured point
    "fig-claims": [["published claim", 3], ["measured (95 % interval)", 1]],
    "fig-energy-stacked": _names([("GPU · measured", 8), ("GPU · sampled", 3), ("CPU · measured", 4),
                                  ("CPU · estimated", 8), ("DRAM · measured", 4), ("DRAM · estimated", 2)]),
}


def test_index_opens_offline_and_draws_every_figure(index):
    p = index
    assert p.figures() == EXPECTED_INDEX
    assert p.page.evaluate("typeof Plotly.newPlot") == "function"
    ARTIFACTS.mkdir(exist_ok=True)
    p.page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)
    # quality curves: log x (step 0 off the axis), a button for linear x with step 0 on it
    axes = "() => ['xaxis', 'xaxis2', 'xaxis3'].map(a => document.getElementById('fig-quality-curves').layout[a].type)"
    assert p.page.evaluate(axes) == ["log"] * 3
    p.page.locator("#fig-quality-curves .updatemenu-button").nth(1).click()
    p.page.wait_for_function(axes.replace("() =>", "() => (") + ").every(t => t === 'linear')")
    p.page.locator("#fig-quality-curves .updatemenu-button").nth(0).click()
    p.page.wait_for_function(axes.replace("() =>", "() => (") + ").every(t => t === 'log')")
    # to target: the not-reached runs are labelled, with no bar
    labels = p.page.evaluate("[...document.querySelectorAll('#fig-quality-target .annotation-text')]"
                             ".map(e => e.textContent)")
    assert labels.count("not reached") == 8 and labels.count("not measured") == 2, labels
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


TOKENS_COLUMN = 9  # suite, workload, seed, repeat, model, devices, nodes, scaling, status, tokens/s


def test_runs_table_sorts_and_filters(index):
    p = index
    visible = "() => [...document.querySelectorAll('#runs-table tbody tr')].filter(r => !r.hidden).length"
    assert p.page.evaluate(visible) == 16
    p.page.fill("[data-filter-text]", "switch")
    assert p.page.evaluate(visible) == 5 and p.page.inner_text("[data-count]") == "5 of 16 records"
    p.page.select_option("select[data-filter=status]", "failed")
    assert p.page.evaluate(visible) == 1
    assert "OutOfMemoryError" in p.page.inner_text("#runs-table tbody tr:not([hidden])")
    p.page.fill("[data-filter-text]", "")
    p.page.select_option("select[data-filter=status]", "")
    p.page.select_option("select[data-filter=kind]", "MoE · Switch")
    assert p.page.evaluate(visible) == 5
    p.page.select_option("select[data-filter=kind]", "")
    col = "(i) => [...document.querySelectorAll('#runs-table tbody tr')].map(r => r.cells[i].getAttribute('data-v'))"
    p.page.click("#runs-table th:has-text('Tokens/s')")
    tps = [float(v) if v else None for v in p.page.evaluate(col, TOKENS_COLUMN)]
    nums = [v for v in tps if v is not None]
    assert nums == sorted(nums) and tps[-1] is None  # ascending, the failed run (no figure) last
    p.page.click("#runs-table th:has-text('Tokens/s')")
    nums = [float(v) for v in p.page.evaluate(col, TOKENS_COLUMN) if v]
    assert nums == sorted(nums, reverse=True)
    p.check_clean()


def test_runs_table_pages_through_every_run_and_sorts_across_pages(browser, tmp_path):
    """230 runs, 100 a page: every run page is reached from the table, sorting and filtering see every
    run (not only the page shown), and a link on the last page opens its run page."""
    from benchmarks.bench_dashboard import synthetic_records

    res = build_site(synthetic_records(230, steps=4), tmp_path)
    p = Page(browser, (tmp_path / "index.html").as_uri())
    rows = "() => [...document.querySelectorAll('#runs-table tbody tr')]"
    links = rows + ".map(r => r.querySelector('a').getAttribute('href'))"
    assert p.page.inner_text("[data-count]") == "230 of 230 records"
    seen = []
    for page, n in ((1, 100), (2, 100), (3, 30)):
        assert p.page.inner_text("[data-page-info]") == f"page {page} of 3"
        seen += p.page.evaluate(links)
        assert len(seen) == 100 * (page - 1) + n
        if page < 3:
            p.page.click("[data-page=next]")
    assert p.page.is_disabled("[data-page=next]") and sorted(seen) == sorted(res.pages[1:])
    assert all((tmp_path / href).is_file() for href in seen)
    p.page.click("#runs-table th:has-text('Tokens/s')")  # ascending over all 230, back on page 1
    assert p.page.inner_text("[data-page-info]") == "page 1 of 3"
    first = p.page.evaluate(f"() => parseFloat(document.querySelector('#runs-table tbody tr').cells[{TOKENS_COLUMN}]"
                            ".getAttribute('data-v'))")
    lowest = min(r["metrics"]["tokens_per_s"] for r in synthetic_records(230, steps=4) if r["metrics"])
    assert first == pytest.approx(lowest)
    p.page.select_option("select[data-filter=status]", "failed")
    assert p.page.inner_text("[data-count]") == "11 of 230 records" and p.page.is_hidden(".pager")
    p.page.select_option("select[data-filter=status]", "")
    p.page.click("[data-page=next]")
    p.page.click("[data-page=next]")
    href = p.page.evaluate(links)[-1]
    p.page.click(f'#runs-table a[href="{href}"]')
    p.page.wait_for_load_state()
    assert p.page.url == (tmp_path / href).as_uri()
    p.check_clean()
    p.page.close()


EXPECTED_RUN = {
    "s000000000000002.html": {"fig-run-steps": [["step time", 20]],
                              "fig-run-loss": [["training loss", 20], ["validation loss", 4]],
                              "fig-run-ranks": [["median step time", 2]], "fig-run-experts": [["tokens routed, before capacity", 8]],
                              "fig-run-memory": [["measured", 4], ["analytic", 4]]},
    "z000000000000004.html": {"fig-run-steps": [["step time", 20]], "fig-run-loss": [["training loss", 20]],
                              "fig-run-memory": [["measured", 4], ["analytic", 4]]},
    "s000000000000008.html": {},
    "ee7bbe62e331231c.html": {"fig-run-steps": [["step time", 10]], "fig-run-loss": [["training loss", 10]],
                              "fig-run-ranks": [["median step time", 1]],
                              "fig-run-memory": [["measured", 4], ["analytic", 4]]},
    "hostile-1.html": {"fig-run-steps": [["step time", 20]],
                       "fig-run-loss": [["training loss", 20], ["validation loss", 4]],
                       "fig-run-ranks": [["median step time", 1]]},
    "q000000000000001.html": {"fig-run-steps": [["step time", 20]],  # switch-q: flagged, no energy meter
                              "fig-run-loss": [["training loss", 20], ["validation loss", 5]],
                              "fig-run-ranks": [["median step time", 1]], "fig-run-experts": [["tokens routed, before capacity", 8]],
                              "fig-run-memory": [["measured", 4], ["analytic", 4]]},
}


def test_run_pages_open_clean(browser, site):
    """Full, failed, strong-scaling (no per-rank data), hostile, flagged and a real CPU record: between
    them every kind of missing section (each page load parses plotly.js, so not all 16)."""
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
        if name == "q000000000000001.html":
            box = p.page.inner_text(".flags")
            assert "Flagged: 1 figure(s)" in box and "metrics.mfu_vs_ceiling" in box and "1.34" in box
            assert p.page.is_visible(".flags")
        else:
            assert p.page.locator(".flags").count() == 0, name
        if name == "z000000000000004.html":
            assert "Per-rank step time: not measured" in text and "MoE expert load: not applicable" in text
        if name == "s000000000000002.html":
            ARTIFACTS.mkdir(exist_ok=True)
            p.page.screenshot(path=str(ARTIFACTS / "dashboard-run.png"), full_page=True)
        p.check_clean()
        p.page.close()


def test_the_dense_vs_sparse_bars_carry_the_reports_figures_and_the_runs_table_names_seeds(browser, tmp_path,
                                                                                           capsys):
    """In the browser: each bar is the report's median, its error bar the report's 95 % interval over
    seeds; the runs table names each record's seed and repeat."""
    import json

    from benchsuite import cli
    from benchsuite.record import write_record
    from test_results_model import TOKENS, record

    results = tmp_path / "results"
    for (workload, router, world, seed), tokens in TOKENS.items():
        for repeat, tps in enumerate(tokens):
            write_record(results, record(workload, router, world, seed, repeat, tps))
    assert cli.main(["report", str(results), "--json"]) == 0
    report = {r["label"]: r for r in json.loads(capsys.readouterr().out)["runs"]}
    build_site(results, tmp_path / "site")
    p = Page(browser, (tmp_path / "site" / "index.html").as_uri())
    bars = p.page.evaluate("""() => document.getElementById('fig-compare-tokens_per_s').data.map(t =>
        ({name: t.name, x: t.x, y: t.y, plus: t.error_y.array, minus: t.error_y.arrayminus}))""")
    drawn = 0
    for t in bars:
        for x, y, plus, minus in zip(t["x"], t["y"], t["plus"], t["minus"]):
            row = report[f"{t['name'].split(' (')[0]} · {x}"]
            assert y == row["tokens_per_s"]
            assert (y - minus, y + plus) == (pytest.approx(row["tokens_per_s_lo"], rel=1e-12),
                                             pytest.approx(row["tokens_per_s_hi"], rel=1e-12))
            drawn += 1
    assert drawn == len(report) == 3
    cells = p.page.evaluate("""() => [...document.querySelectorAll('#runs-table tbody tr')]
        .map(r => [...r.cells].slice(1, 4).map(c => c.textContent))""")
    # the Run column names the run as the report does (its label)
    assert sorted(map(tuple, cells)) == sorted((f"{w} · w{n}", str(s), str(r)) for (w, _, n, s), tokens in
                                               TOKENS.items() for r in range(len(tokens)))
    assert {c[0] for c in cells} == set(report)
    heads = p.page.evaluate("() => [...document.querySelectorAll('#runs-table th')].map(h => h.textContent)")
    assert heads[2:4] == ["Seed", "Repeat"]
    p.check_clean()
    p.page.close()


@pytest.fixture(scope="module")
def dropping_site(tmp_path_factory):
    """The fixtures and a switch run that dropped 64 % of its token assignments (over the 10 % threshold)."""
    import copy

    import msgspec

    from benchsuite.results.store import load_records

    recs = [msgspec.to_builtins(one.record) for one in load_records(FIXTURES)]  # documents, to change
    rec = copy.deepcopy(next(r for r in recs if r["run_key"] == "s000000000000002"))
    rec.update(run_key="drops00000000064", workload="switch-drops")
    rec["config"].update(workload="switch-drops", sweep_id="dense-vs-sparse/switch-drops/weak")
    rec["metrics"]["moe"]["dropped_frac"] = 0.64
    out = tmp_path_factory.mktemp("dropping")
    build_site([*recs, rec], out)
    return out


def test_a_run_dropping_most_tokens_is_flagged_in_the_runs_table_and_on_its_page(browser, dropping_site):
    p = Page(browser, (dropping_site / "index.html").as_uri())
    p.page.fill("[data-filter-text]", "switch-drops")
    status = p.page.locator("#runs-table tbody tr td.status-flagged")
    assert status.count() == 1 and status.inner_text().startswith("ok ⚠ flagged")
    assert "64% of the token assignments were dropped" in status.locator(".warn").get_attribute("title")
    note = status.locator(".flag-note")  # the reason is on the page, not only in a tooltip
    assert note.is_visible() and "64% of the token assignments were dropped" in note.inner_text()
    p.page.click("#runs-table a:has-text('switch-drops')")
    p.page.wait_for_function("() => document.querySelector('.flags') !== null")
    box = p.page.inner_text(".flags")
    assert p.page.is_visible(".flags") and "metrics.moe.dropped_frac" in box and "not the model's" in box
    rows = dict(p.page.evaluate("""() => [...document.querySelectorAll('table.kv tr')]
        .map(r => [r.cells[0].textContent, r.cells[1].textContent])"""))
    assert rows["tokens dropped (over capacity)"] == "64.0% ⚠ above 10%: the run's speed is not the model's"
    assert rows["parameters (total / active per token)"] == "350 M / 190 M"
    assert rows["router"] == "switch, top-1" and rows["capacity factor"] == "1.25"
    assert rows["experts (shared)"] == "8 (0 shared), every 2 block(s)"
    p.check_clean()
    p.page.close()


def _widths(p: Page) -> dict:
    return p.page.evaluate("""() => {
        const box = document.querySelector('#runs-table').parentElement, table = document.querySelector('#runs-table');
        const shown = [...table.tHead.rows[0].cells].filter(c => getComputedStyle(c).display !== 'none');
        return {viewport: window.innerWidth, page: document.documentElement.scrollWidth,
                box_right: box.getBoundingClientRect().right, box: box.clientWidth, table: table.scrollWidth,
                columns: shown.map(c => c.textContent)};
    }""")


@pytest.mark.parametrize("width", [1400, 900])
def test_the_runs_table_fits_its_window_without_a_cut_column(browser, site, width):
    """Every shown column lies inside the window: the table is no wider than its box, the box ends inside
    the viewport and the page does not scroll sideways; below 1,200 px the wide-only columns are left out."""
    out, _ = site
    p = Page(browser, (out / "index.html").as_uri(), width=width)
    w = _widths(p)
    assert w["table"] <= w["box"] and w["box_right"] <= w["viewport"] and w["page"] <= w["viewport"], w
    narrow = ["Run", "Seed", "Model", "Devices", "Status", "Tokens/s", "MFU (HFU)", "Step time (ms, 95% CI)",
              "Scaling efficiency (the run's)"]
    assert w["columns"] == (narrow if width < 1200 else [
        "Suite", "Run", "Seed", "Repeat", "Model", "Devices", "Nodes", "Scaling", "Status", "Tokens/s",
        "MFU (HFU)", "Step time (ms, 95% CI)", "Scaling efficiency (the run's)", "Energy/token (J)", "CO2e/Mtok (g)"])
    ARTIFACTS.mkdir(exist_ok=True)
    p.page.screenshot(path=str(ARTIFACTS / f"dashboard-{width}.png"), full_page=True)
    run = Page(browser, (out / "runs" / "s000000000000002.html").as_uri(), width=width)
    page_width = run.page.evaluate("() => document.documentElement.scrollWidth")
    assert page_width <= width, page_width
    run.page.screenshot(path=str(ARTIFACTS / f"dashboard-run-{width}.png"), full_page=True)
    # a flagged record's note is never cut in the table, and its page's flag box keeps each field on one line
    cut = p.page.evaluate("""() => [...document.querySelectorAll('#runs-table .flag-note')]
        .filter(n => n.scrollHeight > n.clientHeight + 1).map(n => n.textContent)""")
    assert cut == []
    flagged = Page(browser, (out / "runs" / "q000000000000001.html").as_uri(), width=width)
    lines = flagged.page.evaluate("""() => [...document.querySelectorAll('.flags table tbody tr td:first-child')]
        .map(td => { const r = document.createRange(); r.selectNodeContents(td); return r.getClientRects().length; })""")
    assert lines and all(n == 1 for n in lines), lines
    flagged.page.screenshot(path=str(ARTIFACTS / f"dashboard-flagged-{width}.png"), full_page=True)
    p.check_clean()
    run.check_clean()
    flagged.check_clean()
    for page in (p, run, flagged):
        page.page.close()
