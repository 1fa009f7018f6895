"""The dense FFN and its nonlinearity, shared by the decoder's MLP blocks and the MoE experts
(models/moe.py), so a dense run and an expert compute the same function."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def ffn_activation(up: torch.Tensor, gate: torch.Tensor | None) -> torch.Tensor:
    """The FFN nonlinearity of every dense MLP and expert: GELU (tanh approx.) of up, or SwiGLU
    silu(gate) * up when there is a gate projection."""
    return F.silu(gate) * up if gate is not None else F.gelu(up, approximate="tanh")


class MLP(nn.Module):
    """The dense FFN: GELU (up, down) or SwiGLU (gate, up, down); bias: GPT-2/3's biases on each."""

    def __init__(self, hidden: int, ffn: int, activation: str, bias: bool = False):
        super().__init__()
        self.activation = activation
        self.up = nn.Linear(hidden, ffn, bias=bias)
        self.gate = nn.Linear(hidden, ffn, bias=bias) if activation == "swiglu" else None
        self.down = nn.Linear(ffn, hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        """(output, no aux loss, no routing stats): the MoE layer's signature."""
        gate = self.gate(x) if self.gate is not None else None
        return self.down(ffn_activation(self.up(x), gate)), None, None
