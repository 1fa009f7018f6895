"""Published architectures by name: `model.preset = "llama3-8b"` fills [model] (and [moe]) with the
configuration its authors released; any key given beside it overrides that key (fewer layers to fit a
CPU or one GPU), and the record keeps the preset's name beside every resolved value.

Each entry cites the configuration it copies. Total parameter counts are the published ones exactly
(tests/test_presets.py builds each on the meta device beside Hugging Face transformers' own model).
An architecture benchsuite does not build is refused by name, never approximated.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Preset:
    kind: str  # "dense" | "moe"
    model: dict[str, Any]
    source: str  # the configuration copied, and where it differs from the original (nothing left out silently)
    params: int | None = None  # the total parameter count of the released model (its checkpoint's)
    moe: dict[str, Any] = field(default_factory=dict)


def _gpt3(layers: int, hidden: int, heads: int) -> dict[str, Any]:
    """GPT-3 (Brown et al. 2020, table 2.1): GPT-2's block (LayerNorm, learned positions, GELU, biases,
    tied embeddings), 2048 tokens of context, the 50257-token GPT-2 BPE vocabulary, FFN 4 × d_model."""
    return {"layers": layers, "hidden": hidden, "heads": heads, "vocab": 50257, "seq_len": 2048, "activation": "gelu",
            "norm": "layernorm", "position": "learned", "bias": True, "tie_embeddings": True}


_GPT3 = "Brown et al. 2020, Language Models are Few-Shot Learners, table 2.1"
_DENSE_ATTENTION = ("; every layer's attention is dense (the paper alternates dense and locally banded sparse "
                    "patterns, which changes neither parameters nor, at 2048 tokens, the FLOPs convention)")


def _llama3(layers: int, hidden: int, heads: int, ffn: int) -> dict[str, Any]:
    """Llama 3 (Meta's config.json): RMSNorm 1e-5, RoPE theta 500000, 8 key/value heads, SwiGLU, no biases,
    untied LM head, the 128256-token vocabulary, 8192 tokens of context."""
    return {"layers": layers, "hidden": hidden, "heads": heads, "kv_heads": 8, "ffn_hidden": ffn, "vocab": 128256,
            "seq_len": 8192, "activation": "swiglu", "norm": "rmsnorm", "norm_eps": 1e-5, "position": "rope",
            "rope_theta": 500000.0}


def _mixtral(layers: int, hidden: int, heads: int, ffn: int, vocab: int, seq_len: int) -> dict[str, Any]:
    """Mixtral (Mistral AI's config.json): Mistral's block (RMSNorm 1e-5, RoPE theta 1e6, 8 key/value heads,
    SwiGLU) with every FFN an MoE of 8 SwiGLU experts of the FFN's width, top-2, renormalised."""
    return {"layers": layers, "hidden": hidden, "heads": heads, "kv_heads": 8, "ffn_hidden": ffn, "vocab": vocab,
            "seq_len": seq_len, "activation": "swiglu", "norm": "rmsnorm", "norm_eps": 1e-5, "position": "rope",
            "rope_theta": 1e6}


_MIXTRAL_MOE = {"experts": 8, "router": "token_choice", "top_k": 2, "capacity_factor": 0.0, "every": 1,
                "normalize_top_k": True, "aux_loss_coef": 0.02}


def _qwen3_moe(layers: int, hidden: int, heads: int, expert_hidden: int) -> tuple[dict, dict]:
    """Qwen3 MoE (Qwen's config.json): RMSNorm 1e-6, RoPE theta 1e6, 4 key/value heads of head_dim 128 (heads ×
    head_dim ≠ hidden), per-head q/k RMSNorm, every FFN an MoE of 128 fine-grained SwiGLU experts, top-8
    renormalised, no shared expert, the 151936-token vocabulary, 40960 tokens of context."""
    return ({"layers": layers, "hidden": hidden, "heads": heads, "kv_heads": 4, "head_dim": 128, "vocab": 151936,
             "seq_len": 40960, "activation": "swiglu", "norm": "rmsnorm", "norm_eps": 1e-6, "position": "rope",
             "rope_theta": 1e6, "qk_norm": "per_head"},
            {"experts": 128, "router": "token_choice", "top_k": 8, "capacity_factor": 0.0, "every": 1,
             "expert_hidden": expert_hidden, "normalize_top_k": True, "aux_loss_coef": 0.001})


_QWEN3_30B = _qwen3_moe(48, 2048, 32, 768)
_QWEN3_235B = _qwen3_moe(94, 4096, 64, 1536)

PRESETS: dict[str, Preset] = {
    "gpt3-125m": Preset("dense", _gpt3(12, 768, 12), f"{_GPT3}: GPT-3 Small{_DENSE_ATTENTION}", 125_226_240),
    "gpt3-350m": Preset("dense", _gpt3(24, 1024, 16), f"{_GPT3}: GPT-3 Medium{_DENSE_ATTENTION}"),
    "gpt3-760m": Preset("dense", _gpt3(24, 1536, 16), f"{_GPT3}: GPT-3 Large{_DENSE_ATTENTION}"),
    "gpt3-1.3b": Preset("dense", _gpt3(24, 2048, 16), f"{_GPT3}: GPT-3 XL, with 16 heads of 128 (the table's "
                        f"24 heads × 128 would not fit d_model 2048 nor give 1.3B parameters; 16 × 128 is "
                        f"Megatron-LM's GPT-3 1.3B){_DENSE_ATTENTION}"),
    "gpt3-2.7b": Preset("dense", _gpt3(32, 2560, 32), f"{_GPT3}: GPT-3 2.7B{_DENSE_ATTENTION}"),
    "gpt3-6.7b": Preset("dense", _gpt3(32, 4096, 32), f"{_GPT3}: GPT-3 6.7B{_DENSE_ATTENTION}"),
    "gpt3-13b": Preset("dense", _gpt3(40, 5120, 40), f"{_GPT3}: GPT-3 13B, with d_model 5120 (the table's 5140 "
                       f"is not 40 heads × 128){_DENSE_ATTENTION}"),
    "gpt3-175b": Preset("dense", _gpt3(96, 12288, 96), f"{_GPT3}: GPT-3 175B{_DENSE_ATTENTION}"),
    "llama3-8b": Preset("dense", _llama3(32, 4096, 32, 14336), "meta-llama/Meta-Llama-3-8B config.json",
                        8_030_261_248),
    "llama3-70b": Preset("dense", _llama3(80, 8192, 64, 28672), "meta-llama/Meta-Llama-3-70B config.json",
                         70_553_706_496),
    "llama3.1-405b": Preset("dense", _llama3(126, 16384, 128, 53248),
                            "meta-llama/Llama-3.1-405B config.json; its rope_scaling (\"llama3\", factor 8: "
                            "longer-context frequencies) is not applied, which changes no parameter or FLOP",
                            405_853_388_800),
    "mixtral-8x7b": Preset("moe", _mixtral(32, 4096, 32, 14336, 32000, 32768),
                           "mistralai/Mixtral-8x7B-v0.1 config.json", moe=_MIXTRAL_MOE, params=46_702_792_704),
    "mixtral-8x22b": Preset("moe", _mixtral(56, 6144, 48, 16384, 32768, 65536),
                            "mistralai/Mixtral-8x22B-v0.1 config.json", moe=_MIXTRAL_MOE, params=140_630_071_296),
    "qwen3-30b-a3b": Preset("moe", _QWEN3_30B[0], "Qwen/Qwen3-30B-A3B config.json", moe=_QWEN3_30B[1],
                            params=30_532_122_624),
    "qwen3-235b-a22b": Preset("moe", _QWEN3_235B[0], "Qwen/Qwen3-235B-A22B config.json", moe=_QWEN3_235B[1],
                              params=235_093_634_560),
    "olmoe-1b-7b": Preset("moe", {"layers": 16, "hidden": 2048, "heads": 16, "vocab": 50304, "seq_len": 4096,
                                  "activation": "swiglu", "norm": "rmsnorm", "norm_eps": 1e-5, "position": "rope",
                                  "rope_theta": 10000.0, "qk_norm": "full"},
                          "allenai/OLMoE-1B-7B-0924 config.json: RMSNorm over all heads' queries and keys, 64 "
                          "experts of width 1024, top-8 not renormalised",
                          moe={"experts": 64, "router": "token_choice", "top_k": 8, "capacity_factor": 0.0,
                               "every": 1, "expert_hidden": 1024, "normalize_top_k": False, "aux_loss_coef": 0.01},
                          params=6_919_161_856),
}

# Published architectures benchsuite does not build: refused by name with the reason.
NOT_BUILT = {
    "deepseek-v2": "DeepSeek-V2 uses multi-head latent attention (low-rank compressed keys and values)",
    "deepseek-v2-lite": "DeepSeek-V2-Lite uses multi-head latent attention (low-rank compressed keys and values)",
    "deepseek-v3": "DeepSeek-V3 uses multi-head latent attention (low-rank compressed keys and values)",
    "kimi-k2": "Kimi K2 uses DeepSeek-V3's multi-head latent attention",
}


def lookup(name: str) -> tuple[Preset | None, str | None]:
    """(the preset, None) or (None, why it is refused, with the names there are)."""
    if name in PRESETS:
        return PRESETS[name], None
    if name.lower() in NOT_BUILT:
        return None, (f"{NOT_BUILT[name.lower()]}, which benchsuite does not build (a preset is the architecture "
                      f"exactly, never an approximation); presets: {', '.join(PRESETS)}")
    close = [p for p in PRESETS if p.replace(".", "").replace("-", "") == name.lower().replace(".", "").replace("-", "")]
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return None, f"unknown preset {name!r}{hint}; presets: {', '.join(PRESETS)}"
