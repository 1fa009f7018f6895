"""`benchsuite predict` against measured runs, in bytes: the golden CPU suite's world-2 records
(tests/fixtures/golden/: ZeRO-3, Switch with expert 2, pipeline 2 with 1F1B, tensor 2 with sequence
parallelism), which tests/test_golden_records.py holds equal, collective bytes included, to what the code
writes today. Each predicted component's bytes against the record's own count; the step times, which depend
on the box's load, are benchmarks/bench_predict_cpu.py's.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchsuite.config import RunConfig
from benchsuite.predict import load_system, predict_run
from benchsuite.predict.calibrate import calibrate
from benchsuite.results.store import load_records
from benchmarks.bench_predict_cpu import CPU

GOLDEN = Path(__file__).parent / "fixtures" / "golden"
# Collectives the model leaves out, a few bytes each: the pipeline's loss all-reduce (4 B) and DDP's
# broadcast of the MoE router's buffers (42 B here).
UNMODELLED_BYTES = 100


@pytest.fixture(scope="module")
def measured() -> dict:
    """{name-wN: (the record, its prediction on cpu-gloo.toml calibrated from the world-1 record)} of the golden
    suite's world-2 runs."""
    loaded = load_records(GOLDEN)
    ref = next(one for one in loaded if one.record.config.world_size == 1)
    system = calibrate(load_system(CPU), ref.record, str(ref.path))
    return {f"{one.record.workload}-w{one.record.config.world_size}":
            (one.record, predict_run(RunConfig.from_record(one.record.config), system))
            for one in loaded if one.record.config.world_size == 2}


def test_each_predicted_component_sends_the_bytes_the_measured_run_counted(measured):
    """Per world-2 run: the collectives' bytes by the prediction's components against the record's own
    count (metrics.comm), the all-to-all exactly, and the pipeline's point-to-point bytes
    (metrics.pipeline). The step times and the bubble are compared by benchmarks/bench_predict_cpu.py."""
    assert sorted(measured) == ["dense-w2", "pipe-w2", "switch-w2", "tp-w2"]
    for name, (record, p) in measured.items():
        by_kind = record.metrics.comm.bytes_per_step_by_kind or {}
        m = p.workload.microbatches
        predicted = {"pipe-w2": 0.0, "tp-w2": p.tp_bytes_per_microbatch * m, "dense-w2": p.dp_bytes_per_step,
                     "switch-w2": p.dp_bytes_per_step + p.ep_bytes_per_microbatch * m}[name]
        assert abs(sum(by_kind.values()) - predicted) <= UNMODELLED_BYTES, f"{name}: {by_kind} vs {predicted}"
        if name == "switch-w2":
            assert by_kind["all_to_all"] == pytest.approx(p.ep_bytes_per_microbatch * m, rel=1e-12)
        if name == "pipe-w2":
            pipe = record.metrics.pipeline
            assert pipe.p2p_bytes_per_step == p.p2p_bytes_per_step
            comm = record.metrics.comm  # the loss's all-reduce over the stages, expected
            assert comm.paper_bytes_per_step == comm.total_bytes_per_step == 4.0
            assert "loss" in comm.paper_formula
            assert p.bubble_fraction == (2 - 1) / 2  # (p − 1) / m, 1F1B


def test_sequence_parallel_record_expects_the_bytes_it_counted(measured):
    """metrics.comm of the measured tensor 2 + sequence parallel run: the expected volume (paper_bytes, now
    the all-gather / reduce-scatter form) is the counted one, byte for byte."""
    comm = measured["tp-w2"][0].metrics.comm
    assert set(comm.bytes_per_step_by_kind) == {"all_gather", "reduce_scatter", "all_reduce"}
    assert comm.paper_bytes_per_step == comm.total_bytes_per_step
    assert "all-gather" in comm.paper_formula and "reduce-scatter" in comm.paper_formula
