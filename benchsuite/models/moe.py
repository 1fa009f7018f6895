"""Mixture-of-experts FFN: three routers, stacked experts, dispatch and combine.

Plain PyTorch with no ranks inside; benchsuite/parallel/expert.py swaps the experts
for their local shard and adds the all-to-all.

Shape legend: N tokens (B*T of the local batch), E experts, C capacity (slots per
expert), H hidden, F expert FFN width, A assignments (token, expert pairs).

Every router returns a `Routing` in the same slot layout: expert e's slot c holds
token `index[e, c]` when `mask[e, c]`, and its output enters that token with weight
`weight[e, c]`. Slots fill from c = 0, so the filled slots of each expert are a prefix.
Capacities come from static shapes (Python ints), so the padded path never waits
on the device.

Ties: every top-k here is a stable descending sort, so equal scores go to the
lower index (lower expert for switch/gshard, earlier token for expert choice).
torch.topk does not promise an order for equal values, hence the sort.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from benchsuite.config import ModelConfig, MoEConfig

EXPERT_IMPLS = ("padded_bmm", "grouped_mm")
_MILLION = 1_000_000


# ----------------------------------------------------------------------------- sizes

def capacity(moe: MoEConfig, tokens: int) -> int:
    """Slots per expert C for `tokens` routed tokens, clamped to [1, tokens].

    switch: ceil(cf * N / E); gshard: ceil(2 * cf * N / E) (GShard's 2N/E scaled by
    the capacity factor); expert_choice: k = floor(cf * N / E), the tokens each expert
    takes. Integer arithmetic on cf in millionths (1.1 is 1100000 / 10**6), so float
    noise never adds a slot and torch.compile traces it without a break.
    """
    millionths = round(moe.capacity_factor * _MILLION) * (2 if moe.router == "gshard" else 1)
    num, den = millionths * tokens, _MILLION * moe.experts
    c = num // den if moe.router == "expert_choice" else -(-num // den)
    return max(1, min(tokens, c))


def expected_slots_per_token(moe: MoEConfig, tokens: int) -> float:
    """Expert slots executed per token, padding included: E * C / N (for executed FLOPs)."""
    return moe.experts * capacity(moe, tokens) / tokens


def active_experts_per_token(moe: MoEConfig, tokens: int) -> float:
    """Experts a token uses in the model-FLOP count: 1 (switch), 2 (gshard); expert choice fills
    all E * floor(cf * N / E) slots of a call of N tokens, E * C / N per token (not cf)."""
    if moe.router == "expert_choice":
        return expected_slots_per_token(moe, tokens)
    return 1.0 if moe.router == "switch" else 2.0


# ----------------------------------------------------------------------------- routing

class RoutingStats(NamedTuple):
    """One MoE layer call's routing figures: detached tensors, read from the device only when the
    caller wants them (no host sync in the step). Returned by the layer, not kept on it, so a
    checkpointed and compiled block has no attribute write to trace."""

    dropped_frac: torch.Tensor  # 0-d, defined per router
    padding_frac: torch.Tensor  # 0-d, empty slots / (E * C)
    load_max_over_mean: torch.Tensor  # 0-d, of expert_load
    aux_loss: torch.Tensor  # 0-d, coefficient applied
    z_loss: torch.Tensor  # 0-d, coefficient applied
    expert_load: torch.Tensor  # [E] assignments per expert before capacity


SCALAR_STATS = ("dropped_frac", "padding_frac", "load_max_over_mean", "aux_loss", "z_loss")


@dataclass
class Routing:
    """One layer call's routing in slot layout (see the module docstring)."""

    index: torch.Tensor  # [E, C] int64 token in each slot (0 in empty slots)
    mask: torch.Tensor  # [E, C] bool, slot holds a token
    weight: torch.Tensor  # [E, C] fp32 combine weight, 0 in empty slots; carries the router gradient
    expert_load: torch.Tensor  # [E] fp32 assignments per expert before capacity
    dropped_frac: torch.Tensor  # 0-d fp32, defined per router
    aux_loss: torch.Tensor  # 0-d fp32, coefficient applied
    z_loss: torch.Tensor  # 0-d fp32, coefficient applied

    @property
    def capacity(self) -> int:
        return self.index.shape[1]

    def stats(self) -> RoutingStats:
        load = self.expert_load.detach()
        return RoutingStats(self.dropped_frac.detach(), 1.0 - self.mask.float().mean(), load.max() / load.mean(),
                            self.aux_loss.detach(), self.z_loss.detach(), load)


def _top(scores: torch.Tensor, k: int, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k along dim with ties to the lower index (a stable sort keeps equal values in index order)."""
    values, indices = torch.sort(scores, dim=dim, descending=True, stable=True)
    return values.narrow(dim, 0, k), indices.narrow(dim, 0, k)


def _z_loss(logits: torch.Tensor, moe: MoEConfig) -> torch.Tensor:
    """Router z-loss (ST-MoE): coef * mean over tokens of logsumexp(logits)^2."""
    return moe.z_loss_coef * torch.logsumexp(logits, dim=-1).pow(2).mean()


def _balance_loss(probs: torch.Tensor, top1: torch.Tensor, moe: MoEConfig) -> torch.Tensor:
    """Switch load-balancing loss coef * E * sum_i f_i * P_i; f_i (top-1 share) carries no gradient."""
    counts = torch.zeros_like(probs).scatter_(1, top1.unsqueeze(1), 1.0)  # [N, E]
    return moe.aux_loss_coef * moe.experts * (counts.mean(0) * probs.mean(0)).sum()


def _queue_position(expert: torch.Tensor, chosen: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Position of each token in its expert's queue in token order, and assignments per expert.

    expert [N] int64, chosen [N] bool (unchosen rows take no place) -> (pos [N] int64, load [E] int64).
    The one-hot is [E, N] so the cumsum runs along contiguous rows: on an H200 an [N, E]
    cumsum over dim 0 took a quarter of a switch layer's forward + backward.
    """
    onehot = torch.zeros(num_experts, expert.shape[0], dtype=torch.int32, device=expert.device)
    onehot.scatter_(0, expert.unsqueeze(0), chosen.unsqueeze(0).int())  # [E, N]
    pos = (onehot.cumsum(1, dtype=torch.int32) - 1).gather(0, expert.unsqueeze(0)).squeeze(0)
    return pos.long(), onehot.sum(1)


def _fill_slots(token, expert, pos, keep, gate, num_experts: int, cap: int):
    """Scatter assignments (all [A]) into [E, C] slots; the rejected go to a discard slot E*C."""
    slot = torch.where(keep, expert * cap + pos, num_experts * cap)  # [A]
    size = num_experts * cap + 1
    index = torch.zeros(size, dtype=torch.int64, device=token.device).scatter(0, slot, token)
    mask = torch.zeros(size, dtype=torch.bool, device=token.device).scatter(0, slot, keep)
    weight = torch.zeros(size, dtype=torch.float32, device=token.device).scatter(0, slot, gate)
    return (index[:-1].view(num_experts, cap), mask[:-1].view(num_experts, cap),
            weight[:-1].view(num_experts, cap))


def switch_route(logits: torch.Tensor, moe: MoEConfig) -> Routing:
    """Top-1 (Switch Transformer). logits [N, E] fp32.

    Each token goes to its argmax expert with weight = its softmax prob; an expert
    keeps its first C tokens in token order, later ones are dropped (zero MoE output,
    they pass on the residual path). dropped_frac = dropped tokens / N.
    """
    n, e = logits.shape
    cap = capacity(moe, n)
    probs = logits.softmax(-1)  # [N, E]
    gate, expert = (t.squeeze(1) for t in _top(probs, 1, dim=1))  # [N]
    chosen = torch.ones_like(expert, dtype=torch.bool)
    pos, load = _queue_position(expert, chosen, e)
    keep = pos < cap
    token = torch.arange(n, device=logits.device)
    index, mask, weight = _fill_slots(token, expert, pos, keep, gate, e, cap)
    return Routing(index, mask, weight, load.float(), 1.0 - keep.float().mean(),
                   _balance_loss(probs, expert, moe), _z_loss(logits, moe))


def gshard_route(logits: torch.Tensor, moe: MoEConfig, generator: torch.Generator | None = None) -> Routing:
    """Top-2 (GShard). logits [N, E] fp32.

    The two gates are renormalised over the pair. All top-1 assignments take their
    expert's slots before any top-2 assignment (GShard order), each group in token
    order; an assignment is dropped only when its expert is full. With
    second_expert_policy = "random" the 2nd expert is kept with probability
    min(1, 2 * g2) (g2 renormalised); a skipped 2nd expert is not a drop and the
    token keeps weight g1 alone. The draw uses `generator`, or the global RNG when
    None, which activation checkpointing restores on recompute (a private generator
    would draw again and route differently). dropped_frac = dropped assignments /
    (N + kept 2nd assignments). The aux loss uses the top-1 assignment.
    """
    n, e = logits.shape
    cap = capacity(moe, n)
    probs = logits.softmax(-1)  # [N, E]
    gates, experts = _top(probs, 2, dim=1)  # [N, 2]
    gates = gates / gates.sum(-1, keepdim=True)
    e1, e2 = experts.unbind(1)
    all_tokens = torch.ones(n, dtype=torch.bool, device=logits.device)
    if moe.second_expert_policy == "random":
        draw = torch.rand(n, generator=generator, device=logits.device)
        chosen2 = draw < 2.0 * gates[:, 1].detach()
    else:
        chosen2 = all_tokens
    pos1, load1 = _queue_position(e1, all_tokens, e)
    pos2, load2 = _queue_position(e2, chosen2, e)
    pos2 = pos2 + load1[e2]  # top-2 queues start after every top-1 assignment of that expert
    keep = torch.cat([pos1 < cap, chosen2 & (pos2 < cap)])  # [2N]
    token = torch.arange(n, device=logits.device).repeat(2)
    index, mask, weight = _fill_slots(token, experts.t().reshape(-1), torch.cat([pos1, pos2]), keep,
                                      gates.t().reshape(-1), e, cap)
    assigned = n + chosen2.sum()
    return Routing(index, mask, weight, (load1 + load2).float(), 1.0 - keep.sum() / assigned,
                   _balance_loss(probs, e1, moe), _z_loss(logits, moe))


def expert_choice_route(logits: torch.Tensor, moe: MoEConfig) -> Routing:
    """Expert choice (Zhou et al. 2022). logits [N, E] fp32.

    Scores are the softmax over experts per token; each expert takes its top
    k = capacity(moe, N) = floor(cf * N / E) (at least 1) tokens, weight = the score.
    A token may be taken by several experts or by none; dropped_frac = share of tokens
    taken by none. No balancing loss (every expert has exactly k tokens, which is its
    expert_load); the z-loss still applies. Routing over the whole local batch in a
    causal decoder lets later tokens change which experts an earlier token gets: the
    model sees the future through the router, so its loss is not a valid LM loss.
    """
    n, e = logits.shape
    k = capacity(moe, n)
    probs = logits.softmax(-1)  # [N, E]
    weight, index = _top(probs.t(), k, dim=1)  # [E, k]
    taken = torch.zeros(n, dtype=torch.bool, device=logits.device).scatter(0, index.reshape(-1), True)
    load = torch.full((e,), float(k), device=logits.device)
    return Routing(index, torch.ones_like(index, dtype=torch.bool), weight, load,
                   1.0 - taken.float().mean(), logits.new_zeros(()), _z_loss(logits, moe))


def route(logits: torch.Tensor, moe: MoEConfig, generator: torch.Generator | None = None) -> Routing:
    """Dispatch to the router named by moe.router. logits [N, E] fp32."""
    if moe.router == "switch":
        return switch_route(logits, moe)
    if moe.router == "gshard":
        return gshard_route(logits, moe, generator)
    return expert_choice_route(logits, moe)


# ----------------------------------------------------------------------------- experts

def _activate(up: torch.Tensor, gate: torch.Tensor | None) -> torch.Tensor:
    """The dense MLP's activations: GELU (tanh approx.) or SwiGLU."""
    return F.silu(gate) * up if gate is not None else F.gelu(up, approximate="tanh")


def select_expert_impl(device: torch.device, dtype: torch.dtype) -> str:
    """grouped_mm where its fast kernel exists (CUDA sm90+, bf16); padded_bmm everywhere else."""
    if (hasattr(torch, "_grouped_mm") and device.type == "cuda" and dtype == torch.bfloat16
            and torch.cuda.get_device_capability(device) >= (9, 0)):
        return "grouped_mm"
    return "padded_bmm"


def compute_dtype(x: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    """The dtype the expert GEMMs run in: autocast's when active, else the weights'."""
    if torch.is_autocast_enabled(x.device.type):
        return torch.get_autocast_dtype(x.device.type)
    return weight.dtype


class Experts(nn.Module):
    """E expert FFNs with stacked weights w_up [E, H, F], w_gate [E, H, F] (swiglu), w_down [E, F, H]."""

    def __init__(self, experts: int, hidden: int, ffn: int, activation: str):
        super().__init__()
        self.w_up = nn.Parameter(torch.empty(experts, hidden, ffn))
        self.w_gate = nn.Parameter(torch.empty(experts, hidden, ffn)) if activation == "swiglu" else None
        self.w_down = nn.Parameter(torch.empty(experts, ffn, hidden))
        for p in self.parameters():
            nn.init.normal_(p, std=0.02)  # GPT._init_weights redoes this inside a model

    def forward(self, xs: torch.Tensor, valid: torch.Tensor, impl: str) -> torch.Tensor:
        """xs [E, M, H] slot inputs, valid [E, M] bool (filled slots a prefix per expert) -> [E, M, H].

        Outputs of empty slots are unspecified (padded_bmm computes them, grouped_mm
        zeroes them); the combine weight of an empty slot is 0.
        """
        if impl == "grouped_mm":
            return self._grouped(xs, valid)
        up = torch.bmm(xs, self.w_up)  # [E, M, F]
        gate = torch.bmm(xs, self.w_gate) if self.w_gate is not None else None
        return torch.bmm(_activate(up, gate), self.w_down)

    def _grouped(self, xs: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """Pack filled slots expert by expert and run one grouped GEMM per weight, skipping padding.

        The packed buffer keeps the static size E*M; rows past offs[-1] are left
        unwritten by _grouped_mm, so torch.where (not a multiply: garbage may be NaN)
        keeps them out of the result and of the input gradient.
        """
        e, m, h = xs.shape
        dtype = compute_dtype(xs, self.w_up)
        flat_valid = valid.reshape(-1)
        order = torch.sort((~flat_valid).to(torch.uint8), stable=True).indices  # filled slots first, in order
        keep = flat_valid.index_select(0, order).unsqueeze(1)  # [E*M, 1]
        offs = valid.sum(1).cumsum(0).to(torch.int32)  # [E] end row of each expert's group
        packed = torch.where(keep, xs.reshape(-1, h).index_select(0, order), 0).to(dtype)  # [E*M, H]
        up = torch._grouped_mm(packed, self.w_up.to(dtype), offs=offs)
        gate = torch._grouped_mm(packed, self.w_gate.to(dtype), offs=offs) if self.w_gate is not None else None
        out = torch._grouped_mm(_activate(up, gate), self.w_down.to(dtype), offs=offs)
        out = torch.where(keep, out, 0)
        return out.new_zeros(e * m, h).index_copy(0, order, out).view(e, m, h)


# ----------------------------------------------------------------------------- layer

class MoELayer(nn.Module):
    """Drop-in FFN: forward(x [B, T, H]) -> (y [B, T, H], aux, stats). aux: [] fp32 = balance + z
    loss, or None when no loss term applies (see has_aux_loss); stats: this call's RoutingStats.

    Routing is over all B*T tokens of the local batch, in fp32. `expert_impl` names the expert
    path ("padded_bmm" | "grouped_mm"). It is fixed before the first forward (set_expert_impl;
    parallelize picks it for the run's device and precision), never inside forward: a forward
    that writes attributes cannot be traced under activation checkpointing.
    """

    def __init__(self, cfg: ModelConfig, moe: MoEConfig, expert_impl: str = "padded_bmm"):
        super().__init__()
        check_expert_impl(expert_impl)
        self.moe = moe
        self.expert_impl = expert_impl
        self.router = nn.Linear(cfg.hidden, moe.experts, bias=False)
        self.experts = Experts(moe.experts, cfg.hidden, moe.expert_hidden or cfg.ffn, cfg.activation)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None, RoutingStats]:
        b, t, h = x.shape
        tokens = x.reshape(b * t, h)  # [N, H]
        with torch.autocast(x.device.type, enabled=False):
            logits = F.linear(tokens.float(), self.router.weight.float())  # [N, E] fp32
        r = route(logits, self.moe)
        e, c = r.index.shape
        xs = tokens.index_select(0, r.index.reshape(-1)).view(e, c, h)  # [E, C, H]
        ys = self.experts(xs, r.mask, self.expert_impl)  # [E, C, H]
        weighted = ys.float() * r.weight.unsqueeze(-1)  # [E, C, H] fp32, 0 in empty slots
        y = tokens.new_zeros(b * t, h, dtype=torch.float32).index_add(0, r.index.reshape(-1), weighted.view(-1, h))
        aux = (r.aux_loss + r.z_loss) if has_aux_loss(self.moe) else None
        return y.to(x.dtype).view(b, t, h), aux, r.stats()


def check_expert_impl(impl: str) -> None:
    if impl not in EXPERT_IMPLS:
        raise ValueError(f"expert_impl must be one of {EXPERT_IMPLS}, got {impl!r}")


def set_expert_impl(model: nn.Module, impl: str) -> None:
    """Fix the expert path of every MoE layer (before the model is compiled)."""
    check_expert_impl(impl)
    for layer in moe_layers(model):
        layer.expert_impl = impl


def has_aux_loss(moe: MoEConfig) -> bool:
    """Whether the layer's loss term depends on its parameters. Expert choice without z-loss has
    none: the layer then returns None, not a constant zero, which compiled backward graphs
    reject as an output without a gradient."""
    return (moe.router != "expert_choice" and moe.aux_loss_coef > 0) or moe.z_loss_coef > 0


def moe_layers(model: nn.Module) -> list[MoELayer]:
    return [m for m in model.modules() if isinstance(m, MoELayer)]


def summarize_stats(routing: Sequence[RoutingStats]) -> dict[str, float]:
    """Mean over MoE layers of the scalar stats of one step. Reads the device (host sync): call after a step."""
    if not routing:
        return {}
    return {k: torch.stack([getattr(r, k) for r in routing]).mean().item() for k in SCALAR_STATS}
