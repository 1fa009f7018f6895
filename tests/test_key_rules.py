"""Every key either changes the run or is refused naming it (key_rules.py): suites drawn from all keys ×
kinds × routers × layouts either load with every given key held by the record's resolved config, or
fail naming a key they set. The docs' table of where keys apply is the rules' own (drawn at each docs build)."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchsuite.config import SECTIONS, ConfigError, parse_suite
from benchsuite.config.key_rules import RULES, table
from benchsuite.config.presets import PRESETS
from benchsuite.record.types import Config
from helpers import REPO

DRAWS = settings(max_examples=300, deadline=None, derandomize=True, database=None,
                 suppress_health_check=[HealthCheck.too_slow])

# Valid values of each key (the type and range checks pass): what remains is whether the key applies.
VALUES = {
    "model": {"layers": st.sampled_from([2, 4]), "hidden": st.just(64), "heads": st.sampled_from([2, 4]),
              "vocab": st.just(256), "seq_len": st.just(16), "ffn_hidden": st.sampled_from([128, 256]),
              "activation": st.sampled_from(["gelu", "swiglu"]), "norm": st.sampled_from(["layernorm", "rmsnorm"]),
              "norm_eps": st.sampled_from([1e-5, 1e-6]), "position": st.sampled_from(["learned", "rope"]),
              "rope_theta": st.sampled_from([1e4, 5e5]), "kv_heads": st.sampled_from([1, 2]),
              "head_dim": st.sampled_from([16, 32]), "qk_norm": st.sampled_from(["none", "per_head", "full"]),
              "bias": st.booleans(), "tie_embeddings": st.booleans(),
              "preset": st.sampled_from(["gpt3-125m", "llama3-8b", "olmoe-1b-7b"])},
    "train": {"micro_batch": st.sampled_from([4, 8]), "steps": st.just(3), "warmup_steps": st.sampled_from([2, 3]),
              "precision": st.sampled_from(["auto", "fp32"]), "grad_accum": st.sampled_from([1, 2]),
              "recompute": st.sampled_from(["none", "selective", "full"]), "compile": st.booleans(), "seed": st.sampled_from([0, 3]),
              "lr": st.just(1e-3), "eval_every": st.sampled_from([0, 2]), "target_loss": st.just(4.0),
              "timeout_s": st.just(300.0), "data": st.sampled_from(["synthetic", "builtin"])},
    "parallel": {"tensor": st.sampled_from([1, 2]), "zero": st.sampled_from([0, 1, 3]), "expert": st.sampled_from([1, 2]),
                 "pipeline": st.sampled_from([1, 2]), "microbatches": st.sampled_from([2, 4]),
                 "schedule": st.sampled_from(["1f1b", "interleaved", "gpipe"]), "virtual_stages": st.sampled_from([1, 2]),
                 "sequence_parallel": st.booleans(), "first_stage_layers": st.sampled_from([1, 2]),
                 "last_stage_layers": st.sampled_from([1, 2]), "context": st.sampled_from([1, 2]),
                 "expert_tensor": st.sampled_from([1, 2])},
    "moe": {"experts": st.sampled_from([4, 8]), "router": st.sampled_from(["switch", "gshard", "expert_choice",
                                                                           "token_choice"]),
            "top_k": st.sampled_from([1, 2]), "capacity_factor": st.sampled_from([0.0, 1.25]),
            "min_capacity": st.sampled_from([0, 2]), "every": st.sampled_from([1, 2]),
            "expert_hidden": st.sampled_from([32, 64]), "shared_experts": st.sampled_from([0, 1]),
            "score": st.sampled_from(["softmax", "sigmoid"]), "aux_loss_coef": st.sampled_from([0.0, 0.01, 0.1]),
            "z_loss_coef": st.sampled_from([0.0, 1e-3]), "second_expert_policy": st.sampled_from(["all", "random"]),
            "normalize_top_k": st.booleans(), "balance": st.sampled_from(["aux_loss", "aux_free"]),
            "bias_update": st.sampled_from([1e-3, 1e-2]), "routing": st.sampled_from(["learned", "forced"])},
    "energy": {"idle_baseline_s": st.sampled_from([0.0, 1.0]), "min_window_s": st.sampled_from([0.5, 1.0])},
    "carbon": {"pue": st.sampled_from([1.0, 1.2]), "intensity_g_per_kwh": st.sampled_from([0.0, 50.0]),
               "country": st.sampled_from(["FRA", "USA"]), "region": st.just("california"),
               "market_intensity_g_per_kwh": st.sampled_from([0.0, 120.0]),
               "embodied_kg_per_device": st.sampled_from([150.0, 312.5]),
               "device_lifetime_years": st.sampled_from([4.0, 6.0]), "wue_l_per_kwh": st.sampled_from([0.0, 0.5]),
               "water_intensity_l_per_kwh": st.sampled_from([1.0, 3.0])},
}


def test_every_key_of_every_section_is_drawn():
    assert {sec: set(keys) for sec, keys in VALUES.items()} == {
        sec: set(cls.__struct_fields__) for sec, cls in SECTIONS.items()}


@st.composite
def workloads(draw) -> dict:
    kind = draw(st.sampled_from(["dense", "moe"]))
    workload = {"name": "w", "kind": kind}
    for sec, keys in VALUES.items():
        if sec == "moe" and kind != "moe":
            continue
        chosen = draw(st.lists(st.sampled_from(sorted(keys)), unique=True, max_size=len(keys)))
        if chosen:
            workload[sec] = {key: draw(keys[key]) for key in chosen}
    if workload.get("train", {}).get("data") == "builtin":  # byte-level: the vocabulary it needs
        workload.setdefault("model", {})["vocab"] = 512
    if kind == "moe" and draw(st.booleans()):  # a router drawn for every MoE workload half the time
        workload.setdefault("moe", {})["router"] = draw(VALUES["moe"]["router"])
    if draw(st.booleans()):
        workload["sweep"] = {"world_size": draw(st.sampled_from([1, 2, 4]))}
        if draw(st.booleans()):
            workload["sweep"]["seed"] = [1, 2]
    return workload


def _given(workload: dict) -> dict[str, object]:
    return {f"{sec}.{key}": v for sec, table in workload.items() if sec in SECTIONS for key, v in table.items()}


@pytest.mark.heavy  # in this process, a second or more: the full pass runs it, the fast tier does not
@DRAWS
@given(workloads())
def test_a_drawn_suite_is_refused_naming_a_key_it_sets_or_the_record_holds_every_key(workload):
    given_keys = _given(workload)
    try:
        suite = parse_suite({"workload": [workload]}, "drawn.toml")
    except ConfigError as e:
        named = [key for key, _ in e.problems]
        assert all(key.startswith("workload[0] (w)") for key in named), e
        set_here = {*given_keys, "kind", "sweep"}
        preset = PRESETS.get(workload.get("model", {}).get("preset"))
        if preset:  # the preset's values are given too (its name is the key to change)
            set_here |= {f"model.{k}" for k in preset.model} | {f"moe.{k}" for k in preset.moe}
        assert any(key.rpartition(")")[2].lstrip(".").startswith(tuple(set_here)) for key in named), e
        return
    for run in suite.runs:
        config = msgspec.convert(run.to_dict(), Config)  # the record's typed config
        for key, value in given_keys.items():
            sec, _, name = key.partition(".")
            if key == "train.seed" and "seed" in workload.get("sweep", {}):
                pytest.fail("train.seed with a seed sweep loaded: the sweep replaces it")
            assert getattr(getattr(config, sec), name) == value, (key, value, run)


@pytest.mark.parametrize("workload, key, words", [
    ({"parallel": {"schedule": "gpipe"}}, "parallel.schedule", "set pipeline > 1 or remove it"),
    ({"parallel": {"microbatches": 4}}, "parallel.microbatches", "parallel.pipeline is 1"),
    ({"parallel": {"virtual_stages": 2}}, "parallel.virtual_stages", "virtual stages need a pipeline"),
    ({"parallel": {"first_stage_layers": 1}}, "parallel.first_stage_layers", "parallel.pipeline is 1"),
    ({"parallel": {"expert": 2}}, "parallel.expert", "needs kind = \"moe\""),
    ({"parallel": {"sequence_parallel": True}}, "parallel.sequence_parallel", "set tensor > 1 or remove it"),
    ({"kind": "moe", "moe": {"router": "switch", "second_expert_policy": "random"}}, "moe.second_expert_policy",
     "applies to router = \"gshard\""),
    ({"kind": "moe", "moe": {"router": "token_choice", "second_expert_policy": "random"}}, "moe.second_expert_policy",
     "token_choice has no second expert"),
    ({"kind": "moe", "moe": {"router": "expert_choice", "aux_loss_coef": 0.1}}, "moe.aux_loss_coef",
     "balanced by construction"),
    ({"kind": "moe", "moe": {"router": "switch", "top_k": 2}}, "moe.top_k", "is top-1"),
    ({"kind": "moe", "moe": {"every": 1, "expert_hidden": 32}, "model": {"ffn_hidden": 128}}, "model.ffn_hidden",
     "no FFN is ffn_hidden wide"),
    ({"train": {"target_loss": 3.0}}, "train.target_loss", "set eval_every > 0"),
    ({"train": {"seed": 4}, "sweep": {"seed": [1, 2]}}, "train.seed", "the sweep's seed list sets each run's seed"),
    ({"carbon": {"intensity_g_per_kwh": 50.0, "country": "FRA"}}, "carbon.country", "remove country"),
])
def test_a_key_that_changes_nothing_is_refused_naming_it_and_the_fix(workload, key, words):
    with pytest.raises(ConfigError) as e:
        parse_suite({"workload": [{"name": "w", **workload}]})
    problems = dict(e.value.problems)
    assert list(problems) == [f"workload[0] (w).{key}"], problems
    assert words in problems[f"workload[0] (w).{key}"]


@pytest.mark.parametrize("workload", [
    {"parallel": {"expert": 1, "virtual_stages": 1, "schedule": "1f1b"}},  # the defaults: what runs anyway
    {"kind": "moe", "moe": {"router": "gshard", "top_k": 2, "second_expert_policy": "random"}},
    {"kind": "moe", "moe": {"router": "expert_choice", "aux_loss_coef": 0.01, "score": "softmax"}},
    {"train": {"eval_every": 2, "target_loss": 3.0}},
    {"parallel": {"pipeline": 2, "schedule": "gpipe", "microbatches": 2}, "sweep": {"world_size": 2}},
])
def test_a_key_at_what_runs_anyway_or_that_applies_is_accepted(workload):
    assert parse_suite({"workload": [{"name": "w", **workload}]}).runs


def test_an_inherited_key_applies_where_it_applies_and_is_refused_where_it_applies_nowhere():
    suite = parse_suite({"defaults": {"parallel": {"schedule": "gpipe", "microbatches": 4}, "moe": {"top_k": 3}},
                         "workload": [{"name": "dense"},
                                      {"name": "pipe", "parallel": {"pipeline": 2}, "sweep": {"world_size": 2}},
                                      {"name": "tc", "kind": "moe", "moe": {"router": "token_choice"}},
                                      {"name": "sw", "kind": "moe"}]})
    by_name = {r.workload: r for r in suite.runs}
    assert (by_name["pipe"].parallel.schedule, by_name["pipe"].parallel.microbatches) == ("gpipe", 4)
    # where it does not apply the record holds the default, what ran
    assert (by_name["dense"].parallel.schedule, by_name["dense"].parallel.microbatches) == ("1f1b", None)
    assert (by_name["tc"].moe.top_k, by_name["sw"].moe.top_k, by_name["sw"].moe.k) == (3, None, 1)
    with pytest.raises(ConfigError) as e:
        parse_suite({"defaults": {"parallel": {"schedule": "gpipe"}, "moe": {"experts": 4}, "train": {"lr": 0.1}},
                     "workload": [{"name": "a", "train": {"lr": 0.2}}]})
    problems = dict(e.value.problems)
    assert "needs parallel.pipeline > 1" in problems["defaults.parallel.schedule"]
    assert "needs kind = \"moe\"" in problems["defaults.moe.experts"]
    assert "every workload sets its own train.lr" in problems["defaults.train.lr"]


def test_the_suite_carbon_section_is_merged_under_a_workload_carbon_table_key_by_key():
    suite = parse_suite({"carbon": {"country": "FRA", "pue": 1.1},
                         "workload": [{"name": "a", "carbon": {"pue": 1.3}}, {"name": "b"}]})
    assert [(r.carbon.country, r.carbon.pue) for r in suite.runs] == [("FRA", 1.3), ("FRA", 1.1)]


def test_the_docs_table_of_where_keys_apply_is_the_rules_table():
    """The suite-keys page draws the rules' table at each docs build (docs/reference_hook.py; tests/test_docs.py
    renders it)."""
    page = (REPO / "docs" / "reference" / "suite-keys.md").read_text(encoding="utf-8")
    assert "<!-- reference: key-rules -->" in page
    assert table().startswith("| key | applies when |\n|---|---|\n| `")
    assert len(RULES) == len({rule.key for rule in RULES})


@pytest.mark.parametrize("order", [("dense", "moe"), ("moe", "dense")])
def test_an_unused_inherited_keys_reason_is_the_most_specific_whatever_the_workloads_order(order):
    """Once "needs kind = moe" when a dense workload came first, though the suite has an MoE workload: the
    real need there is moe.balance = "aux_free"."""
    workloads = {"dense": {"name": "dense"}, "moe": {"name": "moe", "kind": "moe"}}
    with pytest.raises(ConfigError) as e:
        parse_suite({"defaults": {"moe": {"bias_update": 0.01}}, "workload": [workloads[w] for w in order]})
    reason = dict(e.value.problems)["defaults.moe.bias_update"]
    assert "aux_free" in reason and "kind" not in reason, reason
