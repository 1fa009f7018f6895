"""One sanity rule for every figure with a physical sign or bound (record/types.py `Bound`, record/sanity.py):
each is flagged outside its range, whatever section it sits in, and a projection refuses a flagged input
naming the flag's reason."""

from __future__ import annotations

import copy
import json
from typing import Annotated, get_args, get_origin, get_type_hints

import msgspec
import pytest

from benchsuite import cli
from benchsuite.record import types
from benchsuite.record.sanity import sanity_flags
from helpers.records import make_record

# Figures that may be negative or are not physical quantities: each named with why.
UNBOUNDED = {
    ("PartEnergy", "above_idle_j"): "energy above an idle fit: below zero when the fit exceeds the draw",
    ("DeviceEnergy", "above_idle_j"): "the same, for one GPU",
    ("Energy", "above_idle_j"): "the same, summed",
    ("Carbon", "pue"): ">= 1 by its type: a record with a PUE below 1 is refused on load, naming the field",
    ("StepTime", "ci95"): "an interval's ends",
    ("Env", "ram_total_gb"): "the host, not a figure of the run",
}


def _plain_floats(cls) -> list[tuple[str, str]]:
    """(struct, field) of every float field, or list/dict of floats, declared without a Bound."""
    out = []
    for name, hint in get_type_hints(cls, include_extras=True).items():
        stack = [hint]
        while stack:
            tp = stack.pop()
            if get_origin(tp) is Annotated:
                base, *meta = get_args(tp)
                if base is float and not any(isinstance(m, types.Bound) for m in meta):
                    out.append((cls.__name__, name))
                continue
            stack += [a for a in get_args(tp)]
    return out


def test_every_figure_of_the_record_declares_its_physical_range():
    structs = [c for c in vars(types).values()
               if isinstance(c, type) and issubclass(c, msgspec.Struct) and c is not types.Section
               and not c.__name__.endswith("Config") and c.__name__ not in ("Config", "Flag")]
    missing = sorted(set(f for cls in structs for f in _plain_floats(cls)) - UNBOUNDED.keys())
    assert missing == [], f"float figures without a Bound: {missing}"


def sane() -> dict:
    rec = make_record("sane", world_size=2, tokens_per_s=1000.0, step=0.5)
    rec["metrics"].update(mfu=0.4, hfu=0.5, peak_tflops=989.0, flops={"model_per_token": 1e9},
                          energy={"j_per_token": 0.01, "gco2e_per_mtok": 3.0},
                          moe={"dropped_frac": 0.1, "all_to_all_share": 0.2, "load_max_over_mean": 1.3,
                               "expert_load": [[0.5, 0.5]]},
                          pipeline={"bubble_measured": 0.2, "bubble_per_rank": [0.1, 0.3]},
                          comm={"total_bytes_per_step": 1e6, "bytes_per_step_by_kind": {"all_reduce": 1e6}},
                          quality={"co2e_g": 1.0, "energy_j": 5.0, "curve": [{"step": 0, "val_loss": 5.0}]})
    rec["energy"] = {"total_j": 3000.0, "window_s": 10.0, "per_device": [{"energy_j": 1000.0, "avg_w": 100.0}]}
    rec["carbon"] = {"kwh": 3000.0 / 3.6e6, "pue": 1.1, "intensity_g_per_kwh": 50.0, "co2e_g": 0.05}
    return rec


def test_a_sane_record_with_every_section_has_no_flags():
    assert sanity_flags(sane()) == []


@pytest.mark.parametrize("path, value, field, words", [
    (("carbon", "intensity_g_per_kwh"), -40.0, "carbon.intensity_g_per_kwh", "grid intensity -40 is below 0"),
    (("carbon", "co2e_g"), -1.32, "carbon.co2e_g", "CO2e -1.32 is below 0"),
    (("carbon", "kwh"), -1.0, "carbon.kwh", "below 0"),
    (("metrics", "hfu"), 1.4, "metrics.hfu", "HFU 1.4 exceeds 1"),
    (("metrics", "energy", "gco2e_per_mtok"), -2.0, "metrics.energy.gco2e_per_mtok", "below 0"),
    (("metrics", "flops", "model_per_token"), 0.0, "metrics.flops.model_per_token", "is not above 0"),
    (("metrics", "moe", "dropped_frac"), 1.5, "metrics.moe.dropped_frac", "fraction 1.5 exceeds 1"),
    (("metrics", "moe", "all_to_all_share"), -0.1, "metrics.moe.all_to_all_share", "below 0"),
    (("metrics", "moe", "load_max_over_mean"), 0.5, "metrics.moe.load_max_over_mean", "at least their mean"),
    (("metrics", "pipeline", "bubble_per_rank", 1), 1.2, "metrics.pipeline.bubble_per_rank[1]", "exceeds 1"),
    (("metrics", "comm", "bytes_per_step_by_kind", "all_reduce"), -8.0,
     "metrics.comm.bytes_per_step_by_kind.all_reduce", "bytes -8 is below 0"),
    (("metrics", "quality", "co2e_g"), -3.0, "metrics.quality.co2e_g", "below 0"),
    (("metrics", "quality", "curve", 0, "val_loss"), -1.0, "metrics.quality.curve[0].val_loss", "loss -1"),
    (("energy", "per_device", 0, "avg_w"), -5.0, "energy.per_device[0].avg_w", "average power -5 is below 0"),
    (("energy", "window_s"), 0.0, "energy.window_s", "not above 0"),
])
def test_a_figure_outside_its_physical_range_is_flagged_wherever_it_sits(path, value, field, words):
    rec = sane()
    node = rec
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    flags = sanity_flags(rec)
    assert [f["field"] for f in flags] == [field]
    assert words in flags[0]["reason"] and flags[0]["value"] == value


def test_a_list_of_broken_items_is_one_flag_counting_them():
    rec = sane()
    rec["metrics"]["pipeline"]["bubble_per_rank"] = [0.1, -1.0, -2.0, 0.3]
    (flag,) = sanity_flags(rec)
    assert flag["field"] == "metrics.pipeline.bubble_per_rank[1]" and "(2 of 4 items; the first shown)" in flag["reason"]


def _folder_with(tmp_path, rec: dict):
    from benchsuite.record import write_record

    write_record(tmp_path, rec)
    return tmp_path


def test_carbon_project_refuses_a_negative_intensity_naming_the_flag(tmp_path, capsys):
    rec = sane()
    rec["carbon"].update(intensity_g_per_kwh=-40.0, co2e_g=-0.03)
    folder = _folder_with(tmp_path, rec)
    assert cli.main(["carbon", "project", str(folder), "--tokens", "1e12"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "cannot project: flagged input carbon.intensity_g_per_kwh = -40.0" in text
    assert "t CO2e" not in text
    assert cli.main(["carbon", "project", str(folder), "--tokens", "1e12", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert "grid intensity -40 is below 0" in row["error"] and "co2e_g" not in row
    # given its own intensity, the projection no longer reads the record's: it projects
    assert cli.main(["carbon", "project", str(folder), "--tokens", "1e12", "--intensity", "50", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["co2e_g"] / 1e6 > 0 and row["intensity_g_per_kwh"] == 50.0


def test_a_projection_uses_the_unflagged_seeds_and_names_the_flagged_one(tmp_path, capsys):
    from benchsuite.record import write_record

    good = sane()
    good["config"]["train"] = {"seed": 0}
    bad = copy.deepcopy(good)
    bad["run_key"], bad["config"]["train"] = "bad", {"seed": 1}
    bad["energy"]["total_j"] = -3000.0
    bad["metrics"]["energy"]["j_per_token"] = -0.01
    write_record(tmp_path, good)
    write_record(tmp_path, bad)
    assert cli.main(["carbon", "project", str(tmp_path), "--tokens", "1e12", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["records_projected"] == 1 and row["j_per_token"] == pytest.approx(0.01)
    assert "flagged input metrics.energy.j_per_token = -0.01" in row["records_not_projected"][0]


def test_an_moe_run_that_drops_many_tokens_is_flagged_as_no_like_for_like_comparison(tmp_path, capsys):
    rec = sane()
    rec["metrics"]["moe"]["dropped_frac"] = 0.64
    (flag,) = sanity_flags(rec)
    assert flag["field"] == "metrics.moe.dropped_frac"
    assert "64% of the token assignments were dropped" in flag["reason"] and "not the model's" in flag["reason"]
    rec["metrics"]["moe"]["dropped_frac"] = 0.05  # a little overflow, as capacity factors allow: no flag
    assert sanity_flags(rec) == []
    rec["metrics"]["moe"]["dropped_frac"] = 0.64
    _folder_with(tmp_path, rec)
    assert cli.main(["report", str(tmp_path)]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "ok ⚠" in text and "64% of the token assignments were dropped" in text
