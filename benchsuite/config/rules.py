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


def _check_tensor(kind: str, sections: dict[str, Any], problems: Problems) -> None:
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
    if p.zero and problems.known("parallel.zero"):
        problems.add("parallel.zero", "ZeRO stages 1-3 with tensor > 1 are not supported; set zero = 0 or tensor = 1")
    if p.sequence_parallel and kind == "moe" and problems.known("parallel.sequence_parallel", "kind"):
        problems.add("parallel.sequence_parallel", "sequence parallelism supports dense models (an MoE layer is not "
                                                   "split over the sequence); set sequence_parallel = false")
    if p.sequence_parallel and p.pipeline > 1 and problems.known("parallel.sequence_parallel", "parallel.pipeline"):
        problems.add("parallel.sequence_parallel", "sequence parallelism with pipeline > 1 is not supported; set "
                                                   "sequence_parallel = false or pipeline = 1")


def _check_expert(sections: dict[str, Any], problems: Problems) -> None:
    """Expert parallelism: the experts it shards, and the layouts it is not combined with."""
    p, moe = sections["parallel"], sections.get("moe")
    if p.expert == 1 or not problems.known("parallel.expert"):
        return
    if p.tensor > 1 and problems.known("parallel.tensor"):
        problems.add("parallel.expert", "expert parallelism with tensor > 1 is not supported; set tensor = 1 or "
                                        "expert = 1")
    if p.zero and problems.known("parallel.zero"):
        problems.add("parallel.zero", "ZeRO stages 1-3 would shard expert shards as if replicated; use zero = 0 "
                                      "with expert > 1")
    if moe and problems.known("moe.experts") and moe.experts % p.expert:
        problems.add("parallel.expert", f"expert ({p.expert}) must divide moe.experts ({moe.experts})")


def check_layout(kind: str, sections: dict[str, Any], problems: Problems) -> None:
    """Parallel layouts that cannot run at any world size; checked once per workload."""
    _check_tensor(kind, sections, problems)
    _check_expert(sections, problems)
    m, moe = sections["model"], sections.get("moe")
    if moe and problems.known("moe.every", "model.layers") and moe.every > m.layers:
        problems.add("moe.every", f"every ({moe.every}) exceeds model.layers ({m.layers})")
    _check_pipeline(kind, sections, problems)


def _check_stages(sections: dict[str, Any], problems: Problems) -> None:
    """The stages a pipeline cuts the layers into, and the microbatches its schedule needs."""
    p, m = sections["parallel"], sections["model"]
    stages = p.pipeline * p.virtual_stages
    if problems.known("model.layers") and m.layers % stages:
        problems.add("parallel.pipeline", f"pipeline × virtual_stages ({p.pipeline} × {p.virtual_stages}) must "
                                          f"divide model.layers ({m.layers}): choose stages whose product divides "
                                          f"the layers, or change model.layers")
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


def _check_pipeline(kind: str, sections: dict[str, Any], problems: Problems) -> None:
    """Pipeline layouts that cannot run, and the features not combined with a pipeline (yet)."""
    p, m, t = sections["parallel"], sections["model"], sections["train"]
    if p.pipeline == 1 or not problems.known("parallel.pipeline", "parallel.virtual_stages", "parallel.schedule"):
        return
    _check_stages(sections, problems)
    refusals = [  # (refused, the key named, reason): each judged only when the key's value was accepted
        (p.expert > 1, "parallel.expert", "pipeline with expert parallelism is not supported; set expert = 1 "
                                          "or pipeline = 1"),
        (kind == "moe", "kind", "pipeline parallelism supports dense models (the MoE auxiliary loss is not "
                                "carried between stages); use kind = \"dense\" or pipeline = 1"),
        (p.zero > 0, "parallel.zero", "ZeRO stages 1-3 with pipeline > 1 are not supported; set zero = 0 or "
                                      "pipeline = 1"),
        (t.grad_accum > 1, "train.grad_accum", "with pipeline > 1 the microbatches are the accumulation: set "
                                               "grad_accum = 1 and raise parallel.microbatches"),
        (t.compile, "train.compile", "compile with pipeline > 1 is not supported; set compile = false"),
        (t.eval_every > 0, "train.eval_every", "validation with pipeline > 1 is not supported; set eval_every = 0"),
        (m.tie_embeddings, "model.tie_embeddings", "model.tie_embeddings shares the LM head with the token "
                                                   "embedding, which parallel.pipeline > 1 puts on another stage: "
                                                   "not supported; set tie_embeddings = false or pipeline = 1"),
    ]
    for bad, name, reason in refusals:
        if bad and problems.known(name):
            problems.add(name, reason)


def check_workload(kind: str, sections: dict[str, Any], problems: Problems) -> None:
    """Every rule of one workload that holds at any world size."""
    check_model(sections["model"], problems)
    check_train(sections["train"], problems)
    check_energy(sections["energy"], sections["train"], problems)
    check_data_path(sections["train"], problems)
    check_layout(kind, sections, problems)
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
    if p.expert > 1 and problems.known("parallel.expert") and run.data_parallel % p.expert:
        problems.add("parallel.expert", f"expert ({p.expert}) must divide the data-parallel size ({run.data_parallel})")
    if (run.scaling == "strong" and problems.known("sweep.scaling", "train.micro_batch")
            and run.train.micro_batch % run.data_parallel):
        problems.add("train.micro_batch", f"strong scaling splits the global batch ({run.train.micro_batch}) over "
                                          f"{run.data_parallel} data-parallel ranks: it must divide evenly")
    elif (p.pipeline > 1 and problems.known("train.micro_batch", "parallel.microbatches")
          and run.micro_batch_per_rank % p.n_microbatches):
        problems.add("parallel.microbatches", f"the per-rank batch ({run.micro_batch_per_rank} sequences) is split "
                                              f"into {p.n_microbatches} pipeline microbatches: it must divide evenly; "
                                              f"change train.micro_batch or parallel.microbatches")
