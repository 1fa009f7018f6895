"""Presets are the published architectures exactly: every preset's parameter count equals the released
checkpoint's and that of Hugging Face transformers' own model built from the same configuration (on the
meta device, nothing downloaded), and its model FLOPs per token equal torchtitan's formula
(torchtitan/models/utils.py, get_dense_model_nparams_and_flops / get_moe_model_nparams_and_flops) up
to what the two conventions name differently."""

from __future__ import annotations

import functools

import pytest
import torch

from benchsuite.config import ConfigError, ModelConfig, MoEConfig, parse_suite
from benchsuite.config.presets import PRESETS
from benchsuite.metrics.flops import flops_per_token, param_counts

transformers = pytest.importorskip("transformers")


def resolved(name: str, **model) -> tuple[ModelConfig, MoEConfig | None]:
    (run,) = parse_suite({"workload": [{"name": "w", "model": {"preset": name, **model}}]}).runs
    return run.model, run.moe


def hf_model(m: ModelConfig, moe: MoEConfig | None) -> torch.nn.Module:
    """transformers' model of the same architecture, on the meta device."""
    t = transformers
    common = dict(vocab_size=m.vocab, hidden_size=m.hidden, num_hidden_layers=m.layers, num_attention_heads=m.heads,
                  num_key_value_heads=m.n_kv_heads, rms_norm_eps=m.norm_eps, tie_word_embeddings=m.tie_embeddings,
                  max_position_embeddings=m.seq_len)
    with torch.device("meta"):
        if m.preset.startswith("gpt3"):
            return t.GPT2LMHeadModel(t.GPT2Config(vocab_size=m.vocab, n_positions=m.seq_len, n_embd=m.hidden,
                                                  n_layer=m.layers, n_head=m.heads, tie_word_embeddings=True))
        if m.preset.startswith("llama"):
            return t.LlamaForCausalLM(t.LlamaConfig(intermediate_size=m.ffn, **common))
        if m.preset.startswith("mixtral"):
            return t.MixtralForCausalLM(t.MixtralConfig(intermediate_size=m.ffn, num_local_experts=moe.experts,
                                                        num_experts_per_tok=moe.top_k, **common))
        if m.preset.startswith("qwen3"):
            return t.Qwen3MoeForCausalLM(t.Qwen3MoeConfig(moe_intermediate_size=moe.expert_hidden, head_dim=m.head_dim,
                                                          num_experts=moe.experts, num_experts_per_tok=moe.top_k,
                                                          norm_topk_prob=moe.normalize_top_k, **common))
        if m.preset.startswith("olmoe"):
            return t.OlmoeForCausalLM(t.OlmoeConfig(intermediate_size=moe.expert_hidden, num_experts=moe.experts,
                                                    num_experts_per_tok=moe.top_k, **common))
    raise AssertionError(f"no transformers model for {m.preset}")


@functools.cache
def hf_model_of(name: str) -> torch.nn.Module:
    """hf_model of preset `name`, built once for the two tests that count it (a meta-device model is read only)."""
    return hf_model(*resolved(name))


def _count(model: torch.nn.Module, *, where=lambda name: True) -> int:
    return sum(p.numel() for name, p in model.named_parameters() if where(name))


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_a_presets_parameter_count_is_the_published_architectures(name):
    m, moe = resolved(name)
    ours = param_counts(m, moe).total
    assert ours == _count(hf_model_of(name))
    if PRESETS[name].params is not None:
        assert ours == PRESETS[name].params


def _torchtitan_flops(model: torch.nn.Module, m: ModelConfig, moe: MoEConfig | None) -> float:
    """torchtitan/models/utils.py: 6 · (params − embedding, the routed experts scaled by top_k / E) +
    6 · layers · heads · (qk + v head dims) · seq_len, applied to transformers' model of the preset."""
    embedding = _count(model, where=lambda n: "embed_tokens" in n or ".wte." in n or ".wpe." in n)
    experts = 0 if moe is None else _count(model, where=lambda n: ".mlp.experts." in n)
    nparams = _count(model)
    active = nparams - experts + (0 if moe is None else experts * moe.k // moe.experts)
    return 6 * (active - embedding) + 6 * m.layers * m.heads * 2 * m.dim_head * m.seq_len


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_model_flops_per_token_are_torchtitans_formula(name):
    """Equal once the conventions are aligned: torchtitan's parameter count includes norm weights (and
    biases), which ours leaves out as elementwise; a tied LM head is one parameter to torchtitan's count
    (so its matmul drops out with the embedding), while ours counts the head's matmul either way."""
    m, moe = resolved(name)
    ours = flops_per_token(m, moe, micro_batch=1, recompute="none").model
    pc = param_counts(m, moe)
    elementwise = pc.total - pc.matmul - pc.embedding - (0 if m.tie_embeddings else pc.lm_head)
    tied_head = pc.lm_head if m.tie_embeddings else 0
    assert ours + 6 * elementwise - 6 * tied_head == pytest.approx(_torchtitan_flops(hf_model_of(name), m, moe),
                                                                  rel=1e-12)


def test_active_parameters_of_the_moe_presets_are_their_names():
    """Qwen3-30B-A3B activates 3.3B of its 30.5B parameters, OLMoE-1B-7B 1.3B of 6.9B, Mixtral 8x7B 12.9B of 46.7B."""
    for name, active in (("qwen3-30b-a3b", 3.35e9), ("olmoe-1b-7b", 1.28e9), ("mixtral-8x7b", 12.9e9)):
        m, moe = resolved(name)
        assert flops_per_token(m, moe, micro_batch=1, recompute="none").params_active == pytest.approx(active, rel=0.01)


def test_keys_beside_a_preset_override_it_and_the_record_keeps_its_name():
    m, moe = resolved("qwen3-30b-a3b", layers=2, seq_len=64)
    assert (m.preset, m.layers, m.seq_len, m.hidden, m.head_dim, moe.experts, moe.top_k) == \
        ("qwen3-30b-a3b", 2, 64, 2048, 128, 128, 8)
    (run,) = parse_suite({"defaults": {"model": {"preset": "llama3-8b"}},
                          "workload": [{"name": "w", "model": {"layers": 2}, "moe": {"experts": 4}, "kind": "moe"}]}).runs
    assert (run.kind, run.model.layers, run.model.kv_heads, run.moe.experts) == ("moe", 2, 8, 4)  # a dense preset made MoE
    assert run.to_dict()["model"]["preset"] == "llama3-8b"


@pytest.mark.parametrize("preset, words", [
    ("deepseek-v3", "uses multi-head latent attention (low-rank compressed keys and values), which benchsuite does "
                    "not build"),
    ("llama-3-8b", "did you mean 'llama3-8b'?"),
    ("gpt4", "unknown preset 'gpt4'"),
])
def test_a_preset_benchsuite_does_not_build_is_refused_by_name(preset, words):
    with pytest.raises(ConfigError) as e:
        parse_suite({"workload": [{"name": "w", "model": {"preset": preset}}]})
    (problem,) = e.value.problems
    assert problem[0] == "workload[0] (w).model.preset" and words in problem[1]


def test_an_moe_preset_under_kind_dense_is_refused_naming_both():
    with pytest.raises(ConfigError) as e:
        parse_suite({"workload": [{"name": "w", "kind": "dense", "model": {"preset": "mixtral-8x7b"}}]})
    assert dict(e.value.problems)["workload[0] (w).kind"].startswith("model.preset = 'mixtral-8x7b' is a mixture")


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_the_model_benchsuite_builds_has_the_counted_parameters(name):
    """models/transformer.py on the meta device: the model that runs is the architecture counted above."""
    from benchsuite.models.transformer import build_model

    m, moe = resolved(name)
    with torch.device("meta"):
        model = build_model(m, moe)
    assert _count(model) == param_counts(m, moe).total


@pytest.mark.parametrize("name", ["v4-dropless.json", "v4-pipe.json", "v4-zero3.json"])
def test_a_run_from_before_the_architecture_keys_keeps_its_run_key(name):
    """Resume and identities span the upgrade: the run key of a version-4 run's config, upgraded (the new
    keys at their defaults), is the hash version 4 computed of the config it stored."""
    import hashlib
    import json

    from benchsuite.config import RunConfig
    from benchsuite.results.migrate import migrate
    from helpers import REPO

    stored = json.loads((REPO / "tests" / "fixtures" / "versions" / name).read_text())
    hardware = {"gpus": ["NVIDIA H200"], "cpu": "x", "machine": "x86_64"}
    then = hashlib.sha256(json.dumps({"config": stored["config"], "hardware": hardware},
                                     sort_keys=True).encode()).hexdigest()[:16]
    upgraded = migrate(json.loads(json.dumps(stored)))["config"]
    given = {k for k, v in stored["config"]["model"].items() if v is not None}  # a null reads as its default
    assert set(upgraded["model"]) > given  # the new keys are there, at their defaults
    assert RunConfig.from_dict(upgraded).run_key(hardware) == then
