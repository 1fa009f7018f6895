"""The dashboard for people and at scale, without a browser: one name, colour and marker per model
family on every page, readable table headers with units, and an index page whose size does not
grow with the runs table (its rows live in assets/runs.js; summary figures aggregate per family)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import msgspec
import pytest

from benchmarks.bench_dashboard import synthetic_records
from benchsuite.results.store import load_records
from benchsuite.dashboard import build_site
from benchsuite.dashboard.build import MANIFEST
from benchsuite.dashboard.data import MAX_SERIES, load
from benchsuite.dashboard.pages import summary_pages
from helpers import runs_rows
from benchsuite.dashboard.render import ptext
from benchsuite.dashboard.style import KNOWN, Families, family

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "results"


def _figures(data) -> dict:
    return {f.id: f for p in summary_pages() for f in p.render(data).figures}


def test_every_family_has_its_own_colour_and_marker():
    fams = Families(list(KNOWN) + ["hash", "top_k", "base_layers"])
    styles = [fams[k] for k in fams.styles]
    n = len(KNOWN) + 3
    assert len(styles) == n
    assert len({s.color for s in styles}) == n and len({s.symbol for s in styles}) == n
    assert len({s.name for s in styles}) == n
    assert fams["dense"].name == "dense" and fams["expert_choice"].name == "MoE · Expert choice"


@pytest.mark.parametrize("router", ["expert_choice", "expert-choice", "Expert Choice", " EXPERT_choice "])
def test_a_router_spelt_any_way_is_one_family(router):
    assert family("moe", router) == "expert_choice"


def test_dense_records_are_one_family_whatever_their_router_field():
    assert family("dense", None) == family("dense", "switch") == family(None, None) == "dense"


def test_the_same_router_has_the_same_name_colour_and_marker_on_every_page():
    data = load(FIXTURES)
    figs = _figures(data)
    kind_of_series = dict(zip(data.df["series"], data.df["family"]))
    seen = []  # (family, colour, symbol or None) of every trace that names its series or family
    for column in ("tokens_per_s", "mfu", "j_per_token"):
        for t in figs[f"fig-compare-{column}"].data:
            series = next(s for s in kind_of_series if t["name"].startswith(ptext(s)))
            seen.append((kind_of_series[series], t["marker"]["color"], None))
    for t in figs["fig-scaling-throughput"].data:
        if "ideal" not in t["name"]:
            seen.append((kind_of_series[t["name"]], t["line"]["color"], t["marker"]["symbol"]))
    fams = Families(data.df["family"])
    names = {ptext(fams[k].name): k for k in fams.styles}
    for t in figs["fig-compare-pareto"].data[:-1]:  # the last trace is the front line
        seen.append((names[t["name"]], t["marker"]["color"], t["marker"]["symbol"]))
    for t in figs["fig-quality-curves"].data:
        kind = next(k for n, k in names.items() if t["name"].endswith(f"({n})"))
        seen.append((kind, t["line"]["color"], t["marker"]["symbol"]))
    assert {f for f, _, _ in seen} >= {"dense", "switch", "gshard"}
    for fam, color, symbol in seen:
        assert color == fams[fam].color, (fam, color)
        assert symbol in (None, fams[fam].symbol), (fam, symbol)
    # the runs table and the run pages name the family the same way
    assert set(data.df.loc[data.df["family"] == "switch", "kind_label"]) == {"MoE · Switch"}


def test_pareto_draws_each_family_with_its_own_marker():
    figs = _figures(load(FIXTURES))
    points = figs["fig-compare-pareto"].data[:-1]
    assert len(points) >= 3  # dense, switch, gshard (and the hostile router)
    assert len({t["marker"]["symbol"] for t in points}) == len(points)


def test_table_headers_are_readable_and_carry_units(tmp_path):
    build_site(FIXTURES, tmp_path)
    index = (tmp_path / "index.html").read_text(encoding="utf-8")
    heads = [re.sub(r"<[^>]+>", "", h) for h in re.findall(r"<th[^>]*>(.*?)</th>", index)]
    assert {"Energy/token (J)", "CO2e/Mtok (g)", "Step time (ms, 95% CI)", "Tokens/s", "Devices"} <= set(heads)
    assert {"Energy (kWh)", "CO2e (g)", "Time (s)", "Grid intensity (g CO2e/kWh)"} <= set(heads)
    for h in heads:  # a name a reader knows, capitalised; no record key (co2e_g, energy_j)
        assert h[0].isupper() and "_" not in h, h


def _with_gpu_energy(rec: dict, factor: float, key: str) -> dict:
    rec = json.loads(json.dumps(rec))
    rec["run_key"] = key
    rec["energy"]["gpu_j"] *= factor
    return rec


@pytest.mark.heavy  # in this process, a second or more: the full pass runs it, the fast tier does not
def test_energy_axis_is_logarithmic_where_runs_span_decades():
    recs = [msgspec.to_builtins(one.record) for one in load_records(FIXTURES) if one.record.run_key.startswith("d")][:1]
    assert recs and recs[0]["energy"]["gpu_j"] > 0
    near = recs + [_with_gpu_energy(recs[0], 3, "x1")]
    assert "type" not in _figures(load(near))["fig-energy-stacked"].layout["yaxis"]
    far = recs + [_with_gpu_energy(recs[0], 1e4, "x2")]
    assert _figures(load(far))["fig-energy-stacked"].layout["yaxis"]["type"] == "log"
    assert _figures(load(FIXTURES))["fig-energy-stacked"].layout["yaxis"]["type"] == "log"  # smoke vs GPU runs


def test_the_runs_table_rows_live_in_a_data_file_not_the_index(tmp_path):
    res = build_site(FIXTURES, tmp_path)
    index = (tmp_path / "index.html").read_text(encoding="utf-8")
    assert '<tbody></tbody>' in index and 'href="runs/' not in index
    assert '<script src="assets/runs.js"></script>' in index
    rows = runs_rows(tmp_path)
    assert sorted(r[0] for r in rows) == sorted(res.pages[1:])  # every run page, linked once
    assert all((tmp_path / r[0]).is_file() for r in rows)
    text = (tmp_path / "assets" / "runs.js").read_text(encoding="utf-8")
    assert not set("<>&") & set(text)  # hostile strings travel as \u003c… and are drawn with textContent
    assert any("<img src=x onerror=alert(1)>" in r[4][1][0] for r in rows)


@pytest.mark.heavy  # in this process, a second or more: the full pass runs it, the fast tier does not
def test_index_size_does_not_grow_with_the_runs_table(tmp_path):
    """At 10,000 runs the index must stay under 5 MB (benchmarks/bench_dashboard.py measures it): here
    the bytes each run adds to it, between 64 and 192 synthetic runs (both past MAX_SERIES sweeps),
    must stay under 5 MB / 10,000."""
    sizes = {}
    for n in (64, 192):
        assert n // 4 > MAX_SERIES
        build_site(synthetic_records(n, steps=4), tmp_path / str(n))
        sizes[n] = (tmp_path / str(n) / "index.html").stat().st_size
    per_run = (sizes[192] - sizes[64]) / 128
    assert per_run < 5e6 / 10_000 / 2, (sizes, per_run)  # with room for the fixed part
    assert len(runs_rows(tmp_path / "192")) == 192


def _written(site: Path) -> dict[str, tuple[int, int]]:
    """Each file of a site with what changes whenever a build writes it (atomic_file: a new file every time)."""
    return {p.relative_to(site).as_posix(): (p.stat().st_ino, p.stat().st_mtime_ns) for p in site.rglob("*")
            if p.is_file()}


@pytest.fixture()
def indexed(tmp_path, monkeypatch):
    """A copy of the fixture folder read through its index (store.MIN_FILES: the small folder indexed too), so each
    record is a row with its blob, as in a team's large folder."""
    from benchsuite.results import store

    monkeypatch.setattr(store, "MIN_FILES", 0)
    shutil.copytree(FIXTURES, tmp_path / "results")
    return tmp_path / "results"


def _rebuilt(folder: Path, site: Path, name: str, rec: dict) -> tuple[str, set[str]]:
    """The run page a new record file gets, and the files written besides it, when the site is built again."""
    before = _written(site)
    (folder / name).write_text(json.dumps(rec))
    build_site(folder, site)
    after = _written(site)
    (new,) = set(after) - set(before)
    return new, {f for f in before if after[f] != before[f]}


@pytest.mark.heavy  # in this process, a second or more: the full pass runs it, the fast tier does not
def test_a_rebuild_writes_the_new_records_page_the_pages_whose_run_changed_and_the_index_only(indexed, tmp_path):
    """A team's folder gains records: a rebuild writes each new record's page, the index and the runs table, and
    of the other run pages only those whose run's figures moved; every page then equals a fresh build's."""
    site, fresh = tmp_path / "site", tmp_path / "fresh"
    build_site(indexed, site)
    before = _written(site)
    build_site(indexed, site)  # nothing new: no run page written
    assert {f: w for f, w in _written(site).items() if f.startswith("runs/")} == \
        {f: w for f, w in before.items() if f.startswith("runs/")}
    rec = json.loads((indexed / "make_dvs-dense-w2.json").read_text())
    rec.update(repeat=1, started_at="2026-11-21T10:01:00+00:00")  # another repeat, measured alike
    _, written = _rebuilt(indexed, site, "make_dvs-dense-w2-r1.json", rec)
    assert {"index.html", "assets/runs.js"} <= written and not [f for f in written if f.startswith("runs/")]
    rec.update(repeat=2, started_at="2026-11-22T10:01:00+00:00")
    rec["metrics"]["tokens_per_s"] *= 1.3  # its run's repeats now spread: noisy, and its efficiency moves
    faster, written = _rebuilt(indexed, site, "make_dvs-dense-w2-r2.json", rec)
    run = load(indexed).df
    assert {f for f in written if f.startswith("runs/")} == \
        set(run.loc[run["run_key"] == rec["run_key"], "page"]) - {faster}  # its run's other records' pages
    build_site(indexed, fresh)
    files = set(_written(site)) - {MANIFEST}
    assert {f: (site / f).read_bytes() for f in files} == {f: (fresh / f).read_bytes() for f in files}


@pytest.mark.heavy  # in this process, a second or more: the full pass runs it, the fast tier does not
def test_a_record_read_from_its_file_or_from_the_index_is_one_fingerprint(tmp_path, monkeypatch):
    """A file as new as the index's racy window is read from itself (its row's blob let go with those of its batch
    the index kept); once older, from the index: the same record, so its page is not written again."""
    import time

    from benchsuite.results import index, store

    monkeypatch.setattr(store, "MIN_FILES", 0)
    monkeypatch.setattr(index, "RACY_NS", 100_000_000)
    folder, site = tmp_path / "results", tmp_path / "site"
    folder.mkdir()
    files = sorted(FIXTURES.glob("*.json"))
    for i, f in enumerate(files):
        if i == len(files) // 2:
            time.sleep(0.15)  # the files after this: too new for the first build's index to keep
        shutil.copy(f, folder / f.name)
    build_site(folder, site)
    before = _written(site)
    time.sleep(0.15)
    build_site(folder, site)  # every file read from the index now
    assert {f: w for f, w in _written(site).items() if f.startswith("runs/")} == \
        {f: w for f, w in before.items() if f.startswith("runs/")}


@pytest.mark.heavy  # in this process, a second or more: the full pass runs it, the fast tier does not
def test_a_rebuild_writes_again_the_page_of_a_record_that_changed_where_its_row_did_not(indexed, tmp_path):
    """A step's loss is in no column of the results model: a page's fingerprint holds its record (the record's blob
    in the folder's index), so the page of that record alone is written again."""
    site = tmp_path / "site"
    build_site(indexed, site)
    before = _written(site)
    path = indexed / "make_dvs-dense-w2.json"
    rec = json.loads(path.read_text())
    rec["steps"][0]["loss"] = 9.87654
    path.write_text(json.dumps(rec))
    build_site(indexed, site)
    after = _written(site)
    (page,) = [f for f in before if f.startswith("runs/") and after[f] != before[f]]
    assert "9.8765" in (site / page).read_text(encoding="utf-8")  # its loss figure, drawn again
