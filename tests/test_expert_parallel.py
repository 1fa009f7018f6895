"""Expert parallelism on real gloo processes against the single-process model.

Each rank checks its EP model on its own tokens against a reference model with the
same weights that runs every rank's tokens in turn: outputs, aux losses, routing
stats and, after the DP all-reduce / sync_expert_grads, every gradient of the mean
loss over ranks (expert shards against the matching slice of the full gradient).
Capacity (fixed-split) and dropless (variable-split) layers alike; the uneven
exchange alone and the bytes it counts are checked against one process moving
every rank's rows. Forced routing gives every expert exactly its share of each
rank's tokens; a tiny Qwen3-style model (RMSNorm, RoPE, grouped-query attention,
head_dim, per-head q/k norm; token_choice top-4 of 8, dropless, renormalised) runs
as the single-process one; aux-free balancing keeps one bias on every rank, the one
a single process reaches from every rank's load. One spawned group per world size
runs all its cases.
"""

import msgspec
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from msgspec.structs import replace
from torch.testing import assert_close

from benchsuite.config import ModelConfig, MoEConfig
from benchsuite.dist import shutdown
from benchsuite.metrics.comm import (ALL_TO_ALL_BY_STEP_SOURCE, CommCounter, comm_record,
                                     variable_all_to_all_section)
from benchsuite.models.moe import MoELayer, moe_layers, set_expert_impl, update_expert_bias
from benchsuite.models.transformer import build_model
from benchsuite.parallel.expert import (AllToAllMeter, Exchange, _AllToAll, all_to_all_bytes_by_step,
                                        all_to_all_seconds, apply_expert_parallel, end_all_to_all_step,
                                        ignore_expert_params_in_ddp, sync_expert_grads)
from benchsuite.record.types import Metrics
from benchsuite.results.migrate import upgrade_v2_comm
from helpers import spawn

TOL = dict(rtol=1e-5, atol=1e-6)
EXPERT_PARAMS = ("w_up", "w_gate", "w_down")


def expert_groups(ep):
    """(ep_group, expert_dp_group) as production builds them (benchsuite.dist): a ("edp", "ep") mesh."""
    from torch.distributed.device_mesh import init_device_mesh

    world = dist.get_world_size()
    mesh = init_device_mesh("cpu", (world // ep, ep), mesh_dim_names=("edp", "ep"))
    return mesh["ep"].get_group(), mesh["edp"].get_group() if world > ep else None


def rank_tokens(rank, device):
    return torch.randint(0, 32, (4, 8), generator=torch.Generator().manual_seed(100 + rank)).to(device)  # N = 32


def loss_of(model, idx):
    logits, aux, routing = model(idx)
    return F.cross_entropy(logits.flatten(0, 1), idx.flatten()) + aux, logits, aux, routing


def ref_name(name):
    return name.replace("._checkpoint_wrapped_module", "")


def check_case(rank, world, device, router, ep, activation, impl, wrap, capacity_factor=1.0, model_kw=None,
               moe_kw=None):
    """model_kw, moe_kw: ModelConfig and MoEConfig keys over this test's defaults."""
    cfg = replace(ModelConfig(layers=2, hidden=16, heads=2, vocab=32, seq_len=8, ffn_hidden=32, activation=activation),
                  **(model_kw or {}))
    moe = replace(MoEConfig(experts=4, router=router, every=1, capacity_factor=capacity_factor, z_loss_coef=0.001),
                  **(moe_kw or {}))

    ref = build_model(cfg, moe, seed=0).to(device)
    set_expert_impl(ref, impl)
    mean_grads = {n: torch.zeros_like(p) for n, p in ref.named_parameters()}
    for r in range(world):  # the reference sees every rank's tokens: its gradient is the mean loss's
        ref.zero_grad()
        loss, logits, aux, routing = loss_of(ref, rank_tokens(r, device))
        loss.backward()
        for n, p in ref.named_parameters():
            mean_grads[n] += p.grad / world
        if r == rank:
            own = dict(logits=logits.detach(), aux=aux.detach(), stats=routing,
                       grads={n: p.grad.clone() for n, p in ref.named_parameters()})

    model = build_model(cfg, moe, seed=0).to(device)
    set_expert_impl(model, impl)
    ep_group, expert_dp_group = expert_groups(ep)
    ignored = apply_expert_parallel(model, ep_group, timing=True)
    assert sorted(ignored) == sorted(n for n, _ in model.named_parameters() if n.rpartition(".")[2] in EXPERT_PARAMS)
    if wrap == "ckpt+ddp":  # blocks wrapped after EP, as the worker does for recompute: names change
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

        for i, block in enumerate(model.blocks):
            model.blocks[i] = checkpoint_wrapper(block, preserve_rng_state=False)
        ignored = ignore_expert_params_in_ddp(model)
        assert all("_checkpoint_wrapped_module" in n for n in ignored)
    wrapped = DDP(model) if wrap != "none" else model
    loss, logits, aux, routing = loss_of(wrapped, rank_tokens(rank, device))
    loss.backward()

    assert_close(logits, own["logits"], **TOL)
    assert_close(aux, own["aux"], **TOL)
    assert len(routing) == len(own["stats"])
    for got, want in zip(routing, own["stats"]):
        assert torch.equal(got.expert_load, want.expert_load)
        assert torch.equal(got.dropped_frac, want.dropped_frac)
        assert torch.equal(got.padding_frac, want.padding_frac)
        if moe.routing == "forced":  # every expert exactly its share of this rank's 32 tokens
            assert got.tokens_per_expert.tolist() == [32 * moe.k / moe.experts] * moe.experts
    assert all_to_all_seconds(model) > 0

    shard = dist.get_rank(ep_group)
    ref_params = dict(ref.named_parameters())
    sync_expert_grads(model, world, expert_dp_group)
    for n, p in model.named_parameters():
        if n in ignored:
            local = p.shape[0]
            assert_close(p.detach(), ref_params[ref_name(n)].detach()[shard * local:(shard + 1) * local])
            assert_close(p.grad, mean_grads[ref_name(n)][shard * local:(shard + 1) * local], **TOL, msg=n)
        elif wrap != "none":
            assert_close(p.grad, mean_grads[ref_name(n)], **TOL, msg=n)
        else:  # without DDP a replicated parameter holds exactly its own rank's gradient
            assert_close(p.grad, own["grads"][n], **TOL, msg=n)
            dist.all_reduce(p.grad)
            assert_close(p.grad / world, mean_grads[n], **TOL, msg=n)


def send_rows(src, dst):
    """Rows rank src sends to rank dst in the exchange test: uneven, zero for some pairs."""
    return (3 * src + 5 * dst) % 4


def check_variable_exchange(rank, world, device):
    """The uneven all-to-all and its backward against one process moving every rank's rows,
    bit for bit (pure data movement), and the bytes it counts: rows sent to other ranks x H x 8."""
    h = 3
    xs = [torch.randn(sum(send_rows(i, j) for j in range(world)), h, dtype=torch.float64,
                      generator=torch.Generator().manual_seed(i)).requires_grad_() for i in range(world)]
    grads = [torch.randn(sum(send_rows(i, j) for i in range(world)), h, dtype=torch.float64,
                         generator=torch.Generator().manual_seed(50 + j)) for j in range(world)]
    outs = [torch.cat([xs[i].split([send_rows(i, k) for k in range(world)])[j] for i in range(world)])
            for j in range(world)]
    sum((o * g).sum() for o, g in zip(outs, grads)).backward()

    meter = AllToAllMeter(timing=False)
    x = xs[rank].detach().clone().to(device).requires_grad_()
    send = [send_rows(rank, j) for j in range(world)]
    recv = [send_rows(i, rank) for i in range(world)]
    with CommCounter() as counter:  # metrics.comm's counted step sees the same bytes
        out = _AllToAll.apply(x, Exchange(dist.group.WORLD, rank, meter), send, recv)
        (out * grads[rank].to(device)).sum().backward()
    assert torch.equal(out.detach().cpu(), outs[rank].detach())
    assert torch.equal(x.grad.cpu(), xs[rank].grad)
    sent_rows = (sum(send) - send[rank]) + (sum(recv) - recv[rank])  # forward, then the backward's reverse
    assert meter.step_bytes == sent_rows * h * 8
    assert counter.result()["bytes_by_kind"] == {"all_to_all": sent_rows * h * 8}
    meter.end_step()
    assert meter.bytes_by_step == [sent_rows * h * 8] and meter.step_bytes == 0


# Rank r's tokens choose among FAVOURED[r]: no rank favours experts 2 and 3, so at EP 4 rank 1
# receives no rows at all (its shard runs on an empty batch), and at EP 2 rank 0 runs 2 idle experts.
FAVOURED = ((0, 1, 5), (1, 4, 5), (0, 6, 7), (4, 5, 6))


def skewed_tokens(rank, hidden, experts):
    """[2, 6, H] fp64 tokens whose router logits (router weight 4·I, see check_dropless_layer) favour
    FAVOURED[rank]: every other expert gets no token from this rank, some ranks send no row to others."""
    bias = torch.full((hidden,), -1.0, dtype=torch.float64)
    bias[list(FAVOURED[rank])] = 1.0
    noise = torch.randn(2, 6, hidden, dtype=torch.float64, generator=torch.Generator().manual_seed(200 + rank))
    return bias + 0.3 * noise


def dropless_layer(impl, activation, shared):
    """A token-choice top-2 dropless layer, fp64, the same weights on every rank; router weight 4·I."""
    cfg = ModelConfig(layers=1, hidden=8, heads=2, vocab=32, seq_len=6, ffn_hidden=12, activation=activation)
    moe = MoEConfig(experts=8, router="token_choice", top_k=2, capacity_factor=0, shared_experts=shared,
                    z_loss_coef=0.001)
    torch.manual_seed(0)
    layer = MoELayer(cfg, moe, impl).double()
    with torch.no_grad():
        layer.router.weight.copy_(4.0 * torch.eye(moe.experts, cfg.hidden))
    return layer


def layer_loss(layer, x, rank):
    y, aux, stats = layer(x)
    g = torch.randn(y.shape, dtype=y.dtype, generator=torch.Generator().manual_seed(300 + rank)).to(y.device)
    return (y * g).sum() + aux, y, aux, stats


def check_dropless_layer(rank, world, device, impl, activation, shared):
    """The dropless layer at EP = world against the single-process layer on each rank's tokens: output,
    aux loss, input gradient, router (and shared-expert) gradients of this rank's loss, expert-shard
    gradients of the summed loss; and the bytes the exchanges sent, from the reference's routing."""
    ref = dropless_layer(impl, activation, shared).to(device)
    sum_grads = {n: torch.zeros_like(p) for n, p in ref.named_parameters()}
    counts = []  # [world][E] assignments per expert of each rank's tokens
    for r in range(world):
        ref.zero_grad()
        x = skewed_tokens(r, 8, 8).to(device).requires_grad_()
        loss, y, aux, stats = layer_loss(ref, x, r)
        loss.backward()
        counts.append(stats.expert_load.long().tolist())
        for n, p in ref.named_parameters():
            sum_grads[n] += p.grad
        if r == rank:
            own = dict(y=y.detach(), aux=aux.detach(), x_grad=x.grad.clone(),
                       grads={n: p.grad.clone() for n, p in ref.named_parameters()})
    assert 0 in counts[rank], "the routing must leave some experts without tokens on this rank"

    model = dropless_layer(impl, activation, shared).to(device)
    ignored = apply_expert_parallel(model, dist.group.WORLD)
    x = skewed_tokens(rank, 8, 8).to(device).requires_grad_()
    loss, y, aux, _ = layer_loss(model, x, rank)
    loss.backward()
    end_all_to_all_step(model)
    assert_close(y, own["y"], **TOL)
    assert_close(aux, own["aux"], **TOL)
    assert_close(x.grad, own["x_grad"], **TOL)
    local = 8 // world
    for n, p in model.named_parameters():
        if n in ignored:
            assert_close(p.grad, sum_grads[n][rank * local:(rank + 1) * local], **TOL, msg=n)
        else:
            assert_close(p.grad, own["grads"][n], **TOL, msg=n)

    send = [sum(counts[rank][j * local:(j + 1) * local]) for j in range(world)]
    recv = [sum(counts[i][rank * local:(rank + 1) * local]) for i in range(world)]
    if world == 4:  # the premise of FAVOURED: rank 1 alone receives nothing
        assert (sum(recv) == 0) == (rank == 1)
    rows = 2 * (sum(send) - send[rank] + sum(recv) - recv[rank])  # dispatch and return, forward and backward
    assert all_to_all_bytes_by_step(model, last=1) == [rows * 8 * 8]  # x H x 8 bytes (fp64)


def step_tokens(rank, step, device):
    return torch.randint(0, 32, (4, 8), generator=torch.Generator().manual_seed(1000 + 10 * step + rank)).to(device)


def check_aux_free_bias(rank, world, device, ep):
    """Aux-free balancing over the world's data-parallel ranks (expert-parallel `ep` of them), DDP-wrapped:
    each rank routes and counts its own tokens, update_expert_bias sums the load over the group. Three
    steps (the weights fixed: only the bias moves the routing); after each update every rank holds the
    same biases, the ones a single process reaches from every rank's tokens, though the ranks' own loads
    differ."""
    cfg = ModelConfig(layers=2, hidden=16, heads=2, vocab=32, seq_len=8, ffn_hidden=32, activation="swiglu")
    moe = MoEConfig(experts=4, router="token_choice", top_k=2, every=1, capacity_factor=0.0, balance="aux_free",
                    bias_update=0.05)
    ref = build_model(cfg, moe, seed=0).to(device)
    model = build_model(cfg, moe, seed=0).to(device)
    if ep > 1:
        apply_expert_parallel(model, expert_groups(ep)[0])
    wrapped = DDP(model)
    for step in range(3):
        for r in range(world):  # one process, every rank's tokens: the step's whole load
            loss_of(ref, step_tokens(r, step, device))[0].backward()
        update_expert_bias(ref)
        loss_of(wrapped, step_tokens(rank, step, device))[0].backward()
        own = torch.stack([layer.step_load for layer in moe_layers(model)])
        loads = [torch.empty_like(own) for _ in range(world)]
        dist.all_gather(loads, own)
        assert any(not torch.equal(loads[0], other) for other in loads[1:]), "the ranks' loads must differ"
        update_expert_bias(model, dist.group.WORLD)
        biases = torch.stack([layer.expert_bias for layer in moe_layers(model)])
        gathered = [torch.empty_like(biases) for _ in range(world)]
        dist.all_gather(gathered, biases)
        assert all(torch.equal(b, biases) for b in gathered)
        assert torch.equal(biases, torch.stack([layer.expert_bias for layer in moe_layers(ref)]))
    assert biases.any()


def worker(rank, world, device, cases):
    torch.set_num_threads(1)
    dist.init_process_group("gloo")  # (torchrun's environment variables: helpers.spawn)
    try:
        for check, *args in cases:
            check(rank, world, device, *args)
    finally:
        shutdown()  # collects FSDP2/mesh cycles first: no gloo abort at exit


ROUTERS = ("switch", "gshard", "expert_choice")
QWEN3_STYLE = (dict(norm="rmsnorm", position="rope", kv_heads=1, head_dim=16, qk_norm="per_head"),  # model
               dict(experts=8, top_k=4, normalize_top_k=True, expert_hidden=8))  # moe
CASES = {  # check_case: (router, ep, activation, expert impl, wrapping: none | ddp | ckpt+ddp[, capacity_factor,
    #         model keys, moe keys])
    2: [(check_case, r, 2, "gelu", "padded_bmm", "none") for r in ROUTERS]
       + [(check_case, "gshard", 2, "swiglu", "padded_bmm", "ckpt+ddp"),
          (check_case, "switch", 2, "gelu", "grouped_mm", "ddp"), (check_variable_exchange,),
          (check_dropless_layer, "loop_mm", "swiglu", 1),
          (check_case, "token_choice", 2, "gelu", "grouped_mm", "ddp", 0.0),
          (check_case, "token_choice", 2, "swiglu", "loop_mm", "ddp", 0.0, *QWEN3_STYLE),
          (check_case, "token_choice", 2, "gelu", "padded_bmm", "none", 1.0, None, dict(top_k=3, routing="forced")),
          (check_case, "gshard", 2, "swiglu", "loop_mm", "ddp", 0.0, None, dict(routing="forced")),
          (check_aux_free_bias, 1), (check_aux_free_bias, 2)],
    4: [(check_case, r, 4, "gelu", "padded_bmm", "ddp") for r in ROUTERS]
       + [(check_case, "switch", 2, "swiglu", "padded_bmm", "ckpt+ddp"),
          (check_case, "expert_choice", 2, "gelu", "padded_bmm", "none"), (check_variable_exchange,),
          (check_dropless_layer, "loop_mm", "gelu", 0),
          (check_case, "gshard", 2, "swiglu", "loop_mm", "ckpt+ddp", 0.0)],
}


@pytest.mark.procs
@pytest.mark.parametrize("world", [2, 4])
def test_expert_parallel_matches_single_process(world):
    spawn(worker, world, "cpu", CASES[world])


@pytest.mark.procs
@pytest.mark.cuda
def test_expert_parallel_on_one_gpu_with_gloo():
    """Both ranks on one GPU over gloo (the harness's layout when ranks outnumber GPUs), fp32 (so
    padded_bmm and loop_mm: grouped_mm's CUDA kernel is bf16): fixed splits, then the dropless
    variable-split exchange with its one host read of the counts on CUDA tensors."""
    spawn(worker, 2, "cuda", [(check_case, "switch", 2, "swiglu", "padded_bmm", "ddp"),
                      (check_case, "expert_choice", 2, "gelu", "padded_bmm", "none"),
                      (check_case, "token_choice", 2, "gelu", "loop_mm", "ddp", 0.0),
                      (check_variable_exchange,), (check_dropless_layer, "loop_mm", "swiglu", 1)])


def test_comm_record_summarises_variable_all_to_all_bytes_per_step():
    """Each rank's per-step list (the worker's comm["all_to_all_bytes_by_step"]) becomes mean / min / max
    over ranks and steps beside the counted step's bytes; fixed splits and no EP give null and why."""
    from benchsuite.config import ModelConfig, TrainConfig
    from benchsuite.dist import ParallelDims
    from benchsuite.parallel import Applied
    from benchsuite.parallel.zero import precision_policy

    sections = dict(model=ModelConfig(), moe=None, train=TrainConfig(), dims=ParallelDims(2, ep=2), micro_batch=2,
                    applied=Applied(0, precision_policy("fp32"), "DistributedDataParallel"))
    counted = {"bytes_by_kind": {"all_to_all": 10.0}, "payload_bytes_by_kind": {}, "calls_by_kind": {},
               "total_bytes": 10.0}
    rec = comm_record([{**counted, "all_to_all_bytes_by_step": [100, 300]},
                       {**counted, "all_to_all_bytes_by_step": [200, 600]}], **sections)
    assert rec["all_to_all_bytes_by_step"] == {"mean": 300.0, "min": 100, "max": 600, "per_rank_mean": [200.0, 400.0],
                                               "steps": 2, "source": ALL_TO_ALL_BY_STEP_SOURCE}
    assert rec["all_to_all_bytes_by_step_reason"] is None and rec["bytes_per_step_by_kind"] == {"all_to_all": 10.0}
    fixed = comm_record([{**counted, "all_to_all_bytes_by_step": None}] * 2, **sections)
    assert fixed["all_to_all_bytes_by_step"] is None
    assert fixed["all_to_all_bytes_by_step_reason"].startswith("fixed capacity-slot splits")
    no_ep = variable_all_to_all_section([counted, counted])
    assert no_ep == {"all_to_all_bytes_by_step": None, "all_to_all_bytes_by_step_reason": "no expert parallelism"}


def test_upgrade_v2_comm_adds_a_null_with_its_reason():
    v2 = {"schema_version": 2, "metrics": {"tokens_per_s": 1.0, "comm": {"total_bytes_per_step": 5.0}}}
    up = upgrade_v2_comm(v2)
    assert up["metrics"]["comm"] == {"total_bytes_per_step": 5.0, "all_to_all_bytes_by_step": None,
                                     "all_to_all_bytes_by_step_reason":
                                         "not measured before schema version 3 (fixed splits only)"}
    assert up["metrics"]["tokens_per_s"] == 1.0 and "all_to_all_bytes_by_step" not in v2["metrics"]["comm"]
    assert upgrade_v2_comm(up) == up
    assert upgrade_v2_comm({"schema_version": 2, "metrics": {"comm": None}})["metrics"] == {"comm": None}
    msgspec.convert(up["metrics"], Metrics, strict=True)  # the upgraded part fits the types
