"""Expert parallelism on real gloo processes against the single-process model.

Each rank checks its EP model on its own tokens against a reference model with the
same weights that runs every rank's tokens in turn: outputs, aux losses, routing
stats and, after the DP all-reduce / sync_expert_grads, every gradient of the mean
loss over ranks (expert shards against the matching slice of the full gradient).
"""

import tempfile
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.testing import assert_close

from benchsuite.config import ModelConfig, MoEConfig
from benchsuite.dist import shutdown
from benchsuite.models.moe import set_expert_impl
from benchsuite.models.transformer import build_model
from benchsuite.parallel.expert import (AllToAllMeter, Exchange, _AllToAll, all_to_all_seconds,
                                        apply_expert_parallel, ignore_expert_params_in_ddp, sync_expert_grads)

pytestmark = pytest.mark.procs  # every test here launches processes

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


def check_case(rank, world, device, router, ep, activation, impl, wrap):
    cfg = ModelConfig(layers=2, hidden=16, heads=2, vocab=32, seq_len=8, ffn_hidden=32, activation=activation)
    moe = MoEConfig(experts=4, router=router, every=1, capacity_factor=1.0, z_loss_coef=0.001)

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
    out = _AllToAll.apply(x, Exchange(dist.group.WORLD, rank, meter), send, recv)
    (out * grads[rank].to(device)).sum().backward()
    assert torch.equal(out.detach().cpu(), outs[rank].detach())
    assert torch.equal(x.grad.cpu(), xs[rank].grad)
    sent_rows = (sum(send) - send[rank]) + (sum(recv) - recv[rank])  # forward, then the backward's reverse
    assert meter.step_bytes == sent_rows * h * 8
    meter.end_step()
    assert meter.bytes_by_step == [sent_rows * h * 8] and meter.step_bytes == 0


def worker(rank, world, init_file, device, cases):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        for check, *args in cases:
            check(rank, world, device, *args)
    finally:
        shutdown()  # collects FSDP2/mesh cycles first: no gloo abort at exit


ROUTERS = ("switch", "gshard", "expert_choice")
CASES = {  # check_case: (router, ep, activation, expert impl, wrapping: none | ddp | ckpt+ddp)
    2: [(check_case, r, 2, "gelu", "padded_bmm", "none") for r in ROUTERS]
       + [(check_case, "gshard", 2, "swiglu", "padded_bmm", "ckpt+ddp"),
          (check_case, "switch", 2, "gelu", "grouped_mm", "ddp"), (check_variable_exchange,)],
    4: [(check_case, r, 4, "gelu", "padded_bmm", "ddp") for r in ROUTERS]
       + [(check_case, "switch", 2, "swiglu", "padded_bmm", "ckpt+ddp"),
          (check_case, "expert_choice", 2, "gelu", "padded_bmm", "none"), (check_variable_exchange,)],
}


def spawn(world, device, cases):
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(worker, args=(world, str(Path(tmp) / "init"), device, cases), nprocs=world, join=True)


@pytest.mark.parametrize("world", [2, 4])
def test_expert_parallel_matches_single_process(world):
    spawn(world, "cpu", CASES[world])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_expert_parallel_on_one_gpu_with_gloo():
    """Both ranks on one GPU (a correctness run, as the design allows); fp32, so padded_bmm."""
    spawn(2, "cuda", [(check_case, "switch", 2, "swiglu", "padded_bmm", "ddp"),
                      (check_case, "expert_choice", 2, "gelu", "padded_bmm", "none")])
