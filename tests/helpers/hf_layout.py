"""Hugging Face decoder tensors (weights or gradients) by our GPT's parameter names: the mapping the parity
tests of every family share (tests/test_architectures.py, tests/test_moe_families.py)."""

from __future__ import annotations

from typing import Callable

import torch

from benchsuite.config import ModelConfig


def fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, groups: int) -> torch.Tensor:
    """Separate q, k, v rows (heads in order; weights [rows, H] or biases [rows]) -> our fused rows,
    per key/value head g: [q heads of g, k_g, v_g]."""
    parts = [t.reshape(groups, -1, *t.shape[1:]) for t in (q, k, v)]
    return torch.cat(parts, dim=1).reshape(-1, *q.shape[1:])


def decoder_in_our_layout(hf: dict, cfg: ModelConfig, ffn: Callable[[dict, str], dict]) -> dict:
    """{our name: tensor} from Llama-style names (Llama, Qwen3, Mixtral, Qwen3-MoE, OLMoE): embeddings, norms,
    attention and q/k norms here; each block's FFN by ffn(hf, "model.layers.{i}.") in names under "ffn."."""
    out = {"tok_emb.weight": hf["model.embed_tokens.weight"], "ln_f.weight": hf["model.norm.weight"]}
    if not cfg.tie_embeddings:
        out["head.weight"] = hf["lm_head.weight"]
    for i in range(cfg.layers):
        theirs, ours = f"model.layers.{i}.", f"blocks.{i}."
        attn = theirs + "self_attn."
        out[ours + "ln1.weight"] = hf[theirs + "input_layernorm.weight"]
        out[ours + "ln2.weight"] = hf[theirs + "post_attention_layernorm.weight"]
        out[ours + "attn.qkv.weight"] = fuse_qkv(*(hf[f"{attn}{p}_proj.weight"] for p in "qkv"), cfg.n_kv_heads)
        out[ours + "attn.out.weight"] = hf[attn + "o_proj.weight"]
        if cfg.qk_norm != "none":
            out[ours + "attn.q_norm.weight"] = hf[attn + "q_norm.weight"]
            out[ours + "attn.k_norm.weight"] = hf[attn + "k_norm.weight"]
        out.update({ours + "ffn." + name: t for name, t in ffn(hf, theirs).items()})
    return out
