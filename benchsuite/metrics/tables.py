"""The tables of `benchsuite flops` and `benchsuite memory`: each run's figures as one JSON document
and as the text lines the CLI prints (unescaped: the CLI passes every line through `printable`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from benchsuite.config import Suite
from benchsuite.layout import ParallelDims
from benchsuite.metrics import memory as mem
from benchsuite.metrics.flops import flops_per_token, hardware_basis, param_counts

FLOPS_HEADER = ("model FLOPs (MFU): no recompute, active experts; hardware FLOPs (HFU): what runs, recompute "
                "and every expert slot included (grouped_mm runs count only the filled slots)")
MEMORY_SOURCE = "Rajbhandari et al. 2019 (ZeRO), per-device model states; GB = 1e9 bytes"
INDENT = " " * 24  # the name column


@dataclass(frozen=True)
class Table:
    """A verb's figures: `doc` for --json, `lines` for the terminal."""

    doc: dict
    lines: list[str]


def _run_name(row: dict) -> str:
    """The workload, with its seed and a forced routing where they tell its runs apart."""
    return row["workload"] + (f" · {row['routing']}" if row["routing"] == "forced" else "") + f" · seed {row['seed']}"


def flops_table(suite: Suite) -> Table:
    """Parameters and model/hardware FLOPs per token of every run of `suite`."""
    rows = []
    for run in suite.runs:
        f = flops_per_token(run.model, run.moe, micro_batch=run.micro_batch_per_rank, recompute=run.train.recompute)
        rows.append({"workload": run.workload, "kind": run.kind, "preset": run.model.preset,
                     "router": run.moe.router if run.moe else None, "routing": run.moe.routing if run.moe else None,
                     "seed": run.train.seed,
                     "world_size": run.world_size, "scaling": run.scaling, "recompute": run.train.recompute,
                     "params": f.params, "params_active": f.params_active, "model_flops_per_token": f.model,
                     "hardware_flops_per_token": f.hardware, "hardware_source": hardware_basis(run.moe, recompute=run.train.recompute,
                                                                       expert_impl=None)})
    lines = [FLOPS_HEADER] + [
        f"{_run_name(r):<24} w{r['world_size']:<3} params {r['params']:10.4g}  "
        f"active {r['params_active']:10.4g}  model {r['model_flops_per_token']:10.4g} FLOP/tok  "
        f"hardware {r['hardware_flops_per_token']:10.4g} FLOP/tok" for r in rows]
    return Table({"suite": suite.name, "runs": rows}, lines)


def _constants_doc(consts: mem.StateConstants) -> dict:
    return {"constants": consts.name, "K": consts.k,
            "formulas": {mem.STAGE_LABELS[s]: mem.zero_formula(s, consts) for s in range(4)}}


def _memory_lines(name: str, consts: mem.StateConstants, psi: float, dp: int, stages: list[dict],
                  act: dict | None = None, record: dict | None = None) -> list[str]:
    """One block of the memory table: the constants, each stage's GB, and (for a run) its record's
    analytic figure and its activations."""
    cells = "  ".join(f"{r['name']} {r['total'] / 1e9:10.4g} GB" for r in stages)
    lines = [f"{name:<24} {consts.name}, K = {consts.k:g}", f"{INDENT} Ψ {psi:,.0f}  N {dp:<4} {cells}"]
    if record:
        lines.append(f"{INDENT} the record's analytic figure: {record['formula']} = "
                     f"{record['analytic']['total'] / 1e9:.4g} GB")
    if act:
        lines.append(f"{INDENT} activations per micro-batch (Korthikanti et al. 2022): "
                     f"{act['none'] / 1e9:.4g} GB none, {act['selective'] / 1e9:.4g} GB selective, "
                     f"{act['full'] / 1e9:.4g} GB full recompute")
    return lines


def memory_table_for_params(params: float, dp: int, precision: str | None) -> Table:
    """Model states per device of Ψ = `params` over `dp` ranks at each ZeRO stage; the paper's mixed
    precision unless `precision` is "fp32"."""
    consts = mem.FP32 if precision == "fp32" else mem.PAPER
    stages = mem.stage_table(params, dp, consts)
    doc = {"precision": precision or "mixed", "source": MEMORY_SOURCE, **_constants_doc(consts), "params": params,
           "dp": dp, "stages": stages}
    return Table(doc, ["model states per device (GB = 1e9 bytes)", *_memory_lines("--params", consts, params, dp,
                                                                                  stages)])


def memory_table_for_suite(suite: Suite, device: torch.device, precision: str | None = None,
                           params: float | None = None, dp: int | None = None) -> Table:
    """Each run's model states per device at each ZeRO stage, with the constants of its own precision
    (train.precision, "auto" resolved for `device`) unless `precision` ("mixed" or "fp32") is given;
    `params` and `dp` replace each run's own Ψ and data-parallel degree."""
    from benchsuite.device import resolve_precision

    doc = {"precision": precision, "source": MEMORY_SOURCE, "suite": suite.name, "device": device.type, "runs": []}
    title = "model states per device (GB = 1e9 bytes)" + (
        "" if precision else f"; each run's train.precision, \"auto\" as on this machine ({device.type})")
    lines = [title]
    for run in suite.runs:
        run_precision = {"mixed": "bf16", "fp32": "fp32"}.get(precision) or \
            resolve_precision(run.train.precision, device)
        consts = mem.constants_for(run_precision)
        psi = params or param_counts(run.model, run.moe).total
        run_dp = dp or run.data_parallel
        dims = ParallelDims.from_run(run)
        psi_rank = params or mem.rank_params(run.model, run.moe, dims)
        stages = mem.stage_table(psi_rank, run_dp, consts)
        act = mem.activation_estimates(run.model, micro_batch=run.micro_batch_per_rank,
                                         recompute=run.train.recompute, tp=run.parallel.tensor)
        fsdp_precision = "bf16" if run_precision == "bf16" and device.type == "cuda" else "fp32"  # parallel/zero.py
        record = mem.analytic_model_state(run.model, run.moe, dims, compute=run_precision,
                                          forward_params=fsdp_precision)
        doc["runs"].append({"workload": run.workload, "world_size": run.world_size, "tensor": run.parallel.tensor,
                            "zero": run.parallel.zero, "precision": run_precision, **_constants_doc(consts),
                            "params": psi, "params_per_rank": psi_rank, "dp": run_dp, "stages": stages,
                            "record_model_state": record, "activation_bytes_per_micro_batch": act})
        lines += _memory_lines(f"{run.workload} w{run.world_size}", consts, psi_rank, run_dp, stages, act, record)
    return Table(doc, lines)
