"""`benchsuite predict` against this host's own measurements, in bytes: the small CPU suite of
benchmarks/bench_predict_cpu.py (world 1, and world 2 — pipeline 2 with 1F1B, tensor 2 with sequence
parallelism, ZeRO-3, expert 2), calibrated from its world-1 run. Each predicted component's bytes against
the record's own count; the step times, which depend on the box's load, are the benchmark's.
"""

from __future__ import annotations

import pytest

from benchmarks.bench_predict_cpu import SUITE, measure, predicted_bubble, predictions

# Collectives the model leaves out, a few bytes each: the pipeline's loss all-reduce (4 B) and DDP's
# broadcast of the MoE router's buffers (76 B).
UNMODELLED_BYTES = 100


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> dict:
    """{workload: the record and its file} of one run of the suite, one thread per rank: one measured step after
    the two instrumented ones (step 1 counts the collectives' bytes, all these tests read)."""
    short = SUITE.replace("steps = 10, warmup_steps = 2", "steps = 3, warmup_steps = 2")
    assert short != SUITE
    return measure(tmp_path_factory.mktemp("predict-cpu"), short)


@pytest.mark.procs
def test_each_predicted_component_sends_the_bytes_the_measured_run_counted(measured):
    """Per world-2 run: the collectives' bytes by the prediction's components against the record's own
    count (metrics.comm), the all-to-all exactly, and the pipeline's point-to-point bytes
    (metrics.pipeline). The step times and the bubble are compared by benchmarks/bench_predict_cpu.py."""
    for name, p in predictions(measured).items():
        by_kind = measured[name].record.metrics.comm.bytes_per_step_by_kind or {}
        m = p.workload.microbatches
        predicted = {"pp2": 0.0, "tp2-sp": p.tp_bytes_per_microbatch * m, "zero3": p.dp_bytes_per_step,
                     "ep2": p.dp_bytes_per_step + p.ep_bytes_per_microbatch * m}[name]
        assert abs(sum(by_kind.values()) - predicted) <= UNMODELLED_BYTES, f"{name}: {by_kind} vs {predicted}"
        if name == "ep2":
            assert by_kind["all_to_all"] == pytest.approx(p.ep_bytes_per_microbatch * m, rel=1e-12)
        if name == "pp2":
            pipe = measured[name].record.metrics.pipeline
            assert pipe.p2p_bytes_per_step == p.p2p_bytes_per_step
            comm = measured[name].record.metrics.comm  # the loss's all-reduce over the stages, expected
            assert comm.paper_bytes_per_step == comm.total_bytes_per_step == 4.0
            assert "loss" in comm.paper_formula
            assert 0 < predicted_bubble(p) < 1 and 0 < pipe.bubble_measured < 1


@pytest.mark.procs
def test_sequence_parallel_record_expects_the_bytes_it_counted(measured):
    """metrics.comm of the measured tensor 2 + sequence parallel run: the expected volume (paper_bytes, now
    the all-gather / reduce-scatter form) is the counted one, byte for byte."""
    comm = measured["tp2-sp"].record.metrics.comm
    assert set(comm.bytes_per_step_by_kind) == {"all_gather", "reduce_scatter", "all_reduce"}
    assert comm.paper_bytes_per_step == comm.total_bytes_per_step
    assert "all-gather" in comm.paper_formula and "reduce-scatter" in comm.paper_formula
