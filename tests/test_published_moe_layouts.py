"""Every layout of the H100 tables of Liu et al. 2025, "MoE Parallel Folding: Heterogeneous Parallelism
Mappings for Efficient Large-Scale MoE Model Training with Megatron Core" (arXiv 2504.14960), accepted as a
suite at its full dimensions and degrees, and carried through `flops`, `memory` and `predict`.

From the paper: Table 3 (the best layout of each method per model: FSDP, FSDP + EP, TP + EP + DP, Megatron-Core
and Megatron-Core with folding; global batch 256, sequence 4096) and Table 5 (Mixtral 8x22B's context scaling,
CP 4-16, the tokens of a global batch held at 2^24). The paper trains with token dropping at capacity factor 1.
Its cells leave some degrees implicit, read here as Megatron-Core reads them:
- expert tensor parallelism: blank in the rows without folding, where Megatron-Core splits each expert over the
  tensor-parallel ranks (expert_tensor_parallel_size defaults to the tensor degree); 1 in the folding rows. The
  folding row of Llama3-8x70B leaves it blank and cannot be the tensor degree (EP 8 × ETP 8 × PP 16 > 256
  GPUs): 1, as every other folding row;
- data parallelism: the GPUs over TP × PP (CP counted inside it, as benchsuite's parallel.context is);
- the FSDP rows: ZeRO-3 (FSDP2) over the data-parallel ranks, pipeline 1;
- Llama3-8x70B is Llama3-70B upcycled to 8 experts; its top-k is not stated: top-2, as Mixtral;
  Mixtral-8x22B-G8T8 is Mixtral 8x22B made 64 experts of 1/8 the width, 8 active.
Micro-batch 1 as the authors' released recipes give it (yanring/Megatron-MoE-ModelZoo, 78fd4d6): each
data-parallel rank's share of the global batch in micro-batches of one sequence. One difference remains with
context parallelism: benchsuite's cp ranks share cp × b sequences, each rank a 1/cp shard of every one (the
tokens a rank holds are Megatron-Core's), so a pipeline micro-batch holds at least cp sequences per context
group where Megatron-Core's holds one. The 128K row's 128 sequences over 2 context groups then make 4
micro-batches a rank, fewer than 1F1B's 8 stages need: that row runs GPipe.
"""

from __future__ import annotations

import math

import pytest
import torch

from benchsuite.config import parse_suite
from benchsuite.layout import ParallelDims
from benchsuite.metrics.tables import flops_table, memory_table_for_suite
from benchsuite.predict import load_system, predict_run

MIXTRAL = {"preset": "mixtral-8x22b", "vocab": 32000}
MODELS = {  # model, moe: the paper's four models
    "mixtral-8x22b": (MIXTRAL, {"experts": 8, "top_k": 2}),
    "qwen2-57b-a14b": ({"layers": 28, "hidden": 3584, "heads": 28, "kv_heads": 4, "vocab": 151936,
                        "activation": "swiglu", "norm": "rmsnorm", "position": "rope"},
                       {"experts": 64, "top_k": 8, "expert_hidden": 2560, "shared_experts": 8}),
    "mixtral-8x22b-g8t8": (MIXTRAL, {"experts": 64, "top_k": 8, "expert_hidden": 2048}),
    "llama3-8x70b": ({"preset": "llama3-70b"}, {"experts": 8, "top_k": 2}),
}
# model, method, GPUs, CP, TP, EP, PP, ETP, published MFU (None: out of memory), sequence, global batch
TABLE_3 = [
    ("mixtral-8x22b", "fsdp", 128, 1, 8, 1, 1, 8, 0.043),
    ("mixtral-8x22b", "fsdp-ep", 128, 1, 2, 8, 1, 2, 0.234),
    ("mixtral-8x22b", "tp-ep-dp", 128, 1, 4, 8, 1, 4, 0.366),
    ("mixtral-8x22b", "mcore", 128, 1, 2, 4, 8, 2, 0.463),
    ("mixtral-8x22b", "folding", 128, 1, 2, 8, 8, 1, 0.493),
    ("qwen2-57b-a14b", "fsdp", 64, 1, 2, 1, 1, 2, 0.099),
    ("qwen2-57b-a14b", "fsdp-ep", 64, 1, 1, 8, 1, 1, 0.254),
    ("qwen2-57b-a14b", "tp-ep-dp", 64, 1, 4, 4, 1, 4, 0.231),
    ("qwen2-57b-a14b", "mcore", 64, 1, 2, 4, 4, 2, 0.353),
    ("qwen2-57b-a14b", "folding", 64, 1, 2, 4, 4, 1, 0.390),
    ("mixtral-8x22b-g8t8", "fsdp", 128, 1, 8, 1, 1, 8, 0.022),
    ("mixtral-8x22b-g8t8", "fsdp-ep", 128, 1, 4, 8, 1, 4, 0.090),
    ("mixtral-8x22b-g8t8", "tp-ep-dp", 128, 1, 8, 8, 1, 8, 0.087),
    ("mixtral-8x22b-g8t8", "mcore", 128, 1, 2, 8, 8, 2, 0.171),
    ("mixtral-8x22b-g8t8", "folding", 128, 1, 4, 8, 8, 1, 0.288),
    ("llama3-8x70b", "fsdp", 256, 8, 8, 1, 1, 8, None),
    ("llama3-8x70b", "fsdp-ep", 256, 1, 8, 8, 1, 8, 0.196),
    ("llama3-8x70b", "tp-ep-dp", 256, 1, 8, 8, 1, 8, None),
    ("llama3-8x70b", "mcore", 256, 1, 8, 4, 8, 8, 0.388),
    ("llama3-8x70b", "folding", 256, 1, 8, 8, 16, 1, 0.416),
]
TABLE_5 = [  # Mixtral 8x22B, context scaling: GPUs, sequence, CP, TP, EP, PP, ETP, global batch, MFU
    ("mcore", 128, 16384, 4, 2, 4, 8, 2, 1024, 0.453),
    ("mcore", 256, 32768, 8, 2, 4, 8, 2, 512, 0.432),
    ("mcore", 512, 65536, 16, 2, 4, 8, 2, 256, 0.426),
    ("mcore", 1024, 131072, 16, 4, 8, 8, 4, 128, 0.382),
    ("folding", 128, 16384, 4, 2, 8, 8, 1, 1024, 0.476),
    ("folding", 256, 32768, 8, 2, 8, 8, 1, 512, 0.451),
    ("folding", 512, 65536, 8, 4, 8, 8, 1, 256, 0.445),
    ("folding", 1024, 131072, 8, 8, 8, 8, 1, 128, 0.429),
]
ROWS = [(f"{m}-{method}", m, gpus, cp, tp, ep, pp, etp, mfu, 4096, 256)
        for m, method, gpus, cp, tp, ep, pp, etp, mfu in TABLE_3] + \
       [(f"mixtral-8x22b-{method}-seq{seq // 1024}k", "mixtral-8x22b", gpus, cp, tp, ep, pp, etp, mfu, seq, batch)
        for method, gpus, seq, cp, tp, ep, pp, etp, batch, mfu in TABLE_5]


def workload(name, model, gpus, cp, tp, ep, pp, etp, seq, batch) -> dict:
    arch, moe = MODELS[model]
    dp = gpus // (tp * pp)
    zero = 3 if "fsdp" in name else 0  # FSDP: every weight sharded over the data-parallel ranks
    return {"name": name, "kind": "moe", "model": {**arch, "seq_len": seq},
            "moe": {**moe, "router": "token_choice", "capacity_factor": 1.0, "every": 1},
            "train": {"micro_batch": batch // dp, "precision": "bf16", "steps": 4},
            "parallel": {"tensor": tp, "pipeline": pp, "context": cp, "expert": ep, "expert_tensor": etp,
                         "zero": zero, "sequence_parallel": tp > 1,
                         **({"microbatches": batch // dp} if pp > 1 else {}),
                         **({"schedule": "gpipe"} if batch // dp < pp else {})},
            "sweep": {"world_size": [gpus]}}


@pytest.fixture(scope="module")
def suite():
    return parse_suite({"suite": {"name": "moe-parallel-folding-h100"},
                        "workload": [workload(*row[:8], *row[9:]) for row in ROWS]})  # (all but the MFU)


def test_every_layout_of_the_folding_papers_h100_tables_is_a_suite_at_its_degrees(suite):
    assert len(suite.runs) == len(ROWS) == 28
    for run, (name, _, gpus, cp, tp, ep, pp, etp, _, seq, batch) in zip(suite.runs, ROWS):
        dims = ParallelDims.from_run(run)
        assert run.workload == name and run.world_size == gpus and run.model.seq_len == seq
        assert (dims.tp, dims.cp, dims.ep, dims.pp, dims.etp) == (tp, cp, ep, pp, etp), name
        assert dims.dp == gpus // (tp * pp) and dims.edp == gpus // (pp * ep * etp), name
        assert dims.dp * run.train.micro_batch == batch, name  # the paper's global batch, in sequences
        assert (dims.zero == 3) == ("fsdp" in name), name


def test_each_layout_goes_through_flops_memory_and_predict(suite):
    """Each at full dimensions: FLOPs per token are the model's whatever the layout (one model, many
    layouts); the prediction's model state is the memory table's record formula; a prediction is finite."""
    flops = {r["workload"]: r for r in flops_table(suite).doc["runs"]}
    memory = memory_table_for_suite(suite, torch.device("cpu")).doc["runs"]
    system = load_system("workloads/systems/h100-8x.toml")
    per_model: dict[tuple, set] = {}
    for run, record in zip(suite.runs, memory):
        f = flops[run.workload]
        per_model.setdefault((run.model.hidden, run.moe.experts, run.model.seq_len), set()).add(
            f["model_flops_per_token"])
        p = predict_run(run, system)
        assert p.memory.model_state_bytes == record["record_model_state"]["analytic"]["total"], run.workload
        assert math.isfinite(p.mfu) and 0 < p.mfu < 1 and p.step_s > 0, run.workload
    assert all(len(values) == 1 for values in per_model.values()), per_model
