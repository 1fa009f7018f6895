"""Every view and module classifies an energy source and an MoE router as record/kinds.py does: each is
asked through its own functions, on small inputs, for every Source and every router."""

from __future__ import annotations

import math
import typing
from pathlib import Path

import msgspec
import pytest
import torch

from benchsuite.config import CarbonConfig, MoEConfig
from benchsuite.config.specs import value_problem
from benchsuite.dashboard.data import load
from benchsuite.dashboard.pages import energy as energy_page
from benchsuite.dashboard.pages import quality
from benchsuite.dashboard.style import DROPLESS, KNOWN, family
from benchsuite.energy.attribution import attribute_energy
from benchsuite.energy.bounds import figure_bound
from benchsuite.energy.carbon import record_carbon
from benchsuite.models import moe as moe_model
from benchsuite.record.kinds import ROUTERS, SOURCES, experts_choose, source_kind, weakest, weakness
from benchsuite.record import to_dict
from benchsuite.record.types import Energy, PerWork, Source
from benchsuite.results.compare import estimated_energy
from benchsuite.results.store import load_records
from benchsuite.results.verdicts import SeedGroup, energy_not_measured
from helpers.records import make_record, records_of

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "results"


# -- energy sources ---------------------------------------------------------------------------------------


def test_every_source_is_classified_once_in_the_enums_order_and_each_class_holds_for_every_stronger_source():
    assert list(SOURCES) == list(Source)
    kinds = list(SOURCES.values())
    for stronger, weaker in zip(kinds, kinds[1:]):
        for prop in ("figure", "metered", "measured"):
            assert getattr(stronger, prop) or not getattr(weaker, prop), (stronger.source, weaker.source, prop)
    assert [weakness(s) for s in Source] == list(range(len(Source)))
    assert weakest([]) is Source.UNAVAILABLE and weakest(["measured", "estimated", "sampled"]) is Source.ESTIMATED
    assert source_kind(None) is SOURCES[Source.UNAVAILABLE]


def _group(source: Source) -> SeedGroup:
    return SeedGroup("s", "w", "moe", "switch", "id", "label", (), False, {}, [], energy_source=source)


@pytest.mark.parametrize("source", list(Source))
def test_compare_and_the_verdicts_judge_exactly_the_metered_sources(source):
    kind = SOURCES[source]
    (rec,) = records_of([make_record()])
    by_section = msgspec.structs.replace(rec, energy=Energy(source=source))
    by_metrics = msgspec.structs.replace(rec, energy=None, metrics=msgspec.structs.replace(
        rec.metrics, energy=PerWork(energy_source=source)))
    assert estimated_energy(by_section) is not kind.metered
    assert estimated_energy(by_metrics) is not kind.metered
    assert (energy_not_measured(_group(source), _group(Source.MEASURED)) is None) is kind.metered


@pytest.mark.parametrize("source", list(Source))
def test_a_bound_is_that_of_the_meter_the_source_names(source):
    kind = SOURCES[source]
    figure = {"energy_j": 1000.0 if kind.figure else None, "source": source, "detail": {"cpu_max_w": 200.0}}
    for key in ("gpu", "cpu"):
        bound = figure_bound(figure, 10.0, key)
        assert (bound is None) is not kind.figure
        if bound is None:
            continue
        parts = {p["part"] for p in bound["parts"]}
        assert ("estimate model" in parts) is not kind.metered
        assert ("counter edges" in parts) is kind.measured or (key == "cpu" and kind.metered)
        assert ("part-time sampling" in parts) is (key == "gpu" and kind.metered and not kind.measured)


@pytest.mark.parametrize("source", [s for s in Source if SOURCES[s].figure])
def test_a_shared_devices_reading_is_the_strongest_and_a_sum_as_weak_as_its_weakest(source):
    def rank(r: int, src: Source) -> dict:
        gpu = {"energy_j": 100.0, "source": src, "reason": None, "sampled_energy_j": None, "avg_w": None,
               "idle_w": None, "above_idle_j": None, "detail": {}}
        cpu = {**gpu, "source": Source.MEASURED}
        return {"name": "w", "rank": r, "host": "n1", "window_s": 10.0, "short_window": False, "reasons": [],
                "gpus": [{"uuid": "GPU-a", "name": "g", "cuda_index": 0, "figure": gpu}], "cpu": cpu, "dram": cpu}

    strongest = min(source, Source.SAMPLED, key=weakness)
    section = attribute_energy([rank(0, Source.SAMPLED), rank(1, source)])
    assert section["per_device"][0]["source"] == strongest
    assert section["source"] == weakest([strongest, Source.MEASURED])


def _quality_run_with(source: Source) -> dict:
    rec = to_dict(next(one.record for one in load_records(FIXTURES) if one.path.name == "make_dense-q.json"))
    rec["energy"]["source"] = source
    rec["metrics"]["quality"]["energy_source"] = source
    return rec


@pytest.mark.parametrize("source", list(Source))
def test_the_quality_page_says_not_measured_of_exactly_the_figures_no_view_calls_measured(source):
    kind = SOURCES[source]
    section = quality.render(load([_quality_run_with(source)]))
    curves = next(f for f in section.figures if f.id == "fig-quality-curves")
    flagged = kind.figure and not kind.measured
    assert ("not measured" in curves.layout["annotations"][1]["text"]) is flagged
    assert ("not measured, for:" in section.html) is flagged
    assert (source in quality.NOT_MEASURED.split(" or ")) is flagged


@pytest.mark.parametrize("source", list(Source))
def test_the_energy_page_draws_solid_what_is_measured_and_pale_what_is_not(source):
    kind = SOURCES[source]
    assert (source in energy_page.DRAWN) is kind.figure
    assert (source in energy_page.SOLID) is kind.measured
    shape, opacity = energy_page.look(kind)
    assert (shape == "" and opacity == 1.0) is kind.measured
    assert (opacity < 0.8) is not kind.metered
    rec = _quality_run_with(source)
    rec["energy"]["sources"] = {"gpu": source, "cpu": source, "dram": source}
    fig, _ = energy_page.stacked_figure(load([rec]))
    patterns = {t["marker"]["pattern"]["shape"] for t in fig.data}
    assert patterns == {shape if kind.figure else energy_page.OTHER[0]}


@pytest.mark.parametrize("source", [s for s in Source if SOURCES[s].figure])
def test_carbon_and_its_footprint_count_every_figure_and_carry_its_source_for_the_reader_to_judge(source):
    energy = {"total_j": 3.6e6, "source": source, "window_s": 3600.0, "per_device": [{"uuid": "GPU-a"}]}
    out = record_carbon(energy, CarbonConfig(intensity_g_per_kwh=100.0))
    assert out["energy_source"] == source and out["co2e_g"] == pytest.approx(100.0)
    assert out["embodied"]["devices"] == 1


# -- MoE routers ------------------------------------------------------------------------------------------


def test_only_a_known_router_that_is_no_token_choice_has_experts_choosing_tokens():
    assert {name for name in ROUTERS if experts_choose(name)} == {n for n, k in ROUTERS.items() if not k.token_choice}
    assert not any(experts_choose(x) for x in (None, "", "Expert Choice", ["expert_choice"]))


def test_the_config_accepts_exactly_the_routers_kinds_knows():
    router = next(f for f in msgspec.structs.fields(MoEConfig) if f.name == "router")
    assert set(typing.get_args(router.type)) == set(ROUTERS)
    for name, kind in ROUTERS.items():
        assert value_problem(router, name) is None and MoEConfig(router=name).k == kind.k
    assert value_problem(router, "Expert Choice") == f"must be one of {', '.join(map(repr, ROUTERS))}"


@pytest.mark.parametrize("name", list(ROUTERS))
def test_the_dashboard_styles_every_router_by_its_label_and_its_token_choice(name):
    kind = ROUTERS[name]
    assert family("moe", name, 1.25) == name and KNOWN[name].name == f"MoE · {kind.label}"
    assert family("moe", name, 0.0) == (DROPLESS if kind.token_choice else name)


@pytest.mark.parametrize("name", list(ROUTERS))
def test_the_model_routes_every_router_as_its_kind_says(name):
    kind = ROUTERS[name]
    cfg = MoEConfig(router=name, experts=4, capacity_factor=1.1, aux_loss_coef=0.01)
    tokens = 10
    # token choice rounds its slots up (a token's k choices must fit); expert choice down (each expert's share)
    share = 1.1 * (kind.k or 1) * tokens / cfg.experts
    slots = math.ceil(share) if kind.token_choice else math.floor(share)
    assert moe_model.capacity(cfg, tokens) == slots
    routing = moe_model.route(torch.randn(tokens, cfg.experts), cfg)
    assert tuple(routing.index.shape) == (cfg.experts, slots)
    if kind.token_choice:  # each token chose its k experts before the capacity dropped any
        assert routing.expert_load.sum().item() == kind.k * tokens
        assert moe_model.active_experts_per_token(cfg, tokens) == kind.k
    else:
        assert moe_model.active_experts_per_token(cfg, tokens) == cfg.experts * slots / tokens
    assert moe_model.has_aux_loss(cfg) is kind.token_choice  # expert choice balances by construction
    dropless = msgspec.structs.replace(cfg, capacity_factor=0.0)
    assert (moe_model.layout_impl("padded_bmm", dropless) == "loop_mm") is kind.token_choice


def test_flags_are_headed_and_marked_by_their_kind_in_report_and_dashboard():
    """A noisy-repeat flag was once worded as "figure(s) no real run can produce … treat as wrong", its
    value unlabelled."""
    from benchsuite.dashboard.pages.run import _flags
    from benchsuite.record.kinds import FLAG_KINDS, flag_kind
    from benchsuite.results.report import _status_cell

    noisy = {"field": "repeats", "value": 0.23, "reason": "noisy measurement: seed 0: …", "seeds": [0]}
    wrong = {"field": "metrics.mfu", "value": 1.7, "reason": "above the datasheet peak"}
    assert (flag_kind(noisy).name, flag_kind(wrong).name) == ("noisy", "impossible")
    boxes = {part.split('"')[0]: part for part in _flags({"flags": [noisy, wrong]}).split('<div class="flags flags-')[1:]}
    assert list(boxes) == ["impossible", "noisy"]
    assert FLAG_KINDS["noisy"].heading in boxes["noisy"] and FLAG_KINDS["impossible"].heading not in boxes["noisy"]
    assert "tok/s CV between repeats 23.0%" in boxes["noisy"] and "treat these figures" not in boxes["noisy"]
    assert FLAG_KINDS["impossible"].heading in boxes["impossible"] and "metrics.mfu" in boxes["impossible"]
    assert _status_cell({"status": "ok", "flags": [noisy], "flagged": True}) == "ok ~ noisy"
    assert _status_cell({"status": "ok", "flags": [noisy, wrong], "flagged": True}) == "ok ⚠ flagged ~ noisy"
