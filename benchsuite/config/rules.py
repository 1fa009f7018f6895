"""Cross-field rules: values each valid alone that cannot run together (heads and tensor, stages and layers,
world size and degrees), checked over the problems collector so a refused value skips the rules that read it."""

from __future__ import annotations

import os
from typing import Any

from benchsuite.config.problems import Problems
from benchsuite.config.run import RunConfig
from benchsuite.record.sections import EnergyConfig, ModelConfig, MoEConfig, TrainConfig
from benchsuite.record.kinds import ROUTERS

NAME_MAX, PATH_MAX = 255, 4096  # bytes of one path component and of a whole path (Linux file systems)


def check_model(model: ModelConfig, problems: Problems) -> None:
    if problems.known("model.hidden", "model.heads", "model.head_dim") and model.head_dim is None \
            and model.hidden % model.heads:
        problems.add("model.heads", f"heads ({model.heads}) must divide hidden ({model.hidden}), or give "
                                    f"model.head_dim")
    if problems.known("model.heads", "model.kv_heads") and model.heads % model.n_kv_heads:
        problems.add("model.kv_heads", f"kv_heads ({model.n_kv_heads}) must divide heads ({model.heads}): each "
                                       f"key/value head serves a whole group")
    if (problems.known("model.position", "model.hidden", "model.heads", "model.head_dim")
            and model.position == "rope" and model.dim_head % 2):
        problems.add("model.position", f"rotary positions rotate pairs of a head's dimensions: the head width "
                                       f"({model.dim_head}) must be even")


def check_train(train: TrainConfig, problems: Problems) -> None:
    if problems.known("train.warmup_steps", "train.compile") and train.warmup_steps < train.min_warmup_steps:
        problems.add("train.warmup_steps", f"must be >= {train.min_warmup_steps} with train.compile = true: one "
                                           f"more unmeasured step so that compilation never lands in a measured step")


def check_energy(energy: EnergyConfig, train: TrainConfig, problems: Problems) -> None:
    """The idle baseline is measured inside the run's time limit: one as long as the limit never ends."""
    if problems.known("energy.idle_baseline_s", "train.timeout_s") and energy.idle_baseline_s >= train.timeout_s:
        problems.add("energy.idle_baseline_s",
                     f"the idle baseline ({energy.idle_baseline_s:g} s) is measured within train.timeout_s "
                     f"({train.timeout_s:g} s): the run would be killed while measuring idle power; lower "
                     f"idle_baseline_s or raise train.timeout_s")


def _path_problem(data: str) -> str | None:
    """What makes train.data impossible as a path on any file system (checked before the file system is asked)."""
    if "\x00" in data:
        return "contains a NUL byte, which no file name can hold; give the path of a .bin token file"
    try:
        raw = os.fsencode(data)
    except UnicodeError:
        return "cannot be encoded as a file name; give the path of a .bin token file"
    longest = max(raw.split(b"/"), key=len)
    if len(longest) > NAME_MAX:
        return (f"has a path component of {len(longest)} bytes; file names hold at most {NAME_MAX} bytes: "
                f"give the path of a .bin token file")
    if len(raw) > PATH_MAX:
        return f"is {len(raw)} bytes long; paths hold at most {PATH_MAX} bytes: give a shorter path"
    return None


def check_data_path(train: TrainConfig, problems: Problems) -> None:
    """A train.data path no file system can hold is refused here; the file itself is opened by preflight.py."""
    problem = None if train.data == "synthetic" else _path_problem(train.data)
    if problem and problems.known("train.data"):
        problems.refuse("train.data", problem)


def check_moe(moe: MoEConfig | None, problems: Problems) -> None:
    """The MoE values that cannot run together (k and experts, expert choice and dropless)."""
    if moe is None or not problems.known("moe.router"):
        return
    if problems.known("moe.top_k", "moe.experts") and moe.k is not None and moe.k > moe.experts:
        problems.add("moe.top_k", f"each token chooses {moe.k} experts, more than moe.experts ({moe.experts}); "
                                  f"lower top_k or raise experts")
    if problems.known("moe.capacity_factor") and moe.dropless and not ROUTERS[moe.router].token_choice:
        problems.add("moe.capacity_factor", "expert choice needs capacity_factor > 0 (each expert takes "
                                            "capacity_factor·N/E tokens); 0 (dropless) is for token-choice routers")


def _check_tensor(sections: dict[str, Any], problems: Problems) -> None:
    """Tensor parallelism: the widths it splits, and the features it is not combined with."""
    p, m = sections["parallel"], sections["model"]
    if p.tensor == 1 or not problems.known("parallel.tensor"):
        return
    for name, size, keys in (("heads", m.heads, ("model.heads",)), ("vocab", m.vocab, ("model.vocab",)),
                             ("kv_heads", m.n_kv_heads, ("model.kv_heads", "model.heads")),
                             ("ffn_hidden", m.ffn, ("model.ffn_hidden", "model.hidden"))):
        if problems.known(*keys) and size % p.tensor:
            problems.add("parallel.tensor", f"tensor ({p.tensor}) must divide model.{name} ({size})")
    if m.qk_norm == "full" and problems.known("model.qk_norm"):
        problems.add("parallel.tensor", "model.qk_norm = \"full\" normalises over all heads, which parallel.tensor "
                                        "> 1 splits over ranks: not supported; set tensor = 1")
    if p.zero == 1 and problems.known("parallel.zero"):
        problems.add("parallel.zero", "ZeRO stage 1 (ZeroRedundancyOptimizer) with tensor > 1 is not supported: "
                                      "set zero = 0, or zero = 2 or 3 (FSDP2 shards the tensor-parallel shards)")
    if p.sequence_parallel and problems.known("parallel.sequence_parallel", "model.seq_len") and m.seq_len % p.tensor:
        problems.add("parallel.sequence_parallel", f"sequence parallelism splits model.seq_len ({m.seq_len}) over "
                                                   f"tensor ({p.tensor}) ranks: it must divide evenly; change seq_len "
                                                   f"or set sequence_parallel = false")


def _check_expert(sections: dict[str, Any], problems: Problems) -> None:
    """Expert and expert-tensor parallelism: the experts and the FFN width they shard, and the layouts they
    are not combined with."""
    p, moe = sections["parallel"], sections.get("moe")
    split = [key for key, degree in (("parallel.expert", p.expert), ("parallel.expert_tensor", p.expert_tensor))
             if degree > 1 and problems.known(key)]
    if not split:
        return
    if p.zero == 1 and problems.known("parallel.zero"):
        problems.add("parallel.zero", "ZeRO stage 1 (ZeroRedundancyOptimizer) would broadcast one rank's expert "
                                      "shard over ranks holding other shards; use zero = 2 or 3 (FSDP2 shards "
                                      "the experts over their expert-data-parallel group) or zero = 0")
    if moe and "parallel.expert" in split and problems.known("moe.experts") and moe.experts % p.expert:
        problems.add("parallel.expert", f"expert ({p.expert}) must divide moe.experts ({moe.experts})")
    width = (moe.expert_hidden or sections["model"].ffn) if moe else None
    if width and "parallel.expert_tensor" in split and width % p.expert_tensor \
            and problems.known("moe.expert_hidden", "model.ffn_hidden", "model.hidden"):
        problems.add("parallel.expert_tensor", f"expert_tensor ({p.expert_tensor}) must divide the experts' FFN width "
                                               f"({width}, moe.expert_hidden or model.ffn_hidden): each rank holds "
                                               f"1/{p.expert_tensor} of every expert's columns; use a divisor of "
                                               f"{width}")


def _check_context(sections: dict[str, Any], problems: Problems) -> None:
    """Context parallelism: the sequence it splits (with sequence parallelism, split again over tensor)."""
    p, m = sections["parallel"], sections["model"]
    if p.context == 1 or not problems.known("parallel.context"):
        return
    chunks = 2 * p.context * (p.tensor if p.sequence_parallel else 1)
    if problems.known("model.seq_len", "parallel.sequence_parallel") and m.seq_len % chunks:
        sp = " × tensor, with sequence_parallel," if p.sequence_parallel else ""
        problems.add("parallel.context", f"2 × context{sp} ({chunks}) must divide model.seq_len ({m.seq_len}): each "
                                         f"rank holds two equal chunks of every sequence")


def check_layout(sections: dict[str, Any], problems: Problems) -> None:
    """Parallel layouts that cannot run at any world size; checked once per workload."""
    _check_tensor(sections, problems)
    _check_context(sections, problems)
    _check_expert(sections, problems)
    m, moe = sections["model"], sections.get("moe")
    if moe and problems.known("moe.every", "model.layers") and moe.every > m.layers:
        problems.add("moe.every", f"every ({moe.every}) exceeds model.layers ({m.layers})")
    _check_pipeline(sections, problems)


def _check_stages(sections: dict[str, Any], problems: Problems) -> None:
    """The stages a pipeline cuts the layers into, and the microbatches its schedule needs."""
    p, m = sections["parallel"], sections["model"]
    stages = p.pipeline * p.virtual_stages
    key = ("parallel.first_stage_layers" if p.first_stage_layers is not None else
           "parallel.last_stage_layers" if p.last_stage_layers is not None else "parallel.pipeline")
    if problems.known("model.layers", "parallel.first_stage_layers", "parallel.last_stage_layers"):
        try:
            stage_layer_counts(m.layers, stages, p.first_stage_layers, p.last_stage_layers)
        except ValueError as e:
            problems.add(key, str(e))
    if p.schedule == "interleaved" and p.virtual_stages < 2:
        problems.add("parallel.virtual_stages", "schedule = \"interleaved\" needs virtual_stages >= 2 (several "
                                                "stages per rank); or use schedule = \"1f1b\"")
    if p.schedule != "interleaved" and p.virtual_stages > 1:
        problems.add("parallel.virtual_stages", f"virtual_stages > 1 needs schedule = \"interleaved\" (got "
                                                f"{p.schedule!r}); or set virtual_stages = 1")
    n = p.n_microbatches
    if problems.known("parallel.microbatches") and p.schedule != "gpipe" and n < p.pipeline:
        problems.add("parallel.microbatches", f"schedule {p.schedule!r} needs microbatches >= pipeline "
                                              f"({n} < {p.pipeline}): raise microbatches or use schedule = \"gpipe\"")
    rounds = max(1, n // p.pipeline)
    if problems.known("parallel.microbatches") and p.schedule == "interleaved" and n % rounds:
        problems.add("parallel.microbatches", f"interleaved 1F1B runs microbatches in rounds of pipeline "
                                              f"({p.pipeline}): {n} is not a multiple of {rounds} rounds; use a "
                                              f"multiple of pipeline")


def stage_layer_counts(layers: int, stages: int, first: int | None = None,
                       last: int | None = None) -> tuple[int, ...]:
    """Blocks per pipeline stage (layout.py). Given the first and/or last stage's (Megatron's
    --decoder-first/last-pipeline-num-layers), the other stages split the rest equally. Otherwise L // S
    each, and the L mod S left over one each to the middle stages first, so the first and last stages,
    which also hold the embedding and the LM head, are the lighter ones as Megatron's uneven recipes set
    them (Qwen3-235B's 94 layers over 32 stages: 2, 3 × 30, 2); the ends take a block only when every
    middle stage has one more. ValueError, worded for the suite, when no stage split holds every block
    once with at least one per stage."""
    if layers < stages:
        raise ValueError(f"pipeline × virtual_stages = {stages} stages exceeds model.layers ({layers}): each stage "
                         f"needs a block; use fewer stages")
    if first is None and last is None:
        base, extra = divmod(layers, stages)
        order = list(range(1, stages - 1)) + [0, stages - 1][:stages]  # middles first, then the two ends
        counts = [base] * stages
        for stage in order[:extra]:
            counts[stage] += 1
        return tuple(counts)
    ends = {0: first, stages - 1: last} if stages > 1 else {0: first or last}
    ends = {s: n for s, n in ends.items() if n is not None}
    rest, others = layers - sum(ends.values()), stages - len(ends)
    if rest < others or (others and rest % others) or (not others and rest):
        raise ValueError(f"first_stage_layers / last_stage_layers ({first} / {last}) leave {rest} of model.layers "
                         f"({layers}) blocks for the other {others} stages: they must split them equally, one "
                         f"block at least each; change the two counts or the stages")
    return tuple(ends.get(s, rest // others if others else 0) for s in range(stages))


def _check_pipeline(sections: dict[str, Any], problems: Problems) -> None:
    """Pipeline layouts that cannot run, and the features not combined with a pipeline (yet)."""
    p, m, t = sections["parallel"], sections["model"], sections["train"]
    if p.pipeline == 1 or not problems.known("parallel.pipeline", "parallel.virtual_stages", "parallel.schedule"):
        return
    _check_stages(sections, problems)
    refusals = [  # (refused, the key named, reason): each judged only when the key's value was accepted
        (p.zero == 1, "parallel.zero", "ZeRO stage 1 (ZeroRedundancyOptimizer) with pipeline > 1 is not "
                                       "supported: set zero = 0, or zero = 2 or 3 (FSDP2 shards each stage)"),
        (t.grad_accum > 1, "train.grad_accum", "with pipeline > 1 the microbatches are the accumulation: set "
                                               "grad_accum = 1 and raise parallel.microbatches"),
        (t.compile, "train.compile", "compile with pipeline > 1 is not supported; set compile = false"),
        (t.eval_every > 0, "train.eval_every", "validation with pipeline > 1 is not supported; set eval_every = 0"),
    ]
    for bad, name, reason in refusals:
        if bad and problems.known(name):
            problems.add(name, reason)


def check_workload(sections: dict[str, Any], problems: Problems) -> None:
    """Every rule of one workload that holds at any world size."""
    check_model(sections["model"], problems)
    check_train(sections["train"], problems)
    check_energy(sections["energy"], sections["train"], problems)
    check_data_path(sections["train"], problems)
    check_layout(sections, problems)
    check_moe(sections.get("moe"), problems)


def _whole_data_parallel(run: RunConfig, problems: Problems) -> bool:
    """Whether the world size splits into whole tensor × pipeline groups (the rules on data_parallel need it)."""
    p = run.parallel
    if not problems.known("sweep.world_size", "parallel.tensor"):
        return False
    if run.world_size % p.tensor:
        problems.add("parallel.tensor", f"world_size ({run.world_size}) must be divisible by tensor ({p.tensor})")
        return False
    if problems.known("parallel.pipeline") and run.world_size % (p.tensor * p.pipeline):
        problems.add("parallel.pipeline", f"world_size ({run.world_size}) must be divisible by tensor × pipeline "
                                          f"({p.tensor} × {p.pipeline}); change the sweep's world_size or the degrees")
        return False
    return True


def check_run(run: RunConfig, problems: Problems) -> None:
    """Combinations of one world size with the layout that cannot run; found here so nothing is launched."""
    p = run.parallel
    problems = problems.at(f"{problems.where} (world_size={run.world_size}, nodes={run.nodes})")
    if problems.known("sweep.world_size", "sweep.nodes") and run.world_size % run.nodes:
        problems.add("sweep.nodes", f"nodes ({run.nodes}) must divide world_size ({run.world_size})")
    if not _whole_data_parallel(run, problems):
        return
    if p.context > 1 and problems.known("parallel.context") and run.data_parallel % p.context:
        problems.add("parallel.context", f"context ({p.context}) must divide the data-parallel ranks "
                                         f"({run.data_parallel}): each context-parallel group shares one batch")
    stage_ranks = run.data_parallel * p.tensor  # the experts fold over dp × tp within a stage (layout.py)
    if p.expert_tensor > 1 and problems.known("parallel.expert", "parallel.expert_tensor") \
            and stage_ranks % (p.expert * p.expert_tensor):
        problems.add("parallel.expert_tensor", f"expert × expert_tensor ({p.expert} × {p.expert_tensor}) must divide "
                                               f"data-parallel × tensor ({run.data_parallel} × {p.tensor} = "
                                               f"{stage_ranks}), the ranks of a pipeline stage the experts are folded "
                                               f"over (expert_tensor × expert × expert-data-parallel × pipeline = "
                                               f"world_size): lower expert or expert_tensor, or change world_size")
    elif p.expert > 1 and problems.known("parallel.expert") and stage_ranks % p.expert:
        problems.add("parallel.expert", f"expert ({p.expert}) must divide data-parallel × tensor ({run.data_parallel} "
                                        f"× {p.tensor} = {stage_ranks}), the ranks of a pipeline stage the experts "
                                        f"are folded over")
    if (run.scaling == "strong" and problems.known("sweep.scaling", "train.micro_batch")
            and run.train.micro_batch % run.data_parallel):
        problems.add("train.micro_batch", f"strong scaling splits the global batch ({run.train.micro_batch}) over "
                                          f"{run.data_parallel} data-parallel ranks: it must divide evenly")
    elif (p.pipeline > 1 and problems.known("train.micro_batch", "parallel.microbatches")
          and run.micro_batch_per_rank % p.n_microbatches):
        problems.add("parallel.microbatches", f"the per-rank batch ({run.micro_batch_per_rank} sequences) is split "
                                              f"into {p.n_microbatches} pipeline microbatches: it must divide evenly; "
                                              f"change train.micro_batch or parallel.microbatches")
