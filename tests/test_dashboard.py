"""The dashboard without a browser: the site builds from the fixture results, every page escapes
hostile strings, pages cope with records that lack sections, and nothing loads from the network."""

from __future__ import annotations

import copy
import html
import json
import re
from html.parser import HTMLParser
from pathlib import Path

import msgspec
import pytest

from benchsuite.results.store import load_records
from benchsuite.dashboard import build_site
from benchsuite.dashboard.data import load
from benchsuite.results.frames import rows_of
from benchsuite.dashboard.pages import summary_pages
from benchsuite.dashboard.render import ptext, script_json
from benchsuite.record.columns import described
from helpers import run_cli

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "results"
HOSTILE = ["<img src=x onerror=alert(1)>", '<script>alert("suite")</script>', '"><svg onload=alert(2)>',
           "<img src=y onerror=alert(4)>", "</script><script>alert(5)</script>",
           "<i onclick=alert(6)>grid</i>", "<script>alert('reason')</script>", "</script><script>alert('err')",
           "<svg onload=alert('quality')>"]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    return out, build_site(FIXTURES, out, validate=True)


def _pages(out: Path) -> list[Path]:
    return sorted(out.rglob("*.html"))


class _Tags(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)


def _parse(path: Path) -> _Tags:
    p = _Tags()
    p.feed(path.read_text(encoding="utf-8"))
    return p


def _runs_rows(site: Path) -> list:
    """The runs table's rows, [page, status, model, note, cells], as assets/runs.js holds them."""
    text = (site / "assets" / "runs.js").read_text(encoding="utf-8")
    assert text.startswith("window.BENCHSUITE_RUNS = ") and text.endswith(";\n")
    return json.loads(text[len("window.BENCHSUITE_RUNS = "):-2])


def test_site_builds_from_the_fixture_folder(site):
    out, res = site
    n = len(list(FIXTURES.glob("*.json")))
    assert res.records == n == 16
    assert res.index == (out / "index.html").resolve() and res.index.exists()
    assert res.pages[0] == "index.html" and len(res.pages) == n + 1
    assert all((out / p).exists() for p in res.pages)
    assert len(set(res.pages)) == len(res.pages)
    assert {p.name for p in (out / "runs").iterdir()} == {Path(p).name for p in res.pages[1:]}
    for name in ("plotly.min.js", "theme.js", "dashboard.css", "dashboard.js"):
        assert (out / "assets" / name).stat().st_size > 0
    # a run key is a file name only after it is made safe ("../hostile<1>" stays inside runs/)
    assert "runs/hostile-1.html" in res.pages
    index = (out / "index.html").read_text()
    for section in ("overview", "scaling", "compare", "quality", "energy"):
        assert f'<section id="{section}">' in index


def test_plotly_js_is_the_installed_copy_and_nothing_loads_from_the_network(site):
    from plotly.offline import get_plotlyjs

    out, _ = site
    assert (out / "assets" / "plotly.min.js").read_text(encoding="utf-8") == get_plotlyjs()
    for page in _pages(out):
        text = page.read_text(encoding="utf-8")
        assert not re.search(r"""<script[^>]*\bsrc\s*=\s*["']?(https?:|//)""", text, re.I), page
        refs = [a.get("src") or a.get("href") for t, a in _parse(page).tags if t in ("script", "link")]
        for ref in filter(None, refs):
            assert not re.match(r"(https?:)?//", ref), (page, ref)
            assert (page.parent / ref).resolve().is_file(), (page, ref)
    assert "cdn" not in (out / "index.html").read_text().lower()


def test_every_page_escapes_hostile_strings(site):
    out, _ = site
    for page in _pages(out):
        text = page.read_text(encoding="utf-8")
        parsed = _parse(page)
        for s in HOSTILE:
            assert s not in text, (page.name, s)
        for tag, attrs in parsed.tags:
            assert tag not in ("img", "svg", "b", "i", "iframe", "object"), (page.name, tag, attrs)
            assert not any(k.startswith("on") for k in attrs), (page.name, tag, attrs)
            if tag == "script":  # only our own: shared assets and the figures' JSON data
                assert attrs.get("type") == "application/json" or attrs.get("src", "").startswith(
                    ("assets/", "../assets/")), (page.name, attrs)
        figures = re.search(r'<script type="application/json" id="bs-figures">(.*?)</script>', text, re.S).group(1)
        assert "<" not in figures and ">" not in figures and "&" not in figures.replace("\\u0026", "")
        json.loads(figures)
    index = (out / "index.html").read_text()
    assert html.escape("<img src=x onerror=alert(1)>") in index  # shown as text in the table
    hostile_page = _parse(out / "runs" / "hostile-1.html")
    text = "".join(hostile_page.text)
    for s in ("<img src=x onerror=alert(1)>", "<img src=y onerror=alert(4)>", "</script><script>alert(5)</script>",
              "<i onclick=alert(6)>grid</i>", "<script>alert('reason')</script>"):
        assert s in text, s  # the characters reach the reader as text
    failed = "".join(_parse(out / "runs" / "s000000000000008.html").text)
    assert "CUDA out of memory" in failed and "</script><script>alert('err')</script>" in failed


def test_script_json_cannot_close_its_element():
    doc = {"name": "</script><!-- <script>alert(1)</script> & \u2028", "n": float("nan")}
    text = script_json(doc)
    assert not set("<>&") & set(text) and "\u2028" not in text
    assert json.loads(text) == {"name": doc["name"], "n": None}


def _records() -> list[dict]:
    """The fixture folder's records as documents, to change before a build."""
    return [msgspec.to_builtins(one.record) for one in load_records(FIXTURES)]


def _record(name: str) -> dict:
    return next(msgspec.to_builtins(one.record) for one in load_records(FIXTURES) if one.path.name == name)


def _strip(rec: dict, what: str) -> dict:
    rec = copy.deepcopy(rec)
    m = rec["metrics"]
    if what == "energy":
        rec["energy"] = None
        m.pop("derived", None)
        m.pop("energy", None)
        for k in ("j_per_token", "gco2e_per_mtok", "avg_w_per_device", "j_per_pflop"):
            m.pop(k, None)
    elif what == "energy-all-unavailable":
        rec["energy"].update(gpu_j=None, cpu_j=None, dram_j=None, total_j=None, per_device=[],
                             sources={"gpu": "unavailable", "cpu": "unavailable", "dram": "unavailable"})
    elif what == "carbon":
        rec["carbon"] = None
    elif what == "moe":
        del m["moe"]
    elif what == "expert_load":
        del m["moe"]["expert_load"]
    elif what == "model_state":
        del m["memory"]["model_state_bytes"]
    elif what == "memory":
        del m["memory"]
    elif what == "val_loss":
        for s in rec["steps"]:
            s.pop("val_loss", None)
        m.pop("quality", None)
    elif what == "per_rank":
        m.pop("per_rank", None)
    elif what == "steps":
        rec["steps"] = []
    elif what == "env":
        rec["env"] = {}
    elif what == "metrics":
        rec.update(status="failed", metrics=None, energy=None, carbon=None, steps=[],
                   error={"type": "Timeout", "message": "no heartbeat", "rank": None})
    return rec


MISSING = {  # section taken out of a full record → what the pages say instead
    "energy": "Energy per run</strong>: not measured",
    "energy-all-unavailable": "Energy per run</strong>: not measured",
    "carbon": "Carbon</strong>: not measured",
    "moe": "MoE expert load</strong>: not measured",
    "expert_load": "MoE expert load</strong>: not measured",
    "model_state": "Model-state memory: measured vs analytic</strong>: not measured",
    "memory": "Peak memory per rank</strong>: not measured",
    "val_loss": "Validation loss: not measured",
    "per_rank": "Per-rank step time</strong>: not measured",
    "steps": "Step time</strong>: no per-step times recorded",
    "env": "Environment</strong>: not recorded",
    "metrics": "Step time</strong>: run failed",
}


@pytest.mark.parametrize("what", sorted(MISSING))
def test_pages_cope_with_a_record_missing_a_section(tmp_path, what):
    rec = _strip(_record("make_dvs-switch-w2.json"), what)
    res = build_site([rec], tmp_path, validate=True)
    text = (tmp_path / res.pages[1]).read_text() + (tmp_path / "index.html").read_text()
    assert MISSING[what] in text


def test_pages_cope_with_every_section_missing_at_once(tmp_path):
    recs = []
    for r in _records():
        if r["metrics"]:
            for what in ("energy", "carbon", "val_loss", "per_rank", "memory", "steps"):
                r = _strip(r, what)
            r["metrics"].pop("moe", None)
        recs.append(r)
    res = build_site(recs, tmp_path, validate=True)
    index = (tmp_path / "index.html").read_text()
    assert "Energy per run</strong>: not measured" in index
    assert "no record has a carbon section" in index
    assert "Energy per token</strong>: not measured" in index
    for p in res.pages[1:]:
        assert "not measured" in (tmp_path / p).read_text() or "run failed" in (tmp_path / p).read_text()


def test_empty_and_all_failed_results_build(tmp_path):
    empty = build_site([], tmp_path / "empty")
    assert empty.records == 0 and empty.pages == ["index.html"]
    assert "No records" in (tmp_path / "empty" / "index.html").read_text()
    failed = [_strip(r, "metrics") for r in _records() if r["metrics"]][:3]
    res = build_site(failed, tmp_path / "failed", validate=True)
    index = (tmp_path / "failed" / "index.html").read_text()
    assert "no successful runs" in index and [r[1] for r in _runs_rows(tmp_path / "failed")] == ["failed"] * 3
    assert res.records == 3


def _figures(records) -> dict:
    data = load(records)
    return {f.id: f for p in summary_pages() for f in p.render(data).figures}


def test_summary_figures_from_the_fixtures():
    figs = _figures(FIXTURES)
    assert list(figs) == ["fig-scaling-throughput", "fig-scaling-efficiency", "fig-compare-tokens_per_s",
                          "fig-compare-mfu", "fig-compare-j_per_token", "fig-compare-gco2e_per_mtok",
                          "fig-compare-pareto", "fig-quality-curves", "fig-quality-target", "fig-energy-stacked", "fig-claims"]
    thr = figs["fig-scaling-throughput"].data
    assert [(t["name"], len(t["x"])) for t in thr[::2]] == [("dense", 3), ("dense-tiny", 2), ("switch", 3),
                                                            ("zero3", 3)]
    dense, ideal = thr[0], thr[1]
    assert ideal["y"] == pytest.approx([dense["y"][0] * n for n in dense["x"]], rel=1e-4)
    eff = {t["name"]: t for t in figs["fig-scaling-efficiency"].data}
    assert eff["zero3 (strong)"]["line"]["dash"] == "dash" and eff["dense (weak)"]["y"][0] == 1.0
    assert "validation loss" in figs["fig-compare-pareto"].layout["title"]["text"]
    # measured and estimated energy are drawn differently and named in the legend
    energy = {t["name"]: t["marker"] for t in figs["fig-energy-stacked"].data}
    assert energy["GPU · measured"]["pattern"]["shape"] == "" and energy["GPU · measured"]["opacity"] == 1.0
    assert energy["CPU · estimated"]["pattern"]["shape"] == "x" and energy["CPU · estimated"]["opacity"] < 1
    assert energy["GPU · sampled"]["pattern"]["shape"] == "/"


def test_pareto_falls_back_to_throughput_without_validation_loss():
    recs = [_strip(r, "val_loss") if r["metrics"] else r for r in _records()]
    pareto = _figures(recs)["fig-compare-pareto"]
    assert "throughput" in pareto.layout["title"]["text"]
    assert sum(len(t["x"]) for t in pareto.data[:-1]) == 13  # every ok run with J/token


# -- dense vs sparse at equal quality (pages/quality.py) ---------------------------------------

QUALITY_RUNS = ["&lt;img src=x onerror=alert(1)&gt;", "dense · w1", "dense · w2", "dense · w4", "dense-q",
                "gshard-q", "switch · w1", "switch · w2", "switch · w4", "switch-q"]  # as Plotly text: escaped


def _quality(records):
    from benchsuite.dashboard.pages import quality

    return quality.render(load(records))


def test_quality_curves_one_trace_per_run_and_panel():
    figs = {f.id: f for f in _quality(FIXTURES).figures}
    curves = figs["fig-quality-curves"].data
    by_panel = {ax: [t for t in curves if t["xaxis"] == ax] for ax in ("x", "x2", "x3")}
    tokens, energy, flops = by_panel["x"], by_panel["x2"], by_panel["x3"]
    assert len(curves) == 29 and len(tokens) == len(flops) == 10 and len(energy) == 9
    assert [t["name"].rsplit(" (", 1)[0] for t in tokens] == QUALITY_RUNS
    # one legend entry per run; its three traces toggle together
    assert sum(t["showlegend"] for t in curves) == 10
    assert len({t["legendgroup"] for t in curves}) == 10
    # every evaluation on the tokens and FLOPs panels (5 with eval_every 5 over 20 steps, 6 with 4) ...
    assert [len(t["x"]) for t in tokens] == [5, 5, 5, 5, 6, 6, 5, 5, 5, 6]
    # ... but the run without an energy meter has no energy trace (not a line at 0 J)
    assert not any(t["name"].startswith("switch-q") for t in energy)
    assert all(v is not None for t in energy for v in t["x"])
    # losses fall along the curve; the dashed line is the target
    dense_q = next(t for t in tokens if t["name"].startswith("dense-q"))
    assert dense_q["y"] == sorted(dense_q["y"], reverse=True) and dense_q["x"][0] == 0
    assert {sh["y0"] for sh in figs["fig-quality-curves"].layout["shapes"]} == {4.5, 5.0}
    assert "estimated" in figs["fig-quality-curves"].layout["annotations"][1]["text"]


def test_quality_to_target_never_draws_a_zero_bar():
    fig = next(f for f in _quality(FIXTURES).figures if f.id == "fig-quality-target")
    assert [t["name"] for t in fig.data] == ["Tokens", "Time (s)", "Energy (kWh)", "CO2e (g)"]
    for t in fig.data:
        assert t["y"] == QUALITY_RUNS and t["orientation"] == "h"
        assert all(v is None or v > 0 for v in t["x"]), t["name"]
        values = dict(zip(t["y"], t["x"]))
        assert values["gshard-q"] is None and values[QUALITY_RUNS[0]] is None  # not reached: no bar at all
        assert values["dense-q"] > 0
    tokens, _, kwh, co2e = ({y: x for y, x in zip(t["y"], t["x"])} for t in fig.data)
    assert tokens["switch-q"] > 0 and kwh["switch-q"] is None and co2e["switch-q"] is None  # no energy meter
    assert kwh["dense-q"] == pytest.approx(_record("make_dense-q.json")["metrics"]["quality"]["energy_j"] / 3.6e6,
                                           rel=1e-4)
    labels = {(a["text"], a["y"], a["xref"]) for a in fig.layout["annotations"] if a["yref"] == "y"}
    for x in ("x", "x2", "x3", "x4"):
        assert ("not reached", "gshard-q", f"{x} domain") in labels
        assert ("not reached", QUALITY_RUNS[0], f"{x} domain") in labels
    assert ("not measured", "switch-q", "x3 domain") in labels and ("not measured", "switch-q", "x4 domain") in labels
    assert ("not measured", "switch-q", "x domain") not in labels
    reasons = {a["y"]: a["hovertext"] for a in fig.layout["annotations"] if a["text"] == "not reached"}
    assert reasons["gshard-q"].startswith("target 5 not reached; best 5.197")


def test_quality_section_names_reasons_and_escapes_hostile_names(tmp_path):
    section = _quality(FIXTURES)
    text = section.html
    assert "not reached: target 5 not reached; best 5.197 at step 20" in text
    assert "energy unavailable" in text and "Energy not measured for: switch-q (unavailable)" in text
    assert "No evaluation in 5 other run(s)" in text
    assert "<svg" not in text and html.escape("<svg onload=alert('quality')>") in text
    assert html.escape("<img src=x onerror=alert(1)>") in text and "<img" not in text
    spec = script_json({f.id: f.spec() for f in section.figures})
    assert "<" not in spec and ">" not in spec
    names = [t["name"] for f in section.figures for t in f.data]
    assert any(n.startswith("&lt;img src=x onerror=alert(1)&gt;") for n in names)  # Plotly draws it as text
    # a hostile workload alone: the page still builds, and shows it escaped
    res = build_site([_record("make_hostile.json")], tmp_path, validate=True)
    index = (tmp_path / res.pages[0]).read_text()
    assert '<section id="quality">' in index and "<svg onload" not in index


def test_quality_page_copes_without_evaluation_and_with_older_records(tmp_path):
    recs = [_strip(r, "val_loss") if r["metrics"] else r for r in _records()]
    section = _quality(recs)
    assert not section.figures
    assert "no evaluation in these records: set train.eval_every and train.target_loss" in section.html
    # a record of an older harness: to-target figures, but no curve and no `reached`
    old = copy.deepcopy(_record("make_dvs-dense-w1.json"))
    for k in ("curve", "reached", "step", "energy_source"):
        old["metrics"]["quality"].pop(k)
    section = _quality([old])
    assert [f.id for f in section.figures] == ["fig-quality-target"]
    assert "no evaluation points in these records" in section.html
    assert section.figures[0].data[0]["x"][0] > 0
    build_site([old], tmp_path, validate=True)
    assert "Dense vs sparse at equal quality" in (tmp_path / "index.html").read_text()


def test_quality_estimated_energy_says_so():
    fig = next(f for f in _quality([_record("make_gshard-q.json")]).figures if f.id == "fig-quality-curves")
    assert fig.layout["annotations"][1]["text"] == "Loss vs training energy (energy estimated, not measured)"
    fig = next(f for f in _quality([_record("make_dense-q.json")]).figures if f.id == "fig-quality-curves")
    assert fig.layout["annotations"][1]["text"] == "Loss vs training energy"


def test_quality_page_warns_of_expert_choices_leak_wherever_experts_choose_their_tokens():
    """The note asks the run's router (record/kinds.ROUTERS), not its display name, which never held the
    router's config spelling."""
    leak = "Expert choice routes over the whole batch"
    ec = copy.deepcopy(_record("make_gshard-q.json"))
    ec["config"]["moe"]["router"] = "expert_choice"
    assert leak in _quality([ec]).html
    assert leak not in _quality([_record("make_gshard-q.json")]).html


# -- run pages: sanity flags and validation loss -------------------------------------------------

def test_run_page_shows_flags_in_a_warning_box(tmp_path):
    flagged = _record("make_switch-q.json")
    assert flagged["flags"] and flagged["flags"][0]["field"] == "metrics.mfu_vs_ceiling"
    hostile = copy.deepcopy(_record("make_dense-q.json"))
    hostile["run_key"] = "hostile-flags"
    hostile["flags"] = [{"field": "<b onmouseover=alert(7)>f</b>", "value": "nan",
                         "reason": "<script>alert('flag')</script>"}]
    unflagged = _record("make_dvs-dense-w1.json")
    impossible = copy.deepcopy(unflagged)  # no stored flags: the loader's guard finds them
    impossible.pop("flags", None)
    impossible["run_key"] = "impossible"
    impossible["metrics"]["mfu"] = 1.7
    res = build_site([flagged, hostile, unflagged, impossible], tmp_path, validate=True)
    pages = {Path(p).stem: (tmp_path / p).read_text() for p in res.pages[1:]}
    box = pages["q000000000000001"]
    assert '<div class="flags flags-impossible" role="alert">' in box and "metrics.mfu_vs_ceiling" in box and "1.34" in box
    assert "the ceiling measurement is unreliable" in box
    assert '<div class="flags"' not in pages["d000000000000001"]
    assert '<div class="flags flags-impossible"' in pages["impossible"] and "metrics.mfu" in pages["impossible"]
    page = pages["hostile-flags"]
    assert "<script>alert('flag')</script>" not in page and "<b onmouseover" not in page
    assert html.escape("<script>alert('flag')</script>") in page


def test_run_page_loss_figure_has_validation_loss_and_target():
    from benchsuite.dashboard.pages import run as run_page

    rec = next(one.record for one in load_records(FIXTURES) if one.path.name == "make_dense-q.json")
    fig = run_page.loss_figure(rec)
    names = [t["name"] for t in fig.data]
    assert names == ["training loss", "validation loss"]
    val = fig.data[1]
    assert val["x"] == [3, 7, 11, 15, 19]  # steps[k - 1].val_loss: the loss after k measured steps
    assert val["y"] == pytest.approx([s.val_loss for s in rec.steps if s.val_loss is not None], rel=1e-4)
    assert fig.layout["shapes"][0]["y0"] == 5.0 and "target" in fig.layout["title"]["text"]


def test_rebuild_removes_pages_of_records_no_longer_there(tmp_path):
    recs = _records()
    build_site(recs, tmp_path)
    res = build_site(recs[:2], tmp_path)
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == sorted(Path(p).name for p in res.pages[1:])


def test_a_build_stopped_part_way_keeps_the_previous_index_and_no_partial_page(tmp_path, monkeypatch):
    from benchsuite.dashboard.pages import run as run_page

    recs = _records()
    build_site(recs[:3], tmp_path)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    real, calls = run_page.render, []

    def render_then_fail(row, rec, predicted=None):  # the build dies while writing the run pages of a larger folder
        calls.append(1)
        if len(calls) == 5:
            raise MemoryError("stopped part-way")
        return real(row, rec, predicted)

    monkeypatch.setattr(run_page, "render", render_then_fail)
    with pytest.raises(MemoryError):
        build_site(recs, tmp_path)
    assert (tmp_path / "index.html").read_bytes() == before[tmp_path / "index.html"]
    index_links = {r[0] for r in _runs_rows(tmp_path)}  # the runs table's links, from assets/runs.js
    assert index_links and all((tmp_path / link).is_file() for link in index_links)
    assert not [p for p in tmp_path.rglob("*.tmp")], "a temp file left behind"
    for page in (tmp_path / "runs").glob("*.html"):
        assert page.read_text().rstrip().endswith("</html>"), f"{page.name} is partial"


@pytest.mark.procs
def test_cli_dashboard_verb(tmp_path):
    r = run_cli("dashboard", str(FIXTURES), "-o", str(tmp_path / "s"), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["records"] == 16 and len(doc["pages"]) == 17
    assert Path(doc["index"]) == (tmp_path / "s" / "index.html").resolve()
    r = run_cli("dashboard", str(FIXTURES), "-o", str(tmp_path / "t"))
    assert r.returncode == 0 and r.stdout.strip() == str((tmp_path / "t" / "index.html").resolve())
    r = run_cli("dashboard", str(tmp_path / "nope"), "-o", str(tmp_path / "u"))
    assert r.returncode == 2 and "no such results folder" in " ".join(r.stderr.split())


# ----------------------------------------------------------------------------- run page: MoE and ranks


def _run_page(tmp_path, rec) -> tuple[str, dict]:
    """The built page's text and its figures' specs, by element id."""
    from benchsuite.dashboard.pages import run as run_page

    res = build_site([rec], tmp_path, validate=True)
    data = load([rec])
    row = data.df.to_dict("records")[0]
    section = run_page.render(row, data.record(row))
    return (tmp_path / res.pages[1]).read_text(encoding="utf-8"), {f.id: f.spec() for f in section.figures}


@pytest.mark.parametrize("name", ["make_dvs-switch-w1.json", "make_dvs-switch-w2.json", "make_dvs-switch-w4.json"])
def test_moe_run_page_draws_the_load_of_every_layer_and_expert(tmp_path, name):
    rec = _record(name)
    load = rec["metrics"]["moe"]["expert_load"]  # [MoE layer][expert], as the worker writes it
    page, figs = _run_page(tmp_path, rec)
    assert "MoE expert load</strong>: not measured" not in page
    (trace,) = figs["fig-run-experts"]["data"]
    assert trace["type"] == "heatmap" and len(trace["z"]) == len(load) == 6
    for row, z, counts in zip(load, trace["z"], trace["customdata"]):
        mean = sum(row) / len(row)
        assert z == pytest.approx([v / mean for v in row], rel=1e-3)
        assert counts == row
    assert trace["x"] == list(range(8)) and trace["zmin"] == 0 and trace["zmax"] >= 2
    (_, blue), (white_at, white), (_, red) = trace["colorscale"]
    assert white == "#f8f9fa" and white_at == pytest.approx(1 / trace["zmax"])  # white at exactly 1 × the mean
    text = " ".join(_parse(next(tmp_path.glob("runs/*.html"))).text)
    assert "expert implementation" in text and "grouped_mm" in text  # metrics.moe.expert_impl
    assert "switch, top-1" in text and "8 (0 shared), every 2 block(s)" in text  # the run's MoE settings
    assert "learned, balanced by aux_loss" in text
    assert "parameters (total / active per token)" in text
    assert "custom: 12 layers, hidden 1024, 16 heads (16 K/V) of 64, gelu, layernorm" in text  # the block that ran


def test_an_idle_expert_is_an_empty_cell_not_a_nearly_balanced_one(tmp_path):
    rec = copy.deepcopy(_record("make_dvs-switch-w2.json"))
    moe = rec["metrics"]["moe"]
    moe["tokens_per_expert"] = [[0.0, 600.0, 200.0, 200.0], [400.0, 400.0, 0.0, 800.0]]
    page, figs = _run_page(tmp_path, rec)
    (trace,) = figs["fig-run-experts"]["data"]
    assert trace["z"][0] == [None, 2.4, 0.8, 0.8] and trace["z"][1] == [1.0, 1.0, None, 2.0]
    assert trace["zmax"] == 2.4 and "empty = idle" in figs["fig-run-experts"]["layout"]["title"]["text"]


def test_moe_run_page_without_per_layer_load_says_not_measured(tmp_path):
    rec = copy.deepcopy(_record("make_dvs-switch-w2.json"))
    rec["metrics"]["moe"]["expert_load"] = [[1.0, 2.0], []]  # a layer without experts: not a [layer][expert] table
    page, figs = _run_page(tmp_path, rec)
    assert "fig-run-experts" not in figs and "MoE expert load</strong>: not measured" in page


def test_moe_run_page_draws_the_tokens_the_experts_computed_and_the_imbalance_per_step(tmp_path):
    rec = copy.deepcopy(_record("make_dvs-switch-w2.json"))
    moe = rec["metrics"]["moe"]
    computed = [[min(v, 2000.0) for v in layer] for layer in moe["expert_load"]]  # capacity 2000: the rest dropped
    moe["tokens_per_expert"], moe["imbalance_by_step"] = computed, [1.75, 1.5, 1.25]
    page, figs = _run_page(tmp_path, rec)
    (trace,) = figs["fig-run-experts"]["data"]
    assert trace["customdata"] == computed and trace["customdata"] != moe["expert_load"]
    assert trace["z"][0] == pytest.approx([v / (sum(computed[0]) / 8) for v in computed[0]], rel=1e-3)
    assert trace["name"] == "tokens computed"
    assert "tokens computed" in figs["fig-run-experts"]["layout"]["title"]["text"]
    (line,) = figs["fig-run-imbalance"]["data"]
    assert (line["x0"], line["dx"], line["y"]) == (0, 1, [1.75, 1.5, 1.25])  # measured steps 0, 1, 2
    assert "MoE load imbalance per step</strong>: not measured" not in page


@pytest.mark.heavy  # in this process, a second or more: the full pass runs it, the fast tier does not
def test_moe_run_page_of_an_older_record_says_its_load_is_routed_and_its_imbalance_not_measured(tmp_path):
    rec = _record("make_dvs-switch-w2.json")
    assert rec["metrics"]["moe"]["tokens_per_expert"] is None and rec["metrics"]["moe"]["imbalance_by_step"] is None
    page, figs = _run_page(tmp_path, rec)
    (trace,) = figs["fig-run-experts"]["data"]
    assert trace["customdata"] == rec["metrics"]["moe"]["expert_load"]
    assert trace["name"] == "tokens routed, before capacity"
    assert "tokens routed, before capacity" in figs["fig-run-experts"]["layout"]["title"]["text"]
    assert "fig-run-imbalance" not in figs and "MoE load imbalance per step</strong>: not measured" in page
    dense_page, dense_figs = _run_page(tmp_path / "dense", _record("make_dvs-dense-w1.json"))
    assert "MoE load imbalance per step</strong>: not applicable: dense model" in dense_page


def test_per_rank_figure_names_the_straggler_ratio_the_worker_computes(tmp_path):
    rec = _record("make_dvs-switch-w2.json")
    ratio = rec["metrics"]["per_rank"]["straggler_ratio"]
    _, figs = _run_page(tmp_path, rec)
    title = figs["fig-run-ranks"]["layout"]["title"]["text"]
    assert f"slowest / median = {ratio:.2f}" in title and "fastest" not in title


# ----------------------------------------------------------------------------- the site folder


def test_rebuild_keeps_a_users_files_and_removes_only_stale_pages_it_wrote(tmp_path):
    recs = _records()
    first = build_site(recs, tmp_path)
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "runs" / "my-page.html").write_text("mine too")
    (tmp_path / "assets" / "logo.svg").write_text("<svg/>")
    second = build_site(recs[:2], tmp_path)
    assert (tmp_path / "notes.txt").read_text() == "mine"
    assert (tmp_path / "runs" / "my-page.html").read_text() == "mine too"
    assert (tmp_path / "assets" / "logo.svg").exists()
    stale = set(first.pages) - set(second.pages)
    assert len(stale) == len(recs) - 2 and not any((tmp_path / p).exists() for p in stale)
    manifest = json.loads((tmp_path / ".benchsuite-manifest.json").read_text())
    assert "index.html" in manifest["files"] and set(second.pages) <= set(manifest["files"])
    assert not set(manifest["files"]) & {"notes.txt", "runs/my-page.html", "assets/logo.svg"}


def test_build_never_overwrites_a_file_it_did_not_write(tmp_path):
    from benchsuite.dashboard.build import SiteError

    (tmp_path / "index.html").write_text("my own index")
    with pytest.raises(SiteError, match="index.html"):
        build_site(_records()[:1], tmp_path)
    assert (tmp_path / "index.html").read_text() == "my own index"


def test_a_crafted_manifest_cannot_remove_files_outside_the_sites_pages(tmp_path):
    site, victim = tmp_path / "site", tmp_path / "victim.txt"
    victim.write_text("keep")
    site.mkdir()
    (site / "notes.txt").write_text("keep")
    (site / ".benchsuite-manifest.json").write_text(json.dumps(
        {"files": ["../victim.txt", str(victim), "notes.txt", "runs/../../victim.txt", "assets/.."]}))
    build_site(_records()[:1], site)
    assert victim.read_text() == "keep" and (site / "notes.txt").read_text() == "keep"


@pytest.mark.procs
@pytest.mark.parametrize("where", ["file", "under-file"])
def test_cli_dashboard_out_at_or_under_a_file_exits_2(tmp_path, where):
    existing = tmp_path / "site.txt"
    existing.write_text("x")
    target = existing if where == "file" else existing / "site"
    r = run_cli("dashboard", str(FIXTURES), "-o", str(target))
    assert r.returncode == 2 and "Traceback" not in r.stderr and str(existing) in r.stderr
    assert "not a folder" in r.stderr and existing.read_text() == "x"


@pytest.mark.procs
def test_cli_dashboard_refuses_to_overwrite_a_users_index(tmp_path):
    (tmp_path / "index.html").write_text("mine")
    r = run_cli("dashboard", str(FIXTURES), "-o", str(tmp_path))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "was not written by an earlier build" in r.stderr and (tmp_path / "index.html").read_text() == "mine"


def test_a_site_built_before_the_manifest_is_rebuilt_without_removing_what_it_cannot_know(tmp_path):
    recs = _records()
    build_site(recs[:3], tmp_path)
    (tmp_path / ".benchsuite-manifest.json").unlink()  # as an older benchsuite left it
    (tmp_path / "runs" / "mine.html").write_text("mine")
    old_pages = {p.name for p in (tmp_path / "runs").iterdir()}
    res = build_site(recs[:1], tmp_path)
    assert (tmp_path / "runs" / "mine.html").read_text() == "mine"
    assert {p.name for p in (tmp_path / "runs").iterdir()} == old_pages  # rewritten, none removed
    assert json.loads((tmp_path / ".benchsuite-manifest.json").read_text())["files"] == sorted(
        {"index.html", *res.pages, *(f"assets/{a}" for a in ("plotly.min.js", "plotly.version", "theme.js",
                                                              "dashboard.css", "dashboard.js", "runs.js"))})


@pytest.mark.parametrize("manifest", ["{not json", "[" * 100_000, '{"files": "index.html"}', "[]", "fifo"])
def test_an_odd_manifest_owns_nothing(tmp_path, manifest):
    import os

    from benchsuite.dashboard.build import MANIFEST, read_manifest

    if manifest == "fifo":
        os.mkfifo(tmp_path / MANIFEST)  # reading it would block the build
    else:
        (tmp_path / MANIFEST).write_text(manifest)
    assert read_manifest(tmp_path) == set()


# ----------------------------------------------------------------------------- MoE families and per-expert load

def _moe_variant(name: str, run_key: str, **moe) -> dict:
    """The switch fixture run as another MoE workload: its config.moe updated, its own key and sweep."""
    rec = copy.deepcopy(_record("make_dvs-switch-w1.json"))
    rec.update(run_key=run_key, workload=name)
    rec["config"].update(workload=name, sweep_id=f"dense-vs-sparse/{name}/weak")
    rec["config"]["moe"].update(moe)
    return rec


def _new_router_records() -> list[dict]:
    """dense, switch (capacity), gshard (capacity), dropless top-2, capacity top-k, fine-grained with
    shared experts: one run each."""
    return [_record("make_dvs-dense-w1.json"), _record("make_dvs-switch-w1.json"),
            _moe_variant("gshard", "n1", router="gshard"),
            _moe_variant("dropless-top2", "n2", router="token_choice", top_k=2, capacity_factor=0),
            _moe_variant("top3-capacity", "n3", router="token_choice", top_k=3, capacity_factor=1.25),
            _moe_variant("fine-grained-shared", "n4", router="token_choice", top_k=3, capacity_factor=0,
                         experts=32, expert_hidden=64, shared_experts=1)]


def test_every_router_the_config_accepts_and_each_new_family_has_its_own_colour_marker_and_name():
    from benchsuite.config import MoEConfig
    from benchsuite.config.specs import value_problem
    from benchsuite.dashboard.style import KNOWN, SPARE

    router = next(f for f in msgspec.structs.fields(MoEConfig) if f.name == "router")
    routers = re.findall(r"'(\w+)'", value_problem(router, "no such router"))  # "must be one of 'switch', ..."
    assert {"switch", "gshard", "expert_choice"} <= set(routers)
    assert set(routers) | {"dense", "dropless", "shared_experts"} <= set(KNOWN)
    styles = list(KNOWN.values())
    for attr in ("color", "symbol", "name"):
        values = [getattr(s, attr) for s in styles]
        assert len(set(values)) == len(values), attr
    # a router no config knows takes a spare style, never one a known family already shows
    assert not {c for c, _ in SPARE} & {s.color for s in styles}
    assert not {m for _, m in SPARE} & {s.symbol for s in styles}


@pytest.mark.parametrize("kind, router, cf, shared, expected", [
    ("moe", "token_choice", 0, None, "dropless"),
    ("moe", "gshard", 0.0, 0, "dropless"),
    ("moe", "Switch", 0, None, "dropless"),
    ("moe", "token_choice", 1.25, None, "token_choice"),
    ("moe", "token_choice", 0, 2, "shared_experts"),
    ("moe", "switch", 1.25, 1, "shared_experts"),
    ("moe", "expert_choice", 1.0, None, "expert_choice"),
    ("moe", "switch", 1.25, None, "switch"),  # a record older than shared experts
    ("moe", "gshard", "0", None, "dropless"),
    ("moe", "gshard", "bad", "bad", "gshard"),
    ("dense", "token_choice", 0, 1, "dense"),
])
def test_family_tells_dropless_and_shared_expert_models_from_the_capacity_routers(kind, router, cf, shared, expected):
    from benchsuite.dashboard.style import family

    assert family(kind, router, cf, shared) == expected


def test_new_routers_get_their_family_style_in_the_dataframe_and_on_the_pareto_view():
    from benchsuite.dashboard.style import KNOWN

    data = load(_new_router_records())
    fam = dict(zip(data.df["workload"], data.df["family"]))
    assert fam == {"dense": "dense", "switch": "switch", "gshard": "gshard", "dropless-top2": "dropless",
                   "top3-capacity": "token_choice", "fine-grained-shared": "shared_experts"}
    labels = dict(zip(data.df["workload"], data.df["kind_label"]))
    assert labels["dropless-top2"] == "MoE · Dropless top-k" and labels["fine-grained-shared"] == "MoE · Shared experts"
    pareto = _figures(_new_router_records())["fig-compare-pareto"].data[:-1]
    by_name = {t["name"]: (t["marker"]["color"], t["marker"]["symbol"]) for t in pareto}
    assert by_name == {ptext(KNOWN[k].name): (KNOWN[k].color, KNOWN[k].symbol) for k in fam.values()}
    assert len({c for c, _ in by_name.values()}) == len({s for _, s in by_name.values()}) == 6


def _index_tables(out: Path) -> list[list[list[str]]]:
    """Every table of index.html, as rows of cell texts (header row first)."""
    text = (out / "index.html").read_text(encoding="utf-8")
    tables = []
    for body in re.findall(r"<table[^>]*>(.*?)</table>", text, flags=re.S):
        rows = re.findall(r"<tr>(.*?)</tr>", body, flags=re.S)
        tables.append([[html.unescape(re.sub(r"<[^>]+>", "", c)) for c in re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", r)]
                       for r in rows])
    return tables


def test_compare_page_lists_the_tokens_of_every_expert_of_every_moe_series(tmp_path):
    recs = _new_router_records()
    shared = recs[-1]
    per_layer = [[0 if i == 5 else 10 * i + layer for i in range(32)] for layer in range(6)]  # expert 5 idle
    shared["metrics"]["moe"]["tokens_per_expert"] = per_layer  # what the experts computed: shown
    shared["metrics"]["moe"]["expert_load"] = [[7] * 32] * 6  # what the router sent them: not shown
    shared["metrics"]["moe"]["dropped_frac"] = 0.0
    build_site(recs, tmp_path, validate=True)
    (load_table,) = [t for t in _index_tables(tmp_path) if t[0][0] == "Series" and "Busiest ÷ mean" in t[0]]
    rows = {r[0]: dict(zip(load_table[0], r)) for r in load_table[1:]}
    assert set(rows) == {"switch", "gshard", "dropless-top2", "top3-capacity", "fine-grained-shared"}  # no dense
    switch = [sum(col) for col in zip(*_record("make_dvs-switch-w1.json")["metrics"]["moe"]["expert_load"])]
    row = rows["switch"]
    assert row["Experts"] == "8" and row["Family"] == "MoE · Switch"
    assert row["Tokens per expert (expert 0, 1, …)"] == ", ".join(f"{t:,.0f}" for t in switch)
    # the imbalance the record states (the report's column), not one the page works out from the tokens
    assert row["Busiest ÷ mean"] == f"{_record('make_dvs-switch-w1.json')['metrics']['moe']['load_max_over_mean']:.3g}"
    assert row["Dropped"] == "2.2%" and row["Tokens counted"] == "routed, before capacity"  # an older record
    fine = rows["fine-grained-shared"]  # 32 experts: the first 16 shown, the rest on the run page
    tokens = [sum(col) for col in zip(*per_layer)]
    assert fine["Experts"] == "32" and fine["Family"] == "MoE · Shared experts" and fine["Dropped"] == "0.0%"
    assert fine["Tokens per expert (expert 0, 1, …)"] == ", ".join(f"{t:,}" for t in tokens[:16]) + ", … (16 more)"
    assert fine["Idle experts"] == "1"  # expert 0 of layer 0 alone is not idle
    assert fine["Tokens counted"] == "computed"


def test_compare_page_says_per_expert_load_is_not_measured_where_no_record_has_it(tmp_path):
    recs = _new_router_records()
    for rec in recs[1:]:
        del rec["metrics"]["moe"]["expert_load"]
        rec["metrics"]["moe"]["tokens_per_expert"] = [[1, 2], [3]]  # layers of different expert counts: no table
    build_site(recs, tmp_path, validate=True)
    index = (tmp_path / "index.html").read_text(encoding="utf-8")
    assert "MoE per-expert load</strong>: not measured" in index
    assert not [t for t in _index_tables(tmp_path) if t[0] and t[0][0] == "Series"]


def test_summary_pages_turn_only_the_columns_they_read_into_rows(tmp_path, monkeypatch):
    """Rows of a frame cost a pass per column (~400): every page makes rows of only the columns it reads (the run
    pages and the runs table the most), a column at a time (frames.column_values), never by pandas' to_dict."""
    import pandas as pd

    from benchsuite.dashboard.pages import overview, quality, run
    from benchsuite.results import frames

    widths, made = [], []  # the columns of each set of rows made: by pandas, by column_values
    to_dict, column_values = pd.DataFrame.to_dict, frames.column_values
    monkeypatch.setattr(pd.DataFrame, "to_dict",
                        lambda self, *a, **k: widths.append(self.shape[1]) or to_dict(self, *a, **k))
    for module in (frames, overview, quality):  # (where it is called)
        monkeypatch.setattr(module, "column_values", lambda frame, columns: made.append(len(columns))
                            or column_values(frame, columns))
    build_site(FIXTURES, tmp_path / "site")

    assert widths == [], widths  # (pandas' to_dict: never)
    assert sorted(made)[-2:] == sorted([len(run.ROW_COLUMNS), len(overview.ROW_COLUMNS)])
    assert max(sorted(made)[:-2]) <= 13


def test_rows_of_are_the_rows_pandas_makes_value_for_value_and_type_for_type():
    """Every kind of column the results model has: text with nulls, floats with NaN, ints, bools, nullable ints and
    bools with NA, objects holding numpy scalars and lists; and a column not there."""
    import numpy as np
    import pandas as pd

    frame = pd.DataFrame({"text": ["a", None, "c"], "float": [1.5, np.nan, 3.0], "int": [1, 2, 3],
                          "bool": [True, False, True], "Int64": pd.array([1, None, 3], "Int64"),
                          "boolean": pd.array([True, None, False], "boolean"),
                          "object": [[{"field": "mfu"}], None, np.int64(7)]})
    columns = [*frame.columns, "not a column"]
    mine, theirs = rows_of(frame, columns), frame.reindex(columns=columns).to_dict("records")
    assert [[(type(v), repr(v)) for v in r.values()] for r in mine] == \
        [[(type(v), repr(v)) for v in r.values()] for r in theirs]
    assert [list(r) for r in mine] == [list(r) for r in theirs]
    assert rows_of(frame.iloc[0:0], columns) == []


def test_the_environment_block_says_its_figures_in_words_and_units_and_collapses_what_was_not_recorded(tmp_path):
    rec = copy.deepcopy(_record("make_dvs-switch-w2.json"))
    rec["env"].update(ram_total_gb=23.585494995117188, cuda=None, nccl=None, driver=None)
    page, _ = _run_page(tmp_path, rec)
    text = " ".join(_parse(next(tmp_path.glob("runs/*.html"))).text)
    assert "RAM (GB)" in text and "23.6" in text and "23.585494995117188" not in text
    assert "not recorded" in text and "CUDA, NCCL, driver" in text


# ----------------------------------------------------------------------------- run page: rows in words and units


def _kv_rows(page: str) -> list[list[tuple[str, str]]]:
    """Every label/value table of a run page, as (label, value) text pairs."""
    return [[(html.unescape(k), html.unescape(v)) for k, v in re.findall(r"<tr><th>(.*?)</th><td>(.*?)</td></tr>", t)]
            for t in re.findall(r'<table class="kv">(.*?)</table>', page, flags=re.S)]


def test_run_page_rows_that_have_nothing_to_say_are_one_line_per_block(tmp_path):
    rec = copy.deepcopy(_record("make_dvs-switch-w2.json"))
    rec["metrics"].update(hfu=None, hardware_tflops_per_device=None)
    rec["metrics"]["moe"].update(padding_frac=None, z_loss=None, all_to_all_share=None)
    page, _ = _run_page(tmp_path, rec)
    blocks = _kv_rows(page)
    assert len(blocks) >= 6
    for rows in blocks:
        assert not [v for _, v in rows if not v.strip(" —/·,()")], rows  # no row of "—" (or "— / —")
        silent = [v for k, v in rows if k in ("not recorded", "not measured")]
        assert len(silent) <= 1 and rows[-1][0] in ("not recorded", "not measured") if silent else True
    flat = dict(kv for rows in blocks for kv in rows if kv[0] not in ("not recorded", "not measured"))
    said = [v for rows in blocks for k, v in rows if k == "not recorded"]
    assert "HFU (hardware FLOPs, recompute included)" in said[0] and "hardware FLOP/s per device" in said[0]
    moe = next(v for rows in blocks for k, v in rows if k == "not recorded" and "router z-loss" in v)
    assert moe == ", ".join(["padding (empty capacity slots)", *(described(f"metrics.moe.{f}") for f in (
        "imbalance_mean", "imbalance_max", "tokens_per_expert_max", "tokens_per_expert_mean")),
        "router z-loss", "all-to-all share of step time"])
    assert flat["tokens dropped (over capacity)"] == "2.7%"


def test_run_page_numbers_are_in_their_units_and_labels_in_words(tmp_path):
    rec = _record("make_dvs-switch-w2.json")
    page, _ = _run_page(tmp_path, rec)
    rows = dict(kv for rows in _kv_rows(page) for kv in rows)
    m, e = rec["metrics"], rec["energy"]
    assert rows["model FLOPs / token"] == f"{m['flops']['model_per_token'] / 1e9:.3g} GFLOP"
    assert rows["model FLOP/s per device"] == f"{m['tflops_per_device']:.3g} TFLOP/s"
    assert rows["parameters (total / active per token)"] == (f"{m['params']['total'] / 1e6:.3g} M / "
                                                            f"{m['params']['active'] / 1e6:.3g} M")
    assert rows["energy / token"] == f"{m['energy']['j_per_token'] * 1e3:.3g} mJ"
    assert rows["GPU energy"] == f"{e['gpu_j'] / 1e3:.3g} kJ · measured"
    assert rows["measured window"] == f"{e['window_s']:.3g} s"
    assert rows["CO2e (the run's, location-based)"] == f"{rec['carbon']['co2e_g'] * 1e3:.3g} mg"
    assert rows["CO2e to target"] == f"{m['quality']['co2e_g'] * 1e3:.3g} mg"
    assert rows["duration"] == f"{rec['duration_s']:.3g} s"
    assert rows["parallelism"] == "none (data parallel only)"
    assert rows["router z-loss"] == "0.0007"
    visible = re.sub(r"<script.*?</script>|<details>.*?</details>", "", page, flags=re.S)
    assert not re.findall(r"\d\.\d{5,}", visible)  # no raw float (23.54010009765625) anywhere a reader looks
    for label, _ in (kv for rows in _kv_rows(page) for kv in rows):
        assert "_" not in label, label  # words, not record field names


def test_an_moe_run_dropping_more_than_the_threshold_is_flagged_on_its_page_and_in_the_runs_table(tmp_path):
    from benchsuite.record.sanity import MAX_DROPPED_FRAC

    rec = copy.deepcopy(_record("make_dvs-switch-w2.json"))
    rec["metrics"]["moe"]["dropped_frac"] = 0.64
    assert 0.64 > MAX_DROPPED_FRAC
    page, _ = _run_page(tmp_path, rec)
    box = re.search(r'<div class="flags flags-impossible" role="alert">(.*?)</div>', page, flags=re.S).group(1)
    assert "metrics.moe.dropped_frac" in box and "64% of the token assignments were dropped" in html.unescape(box)
    rows = dict(kv for rows in _kv_rows(page) for kv in rows)
    assert rows["tokens dropped (over capacity)"] == "64.0% ⚠ above 10%: the run's speed is not the model's"
    (row,) = _runs_rows(tmp_path)
    assert row[1] == "ok" and "64% of the token assignments were dropped" in row[3]  # the page script: ⚠ flagged


def test_the_runs_table_marks_the_columns_a_narrow_window_leaves_out(tmp_path):
    from benchsuite.dashboard.pages.overview import COLUMNS, WIDE

    build_site(FIXTURES, tmp_path)
    index = (tmp_path / "index.html").read_text(encoding="utf-8")
    heads = re.findall(r'<th data-type="\w+" data-render="\w*" class="(\w*)" tabindex="0">(.*?)</th>', index)
    assert [html.unescape(h) for _, h in heads] == [c[0] for c in COLUMNS]
    assert [h for w, h in heads if w == WIDE] == ["Suite", "Repeat", "Nodes", "Scaling", "Energy/token (J)",
                                                   "CO2e/Mtok (g)"]
    css = (tmp_path / "assets" / "dashboard.css").read_text(encoding="utf-8")
    assert re.search(r"@media \(max-width: 1199px\) \{\s*table\.runs \.wide \{ display: none; \}", css)


def test_run_page_states_the_energy_bound_its_parts_and_the_carbon_beside_the_co2e(tmp_path):
    """The bound the record holds (energy.bounds.total, carbon.co2e_g_bound), each part of it, the market-based
    and embodied CO2e beside the location-based figure with their sources, and why a part is absent."""
    import html
    import re

    from benchsuite.config import CarbonConfig
    from benchsuite.energy.bounds import add_bounds
    from benchsuite.energy.carbon import record_carbon

    rec = _record("make_dvs-dense-w1.json")
    per_device = rec["energy"]["per_device"][0]
    per_device["detail"] = {"counter_edge_s": 0.001}
    rec["energy"]["per_node"] = []
    rec["energy"]["total_includes"], rec["energy"]["total_j"] = ["gpu"], per_device["energy_j"]
    add_bounds(rec["energy"])
    rec["carbon"] = record_carbon(rec["energy"], CarbonConfig(intensity_g_per_kwh=400.0, market_intensity_g_per_kwh=50.0))
    page, _ = _run_page(tmp_path, rec)
    text = html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", page)))
    total = rec["energy"]["bounds"]["total"]
    assert f"total, as the meters bound it {total['low_j'] / 1e3:.3g} kJ – {total['high_j'] / 1e3:.3g} kJ " \
           f"(±{total['share']:.1%})" in text
    assert "parts of that bound sensor accuracy" in text and "counter edges" in text
    assert "market-based CO2e (Scope 2, not added)" in text and "at 50 g/kWh" in text
    assert "Luccioni" in text  # the embodied default says where it comes from
    assert "water: set carbon.wue_l_per_kwh and carbon.water_intensity_l_per_kwh" in text


def test_a_users_own_loop_is_named_beside_the_dense_vs_sparse_bars_never_among_them(tmp_path):
    from helpers.records import make_record

    loop = make_record("loop1", workload="my-loop", tokens_per_s=1e9)
    loop["config"]["kind"] = "user"
    recs = [_record(p.name) for p in sorted(FIXTURES.glob("make_dvs-*.json"))] + [loop]
    figs = _figures(recs)
    assert not [t for t in figs["fig-compare-tokens_per_s"].data if "my-loop" in t["name"]]
    assert max(y for t in figs["fig-compare-tokens_per_s"].data for y in t["y"]) < 1e9
    build_site(recs, tmp_path, validate=True)
    index = (tmp_path / "index.html").read_text(encoding="utf-8")
    assert "Your own training loops (benchsuite.measure), on the overview and their run pages, not among these " \
           "bars: my-loop · w1." in index


def test_a_bar_whose_interval_spans_decades_is_drawn_on_a_log_axis():
    """Two-seed intervals reaching 268k tok/s over 3k tok/s bars once drew those bars as flat lines."""
    from benchsuite.dashboard.pages.compare import bar_figure
    from benchsuite.dashboard.style import trace_styles

    data = load(FIXTURES)
    df = data.ok_runs.copy()
    df["tokens_per_s_lo"], df["tokens_per_s_hi"] = df["tokens_per_s"] / 2, df["tokens_per_s"] * 300
    df["seeds"] = [[0, 1]] * len(df)
    fig = bar_figure(df, "tokens_per_s", "Throughput", "tokens / s", str, None, trace_styles(data.df, False), False)
    assert fig.layout["yaxis"].get("type") == "log"
    df["tokens_per_s_hi"] = df["tokens_per_s"] * 1.1
    fig = bar_figure(df, "tokens_per_s", "Throughput", "tokens / s", str, None, trace_styles(data.df, False), False)
    assert fig.layout["yaxis"].get("type") != "log"


def test_the_dashboard_counts_published_claims_as_the_report_does(tmp_path, capsys):
    """The report once counted 4 claims where the dashboard listed more rows (one paper's claim per suite)."""
    import re

    from benchsuite import cli

    build_site(FIXTURES, tmp_path / "site")
    index = (tmp_path / "site" / "index.html").read_text(encoding="utf-8")
    assert cli.main(["report", str(FIXTURES)]) == 0
    reported = int(re.search(r"none of the (\d+) published claims", capsys.readouterr().out).group(1))
    assert re.search(r"(\d+) published claims, checked \d+ times", index).group(1) == str(reported)


def test_a_run_pages_layout_names_every_degree_above_one_context_and_expert_tensor_included():
    from benchsuite.dashboard.pages.run import _parallel
    from benchsuite.record.sections import ParallelConfig

    p = ParallelConfig(tensor=2, pipeline=2, context=2, expert=4, expert_tensor=2, zero=3)
    assert _parallel(p) == "tensor 2 · pipeline 2 · context 2 · expert 4 · expert-tensor 2 · ZeRO stage 3"
    assert _parallel(ParallelConfig()) == "none (data parallel only)"
