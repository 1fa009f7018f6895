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
from benchsuite.parallel.expert import (all_to_all_seconds, apply_expert_parallel, ignore_expert_params_in_ddp,
                                        new_expert_groups, sync_expert_grads)

pytestmark = pytest.mark.procs  # every test here launches processes

TOL = dict(rtol=1e-5, atol=1e-6)
EXPERT_PARAMS = ("w_up", "w_gate", "w_down")


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
    ep_group, expert_dp_group = new_expert_groups(ep)
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


def worker(rank, world, init_file, device, cases):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        for case in cases:
            check_case(rank, world, device, *case)
    finally:
        shutdown()  # collects FSDP2/mesh cycles first: no gloo abort at exit


ROUTERS = ("switch", "gshard", "expert_choice")
CASES = {  # (router, ep, activation, expert impl, wrapping: none | ddp | ckpt+ddp)
    2: [(r, 2, "gelu", "padded_bmm", "none") for r in ROUTERS]
       + [("gshard", 2, "swiglu", "padded_bmm", "ckpt+ddp"), ("switch", 2, "gelu", "grouped_mm", "ddp")],
    4: [(r, 4, "gelu", "padded_bmm", "ddp") for r in ROUTERS]
       + [("switch", 2, "swiglu", "padded_bmm", "ckpt+ddp"), ("expert_choice", 2, "gelu", "padded_bmm", "none")],
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
    spawn(2, "cuda", [("switch", 2, "swiglu", "padded_bmm", "ddp"), ("expert_choice", 2, "gelu", "padded_bmm", "none")])
