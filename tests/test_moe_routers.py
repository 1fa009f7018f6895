"""Routers on hand-built logits: assignments, capacities, drops, weights and losses by hand.

Logits are log-probabilities, so softmax gives back the written probabilities.
"""

import math

import pytest
import torch
from torch.testing import assert_close

from benchsuite.config import MoEConfig
from benchsuite.models.moe import (SortedRouting, active_experts_per_token, capacity, expected_slots_per_token,
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


@pytest.mark.parametrize("moe, tokens, expected", [
    (dict(router="switch", capacity_factor=1.0), 8, 2),  # ceil(1 * 1.0 * 8 / 4)
    (dict(router="switch", capacity_factor=1.0, min_capacity=3), 8, 3),
    (dict(router="switch", capacity_factor=1.0, min_capacity=100), 8, 8),  # clamped to N
    (dict(router="switch", capacity_factor=1.0, min_capacity=2), 8, 2),  # already at least 2
    (dict(router="gshard", capacity_factor=1.0, min_capacity=5), 8, 5),  # ceil(4) < 5
    (dict(router="token_choice", top_k=3, capacity_factor=1.0), 8, 6),  # ceil(3 * 1.0 * 8 / 4)
    (dict(router="token_choice", top_k=3, capacity_factor=0.5), 8, 3),
    (dict(router="token_choice", top_k=3, capacity_factor=0.5, min_capacity=4), 8, 4),
    (dict(router="token_choice", capacity_factor=1.1), 100, 55),  # default k = 2: ceil(2 * 1.1 * 100 / 4)
    (dict(router="expert_choice", capacity_factor=0.5), 8, 1),  # floor(1)
    (dict(router="expert_choice", capacity_factor=0.5, min_capacity=3), 8, 3),
])
def test_capacity_is_deepspeeds_max_of_k_cf_n_over_e_and_min_capacity(moe, tokens, expected):
    assert capacity(MoEConfig(experts=4, **moe), tokens) == expected


def test_slots_and_active_experts_per_token():
    assert expected_slots_per_token(MoEConfig(experts=4, router="switch", capacity_factor=1.25), 32) == 1.25
    assert expected_slots_per_token(MoEConfig(experts=4, router="gshard", capacity_factor=1.0), 6) == 4 * 3 / 6
    assert expected_slots_per_token(MoEConfig(experts=3, router="expert_choice", capacity_factor=1.0), 7) == 6 / 7
    assert active_experts_per_token(MoEConfig(router="switch"), 32) == 1.0
    assert active_experts_per_token(MoEConfig(router="gshard"), 32) == 2.0
    # expert choice: E * floor(cf * N / E) / N = 3 * 2 / 7, not cf = 1
    assert active_experts_per_token(MoEConfig(experts=3, router="expert_choice", capacity_factor=1.0), 7) == 6 / 7
    for router, k in (("switch", 1), ("gshard", 2), ("token_choice", 3)):
        moe = MoEConfig(experts=4, router=router, top_k=3 if router == "token_choice" else None, capacity_factor=0.0)
        assert active_experts_per_token(moe, 32) == expected_slots_per_token(moe, 32) == k  # dropless: no padding
    assert expected_slots_per_token(MoEConfig(experts=4, router="token_choice", capacity_factor=1.0), 8) == 4 * 4 / 8


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


# ----------------------------------------------------------------------------- token choice and dropless

TC_PROBS = [
    [0.4, 0.3, 0.2, 0.1],  # e0, e1
    [0.1, 0.2, 0.3, 0.4],  # e3, e2
    [0.25, 0.25, 0.25, 0.25],  # all tie: e0, e1 (lowest two)
    [0.1, 0.4, 0.4, 0.1],  # tie e1/e2: e1 first
]
# c = assignments [2, 3, 2, 1] / 4 tokens, P = column means [0.2125, 0.2875, 0.2875, 0.2125]:
# 0.01 * E/k * sum c_i P_i = 0.01 * 4/2 * 0.51875
TC_AUX = 0.010375


def check_sorted(r, counts, token, weight):
    assert isinstance(r, SortedRouting)
    assert r.counts.tolist() == counts and r.counts.dtype == torch.int64
    assert r.token.tolist() == token
    assert_close(r.weight, torch.tensor(weight))


def test_dropless_top_k_sorts_assignments_by_expert_in_token_order_with_ties():
    moe = MoEConfig(experts=4, router="token_choice", top_k=2, capacity_factor=0.0, aux_loss_coef=0.01)
    r = route(logits_of(TC_PROBS), moe)
    check_sorted(r, counts=[2, 3, 2, 1], token=[0, 2, 0, 2, 3, 1, 3, 1],
                 weight=[4 / 7, 0.5, 3 / 7, 0.5, 0.5, 3 / 7, 0.5, 4 / 7])  # renormalised over the chosen 2
    assert_close(r.aux_loss, torch.tensor(TC_AUX))
    s = r.stats()
    assert s.dropped_frac == 0 and s.padding_frac == 0
    assert s.expert_load.tolist() == s.tokens_per_expert.tolist() == [2.0, 3.0, 2.0, 1.0]
    assert_close(s.load_max_over_mean, torch.tensor(1.5))


def test_top_k_with_capacity_queues_in_token_order_and_min_capacity_removes_the_drop():
    moe = MoEConfig(experts=4, router="token_choice", top_k=2, capacity_factor=1.0, aux_loss_coef=0.01)
    r = route(logits_of(TC_PROBS), moe)
    assert r.capacity == 2  # ceil(2 * 1.0 * 4 / 4)
    # e1 gets t0, t2, t3 in that order: t3's assignment is dropped, its weight on e2 stays 0.5
    check_slots(r, index=[[0, 2], [0, 2], [1, 3], [1, 0]],
                mask=[[True, True], [True, True], [True, True], [True, False]],
                weight=[[4 / 7, 0.5], [3 / 7, 0.5], [3 / 7, 0.5], [4 / 7, 0.0]])
    assert r.expert_load.tolist() == [2.0, 3.0, 2.0, 1.0]
    assert r.stats().tokens_per_expert.tolist() == [2.0, 2.0, 2.0, 1.0]
    assert_close(r.dropped_frac, torch.tensor(1 / 8))
    assert_close(r.aux_loss, torch.tensor(TC_AUX))  # before capacity: the same as dropless
    roomy = route(logits_of(TC_PROBS), MoEConfig(experts=4, router="token_choice", capacity_factor=1.0,
                                                 min_capacity=3))
    assert roomy.capacity == 3 and roomy.dropped_frac == 0
    assert roomy.index[1].tolist() == [0, 2, 3] and roomy.mask.sum() == 8


def test_sigmoid_scores_weights_over_the_chosen_k_and_balance_over_all_experts():
    moe = MoEConfig(experts=4, router="token_choice", top_k=2, capacity_factor=0.0, score="sigmoid",
                    aux_loss_coef=0.1)
    logits = torch.tensor([[2.0, 0.0, 0.0, -1.0], [0.0, 0.0, 0.0, 0.0]])
    r = route(logits, moe)
    sig = [1 / (1 + math.exp(-v)) for v in (2.0, 0.0, 0.0, -1.0)]
    check_sorted(r, counts=[2, 2, 0, 0], token=[0, 1, 0, 1],  # t0: e0 then e1 (tie with e2); t1: e0, e1
                 weight=[sig[0] / (sig[0] + sig[1]), 0.5, sig[1] / (sig[0] + sig[1]), 0.5])
    p0 = [v / sum(sig) for v in sig]
    P = [(a + 0.25) / 2 for a in p0]  # column means of the scores normalised over all four experts
    assert_close(r.aux_loss, torch.tensor(0.1 * 4 / 2 * (1.0 * P[0] + 1.0 * P[1])))


def test_dropless_switch_and_gshard_keep_their_weights_and_losses():
    """The presets dropless: switch's weight is its top-1 probability, gshard's the pair renormalised;
    the balancing loss is the top-1 form of their capacity routers."""
    switch = MoEConfig(experts=3, router="switch", capacity_factor=0.0, aux_loss_coef=0.01)
    r = route(logits_of(SWITCH_PROBS), switch)
    check_sorted(r, counts=[4, 1, 1], token=[0, 1, 3, 5, 2, 4], weight=[0.5, 0.6, 0.7, 0.4, 0.8, 0.5])
    assert_close(r.aux_loss, torch.tensor(0.011375))
    gshard = MoEConfig(experts=4, router="gshard", capacity_factor=0.0, aux_loss_coef=0.01)
    r = route(logits_of(GSHARD_PROBS), gshard)
    check_sorted(r, counts=[2, 2, 4, 0], token=[0, 3, 1, 2, 0, 1, 2, 3],
                 weight=[5 / 8, 3 / 7, 6 / 8, 2 / 8, 3 / 8, 2 / 8, 6 / 8, 4 / 7])
    assert_close(r.aux_loss, torch.tensor(0.0125))


def test_top_k_aux_loss_is_the_switch_loss_at_k_1():
    """E/k * sum c_i P_i at k = 1 is Switch's E * sum f_i P_i: token_choice top-1 and switch agree."""
    logits = torch.randn(32, 4, generator=torch.Generator().manual_seed(0))
    one = route(logits, MoEConfig(experts=4, router="token_choice", top_k=1, capacity_factor=0.0))
    sw = route(logits, MoEConfig(experts=4, router="switch", capacity_factor=0.0))
    assert torch.equal(one.token, sw.token) and torch.equal(one.counts, sw.counts)
    assert_close(one.aux_loss, sw.aux_loss)
    assert torch.equal(one.weight, torch.ones(32))  # renormalised over one expert
