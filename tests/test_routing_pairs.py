"""Learned vs forced routing side by side (results/routing.py): a suite's sweep over moe.routing gives two
runs of one workload, and report (text and --json) puts them on one row with forced ÷ learned tok/s and its
interval over seeds."""

from __future__ import annotations

import json

import pytest

from benchsuite import cli
from benchsuite.config import parse_suite
from benchsuite.record import write_record
from benchsuite.results.model import results_at
from benchsuite.results.routing import routing_pairs
from helpers.records import make_record, typed


def _moe_record(routing: str, seed: int, tokens_per_s: float, workload: str = "mix") -> dict:
    rec = make_record(f"{routing}{seed}{workload}", workload=workload, tokens_per_s=tokens_per_s, step=1.0)
    rec["config"].update(kind="moe", moe={"router": "token_choice", "experts": 8, "top_k": 2, "routing": routing},
                         train={"seed": seed})
    rec["metrics"].update(mfu=tokens_per_s / 1e4, energy={"j_per_token": 100.0 / tokens_per_s})
    return typed(rec)


@pytest.fixture
def folder(tmp_path):
    for seed, learned, forced in ((0, 100.0, 150.0), (1, 110.0, 160.0), (2, 105.0, 158.0)):
        write_record(tmp_path, _moe_record("learned", seed, learned))
        write_record(tmp_path, _moe_record("forced", seed, forced))
    write_record(tmp_path, _moe_record("learned", 0, 90.0, workload="alone"))  # no forced twin: no pair
    return tmp_path


def test_a_learned_and_a_forced_run_of_one_workload_are_one_pair(folder):
    results = results_at(folder)
    (pair,) = results.routing_pairs
    assert pair.learned["tokens_per_s"] == 105.0 and pair.forced["tokens_per_s"] == 158.0
    assert pair.speedup.point == pytest.approx(158.0 / 105.0)
    assert pair.speedup.lo < pair.speedup.point < pair.speedup.hi and pair.speedup.lo > 1.3
    assert pair.forced["j_per_token"] == pytest.approx(100.0 / 158.0)
    labels = set(results.runs["label"])
    assert {"mix · learned routing · w1", "mix · forced routing · w1"} <= labels, labels  # named apart, not by a hash


def test_report_shows_the_pair_on_one_row_in_text_and_json(folder, capsys):
    assert cli.main(["report", str(folder)]) == 0
    text = capsys.readouterr().out
    assert "Learned vs forced routing" in text
    row = next(line for line in text.splitlines() if "mix · learned routing · w1" in line and "158" in line)
    assert "105" in row and "1.50 (" in row
    assert cli.main(["report", str(folder), "--json"]) == 0
    (pair,) = json.loads(capsys.readouterr().out)["routing"]
    assert pair["learned"]["tokens_per_s"] == 105.0 and pair["forced"]["tokens_per_s"] == 158.0
    assert pair["speedup"] == pytest.approx(158.0 / 105.0) and pair["speedup_lo"] > 1.3


def test_one_seed_a_side_gives_the_ratio_without_an_interval(tmp_path):
    write_record(tmp_path, _moe_record("learned", 0, 100.0))
    write_record(tmp_path, _moe_record("forced", 0, 200.0))
    (pair,) = results_at(tmp_path).routing_pairs
    assert pair.speedup.point == 2.0 and pair.speedup.lo is None and "one seed on a side" in pair.speedup.reason


def test_a_routing_sweep_expands_each_token_choice_moe_workload_into_both_routings():
    suite = parse_suite({"sweep": {"routing": ["learned", "forced"], "seed": [0, 1]},
                         "workload": [{"name": "dense"}, {"name": "tc", "kind": "moe", "moe": {"router": "token_choice"}},
                                      {"name": "ec", "kind": "moe", "moe": {"router": "expert_choice"}}]})
    runs = [(r.workload, r.train.seed, r.moe.routing if r.moe else None) for r in suite.runs]
    assert runs == [("dense", 0, None), ("dense", 1, None),
                    ("tc", 0, "learned"), ("tc", 0, "forced"), ("tc", 1, "learned"), ("tc", 1, "forced"),
                    ("ec", 0, "learned"), ("ec", 1, "learned")]


def test_the_dashboard_shows_the_pair_on_one_row(folder, tmp_path):
    site = tmp_path / "site"
    assert cli.main(["dashboard", str(folder), "-o", str(site)]) == 0
    html = " ".join(p.read_text() for p in site.rglob("*.html"))
    assert "Learned vs forced routing" in html
    row = html[html.index("mix · learned routing · w1</td>"):]
    row = row[:row.index("</tr>")]
    assert ">105<" in row and ">158<" in row and "1.5 (" in row


def test_pairs_are_found_from_the_runs_rows_reading_no_record_and_only_within_one_configuration(folder,
                                                                                              monkeypatch):
    """The pair key is a row column (results.identity.routing_identity): a report of 100,000 records decodes none
    for its routing table. A forced run of another configuration (16 experts) is no one's twin."""
    other = _moe_record("forced", 0, 170.0, workload="alone")
    other["config"]["moe"]["experts"] = 16
    write_record(folder, typed(other))
    results = results_at(folder)
    monkeypatch.setattr(type(results), "run_records", lambda *a: pytest.fail("a record was read"))
    (pair,) = routing_pairs(results)
    assert pair.forced["tokens_per_s"] == 158.0
    keys = results.df.drop_duplicates("identity").set_index("identity")["routing_identity"]
    assert keys[pair.identities[0]] == keys[pair.identities[1]] and keys.nunique() == 3  # mix, alone, alone-16
