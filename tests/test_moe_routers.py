"""Routers on hand-built logits: assignments, capacities, drops, weights and losses by hand.

Logits are log-probabilities, so softmax gives back the written probabilities.
"""

import math

import pytest
import torch
from torch.testing import assert_close

from benchsuite.config import MoEConfig
from benchsuite.models.moe import (active_experts_per_token, capacity, expected_slots_per_token,
                                   gshard_route, route)


def logits_of(probs):
    return torch.tensor(probs, dtype=torch.float64).log().float()


def check_slots(r, index, mask, weight):
    assert r.index.tolist() == index
    assert r.mask.tolist() == mask
    assert_close(r.weight, torch.tensor(weight))


# ----------------------------------------------------------------------------- capacity

@pytest.mark.parametrize("router,cf,tokens,experts,expected", [
    ("switch", 1.25, 32, 4, 10),
    ("switch", 1.1, 100, 10, 11),  # 1.1 * 100 / 10 is 11.000000000000002 in floats
    ("switch", 1.0, 7, 2, 4),  # ceil(3.5)
    ("switch", 10.0, 8, 2, 8),  # never more slots than tokens
    ("gshard", 1.25, 32, 4, 20),  # 2 * cf * N / E
    ("gshard", 1.0, 5, 4, 3),  # ceil(2.5)
    ("expert_choice", 1.25, 32, 4, 10),
    ("expert_choice", 1.0, 7, 2, 3),  # floor(3.5)
    ("expert_choice", 0.01, 8, 4, 1),  # at least one
])
def test_capacity(router, cf, tokens, experts, expected):
    assert capacity(MoEConfig(experts=experts, router=router, capacity_factor=cf), tokens) == expected


def test_slots_and_active_experts_per_token():
    assert expected_slots_per_token(MoEConfig(experts=4, router="switch", capacity_factor=1.25), 32) == 1.25
    assert expected_slots_per_token(MoEConfig(experts=4, router="gshard", capacity_factor=1.0), 6) == 4 * 3 / 6
    assert expected_slots_per_token(MoEConfig(experts=3, router="expert_choice", capacity_factor=1.0), 7) == 6 / 7
    assert active_experts_per_token(MoEConfig(router="switch"), 32) == 1.0
    assert active_experts_per_token(MoEConfig(router="gshard"), 32) == 2.0
    # expert choice: E * floor(cf * N / E) / N = 3 * 2 / 7, not cf = 1
    assert active_experts_per_token(MoEConfig(experts=3, router="expert_choice", capacity_factor=1.0), 7) == 6 / 7


# ----------------------------------------------------------------------------- switch

SWITCH_PROBS = [
    [0.5, 0.25, 0.25],  # t0 -> e0, slot 0
    [0.6, 0.2, 0.2],  # t1 -> e0, slot 1
    [0.1, 0.8, 0.1],  # t2 -> e1
    [0.7, 0.2, 0.1],  # t3 -> e0, over capacity: dropped
    [0.25, 0.25, 0.5],  # t4 -> e2
    [0.4, 0.4, 0.2],  # t5: tie e0/e1 -> e0 (lower index), over capacity: dropped
]


def test_switch_assignments_overflow_and_ties():
    moe = MoEConfig(experts=3, router="switch", capacity_factor=1.0, aux_loss_coef=0.01)
    r = route(logits_of(SWITCH_PROBS), moe)
    assert r.capacity == 2
    check_slots(r, index=[[0, 1], [2, 0], [4, 0]], mask=[[True, True], [True, False], [True, False]],
                weight=[[0.5, 0.6], [0.8, 0.0], [0.5, 0.0]])
    assert r.expert_load.tolist() == [4.0, 1.0, 1.0]
    assert_close(r.dropped_frac, torch.tensor(2 / 6))
    # f = [4, 1, 1] / 6, P = column means [0.425, 0.35, 0.225]: 0.01 * 3 * 2.275 / 6
    assert_close(r.aux_loss, torch.tensor(0.011375))
    assert_close(r.z_loss, torch.tensor(0.0))
    stats = r.stats()
    assert_close(stats.padding_frac, torch.tensor(2 / 6))
    assert_close(stats.load_max_over_mean, torch.tensor(2.0))


def test_z_loss_and_shift_invariance():
    """A per-token shift of the logits changes only the z-loss: logsumexp becomes the shift."""
    moe = MoEConfig(experts=3, router="switch", capacity_factor=1.0, z_loss_coef=0.5)
    shift = torch.tensor([1.0, -1.0, 2.0, 0.0, 0.0, 0.0]).unsqueeze(1)
    plain = route(logits_of(SWITCH_PROBS), moe)
    shifted = route(logits_of(SWITCH_PROBS) + shift, moe)
    assert torch.equal(plain.index, shifted.index) and torch.equal(plain.mask, shifted.mask)
    assert_close(shifted.z_loss, torch.tensor(0.5 * (1 + 1 + 4) / 6))


def test_all_ties_go_to_expert_zero():
    moe = MoEConfig(experts=4, router="switch", capacity_factor=1.0)
    r = route(torch.zeros(8, 4), moe)
    assert r.index.tolist() == [[0, 1], [0, 0], [0, 0], [0, 0]]
    assert r.mask[0].all() and not r.mask[1:].any()
    assert r.expert_load.tolist() == [8.0, 0.0, 0.0, 0.0]
    assert_close(r.dropped_frac, torch.tensor(6 / 8))


# ----------------------------------------------------------------------------- gshard

GSHARD_PROBS = [
    [0.5, 0.1, 0.3, 0.1],  # top1 e0, top2 e2 (e2 full of top-1 tokens: dropped)
    [0.1, 0.6, 0.2, 0.1],  # top1 e1, top2 e2 (dropped)
    [0.1, 0.2, 0.6, 0.1],  # top1 e2, top2 e1
    [0.3, 0.1, 0.4, 0.2],  # top1 e2, top2 e0
]


def test_gshard_top1_fills_capacity_before_top2():
    moe = MoEConfig(experts=4, router="gshard", capacity_factor=1.0, aux_loss_coef=0.01)
    r = route(logits_of(GSHARD_PROBS), moe)
    assert r.capacity == 2  # ceil(2 * 1.0 * 4 / 4)
    check_slots(r, index=[[0, 3], [1, 2], [2, 3], [0, 0]],
                mask=[[True, True], [True, True], [True, True], [False, False]],
                weight=[[0.5 / 0.8, 0.3 / 0.7], [0.6 / 0.8, 0.2 / 0.8], [0.6 / 0.8, 0.4 / 0.7], [0.0, 0.0]])
    assert r.expert_load.tolist() == [2.0, 2.0, 4.0, 0.0]
    assert_close(r.dropped_frac, torch.tensor(2 / 8))
    # top-1 f = [1, 1, 2, 0] / 4, P = [0.25, 0.25, 0.375, 0.125]: 0.01 * 4 * 0.3125
    assert_close(r.aux_loss, torch.tensor(0.0125))
    assert_close(r.stats().padding_frac, torch.tensor(2 / 8))


def test_gshard_ties_take_lowest_two():
    moe = MoEConfig(experts=4, router="gshard", capacity_factor=2.0)
    r = route(torch.zeros(2, 4), moe)  # C = ceil(2 * 2.0 * 2 / 4) = 2
    check_slots(r, index=[[0, 1], [0, 1], [0, 0], [0, 0]],
                mask=[[True, True], [True, True], [False, False], [False, False]],
                weight=[[0.5, 0.5], [0.5, 0.5], [0.0, 0.0], [0.0, 0.0]])


def test_gshard_random_policy_extremes():
    """min(1, 2 * g2): g2 = 0 is never kept, g2 = 1/2 always; a skipped 2nd expert is not a drop."""
    moe = MoEConfig(experts=4, router="gshard", capacity_factor=2.0, second_expert_policy="random")
    logits = torch.tensor([[0.0, -math.inf, -math.inf, -math.inf], [1.0, 1.0, 0.0, 0.0]] * 4)
    r = gshard_route(logits, moe, torch.Generator().manual_seed(0))
    assert r.expert_load.tolist() == [8.0, 4.0, 0.0, 0.0]  # 8 top-1 on e0, 4 kept top-2 on e1
    assert r.mask.sum().item() == 12
    assert_close(r.dropped_frac, torch.tensor(0.0))
    on_e0 = r.index[0][r.mask[0]].tolist()
    assert on_e0 == list(range(8))
    assert_close(r.weight[0][r.mask[0]], torch.tensor([1.0, 0.5] * 4))


def test_gshard_random_policy_is_seeded():
    moe = MoEConfig(experts=4, router="gshard", capacity_factor=2.0, second_expert_policy="random")
    logits = torch.randn(64, 4, generator=torch.Generator().manual_seed(1))

    def kept(seed):
        return gshard_route(logits, moe, torch.Generator().manual_seed(seed)).mask

    assert torch.equal(kept(3), kept(3))
    assert not torch.equal(kept(3), kept(4))
    torch.manual_seed(5)
    first = gshard_route(logits, moe).mask  # global RNG: what activation recompute restores
    torch.manual_seed(5)
    assert torch.equal(first, gshard_route(logits, moe).mask)
    always = gshard_route(logits, MoEConfig(experts=4, router="gshard", capacity_factor=2.0)).mask
    assert always.sum() == 128 and first.sum() < 128


# ----------------------------------------------------------------------------- expert choice

EC_PROBS = [
    [0.7, 0.2, 0.1],
    [0.6, 0.3, 0.1],
    [0.1, 0.1, 0.8],
    [0.2, 0.6, 0.2],
    [0.4, 0.32, 0.28],  # third on every expert: taken by none
    [0.1, 0.6, 0.3],  # ties t3 on e1 (t3 first), taken by e1 and e2
]


def test_expert_choice_takes_top_k_tokens_per_expert():
    moe = MoEConfig(experts=3, router="expert_choice", capacity_factor=1.0, aux_loss_coef=0.01)
    r = route(logits_of(EC_PROBS), moe)
    assert r.capacity == 2
    check_slots(r, index=[[0, 1], [3, 5], [2, 5]], mask=[[True, True]] * 3,
                weight=[[0.7, 0.6], [0.6, 0.6], [0.8, 0.3]])
    assert r.expert_load.tolist() == [2.0, 2.0, 2.0]
    assert_close(r.dropped_frac, torch.tensor(1 / 6))
    assert_close(r.aux_loss, torch.tensor(0.0))
    assert_close(r.stats().padding_frac, torch.tensor(0.0))
    assert_close(r.stats().load_max_over_mean, torch.tensor(1.0))


def test_expert_choice_ties_at_the_cutoff_take_earlier_tokens():
    moe = MoEConfig(experts=1, router="expert_choice", capacity_factor=0.7)
    r = route(torch.zeros(3, 1), moe)  # k = floor(2.1) = 2
    assert r.index.tolist() == [[0, 1]]
    assert_close(r.dropped_frac, torch.tensor(1 / 3))


@pytest.mark.parametrize("router", ["switch", "gshard", "expert_choice"])
def test_routing_is_deterministic(router):
    moe = MoEConfig(experts=4, router=router, capacity_factor=1.0)
    logits = torch.randn(32, 4, generator=torch.Generator().manual_seed(0)).round(decimals=1)  # many ties
    a, b = route(logits, moe), route(logits.clone(), moe)
    assert torch.equal(a.index, b.index) and torch.equal(a.mask, b.mask) and torch.equal(a.weight, b.weight)
