"""The architectures of models/transformer.py against Hugging Face transformers' own models.

Each case builds a tiny Hugging Face model from a config (no download), gives its norms and biases
random values (its init leaves them at one and zero, where a wrong mapping would not show), copies
every weight into ours (q_proj, k_proj and v_proj fused into our grouped QKV rows; GPT-2's Conv1D
weights transposed), runs both in fp32 on one batch and compares, as relative error ‖a − b‖ / ‖b‖
≤ 1e-5: the logits, the loss and every gradient (Hugging Face's gradients mapped into our layout by
the same function as its weights).

- LlamaForCausalLM: RMSNorm, RoPE (theta 500000, Llama 3's), grouped-query attention (4 query heads,
  2 key/value heads), SwiGLU, no biases; untied and tied LM head.
- Qwen3ForCausalLM (dense): head_dim 16 with heads × head_dim (64) ≠ hidden (32), RMSNorm of each
  query and key head before RoPE.
- GPT2LMHeadModel, GPT-3's layout: LayerNorm, learned positions, GELU tanh ("gelu_new"), biases in
  every projection, tied LM head.
- OlmoeForCausalLM with one expert: its router's softmax over a single expert is exactly 1, so the
  sparse block is one SwiGLU MLP and the model is our dense one with "full" query/key norm (RMSNorm
  over all query heads' width and all key heads' width); grouped-query attention too. The MoE parts
  of OLMoE are tested with the MoE layer.

Differences that stay below the tolerance: Hugging Face runs attn_implementation="eager" (scores,
additive causal mask, softmax, one matmul each), ours SDPA (on CPU its math kernel); Hugging Face
computes the RoPE tables each forward from position ids, ours once at construction, both in fp32
with the same operations; Hugging Face's RMSNorm is written out, ours is torch.nn.RMSNorm. The
largest relative errors seen (torch 2.13 CPU, transformers 5.24): logits 2e-7, loss 0 (equal),
gradients 6e-7.
"""

from __future__ import annotations

from msgspec.structs import replace
from typing import Callable

import pytest
import torch
import torch.nn.functional as F

from benchsuite.config import ModelConfig
from helpers.hf_layout import decoder_in_our_layout, fuse_qkv
from benchsuite.models.transformer import build_model

transformers = pytest.importorskip("transformers")

TOL = 1e-5
BATCH = 2
BASE = dict(layers=2, hidden=32, heads=4, vocab=64, seq_len=16, ffn_hidden=48)
LLAMA = ModelConfig(**BASE, activation="swiglu", norm="rmsnorm", norm_eps=1e-6, position="rope",
                    rope_theta=500000.0, kv_heads=2)
QWEN3 = replace(LLAMA, rope_theta=1000000.0, head_dim=16, qk_norm="per_head")
GPT3 = ModelConfig(**BASE, bias=True, tie_embeddings=True)
OLMOE = replace(LLAMA, norm_eps=1e-5, rope_theta=10000.0, qk_norm="full")


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach(), b.detach()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


# ------------------------------------------------------------------ Hugging Face models from our configs

def llama_family_kwargs(cfg: ModelConfig) -> dict:
    """The config keys LlamaConfig, Qwen3Config and OlmoeConfig share, from ours."""
    return dict(vocab_size=cfg.vocab, hidden_size=cfg.hidden, intermediate_size=cfg.ffn, num_hidden_layers=cfg.layers,
                num_attention_heads=cfg.heads, num_key_value_heads=cfg.n_kv_heads, head_dim=cfg.dim_head,
                max_position_embeddings=cfg.seq_len, rms_norm_eps=cfg.norm_eps, hidden_act="silu",
                rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
                tie_word_embeddings=cfg.tie_embeddings, attention_bias=cfg.bias, use_cache=False,
                attn_implementation="eager", pad_token_id=None, bos_token_id=None,
                eos_token_id=None)  # no padding row (OLMoE's is 1), no special ids outside the tiny vocabulary


def hf_llama(cfg: ModelConfig):
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**llama_family_kwargs(cfg), mlp_bias=cfg.bias))


def hf_qwen3(cfg: ModelConfig):
    return transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**llama_family_kwargs(cfg)))


def hf_olmoe(cfg: ModelConfig):
    return transformers.OlmoeForCausalLM(transformers.OlmoeConfig(**llama_family_kwargs(cfg), num_experts=1,
                                                                  num_experts_per_tok=1))


def hf_gpt2(cfg: ModelConfig):
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=cfg.vocab, n_positions=cfg.seq_len, n_embd=cfg.hidden, n_layer=cfg.layers, n_head=cfg.heads,
        n_inner=cfg.ffn, activation_function="gelu_new", layer_norm_epsilon=cfg.norm_eps, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=cfg.tie_embeddings, use_cache=False,
        attn_implementation="eager", bos_token_id=None, eos_token_id=None))


# ------------------------------------------------------------------ their tensors in our layout

def dense_ffn(hf: dict, layer: str) -> dict:
    """A block's dense FFN (Llama, Qwen3), or OLMoE's one expert ([gate; up] rows, then down)."""
    if layer + "mlp.experts.gate_up_proj" in hf:
        gate, up = hf[layer + "mlp.experts.gate_up_proj"][0].chunk(2, dim=0)
        return {"gate.weight": gate, "up.weight": up, "down.weight": hf[layer + "mlp.experts.down_proj"][0]}
    return {f"{p}.weight": hf[f"{layer}mlp.{p}_proj.weight"] for p in ("gate", "up", "down")}


def from_llama_family(hf: dict, cfg: ModelConfig) -> dict:
    """{our parameter name: tensor} from Llama/Qwen3/OLMoE names (their weights or their gradients)."""
    return decoder_in_our_layout(hf, cfg, dense_ffn)


def linear_layout(t: torch.Tensor) -> torch.Tensor:
    """A Conv1D weight [in, out] as a Linear's [out, in]; a bias as it is."""
    return t.mT if t.dim() == 2 else t


def from_gpt2(hf: dict, cfg: ModelConfig) -> dict:
    """{our parameter name: tensor} from GPT-2 names. Conv1D keeps weights [in, out]: transposed;
    c_attn's columns are [all q heads, all k heads, all v heads]."""
    out = {"tok_emb.weight": hf["transformer.wte.weight"], "pos_emb.weight": hf["transformer.wpe.weight"],
           "ln_f.weight": hf["transformer.ln_f.weight"], "ln_f.bias": hf["transformer.ln_f.bias"]}
    for i in range(cfg.layers):
        theirs, ours = f"transformer.h.{i}.", f"blocks.{i}."
        for p in ("weight", "bias"):
            out[f"{ours}ln1.{p}"] = hf[f"{theirs}ln_1.{p}"]
            out[f"{ours}ln2.{p}"] = hf[f"{theirs}ln_2.{p}"]
            qkv = linear_layout(hf[f"{theirs}attn.c_attn.{p}"]).chunk(3, dim=0)
            out[f"{ours}attn.qkv.{p}"] = fuse_qkv(*qkv, cfg.heads)
            out[f"{ours}attn.out.{p}"] = linear_layout(hf[f"{theirs}attn.c_proj.{p}"])
            out[f"{ours}ffn.up.{p}"] = linear_layout(hf[f"{theirs}mlp.c_fc.{p}"])
            out[f"{ours}ffn.down.{p}"] = linear_layout(hf[f"{theirs}mlp.c_proj.{p}"])
    return out


# ------------------------------------------------------------------ the comparison

def randomize_vectors(model: torch.nn.Module) -> None:
    """Norm weights around one and biases around zero, so each reaches the comparison with a value of its own."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.normal_(mean=1.0 if name.endswith("weight") else 0.0, std=0.1)


def compare(cfg: ModelConfig, make_hf: Callable, to_ours: Callable) -> dict[str, float]:
    """Relative errors of logits, loss and the worst gradient (with its name) of ours vs Hugging Face's."""
    torch.manual_seed(0)
    hf = make_hf(cfg)
    assert hf.config._attn_implementation == "eager"
    randomize_vectors(hf)
    ours = build_model(cfg)
    weights = to_ours(dict(hf.named_parameters()), cfg)
    assert set(weights) == {n for n, _ in ours.named_parameters()}, "the mapping must cover every parameter"
    with torch.no_grad():
        for name, p in ours.named_parameters():
            p.copy_(weights[name])
    x = torch.randint(0, cfg.vocab, (BATCH, cfg.seq_len))
    y = torch.randint(0, cfg.vocab, (BATCH, cfg.seq_len))
    logits, ref_logits = ours(x).logits, hf(input_ids=x).logits
    loss, ref_loss = (F.cross_entropy(t.flatten(0, 1), y.flatten()) for t in (logits, ref_logits))
    loss.backward()
    ref_loss.backward()
    ref_grads = to_ours({n: p.grad for n, p in hf.named_parameters() if p.grad is not None}, cfg)
    grads = {n: rel(p.grad, ref_grads[n]) for n, p in ours.named_parameters()}
    worst = max(grads, key=grads.get)
    return {"logits": rel(logits, ref_logits), "loss": rel(loss, ref_loss), "grads": grads[worst], "worst": worst}


CASES = {
    "llama": (LLAMA, hf_llama, from_llama_family),
    "llama_tied": (replace(LLAMA, tie_embeddings=True), hf_llama, from_llama_family),
    "qwen3": (QWEN3, hf_qwen3, from_llama_family),
    "gpt3_style_gpt2": (GPT3, hf_gpt2, from_gpt2),
    "olmoe_one_expert": (OLMOE, hf_olmoe, from_llama_family),
}


@pytest.mark.parametrize("name", CASES)
def test_matches_hugging_face(name):
    err = compare(*CASES[name])
    assert err["logits"] <= TOL and err["loss"] <= TOL, f"{name}: {err}"
    assert err["grads"] <= TOL, f"{name}: gradient of {err['worst']} off by {err['grads']:.2e}"


def test_architecture_keys_shape_the_model():
    """What each key builds: no position table with RoPE (its tables are buffers outside the
    checkpoint), one parameter for a tied head, Qwen3's attention widths, biases only where asked."""
    llama = build_model(replace(LLAMA, tie_embeddings=True))
    assert llama.pos_emb is None and not any("rope" in k for k in llama.state_dict())
    assert llama.head.weight is llama.tok_emb.weight
    assert "head.weight" not in dict(llama.named_parameters())
    attn = build_model(QWEN3).blocks[0].attn
    assert attn.qkv.weight.shape == ((4 + 2 * 2) * 16, 32) and attn.out.weight.shape == (32, 4 * 16)
    assert attn.q_norm.weight.shape == attn.k_norm.weight.shape == (16,)
    assert {n for n, _ in build_model(GPT3).named_parameters() if n.endswith("bias")} >= \
        {"blocks.0.attn.qkv.bias", "blocks.0.attn.out.bias", "blocks.0.ffn.up.bias", "blocks.0.ffn.down.bias"}
    assert all(b.abs().sum() == 0 for n, b in build_model(GPT3).named_parameters() if n.endswith("qkv.bias"))


def test_full_recompute_gives_the_same_gradients():
    """Activation checkpointing re-runs each block with its rotary tables: same loss and gradients."""
    from benchsuite.parallel import apply_activation_checkpointing

    x = torch.randint(0, LLAMA.vocab, (BATCH, LLAMA.seq_len))
    grads = []
    for recompute in (False, True):
        model = build_model(QWEN3)
        if recompute:
            apply_activation_checkpointing(model, preserve_rng_state=False)
        F.cross_entropy(model(x).logits.flatten(0, 1), x.flatten()).backward()
        grads.append({n.replace("_checkpoint_wrapped_module.", ""): p.grad for n, p in model.named_parameters()})
    assert grads[0].keys() == grads[1].keys()
    assert all(torch.equal(grads[0][n], grads[1][n]) for n in grads[0])
