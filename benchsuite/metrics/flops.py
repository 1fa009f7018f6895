"""FLOP accounting: analytic model FLOPs, counted FLOPs, peak table, MFU.

Analytic training FLOPs per token (forward + backward), DESIGN.md:
    6 * (non-embedding matmul params active per token + LM head) + 12 * layers * seq_len * hidden
With full activation recompute each block's forward runs twice: factor 8 and 16 instead of 6
and 12 for the blocks (the LM head is not recomputed), the 96-vs-72 form of Narayanan et al. 2021 ("Efficient Large-Scale Language Model Training
on GPU Clusters", eq. 3). Attention is counted without a causal discount, as in that paper
and in PaLM's MFU (Chowdhery et al. 2022, appendix B).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import torch

from benchsuite.config import ModelConfig, MoEConfig, RunConfig


@dataclass(frozen=True)
class ParamCounts:
    total: int  # every parameter, embeddings and norms included
    embedding: int  # token + position embeddings (lookups: no FLOPs)
    matmul: int  # all matmul weights except the LM head (every expert counted)
    active_matmul: float  # matmul weights one token passes through (top-k experts + router)
    executed_matmul: float  # like active, but with the padded expert slots actually computed
    lm_head: int


def _moe_layer_count(cfg: ModelConfig, moe: MoEConfig | None) -> int:
    return 0 if moe is None else cfg.layers // moe.every


def param_counts(cfg: ModelConfig, moe: MoEConfig | None = None, tokens_per_route: int | None = None) -> ParamCounts:
    """Exact counts for models/transformer.py (no biases; LayerNorm has weight and bias).

    tokens_per_route is the number of tokens one MoE layer routes at once (the local
    micro-batch × seq_len); it sets the capacity and so the executed (padded) expert slots.
    """
    h, f = cfg.hidden, cfg.ffn
    mats = 3 if cfg.activation == "swiglu" else 2
    attn = 4 * h * h
    dense_ffn = mats * h * f
    n_moe = _moe_layer_count(cfg, moe)
    n_dense = cfg.layers - n_moe
    norms = cfg.layers * 4 * h + 2 * h
    embedding = cfg.vocab * h + cfg.seq_len * h
    lm_head = cfg.vocab * h
    matmul = cfg.layers * attn + n_dense * dense_ffn
    active = float(matmul)
    executed = float(matmul)
    if n_moe:
        from benchsuite.models.moe import active_experts_per_token, expected_slots_per_token

        expert = mats * h * (moe.expert_hidden or f)
        router = h * moe.experts
        tokens = tokens_per_route or cfg.seq_len
        matmul += n_moe * (moe.experts * expert + router)
        active += n_moe * (active_experts_per_token(moe) * expert + router)
        executed += n_moe * (expected_slots_per_token(moe, tokens) * expert + router)
    return ParamCounts(total=matmul + lm_head + embedding + norms, embedding=embedding, matmul=matmul,
                       active_matmul=active, executed_matmul=executed, lm_head=lm_head)


def _training_flops(block_params: float, lm_head: int, cfg: ModelConfig, recompute: str) -> float:
    """Full recompute re-runs each block's forward (8 = 2 fwd + 4 bwd + 2 recompute); the LM head
    sits outside the checkpointed blocks and stays at 6 (Narayanan et al.'s V/16lh term)."""
    mult, attn_mult = (8, 16) if recompute == "full" else (6, 12)
    return mult * block_params + 6 * lm_head + attn_mult * cfg.layers * cfg.seq_len * cfg.hidden


def flops_per_token(run: RunConfig) -> dict:
    """Model and executed training FLOPs per token, plus the parameter counts behind them."""
    cfg = run.model
    pc = param_counts(cfg, run.moe, run.micro_batch_per_rank * cfg.seq_len)
    return {
        "model_per_token": _training_flops(pc.active_matmul, pc.lm_head, cfg, run.train.recompute),
        "executed_per_token": _training_flops(pc.executed_matmul, pc.lm_head, cfg, run.train.recompute),
        "params": pc.total,
        "params_active": pc.active_matmul + pc.lm_head + pc.embedding,
        "params_non_embedding": pc.matmul + pc.lm_head,
    }


def _extra_formulas() -> dict:
    """Ops FlopCounterMode does not know: SDPA's CPU flash kernel (same formula as on CUDA)
    and torch._grouped_mm (the expert GEMMs of MoE layers on sm90)."""
    from torch.utils import flop_counter

    def sdpa_forward(q, k, v, *args, out_shape=None, **kwargs):
        return flop_counter.sdpa_flop_count(q, k, v)

    def sdpa_backward(grad_out, q, k, v, *args, out_shape=None, **kwargs):
        return flop_counter.sdpa_backward_flop_count(grad_out, q, k, v)

    def grouped_mm(a, b, *args, out_shape=None, **kwargs):
        # 2D x 2D (weight gradients) contracts over the grouped rows: out [G, K, N]; else out x K.
        if len(a) == 2 and len(b) == 2 and len(out_shape) == 3:
            return 2 * (math.prod(out_shape) // out_shape[0]) * a[-1]
        return 2 * math.prod(out_shape) * a[-1]

    aten = torch.ops.aten
    mapping = {}
    if hasattr(aten, "_scaled_dot_product_flash_attention_for_cpu"):
        mapping[aten._scaled_dot_product_flash_attention_for_cpu] = sdpa_forward
        mapping[aten._scaled_dot_product_flash_attention_for_cpu_backward] = sdpa_backward
    if hasattr(aten, "_grouped_mm"):
        mapping[aten._grouped_mm] = grouped_mm
    return mapping


def flop_counter():
    """A FlopCounterMode that also counts SDPA on CPU and grouped GEMMs; a context manager over one step."""
    from torch.utils.flop_counter import FlopCounterMode

    return FlopCounterMode(display=False, custom_mapping=_extra_formulas())


# Peak dense tensor-core FLOP/s by device and precision (no sparsity), from vendor datasheets:
#   H100 SXM / H200 SXM: NVIDIA H100 and H200 datasheets (989.4 TFLOP/s bf16 dense, 66.9 fp32);
#   H100 PCIe: NVIDIA H100 datasheet (756 bf16, 51 fp32);
#   A100: NVIDIA A100 datasheet (312 bf16, 19.5 fp32);
#   L40S: NVIDIA L40S datasheet (362.05 bf16, 91.6 fp32); L4: NVIDIA L4 datasheet (121 bf16, 30.3 fp32);
#   A10: NVIDIA A10 datasheet (125 bf16, 31.2 fp32); MI300X: AMD Instinct MI300X datasheet (1307.4 bf16, 163.4 fp32).
# Order matters: the first substring that occurs in the device name wins.
PEAK_TFLOPS = [
    ("H200", {"bf16": 989.4, "fp32": 66.9}),
    ("H100 PCIe", {"bf16": 756.0, "fp32": 51.0}),
    ("H100", {"bf16": 989.4, "fp32": 66.9}),
    ("GH200", {"bf16": 989.4, "fp32": 66.9}),
    ("A100", {"bf16": 312.0, "fp32": 19.5}),
    ("L40S", {"bf16": 362.05, "fp32": 91.6}),
    ("L4", {"bf16": 121.0, "fp32": 30.3}),
    ("A10", {"bf16": 125.0, "fp32": 31.2}),
    ("MI300X", {"bf16": 1307.4, "fp32": 163.4}),
]


def peak_flops(device_name: str, precision: str, override_tflops: float | None = None) -> tuple[float | None, str]:
    """(peak FLOP/s or None, source). Unknown hardware gives None and a warning, never a guess."""
    if override_tflops is not None:
        return override_tflops * 1e12, "given"
    for key, table in PEAK_TFLOPS:
        if key in device_name and precision in table:
            return table[precision] * 1e12, f"datasheet:{key}:{precision}"
    warnings.warn(f"no peak FLOP/s known for {device_name!r} at {precision}; MFU is null "
                  "(pass --peak-tflops to set one)", stacklevel=2)
    return None, "unknown device"


def mfu(model_flops_per_s_per_device: float | None, peak: float | None) -> float | None:
    if not model_flops_per_s_per_device or not peak:
        return None
    return model_flops_per_s_per_device / peak
