"""Carbon: intensity lookups against codecarbon's bundled data, calculators against hand sums."""

import csv
import dataclasses
import json
from importlib import resources

import pytest

from benchsuite.config import CarbonConfig
from benchsuite.energy import carbon


def cc_json(relpath):
    """Read codecarbon's bundled file independently of the code under test."""
    return json.loads(resources.files("codecarbon").joinpath(relpath).read_text(encoding="utf-8"))


def test_estimate_matches_hand_computation():
    # 8 chips x 24 h x 400 W = 76.8 kWh; x PUE 1.1 = 84.48 kWh; x 400 g/kWh = 33,792 g.
    out = carbon.estimate(chips=8, hours=24, watts=400, pue=1.1, intensity=400)
    assert out["energy_kwh"] == pytest.approx(76.8)
    assert out["facility_kwh"] == pytest.approx(84.48)
    assert out["co2e_kg"] == pytest.approx(33.792)
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


def test_unknown_region_uses_country_value_and_says_so():
    it = carbon.lookup(country="USA", region="atlantis")
    assert it.source == "codecarbon:global_energy_mix:USA" and "atlantis" in it.note


@pytest.mark.parametrize("cfg", [CarbonConfig(country="XYZ"), CarbonConfig(), None])
def test_unknown_or_missing_country_falls_back_to_world_average(cfg):
    expected = cc_json("data/private_infra/carbon_intensity_per_source.json")["world_average"]
    it = carbon.resolve_intensity(cfg)
    assert it.value_g_per_kwh == expected == carbon.WORLD_AVERAGE_G_PER_KWH == 475
    assert it.source == "fallback:world_average"
    assert "world average" in it.note


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
    assert out["hours"] == pytest.approx(1e12 / 1e7 / 3600)
    assert out["energy_kwh"] == pytest.approx(5e11 / 3.6e6)
    assert out["co2e_t"] == pytest.approx(5e11 / 3.6e6 * 1.1 * 400 / 1e6)


def energy_section(total=1000.0, gpu=800.0):
    return {"total_j": total, "gpu_j": gpu, "cpu_j": 200.0, "dram_j": None, "window_s": 10.0,
            "per_device": [{}, {}], "source": "measured", "total_includes": ["gpu", "cpu"]}


def test_derived_metrics_and_missing_inputs():
    c = carbon.carbon_section(1000.0, CarbonConfig(intensity_g_per_kwh=360.0))
    d = carbon.derived_metrics(energy_section(), tokens=2000, model_flops=4e15, carbon=c)
    assert d["j_per_token"] == pytest.approx(0.5) and d["j_per_pflop"] == pytest.approx(250.0)
    assert d["avg_w_per_device"] == pytest.approx(40.0)
    assert d["gco2e_per_mtok"] == pytest.approx(1000.0 / 3.6e6 * 360.0 / 2000 * 1e6)
    d = carbon.derived_metrics(energy_section(total=None, gpu=None), tokens=None, model_flops=None)
    assert all(d[k] is None for k in ("j_per_token", "j_per_pflop", "avg_w_per_device", "gco2e_per_mtok"))


def record(status="ok"):
    return {"status": status, "run_key": "abc", "suite": "s", "workload": "dense", "started_at": "2025-01-01T00:00:00Z",
            "duration_s": 60.0, "config": {"carbon": {"country": "FRA", "region": None}, "world_size": 2},
            "env": {"world_size": 2, "python": "3.11",
                    "devices": [{"type": "cuda", "name": "NVIDIA H200", "uuid": "GPU-a", "rank": 0},
                                {"type": "cuda", "name": "NVIDIA H200", "uuid": "GPU-a", "rank": 1}]},
            "metrics": {"tokens_per_s": 1000.0},
            "energy": {**energy_section(), "gpu_j": None, "total_j": 200.0, "total_includes": ["cpu"], "per_device": [],
                       "source": "estimated"},
            "carbon": carbon.carbon_section(200.0, CarbonConfig(country="FRA", pue=1.1))}


def test_codecarbon_rows_use_its_columns_and_units(tmp_path):
    from codecarbon.output_methods.emissions_data import EmissionsData
    columns = [f.name for f in dataclasses.fields(EmissionsData)]
    rows = carbon.to_codecarbon_rows([record(), record(status="failed")])
    assert len(rows) == 1 and list(rows[0]) == columns
    row = rows[0]
    assert row["cpu_energy"] == pytest.approx(200.0 / 3.6e6) and row["cpu_power"] == pytest.approx(20.0)
    assert row["gpu_energy"] is None and row["gpu_power"] is None            # not measured: empty, not 0
    assert row["emissions"] == pytest.approx(record()["carbon"]["co2e_g"] / 1000)
    assert row["duration"] == 10.0 and row["country_name"] == "France" and row["pue"] == 1.1
    assert row["gpu_count"] == 1 and row["gpu_model"] == "NVIDIA H200"   # two ranks, one GPU
    path = carbon.write_codecarbon_csv([record()], tmp_path / "emissions.csv")
    with path.open() as f:
        assert next(csv.reader(f)) == columns


def test_project_from_record():
    out = carbon.project_from_record(record(), tokens=1e9)
    assert out["j_per_token"] == pytest.approx(200.0 / (1000.0 * 10.0))
    assert out["tokens_per_s_per_device"] == pytest.approx(500.0) and out["devices"] == 2
    assert out["intensity_source"] == "codecarbon:global_energy_mix:FRA" and out["energy_source"] == "estimated"
