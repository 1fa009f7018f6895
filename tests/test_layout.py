"""The layout (benchsuite/layout.py) is the one answer about a run's parallelism: the wrapper it says is
the one benchsuite.parallel applies, and a prediction's model states are the record's analytic figure.

The harness is checked in this process on torch's fake process group (collectives return at once, so
parallelize builds every wrapper of a world of several ranks without starting any); the training itself
is checked on real processes by test_zero.py, test_tensor_parallel.py and test_pipeline.py.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.distributed as dist
from torch.distributed._composable.replicate_with_fsdp import ReplicateModule
from torch.distributed.fsdp import FSDPModule
from torch.nn.parallel import DistributedDataParallel

from benchsuite.config import CarbonConfig, EnergyConfig, ModelConfig, MoEConfig, ParallelConfig, RunConfig, TrainConfig
from benchsuite.layout import DataParallel, ParallelDims, Schedule
from benchsuite.metrics.comm import context_parallel_bytes
from benchsuite.metrics.memory import activation_bytes, model_state_record
from benchsuite.models.transformer import build_model
from benchsuite.parallel import Parallelized, parallelize
from benchsuite.parallel.pipeline import PipelinePlan
from benchsuite.predict import load_system, predict_run
from benchsuite.predict.workload import Implementation, from_run

CPU_SYSTEM = "workloads/systems/cpu-gloo.toml"  # a CPU device: precision "auto" is fp32, as a CPU record's
MODEL = ModelConfig(layers=4, hidden=32, heads=4, vocab=64, seq_len=16, ffn_hidden=64)
MOE = MoEConfig(experts=4, router="switch", capacity_factor=1.25, every=2)

# name: (world, parallel section, MoE section or None, the wrapper the layout says)
LAYOUTS = {
    "single process, ZeRO-3 asked": (1, ParallelConfig(zero=3), None, DataParallel.NONE),
    "TP 2": (2, ParallelConfig(tensor=2), None, DataParallel.NONE),
    "PP 2": (2, ParallelConfig(pipeline=2), None, DataParallel.NONE),
    "DDP": (2, ParallelConfig(), None, DataParallel.DDP),
    "ZeRO-1": (4, ParallelConfig(zero=1), None, DataParallel.ZERO1),
    "ZeRO-2": (4, ParallelConfig(zero=2), None, DataParallel.FSDP_STAGE2),
    "ZeRO-3": (4, ParallelConfig(zero=3), None, DataParallel.FSDP_STAGE3),
    "TP 2 x DP 2": (4, ParallelConfig(tensor=2), None, DataParallel.REPLICATE),
    "PP 2 x DP 2": (4, ParallelConfig(pipeline=2), None, DataParallel.REPLICATE),
    "PP 2 x DP 2, interleaved": (4, ParallelConfig(pipeline=2, schedule="interleaved", virtual_stages=2), None,
                                 DataParallel.REPLICATE),
    "EP 2 x DP 4": (4, ParallelConfig(expert=2), MOE, DataParallel.DDP),
    "CP 2 x DP 2, ZeRO-2": (4, ParallelConfig(context=2, zero=2), None, DataParallel.FSDP_STAGE2),
    "TP 2 x DP 2, ZeRO-3": (4, ParallelConfig(tensor=2, zero=3), None, DataParallel.FSDP_STAGE3),
    "PP 2 x DP 2, ZeRO-2": (4, ParallelConfig(pipeline=2, zero=2), None, DataParallel.FSDP_STAGE2),
}
# Experts on a layout of their own (folded over dp x tp, sharded over their expert-data-parallel group)
FOLDED = {
    "EP 2 = TP 2 x DP 2": (4, ParallelConfig(expert=2, tensor=2), MOE, DataParallel.REPLICATE),
    "PP 2 x EP 2": (4, ParallelConfig(expert=2, pipeline=2), MOE, DataParallel.REPLICATE),
    "ZeRO-3 x EP 2": (4, ParallelConfig(expert=2, zero=3), MOE, DataParallel.FSDP_STAGE3),
    "ETP 2 x EP 2": (4, ParallelConfig(expert=2, expert_tensor=2), MOE, DataParallel.DDP),
    "ZeRO-3 x ETP 2 (EDP 2)": (4, ParallelConfig(expert_tensor=2, zero=3), MOE, DataParallel.FSDP_STAGE3),
}


def make_run(world: int, parallel: ParallelConfig, moe: MoEConfig | None) -> RunConfig:
    return RunConfig(suite="t", workload="w", kind="moe" if moe else "dense", model=MODEL,
                     train=TrainConfig(micro_batch=4, precision="fp32"), parallel=parallel, energy=EnergyConfig(),
                     carbon=CarbonConfig(), moe=moe, world_size=world)


@contextlib.contextmanager
def fake_world(world: int):
    """A process group of `world` ranks held by this one process (rank 0); none for a world of one. torch's
    testing package (and torch.distributed.optim) are imported where used, not with the module: they script
    TorchScript functions on import, whose deprecation warnings would reach every collection of the test tree
    (`pytest -m cuda` among them, whose summary benchmarks/gpu_check.py reads)."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if world > 1:
        dist.init_process_group("fake", rank=0, world_size=world, store=FakeStore())
    try:
        yield
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def parallelized(run: RunConfig) -> tuple[ParallelDims, Parallelized]:
    """The run's layout (with its meshes) and what benchsuite.parallel builds for it."""
    dims = ParallelDims.from_run(run)
    if dims.world > 1:
        dims = dims.build_meshes("cpu")
    plan = PipelinePlan.from_run(run) if dims.pp_enabled else None
    model = build_model(run.model, run.moe, seed=0)
    return dims, parallelize(model, dims=dims, train=run.train, moe=run.moe, device=torch.device("cpu"),
                             pipeline=plan)


def applied_wrapper(par: Parallelized) -> DataParallel:
    """The data-parallel wrapper parallelize built, read from its objects (the model, a pipeline's first
    stage, the optimizer); FSDP2's stages 2 and 3 told apart by the name the record holds."""
    from torch.distributed.optim import ZeroRedundancyOptimizer  # scripts TorchScript on import (see fake_world)

    module = par.model[0] if par.pipeline is not None else par.model
    if isinstance(module, ReplicateModule):
        return DataParallel.REPLICATE
    if isinstance(module, FSDPModule):
        resharded = "reshard_after_forward=True" in par.applied.data
        return DataParallel.FSDP_STAGE3 if resharded else DataParallel.FSDP_STAGE2
    if isinstance(module, DistributedDataParallel):
        zero1 = isinstance(par.optimizer, ZeroRedundancyOptimizer)
        return DataParallel.ZERO1 if zero1 else DataParallel.DDP
    return DataParallel.NONE


@pytest.mark.parametrize("name", {**LAYOUTS, **FOLDED})
def test_the_layouts_wrapper_is_the_one_parallelize_applies(name):
    world, parallel, moe, wrapper = {**LAYOUTS, **FOLDED}[name]
    run = make_run(world, parallel, moe)
    with fake_world(world):
        dims, par = parallelized(run)
    assert dims.data_parallel is wrapper, name
    assert applied_wrapper(par) is wrapper, f"{name}: {par.applied.data}"
    assert par.applied.zero_stage == dims.zero_applied, name
    module = par.model[0] if par.pipeline is not None else par.model
    assert isinstance(module, FSDPModule) == wrapper.fsdp, name  # what the predictor charges host time for


@pytest.mark.parametrize("name", {**LAYOUTS, **FOLDED})
def test_a_predictions_model_states_are_the_records_analytic_figure(name):
    """The model-state bytes `benchsuite predict` gives a run equal the analytic figure its record holds
    (metrics.memory.model_state_record, with what parallelize applied), layout by layout, the folded expert
    layouts (experts sharded over their own group) included."""
    world, parallel, moe, _ = {**LAYOUTS, **FOLDED}[name]
    run = make_run(world, parallel, moe)
    with fake_world(world):
        dims, par = parallelized(run)
    record = model_state_record([None], model=run.model, moe=run.moe, dims=dims, applied=par.applied)
    predicted = predict_run(run, load_system(CPU_SYSTEM)).memory
    assert predicted.model_state_bytes == record["analytic"]["total"], f"{name}: {record['formula']}"
    assert record["formula"].endswith(predicted.model_state_formula), name


def test_a_data_parallel_pipeline_holds_replicate_with_fsdps_states():
    """PP 2 × DP 2: replicate_with_fsdp keeps a gathered copy beside the stored parameters, (4+4+4+8)Ψ of
    the pipeline rank holding the most, in the prediction as in the record."""
    from benchsuite.metrics.memory import params_per_pipeline_rank

    run = make_run(4, ParallelConfig(pipeline=2), None)
    predicted = predict_run(run, load_system(CPU_SYSTEM)).memory
    assert predicted.model_state_bytes == 20 * params_per_pipeline_rank(MODEL, 2)
    assert predicted.model_state_formula == "(4+4+4+8)Ψ"


def test_the_predictor_reads_the_runs_own_layout():
    run = make_run(4, ParallelConfig(pipeline=2, schedule="interleaved", virtual_stages=2), None)
    w = from_run(run, "cpu")
    assert w.layout == ParallelDims.from_run(run) and w.implementation is Implementation.BENCHSUITE
    assert (w.layout.dp, w.layout.num_stages, w.layout.schedule) == (2, 4, Schedule.INTERLEAVED)


def test_degrees_and_what_follows_from_them():
    lay = ParallelDims.from_degrees(tp=8, pp=4, dp=2, virtual_stages=2, schedule=Schedule.INTERLEAVED)
    assert (lay.world, lay.dp, lay.num_stages) == (64, 2, 8)
    assert [lay.stage_ids(r) for r in range(4)] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert lay.data_parallel is DataParallel.REPLICATE and lay.data_parallel.fsdp
    assert ParallelDims(4, zero=1).data_parallel is DataParallel.ZERO1 and not DataParallel.ZERO1.fsdp
    assert ParallelDims(1, zero=2).zero_applied == 0 and ParallelDims(1, zero=2).data_parallel is DataParallel.NONE


@pytest.mark.parametrize("degrees, why", [
    ({"world": 6, "tp": 4}, "does not factor"),
    ({"world": 4, "ep": 3}, "does not factor"),
    ({"world": 4, "pp": 2, "ep": 4}, "ep 4 dividing dp x tp"),
    ({"world": 4, "zero": 4}, "ZeRO stage must be"),
    ({"world": 4, "tp": 2, "zero": 1}, "plain data parallelism only"),
    ({"world": 4, "pp": 2, "zero": 1}, "plain data parallelism only"),
    ({"world": 4, "ep": 2, "zero": 1}, "would broadcast one rank's expert shard"),
    ({"world": 4, "etp": 2, "zero": 1}, "expert-tensor 2 > 1 would broadcast one rank's expert shard"),
    ({"world": 4, "ep": 2, "etp": 4}, "ep 2 x etp 4 dividing dp x tp"),
    ({"world": 4, "pp": 2, "layers_per_stage": (1, 1, 1)}, "3 stage layer counts for 2 stages"),
    ({"world": 4, "cp": 3}, "context 3 must divide the data-parallel ranks"),
])
def test_a_layout_no_harness_runs_is_refused(degrees, why):
    with pytest.raises(ValueError, match=why):
        ParallelDims(**degrees)


def test_a_context_parallel_run_is_predicted_with_the_records_formulas():
    """parallel.context: the predictor charges the key/value gathers metrics.comm.context_parallel_bytes counts
    (the record's formula) per micro-batch, and the activations metrics.memory.activation_bytes gives at that
    context; the same run without it has neither."""
    moe = MoEConfig(router="switch", experts=4)
    system = load_system(CPU_SYSTEM)
    split = predict_run(make_run(4, ParallelConfig(context=2), moe), system)
    whole = predict_run(make_run(4, ParallelConfig(), moe), system)
    sent = sum(context_parallel_bytes(model=MODEL, moe=moe, context=2, tensor=1, micro_batch=4, kv_bytes=4).values())
    assert sent > 0 and f"{sent / 1e6:.4g} MB sent" in split.detail("context_parallel")
    assert split.seconds("context_parallel") > 0 == whole.seconds("context_parallel")
    act = {c: activation_bytes(MODEL.seq_len, 4, MODEL.hidden, MODEL.heads, MODEL.layers, MODEL.vocab,
                               context=c)["per_layer_bytes"] for c in (1, 2)}
    assert split.memory.activation_bytes - whole.memory.activation_bytes == MODEL.layers * (act[2] - act[1]) != 0
