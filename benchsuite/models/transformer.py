"""A decoder-only transformer you can read in one sitting. No parallelism in here.

The defaults build the GPT-2-style decoder (LayerNorm, learned positions, multi-head attention,
GELU MLP, no biases, untied LM head); ModelConfig's architecture keys turn it into the models
people train now: RMSNorm, rotary positions (RoPE), grouped-query attention (kv_heads < heads),
a head width of its own (head_dim), RMSNorm of queries and keys (qk_norm), GPT-2/3 biases and a
tied LM head. tests/test_architectures.py holds each against Hugging Face's implementation.

Shape legend: B batch, T sequence, H hidden, V vocab, D head dim, F FFN width, G key/value heads
(groups), R query heads per group (heads / kv_heads).
Forward code infers head counts from tensor shapes, so the functions in
benchsuite/parallel/ can shard weights (whole groups of heads per rank) without touching it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from benchsuite.config import ModelConfig, MoEConfig
from benchsuite.models.ffn import MLP

if TYPE_CHECKING:
    from benchsuite.models.moe import RoutingStats


class ModelOutput(NamedTuple):
    logits: torch.Tensor  # [B, T, V]
    aux_loss: torch.Tensor  # [] fp32, summed over MoE layers (0 without any loss term)
    routing: tuple[RoutingStats, ...]  # one per MoE layer, in block order (empty for a dense model)


class Rope(NamedTuple):
    """The rotary tables of positions 0..T-1, each [T, D]."""

    cos: torch.Tensor
    sin: torch.Tensor


def make_norm(cfg: ModelConfig, width: int) -> nn.Module:
    """The block and final norm: LayerNorm (weight and bias) or RMSNorm (weight only)."""
    if cfg.norm == "rmsnorm":
        return nn.RMSNorm(width, eps=cfg.norm_eps)
    return nn.LayerNorm(width, eps=cfg.norm_eps)


class RotaryTables(nn.Module):
    """cos/sin of rotary positions (Su et al. 2021) in Hugging Face Llama's convention: frequencies
    1/theta^(2i/D) for i < D/2, each used by the two halves of a head (not by interleaved pairs),
    computed once in fp32. Non-persistent buffers: moved with the model, never in a checkpoint."""

    def __init__(self, head_dim: int, theta: float, max_len: int):
        super().__init__()
        inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)  # [D/2]
        freqs = torch.outer(torch.arange(max_len, dtype=torch.float32), inv_freq)  # [T, D/2]
        angles = torch.cat((freqs, freqs), dim=-1)  # [T, D]
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, seq_len: int) -> Rope:
        return Rope(self.cos[:seq_len], self.sin[:seq_len])


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """[x1, x2] -> [-x2, x1] over the last dimension's halves."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, rope: Rope) -> torch.Tensor:
    """x [B, heads, T, D] rotated by position; the tables take x's dtype (bf16 under autocast), so
    queries, keys and values reach attention in one dtype."""
    cos, sin = rope.cos.to(x.dtype), rope.sin.to(x.dtype)
    return x * cos + rotate_half(x) * sin


class AttentionCore(nn.Module):
    """softmax(Q·Kᵀ/√D)·V, causal, through SDPA (flash path on GPU): Megatron's "core attention", a
    module of its own (no weights) so that selective recompute can checkpoint exactly this part
    (parallel/__init__.py). q [B, heads, T, D], k and v [B, G, T, D] -> [B, heads, T, D]."""

    def __init__(self, grouped: bool):
        super().__init__()
        self.grouped = grouped

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.grouped)


class Attention(nn.Module):
    """Causal self-attention (the core through SDPA), grouped-query when kv_heads < heads.

    QKV is one GEMM whose output rows are laid out per key/value head g as
    [q heads of group g (R × D), k_g (D), v_g (D)], so a contiguous column shard holds whole groups
    (with kv_heads = heads: [q_h, k_h, v_h] per head, the Megatron layout). Query head h uses key/value
    head h // R, as Hugging Face's repeat_kv and SDPA's enable_gqa have it.

    qk_norm "per_head" (Qwen3): RMSNorm over each head's D, one weight [D] shared by the heads;
    "full" (OLMoE): RMSNorm over the concatenated heads, weights [heads·D] and [kv_heads·D]. Both
    before RoPE."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.head_dim = cfg.dim_head
        self.group = cfg.heads // cfg.n_kv_heads  # R: fixed by the model, so a shard of whole groups keeps it
        q_width, kv_width = cfg.heads * self.head_dim, cfg.n_kv_heads * self.head_dim
        self.qkv = nn.Linear(cfg.hidden, q_width + 2 * kv_width, bias=cfg.bias)
        self.core = AttentionCore(grouped=self.group > 1)
        self.out = nn.Linear(q_width, cfg.hidden, bias=cfg.bias)
        self.qk_norm = cfg.qk_norm
        if cfg.qk_norm != "none":
            per_head = cfg.qk_norm == "per_head"
            self.q_norm = nn.RMSNorm(self.head_dim if per_head else q_width, eps=cfg.norm_eps)
            self.k_norm = nn.RMSNorm(self.head_dim if per_head else kv_width, eps=cfg.norm_eps)

    def split_heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [B, T, H] -> q [B, T, G·R, D], k and v [B, T, G, D], q and k normalised when asked."""
        B, T, _ = x.shape
        qkv = self.qkv(x).view(B, T, -1, self.group + 2, self.head_dim)  # [B, T, G, R + 2, D]
        q = qkv[:, :, :, : self.group].flatten(2, 3)  # [B, T, G·R, D]
        k, v = qkv[:, :, :, self.group], qkv[:, :, :, self.group + 1]  # each [B, T, G, D]
        if self.qk_norm == "per_head":
            q, k = self.q_norm(q), self.k_norm(k)
        elif self.qk_norm == "full":
            q = self.q_norm(q.flatten(2)).view(q.shape)
            k = self.k_norm(k.flatten(2)).view(k.shape)
        return q, k, v

    def forward(self, x: torch.Tensor, rope: Rope | None) -> torch.Tensor:
        B, T, _ = x.shape
        q, k, v = (t.transpose(1, 2) for t in self.split_heads(x))  # [B, heads, T, D], k and v [B, G, T, D]
        if rope is not None:
            q, k = apply_rope(q, rope), apply_rope(k, rope)
        y = self.core(q, k, v)
        return self.out(y.transpose(1, 2).reshape(B, T, -1))  # [B, T, heads·D] -> [B, T, H]


class Block(nn.Module):
    """Pre-norm block; `ffn` is an MLP or an MoE layer, both returning (output, aux_loss | None,
    RoutingStats | None). forward takes the rotary tables (None with learned positions)."""

    def __init__(self, cfg: ModelConfig, ffn: nn.Module):
        super().__init__()
        self.ln1 = make_norm(cfg, cfg.hidden)
        self.attn = Attention(cfg)
        self.ln2 = make_norm(cfg, cfg.hidden)
        self.ffn = ffn

    def forward(self, x: torch.Tensor,
                rope: Rope | None) -> tuple[torch.Tensor, torch.Tensor | None, RoutingStats | None]:
        x = x + self.attn(self.ln1(x), rope)
        y, aux, routing = self.ffn(self.ln2(x))
        return x + y, aux, routing


def embed(tok_emb: nn.Embedding, pos_emb: nn.Embedding | None, idx: torch.Tensor) -> torch.Tensor:
    """idx [B, T] -> [B, T, H]: the token embedding, plus the position embedding when positions are
    learned (the model's and the first pipeline stage's input)."""
    x = tok_emb(idx)
    if pos_emb is not None:
        x = x + pos_emb(torch.arange(idx.shape[1], device=idx.device))
    return x


class GPT(nn.Module):
    """Token embedding (+ learned positions), the blocks, the final norm and the LM head. With
    position = "rope" there is no position table: `rope` holds the rotary tables every block reads."""

    def __init__(self, cfg: ModelConfig, moe: MoEConfig | None = None):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab, cfg.hidden)
        self.pos_emb = nn.Embedding(cfg.seq_len, cfg.hidden) if cfg.position == "learned" else None
        self.rope = RotaryTables(cfg.dim_head, cfg.rope_theta, cfg.seq_len) if cfg.position == "rope" else None
        self.blocks = nn.ModuleList(Block(cfg, make_ffn(cfg, moe, i)) for i in range(cfg.layers))
        self.ln_f = make_norm(cfg, cfg.hidden)
        self.head = nn.Linear(cfg.hidden, cfg.vocab, bias=False)
        if cfg.tie_embeddings:
            self.head.weight = self.tok_emb.weight
        self._init_weights()

    def _init_weights(self) -> None:
        """GPT-2 init: N(0, 0.02), residual output projections scaled by 1/sqrt(2 * layers), Linear
        biases zero (norms keep their ones and zeros). A tied weight is one parameter, drawn once."""
        for name, p in self.named_parameters():
            if p.dim() < 2:
                continue
            std = 0.02
            if name.endswith(("attn.out.weight", "down.weight", "w_down")):
                std = 0.02 / math.sqrt(2 * self.cfg.layers)
            nn.init.normal_(p, mean=0.0, std=std)
        for module in self.modules():
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor) -> ModelOutput:
        """idx [B, T] token ids -> (logits, summed auxiliary loss, routing stats of the MoE layers)."""
        x = embed(self.tok_emb, self.pos_emb, idx)  # [B, T, H]
        rope = self.rope(idx.shape[1]) if self.rope is not None else None
        aux_total = x.new_zeros((), dtype=torch.float32)
        routing = []
        for block in self.blocks:
            x, aux, stats = block(x, rope)
            if aux is not None:
                aux_total = aux_total + aux
            if stats is not None:
                routing.append(stats)
        return ModelOutput(self.head(self.ln_f(x)), aux_total, tuple(routing))


def is_moe_layer(layer_index: int, moe: MoEConfig | None) -> bool:
    """MoE takes the FFN slot of every `every`-th block (blocks every-1, 2*every-1, ...)."""
    return moe is not None and (layer_index + 1) % moe.every == 0


def make_ffn(cfg: ModelConfig, moe: MoEConfig | None, layer_index: int) -> nn.Module:
    if is_moe_layer(layer_index, moe):
        from benchsuite.models.moe import MoELayer

        return MoELayer(cfg, moe)
    return MLP(cfg.hidden, cfg.ffn, cfg.activation, bias=cfg.bias)


def build_model(cfg: ModelConfig, moe: MoEConfig | None = None, seed: int = 0) -> GPT:
    """Same seed, same weights: the reference every parallel test compares against."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return GPT(cfg, moe)
