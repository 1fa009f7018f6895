"""The carbon beside the location-based CO2e (market-based, embodied, water), and golden reproductions of
published footprints from their papers' inputs, within the rounding of those inputs."""

import json
from pathlib import Path

import pytest

from benchsuite.cli import main
from benchsuite.config import CarbonConfig
from benchsuite.energy import carbon, footprint
from benchsuite.energy.footprint import Usage


def _within_rounding(value: float, published: float, *rounded: tuple[float, float]) -> None:
    """value agrees with the published figure within the relative rounding of each input (value, half a unit
    of its last digit) plus the published figure's own last digit."""
    tolerance = sum(half / v for v, half in rounded)
    assert value == pytest.approx(published, rel=tolerance)


# ----------------------------------------------------------------------------- Patterson et al. 2021, table 4


@pytest.mark.parametrize("row", [
    # chips, days, W per chip, PUE, kg CO2e/kWh -> MWh, t CO2e (Patterson et al. 2021, table 4)
    dict(name="T5", chips=512, days=20, watts=310, pue=1.12, kg_per_kwh=0.545, mwh=85.7, t=46.7, days_half=0.5),
    dict(name="GPT-3", chips=10000, days=14.8, watts=330, pue=1.10, kg_per_kwh=0.429, mwh=1287, t=552.1,
         days_half=0.05),
], ids=lambda r: r["name"])
def test_patterson_table_4_rows_from_their_inputs(row):
    res = carbon.estimate(row["chips"], row["days"] * 24, row["watts"], row["pue"], row["kg_per_kwh"] * 1000)
    inputs = [(row["days"], row["days_half"]), (row["watts"], 0.5), (row["pue"], 0.005), (row["kg_per_kwh"], 0.0005)]
    _within_rounding(res["facility_j"] / 3.6e6 / 1000, row["mwh"], *inputs[:3], (row["mwh"], 0.05))
    _within_rounding(res["co2e_g"] / 1000 / 1000, row["t"], *inputs, (row["t"], 0.05))


# ----------------------------------------------------------------------------- LLMCarbon (Faiz et al. 2024)

# LLMCarbon's hardware table for XLM's embodied footprint (its data/hardware.csv): unit (cm² or GB) × kg CO2e per
# unit × count; spread over a 5-year life (its embodied.py: lifespan 5 × 365 days).
XLM_HARDWARE = [(1.47, 1.0, 64), (256, 0.4, 64), (32768, 0.018, 64), (8.15, 1.2, 512), (111.6, 1.2, 64)]


def test_llmcarbon_xlm_operational_and_embodied_rows():
    """XLM: 512 V100 for 20.4 days at 342 W, PUE 1.1, 0.413 kg/kWh -> 94.4 MWh, 39 t; embodied 0.66 t published,
    LLMCarbon's model 0.648 t. The embodied part, given the same hardware total per device and LLMCarbon's 5-year
    life, equals LLMCarbon's own formula and is within 2 % of the published figure."""
    kg_total = sum(unit * per_unit * n for unit, per_unit, n in XLM_HARDWARE)
    res = carbon.estimate(512, 20.4 * 24, 342, 1.1, 413, parts_cfg=CarbonConfig(
        embodied_kg_per_device=kg_total / 512, device_lifetime_years=5))
    _within_rounding(res["facility_j"] / 3.6e6 / 1000, 94.4, (20.4, 0.05), (342, 0.5), (1.1, 0.005), (94.4, 0.05))
    _within_rounding(res["co2e_g"] / 1000 / 1000, 39.0, (20.4, 0.05), (342, 0.5), (1.1, 0.005), (0.413, 0.0005), (39, 0.5))
    embodied_t = res["embodied"]["co2e_g"] / 1e6
    assert embodied_t == pytest.approx(kg_total * 20.4 / (5 * 365) / 1000, rel=1e-12)  # LLMCarbon's embodied.py
    assert embodied_t == pytest.approx(0.66, rel=0.02)


# ----------------------------------------------------------------------------- BLOOM (Luccioni et al. 2022)


def test_bloom_operational_and_embodied_split():
    """BLOOM's final training: 1,082,990 GPU-hours at 400 W on France's 57 g/kWh grid -> 24.7 t dynamic; with
    256,646 kWh of idle energy (14.6 t), the servers' embodied share (2,500 kg per 8-GPU node, replaced after
    6 years at 85 % use: 5.1 service-years; 7.57 t) and the network's 3.64 t (the paper's figure) -> 50.5 t."""
    dynamic = carbon.estimate(1, 1_082_990, 400, 1.0, 57, parts_cfg=CarbonConfig(device_lifetime_years=6 * 0.85))
    assert dynamic["energy_j"] / 3.6e6 == pytest.approx(433_196)
    _within_rounding(dynamic["co2e_g"] / 1000 / 1000, 24.7, (57, 0.5), (24.7, 0.05))
    servers = dynamic["embodied"]
    assert servers["kg_per_device"] == 2500 / 8 and "Luccioni" in servers["source"]  # the documented default
    _within_rounding(servers["co2e_g"] / 1e6, 7.57, (0.85, 0.005), (7.57, 0.005))
    idle_t = 256_646 * 57 / 1e6
    total = dynamic["co2e_g"] / 1000 / 1000 + idle_t + servers["co2e_g"] / 1e6 + 3.64
    _within_rounding(total, 50.5, (57, 0.5), (0.85, 0.005), (50.5, 0.05))


# ----------------------------------------------------------------------------- the parts


def test_market_based_is_beside_the_location_based_figure_never_added():
    usage = Usage(energy_j=3.6e9, pue=1.2, devices=8, hours=10.0, gpus=True)  # 1,000 kWh IT
    cfg = CarbonConfig(intensity_g_per_kwh=400.0, market_intensity_g_per_kwh=50.0)
    market = footprint.market_based(usage, cfg)
    assert market["co2e_g"] == pytest.approx(1000 * 1.2 * 50.0) and market["source"] == "carbon.market_intensity_g_per_kwh"
    assert footprint.market_based(usage, CarbonConfig()).get("co2e_g") is None


def test_embodied_per_device_hour_and_a_cpu_host_has_no_default():
    usage = Usage(energy_j=1.0, pue=1.0, devices=8, hours=24.0, gpus=True)
    e = footprint.embodied(usage, CarbonConfig(embodied_kg_per_device=1000.0, device_lifetime_years=4.0))
    assert e["co2e_g"] == pytest.approx(1000 * 1000 * 8 * 24 / (4 * 8760)) and e["device_hours"] == 192
    cpu = footprint.embodied(Usage(1.0, 1.0, 1, 1.0, gpus=False), CarbonConfig())
    assert cpu.get("co2e_g") is None and "carbon.embodied_kg_per_device" in cpu["reason"]


def test_water_on_site_and_off_site():
    w = footprint.water(Usage(3.6e9, 1.5, 1, 1.0, True), CarbonConfig(wue_l_per_kwh=0.5, water_intensity_l_per_kwh=3.0))
    assert (w["onsite_l"], w["offsite_l"], w["reason"]) == pytest.approx((500.0, 1000 * 1.5 * 3.0, None))
    none = footprint.water(Usage(3.6e9, 1.5, 1, 1.0, True), CarbonConfig(wue_l_per_kwh=0.5))
    assert none["offsite_l"] is None and "carbon.water_intensity_l_per_kwh" in none["reason"]


def _energy_section(total_j: float) -> dict:
    from benchsuite.energy.attribution import attribute_energy

    return attribute_energy([{"rank": 0, "host": "n0", "window_s": 100.0, "short_window": False, "reasons": [],
                              "gpus": [{"uuid": "GPU-a", "name": "H200", "cuda_index": 0,
                                        "figure": {"energy_j": total_j, "source": "measured",
                                                   "detail": {"counter_edge_s": 0.001}}}],
                              "cpu": {"energy_j": None, "source": "unavailable", "reason": "none"},
                              "dram": {"energy_j": None, "source": "unavailable", "reason": "none"}}])


def test_a_record_carbon_section_holds_each_part_and_the_market_factor_leaves_the_co2e_alone():
    energy = _energy_section(36e6)  # 10 kWh
    plain = carbon.record_carbon(energy, CarbonConfig(intensity_g_per_kwh=400.0))
    market = carbon.record_carbon(energy, CarbonConfig(intensity_g_per_kwh=400.0, market_intensity_g_per_kwh=900.0))
    assert plain["co2e_g"] == market["co2e_g"] == pytest.approx(4000.0)  # never summed, never replaced
    assert market["market"]["co2e_g"] == pytest.approx(9000.0)
    low, high = market["co2e_g_bound"]["low"], market["co2e_g_bound"]["high"]
    assert low < 4000.0 < high and high / 4000.0 - 1 == pytest.approx(energy["bounds"]["total"]["share"])
    assert market["embodied"]["devices"] == 1 and market["embodied"]["device_hours"] == pytest.approx(100 / 3600)


def test_carbon_estimate_cli_prints_each_part_beside_and_json_holds_them(capsys):
    assert main(["carbon", "estimate", "--chips", "8", "--hours", "10", "--watts", "500", "--intensity", "400",
                 "--market-intensity", "0", "--wue", "0.4", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["co2e_g"] / 1000 == pytest.approx(40 * 400 / 1000) and doc["market"]["co2e_g"] == 0.0
    assert doc["water"]["onsite_l"] == pytest.approx(16.0) and "water_intensity" in doc["water"]["reason"]
    assert main(["carbon", "estimate", "--chips", "8", "--hours", "10", "--watts", "500", "--intensity", "400"]) == 0
    text = capsys.readouterr().out
    assert "market-based (Scope 2): not computed" in text and "embodied (Scope 3):" in text


def test_report_json_and_load_show_the_bound_and_the_parts_the_record_holds(tmp_path, capsys):
    """One figure everywhere: a record's energy bound, CO2e bound and carbon parts read the same in
    `report --json`, in `load()` and in the record."""
    import benchsuite
    from benchsuite.record import to_dict
    from benchsuite.results.decoding import read_record

    fixtures = Path(__file__).parent / "fixtures" / "results"
    rec = to_dict(read_record(fixtures / "make_dvs-dense-w1.json"))  # a document to change by hand
    energy = _energy_section(36e6)
    cfg = CarbonConfig(intensity_g_per_kwh=400.0, market_intensity_g_per_kwh=100.0, wue_l_per_kwh=0.5,
                       water_intensity_l_per_kwh=2.0)
    rec["energy"], rec["carbon"] = energy, carbon.record_carbon(energy, cfg)
    rec["config"]["carbon"] = {**rec["config"]["carbon"], **{k: getattr(cfg, k) for k in CarbonConfig.LATER}}
    folder = tmp_path / "results"
    folder.mkdir()
    (folder / "r.json").write_text(json.dumps(rec))
    assert main(["report", str(folder), "--json"]) == 0
    [run] = json.loads(capsys.readouterr().out)["runs"]
    df = benchsuite.load(folder)
    for column, loaded, value in (("carbon.co2e_g_bound.low", "co2e_low_g", rec["carbon"]["co2e_g_bound"]["low"]),
                                  ("carbon.market.co2e_g", "market_co2e_g", rec["carbon"]["market"]["co2e_g"]),
                                  ("carbon.water.offsite_l", "water_offsite_l", rec["carbon"]["water"]["offsite_l"]),
                                  ("carbon.embodied.co2e_g", "embodied_co2e_g", rec["carbon"]["embodied"]["co2e_g"])):
        assert run[column] == pytest.approx(value) == pytest.approx(df[loaded].iloc[0]), column
    assert run["energy_bound_share"] == pytest.approx(energy["bounds"]["total"]["share"])
    assert df["energy_high_j"].iloc[0] == pytest.approx(energy["bounds"]["total"]["high_j"])
    assert benchsuite.load_runs(folder)["energy_bound_share"].iloc[0] == pytest.approx(run["energy_bound_share"])


def test_a_projection_states_the_meters_bound_of_the_energy_it_scales(tmp_path, capsys):
    fixtures = Path(__file__).parent / "fixtures" / "results"
    folder = tmp_path / "results"
    folder.mkdir()
    (folder / "r.json").write_bytes((fixtures / "smoke__dense-tiny__w1n1-weak__ee7bbe62e331231c.json").read_bytes())
    from benchsuite.results.decoding import read_record

    share = read_record(folder / "r.json").energy.bounds.total.share
    assert main(["carbon", "project", str(folder), "--tokens", "1e9"]) == 0
    assert f"meters: the record's energy is bound to ±{share:.1%}" in capsys.readouterr().out
    assert main(["carbon", "project", str(folder), "--tokens", "1e9", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["energy_bound_share"] == pytest.approx(share)
