"""MoELayer: the padded path against a per-token loop, gradients, the model, drops, impl choice."""

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from benchsuite.config import ModelConfig, MoEConfig
from benchsuite.models import moe as moe_mod
from benchsuite.models.moe import (LOAD_STATS, MoELayer, RoutingStats, route, select_expert_impl,
                                   mean_scalars, scalar_rows, set_expert_impl)
from benchsuite.models.transformer import build_model
from helpers import grouped_mm_runs_here

ROUTERS = ["switch", "gshard", "expert_choice"]
H, E, FFN, B, T = 16, 4, 32, 2, 16  # N = 32 tokens


def make_layer(router, activation="gelu", capacity_factor=1.0, seed=0, **kw):
    torch.manual_seed(seed)
    cfg = ModelConfig(hidden=H, ffn_hidden=FFN, activation=activation)
    moe = MoEConfig(experts=E, router=router, capacity_factor=capacity_factor, z_loss_coef=0.001, **kw)
    return MoELayer(cfg, moe)


def loop_reference(layer, x):
    """Token by token, expert by expert, with vector-matrix products: no gather, no bmm."""
    tokens = x.reshape(-1, H)
    r = route(tokens @ layer.router.weight.t(), layer.moe)
    ex = layer.experts
    y = torch.zeros_like(tokens)
    for e in range(E):
        for c in range(r.capacity):
            if not r.mask[e, c]:
                continue
            n = r.index[e, c]
            up = tokens[n] @ ex.w_up[e]
            h = F.silu(tokens[n] @ ex.w_gate[e]) * up if ex.w_gate is not None else F.gelu(up, approximate="tanh")
            y[n] += r.weight[e, c] * (h @ ex.w_down[e])
    return y.view_as(x)


@pytest.mark.parametrize("activation", ["gelu", "swiglu"])
@pytest.mark.parametrize("router", ROUTERS)
def test_padded_path_matches_token_loop(router, activation):
    layer = make_layer(router, activation)
    x = torch.randn(B, T, H)
    y, aux, _ = layer(x)
    assert layer.expert_impl == "padded_bmm"
    assert y.shape == x.shape and aux.dtype == torch.float32 and aux.dim() == 0
    assert_close(y, loop_reference(layer, x), rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(not grouped_mm_runs_here(), reason="torch._grouped_mm has no kernel on this device")
@pytest.mark.parametrize("activation", ["gelu", "swiglu"])
@pytest.mark.parametrize("router", ROUTERS)
def test_grouped_path_matches_padded_path(router, activation):
    """Forced onto the CPU fallback kernel in fp32, so both paths must agree tightly."""
    padded = make_layer(router, activation)
    grouped = make_layer(router, activation)
    set_expert_impl(grouped, "grouped_mm")
    x = torch.randn(B, T, H)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, auxa, _ = padded(xa)
    yb, auxb, _ = grouped(xb)
    assert_close(ya, yb, rtol=1e-5, atol=1e-6)
    (ya.pow(2).sum() + auxa).backward()
    (yb.pow(2).sum() + auxb).backward()
    assert_close(xa.grad, xb.grad, rtol=1e-5, atol=1e-6)
    for (name, pa), pb in zip(padded.named_parameters(), grouped.parameters()):
        assert_close(pa.grad, pb.grad, rtol=1e-5, atol=1e-6, msg=name)


def test_impl_choice(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert select_expert_impl(cpu, torch.bfloat16) == "padded_bmm"
    assert select_expert_impl(cpu, torch.float32) == "padded_bmm"
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert select_expert_impl(cuda, torch.bfloat16) == "grouped_mm"
    assert select_expert_impl(cuda, torch.float32) == "padded_bmm"
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert select_expert_impl(cuda, torch.bfloat16) == "padded_bmm"
    assert make_layer("switch").expert_impl == "padded_bmm"
    with pytest.raises(ValueError):
        MoELayer(ModelConfig(hidden=H), MoEConfig(experts=E), expert_impl="fast")
    with pytest.raises(ValueError):
        set_expert_impl(make_layer("switch"), "auto")


def test_parallelize_fixes_the_expert_impl_for_the_device_before_any_forward(monkeypatch):
    """The choice is made once, outside forward (a forward that writes attributes cannot be traced
    under activation checkpointing): a model built on CPU and parallelized for an sm90 GPU in bf16
    gets grouped_mm, and a forward on CPU does not change it."""
    from benchsuite.parallel import choose_expert_impl

    cfg = ModelConfig(layers=2, hidden=H, heads=2, vocab=32, seq_len=8, ffn_hidden=FFN)
    moe = MoEConfig(experts=E, every=1)
    model = build_model(cfg, moe)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert choose_expert_impl(model, precision="bf16", device=torch.device("cuda", 0)) == "grouped_mm"
    model(torch.zeros(1, 8, dtype=torch.long))
    assert [m.expert_impl for m in moe_mod.moe_layers(model)] == ["grouped_mm", "grouped_mm"]


@pytest.mark.parametrize("router", ROUTERS)
def test_gradients_reach_router_and_every_expert(router):
    layer = make_layer(router, "swiglu", capacity_factor=2.0)
    y, aux, _ = layer(torch.randn(B, T, H))
    (y.pow(2).sum() + aux).backward()
    assert layer.router.weight.grad.abs().sum() > 0
    for name in ("w_up", "w_gate", "w_down"):
        grad = getattr(layer.experts, name).grad
        assert grad.shape == (E, H, FFN) if name != "w_down" else (E, FFN, H)
        assert (grad.flatten(1).abs().sum(1) > 0).all(), name  # each expert got tokens


def test_dropped_tokens_give_exact_zero():
    layer = make_layer("switch", capacity_factor=1.25)
    with torch.no_grad():
        layer.router.weight.zero_()  # every token ties: all go to expert 0, which keeps C = 10
    y, _, s = layer(torch.randn(B, T, H))
    flat = y.reshape(-1, H)
    assert (flat[10:] == 0).all()
    assert (flat[:10].abs().sum(1) > 0).all()
    assert_close(s.dropped_frac, torch.tensor(22 / 32))
    assert_close(s.padding_frac, torch.tensor(30 / 40))
    assert_close(s.load_max_over_mean, torch.tensor(4.0))
    assert s.expert_load.tolist() == [32.0, 0.0, 0.0, 0.0]


def test_routing_stats_are_returned_detached_and_not_kept_on_the_layer():
    layer = make_layer("gshard")
    before = dict(vars(layer))
    _, _, s = layer(torch.randn(B, T, H, requires_grad=True))
    assert vars(layer) == before  # forward writes no attribute
    assert isinstance(s, RoutingStats)
    assert all(isinstance(v, torch.Tensor) and not v.requires_grad for v in s)
    assert s.expert_load.shape == (E,) and s.expert_load.sum() == 2 * B * T
    assert all(v.dim() == 0 for k, v in s._asdict().items() if k not in LOAD_STATS)
    assert s.tokens_per_expert.shape == (E,) and s.tokens_per_expert.sum() <= 2 * B * T


@pytest.mark.parametrize("router", ROUTERS)
def test_moe_inside_the_model(router):
    cfg = ModelConfig(layers=2, hidden=H, heads=2, vocab=32, seq_len=8, ffn_hidden=FFN)
    model = build_model(cfg, MoEConfig(experts=E, router=router, every=2, z_loss_coef=0.001), seed=0)
    assert isinstance(model.blocks[1].ffn, MoELayer) and not isinstance(model.blocks[0].ffn, MoELayer)
    idx = torch.randint(0, 32, (4, 8), generator=torch.Generator().manual_seed(0))
    logits, aux, routing = model(idx)
    assert logits.shape == (4, 8, 32) and aux > 0 and len(routing) == 1
    loss = F.cross_entropy(logits.flatten(0, 1), idx.flatten()) + aux
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    assert model.blocks[1].ffn.router.weight.grad.abs().sum() > 0
    stats = mean_scalars(scalar_rows(routing))
    assert set(stats) == {"dropped_frac", "padding_frac", "load_max_over_mean", "aux_loss", "z_loss"}
    assert stats["aux_loss"] + stats["z_loss"] == pytest.approx(aux.item(), rel=1e-6)


def test_router_runs_in_fp32_under_autocast(monkeypatch):
    layer = make_layer("switch")
    seen = {}
    real_route = moe_mod.route

    def spy(logits, moe, generator=None, bias=None):
        seen["dtype"] = logits.dtype
        return real_route(logits, moe, generator, bias)

    monkeypatch.setattr(moe_mod, "route", spy)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, aux, _ = layer(torch.randn(B, T, H))
    assert seen["dtype"] == torch.float32 and aux.dtype == torch.float32


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available() or select_expert_impl(torch.device("cuda"), torch.bfloat16)
                    != "grouped_mm", reason="needs a CUDA device with the grouped_mm kernel (sm90+)")
@pytest.mark.parametrize("router, capacity_factor", [(r, 1.0) for r in ROUTERS] + [("token_choice", 0.0)])
def test_grouped_path_on_cuda(router, capacity_factor):
    """bf16 on the real kernel: auto picks grouped_mm, and it matches the slot path (padded_bmm; for the
    dropless layer its sorted counterpart, loop_mm) to bf16 rounding."""
    cfg = ModelConfig(hidden=128, ffn_hidden=256, activation="swiglu")
    moe = MoEConfig(experts=8, router=router, capacity_factor=capacity_factor)
    torch.manual_seed(0)
    impl = select_expert_impl(torch.device("cuda"), torch.bfloat16)
    auto = MoELayer(cfg, moe, expert_impl=impl).cuda().bfloat16()
    padded = MoELayer(cfg, moe, expert_impl="padded_bmm").cuda().bfloat16()
    padded.load_state_dict(auto.state_dict())
    x = torch.randn(4, 64, 128, device="cuda", dtype=torch.bfloat16)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, _, _ = auto(xa)
    yb, _, _ = padded(xb)
    assert auto.expert_impl == "grouped_mm"
    assert padded.expert_impl == ("loop_mm" if moe.dropless else "padded_bmm")
    assert_near(ya, yb)
    ya.float().square().sum().backward()
    yb.float().square().sum().backward()
    assert_near(xa.grad, xb.grad)
    for (name, pa), pb in zip(auto.named_parameters(), padded.parameters()):
        assert_near(pa.grad, pb.grad, name)


def assert_near(a, b, what=""):
    """Relative error of the whole tensor: bf16 rounding, but not a wrong result."""
    err = (a.float() - b.float()).norm() / b.float().norm()
    assert err < 1e-2, f"{what}: relative error {err:.3g}"


def test_random_second_expert_under_recompute_needs_preserved_rng():
    """The draw uses the global RNG, which checkpoint restores with preserve_rng_state=True,
    so the recomputed forward routes as the first one did and the gradients match."""
    from torch.utils.checkpoint import checkpoint

    layer = make_layer("gshard", capacity_factor=2.0, second_expert_policy="random")
    x = torch.randn(B, T, H)
    grads = []
    for recompute in (False, True):
        layer.zero_grad()
        torch.manual_seed(7)
        y, aux, _ = checkpoint(layer, x, use_reentrant=False, preserve_rng_state=True) if recompute else layer(x)
        (y.pow(2).sum() + aux).backward()
        grads.append([p.grad.clone() for p in layer.parameters()])
    for a, b in zip(*grads):
        assert_close(a, b, rtol=1e-6, atol=0.0)


def test_expert_choice_without_z_loss_returns_no_aux_term():
    """A constant zero aux output breaks compiled backward graphs (no gradient flows to it)."""
    from benchsuite.config import ModelConfig, MoEConfig
    from benchsuite.models.moe import MoELayer

    cfg = ModelConfig(hidden=16, heads=2)
    x = torch.randn(2, 8, 16)
    assert MoELayer(cfg, MoEConfig(experts=4, router="expert_choice"))(x)[1] is None
    _, aux, _ = MoELayer(cfg, MoEConfig(experts=4, router="expert_choice", z_loss_coef=1e-3))(x)
    assert aux.requires_grad
    _, aux, _ = MoELayer(cfg, MoEConfig(experts=4, router="switch"))(x)
    assert aux.requires_grad


# ----------------------------------------------------------------------------- dropless (sorted layout)

def dropless_layer(router, activation, shared, impl, top_k=None, score="softmax", dtype=torch.float64):
    """A dropless layer, the same weights for every dtype (the router's logits are fp32 by design)."""
    torch.manual_seed(0)
    cfg = ModelConfig(hidden=H, ffn_hidden=FFN, activation=activation)
    moe = MoEConfig(experts=E, router=router, top_k=top_k, capacity_factor=0.0, shared_experts=shared,
                    score=score, aux_loss_coef=0.1, z_loss_coef=0.01)
    layer = MoELayer(cfg, moe, expert_impl=impl)
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(std=0.3)  # larger than the init, so every term of the output matters
    return layer.to(dtype)


def token_loop_reference(layer, x):
    """(output, aux loss) token by token in fp64 from the layer's parameters: each token's scores, its k
    experts by a stable descending sort (ties to the lower expert), the weights by the documented rule,
    each expert's FFN as vector-matrix products, the shared experts added; balancing loss
    coef * E/j * sum_i c_i P_i (j = 1 for switch/gshard, k for token_choice), z-loss coef * mean lse^2."""
    moe, ex = layer.moe, layer.experts
    tokens = x.reshape(-1, H)
    k = moe.k

    def ffn(v, w_up, w_gate, w_down):
        up = v @ w_up
        act = F.silu(v @ w_gate) * up if w_gate is not None else F.gelu(up, approximate="tanh")
        return act @ w_down

    rows, probs, chosen_counts, lse = [], [], torch.zeros(E, dtype=torch.float64), []
    for v in tokens:
        logit = v @ layer.router.weight.t()
        lse.append(torch.logsumexp(logit, 0))
        score = logit.sigmoid() if moe.score == "sigmoid" else logit.softmax(0)
        probs.append(score / score.sum())
        order = sorted(range(E), key=lambda e: -score[e].item())[:k]
        gates = torch.stack([score[e] for e in order])
        if moe.router != "switch":
            gates = gates / gates.sum()
        out = sum(g * ffn(v, ex.w_up[e], ex.w_gate[e] if ex.w_gate is not None else None, ex.w_down[e])
                  for g, e in zip(gates, order))
        if layer.shared is not None:
            sh = layer.shared
            out = out + ffn(v, sh.up.weight.t(), sh.gate.weight.t() if sh.gate is not None else None, sh.down.weight.t())
        rows.append(out)
        for e in (order if moe.router == "token_choice" else order[:1]):
            chosen_counts[e] += 1
    n, j = len(rows), (k if moe.router == "token_choice" else 1)
    balance = moe.aux_loss_coef * E / j * ((chosen_counts / n) * torch.stack(probs).mean(0)).sum()
    z = moe.z_loss_coef * torch.stack(lse).pow(2).mean()
    return torch.stack(rows).view_as(x), balance + z


SORTED_IMPLS_HERE = ["loop_mm"] + (["grouped_mm"] if grouped_mm_runs_here() else [])


@pytest.mark.parametrize("impl", SORTED_IMPLS_HERE)
@pytest.mark.parametrize("activation, shared", [("gelu", 0), ("swiglu", 2)])
@pytest.mark.parametrize("router, top_k, score", [("switch", None, "softmax"), ("gshard", None, "softmax"),
                                                  ("token_choice", 3, "softmax"), ("token_choice", 2, "sigmoid")])
def test_dropless_output_and_every_gradient_equal_a_per_token_fp64_loop(router, top_k, score, activation,
                                                                        shared, impl):
    """loop_mm runs its experts in fp64, grouped_mm (no fp64 kernel) in fp32; the router's logits are fp32
    by design in both, so the tolerance is fp32 rounding (a wrong weight, expert or order is off by > 1e-2)."""
    dtype = torch.float64 if impl == "loop_mm" else torch.float32
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float64 else dict(rtol=1e-4, atol=1e-4)
    layer = dropless_layer(router, activation, shared, impl, top_k, score, dtype)
    ref = dropless_layer(router, activation, shared, impl, top_k, score)
    assert layer.expert_impl == impl
    x = torch.randn(B, T, H, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    xa, xb = x.to(dtype, copy=True).requires_grad_(), x.clone().requires_grad_()
    target = torch.randn(B, T, H, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    y, aux, stats = layer(xa)
    y_ref, aux_ref = token_loop_reference(ref, xb)
    assert_close(y.double(), y_ref, **tol)
    assert_close(aux.double(), aux_ref, rtol=1e-5, atol=1e-7)
    ((y.double() * target).sum() + aux).backward()
    ((y_ref * target).sum() + aux_ref).backward()
    assert_close(xa.grad.double(), xb.grad, **tol)
    for (name, pa), pb in zip(layer.named_parameters(), ref.parameters()):
        assert pa.grad is not None and pa.grad.abs().sum() > 0, name
        assert_close(pa.grad.double(), pb.grad, **tol, msg=name)
    assert stats.dropped_frac == 0 and stats.padding_frac == 0
    assert stats.tokens_per_expert.sum() == B * T * layer.moe.k
    assert torch.equal(stats.tokens_per_expert, stats.expert_load)


def test_dropless_keeps_every_token_where_a_capacity_router_drops():
    """All tokens tie onto expert 0: switch with cf 1.25 keeps 10 of 32 (test above), dropless all 32."""
    torch.manual_seed(0)
    layer = MoELayer(ModelConfig(hidden=H, ffn_hidden=FFN), MoEConfig(experts=E, capacity_factor=0.0))
    with torch.no_grad():
        layer.router.weight.zero_()
    y, _, s = layer(torch.randn(B, T, H))
    assert (y.reshape(-1, H).abs().sum(1) > 0).all()
    assert s.expert_load.tolist() == s.tokens_per_expert.tolist() == [32.0, 0.0, 0.0, 0.0]
    assert s.dropped_frac == 0 and s.load_max_over_mean == 4.0


def test_shared_experts_add_a_dense_mlp_to_the_routed_output():
    """A layer with shared experts is the same layer without them plus their MLP over every token."""
    torch.manual_seed(0)
    cfg = ModelConfig(hidden=H, ffn_hidden=FFN, activation="swiglu")
    with_shared = MoELayer(cfg, MoEConfig(experts=E, router="gshard", shared_experts=2))
    plain = MoELayer(cfg, MoEConfig(experts=E, router="gshard"))
    plain.load_state_dict({k: v for k, v in with_shared.state_dict().items() if not k.startswith("shared.")})
    assert with_shared.shared.up.weight.shape == (2 * FFN, H)
    x = torch.randn(B, T, H)
    assert_close(with_shared(x)[0], plain(x)[0] + with_shared.shared(x)[0], rtol=1e-6, atol=1e-6)


def test_expert_impl_per_layout():
    """The device's choice (padded_bmm | grouped_mm) runs as itself on slots and as loop_mm | grouped_mm
    on sorted rows; loop_mm has no slot form."""
    cfg = ModelConfig(hidden=H, ffn_hidden=FFN)
    dropless = MoELayer(cfg, MoEConfig(experts=E, router="token_choice", capacity_factor=0.0))
    capped = MoELayer(cfg, MoEConfig(experts=E, router="token_choice"))
    assert (dropless.expert_impl, capped.expert_impl) == ("loop_mm", "padded_bmm")
    for layer in (dropless, capped):
        set_expert_impl(layer, "grouped_mm")
        assert layer.expert_impl == "grouped_mm"
    with pytest.raises(ValueError, match="with capacity"):
        MoELayer(cfg, MoEConfig(experts=E), expert_impl="loop_mm")
    with pytest.raises(ValueError):
        dropless.experts.forward_sorted(torch.zeros(2, H), torch.tensor([2, 0, 0, 0]), "padded_bmm")


def test_loop_mm_and_grouped_mm_agree_on_empty_and_full_groups():
    if not grouped_mm_runs_here():
        pytest.skip("torch._grouped_mm has no kernel on this device")
    from benchsuite.models.moe import Experts

    torch.manual_seed(0)
    ex = Experts(E, H, FFN, "swiglu")
    x = torch.randn(10, H)
    counts = torch.tensor([0, 7, 0, 3])
    assert_close(ex.forward_sorted(x, counts, "loop_mm"), ex.forward_sorted(x, counts, "grouped_mm"),
                 rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- record figures

def test_merge_sums_loads_over_ranks_and_defines_imbalance_per_step():
    from benchsuite.assembly.harness import merge_moe_stats

    def rank(tokens, by_step):
        scalars = {"dropped_frac": 0.0, "padding_frac": 0.0, "load_max_over_mean": 1.0, "aux_loss": 0.1,
                   "z_loss": 0.0}
        return {**scalars, "expert_load": tokens, "tokens_per_expert": tokens, "load_by_step": by_step,
                "expert_impl": "loop_mm", "all_to_all_share": None}

    # two ranks, two MoE layers, two experts, two steps
    a = rank([[3.0, 1.0], [2.0, 2.0]], [[[4.0, 0.0], [2.0, 2.0]], [[3.0, 1.0], [2.0, 2.0]]])
    b = rank([[1.0, 3.0], [2.0, 2.0]], [[[4.0, 0.0], [1.0, 3.0]], [[1.0, 3.0], [2.0, 2.0]]])
    m = merge_moe_stats([a, b])
    assert m["tokens_per_expert"] == [[4.0, 4.0], [4.0, 4.0]]
    assert m["tokens_per_expert_max"] == 4.0 and m["tokens_per_expert_mean"] == 4.0
    # step 0: layer loads [8, 0] (max/mean 2) and [3, 5] (1.25); step 1: [4, 4] and [4, 4]
    assert m["imbalance_by_step"] == [pytest.approx(1.625), 1.0]
    assert m["imbalance_mean"] == pytest.approx(1.3125) and m["imbalance_max"] == pytest.approx(1.625)
    assert m["expert_impl"] == "loop_mm" and "load_by_step" not in m


def test_upgrade_v2_moe_adds_config_defaults_and_the_figures_a_v2_record_determines():
    from benchsuite.results.migrate import upgrade_v2_moe
    from benchsuite.record import validate
    from benchsuite.results.migrate import migrate

    def v2(router, dropped):
        return {"schema_version": 2, "run_key": "k", "suite": "s", "workload": "w", "status": "ok", "error": None,
                "started_at": "2026-01-01T00:00:00+00:00", "duration_s": 1.0, "env": {}, "energy": None, "carbon": None, "steps": [],
                "config": {"world_size": 1, "nodes": 1, "scaling": "weak",
                           "moe": {"router": router, "experts": 2, "capacity_factor": 1.0}},
                "metrics": {"moe": {"dropped_frac": dropped, "expert_load": [[3.0, 1.0]], "expert_impl": "padded_bmm"}}}

    old = v2("switch", 0.25)
    new = upgrade_v2_moe(old)
    assert "top_k" not in old["config"]["moe"]  # the input is not changed
    assert new["config"]["moe"] == {"router": "switch", "experts": 2, "capacity_factor": 1.0, "top_k": None,
                                    "min_capacity": 0, "shared_experts": 0, "score": "softmax"}
    m = new["metrics"]["moe"]
    assert m["tokens_per_expert"] is None and m["imbalance_by_step"] is None and m["imbalance_mean"] is None
    assert "expert_load counts dropped tokens" in m["upgraded_from"]
    m = upgrade_v2_moe(v2("switch", 0.0))["metrics"]["moe"]
    assert m["tokens_per_expert"] == [[3.0, 1.0]] and m["tokens_per_expert_max"] == 3.0
    assert m["tokens_per_expert_mean"] == 2.0
    assert upgrade_v2_moe(v2("expert_choice", 0.5))["metrics"]["moe"]["tokens_per_expert"] == [[3.0, 1.0]]
    validate(migrate(v2("switch", 0.25)))  # the whole chain from version 2 gives a record the types accept
    dense = {"config": {"moe": None}, "metrics": {"tokens_per_s": 1.0}}
    assert upgrade_v2_moe(dense) is dense
