"""Data parallelism: DDP (stage 0) and the ZeRO stages.

Stage 0 is plain DistributedDataParallel: every rank holds full parameters, gradients
and optimizer state, (2 + 2 + K)Ψ bytes in mixed precision (Rajbhandari et al. 2019).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from benchsuite.config import RunConfig
from benchsuite.dist import DistContext


def make_adamw(params, run: RunConfig, device: torch.device) -> torch.optim.Optimizer:
    """AdamW, fused on CUDA (one kernel for all parameters)."""
    return torch.optim.AdamW(params, lr=run.train.lr, betas=(0.9, 0.95), weight_decay=0.1,
                             fused=device.type == "cuda")


def apply_data_parallel(model: nn.Module, run: RunConfig, ctx: DistContext):
    """(model, optimizer, implementation name) for `parallel.zero`."""
    if ctx.dims.dp_enabled:
        model = DDP(model, device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None,
                    process_group=ctx.dp_group)
        name = "DistributedDataParallel"
    else:
        name = "single process"
    return model, make_adamw(model.parameters(), run, ctx.device), name
