"""Activation memory of selective recompute and sequence parallelism against Korthikanti et al. 2022.

What a block stores for its backward pass is counted exactly: the tensors autograd saves during its
forward (saved_tensors_hooks; a non-reentrant checkpoint's region saves only its inputs there),
each storage once, parameters left out, a DTensor by its local shard. The attention core runs as
Megatron's unfused one (SDPA's math backend), which stores the softmax output: the paper's setting.
The model has no dropout and runs in fp32, so the formula is metrics.memory.activation_bytes with
value_bytes=4, dropout=False; LayerNorm's mean and 1/std (b·s fp32 values each, split like its
input), which the paper leaves out, are added. Checked equal (relative 1e-9) per layer: TP 1 without
and with selective recompute (this process), TP 2 without and with sequence parallelism, each
without and with selective recompute (one gloo spawn at world 2); so are the bytes each saves.
"""

from __future__ import annotations

import pytest
import torch

from benchsuite.config import ModelConfig, TrainConfig
from helpers import spawn_gather

CFG = ModelConfig(layers=2, hidden=64, heads=4, vocab=64, seq_len=32, ffn_hidden=256)  # GPT-2 block
B = 2
LAYOUTS = [(1, False, "none"), (1, False, "selective"), (2, False, "none"), (2, False, "selective"),
           (2, True, "none"), (2, True, "selective")]  # (tp, sequence_parallel, recompute)


def stored_bytes_per_block(model, idx: torch.Tensor) -> float:
    """Bytes the blocks' forward saves for backward, per block (module docstring)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from benchsuite.metrics.memory import local_tensor

    params = {local_tensor(p).untyped_storage().data_ptr() for p in model.parameters()}
    storages: dict[int, int] = {}
    inside = []

    def pack(t):
        if inside:
            storage = local_tensor(t).untyped_storage()
            if storage.data_ptr() not in params:
                storages[storage.data_ptr()] = storage.nbytes()
        return t

    def leave(module, args, output):
        inside.pop()

    for block in model.blocks:
        block.register_forward_pre_hook(lambda m, a: inside.append(m))
        block.register_forward_hook(leave)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), sdpa_kernel(SDPBackend.MATH):
        model(idx)
    return sum(storages.values()) / len(model.blocks)


def expected_per_block(tp: int, sequence_parallel: bool, recompute: str) -> float:
    from benchsuite.metrics.memory import activation_bytes

    formula = activation_bytes(CFG.seq_len, B, CFG.hidden, CFG.heads, CFG.layers, CFG.vocab, tp=tp,
                               recompute=recompute, sequence_parallel=sequence_parallel, value_bytes=4,
                               dropout=False)["per_layer_bytes"]
    norm_stats = 2 * 2 * B * CFG.seq_len * 4 / (tp if sequence_parallel else 1)  # two norms' mean and 1/std
    return formula + norm_stats


def measure(tp: int, sequence_parallel: bool, recompute: str, rank: int = 0) -> float:
    from benchsuite.layout import ParallelDims
    from benchsuite.models.transformer import build_model
    from benchsuite.parallel import parallelize

    dims = ParallelDims(tp, tp=tp, sequence_parallel=sequence_parallel).build_meshes("cpu") if tp > 1 \
        else ParallelDims(1)
    par = parallelize(build_model(CFG, seed=0), dims=dims, train=TrainConfig(precision="fp32", recompute=recompute),
                      moe=None, device=torch.device("cpu"))
    idx = torch.randint(0, CFG.vocab, (B, CFG.seq_len), generator=torch.Generator().manual_seed(0))
    return stored_bytes_per_block(par.model, idx)


def check(measured: dict) -> list[str]:
    """Each layout against the formula, and what selective recompute and sequence parallelism save."""
    failures = []
    for layout, got in measured.items():
        want = expected_per_block(*layout)
        if abs(got - want) > 1e-9 * want:
            failures.append(f"tp, sp, recompute = {layout}: {got:,.0f} bytes per block, formula {want:,.0f}")
    for (tp, sp, r), got in measured.items():
        for other in ((tp, sp, "none"), (tp, False, r)):
            if other != (tp, sp, r) and other in measured:
                saved, want = measured[other] - got, expected_per_block(*other) - expected_per_block(tp, sp, r)
                if want <= 0 or abs(saved - want) > 1e-9 * want:
                    failures.append(f"{(tp, sp, r)} saves {saved:,.0f} bytes per block against {other}, "
                                    f"formula {want:,.0f}")
    return failures


def test_selective_recompute_stores_what_the_formula_says_in_one_process():
    measured = {layout: measure(*layout) for layout in LAYOUTS if layout[0] == 1}
    assert not check(measured), "\n".join(check(measured))


def _rank(rank: int, world: int) -> list:
    import torch.distributed as dist

    from benchsuite.dist import shutdown

    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    results = [[list(layout), measure(*layout, rank=rank)] for layout in LAYOUTS if layout[0] == world]
    shutdown()
    return results


@pytest.mark.procs
def test_sequence_parallel_and_selective_recompute_store_what_the_formula_says():
    for rank, results in enumerate(spawn_gather(_rank, 2)):
        measured = {tuple(layout): got for layout, got in results}
        failures = check(measured)
        assert not failures, f"rank {rank}:\n" + "\n".join(failures)
