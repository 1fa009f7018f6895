"""Every kind of record the shipped suites write, written for real and checked against the shipped JSON
Schema: the first run of each shape found in workloads/*.toml (dense, each router, dropless and shared
experts, tensor, pipeline, expert parallel, ZeRO, evaluation), at a tiny size; one-rank shapes measured
in this process, the others through `benchsuite run`. The writer passes every record through the types
(a key they do not declare fails the write), so this is also the test that the worker writes nothing the
types leave out."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from benchsuite.config import RunConfig, load_suite
from helpers import REPO, run_cli, write_suite
from helpers.records import schema_problems

pytest.importorskip("jsonschema")  # test-only (pyproject's [test]); absent on the GPU image

WORKLOADS = REPO / "workloads"
GOLDEN_SUITE = REPO / "tests" / "fixtures" / "golden" / "suite.toml"  # its records: test_golden_records
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


def _world(run: RunConfig) -> int:
    """The fewest ranks that keep the run's shape: its layout at one data-parallel rank, ZeRO over two."""
    p = run.parallel
    return max(p.tensor * p.pipeline, p.expert, 2 if p.zero else 1)


def workload(i: int, run: RunConfig) -> str:
    """The run at a tiny size with the keys that make its shape."""
    p, m = run.parallel, run.moe
    parallel = {"tensor": p.tensor, "zero": p.zero, "expert": p.expert, "pipeline": p.pipeline}
    if p.pipeline > 1:
        parallel.update(schedule=p.schedule, virtual_stages=p.virtual_stages, microbatches=2)
    world = _world(run)
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


def _validate(records: list[dict]) -> None:
    assert not schema_problems(records)


def _suite(tmp_path: Path, runs: list[RunConfig]) -> Path:
    text = "\n\n".join(['[suite]\nname = "shapes"', f"[defaults]\n{TINY_MODEL}"]
                       + [workload(i, run) for i, run in enumerate(runs)])
    return write_suite(tmp_path / "shapes.toml", text)


@pytest.mark.heavy  # in this process, seconds: the full pass runs it, the fast tier does not
def test_every_one_rank_record_shape_validates_against_the_shipped_schema(tmp_path, monkeypatch):
    """The one-rank shapes measured in this process by the worker's own functions, written by its writer."""
    from benchsuite import dist as bdist
    from benchsuite import worker
    from benchsuite.assembly import Stamp, harness_record
    from benchsuite.record import utc_now, write_record

    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")
    ones = [r for r in shipped_shapes().values() if _world(r) == 1]
    assert len(ones) >= 6
    records = []
    for run in load_suite(_suite(tmp_path, ones)).runs:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "no peak FLOP/s known" for a CPU
            mine, facts = worker.run_rank(run, bdist.init_distributed(run), None)
        rec = harness_record(run, facts, [mine], Stamp(run.workload, 0, utc_now(), 1.0))
        records.append(json.loads(write_record(tmp_path / "out", rec).read_text()))
    _validate(records)
    assert any(r["metrics"]["quality"] for r in records) and any(r["config"]["moe"] for r in records)


@pytest.mark.procs
def test_every_multi_rank_record_shape_validates_against_the_shipped_schema(tmp_path):
    """Tensor, pipeline, expert parallel and ZeRO across two ranks, through `benchsuite run` (torchrun): the
    shapes the golden suite does not write (tests/test_golden_records.py validates the records of those it
    does: one launch per shape is enough)."""
    golden = {_shape(r) for r in load_suite(GOLDEN_SUITE).runs}
    many = [r for key, r in shipped_shapes().items() if _world(r) > 1 and key not in golden]
    assert len(many) < len([r for r in shipped_shapes().values() if _world(r) > 1])
    res = run_cli("run", str(_suite(tmp_path, many)), "--out", str(tmp_path / "out"), "--json", timeout=600)
    doc = json.loads(res.stdout)
    assert [r["status"] for r in doc["runs"]] == ["ok"] * len(many), (res.stderr[-3000:], doc["runs"])
    records = [json.loads(Path(r["record"]).read_text()) for r in doc["runs"]]
    _validate(records)
