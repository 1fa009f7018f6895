"""MoE in the layouts clusters run, on real gloo processes against one process.

One spawn at world 4 checks every layout in turn: expert parallelism folded over tensor parallelism
(EP 2 = TP 2 beside DP 2; EP 4 over TP 2 × DP 2, dropless; with sequence parallelism, the MoE layer
routing the gathered sequence), MoE blocks on pipeline stages with expert parallelism (1F1B,
interleaved, GPipe; PP 2 × TP 2 × EP 2 folded, also with sequence parallelism), FSDP2 with experts
sharded over their expert-data-parallel group (ZeRO-3 EP 2, ZeRO-2 EP 2; under ZeRO-2 EP 4 each expert
has one holder), an uneven pipeline (first_stage_layers 1: stages of 1 and 3 blocks), a tied LM head
over an interleaved pipeline of 5 blocks (derived stages 1, 2, 1, 1) and context parallelism (CP 2 with
DP 2 on a dense model with RoPE and grouped-query attention, with TP 2, with EP 2, EP 4 over CP 2 × TP 2,
under ZeRO-3, on pipeline stages, and with sequence parallelism; the reference runs each context-parallel
group's sequences whole) and expert tensor parallelism (each expert's FFN columns split over ETP 2: beside
EP 2 over DP 4, beside TP 2 attention with SwiGLU experts, under ZeRO-3 with the shards over EDP 2, and
alone over EDP 2, dropless with forced routing). Each builds the plain model with the same seed, parallelizes it with
benchsuite.parallel.parallelize and trains it with the worker's train_step; the reference is one process
that runs every data-parallel rank's microbatches in turn and averages their losses (cross-entropy + every
MoE layer's auxiliary loss). Checked (fp32, relative error ≤ 1e-5): the loss each rank reports, every
gradient after the first backward (expert shards against their slice of the full gradient), every weight
after the AdamW steps, the expert loads of the last microbatch (each rank's, and the record's sum over
ranks through worker.moe_stats: the loads of one process that saw all tokens), the expert all-to-all bytes
where no routing sets the splits (capacity slots, forced routing), the folded experts', expert
tensor parallelism's and context parallelism's all-gather and reduce-scatter bytes (every rank's) and a
pipeline's point-to-point bytes against their formulas, and the model-state bytes (parameters, gradients,
Adam state) against metrics.memory's formula for the layout. The other tests are fast: the public recipes'
layouts as a suite (also Mixtral 8x22B at ETP 2 through flops, memory and predict), the refusals that remain,
the stage split and the per-rank parameter counts.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from msgspec.structs import replace

from benchsuite.config import (CarbonConfig, ConfigError, EnergyConfig, ModelConfig, MoEConfig, ParallelConfig,
                               RunConfig, TrainConfig)
from helpers import spawn_gather
from helpers.parallel import clean_name, full, rel

CFG = ModelConfig(layers=4, hidden=16, heads=2, vocab=32, seq_len=8, ffn_hidden=32)
CAPACITY = MoEConfig(experts=4, router="token_choice", top_k=2, every=2, capacity_factor=1.0, z_loss_coef=0.001)
DROPLESS = replace(CAPACITY, capacity_factor=0.0)
FORCED = replace(DROPLESS, routing="forced")  # every rank's rows per expert equal: the padded gathers are exact
TIED = replace(CFG, layers=5, tie_embeddings=True)
ROPE = replace(CFG, heads=4, kv_heads=2, position="rope", norm="rmsnorm", activation="swiglu")
MB, STEPS, TOL, WORLD = 4, 2, 1e-5, 4

# name: (parallel section, moe section[, model section])
CASES = {
    "ep2=tp2 x dp2": (ParallelConfig(tensor=2, expert=2), CAPACITY),
    "ep4 over tp2 x dp2, dropless": (ParallelConfig(tensor=2, expert=4), DROPLESS),
    "pp2 x ep2, 1f1b": (ParallelConfig(pipeline=2, expert=2, microbatches=2), CAPACITY),
    "pp2 x ep2, interleaved, dropless": (ParallelConfig(pipeline=2, expert=2, schedule="interleaved",
                                                       virtual_stages=2, microbatches=2), DROPLESS),
    "pp2 x tp2 x ep2, gpipe": (ParallelConfig(pipeline=2, tensor=2, expert=2, schedule="gpipe", microbatches=2),
                               CAPACITY),
    "zero3 x ep2, dropless": (ParallelConfig(zero=3, expert=2), DROPLESS),
    "zero2 x ep4": (ParallelConfig(zero=2, expert=4), CAPACITY),
    "zero2 x ep2": (ParallelConfig(zero=2, expert=2), DROPLESS),
    "pp2 uneven (1, 3) x ep2": (ParallelConfig(pipeline=2, expert=2, microbatches=2, first_stage_layers=1), CAPACITY),
    "sp tp2 x dp2, ep2 folded": (ParallelConfig(tensor=2, expert=2, sequence_parallel=True), DROPLESS),
    "pp2 x sp tp2 x ep2, 1f1b": (ParallelConfig(pipeline=2, tensor=2, expert=2, sequence_parallel=True,
                                                microbatches=2), CAPACITY),
    "pp2 x dp2 x ep2, interleaved, 5 layers derived (1, 2, 1, 1), tied": (
        ParallelConfig(pipeline=2, expert=2, schedule="interleaved", virtual_stages=2, microbatches=2),
        CAPACITY, TIED),
    "cp2 x dp2, dense, rope, grouped-query": (ParallelConfig(context=2), None, ROPE),
    "cp2 x tp2, dense": (ParallelConfig(context=2, tensor=2), None),
    "cp2 x ep2 x dp2": (ParallelConfig(context=2, expert=2), CAPACITY),
    "cp2 x tp2 x ep4, dropless": (ParallelConfig(context=2, tensor=2, expert=4), DROPLESS, ROPE),
    "zero3 x cp2 x ep2": (ParallelConfig(zero=3, context=2, expert=2), DROPLESS),
    "pp2 x cp2 x ep2, interleaved": (ParallelConfig(pipeline=2, context=2, expert=2, schedule="interleaved",
                                                    virtual_stages=2, microbatches=2), CAPACITY, ROPE),
    "sp tp2 x cp2, dense": (ParallelConfig(tensor=2, context=2, sequence_parallel=True), None, ROPE),
    "zero3 x tp2, dense": (ParallelConfig(zero=3, tensor=2), None, ROPE),
    "zero2 x pp2, dense, interleaved": (ParallelConfig(zero=2, pipeline=2, schedule="interleaved", virtual_stages=2,
                                                       microbatches=2), None),
    "zero3 x pp2 x ep2, dropless": (ParallelConfig(zero=3, pipeline=2, expert=2, microbatches=2), DROPLESS),
    "sp tp2 x cp2 x ep4, dropless": (ParallelConfig(tensor=2, context=2, expert=4, sequence_parallel=True), DROPLESS),
    "etp2 x ep2 over dp4": (ParallelConfig(expert=2, expert_tensor=2), CAPACITY),
    "tp2 x etp2 x ep2, swiglu": (ParallelConfig(tensor=2, expert=2, expert_tensor=2), CAPACITY, ROPE),
    "zero3 x etp2 (edp2), dropless": (ParallelConfig(zero=3, expert_tensor=2), DROPLESS),
    "etp2 x edp2, dropless forced": (ParallelConfig(expert_tensor=2), FORCED),
}


def make_run(parallel: ParallelConfig, moe: MoEConfig | None, model: ModelConfig = CFG) -> RunConfig:
    return RunConfig(suite="t", workload="w", kind="moe" if moe else "dense", model=model, moe=moe,
                     train=TrainConfig(micro_batch=MB, steps=STEPS, precision="fp32"), parallel=parallel,
                     energy=EnergyConfig(), carbon=CarbonConfig(), world_size=WORLD)


def global_batch(step: int, dp: int):
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randint(0, CFG.vocab, (dp * MB, CFG.seq_len), generator=g)
    return x, torch.randint(0, CFG.vocab, (dp * MB, CFG.seq_len), generator=g)


def full_params(par) -> dict:
    """{name in the full model: parameter} of this rank (a pipeline's stages, unwrapped)."""
    if par.pipeline is None:
        return {clean_name(n): p for n, p in par.model.named_parameters()}
    return {stage.full_name(clean_name(n)): p for stage in par.pipeline.modules() for n, p in stage.named_parameters()}


class GradCapture:
    def __init__(self, par):
        self.par, self.grads = par, None

    def after_backward(self):
        self.grads = {n: full(p.grad).clone() for n, p in full_params(self.par).items()}

    def after_step(self):
        pass


def expert_slice(name: str, ref: torch.Tensor, dims, ep_rank: int, etp_rank: int) -> torch.Tensor:
    """The reference's part of a parameter this rank holds: for an expert weight its E/ep experts, of each its
    1/etp of the FFN width (w_up and w_gate columns, w_down rows)."""
    if ".experts.w_" not in name:
        return ref
    n = ref.shape[0] // dims.ep
    experts = ref[ep_rank * n:(ep_rank + 1) * n]
    width_dim = 1 if name.endswith("w_down") else 2
    f = experts.shape[width_dim] // dims.etp
    return experts.narrow(width_dim, etp_rank * f, f)


def reference_step(ref, x, y, batches: int, microbatches: int) -> tuple[list[float], list]:
    """One process over every distinct batch's microbatches (a data-parallel rank's, or a context-parallel
    group's): backward of the mean of (CE + aux); per batch its mean loss and the routing of its last
    microbatch."""
    losses, routing = [], []
    for xr, yr in zip(x.chunk(batches), y.chunk(batches)):
        total = 0.0
        for xm, ym in zip(xr.chunk(microbatches), yr.chunk(microbatches)):
            logits, aux, stats = ref(xm)
            loss = F.cross_entropy(logits.flatten(0, 1), ym.flatten()) + aux
            (loss / (batches * microbatches)).backward()
            total += float(loss.detach()) / microbatches
        losses.append(total)
        routing.append(stats)
    return losses, routing


def rank_batch(x: torch.Tensor, dims, dp_rank: int) -> torch.Tensor:
    """This rank's part of the global batch: its data-parallel rank's MB sequences, or with context
    parallelism its shard of its group's cp·MB sequences (worker.Bench.batches)."""
    from benchsuite.parallel.context import shard_positions

    cp, group = dims.cp, dp_rank // dims.cp
    rows = x[group * cp * MB:(group + 1) * cp * MB]
    return rows[:, shard_positions(dp_rank % cp, cp, x.shape[1])] if cp > 1 else rows


def train_and_compare(rank: int, run: RunConfig) -> dict:
    import torch.distributed as dist

    from benchsuite.dist import DistContext
    from benchsuite.layout import CP, EP, ETP, ParallelDims
    from benchsuite.metrics.comm import CommCounter
    from benchsuite.metrics.memory import ModelStateProbe, analytic_model_state
    from benchsuite.models.moe import set_expert_impl
    from benchsuite.models.transformer import build_model
    from benchsuite.parallel import parallelize
    from benchsuite.parallel.pipeline import PipelinePlan
    from benchsuite.parallel.zero import make_adamw
    from benchsuite.worker import moe_stats, train_step

    cpu = torch.device("cpu")
    dims = ParallelDims.from_run(run).build_meshes("cpu")
    ctx = DistContext(rank, rank, WORLD, 0, cpu, "gloo", dims)
    batches, m, group = dims.dp_batches, run.parallel.n_microbatches, ctx.dp_rank // dims.cp
    ref = build_model(run.model, run.moe, seed=0)
    if run.moe is not None:
        set_expert_impl(ref, "padded_bmm")
    ref_opt = make_adamw(ref.parameters(), run.train)
    par = parallelize(build_model(run.model, run.moe, seed=0), dims=dims, train=run.train, moe=run.moe, device=cpu,
                      pipeline=PipelinePlan.from_run(run) if dims.pp_enabled else None)
    ep_rank = dims.ep_mesh.get_local_rank(EP) if dims.experts_split else 0
    etp_rank = dims.ep_mesh.get_local_rank(ETP) if dims.etp_enabled else 0
    out = {"impl": par.applied.implementation(), "names": sorted(full_params(par))}
    ref_params = dict(ref.named_parameters(remove_duplicate=False))  # a tied head.weight by its name too
    for step in range(STEPS):
        x, y = global_batch(step, dims.dp)
        probe = GradCapture(par) if step == 0 else None
        mine = [(rank_batch(x, dims, ctx.dp_rank), rank_batch(y, dims, ctx.dp_rank))]
        with CommCounter() as counter:
            result = train_step(par, mine, "fp32", cpu, probe=probe)
        ref_losses, ref_routing = reference_step(ref, x, y, batches, m)
        if step == 0:
            loss = result.loss.clone()
            if dims.cp_enabled:  # the group's mean: every shard holds as many tokens
                dist.all_reduce(loss, group=dims.group(CP))
                loss /= dims.cp
            out["loss"] = abs(float(loss) - ref_losses[group]) / ref_losses[group]
            errs = {n: rel(g, expert_slice(n, ref_params[n].grad, dims, ep_rank, etp_rank))
                    for n, g in probe.grads.items()}
            out["grads"] = max(errs.values())
            out["bad"] = [n for n, e in errs.items() if e > TOL]
            if run.moe is not None:
                moe_index = [(b + 1) // run.moe.every - 1 for b in par.pipeline.moe_layer_ids()] if par.pipeline \
                    else range(len(result.routing))  # the MoE layer each routing entry is
                out["own_loads"] = [stats.expert_load.tolist() == ref_routing[group][i].expert_load.tolist()
                                    for i, stats in zip(moe_index, result.routing)]
                out["loads"] = moe_stats(par.model, [result.routing], ctx=ctx, pipeline=par.pipeline)["expert_load"]
                out["ref_loads"] = [[sum(v) for v in zip(*(ref_routing[b][i].expert_load.tolist()
                                                          for b in range(batches)))]
                                    for i in range(run.model.layers // run.moe.every)]
        else:  # a step without the gradient capture's own gathers
            out["comm"] = counter.result()["bytes_by_kind"]
        ref_opt.step()
        ref_opt.zero_grad(set_to_none=True)
    out["figures"] = par.pipeline.figures() if par.pipeline is not None else None
    out["params"] = max(rel(full(p), expert_slice(n, ref_params[n], dims, ep_rank, etp_rank))
                        for n, p in full_params(par).items())
    probe = ModelStateProbe(par.model, par.optimizer)
    train_step(par, mine, "fp32", cpu, probe=probe)
    probe.close()
    steps = 4 * len(par.optimizer.state)  # AdamW's fp32 step count per parameter, no model state of the formula
    measured = probe.result()
    out["state"] = [measured["params"], measured["grads"], measured["optimizer"] - steps]
    formula = analytic_model_state(run.model, run.moe, dims, compute="fp32", forward_params="fp32")["analytic"]
    out["state_formula"] = [formula[k] for k in ("params", "grads", "optimizer")]
    return out


def _rank(rank: int, world: int) -> dict:
    import torch.distributed as dist

    from benchsuite.dist import shutdown

    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    results = {}
    for name, spec in CASES.items():
        results[name] = train_and_compare(rank, make_run(*spec))
    shutdown()
    return results


@pytest.mark.procs
def test_moe_layouts_match_single_process():
    from benchsuite.models.transformer import build_model

    ranks = spawn_gather(_rank, WORLD)
    for name, (parallel, moe, *model) in CASES.items():
        run = make_run(parallel, moe, *model)
        all_names = {n for n, _ in build_model(run.model, moe).named_parameters(remove_duplicate=False)}
        for rank, results in enumerate(ranks):
            r, where = results[name], f"{name} rank {rank}"
            assert r["loss"] <= TOL, f"{where}: loss rel err {r['loss']:.2e}"
            assert r["grads"] <= TOL, f"{where}: grad rel err {r['grads']:.2e} in {r['bad']}"
            assert r["params"] <= TOL, f"{where}: params after {STEPS} steps rel err {r['params']:.2e}"
            assert all(r.get("own_loads", [])), f"{where}: expert loads differ from one process's on the same tokens"
            assert ("expert_layout" in r["impl"]) == (parallel.expert * parallel.expert_tensor > 1), where
            assert (f"etp {parallel.expert_tensor}" in r["impl"].get("expert_layout", "")) == \
                (parallel.expert_tensor > 1), where
            assert ("context" in r["impl"]) == (parallel.context > 1), where
        assert set().union(*(res[name]["names"] for res in ranks)) == all_names, f"{name}: a parameter is lost"
        largest = max((res[name] for res in ranks), key=lambda r: sum(r["state"]))  # a pipeline: the formula's rank
        assert largest["state"] == largest["state_formula"], f"{name}: model state {largest['state']}"
        if moe is not None:
            summed = [[sum(v) for v in zip(*layer)] for layer in zip(*(res[name]["loads"] for res in ranks))]
            assert summed == ranks[0][name]["ref_loads"], f"{name}: loads over ranks {summed}"
        if parallel.pipeline > 1:  # the stages' sends: MoE adds nothing between stages (AuxLossIntoGradient)
            from benchsuite.parallel.pipeline import p2p_bytes_formula, pipeline_section

            figs = [res[name]["figures"] for res in ranks]
            section = pipeline_section(figs, parallel=run.parallel, model=run.model, train=run.train, micro_batch=MB,
                                       data_parallel=run.data_parallel)
            assert section["p2p_bytes_per_step"] == p2p_bytes_formula(parallel=run.parallel, model=run.model,
                                                                      micro_batch=MB), name
        if parallel.pipeline == 1 and (moe is None or not moe.dropless or moe.routing == "forced"
                                       and parallel.tensor * parallel.context == 1):  # splits the routing keeps
            from benchsuite.metrics.comm import expert_all_to_all_bytes

            exchanged = expert_all_to_all_bytes(model=run.model, moe=moe, parallel=parallel, micro_batch=MB).total
            assert (exchanged > 0) == (moe is not None and parallel.expert > 1), name
            for rank, res in enumerate(ranks):
                assert res[name]["comm"].get("all_to_all", 0) == exchanged, f"{name} rank {rank}"
        if parallel.tensor * parallel.context * parallel.expert_tensor > 1 and parallel.pipeline == 1 \
                and not parallel.sequence_parallel and parallel.zero == 0:  # these layouts' own collectives
            from benchsuite.metrics.comm import context_parallel_bytes, expert_fold_gather_bytes, expert_tensor_bytes

            context = context_parallel_bytes(model=run.model, moe=moe, context=parallel.context, tensor=parallel.tensor,
                                             micro_batch=MB, kv_bytes=4)
            fold = expert_fold_gather_bytes(model=run.model, moe=moe, parallel=parallel, micro_batch=MB)
            width = expert_tensor_bytes(model=run.model, moe=moe, parallel=parallel, micro_batch=MB)
            for rank, res in enumerate(ranks):
                comm, where = res[name]["comm"], f"{name} rank {rank}"
                assert comm.get("all_gather", 0) == fold + context.get("all_gather", 0) + width.get("all_gather", 0), \
                    where
                assert comm.get("reduce_scatter", 0) == context.get("reduce_scatter", 0) + \
                    width.get("reduce_scatter", 0), where


# ------------------------------------------------------------------ public recipes at their degrees

RECIPES = """
[suite]
name = "moe-recipes"

[defaults]
train = { micro_batch = 8, steps = 4, precision = "bf16" }

[[workload]]
name = "qwen3-30b-a3b-ep8"
model = { preset = "qwen3-30b-a3b" }
parallel = { expert = 8 }
sweep = { world_size = [8] }

[[workload]]
name = "qwen3-30b-a3b-tp4-pp2-ep4"
model = { preset = "qwen3-30b-a3b" }
parallel = { tensor = 4, pipeline = 2, expert = 4, microbatches = 8 }
sweep = { world_size = [8] }

[[workload]]
name = "qwen3-235b-a22b-tp4-pp8-vp4-ep8"
model = { preset = "qwen3-235b-a22b" }
parallel = { tensor = 4, pipeline = 8, virtual_stages = 4, schedule = "interleaved", expert = 8, microbatches = 8 }
sweep = { world_size = [64] }

[[workload]]
name = "mixtral-8x22b-tp2-pp4-ep8"
model = { preset = "mixtral-8x22b" }
parallel = { tensor = 2, pipeline = 4, expert = 8, microbatches = 8 }
sweep = { world_size = [32] }

[[workload]]
name = "qwen3-30b-a3b-long-context-cp2-tp2-ep8"
model = { preset = "qwen3-30b-a3b" }
parallel = { context = 2, tensor = 2, expert = 8 }
sweep = { world_size = [16] }

[[workload]]
name = "mixtral-8x22b-zero3-ep8"
model = { preset = "mixtral-8x22b" }
parallel = { zero = 3, expert = 8 }
sweep = { world_size = [64] }

[[workload]]
name = "mixtral-8x22b-folding-tp2-pp8-ep8"  # Liu et al. 2025's Mixtral 8x22B layout: 128 H100, here dropless
model = { preset = "mixtral-8x22b", seq_len = 4096 }
moe = { capacity_factor = 0 }
train = { micro_batch = 32 }  # global batch 256 over DP 8, in micro-batches of one sequence
parallel = { tensor = 2, pipeline = 8, expert = 8, microbatches = 32, sequence_parallel = true }
sweep = { world_size = [128] }
"""


def test_public_moe_recipes_parse_at_their_degrees():
    """The layouts of Qwen3-30B-A3B (also a long-context variant with context parallelism), Qwen3-235B-A22B
    (94 layers over PP 8 × VP 4: the ends lighter, experts folded over TP 4 × DP 2) and Mixtral 8x22B are
    accepted as a suite; each run's layout, the experts'
    own layout and the model-state formula per group follow from them at full dimensions."""
    import tomllib

    from benchsuite.config import parse_suite
    from benchsuite.layout import ParallelDims
    from benchsuite.metrics.memory import analytic_model_state, rank_param_split

    runs = {r.workload: r for r in parse_suite(tomllib.loads(RECIPES)).runs}
    assert len(runs) == 7
    folding = ParallelDims.from_run(runs["mixtral-8x22b-folding-tp2-pp8-ep8"])
    assert (folding.dp, folding.edp, folding.num_stages) == (8, 2, 8)  # EP 8 folded over TP 2 × DP 8 of a stage
    assert [len(folding.stage_layers(s, 56)) for s in range(8)] == [7] * 8
    long = ParallelDims.from_run(runs["qwen3-30b-a3b-long-context-cp2-tp2-ep8"])
    assert (long.dp, long.dp_batches, long.edp) == (8, 4, 2)
    big = ParallelDims.from_run(runs["qwen3-235b-a22b-tp4-pp8-vp4-ep8"])
    assert (big.dp, big.edp, big.num_stages) == (2, 1, 32)
    assert [len(big.stage_layers(s, 94)) for s in range(32)] == [2] + [3] * 30 + [2]
    assert big.layouts()["expert_layout"].startswith("pp 8 x edp 1 x ep 8")
    mixtral = ParallelDims.from_run(runs["mixtral-8x22b-tp2-pp4-ep8"])
    assert (mixtral.dp, mixtral.edp, mixtral.num_stages) == (4, 1, 4)
    sharded = runs["mixtral-8x22b-zero3-ep8"]
    dims = ParallelDims.from_run(sharded)
    assert (dims.dp, dims.edp, dims.experts_sharded) == (64, 8, True)
    state = analytic_model_state(sharded.model, sharded.moe, dims, compute="bf16", forward_params="fp32")
    psi, experts = rank_param_split(sharded.model, sharded.moe, dims)
    assert state["analytic"]["total"] == 16 * (psi - experts) / 64 + 16 * experts / 8, state["formula"]
    assert experts == 56 * 1 * 3 * 6144 * 16384  # one of 8 experts per rank in each of 56 layers


ETP_RECIPES = """
[suite]
name = "moe-expert-tensor"

[defaults]
model = { preset = "mixtral-8x22b", seq_len = 4096 }
moe = { capacity_factor = 0 }
train = { micro_batch = 32, steps = 4, precision = "bf16" }

[sweep]
world_size = [128]

[[workload]]
name = "mixtral-8x22b-tp2-pp8-ep8-etp2"  # Megatron-Core's default expert_tensor_parallel_size: the tensor degree
parallel = { tensor = 2, pipeline = 8, expert = 8, expert_tensor = 2, microbatches = 32, sequence_parallel = true }

[[workload]]
name = "mixtral-8x22b-folding-tp2-pp8-ep8"  # the same ranks folded at expert-TP 1 (Liu et al. 2025's row)
parallel = { tensor = 2, pipeline = 8, expert = 8, microbatches = 32, sequence_parallel = true }
"""


def test_expert_tensor_parallel_recipe_at_full_dimensions_through_flops_memory_and_predict():
    """Mixtral 8x22B on 128 H100s at TP 2 × PP 8 × EP 8 with each expert's FFN split over ETP 2 (expert-DP 1),
    beside the same ranks at ETP 1: the FLOPs per token are the model's either way; a rank holds half of its
    expert (1/ETP of the FFN columns) in the memory formula, the record's and the prediction's alike; the
    predictor runs the same expert FLOPs per device in grouped GEMMs of ETP × the rows, and charges the
    expert-tensor all-gathers and reduce-scatters of ETP × the device's rows."""
    import tomllib

    from benchsuite.config import parse_suite
    from benchsuite.layout import ParallelDims
    from benchsuite.metrics.memory import rank_param_split
    from benchsuite.metrics.tables import flops_table, memory_table_for_suite
    from benchsuite.predict import load_system, predict_run
    from benchsuite.predict.communication import expert_tensor_parallel
    from benchsuite.predict.moe import moe_time, rows_per_device
    from benchsuite.predict.workload import from_run

    suite = parse_suite(tomllib.loads(ETP_RECIPES))
    split, whole = suite.runs
    dims, folded = ParallelDims.from_run(split), ParallelDims.from_run(whole)
    assert (dims.dp, dims.ep, dims.etp, dims.edp) == (8, 8, 2, 1) and (folded.edp, folded.etp) == (2, 1)
    assert dims.layouts()["expert_layout"].startswith("pp 8 x edp 1 x ep 8 x etp 2")
    first, second = flops_table(suite).doc["runs"]
    assert first["model_flops_per_token"] == second["model_flops_per_token"] > 0
    assert first["hardware_flops_per_token"] == second["hardware_flops_per_token"]
    (psi, experts), (psi_whole, experts_whole) = rank_param_split(split.model, split.moe, dims), \
        rank_param_split(whole.model, whole.moe, folded)
    assert experts_whole == 2 * experts == 7 * 3 * 6144 * 16384  # 7 blocks a pipeline rank, one expert of each
    assert psi_whole - psi == experts
    system = load_system("workloads/systems/h100-8x.toml")
    records = memory_table_for_suite(suite, torch.device("cpu")).doc["runs"]
    for run, record in zip((split, whole), records):
        assert predict_run(run, system).memory.model_state_bytes == record["record_model_state"]["analytic"]["total"]
    w, w_whole = from_run(split, "gpu"), from_run(whole, "gpu")
    t, t_whole = moe_time(w, system), moe_time(w_whole, system)
    assert t.rows_per_expert == 2 * t_whole.rows_per_expert
    assert t.experts_s * t.efficiency == pytest.approx(t_whole.experts_s * t_whole.efficiency)  # the same FLOPs
    sent = expert_tensor_parallel(w, system)
    assert (sent.calls, sent.bytes_sent) == (4 * 7, 4 * 7 * rows_per_device(w) * 6144 * 4)  # (ETP−1) × fp32 rows
    assert expert_tensor_parallel(w_whole, system).calls == 0
    assert "expert-tensor all-gathers and reduce-scatters over 2 ranks" in predict_run(split, system).detail(
        "expert_parallel")


FOLDED = [name for name, (parallel, moe, *_) in CASES.items()  # the spawn's folded layouts, bytes checked there
          if moe is not None and parallel.expert > 1 and parallel.tensor * parallel.context > 1
          and parallel.pipeline == 1]


def _predicted_and_recorded_expert_bytes(run: RunConfig) -> tuple[tuple[float, float], tuple[float, float]]:
    """(all-to-all, expert-tensor bytes) per micro-batch of one rank as the predictor sends them, and as
    metrics.comm's record formulas count them: expert_all_to_all_bytes's token rows (the per-expert counts
    beside them are not predicted), the expert-tensor reduce-scatters forward and backward, the all-gathers as
    many. The record formulas per pipeline stage: its MoE layers only."""
    from benchsuite.metrics.comm import expert_all_to_all_bytes, expert_tensor_bytes
    from benchsuite.predict import load_system
    from benchsuite.predict.communication import expert_parallel, expert_tensor_parallel
    from benchsuite.predict.workload import from_run

    p, system = run.parallel, load_system("workloads/systems/h100-8x.toml")
    w = from_run(run, "gpu")
    sections = dict(model=replace(run.model, layers=run.model.layers // p.pipeline), moe=run.moe, parallel=p,
                    micro_batch=run.micro_batch_per_rank)
    m = p.n_microbatches
    recorded = (expert_all_to_all_bytes(**sections).rows / m,
                2 * expert_tensor_bytes(**sections).get("reduce_scatter", 0) / m)
    return (expert_parallel(w, system).bytes_sent, expert_tensor_parallel(w, system).bytes_sent), recorded


@pytest.mark.parametrize("name", FOLDED)
def test_predicted_expert_bytes_of_a_folded_layout_are_the_record_formulas(name):
    """Experts folded over tensor (× context) ranks: each rank dispatches its 1/t chunk of the routed rows
    (parallel/expert.py), so the predicted all-to-all and expert-tensor bytes are those the record formulas
    (checked against measured bytes by the spawn above) count, not t × them."""
    parallel, moe, *model = CASES[name]
    predicted, recorded = _predicted_and_recorded_expert_bytes(make_run(parallel, moe, *model))
    assert predicted == pytest.approx(recorded, rel=1e-12) and recorded[0] > 0


def test_predicted_expert_bytes_of_the_published_mixtral_folding_layouts_are_the_record_formulas():
    """Mixtral 8x22B on 128 H100s (Liu et al. 2025's TP 2 × PP 8 × EP 8 row, and with ETP 2), bf16: a rank
    sends half the routed rows of its tensor-parallel pair, in fp32 (the residual stream's rows)."""
    import tomllib

    from benchsuite.config import parse_suite
    from benchsuite.predict.moe import rows_per_device
    from benchsuite.predict.workload import from_run

    for run in parse_suite(tomllib.loads(ETP_RECIPES)).runs:
        predicted, recorded = _predicted_and_recorded_expert_bytes(run)
        assert predicted == pytest.approx(recorded, rel=1e-12), run.workload
        assert rows_per_device(from_run(run, "gpu")) == 4096 * 2 // 2  # N·k/t
        assert recorded[0] == 4 * 7 / 8 * 7 * 4096 * 2 // 2 * 6144 * 4  # (EP−1)/EP of 7 layers' N·k/t fp32 rows
        assert (recorded[1] > 0) == (run.parallel.expert_tensor > 1)


@pytest.mark.parametrize("parallel,kind,key,needle", [
    ({"tensor": 2, "expert": 2, "sequence_parallel": True}, "moe", "parallel.sequence_parallel",
     "model.seq_len (15) over tensor (2) ranks"),
    ({"expert": 2, "zero": 1}, "moe", "parallel.zero", "use zero = 2 or 3"),
    ({"tensor": 2, "pipeline": 2, "zero": 1}, "moe", "parallel.zero", "zero = 2 or 3"),
    ({"expert": 8, "tensor": 2}, "moe", "parallel.expert", "must divide data-parallel × tensor (2 × 2 = 4)"),
    ({"context": 2, "tensor": 2, "sequence_parallel": True}, "dense", "parallel.context",
     "2 × context × tensor, with sequence_parallel, (8) must divide model.seq_len (15)"),
    ({"context": 3}, "dense", "parallel.context", "must divide the data-parallel ranks (4)"),
    ({"expert_tensor": 3}, "moe", "parallel.expert_tensor",
     "expert_tensor (3) must divide the experts' FFN width (128, moe.expert_hidden or model.ffn_hidden)"),
    ({"expert": 2, "expert_tensor": 4}, "moe", "parallel.expert_tensor",
     "expert × expert_tensor (2 × 4) must divide data-parallel × tensor (4 × 1 = 4)"),
    ({"expert_tensor": 2, "zero": 1}, "moe", "parallel.zero", "use zero = 2 or 3"),
    ({"expert_tensor": 2}, "dense", "parallel.expert_tensor", "needs kind = \"moe\""),
])
def test_layouts_still_refused_say_why_and_what_to_set(parallel, kind, key, needle):
    from benchsuite.config import parse_suite

    doc = {"defaults": {"model": dict(layers=4, hidden=32, heads=4, vocab=64, seq_len=15)},
           "workload": [{"name": "w", "kind": kind, "parallel": parallel, "train": {"micro_batch": 8},
                         **({"moe": {"experts": 8}} if kind == "moe" else {})}],
           "sweep": {"world_size": [4]}}
    with pytest.raises(ConfigError) as e:
        parse_suite(doc)
    assert key in str(e.value) and needle in str(e.value), str(e.value)


def test_stage_layer_counts_put_the_remainder_in_the_middle_and_honour_given_ends():
    from benchsuite.config.rules import stage_layer_counts

    assert stage_layer_counts(94, 32) == (2,) + (3,) * 30 + (2,)  # Qwen3-235B over PP 8 × VP 4
    assert stage_layer_counts(8, 4) == (2, 2, 2, 2) and stage_layer_counts(5, 4) == (1, 2, 1, 1)
    assert stage_layer_counts(10, 4) == (2, 3, 3, 2) and stage_layer_counts(5, 2) == (3, 2)
    assert stage_layer_counts(61, 16, first=3, last=2) == (3,) + (4,) * 14 + (2,)  # Megatron's first/last keys
    assert stage_layer_counts(4, 2, first=1) == (1, 3) and stage_layer_counts(4, 2, last=1) == (3, 1)
    with pytest.raises(ValueError, match="split them equally"):
        stage_layer_counts(10, 4, first=2)
    with pytest.raises(ValueError, match="exceeds model.layers"):
        stage_layer_counts(3, 4)


def test_pipeline_ranks_hold_the_parameters_of_their_stages():
    """metrics.memory's Ψ per pipeline rank, with MoE blocks, experts spread over ep, uneven stages and a
    tied head's copy on the last stage, is the parameter count of the stage modules a rank builds."""
    from benchsuite.layout import ParallelDims, Schedule
    from benchsuite.metrics.memory import pipeline_rank_params
    from benchsuite.models.transformer import build_model
    from benchsuite.parallel.pipeline import StageModule

    dims = ParallelDims.from_degrees(pp=2, dp=2, ep=2, virtual_stages=2, schedule=Schedule.INTERLEAVED)
    model = build_model(TIED, CAPACITY)
    expert_rows = CAPACITY.experts // dims.ep
    for rank, (total, experts) in enumerate(pipeline_rank_params(TIED, dims, CAPACITY)):
        stages = [StageModule(model, dims.stage_layers(s, TIED.layers), s == 0, s == dims.num_stages - 1)
                  for s in dims.stage_ids(rank)]
        params = [(n, p) for stage in stages for n, p in stage.named_parameters()]
        own = sum(p[:expert_rows].numel() if ".experts." in n else p.numel() for n, p in params)
        assert (total, experts) == (own, sum(p[:expert_rows].numel() for n, p in params if ".experts." in n))


def test_context_parallel_activations_add_the_gathered_keys_and_values():
    """Without recompute a context-parallel rank also keeps the K/V it gathered from the c − 1 other shards;
    with recompute they are gathered again inside the checkpoint, so nothing is added."""
    from benchsuite.metrics.memory import activation_bytes

    s, b, h, a, L, v = 4096, 1, 8192, 64, 4, 32000
    for c, t in ((2, 1), (4, 8)):
        base = activation_bytes(s, b, h, a, L, v, tp=t)
        shard = activation_bytes(s, b, h, a, L, v, tp=t, context=c)
        assert shard["per_layer_bytes"] - base["per_layer_bytes"] == 2 * 2 * (c - 1) * s * b * h / t
        assert shard["formula"].endswith("+ 2·2·(c−1)·s·b·h/t + 4·s·b·h/t·(1 + v/h)")
        for recompute in ("selective", "full"):
            assert activation_bytes(s, b, h, a, L, v, tp=t, context=c, recompute=recompute) == \
                activation_bytes(s, b, h, a, L, v, tp=t, recompute=recompute)


def test_context_shards_cover_the_sequence_once_with_equal_causal_work():
    from benchsuite.parallel.context import shard_positions

    for c, t in ((2, 8), (4, 64)):
        shards = [shard_positions(r, c, t) for r in range(c)]
        assert sorted(torch.cat(shards).tolist()) == list(range(t))
        assert len({int((s + 1).sum()) for s in shards}) == 1  # keys each shard's queries see, causally
