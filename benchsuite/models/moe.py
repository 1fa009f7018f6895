"""Mixture-of-experts FFN: four routers, stacked experts, dispatch and combine.

Plain PyTorch with no ranks inside, but for update_expert_bias, which sums the load over the
data-parallel group it is given; benchsuite/parallel/expert.py swaps the experts for their
local shard and adds the all-to-all.

Shape legend: N tokens (B*T of the local batch), E experts, C capacity (slots per
expert), H hidden, F expert FFN width, k experts per token, A assignments (token,
expert pairs).

A router with capacity returns a `Routing` in slot layout: expert e's slot c holds
token `index[e, c]` when `mask[e, c]`, and its output enters that token with weight
`weight[e, c]`. Slots fill from c = 0, so the filled slots of each expert are a prefix.
Capacities come from static shapes (Python ints), so the padded path never waits
on the device.

A dropless call (capacity_factor = 0, token-choice routers) returns a `SortedRouting`
in sorted layout: the A = N*k assignments sorted by expert (stable, so in token order
inside an expert), `counts [E]` per expert, `token [A]` and `weight [A]` of each.
Experts.forward_sorted runs each expert on its contiguous group of rows, no padding.

Ties: every top-k here is a stable descending sort, so equal scores go to the
lower index (lower expert for token-choice routers, earlier token for expert choice).
torch.topk does not promise an order for equal values, hence the sort.

The token-choice routers choose their k experts in one of three ways (_choose_experts): the k
highest scores (learned); the k highest scores plus a per-expert bias that only chooses
(balance = "aux_free", DeepSeek-V3's auxiliary-loss-free balancing; update_expert_bias moves the
bias after each step); or a fixed round robin (routing = "forced"). In all three the gates are the
router's own scores at the chosen experts, so the router's compute and gradient stay in the step.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import NamedTuple, Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from benchsuite.config import ModelConfig, MoEConfig
from benchsuite.models.ffn import MLP, ffn_activation
from benchsuite.record.kinds import ROUTERS

# Expert paths per layout: slots (capacity routers) and sorted (dropless). On this project's CPU
# (fp32, 2 threads; 4-32 experts, H 64-128, loads skewed as a router skews them) one forward +
# backward of the sorted experts took 1.0x with loop_mm, 0.9-1.0x with torch._grouped_mm's CPU
# fallback and 1.6-2.8x padding every group to the largest (which also reads the largest count on
# the host): so loop_mm is the sorted path wherever the slot layout uses padded_bmm.
SLOT_IMPLS = ("padded_bmm", "grouped_mm")
SORTED_IMPLS = ("loop_mm", "grouped_mm")
EXPERT_IMPLS = SLOT_IMPLS + ("loop_mm",)
_MILLION = 1_000_000


# ----------------------------------------------------------------------------- sizes

def capacity(moe: MoEConfig, tokens: int) -> int:
    """Slots per expert C of a router with capacity, for `tokens` routed tokens.

    Token-choice routers (k experts per token: switch 1, gshard 2, token_choice top_k):
    C = max(ceil(k * cf * N / E), min_capacity), DeepSpeed's rule (GShard's 2N/E scaled by cf for
    gshard); expert_choice: k = max(floor(cf * N / E), min_capacity), the tokens each expert takes.
    Then clamped to [1, N]. Integer arithmetic on cf in millionths (1.1 is 1100000 / 10**6), so
    float noise never adds a slot and torch.compile traces it without a break.
    """
    millionths = round(moe.capacity_factor * _MILLION) * (moe.k or 1)
    num, den = millionths * tokens, _MILLION * moe.experts
    c = -(-num // den) if ROUTERS[moe.router].token_choice else num // den
    return max(1, min(tokens, max(c, moe.min_capacity)))


def expected_slots_per_token(moe: MoEConfig, tokens: int) -> float:
    """Expert rows executed per token, padding included: E * C / N (for executed FLOPs); k when
    dropless (the sorted layout computes each assignment once)."""
    if moe.dropless:
        return float(moe.k)
    return moe.experts * capacity(moe, tokens) / tokens


def active_experts_per_token(moe: MoEConfig, tokens: int) -> float:
    """Routed experts a token uses in the model-FLOP count: k for token-choice routers (1 switch,
    2 gshard, top_k token_choice); expert choice fills all E * floor(cf * N / E) slots of a call of
    N tokens, E * C / N per token (not cf). Shared experts come on top (flops.param_counts)."""
    if ROUTERS[moe.router].token_choice:
        return float(moe.k)
    return expected_slots_per_token(moe, tokens)


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
    tokens_per_expert: torch.Tensor  # [E] assignments each expert computed (after capacity)


SCALAR_STATS = ("dropped_frac", "padding_frac", "load_max_over_mean", "aux_loss", "z_loss")
LOAD_STATS = ("expert_load", "tokens_per_expert")  # [E] per MoE layer; summed over ranks in a record


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
                            self.aux_loss.detach(), self.z_loss.detach(), load, self.mask.float().sum(1))


@dataclass
class SortedRouting:
    """One dropless call's routing in sorted layout (see the module docstring)."""

    counts: torch.Tensor  # [E] int64 assignments per expert (every one is computed)
    token: torch.Tensor  # [A] int64 token of each assignment, sorted by expert, token order inside
    weight: torch.Tensor  # [A] fp32 combine weight; carries the router gradient
    aux_loss: torch.Tensor  # 0-d fp32, coefficient applied
    z_loss: torch.Tensor  # 0-d fp32, coefficient applied

    def stats(self) -> RoutingStats:
        load = self.counts.float()
        zero = load.new_zeros(())
        return RoutingStats(zero, zero, load.max() / load.mean(), self.aux_loss.detach(), self.z_loss.detach(),
                            load, load)


def _top(scores: torch.Tensor, k: int, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k along dim with ties to the lower index (a stable sort keeps equal values in index order)."""
    values, indices = torch.sort(scores, dim=dim, descending=True, stable=True)
    return values.narrow(dim, 0, k), indices.narrow(dim, 0, k)


def _z_loss(logits: torch.Tensor, moe: MoEConfig) -> torch.Tensor:
    """Router z-loss (ST-MoE): coef * mean over tokens of logsumexp(logits)^2."""
    return moe.z_loss_coef * torch.logsumexp(logits, dim=-1).pow(2).mean()


def _balance_loss(probs: torch.Tensor, chosen: torch.Tensor, moe: MoEConfig) -> torch.Tensor:
    """Load-balancing loss coef * (E / j) * sum_i c_i * P_i over the j columns of chosen [N, j]:
    c_i = share of tokens with expert i among their j choices (no gradient), P_i = mean router
    probability of expert i. j = 1 is Switch's E * sum f_i P_i; j = k is DeepSpeed's topkgating
    (E / k * sum me * ce), the same as E * sum f_i P_i with f_i = c_i / k the share of assignments."""
    counts = torch.zeros_like(probs).scatter_(1, chosen, 1.0)  # [N, E]
    return moe.aux_loss_coef * moe.experts / chosen.shape[1] * (counts.mean(0) * probs.mean(0)).sum()


def _renormalises(moe: MoEConfig) -> bool:
    """Whether the k chosen scores are renormalised to sum to 1: gshard always (GShard), switch never
    (Switch Transformer keeps its expert's probability), token_choice unless normalize_top_k = false
    (Mixtral and Qwen3-MoE renormalise, OLMoE does not)."""
    if moe.router == "token_choice":
        return moe.normalize_top_k is not False
    return moe.router == "gshard"


def forced_experts(tokens: int, moe: MoEConfig, device: torch.device) -> torch.Tensor:
    """Forced routing's choices [N, k]: token i's j-th expert is (i * k + j) mod E, a round robin over
    the call's N * k assignments (Megatron's --moe-router-force-load-balancing, torchtitan's debug
    balance). Each expert gets exactly k * N / E of them when E divides k * N, otherwise the counts
    differ by at most one; k <= E, so a token's k experts are distinct."""
    return torch.arange(tokens * moe.k, device=device).view(tokens, moe.k) % moe.experts


def _choose_experts(logits: torch.Tensor, moe: MoEConfig,
                    bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The k experts of each token and their combine weights: (probs [N, E], experts [N, k], gates [N, k]).

    Scores are the softmax over experts, or for token_choice with score = "sigmoid" the per-expert
    sigmoid (DeepSeek-V3). Chosen: the k highest scores; with `bias` [E] (aux_free) the k highest of
    scores + bias, the bias choosing only; with routing = "forced" the round robin of forced_experts.
    Gates are the scores at the chosen experts (never the bias), renormalised to sum to 1 where
    _renormalises says (so token_choice with k = 1 gives weight 1 and its router learns through the
    balancing loss alone). probs, for the balancing loss, are the scores normalised over all E
    experts (the softmax itself; sigmoid scores / their sum).
    """
    if moe.score == "sigmoid":
        scores = logits.sigmoid()
        probs = scores / scores.sum(-1, keepdim=True)
    else:
        scores = probs = logits.softmax(-1)
    if moe.routing == "forced":
        experts = forced_experts(logits.shape[0], moe, logits.device)
    else:
        experts = _top(scores if bias is None else scores + bias, moe.k, dim=1)[1]  # [N, k]
    gates = scores.gather(1, experts)
    if _renormalises(moe):
        gates = gates / gates.sum(-1, keepdim=True)
    return probs, experts, gates


def _balance_choices(experts: torch.Tensor, moe: MoEConfig) -> torch.Tensor:
    """The choices the balancing loss counts: all k for token_choice, the top-1 for the switch and
    gshard presets (as in their papers)."""
    return experts if moe.router == "token_choice" else experts[:, :1]


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


def gshard_route(logits: torch.Tensor, moe: MoEConfig, generator: torch.Generator | None = None,
                 bias: torch.Tensor | None = None) -> Routing:
    """Top-2 (GShard). logits [N, E] fp32; bias [E] or None: _choose_experts.

    The two gates are renormalised over the pair. All top-1 assignments take their
    expert's slots before any top-2 assignment (GShard order), each group in token
    order; an assignment is dropped only when its expert is full. With
    second_expert_policy = "random" the 2nd expert is kept with probability
    min(1, 2 * g2) (g2 renormalised); a skipped 2nd expert is not a drop and the
    token keeps weight g1 alone. The draw uses `generator`, or the global RNG when
    None, which activation checkpointing restores on recompute (a private generator
    would draw again and route differently). dropped_frac = dropped assignments /
    (N + kept 2nd assignments). The aux loss uses the top-1 assignment. Under forced routing the
    random policy still draws on the forced pair's gates, so only "all" keeps the loads exact.
    """
    n, e = logits.shape
    cap = capacity(moe, n)
    probs, experts, gates = _choose_experts(logits, moe, bias)  # experts, gates [N, 2]
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
                   _balance_loss(probs, experts[:, :1], moe), _z_loss(logits, moe))


def token_choice_route(logits: torch.Tensor, moe: MoEConfig, bias: torch.Tensor | None = None) -> Routing:
    """Top-k token choice with capacity (scores and weights: _choose_experts), and Switch at k = 1
    (each token to its argmax expert with its softmax probability as weight; a dropped token passes
    on the residual path). logits [N, E] fp32; bias [E] or None: _choose_experts.

    The N*k assignments queue in token order, a token's k choices together (DeepSpeed's
    "position" drop policy); an expert keeps its first C = capacity(moe, N) and drops the rest.
    A dropped assignment's weight is lost (the kept ones are not renormalised).
    dropped_frac = dropped assignments / (N*k). The balancing loss counts all k choices.
    """
    n, e = logits.shape
    cap = capacity(moe, n)
    probs, experts, gates = _choose_experts(logits, moe, bias)  # [N, k]
    flat = experts.reshape(-1)  # [N*k] token-major
    pos, load = _queue_position(flat, torch.ones_like(flat, dtype=torch.bool), e)
    keep = pos < cap
    token = torch.arange(n, device=logits.device).repeat_interleave(moe.k)
    index, mask, weight = _fill_slots(token, flat, pos, keep, gates.reshape(-1), e, cap)
    return Routing(index, mask, weight, load.float(), 1.0 - keep.float().mean(),
                   _balance_loss(probs, experts, moe), _z_loss(logits, moe))


def sorted_route(logits: torch.Tensor, moe: MoEConfig, bias: torch.Tensor | None = None) -> SortedRouting:
    """Dropless routing of the token-choice routers (capacity_factor = 0). logits [N, E] fp32; bias [E]
    or None: _choose_experts.

    Each token reaches its k experts with the weights of _choose_experts (switch: its top-1
    probability; gshard, token_choice: renormalised over the k unless normalize_top_k = false). The
    N*k assignments are sorted by expert with a stable sort (token order inside an expert). Counts
    come from a scatter-add, not
    bincount (which reads its input's maximum on the host): no host sync. Balancing loss as the
    router's capacity form (top-1 for switch and gshard, all k for token_choice); z-loss the same.
    """
    n, e = logits.shape
    probs, experts, gates = _choose_experts(logits, moe, bias)  # [N, k]
    flat = experts.reshape(-1)  # [N*k]: assignment j of token t at t*k + j
    order = torch.sort(flat, stable=True).indices
    counts = torch.zeros(e, dtype=torch.int64, device=logits.device).scatter_add_(0, flat, torch.ones_like(flat))
    return SortedRouting(counts, order // moe.k, gates.reshape(-1).index_select(0, order),
                         _balance_loss(probs, _balance_choices(experts, moe), moe), _z_loss(logits, moe))


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


def route(logits: torch.Tensor, moe: MoEConfig, generator: torch.Generator | None = None,
          bias: torch.Tensor | None = None) -> Routing | SortedRouting:
    """Dispatch to the router named by moe.router, dropless (sorted layout) when capacity_factor = 0.
    logits [N, E] fp32; bias [E]: the aux-free expert bias of a token-choice router (None: none)."""
    if moe.router == "expert_choice":
        return expert_choice_route(logits, moe)
    if moe.dropless:
        return sorted_route(logits, moe, bias)
    if moe.router == "gshard":
        return gshard_route(logits, moe, generator, bias)
    return token_choice_route(logits, moe, bias)


# ----------------------------------------------------------------------------- experts

def select_expert_impl(device: torch.device, dtype: torch.dtype) -> str:
    """grouped_mm where its fast kernel exists (CUDA sm90+, bf16); padded_bmm everywhere else.
    A dropless layer runs that choice's sorted counterpart (layout_impl)."""
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
        return torch.bmm(ffn_activation(up, gate), self.w_down)

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
        packed = torch.where(keep, xs.reshape(-1, h).index_select(0, order), 0)  # [E*M, H]
        out = torch.where(keep, self._grouped_ffn(packed, offs, dtype), 0)
        return out.new_zeros(e * m, h).index_copy(0, order, out).view(e, m, h)

    def _grouped_ffn(self, rows: torch.Tensor, offs: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """rows [R, H] grouped by expert (group e ends at row offs[e]) through their experts' FFN, one
        torch._grouped_mm per projection in `dtype`; the slot and the sorted layout both come here."""
        rows = rows.to(dtype)
        up = torch._grouped_mm(rows, self.w_up.to(dtype), offs=offs)
        gate = torch._grouped_mm(rows, self.w_gate.to(dtype), offs=offs) if self.w_gate is not None else None
        return torch._grouped_mm(ffn_activation(up, gate), self.w_down.to(dtype), offs=offs)

    def forward_sorted(self, x: torch.Tensor, counts: torch.Tensor, impl: str,
                       sizes: list[int] | None = None) -> torch.Tensor:
        """x [A, H] rows sorted by expert (counts[e] rows of expert e, in expert order), counts [E]
        int64 -> [A, H], each row through its expert's FFN; no padding is computed.

        impl "grouped_mm": one torch._grouped_mm per projection, group ends offs = cumsum(counts) on
        the device: no host sync. "loop_mm": one matmul per expert group; the split sizes must be
        on the host, so it reads counts.tolist() (a device sync on GPU, the one of this path) unless
        the caller already has them: `sizes`, counts as a list (the expert-parallel exchange does).
        """
        if impl == "grouped_mm":
            offs = counts.cumsum(0).to(torch.int32)  # [E] end row of each expert's group
            return self._grouped_ffn(x, offs, compute_dtype(x, self.w_up))
        if impl != "loop_mm":
            raise ValueError(f"forward_sorted runs one of {SORTED_IMPLS}, got {impl!r}")
        if torch.compiler.is_compiling():  # data-dependent split sizes: a graph would recompile for each step's counts
            # disabled here, at trace time, not by a decorator: that imports torch._dynamo (~1 s) with this module
            return torch.compiler.disable(type(self)._loop)(self, x, counts, sizes)
        return self._loop(x, counts, sizes)

    def _loop(self, x: torch.Tensor, counts: torch.Tensor, sizes: list[int] | None) -> torch.Tensor:
        """One matmul per expert group. unbind, not w[e]: its backward stacks the E slices once,
        where indexing would add a zero-filled [E, H, F] gradient per expert."""
        sizes = counts.tolist() if sizes is None else sizes
        gates = self.w_gate.unbind(0) if self.w_gate is not None else [None] * len(sizes)
        outs = []
        for group, w_up, w_gate, w_down in zip(x.split(sizes), self.w_up.unbind(0), gates,
                                               self.w_down.unbind(0)):
            up = group @ w_up
            outs.append(ffn_activation(up, group @ w_gate if w_gate is not None else None) @ w_down)
        return torch.cat(outs)


# ----------------------------------------------------------------------------- layer

class MoELayer(nn.Module):
    """Drop-in FFN: forward(x [B, T, H]) -> (y [B, T, H], aux, stats). aux: [] fp32 = balance + z
    loss, or None when no loss term applies (see has_aux_loss); stats: this call's RoutingStats.

    Routing is over all B*T tokens of the local batch, in fp32. With capacity the experts run on
    slots, dropless (capacity_factor = 0) on sorted rows (Experts.forward_sorted); either way the
    combine is a weighted index_add back into token order. Shared experts (moe.shared_experts of
    width expert_hidden) are one dense MLP of their summed width over every token, added with
    weight 1; they run before the router, so the last tensor the block saves for backward is the
    routed experts' output and a checkpoint re-runs the whole block (metrics/flops.py).
    The forward never waits on the device except in loop_mm, which reads the per-expert counts on
    the host (the matmul sizes; grouped_mm takes them on the device).

    `expert_impl` names the expert path that runs (SLOT_IMPLS or, dropless, SORTED_IMPLS). It is
    fixed before the first forward (set_expert_impl; parallelize picks it for the run's device and
    precision), never inside forward: a forward that writes attributes cannot be traced under
    activation checkpointing.

    With balance = "aux_free" the layer has two fp32 [E] buffers (None otherwise): expert_bias, which
    only chooses experts (persistent: routing state a checkpoint keeps), and step_load, to which every
    training-mode forward adds its expert_load in place. update_expert_bias turns the step's load into
    a bias step once per optimizer step. The bias does not move inside forward because a checkpointed
    block's recompute must route exactly as its forward did. torch's checkpoint stops its recompute
    once the saved tensors are rebuilt, before the add; a recompute that reached it would add the
    load a second time, which the update's sign() ignores. DDP broadcasts buffers from rank 0 only
    at the first forward of a step (after a synchronised backward), when every rank's step_load is 0
    and the biases are equal anyway.
    """

    def __init__(self, cfg: ModelConfig, moe: MoEConfig, expert_impl: str = "padded_bmm"):
        super().__init__()
        self.moe = moe
        self.expert_impl = layout_impl(expert_impl, moe)
        ffn = moe.expert_hidden or cfg.ffn
        self.router = nn.Linear(cfg.hidden, moe.experts, bias=False)
        self.experts = Experts(moe.experts, cfg.hidden, ffn, cfg.activation)
        self.shared = MLP(cfg.hidden, moe.shared_experts * ffn, cfg.activation) if moe.shared_experts else None
        aux_free = moe.balance == "aux_free"
        self.register_buffer("expert_bias", torch.zeros(moe.experts) if aux_free else None)
        self.register_buffer("step_load", torch.zeros(moe.experts) if aux_free else None, persistent=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None, RoutingStats]:
        b, t, h = x.shape
        tokens = x.reshape(b * t, h)  # [N, H]
        shared = self.shared(tokens)[0] if self.shared is not None else None
        with torch.autocast(x.device.type, enabled=False):
            logits = F.linear(tokens.float(), self.router.weight.float())  # [N, E] fp32
        r = route(logits, self.moe, bias=self.expert_bias)
        if isinstance(r, SortedRouting):
            token, weight = r.token, r.weight  # [A]
            ys = self.experts.forward_sorted(tokens.index_select(0, token), r.counts, self.expert_impl)  # [A, H]
        else:
            token, weight = r.index.reshape(-1), r.weight.reshape(-1)  # [E*C], weight 0 in empty slots
            e, c = r.index.shape
            xs = tokens.index_select(0, token).view(e, c, h)  # [E, C, H]
            ys = self.experts(xs, r.mask, self.expert_impl).view(e * c, h)
        weighted = ys.float() * weight.unsqueeze(-1)  # fp32
        y = tokens.new_zeros(b * t, h, dtype=torch.float32).index_add(0, token, weighted)
        if shared is not None:
            y = y + shared.float()
        aux = (r.aux_loss + r.z_loss) if has_aux_loss(self.moe) else None
        stats = r.stats()
        if self.step_load is not None and self.training:
            self.step_load.add_(stats.expert_load)
        return y.to(x.dtype).view(b, t, h), aux, stats


def layout_impl(impl: str, moe: MoEConfig) -> str:
    """The expert path a layer of this config runs for `impl`: a dropless layer runs sorted rows, where
    padded_bmm's counterpart is loop_mm (measured faster on CPU than padding each group, see
    SORTED_IMPLS) and grouped_mm stays grouped_mm; a layer with capacity runs slots (SLOT_IMPLS)."""
    if impl not in EXPERT_IMPLS:
        raise ValueError(f"expert_impl must be one of {EXPERT_IMPLS}, got {impl!r}")
    if moe.dropless and ROUTERS[moe.router].token_choice:
        return "loop_mm" if impl == "padded_bmm" else impl
    if impl not in SLOT_IMPLS:
        raise ValueError(f"expert_impl {impl!r} runs sorted rows (dropless layers); with capacity use one of "
                         f"{SLOT_IMPLS}")
    return impl


def set_expert_impl(model: nn.Module, impl: str) -> None:
    """Fix the expert path of every MoE layer (before the model is compiled); each runs layout_impl(impl)."""
    for layer in moe_layers(model):
        layer.expert_impl = layout_impl(impl, layer.moe)


def has_aux_loss(moe: MoEConfig) -> bool:
    """Whether the layer's loss term depends on its parameters. Expert choice without z-loss has
    none: the layer then returns None, not a constant zero, which compiled backward graphs
    reject as an output without a gradient."""
    return (ROUTERS[moe.router].token_choice and moe.aux_loss_coef > 0) or moe.z_loss_coef > 0


def moe_layers(model: nn.Module) -> list[MoELayer]:
    return [m for m in model.modules() if isinstance(m, MoELayer)]


@torch.no_grad()
def update_expert_bias(model: nn.Module, group=None) -> None:
    """Aux-free balancing's step (DeepSeek-V3): each aux_free layer's expert_bias += bias_update *
    sign(mean load - load), the overloaded experts' bias down and the underloaded ones' up, from the
    step_load its training forwards added since the last update; then step_load restarts from 0.

    The load is summed over `group`, the data-parallel ranks (expert-parallel ones included), which
    route different tokens, in one all_reduce for all layers (None: this process alone). Every rank
    then takes the same step from the same sum, so the replicated biases stay identical. Call it
    once per optimizer step after the last backward (the worker adds it to parallelize's grad
    hooks, as torchtitan runs it in an optimizer pre-step hook), so gradient accumulation's
    micro-batches count together and no recompute routes with a moved bias.
    """
    layers = [layer for layer in moe_layers(model) if layer.expert_bias is not None]
    if not layers:
        return
    loads = torch.stack([layer.step_load for layer in layers])  # [L, E]
    if group is not None and dist.get_world_size(group) > 1:
        dist.all_reduce(loads, group=group)
    for layer, load in zip(layers, loads):
        layer.expert_bias.add_(layer.moe.bias_update * torch.sign(load.mean() - load))
        layer.step_load.zero_()


def scalar_rows(routing: Sequence[RoutingStats]) -> list[list[float]]:
    """Each MoE layer's scalar stats of one step (SCALAR_STATS' order), read from the device at once (host sync:
    call after a step)."""
    return torch.stack([torch.stack([getattr(r, k) for k in SCALAR_STATS]) for r in routing]).tolist() \
        if routing else []


def mean_scalars(rows: list[list[float]]) -> dict[str, float]:
    """The mean over MoE layers of each scalar stat (rows: scalar_rows', of one rank's layers or of a whole
    pipeline's)."""
    return {k: statistics.fmean(row[j] for row in rows) for j, k in enumerate(SCALAR_STATS)} if rows else {}


def load_figures(tokens_per_expert: list[list[float]] | None,
                 load_by_step: list[list[list[float]]] | None) -> dict:
    """A record's per-expert figures from loads summed over ranks (None: not measured).

    tokens_per_expert [MoE layer][expert]: assignments each expert computed in the last measured
    step; its max (the busiest expert of any layer) and mean over layers and experts.
    load_by_step [step][MoE layer][expert]: assignments per expert before capacity in each measured
    step. A step's imbalance is the mean over MoE layers of max / mean tokens per expert (1: even;
    E: all on one expert at k = 1); imbalance_mean and imbalance_max are over the measured steps.
    """
    flat = [v for layer in tokens_per_expert or [] for v in layer]
    by_step = None if load_by_step is None else [
        statistics.fmean(max(layer) / statistics.fmean(layer) for layer in step) for step in load_by_step]
    return {"tokens_per_expert": tokens_per_expert,
            "tokens_per_expert_max": max(flat) if flat else None,
            "tokens_per_expert_mean": statistics.fmean(flat) if flat else None,
            "imbalance_by_step": by_step,
            "imbalance_mean": statistics.fmean(by_step) if by_step else None,
            "imbalance_max": max(by_step) if by_step else None}


