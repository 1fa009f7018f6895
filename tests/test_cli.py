"""The CLI as a user meets it: --json documents on stdout, figures that match a hand computation."""

import json

import pytest

from conftest import run_cli


def test_carbon_estimate_json_matches_hand_computation():
    res = run_cli("carbon", "estimate", "--chips", "8", "--hours", "24", "--watts", "400", "--pue", "1.1",
                  "--intensity", "400", "--json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["energy_kwh"] == pytest.approx(8 * 24 * 400 / 1000)
    assert doc["co2e_kg"] == pytest.approx(8 * 24 * 400 / 1000 * 1.1 * 400 / 1000)
    assert (doc["pue"], doc["intensity_source"]) == (1.1, "explicit")


def test_carbon_estimate_unknown_country_exits_2():
    res = run_cli("carbon", "estimate", "--chips", "1", "--hours", "1", "--watts", "1000", "--country", "XXX",
                  "--json")
    assert res.returncode == 2 and res.stdout == "" and "--country XXX" in res.stderr


def test_flops_json_is_one_document_with_every_run():
    res = run_cli("flops", "workloads/scaling.toml", "--json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert len(doc["runs"]) == 6
    r = doc["runs"][0]
    l, h, s, v = 2, 128, 64, 512
    assert r["model_flops_per_token"] == 72 * l * h * h + 12 * l * s * h + 6 * v * h


def test_bad_numbers_on_the_command_line_exit_2():
    res = run_cli("carbon", "estimate", "--chips", "-1", "--hours", "1", "--watts", "1")
    assert res.returncode == 2 and "Traceback" not in res.stderr
