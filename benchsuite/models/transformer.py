"""A GPT-style decoder you can read in one sitting. No parallelism in here.

Shape legend: B batch, T sequence, H hidden, V vocab, D head dim, F FFN width.
Forward code infers head counts from tensor shapes, so the functions in
benchsuite/parallel/ can shard weights (whole heads per rank) without touching it.
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


class Attention(nn.Module):
    """Causal self-attention through SDPA (flash path on GPU). QKV is one GEMM whose
    output rows are laid out per head as [q_h, k_h, v_h], so a contiguous column
    shard holds whole heads (the Megatron layout)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.head_dim = cfg.hidden // cfg.heads
        self.qkv = nn.Linear(cfg.hidden, 3 * cfg.hidden, bias=False)
        self.out = nn.Linear(cfg.hidden, cfg.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        qkv = self.qkv(x).view(B, T, -1, 3, self.head_dim)  # [B, T, heads, 3, D]
        q, k, v = qkv.permute(3, 0, 2, 1, 4).unbind(0)  # each [B, heads, T, D]
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(B, T, -1))


class Block(nn.Module):
    """Pre-LN block; `ffn` is an MLP or an MoE layer, both returning (output, aux_loss | None,
    RoutingStats | None)."""

    def __init__(self, cfg: ModelConfig, ffn: nn.Module):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.hidden)
        self.attn = Attention(cfg)
        self.ln2 = nn.LayerNorm(cfg.hidden)
        self.ffn = ffn

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None, RoutingStats | None]:
        x = x + self.attn(self.ln1(x))
        y, aux, routing = self.ffn(self.ln2(x))
        return x + y, aux, routing


class GPT(nn.Module):
    def __init__(self, cfg: ModelConfig, moe: MoEConfig | None = None):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab, cfg.hidden)
        self.pos_emb = nn.Embedding(cfg.seq_len, cfg.hidden)
        self.blocks = nn.ModuleList(Block(cfg, make_ffn(cfg, moe, i)) for i in range(cfg.layers))
        self.ln_f = nn.LayerNorm(cfg.hidden)
        self.head = nn.Linear(cfg.hidden, cfg.vocab, bias=False)
        self._init_weights()

    def _init_weights(self) -> None:
        """GPT-2 init: N(0, 0.02), residual output projections scaled by 1/sqrt(2 * layers)."""
        for name, p in self.named_parameters():
            if p.dim() < 2:
                continue
            std = 0.02
            if name.endswith(("attn.out.weight", "down.weight", "w_down")):
                std = 0.02 / math.sqrt(2 * self.cfg.layers)
            nn.init.normal_(p, mean=0.0, std=std)

    def forward(self, idx: torch.Tensor) -> ModelOutput:
        """idx [B, T] token ids -> (logits, summed auxiliary loss, routing stats of the MoE layers)."""
        T = idx.shape[1]
        pos = torch.arange(T, device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(pos)  # [B, T, H]
        aux_total = x.new_zeros((), dtype=torch.float32)
        routing = []
        for block in self.blocks:
            x, aux, stats = block(x)
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
    return MLP(cfg.hidden, cfg.ffn, cfg.activation)


def build_model(cfg: ModelConfig, moe: MoEConfig | None = None, seed: int = 0) -> GPT:
    """Same seed, same weights: the reference every parallel test compares against."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return GPT(cfg, moe)
