"""The MoE models users train: forced routing, aux-loss-free balancing, normalize_top_k, and Hugging
Face's Mixtral, Qwen3-MoE and OLMoE against ours.

Forced routing (routing = "forced") gives token i's j-th choice to expert (i * k + j) mod E: every
expert gets exactly its share of the call's N * k assignments, on every router and layout; the gates
stay the router's own probabilities at those experts, so the router's compute and gradient stay in
the step. Aux-free balancing (balance = "aux_free") adds a per-expert bias to the scores only to
choose; update_expert_bias moves it toward balance once per step.

Hugging Face parity, fp32, Hugging Face's weights (random, norms off one) mapped into our layout by
one function that maps its gradients too; relative error ‖a − b‖ / ‖b‖ ≤ 1e-5 on the outputs, the
loss and every gradient:
- the sparse MoE blocks (MixtralSparseMoeBlock: softmax, top-2, renormalised; Qwen3MoeSparseMoeBlock
  with norm_topk_prob true; OlmoeSparseMoeBlock with norm_topk_prob false) against MoELayer with
  router = "token_choice", dropless, SwiGLU experts, no shared experts. Their experts are fused
  [E, 2F, H] gate_up_proj ([gate; up] rows) and [E, H, F] down_proj; ours [E, H, F] w_gate / w_up
  and [E, F, H] w_down.
- the auxiliary loss against their load_balancing_loss_func (test docstring: where the conventions
  meet and where they part).
- the whole models (MixtralForCausalLM, Qwen3MoeForCausalLM, OlmoeForCausalLM): logits, loss and
  every gradient, two layers with the auxiliary loss off on both sides (over several layers its
  conventions differ), and one layer with it on (theirs times c, ours times k * c).
Hugging Face picks with torch.topk, ours with a stable sort: the same experts without ties, and
random weights leave none.
"""

from __future__ import annotations

from dataclasses import dataclass

from msgspec.structs import replace
from typing import Callable

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from benchsuite.config import ModelConfig, MoEConfig
from helpers.hf_layout import decoder_in_our_layout
from benchsuite.models.moe import MoELayer, forced_experts, moe_layers, route, update_expert_bias
from benchsuite.models.transformer import build_model

H, FFN, B, T = 16, 24, 2, 16  # N = 32 tokens
TOL = 1e-5


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach(), b.detach()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def moe_layer(seed: int = 0, router_std: float = 0.3, **moe) -> MoELayer:
    """A SwiGLU MoE layer of E = 4 experts unless `moe` says otherwise, router weights large enough that
    the router's choices are clear."""
    torch.manual_seed(seed)
    layer = MoELayer(ModelConfig(hidden=H, ffn_hidden=FFN, activation="swiglu"),
                     MoEConfig(**{"experts": 4, "z_loss_coef": 0.0, **moe}))
    with torch.no_grad():
        layer.router.weight.normal_(std=router_std)
    return layer


def tokens(seed: int = 1, offset: float = 0.0) -> torch.Tensor:
    return torch.randn(B, T, H, generator=torch.Generator().manual_seed(seed)) + offset


# ----------------------------------------------------------------------------- forced routing

PATHS = [  # (router, top_k, capacity_factor): each token-choice router, capacity (slots) and dropless (sorted rows)
    ("switch", None, 1.0), ("switch", None, 0.0), ("gshard", None, 1.0), ("gshard", None, 0.0),
    ("token_choice", 3, 1.0), ("token_choice", 3, 0.0),
]


@pytest.mark.parametrize("router, top_k, capacity_factor", PATHS)
def test_forced_routing_gives_every_expert_exactly_its_share(router, top_k, capacity_factor):
    """A router skewed onto expert 0 (a large weight on a shared input direction): learned routing
    piles onto it, forced routing gives each of the 4 experts exactly k * 32 / 4 assignments, all
    computed (capacity 1.0 holds exactly that share)."""
    kw = dict(router=router, top_k=top_k, capacity_factor=capacity_factor)
    learned, forced = moe_layer(**kw), moe_layer(**kw, routing="forced")
    with torch.no_grad():
        for layer in (learned, forced):
            layer.router.weight[0] += 1.0
    x = tokens(offset=1.0)
    k = forced.moe.k
    share = k * B * T / 4
    _, _, skewed = learned(x)
    y, _, s = forced(x)
    assert skewed.expert_load[0] == B * T  # learned: every token has expert 0 among its k
    assert s.expert_load.tolist() == [share] * 4
    assert s.tokens_per_expert.tolist() == [share] * 4
    assert s.dropped_frac == 0 and s.load_max_over_mean == 1.0
    assert y.shape == x.shape


def test_forced_counts_differ_by_at_most_one_when_the_experts_do_not_divide_the_assignments():
    """30 tokens x top-3 = 90 assignments over 4 experts: the round robin gives 23, 23, 22, 22."""
    moe = MoEConfig(experts=4, router="token_choice", top_k=3, capacity_factor=0.0, routing="forced")
    r = route(torch.randn(30, 4), moe)
    assert r.counts.tolist() == [23, 23, 22, 22]
    chosen = forced_experts(30, moe, torch.device("cpu"))
    assert all(len(set(row)) == 3 for row in chosen.tolist())  # a token's k experts are distinct


@pytest.mark.parametrize("normalize", [None, False])
def test_forced_gates_are_the_routers_probabilities_at_the_forced_experts(normalize):
    """Token i's j-th assignment goes to expert (3i + j) mod 4 with the softmax probability there,
    renormalised over the token's 3 as the router would (normalize_top_k default) or not (false)."""
    moe = MoEConfig(experts=4, router="token_choice", top_k=3, capacity_factor=0.0, routing="forced",
                    normalize_top_k=normalize)
    logits = torch.randn(8, 4, generator=torch.Generator().manual_seed(0))
    r = route(logits, moe)
    probs = logits.softmax(-1)
    want = {}  # (token, expert) -> gate
    for i in range(8):
        chosen = [(3 * i + j) % 4 for j in range(3)]
        total = probs[i, chosen].sum() if normalize is None else 1.0
        want.update({(i, e): probs[i, e] / total for e in chosen})
    experts = torch.repeat_interleave(torch.arange(4), r.counts)
    got = {(t, e): w for t, e, w in zip(r.token.tolist(), experts.tolist(), r.weight)}
    assert got.keys() == want.keys()
    for key, w in want.items():
        assert_close(got[key], w, msg=str(key))


def test_learned_and_forced_on_the_same_weights():
    """Same weights, same tokens: the same output shape, different routing and output, and the router
    still gets a gradient under forced routing (its probabilities are the gates)."""
    learned = moe_layer(router="token_choice", top_k=2, capacity_factor=0.0)
    forced = moe_layer(router="token_choice", top_k=2, capacity_factor=0.0, routing="forced")
    forced.load_state_dict(learned.state_dict())
    x = tokens()
    (ya, _, sa), (yb, _, sb) = learned(x), forced(x)
    assert ya.shape == yb.shape == x.shape
    assert not torch.equal(sa.expert_load, sb.expert_load) and not torch.allclose(ya, yb)
    yb.square().sum().backward()
    assert forced.router.weight.grad.abs().sum() > 0


# ----------------------------------------------------------------------------- normalize_top_k

def test_normalize_top_k_false_keeps_the_raw_probabilities():
    """OLMoE's gates are the top-k softmax probabilities (summing to less than 1); Mixtral's and Qwen3's,
    the default, are renormalised to 1."""
    logits = torch.randn(16, 8, generator=torch.Generator().manual_seed(0))
    moe = MoEConfig(experts=8, router="token_choice", top_k=2, capacity_factor=0.0)
    raw, default, renorm = (route(logits, replace(moe, normalize_top_k=v)) for v in (False, None, True))
    top = logits.softmax(-1).topk(2).values  # [N, 2]
    per_token = torch.zeros(16).index_add(0, raw.token, raw.weight)
    assert_close(per_token, top.sum(-1))
    assert_close(torch.zeros(16).index_add(0, default.token, default.weight), torch.ones(16))
    assert torch.equal(default.weight, renorm.weight) and torch.equal(raw.token, renorm.token)


# ----------------------------------------------------------------------------- aux-free balancing

@pytest.mark.parametrize("router, score", [("switch", "softmax"), ("token_choice", "softmax"),
                                           ("token_choice", "sigmoid")])
def test_the_bias_chooses_the_experts_but_never_sets_a_gate(router, score):
    """A large bias on expert 3 puts every token there, with expert 3's own score as its gate (switch:
    the probability; token_choice: renormalised over the token's 2); a bias the same for every expert
    changes nothing."""
    kw = dict(router=router, top_k=2 if router == "token_choice" else None, score=score)
    moe = MoEConfig(experts=4, capacity_factor=0.0, balance="aux_free", **kw)
    logits = torch.randn(8, 4, generator=torch.Generator().manual_seed(0))
    scores = logits.sigmoid() if score == "sigmoid" else logits.softmax(-1)
    plain = route(logits, moe)
    same = route(logits, moe, bias=torch.ones(4))
    assert torch.equal(plain.token, same.token) and torch.equal(plain.weight, same.weight)
    r = route(logits, moe, bias=torch.tensor([0.0, 0.0, 0.0, 10.0]))
    assert r.counts[3] == 8
    expert3 = r.weight[-8:]  # the sorted layout's last group: expert 3's assignments, in token order
    assert r.token[-8:].tolist() == list(range(8))
    if router == "switch":
        assert_close(expert3, scores[:, 3])
    else:
        other = scores[:, :3].max(-1).values  # each token's second choice: its best of the unbiased experts
        assert_close(expert3, scores[:, 3] / (scores[:, 3] + other))


def test_aux_free_buffers_get_no_gradient_and_the_default_has_none():
    layer = moe_layer(router="token_choice", top_k=2, capacity_factor=0.0, balance="aux_free")
    assert "expert_bias" in layer.state_dict() and "step_load" not in layer.state_dict()
    assert all(not n.endswith(("expert_bias", "step_load")) for n, _ in layer.named_parameters())
    y, aux, _ = layer(tokens())
    (y.square().sum() + aux).backward()
    assert not layer.expert_bias.requires_grad and layer.expert_bias.grad is None
    assert layer.router.weight.grad.abs().sum() > 0
    plain = moe_layer(router="token_choice", top_k=2, capacity_factor=0.0)
    assert plain.expert_bias is None and plain.step_load is None
    assert set(plain.state_dict()) == set(layer.state_dict()) - {"expert_bias"}


def test_aux_free_keeps_the_aux_loss_when_its_coefficient_is_set():
    """DeepSeek-V3 keeps a small balancing loss beside the bias: aux_loss_coef > 0 still adds it."""
    a = moe_layer(router="token_choice", top_k=2, capacity_factor=0.0, balance="aux_free", aux_loss_coef=0.01)
    b = moe_layer(router="token_choice", top_k=2, capacity_factor=0.0, aux_loss_coef=0.01)
    x = tokens()
    assert_close(a(x)[1], b(x)[1])
    assert a(x)[1] > 0


@pytest.mark.parametrize("router, top_k, capacity_factor", PATHS)
def test_aux_free_bias_balances_a_skewed_router(router, top_k, capacity_factor):
    """Tokens sharing a direction the router favours for expert 0 (max / mean load 2.3 to 5 of 8 experts):
    60 forward + update steps with the router fixed (only the bias moves) bring it to at most 0.6 of
    that, with the overloaded expert's bias below every other's; every step's load reached step_load
    and was cleared."""
    layer = moe_layer(router=router, top_k=top_k, capacity_factor=capacity_factor, experts=8,
                      balance="aux_free", bias_update=1e-2)
    with torch.no_grad():
        layer.router.weight[0] += 0.3
    x = tokens(offset=0.5)
    imbalance = []
    for _ in range(60):
        _, _, s = layer(x)
        assert torch.equal(layer.step_load, s.expert_load)
        imbalance.append(s.load_max_over_mean.item())
        update_expert_bias(layer)
        assert not layer.step_load.any()
    assert imbalance[0] > 2 and max(imbalance[-10:]) <= 0.6 * imbalance[0], imbalance
    assert layer.expert_bias.argmin() == 0


def test_step_load_counts_training_forwards_only():
    layer = moe_layer(router="switch", capacity_factor=0.0, balance="aux_free")
    layer.eval()
    with torch.no_grad():
        layer(tokens())
    assert not layer.step_load.any()
    layer.train()
    _, _, s1 = layer(tokens(1))
    _, _, s2 = layer(tokens(2))  # gradient accumulation: the step's micro-batches add up
    assert torch.equal(layer.step_load, s1.expert_load + s2.expert_load)


def test_recompute_routes_as_the_forward_did_and_moves_the_bias_the_same():
    """Under activation checkpointing the recompute routes with the bias its forward used (the bias moves
    only in update_expert_bias), so the gradients equal the plain step's. torch's non-reentrant checkpoint
    stops its recompute once the saved tensors are rebuilt (early stop), before the load is added: the
    load counts once; a recompute run to the end adds it a second time, and sign() takes the same step
    from the doubled load."""
    from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop

    results = []
    for recompute, counted in (("none", 1), ("early stop", 1), ("to the end", 2)):
        layer = moe_layer(router="token_choice", top_k=2, capacity_factor=0.0, experts=8, balance="aux_free")
        with torch.no_grad():
            layer.expert_bias.copy_(torch.linspace(-0.1, 0.1, 8))
        x = tokens()
        with set_checkpoint_early_stop(recompute == "early stop"):
            y, aux, s = layer(x) if recompute == "none" else checkpoint(layer, x, use_reentrant=False)
            (y.square().sum() + aux).backward()
        assert torch.equal(layer.step_load, counted * s.expert_load), recompute
        update_expert_bias(layer)
        results.append((layer.expert_bias.clone(), [p.grad for p in layer.parameters()]))
    (bias, grads), *others = results
    for other_bias, other_grads in others:
        assert torch.equal(other_bias, bias)
        for a, b in zip(other_grads, grads):
            assert_close(a, b, rtol=1e-6, atol=0.0)


def test_the_worker_moves_the_bias_once_per_step_from_every_micro_batch():
    """worker.set_up adds update_expert_bias to the step's grad hooks: one train step of two micro-batches
    moves each layer's bias by bias_update * sign(mean - load) of the two micro-batches' summed load."""
    from benchsuite import worker
    from benchsuite.config import parse_suite
    from benchsuite.dist import DistContext, ParallelDims

    moe = {"experts": 4, "router": "token_choice", "top_k": 2, "capacity_factor": 0, "every": 1,
           "balance": "aux_free", "bias_update": 0.01}
    run = parse_suite({"defaults": {"model": {"layers": 2, "hidden": 32, "heads": 2, "vocab": 128, "seq_len": 16},
                                    "train": {"micro_batch": 2, "precision": "fp32", "grad_accum": 2}},
                       "workload": [{"name": "m", "kind": "moe", "moe": moe}]}).runs[0]
    bench = worker.set_up(run, DistContext(0, 0, 1, 0, torch.device("cpu"), None, ParallelDims(1)))
    layers = moe_layers(bench.par.model)
    batches = bench.batches(0)
    for inputs, _ in batches:  # the step's routing, before the step: same weights, same bias
        bench.par.model(inputs)
    loads = [layer.step_load.clone() for layer in layers]
    for layer in layers:
        layer.step_load.zero_()
    bench.step(batches)
    for layer, load in zip(layers, loads):
        assert torch.equal(layer.expert_bias, 0.01 * torch.sign(load.mean() - load))
        assert not layer.step_load.any()


@pytest.mark.heavy
def test_aux_free_compiles_whole_and_recompute_moves_the_bias_the_same(monkeypatch):
    """As the worker runs it (parallelize: checkpoint, then one compiled region per block on dynamo's
    aot_eager; update_expert_bias as a grad hook): the add to step_load is a buffer mutation inside the
    graph, no graph break; with and without full recompute every step routes and moves the bias alike."""
    from torch._dynamo.testing import CompileCounterWithBackend

    from benchsuite.config import TrainConfig
    from benchsuite.dist import ParallelDims
    from benchsuite.parallel import parallelize
    from benchsuite.worker import train_step

    cpu = torch.device("cpu")
    moe = MoEConfig(experts=4, router="token_choice", top_k=2, capacity_factor=1.0, every=2, z_loss_coef=0.0,
                    balance="aux_free", bias_update=0.01)
    cfg = ModelConfig(layers=2, hidden=32, heads=2, vocab=64, seq_len=16, ffn_hidden=64)
    compile_module = torch.nn.Module.compile
    biases = []
    for recompute in ("none", "full"):
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        backend = CompileCounterWithBackend("aot_eager")
        monkeypatch.setattr(torch.nn.Module, "compile", lambda self, **kw: compile_module(self, backend=backend))
        train = TrainConfig(micro_batch=2, precision="fp32", compile=True, recompute=recompute)
        model = build_model(cfg, moe, seed=0)
        par = parallelize(model, dims=ParallelDims(1), train=train, moe=moe, device=cpu)
        par.grad_hooks.append(lambda: update_expert_bias(model))
        steps = []
        for step in range(4):
            x = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(step))
            loads = train_step(par, [(x, torch.roll(x, -1, 1))], "fp32", cpu).routing[0].expert_load
            steps.append((loads, model.blocks[1].ffn.expert_bias.clone()))
        assert dict(torch._dynamo.utils.counters["graph_break"]) == {} and backend.frame_count == 2
        assert not model.blocks[1].ffn.step_load.any()
        biases.append(steps)
    torch._dynamo.reset()
    for (load_a, bias_a), (load_b, bias_b) in zip(*biases):
        assert torch.equal(load_a, load_b) and torch.equal(bias_a, bias_b)
    assert biases[0][-1][1].any()


# ----------------------------------------------------------------------------- Hugging Face: the families

@dataclass(frozen=True)
class Family:
    """One Hugging Face MoE model, tiny, and its config in our terms."""

    name: str
    config: Callable  # Hugging Face config class
    block: Callable  # its sparse MoE block class
    causal_lm: Callable  # its ForCausalLM class
    hf_kwargs: dict  # what sets its experts, top-k and normalisation
    model: ModelConfig  # ours, the attention and norms as theirs
    moe: MoEConfig  # ours: token_choice, dropless, no loss terms


MODEL = dict(layers=2, hidden=32, heads=4, kv_heads=2, vocab=64, seq_len=16, activation="swiglu", norm="rmsnorm",
             position="rope")
NO_LOSS = dict(router="token_choice", capacity_factor=0.0, every=1, aux_loss_coef=0.0, z_loss_coef=0.0)


FAMILIES = ("mixtral", "qwen3_moe", "olmoe")


def family_of(name: str) -> Family:
    """The family by name; skips where transformers (a test-only reference) is not installed."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.mixtral import modeling_mixtral as mixtral
    from transformers.models.olmoe import modeling_olmoe as olmoe
    from transformers.models.qwen3_moe import modeling_qwen3_moe as qwen3_moe

    families = {f.name: f for f in (
        Family("mixtral", transformers.MixtralConfig, mixtral.MixtralSparseMoeBlock, transformers.MixtralForCausalLM,
               dict(num_local_experts=4, num_experts_per_tok=2, intermediate_size=FFN),
               ModelConfig(**MODEL, norm_eps=1e-5, rope_theta=1e6),
               MoEConfig(experts=4, top_k=2, expert_hidden=FFN, **NO_LOSS)),
        Family("qwen3_moe", transformers.Qwen3MoeConfig, qwen3_moe.Qwen3MoeSparseMoeBlock,
               transformers.Qwen3MoeForCausalLM,
               dict(num_experts=8, num_experts_per_tok=4, moe_intermediate_size=FFN, norm_topk_prob=True,
                    decoder_sparse_step=1, mlp_only_layers=[]),
               ModelConfig(**MODEL, norm_eps=1e-6, rope_theta=1e6, head_dim=16, qk_norm="per_head"),
               MoEConfig(experts=8, top_k=4, expert_hidden=FFN, normalize_top_k=True, **NO_LOSS)),
        Family("olmoe", transformers.OlmoeConfig, olmoe.OlmoeSparseMoeBlock, transformers.OlmoeForCausalLM,
               dict(num_experts=8, num_experts_per_tok=2, intermediate_size=FFN, norm_topk_prob=False),
               ModelConfig(**MODEL, norm_eps=1e-5, rope_theta=10000.0, qk_norm="full"),
               MoEConfig(experts=8, top_k=2, expert_hidden=FFN, normalize_top_k=False, **NO_LOSS)),
    )}
    return families[name]


def hf_config(family: Family, cfg: ModelConfig, aux_coef: float = 0.0):
    """Their config from ours: eager attention and experts (the reference loops), their auxiliary loss
    times aux_coef (none at 0: output_router_logits false), no special token ids outside the tiny
    vocabulary."""
    return family.config(
        vocab_size=cfg.vocab, hidden_size=cfg.hidden, num_hidden_layers=cfg.layers, num_attention_heads=cfg.heads,
        num_key_value_heads=cfg.n_kv_heads, head_dim=cfg.dim_head, max_position_embeddings=cfg.seq_len,
        rms_norm_eps=cfg.norm_eps, hidden_act="silu",
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta}, tie_word_embeddings=False,
        attention_bias=False, use_cache=False, output_router_logits=aux_coef > 0, router_aux_loss_coef=aux_coef,
        attn_implementation="eager", experts_implementation="eager", pad_token_id=None, bos_token_id=None, eos_token_id=None, **family.hf_kwargs)


def randomize(module: torch.nn.Module) -> None:
    """Every weight drawn anew: matrices N(0, 0.1²) and the routers N(0, 0.5²) (their init may leave a
    router at zero, where every expert ties), norm weights around one."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if p.dim() == 1:
                p.normal_(mean=1.0, std=0.1)
            else:
                p.normal_(std=0.5 if name.endswith("gate.weight") else 0.1)


def moe_in_our_layout(hf: dict, prefix: str) -> dict:
    """A sparse MoE block's tensors (weights or gradients) by our MoELayer names: the router as it is,
    gate_up_proj's [gate; up] rows and down_proj transposed into [E, H, F] / [E, F, H]."""
    gate, up = hf[prefix + "experts.gate_up_proj"].chunk(2, dim=1)  # each [E, F, H]
    return {"router.weight": hf[prefix + "gate.weight"], "experts.w_gate": gate.mT, "experts.w_up": up.mT,
            "experts.w_down": hf[prefix + "experts.down_proj"].mT}


def model_in_our_layout(hf: dict, cfg: ModelConfig) -> dict:
    """A Mixtral/Qwen3-MoE/OLMoE ForCausalLM's tensors (weights or gradients) by our GPT names."""
    return decoder_in_our_layout(hf, cfg, lambda tensors, layer: moe_in_our_layout(tensors, layer + "mlp."))


def load_into(ours: torch.nn.Module, weights: dict) -> None:
    assert set(weights) == {n for n, _ in ours.named_parameters()}, "the mapping must cover every parameter"
    with torch.no_grad():
        for name, p in ours.named_parameters():
            p.copy_(weights[name])


def block_errors(family: Family) -> dict[str, float]:
    """Relative errors of our MoE layer against their sparse block: output and every gradient."""
    torch.manual_seed(0)
    theirs = family.block(hf_config(family, family.model))
    randomize(theirs)
    ours = MoELayer(family.model, family.moe)
    load_into(ours, moe_in_our_layout(dict(theirs.named_parameters()), ""))
    x = torch.randn(B, T, family.model.hidden)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    target = torch.randn(B, T, family.model.hidden)
    y, aux, stats = ours(xa)
    ref = theirs(xb)
    assert aux is None and stats.tokens_per_expert.sum() == B * T * family.moe.k
    (y * target).sum().backward()
    (ref * target).sum().backward()
    ref_grads = moe_in_our_layout({n: p.grad for n, p in theirs.named_parameters()}, "")
    errors = {"output": rel(y, ref), "input grad": rel(xa.grad, xb.grad)}
    errors.update({n: rel(p.grad, ref_grads[n]) for n, p in ours.named_parameters()})
    return errors


@pytest.mark.parametrize("name", FAMILIES)
def test_moe_block_matches_hugging_face(name):
    errors = block_errors(family_of(name))
    assert max(errors.values()) <= TOL, f"{name}: {errors}"


def model_errors(family: Family, aux_coef: float = 0.0) -> dict[str, float]:
    """Relative errors of our whole model against their ForCausalLM: logits, loss and every gradient.
    aux_coef = 0: no auxiliary loss on either side; > 0: one layer (where the conventions meet, see
    the aux-loss test), theirs times aux_coef and ours times k * aux_coef, in the loss."""
    torch.manual_seed(0)
    cfg = replace(family.model, layers=1) if aux_coef else family.model
    theirs = family.causal_lm(hf_config(family, cfg, aux_coef))
    randomize(theirs)
    ours = build_model(cfg, replace(family.moe, aux_loss_coef=family.moe.k * aux_coef))
    load_into(ours, model_in_our_layout(dict(theirs.named_parameters()), cfg))
    idx = torch.randint(0, cfg.vocab, (B, cfg.seq_len))
    out = ours(idx)
    ref = theirs(input_ids=idx, labels=idx)
    loss = F.cross_entropy(out.logits[:, :-1].flatten(0, 1), idx[:, 1:].flatten())  # their shift of the labels
    assert (out.aux_loss > 0) == (aux_coef > 0)
    loss = loss + out.aux_loss
    loss.backward()
    ref.loss.backward()
    ref_grads = model_in_our_layout({n: p.grad for n, p in theirs.named_parameters() if p.grad is not None}, cfg)
    errors = {"logits": rel(out.logits, ref.logits), "loss": rel(loss, ref.loss)}
    errors.update({n: rel(p.grad, ref_grads[n]) for n, p in ours.named_parameters()})
    return errors


@pytest.mark.parametrize("aux_coef", [0.0, 0.02])
@pytest.mark.parametrize("name", FAMILIES)
def test_whole_model_matches_hugging_face(name, aux_coef):
    errors = model_errors(family_of(name), aux_coef)
    worst = max(errors, key=errors.get)
    assert errors[worst] <= TOL, f"{name}: {worst} off by {errors[worst]:.2e}"


def test_aux_loss_against_hugging_faces_load_balancing_loss():
    """Where the conventions meet and where they part.

    Hugging Face (Mixtral, Qwen3-MoE and OLMoE share load_balancing_loss_func): E * sum_i f_i * P_i,
    with f_i expert i's top-k assignments over the rows (summing to k) and P_i its mean softmax
    probability, both pooled over the router logits of ALL layers, then times router_aux_loss_coef
    once in the ForCausalLM. Ours: per MoE layer coef * (E / k) * sum_i f_i * P_i (the same f and P
    of that layer alone), summed over layers in GPT.forward. So:
    - one layer: ours with aux_loss_coef = k * c equals c times theirs (the 1 / k is ours, from
      DeepSpeed's top-k gating, so that coef means the same at every k);
    - several layers: ours is the sum of their loss of each layer alone, not their pooled loss,
      which multiplies layer-pooled f and P and so has cross-layer terms f_l * P_m.
    Neither renormalisation of the k gates (normalize_top_k) nor the score function enters either
    loss (theirs is always the softmax; ours the scores normalised over E, the same for softmax).
    """
    pytest.importorskip("transformers")
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

    e, k, c = 8, 2, 0.01
    moe = MoEConfig(experts=e, router="token_choice", top_k=k, capacity_factor=0.0, aux_loss_coef=k * c)
    gen = torch.Generator().manual_seed(0)
    layers = [torch.randn(64, e, generator=gen), 2.0 * torch.randn(64, e, generator=gen) + torch.arange(e) / 4]
    ours = [route(logits, moe).aux_loss for logits in layers]
    theirs = [load_balancing_loss_func((logits,), e, k) for logits in layers]
    for a, b in zip(ours, theirs):
        assert_close(a, c * b)
    logits = layers[1].clone().requires_grad_()
    grad, = torch.autograd.grad(route(logits, moe).aux_loss, logits)
    assert_close(grad, torch.autograd.grad(c * load_balancing_loss_func((logits,), e, k), logits)[0])
    pooled = load_balancing_loss_func(tuple(layers), e, k)
    assert_close(sum(ours), c * sum(theirs))
    assert rel(sum(ours), c * pooled) > 1e-3  # the pooled convention is another number
