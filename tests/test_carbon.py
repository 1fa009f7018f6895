"""Carbon: intensity lookups against codecarbon's bundled data, calculators against hand sums."""

import json
from importlib import resources

import pytest

from benchsuite.config import CarbonConfig
from benchsuite.energy import carbon
from benchsuite.metrics import energy as em
from benchsuite.results import migrate


def cc_json(relpath):
    """Read codecarbon's bundled file independently of the code under test."""
    return json.loads(resources.files("codecarbon").joinpath(relpath).read_text(encoding="utf-8"))


def test_estimate_matches_hand_computation():
    # 8 chips x 24 h x 400 W = 76.8 kWh; x PUE 1.1 = 84.48 kWh; x 400 g/kWh = 33,792 g.
    out = carbon.estimate(chips=8, hours=24, watts=400, pue=1.1, intensity=400)
    assert out["energy_j"] / 3.6e6 == pytest.approx(76.8)
    assert out["facility_j"] / 3.6e6 == pytest.approx(84.48)
    assert out["co2e_g"] / 1000 == pytest.approx(33.792)
    assert out["intensity_source"] == "explicit" and out["pue"] == 1.1


@pytest.mark.parametrize("kwargs", [dict(chips=-1, hours=1, watts=1), dict(chips=1, hours=1, watts=1, pue=0.9)])
def test_estimate_rejects_impossible_inputs(kwargs):
    with pytest.raises(ValueError):
        carbon.estimate(**kwargs)


@pytest.mark.parametrize("iso", ["FRA", "DEU", "USA", "IND", "BRA", "SWE", "ZAF"])
def test_country_lookup_equals_codecarbon_data(iso):
    expected = cc_json("data/private_infra/global_energy_mix.json")[iso]["carbon_intensity"]
    it = carbon.resolve_intensity(CarbonConfig(country=iso.lower()))
    assert it.value_g_per_kwh == pytest.approx(expected)
    assert it.source == f"codecarbon:global_energy_mix:{iso}"


@pytest.mark.parametrize("iso, region", [("USA", "California"), ("CAN", "quebec"), ("SWE", "SE3"),
                                         ("NOR", "NO4"), ("CHN", "Beijing Municipality")])
def test_region_lookup_equals_codecarbon_computation(iso, region):
    from codecarbon.core.emissions import Emissions
    from codecarbon.core.units import Energy
    from codecarbon.external.geography import GeoMetadata
    from codecarbon.input import DataSource

    kg = Emissions(DataSource()).get_region_emissions(Energy(kWh=1.0), GeoMetadata(iso, region=region))
    it = carbon.lookup(country=iso, region=region)
    assert it.value_g_per_kwh == pytest.approx(kg * 1000.0)
    assert it.source.startswith("codecarbon:") and it.source.split(":")[2].startswith(iso + "/")


@pytest.mark.parametrize("cfg", [CarbonConfig(), None])
def test_missing_country_uses_world_average(cfg):
    expected = cc_json("data/private_infra/carbon_intensity_per_source.json")["world_average"]
    it = carbon.resolve_intensity(cfg)
    assert it.value_g_per_kwh == expected == carbon.WORLD_AVERAGE_G_PER_KWH == 475
    assert it.source == "fallback:world_average"
    assert "world average" in it.note


@pytest.mark.parametrize("country, region, field, says", [
    ("fr", None, "country", "fr: not an ISO 3166 alpha-3 code; did you mean FRA?"),
    ("FR", None, "country", "did you mean FRA?"),
    ("Germany", None, "country", "did you mean DEU?"),
    ("XYZ", None, "country", "give its alpha-3 code, e.g. FRA"),
    ("MCO", None, "country", "no figure for MCO"),        # a real country codecarbon has no figure for
    ("USA", "atlantis", "region", "not in codecarbon's data for USA; valid: alabama"),
    ("SWE", "NO1", "region", "valid: SE1, SE2, SE3, SE4"),
    ("FRA", "paris", "region", "no regional data for FRA"),
    (None, "california", "region", "needs a country"),
])
def test_places_codecarbon_does_not_hold_are_bad_input(country, region, field, says):
    problems = carbon.place_problems(country, region)
    assert len(problems) == 1 and problems[0][0] == field and says in problems[0][1]
    with pytest.raises(ValueError, match=field):
        carbon.lookup(country=country, region=region)
    with pytest.raises(ValueError):   # never the world average at exit 0
        carbon.resolve_intensity(CarbonConfig(country=country, region=region))


@pytest.mark.parametrize("country, region", [("fra", None), ("usa", "California"), ("swe", "se3"), ("CHN", "Beijing")])
def test_places_codecarbon_holds_pass(country, region):
    assert carbon.place_problems(country, region) == []


def test_suite_with_unknown_country_or_region_lists_both_before_running():
    from benchsuite.config import ConfigError
    from benchsuite.config.preflight import parse_suite

    doc = {"carbon": {"country": "FR"},
           "workload": [{"name": "a"}, {"name": "b", "carbon": {"country": "usa", "region": "atlantis"}}]}
    with pytest.raises(ConfigError) as e:
        parse_suite(doc)
    problems = dict(e.value.problems)
    assert problems["carbon.country"] == "FR: not an ISO 3166 alpha-3 code; did you mean FRA?"
    assert "'atlantis' not in codecarbon's data for USA" in problems["workload[1] (b).carbon.region"]
    assert len(e.value.problems) == 2
    parse_suite({"carbon": {"country": "FRA"}, "workload": [{"name": "a"}]})   # a known code passes


@pytest.mark.procs
def test_run_with_unknown_country_exits_2_and_launches_nothing(tmp_path):
    from helpers import run_cli, write_suite

    suite = write_suite(tmp_path / "s.toml", """
        [carbon]
        country = "fr"
        [[workload]]
        name = "tiny"
        """)
    res = run_cli("run", str(suite), "--out", str(tmp_path / "out"))
    assert res.returncode == 2, res.stderr
    assert "carbon.country: fr: not an ISO 3166 alpha-3 code; did you mean FRA?" in res.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("*.json"))


@pytest.mark.procs
@pytest.mark.parametrize("verb, args, says", [
    ("estimate", ["--chips", "1", "--hours", "1", "--watts", "1000", "--country", "fr"],
     "--country fr: not an ISO 3166 alpha-3 code; did you mean FRA?"),
    ("estimate", ["--chips", "1", "--hours", "1", "--watts", "1000", "--country", "USA", "--region", "atlantis"],
     "--region 'atlantis' not in codecarbon's data for USA"),
    ("project", ["tests/fixtures/results", "--tokens", "1e9", "--country", "de"], "did you mean DEU?"),
])
def test_cli_unknown_country_or_region_exits_2(verb, args, says):
    from helpers import run_cli

    res = run_cli("carbon", verb, *args, "--json")
    assert res.returncode == 2 and json.loads(res.stdout)["error"] == "usage" and "Traceback" not in res.stderr
    assert says in res.stderr


def test_explicit_intensity_wins_over_country():
    it = carbon.resolve_intensity(CarbonConfig(intensity_g_per_kwh=123.0, country="FRA"))
    assert (it.value_g_per_kwh, it.source) == (123.0, "explicit")


def test_carbon_section():
    s = carbon.carbon_section(7.2e6, CarbonConfig(pue=1.2, intensity_g_per_kwh=300.0))
    assert s["kwh"] == pytest.approx(2.0) and s["pue"] == 1.2
    assert s["co2e_g"] == pytest.approx(2.0 * 1.2 * 300.0) and s["intensity_source"] == "explicit"
    none = carbon.carbon_section(None, CarbonConfig())
    assert none["kwh"] is None and none["co2e_g"] is None
    assert none["pue"] == 1.0 and none["intensity_source"] == "fallback:world_average"


def test_project_matches_hand_computation():
    out = carbon.project(tokens=1e12, devices=1000, j_per_token=0.5, tokens_per_s_per_device=1e4,
                         pue=1.1, intensity=400.0)
    assert out["duration_s"] / 3600 == pytest.approx(1e12 / 1e7 / 3600)
    assert out["energy_j"] / 3.6e6 == pytest.approx(5e11 / 3.6e6)
    assert out["co2e_g"] / 1e6 == pytest.approx(5e11 / 3.6e6 * 1.1 * 400 / 1e6)


def energy_section(total=1000.0, gpu=800.0):
    return {"total_j": total, "gpu_j": gpu, "cpu_j": 200.0, "dram_j": None, "window_s": 10.0,
            "per_device": [{}, {}], "source": "measured", "total_includes": ["gpu", "cpu"]}


def test_derived_metrics_and_missing_inputs():
    c = carbon.carbon_section(1000.0, CarbonConfig(intensity_g_per_kwh=360.0))
    d = em.derived_metrics(energy_section(), tokens=2000, model_flops=4e15, carbon=c)
    assert d["j_per_token"] == pytest.approx(0.5) and d["j_per_pflop"] == pytest.approx(250.0)
    assert d["gpu_j_per_token"] == pytest.approx(800.0 / 2000) and d["gpu_j_per_token_reason"] is None
    assert d["avg_w_per_device"] == pytest.approx(40.0)
    assert d["gco2e_per_mtok"] == pytest.approx(1000.0 / 3.6e6 * 360.0 / 2000 * 1e6)
    d = em.derived_metrics(energy_section(total=None, gpu=None), tokens=None, model_flops=None)
    assert all(d[k] is None for k in ("j_per_token", "gpu_j_per_token", "j_per_pflop", "avg_w_per_device",
                                      "gco2e_per_mtok"))


def test_gpu_j_per_token_is_null_with_the_reason():
    cpu_only = {**energy_section(gpu=None), "per_device": []}
    d = em.derived_metrics(cpu_only, tokens=2000, model_flops=None)
    assert d["gpu_j_per_token"] is None and d["gpu_j_per_token_reason"] == "no GPU in this run"
    assert d["j_per_token"] == pytest.approx(0.5)      # the total still stands
    no_counter = {**energy_section(gpu=None), "per_device": [{"energy_j": None, "reason": "NVML: not supported"}]}
    d = em.derived_metrics(no_counter, tokens=2000, model_flops=None)
    assert d["gpu_j_per_token"] is None and d["gpu_j_per_token_reason"] == "GPU energy unavailable: NVML: not supported"


def test_upgrade_v1_energy_metrics_adds_gpu_j_per_token_from_the_record():
    v1 = {"schema_version": 1, "metrics": {"tokens_per_step": 100, "energy": {"j_per_token": 0.5}},
          "energy": {**energy_section(gpu=800.0), "sources": {"gpu": "measured"}}, "steps": [{}] * 20}
    up = migrate.upgrade_v1_energy_metrics(v1)
    assert up["metrics"]["energy"]["gpu_j_per_token"] == pytest.approx(800.0 / 2000)
    assert up["metrics"]["energy"]["gpu_energy_source"] == "measured"
    assert "gpu_j_per_token" not in v1["metrics"]["energy"]          # pure: the input is unchanged
    failed = {"schema_version": 1, "metrics": None, "energy": None, "steps": []}
    assert migrate.upgrade_v1_energy_metrics(failed) == failed


def test_host_facts_are_what_codecarbon_reads():
    import platform

    import psutil

    from benchsuite.environment import host_facts
    devices = [{"type": "cuda", "uuid": "GPU-a"}, {"type": "cuda", "uuid": "GPU-a"}, {"type": "cuda", "uuid": "GPU-b"}]
    facts = host_facts(devices)
    assert facts["os"] == platform.platform() and facts["cpu_count"] == psutil.cpu_count()
    assert facts["ram_total_gb"] == psutil.virtual_memory().total / 1024**3
    assert facts["gpu_count"] == 2 and host_facts([{"type": "cpu", "uuid": None}])["gpu_count"] == 0


def record(status="ok"):
    return {"status": status, "run_key": "abc", "suite": "s", "workload": "dense", "started_at": "2025-01-01T00:00:00Z",
            "duration_s": 60.0, "config": {"carbon": {"country": "FRA", "region": None}, "world_size": 2},
            "env": {"world_size": 2, "python": "3.11",
                    "devices": [{"type": "cuda", "name": "NVIDIA H200", "uuid": "GPU-a", "rank": 0},
                                {"type": "cuda", "name": "NVIDIA H200", "uuid": "GPU-a", "rank": 1}]},
            "metrics": {"tokens_per_s": 1000.0, "tokens_per_s_per_device": 500.0},
            "energy": {**energy_section(), "gpu_j": None, "total_j": 200.0, "total_includes": ["cpu"], "per_device": [],
                       "source": "estimated"},
            "carbon": carbon.carbon_section(200.0, CarbonConfig(country="FRA", pue=1.1))}


def test_project_from_record():
    out = carbon.project_from_record(record(), tokens=1e9)
    assert out["j_per_token"] == pytest.approx(200.0 / (1000.0 * 10.0))
    assert out["tokens_per_s_per_device"] == pytest.approx(500.0) and out["devices"] == 2
    assert out["intensity_source"] == "codecarbon:global_energy_mix:FRA" and out["energy_source"] == "estimated"


def test_report_energy_table_shows_gpu_j_per_token(tmp_path):
    from rich.console import Console

    from benchsuite.results.report import section_tables
    from benchsuite.results.model import results_at
    from helpers import REPO

    rec = json.loads((REPO / "tests/fixtures/results/make_dvs-dense-w1.json").read_text())
    rec = migrate.upgrade_v1_energy_metrics(rec)
    expected = rec["energy"]["gpu_j"] / (rec["metrics"]["tokens_per_step"] * len(rec["steps"]))
    (tmp_path / "r.json").write_text(json.dumps(rec))
    console = Console(record=True, width=300)
    for table in section_tables(results_at(tmp_path)):
        console.print(table)
    text = console.export_text()
    assert "GPU J/token" in text and f"{expected:.3g}" in text


def test_project_from_a_record_whose_optional_fields_are_null():
    """A record as the loader gives it has every declared field, null where not measured: a null source,
    parts list or intensity source is 'not stated', never a crash."""
    rec = record()
    rec["energy"].update(total_includes=None, source=None)
    rec["carbon"].update(intensity_source=None)
    out = carbon.project_from_record(rec, tokens=1e9)
    assert (out["energy_includes"], out["energy_source"], out["intensity_source"]) == ([], "unavailable", "record")


def test_a_run_of_two_seeds_projects_from_the_throughput_and_j_per_token_it_prints(tmp_path, capsys):
    """hours, kWh and CO2e follow from the printed per-device tok/s and J/token by the printed formulas (a
    median of each record's hours beside a median of tok/s did not: 1/median ≠ median of 1/x)."""
    from pathlib import Path

    from benchsuite.cli import main

    doc = json.loads((Path(__file__).parent / "fixtures" / "results" / "make_dvs-dense-w1.json").read_text())
    for seed, share in ((0, 0.5), (1, 0.125)):
        rec = json.loads(json.dumps(doc))
        rec["run_key"] = f"{doc['run_key']}{seed}"
        rec["config"]["train"]["seed"] = seed
        rec["metrics"]["tokens_per_s"] *= share
        rec["metrics"]["energy"]["j_per_token"] /= share  # the same power over fewer tokens
        (tmp_path / f"r{seed}.json").write_text(json.dumps(rec))
    assert main(["carbon", "project", str(tmp_path), "--tokens", "1e12", "--json"]) == 0
    (run,) = json.loads(capsys.readouterr().out)
    assert run["records_projected"] == 2 and run["duration_s_range"][0] < run["duration_s_range"][1]
    tokens, devices = run["tokens"], run["devices"]
    assert run["duration_s"] / 3600 == pytest.approx(tokens / (run["tokens_per_s_per_device"] * devices) / 3600, rel=1e-12)
    assert run["energy_j"] / 3.6e6 == pytest.approx(tokens * run["j_per_token"] / 3.6e6, rel=1e-12)
    assert run["facility_j"] / 3.6e6 == pytest.approx(run["energy_j"] / 3.6e6 * run["pue"], rel=1e-12)
    assert run["co2e_g"] / 1e6 == pytest.approx(run["facility_j"] / 3.6e6 * run["intensity_g_per_kwh"] / 1e6, rel=1e-12)
