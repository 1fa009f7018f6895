"""MoELayer: the padded path against a per-token loop, gradients, the model, drops, impl choice."""

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from benchsuite.config import ModelConfig, MoEConfig
from benchsuite.models import moe as moe_mod
from benchsuite.models.moe import (MoELayer, RoutingStats, route, select_expert_impl, set_expert_impl,
                                   summarize_stats)
from benchsuite.models.transformer import build_model

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


def grouped_mm_runs_here():
    try:
        torch._grouped_mm(torch.ones(2, 8), torch.ones(1, 8, 8), offs=torch.tensor([2], dtype=torch.int32))
        return True
    except (AttributeError, RuntimeError, NotImplementedError):
        return False


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
    assert all(v.dim() == 0 for k, v in s._asdict().items() if k != "expert_load")


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
    stats = summarize_stats(routing)
    assert set(stats) == {"dropped_frac", "padding_frac", "load_max_over_mean", "aux_loss", "z_loss"}
    assert stats["aux_loss"] + stats["z_loss"] == pytest.approx(aux.item(), rel=1e-6)


def test_router_runs_in_fp32_under_autocast(monkeypatch):
    layer = make_layer("switch")
    seen = {}
    real_route = moe_mod.route

    def spy(logits, moe, generator=None):
        seen["dtype"] = logits.dtype
        return real_route(logits, moe, generator)

    monkeypatch.setattr(moe_mod, "route", spy)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, aux, _ = layer(torch.randn(B, T, H))
    assert seen["dtype"] == torch.float32 and aux.dtype == torch.float32


@pytest.mark.skipif(not torch.cuda.is_available() or select_expert_impl(torch.device("cuda"), torch.bfloat16)
                    != "grouped_mm", reason="needs a CUDA device with the grouped_mm kernel (sm90+)")
@pytest.mark.parametrize("router", ROUTERS)
def test_grouped_path_on_cuda(router):
    """bf16 on the real kernel: auto picks grouped_mm, and it matches padded_bmm to bf16 rounding."""
    cfg = ModelConfig(hidden=128, ffn_hidden=256, activation="swiglu")
    moe = MoEConfig(experts=8, router=router, capacity_factor=1.0)
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
