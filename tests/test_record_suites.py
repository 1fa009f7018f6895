"""Every kind of record the shipped suites write, written for real and checked against the shipped JSON
Schema: the first run of each shape found in workloads/*.toml (dense, each router, dropless and shared
experts, tensor, pipeline, expert parallel, each ZeRO stage kind, evaluation), at a tiny size, through
`benchsuite run`. The worker builds its record through the types (a key they do not declare fails the
run), so this is also the test that the worker writes nothing the types leave out."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from benchsuite.config import RunConfig, load_suite
from benchsuite.record.schema import SHIPPED
from helpers import REPO, run_cli, write_suite

WORKLOADS = REPO / "workloads"
TINY_MODEL = 'model = { layers = 4, hidden = 32, heads = 2, vocab = 300, seq_len = 16 }'


def _shape(run: RunConfig) -> tuple:
    m, p = run.moe, run.parallel  # under expert parallelism the routers' records differ by dropless alone
    return (run.kind, m and (m.router if p.expert == 1 else "any"), m and m.capacity_factor == 0,
            bool(m and m.shared_experts),
            p.tensor > 1, 3 if p.zero == 3 else min(p.zero, 1), p.expert > 1, p.pipeline > 1)  # ZeRO: DDP, 1-2, 3


def shipped_shapes() -> dict[tuple, RunConfig]:
    """The first run of each shape, preferring one that evaluates (its record has metrics.quality)."""
    shapes: dict[tuple, RunConfig] = {}
    for path in sorted(WORKLOADS.glob("*.toml")):
        for run in load_suite(path).runs:
            key = _shape(run)
            if key not in shapes or (run.train.eval_every and not shapes[key].train.eval_every):
                shapes[key] = run
    return shapes


def _toml_value(v) -> str:
    return json.dumps(v) if isinstance(v, str) else str(v).lower() if isinstance(v, bool) else repr(v)


def _table(d: dict) -> str:
    return "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in d.items()) + " }"


def workload(i: int, run: RunConfig) -> str:
    """The run at a tiny size with the keys that make its shape."""
    p, m = run.parallel, run.moe
    parallel = {"tensor": p.tensor, "zero": p.zero, "expert": p.expert, "pipeline": p.pipeline}
    if p.pipeline > 1:
        parallel.update(schedule=p.schedule, virtual_stages=p.virtual_stages, microbatches=2)
    world = max(p.tensor * p.pipeline, p.expert, 2 if p.zero else 1)
    train = {"micro_batch": 4, "steps": 3, "warmup_steps": 2, "timeout_s": 300,
             "data": "builtin" if run.train.data == "builtin" else "synthetic", "recompute": run.train.recompute}
    if run.train.eval_every:
        train.update(eval_every=2, target_loss=9.0)
    lines = ["[[workload]]", f'name = "w{i}-{run.workload}"', f'kind = "{run.kind}"', f"parallel = {_table(parallel)}",
             f"train = {_table(train)}", f"sweep = {{ world_size = [{world}] }}"]
    if m is not None:
        moe = {"experts": min(m.experts, 8), "router": m.router, "capacity_factor": m.capacity_factor,
               "every": m.every}
        if m.router == "token_choice":
            moe.update(top_k=min(m.top_k, 2), score=m.score)
        if m.shared_experts:
            moe.update(shared_experts=m.shared_experts, expert_hidden=16)
        lines.append(f"moe = {_table(moe)}")
    return "\n".join(lines)


def test_the_shapes_cover_every_family_and_layout():
    shapes = shipped_shapes()
    routers = {k[1] for k in shapes if k[1]}
    assert routers == {"switch", "gshard", "expert_choice", "token_choice", "any"}
    assert {k[4] for k in shapes} == {True, False} and {k[5] for k in shapes} == {0, 1, 3}
    assert any(k[6] for k in shapes) and any(k[7] for k in shapes) and any(k[3] for k in shapes)
    assert any(r.train.eval_every for r in shapes.values())


@pytest.mark.procs
def test_every_record_shape_of_the_shipped_suites_validates_against_the_shipped_schema(tmp_path):
    shapes = shipped_shapes()
    text = "\n\n".join(["[suite]", 'name = "shapes"', "[defaults]", TINY_MODEL]
                       + [workload(i, run) for i, run in enumerate(shapes.values())])
    suite = write_suite(tmp_path / "shapes.toml", text.replace("[suite]\n\n", "[suite]\n").replace(
        "[defaults]\n\n", "[defaults]\n"))
    res = run_cli("run", str(suite), "--out", str(tmp_path / "out"), "--json", timeout=900)
    doc = json.loads(res.stdout)
    assert [r["status"] for r in doc["runs"]] == ["ok"] * len(shapes), (res.stderr[-3000:], doc["runs"])
    validator = jsonschema.Draft202012Validator(json.loads(SHIPPED.read_text()))
    records = [json.loads(Path(r["record"]).read_text()) for r in doc["runs"]]
    for rec in records:
        errors = list(validator.iter_errors(rec))
        assert not errors, (rec["workload"], errors[0].message[:300], list(errors[0].absolute_path))
    assert any(rec["metrics"]["quality"] for rec in records) and any(rec["metrics"]["pipeline"] for rec in records)
    assert any(rec["metrics"]["moe"] and rec["config"]["parallel"]["expert"] > 1 for rec in records)
