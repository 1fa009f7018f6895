"""One assembler for the record: a harness run's records and a measured loop's, built through the real
code paths in this process, hold the same deterministic fields as the fixture (tests/fixtures/assembly.json),
and the file written is the record as sorted, indented JSON."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import benchsuite
from benchsuite import dist as bdist
from benchsuite import worker
from benchsuite.assembly import RankResult, RunFacts, Stamp, harness_record, user_record
from benchsuite.config import parse_suite
from benchsuite.data import write_bin
from benchsuite.measuring import shares_a_gpu
from benchsuite.record import to_dict, write_record

from helpers.user_loop import MICRO_BATCH, MODEL, ClockedGpu, synthetic_meters, train

GOLDEN = Path(__file__).parent / "fixtures" / "assembly.json"
TINY = {"layers": 1, "hidden": 16, "heads": 2, "vocab": 260, "seq_len": 16}
HARNESS = {  # one run each: a dense model evaluated towards a target loss, and a token-choice MoE
    "dense-eval": {"kind": "dense", "train": {"eval_every": 2, "target_loss": 4.5}},
    "moe": {"kind": "moe", "moe": {"experts": 4, "router": "gshard", "every": 1}, "train": {}},
}
VARIES = "<varies>"
READINGS = ("energy", "carbon", "metrics.energy")  # every number in them is a reading, or made from one
TIMED = {"started_at", "duration_s", "time_s", "step_time_s", "tokens_per_s", "tokens_per_s_per_device",
         "tflops_per_device",
         "hardware_tflops_per_device", "mfu", "hfu", "matmul_ceiling_tflops", "mfu_vs_ceiling", "mfu_vs_ceiling_reason",
         "seconds", "eval_seconds", "energy_j", "eval_energy_j", "co2e_g", "energy_bound", "step_time_median_s",
         "straggler_ratio", "peak_allocated_bytes", "peak_reserved_bytes", "per_rank"}
HOST = {"host", "corpus", "run_key"}  # a host's name, a temporary folder, a run key from the host's hardware
ENV_KEPT = {"world_size", "nodes", "backend", "threads_per_rank"}
NUMBER = re.compile(r"\d+(\.\d+)?(e-?\d+)?")


@pytest.fixture(autouse=True)
def one_rank_one_thread(monkeypatch):
    """A world of one on one thread, every monitor on the synthetic meters (the same sources on every
    machine); a CPU has no datasheet peak, said once here."""
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")
    synthetic_meters(monkeypatch)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="no peak FLOP/s")
        yield
    torch.set_num_threads(threads)


def run_record(name: str, tokens: Path) -> dict:
    """The worker's record of one tiny run on a token file, as its file holds it (every declared field)."""
    spec = HARNESS[name]
    doc = {"suite": {"name": "golden"},
           "defaults": {"model": TINY, "energy": {"min_window_s": 0},
                        "train": {"micro_batch": 2, "steps": 5, "warmup_steps": 2, "precision": "fp32", "lr": 1e-2,
                                  "seed": 3, "data": str(tokens), **spec["train"]}},
           "workload": [{"name": name, **{k: v for k, v in spec.items() if k != "train"}}]}
    run = parse_suite(doc).runs[0]
    mine, facts = worker.run_rank(run, bdist.init_distributed(run), 1.0)  # --peak-tflops 1: no CPU's name
    return to_dict(harness_record(run, facts, [mine], Stamp(f"key-{name}", 2, "2026-12-02T00:00:00+00:00", 1.0)))


def loop_record(out: Path) -> dict:
    """measure() around the plain loop, told its FLOPs and tokens, with an evaluation outside training."""
    with benchsuite.measure("loop", out=out, flops_per_token=1e6, tokens_per_step=MICRO_BATCH * MODEL.seq_len,
                            warmup_steps=1, peak_tflops=1.0, description="plain loop, ünïcode",
                            carbon={"country": "FRA", "pue": 1.2}, energy={"min_window_s": 0}) as m:
        train(m, 5, eval_every=2)
    return to_dict(m.record)


def bare_record(out: Path) -> dict:
    """measure() told nothing, over two ranks' figures sharing one GPU (built here, as rank 0 gathers them)."""
    with benchsuite.measure("bare", out=out) as m:
        m.step()
        m.step(tokens=7)
    device = {"host": "h", "type": "cuda", "name": "synthetic GPU", "uuid": ClockedGpu.uuid, "index": 0,
              "cpu_threads": 1}
    memory = {"peak_allocated_bytes": 1, "peak_reserved_bytes": 2, "source": "torch.cuda"}
    ranks = [RankResult(rank, 0, device, [0.01, 0.02 + rank], [2.5, None], memory, {**m._segments[0], "rank": rank},
                        tokens=[None, 7]) for rank in (0, 1)]
    facts = RunFacts(2, "fp32", None, "none", "gloo", shares_a_gpu(ranks))
    return to_dict(user_record(m.loop, facts, ranks, started_at=m.started_at, duration_s=1.0))


def deterministic(rec: dict) -> dict:
    """What a record holds on every machine and every run: timings, timestamps, energy readings, memory
    peaks and host details are "<varies>" (a null stays null, a reading in a text is "#"), every other float
    rounded to 6 digits (the last bits of a loss are the CPU's)."""
    env = rec["env"]
    kept = {**{k: env[k] for k in ENV_KEPT},
            "devices": [{k: d[k] for k in ("rank", "node_rank", "type")} for d in env["devices"]]}
    return masked({**rec, "env": kept}, "")


def masked(value, path: str):
    """The value at a dotted path as deterministic() compares it."""
    key = path.rsplit(".", 1)[-1]
    if value is None:
        return None
    if key in TIMED or key in HOST or (key == "data" and isinstance(value, str)):
        return VARIES
    if isinstance(value, dict):
        return {k: masked(v, f"{path}.{k}".lstrip(".")) for k, v in value.items()}
    if isinstance(value, list):
        return [masked(v, path) for v in value]
    reading = path.startswith(READINGS)
    if isinstance(value, str):
        return NUMBER.sub("#", value) if reading else value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return value
    if reading:
        return VARIES
    return value if isinstance(value, int) else float(f"{value:.6g}")


def records(tmp_path: Path) -> dict[str, dict]:
    tokens = write_bin(tmp_path / "tokens.bin", np.tile(np.arange(20), 500))  # a pattern a tiny model learns
    return {**{f"harness/{name}": run_record(name, tokens) for name in HARNESS},
            "user/loop": loop_record(tmp_path / "loop"), "user/bare": bare_record(tmp_path / "bare")}


@pytest.mark.skipif(torch.cuda.is_available(), reason="the fixture holds CPU records")
def test_the_records_of_both_paths_hold_the_fixtures_deterministic_fields_and_are_written_as_sorted_json(tmp_path):
    golden = json.loads(GOLDEN.read_text())
    built = records(tmp_path)
    got = {name: deterministic(rec) for name, rec in built.items()}
    assert set(got) == set(golden)
    for name in golden:
        for section in golden[name]:
            assert got[name][section] == golden[name][section], (name, section)
    loop = built["user/loop"]
    data = write_record(tmp_path / "out", loop).read_bytes()
    assert data == json.dumps(loop, indent=1, sort_keys=True, ensure_ascii=False).encode("utf-8")
    assert "ünïcode".encode() in data
