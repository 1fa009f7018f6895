"""FLOP accounting: model and hardware FLOPs per token, counted FLOPs, peak table, MFU and HFU.

Model FLOPs, the numerator of MFU, count the work the model needs, whatever the implementation
does to run it (PaLM, Chowdhery et al. 2022, appendix B; torchtitan; Korthikanti et al. 2022):
never activation recompute, never padding. Per token, forward + backward:
    6 · (non-embedding matmul parameters active per token + LM head) + 12 · layers · seq_len · heads · head_dim
(torchtitan's `get_dense_model_nparams_and_flops`, torchtitan/models/utils.py: 6 · (params − embedding) +
12 · l · h · q · t; grouped-query attention's smaller K/V projections are counted as they are, and the attention
term uses the heads' width heads × head_dim, which is `hidden` only where head_dim = hidden / heads).
The LM head is counted whether or not it shares the embedding's weight (the matmul runs either way); biases
and norms are elementwise, not counted.
MoE layers count the router, the shared experts and the routed experts a token uses: k for the
token-choice routers (switch 1, gshard 2, token_choice top_k), and for expert choice the
E · ⌊cf · N / E⌋ slots of a call shared by its N tokens. Attention is counted
without a causal discount, as in PaLM and Narayanan et al. 2021 (eq. 3).

Hardware FLOPs, the numerator of HFU, count what the device executes in the eager step:
- the expert slots the expert GEMMs compute: padded_bmm every E · C slot, grouped_mm only the
  filled ones (rows past offs[-1] are never computed); dropless layers (sorted rows, loop_mm or
  grouped_mm) compute each of the N · k assignments once, no padding: their hardware expert FLOPs
  are the model's;
- the fused attention backward (flash / memory-efficient / the CPU flash kernel) recomputes the
  scores Q·Kᵀ from the saved log-sum-exp: 2 · seq_len · hidden more per layer;
- with recompute = "selective", the attention core's forward (Q·Kᵀ and the weighted sum of V,
  4 · seq_len · heads · head_dim per token and layer) that the checkpoint re-runs in backward;
- with recompute = "full", the forward the non-reentrant checkpoint re-runs in backward. Its early
  stop ends the re-run once the last tensor saved for backward is rebuilt: in a dense block that is
  the input of the FFN down-projection (a matmul saves its inputs before it runs), so that GEMM is
  never re-run; in an MoE block the combine saves the token index after the experts (shared
  experts run before the router), so the whole block re-runs. The LM head sits outside the
  checkpointed blocks. Compiled graphs recompute what the partitioner chooses; the figure
  describes the eager checkpoint.
FlopCounterMode over a real step counts the same work (tests/test_flops.py checks both).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from benchsuite.config import ModelConfig, MoEConfig


@dataclass(frozen=True)
class ParamCounts:
    total: int  # every parameter, embeddings and norms included
    embedding: int  # token + position embeddings (lookups: no FLOPs)
    matmul: int  # all matmul weights except the LM head (every expert counted)
    active_matmul: float  # matmul weights one token passes through (its experts + router)
    executed_matmul: float  # like active, but with the expert slots the expert GEMMs compute
    lm_head: int
    dense_down: int  # the dense blocks' FFN down-projections (the checkpoint never re-runs them)
    moe_layers: int
    expert: int  # matmul weights of one expert, routed or shared (0 without MoE)


def _moe_layer_count(cfg: ModelConfig, moe: MoEConfig | None) -> int:
    """MoE layers of the model (models.transformer.is_moe_layer: every `every`-th block)."""
    return 0 if moe is None else cfg.layers // moe.every


def attention_matmul(cfg: ModelConfig) -> int:
    """One block's attention weights: q and out (heads × head_dim wide), k and v (kv_heads × head_dim)."""
    return 2 * cfg.hidden * cfg.heads * cfg.dim_head + 2 * cfg.hidden * cfg.n_kv_heads * cfg.dim_head


def one_norm_params(cfg: ModelConfig) -> int:
    """One hidden-width norm's weights (LayerNorm's bias too)."""
    return 2 * cfg.hidden if cfg.norm == "layernorm" else cfg.hidden


def _norm_params(cfg: ModelConfig) -> int:
    """Norm weights: two per block and a final one, and the q/k norms."""
    qk = {"none": 0, "per_head": 2 * cfg.dim_head, "full": (cfg.heads + cfg.n_kv_heads) * cfg.dim_head}[cfg.qk_norm]
    return (2 * cfg.layers + 1) * one_norm_params(cfg) + cfg.layers * qk


def _bias_params(cfg: ModelConfig, n_dense: int) -> int:
    """With bias = true, the attention projections' and the dense FFNs' biases (GPT-2/3)."""
    if not cfg.bias:
        return 0
    attn = (cfg.heads + 2 * cfg.n_kv_heads) * cfg.dim_head + cfg.hidden
    ffn = (2 if cfg.activation == "swiglu" else 1) * cfg.ffn + cfg.hidden
    return cfg.layers * attn + n_dense * ffn


def param_counts(cfg: ModelConfig, moe: MoEConfig | None = None, tokens_per_route: int | None = None,
                 slot_share: float = 1.0) -> ParamCounts:
    """Exact counts for models/transformer.py.

    tokens_per_route is the number of tokens one MoE layer routes at once (the local micro-batch
    × seq_len); it sets the capacity C and so the E · C expert slots. slot_share is the share of
    those slots the expert GEMMs compute (see flops_per_token).
    """
    h, f = cfg.hidden, cfg.ffn
    mats = 3 if cfg.activation == "swiglu" else 2
    attn = attention_matmul(cfg)
    dense_ffn = mats * h * f
    n_moe = _moe_layer_count(cfg, moe)
    n_dense = cfg.layers - n_moe
    elementwise = _norm_params(cfg) + _bias_params(cfg, n_dense)
    embedding = cfg.vocab * h + (cfg.seq_len * h if cfg.position == "learned" else 0)
    lm_head = cfg.vocab * h
    matmul = cfg.layers * attn + n_dense * dense_ffn
    active = float(matmul)
    executed = float(matmul)
    expert = 0
    if n_moe:
        from benchsuite.models.moe import active_experts_per_token, expected_slots_per_token

        expert = mats * h * (moe.expert_hidden or f)
        router = h * moe.experts
        tokens = tokens_per_route or cfg.seq_len
        shared = moe.shared_experts * expert  # dense over every token
        matmul += n_moe * (moe.experts * expert + shared + router)
        active += n_moe * (active_experts_per_token(moe, tokens) * expert + shared + router)
        executed += n_moe * (expected_slots_per_token(moe, tokens) * slot_share * expert + shared + router)
    unique_head = 0 if cfg.tie_embeddings else lm_head  # a tied head is the embedding's weight
    return ParamCounts(total=matmul + unique_head + embedding + elementwise, embedding=embedding, matmul=matmul,
                       active_matmul=active, executed_matmul=executed, lm_head=lm_head, dense_down=n_dense * h * f,
                       moe_layers=n_moe, expert=expert)


@dataclass(frozen=True)
class TokenFlops:
    """Training FLOPs per token (forward + backward) and the parameter counts behind them."""

    model: float  # MFU's: what the model needs (module docstring)
    hardware: float  # HFU's: what the device executes, recompute and computed padding included
    params: int
    params_active: float
    params_non_embedding: int


@dataclass(frozen=True)
class FlopParts:
    """FLOPs per token split by the kernels that run them, so a step-time model can give each its own
    rate (benchsuite.predict): the weight matmuls and the attention core (Q·Kᵀ and the weighted sum of V),
    each as the model needs it and as the device executes it, and what recompute adds to each."""

    matmul: float  # model: 6 · (active matmul parameters + LM head)
    attention: float  # model: 12 · layers · seq_len · heads · head_dim
    executed_matmul: float  # hardware: 6 · (executed matmul parameters + LM head), computed padding included
    fused_attention_backward: float  # the fused attention backward's recomputed Q·Kᵀ
    recompute_matmul: float  # the weight matmuls the checkpoint re-runs
    recompute_attention: float  # the attention core it re-runs

    @property
    def model(self) -> float:
        return self.matmul + self.attention

    @property
    def hardware(self) -> float:
        return (self.executed_matmul + self.attention + self.fused_attention_backward + self.recompute_matmul
                + self.recompute_attention)


def flop_parts(cfg: ModelConfig, moe: MoEConfig | None, *, micro_batch: int, recompute: str,
               slot_share: float = 1.0, whole_block_recompute: bool = False) -> FlopParts:
    """FLOPs per token by kernel (arguments as flops_per_token). recompute: "none" | "selective" (the
    attention core re-run, Korthikanti et al. 2022) | "full". whole_block_recompute: the checkpoint re-runs
    every GEMM of the block (Megatron-LM's reentrant checkpoint) instead of stopping before the dense FFN
    down-projection (benchsuite's non-reentrant one, module docstring)."""
    if recompute not in ("none", "selective", "full"):
        raise ValueError(f"recompute must be none, selective or full, got {recompute!r}")
    pc = param_counts(cfg, moe, micro_batch * cfg.seq_len, slot_share)
    scores = cfg.layers * cfg.seq_len * cfg.heads * cfg.dim_head  # Q·Kᵀ per token and layer: s·heads·D MACs
    rerun = pc.executed_matmul - (0 if whole_block_recompute else pc.dense_down)
    return FlopParts(matmul=6 * (pc.active_matmul + pc.lm_head), attention=12 * scores,
                     executed_matmul=6 * (pc.executed_matmul + pc.lm_head), fused_attention_backward=2 * scores,
                     recompute_matmul=2 * rerun if recompute == "full" else 0.0,
                     recompute_attention=4 * scores if recompute != "none" else 0.0)


def flops_per_token(cfg: ModelConfig, moe: MoEConfig | None, *, micro_batch: int, recompute: str,
                    slot_share: float = 1.0) -> TokenFlops:
    """Model and hardware FLOPs per token of one run (formulas in the module docstring).

    micro_batch: sequences per rank per micro-step (RunConfig.micro_batch_per_rank: with seq_len, the
    tokens an MoE layer routes at once); recompute: train.recompute. slot_share: the share of the
    E · C expert slots that the expert GEMMs compute. 1 for padded_bmm (every slot) and for a run not
    yet measured; for grouped_mm the filled share, 1 - padding_frac, which only a run can measure
    (computed_slot_share).
    """
    pc = param_counts(cfg, moe, micro_batch * cfg.seq_len, slot_share)
    parts = flop_parts(cfg, moe, micro_batch=micro_batch, recompute=recompute, slot_share=slot_share)
    return TokenFlops(model=parts.model, hardware=parts.hardware, params=pc.total,
                      params_active=pc.total - pc.matmul + pc.active_matmul,  # all but the experts a token skips
                      params_non_embedding=pc.matmul + pc.lm_head)


def computed_slot_share(expert_impl: str | None, padding_frac: float | None) -> float:
    """Share of the expert slots a run's expert GEMMs computed: grouped_mm skips the empty slots
    (padding_frac of them, measured on the last step), padded_bmm computes every one."""
    if expert_impl == "grouped_mm" and padding_frac is not None:
        return 1.0 - padding_frac
    return 1.0


def hardware_basis(moe: MoEConfig | None, *, recompute: str, expert_impl: str | None) -> str:
    """What metrics.flops.hardware_per_token counts for a run with these sections, in words."""
    parts = ["analytic, eager step: fused attention backward recomputes Q·Kᵀ"]
    if recompute == "full":
        parts.append("full recompute of each block, less the dense FFN down-projection (checkpoint early stop)")
    elif recompute == "selective":
        parts.append("selective recompute: each attention core's forward (Q·Kᵀ and ·V) again in backward")
    if moe is not None and moe.dropless:
        parts.append(f"each routed assignment once, no padding (dropless, {expert_impl or 'sorted rows'})")
    elif moe is not None:
        parts.append("filled expert slots only (grouped_mm; filled share of the last step)"
                     if expert_impl == "grouped_mm" else "every expert slot, padding included (padded_bmm)")
    return "; ".join(parts)


def record_flops(model: float | None, hardware: float | None, hardware_source: str,
                 counted: float | None, counted_source: str | None) -> dict:
    """A record's metrics.flops: FLOPs per token by each count (hardware_per_token replaces
    schema 1's executed_per_token)."""
    return {"model_per_token": model, "hardware_per_token": hardware, "hardware_source": hardware_source,
            "counted_per_token": counted, "counted_source": counted_source}


def rate_figures(model_per_device: float | None, hardware_per_device: float | None, peak: float | None) -> dict:
    """A record's FLOP-rate figures from achieved FLOP/s per device: TFLOP/s and utilisation of the
    peak, by model FLOPs (tflops_per_device, mfu: the field's convention) and by hardware FLOPs
    (hardware_tflops_per_device, hfu)."""
    return {"tflops_per_device": None if model_per_device is None else model_per_device / 1e12,
            "hardware_tflops_per_device": None if hardware_per_device is None else hardware_per_device / 1e12,
            "mfu": mfu(model_per_device, peak), "hfu": mfu(hardware_per_device, peak)}


def _extra_formulas() -> dict:
    """Ops FlopCounterMode does not know: SDPA's CPU flash kernel (same formula as on CUDA)
    and torch._grouped_mm (the expert GEMMs of MoE layers on sm90)."""
    from torch.utils import flop_counter

    def sdpa_forward(q, k, v, *args, out_shape=None, **kwargs):
        return flop_counter.sdpa_flop_count(q, k, v)

    def sdpa_backward(grad_out, q, k, v, *args, out_shape=None, **kwargs):
        return flop_counter.sdpa_backward_flop_count(grad_out, q, k, v)

    aten = torch.ops.aten
    mapping = {}
    if hasattr(aten, "_scaled_dot_product_flash_attention_for_cpu"):
        mapping[aten._scaled_dot_product_flash_attention_for_cpu] = sdpa_forward
        mapping[aten._scaled_dot_product_flash_attention_for_cpu_backward] = sdpa_backward
    if hasattr(aten, "_grouped_mm"):
        mapping[aten._grouped_mm] = grouped_mm_flops
    return mapping


def grouped_mm_flops(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor | None = None, *args,
                     out_val: torch.Tensor | None = None, **kwargs) -> int:
    """FLOPs torch._grouped_mm computes: only the groups' rows up to offs[-1] (rows past it are
    never computed, so empty expert slots cost nothing). Takes the tensors themselves (_get_raw)
    to read offs: one host sync, in the counted step only.

    [M, K] x [G, K, N] (forward, input gradient): the first offs[-1] rows of the output;
    [K, M] x [M, N] -> [G, K, N] (weight gradient): the contraction over the first offs[-1] rows;
    [G, M, K] x [K, N] -> [M, N]: the first offs[-1] columns; no offs (3D x 3D): every batch."""
    if offs is None:
        return 2 * out_val.numel() * a.shape[-1]
    filled = int(offs[-1])
    if a.dim() == 2 and b.dim() == 3:
        return 2 * filled * a.shape[1] * b.shape[2]
    if a.dim() == 2:
        return 2 * a.shape[0] * filled * b.shape[1]
    return 2 * a.shape[1] * a.shape[2] * filled


grouped_mm_flops._get_raw = True  # FlopCounterMode passes tensors, not shapes


def flop_counter():
    """A FlopCounterMode that also counts SDPA on CPU and grouped GEMMs; a context manager over one step."""
    from torch.utils.flop_counter import FlopCounterMode

    return FlopCounterMode(display=False, custom_mapping=_extra_formulas())


@dataclass(frozen=True)
class Peak:
    """Dense (no sparsity) peak TFLOP/s of one part, from its vendor datasheet. bf16 is also the
    fp16 figure on every part here. fp32 is plain FP32, not TF32 (torch leaves TF32 matmuls off);
    on AMD parts the FP32 matrix rate. None: the vendor publishes no figure."""

    part: str
    names: tuple[str, ...]  # the device names NVML / torch.cuda report for it
    bf16: float | None
    fp32: float | None
    source: str


# NVIDIA datasheets give Tensor Core rates "with sparsity"; the dense figure is half of it.
PEAKS = (
    Peak("A100", ("NVIDIA A100-SXM4-40GB", "NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM-80GB", "NVIDIA A100-PCIE-40GB",
                  "NVIDIA A100-PCIE-80GB", "NVIDIA A100 80GB PCIe"), 312.0, 19.5,
         "NVIDIA A100 Tensor Core GPU datasheet (PCIe and SXM, 40 and 80 GB): BF16/FP16 312 (624 sparse), FP32 19.5"),
    Peak("A10", ("NVIDIA A10",), 125.0, 31.2,
         "NVIDIA A10 Tensor Core GPU datasheet: BF16/FP16 125 (250 sparse), FP32 31.2"),
    Peak("A10G", ("NVIDIA A10G",), None, None,
         "no vendor datasheet: NVIDIA publishes no A10G figures (an AWS part, clocks and SMs differ from the A10's)"),
    Peak("L4", ("NVIDIA L4",), 121.0, 30.3,
         "NVIDIA L4 Tensor Core GPU datasheet: BF16/FP16 242 sparse (121 dense), FP32 30.3"),
    Peak("L40", ("NVIDIA L40",), 181.05, 90.5, "NVIDIA L40 GPU datasheet: BF16/FP16 181.05 (362.1 sparse), FP32 90.5"),
    Peak("L40S", ("NVIDIA L40S",), 362.05, 91.6, "NVIDIA L40S GPU datasheet: BF16/FP16 362.05 (733 sparse), FP32 91.6"),
    Peak("H100 SXM", ("NVIDIA H100 80GB HBM3",), 989.5, 67.0,
         "NVIDIA H100 Tensor Core GPU datasheet, H100 SXM: BF16/FP16 1,979 sparse (989.5 dense), FP32 67"),
    Peak("H100 PCIe", ("NVIDIA H100 PCIe",), 756.5, 51.0,
         "NVIDIA H100 Tensor Core GPU datasheet, H100 PCIe: BF16/FP16 1,513 sparse (756.5 dense), FP32 51"),
    Peak("H100 NVL", ("NVIDIA H100 NVL",), 835.5, 60.0,
         "NVIDIA H100 Tensor Core GPU datasheet, H100 NVL: BF16/FP16 1,671 sparse (835.5 dense), FP32 60"),
    Peak("H200 SXM", ("NVIDIA H200",), 989.5, 67.0,
         "NVIDIA H200 Tensor Core GPU datasheet, H200 SXM: BF16/FP16 1,979 sparse (989.5 dense), FP32 67"),
    Peak("H200 NVL", ("NVIDIA H200 NVL",), 835.5, 60.0,
         "NVIDIA H200 Tensor Core GPU datasheet, H200 NVL: BF16/FP16 1,671 sparse (835.5 dense), FP32 60"),
    Peak("GH200", ("NVIDIA GH200 480GB", "NVIDIA GH200 144G HBM3e"), 989.5, 67.0,
         "NVIDIA GH200 Grace Hopper Superchip datasheet, GPU: BF16/FP16 1,979 sparse (989.5 dense), FP32 67"),
    Peak("B200", ("NVIDIA B200",), 2250.0, 75.0,
         "NVIDIA HGX B200 datasheet, 8 GPUs: BF16/FP16 36 PFLOPS sparse (2,250 TFLOP/s dense per GPU), "
         "FP32 600 (75 per GPU)"),
    Peak("MI250X", ("AMD Instinct MI250X",), 383.0, 95.7,
         "AMD Instinct MI250X datasheet: BF16/FP16 383 (no sparsity on CDNA 2), FP32 matrix 95.7"),
    Peak("MI300X", ("AMD Instinct MI300X",), 1307.4, 163.4,
         "AMD Instinct MI300X datasheet: BF16/FP16 1,307.4 (2,614.9 sparse), FP32 matrix 163.4"),
)


def normalise_device_name(name: str) -> str:
    """Case and runs of whitespace do not matter; every other character does ("L4" is not "L40")."""
    return " ".join(name.split()).casefold()


PEAK_BY_NAME = {normalise_device_name(n): p for p in PEAKS for n in p.names}


def lookup_peak(device_name: str, precision: str, option: str = "--peak-tflops") -> tuple[float | None, str]:
    """(peak FLOP/s or None, source) for one exact device name; no guess for a name not in PEAKS. option: how
    the caller's user gives a peak of their own (the CLI's flag, measure()'s argument), named in the fix."""
    peak = PEAK_BY_NAME.get(normalise_device_name(device_name))
    if peak is None:
        return None, (f"unknown device: {device_name!r} is not in the peak table (benchsuite/metrics/flops.py); "
                      f"pass {option}")
    tflops = {"bf16": peak.bf16, "fp32": peak.fp32}.get(precision)
    if tflops is None:
        return None, f"no {precision} figure for {peak.part}: {peak.source}; pass {option}"
    return tflops * 1e12, f"datasheet: {peak.part} {precision} dense ({peak.source})"


def peak_flops(device_name: str, precision: str, override_tflops: float | None = None,
               option: str = "--peak-tflops") -> tuple[float | None, str]:
    """(peak FLOP/s or None, source). Unknown hardware gives None and a warning, never a guess; option: how
    the user gives their own peak (lookup_peak)."""
    if override_tflops is not None:
        return override_tflops * 1e12, f"given ({option})"
    peak, source = lookup_peak(device_name, precision, option)
    if peak is None:
        warnings.warn(f"no peak FLOP/s for {device_name!r} at {precision}, MFU and HFU are null: {source}",
                      stacklevel=2)
    return peak, source


def mfu(flops_per_s_per_device: float | None, peak: float | None) -> float | None:
    """Achieved FLOP/s per device / peak FLOP/s: MFU with model FLOPs, HFU with hardware FLOPs."""
    if not flops_per_s_per_device or not peak:
        return None
    return flops_per_s_per_device / peak
