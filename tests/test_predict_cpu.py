"""`benchsuite predict` against this host's own measurements: one `benchsuite run` of a small CPU suite
(gloo, one thread per rank) at world 1 and 2 — pipeline 2 (1F1B), tensor 2 with sequence parallelism,
ZeRO-3 and expert 2. The box has 2 cores, so world 2 only. The compute rate is calibrated from the
suite's world-1 run (`--calibrate`), the links are workloads/systems/cpu-gloo.toml's (measured by
benchmarks/bench_cpu_system.py). Checked per world-2 run: the median step time within 25 %, and each
component against the record's own measurement: the collective bytes the run counted (metrics.comm), the
pipeline's point-to-point bytes and its bubble (metrics.pipeline).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchsuite.config import RunConfig
from benchsuite.predict import load_system, predict_run
from benchsuite.predict.calibrate import calibrate

CPU = "workloads/systems/cpu-gloo.toml"
SUITE = """
[suite]
name = "predict-cpu"

[defaults]
model = { layers = 4, hidden = 256, heads = 4, vocab = 512, seq_len = 128 }
train = { micro_batch = 8, steps = 10, warmup_steps = 2, timeout_s = 300 }

[[workload]]
name = "ref"
sweep = { world_size = [1] }

[[workload]]
name = "pp2"
parallel = { pipeline = 2, schedule = "1f1b", microbatches = 4 }
sweep = { world_size = [2] }

[[workload]]
name = "tp2-sp"
parallel = { tensor = 2, sequence_parallel = true }
sweep = { world_size = [2] }

[[workload]]
name = "zero3"
parallel = { zero = 3 }
sweep = { world_size = [2] }

[[workload]]
name = "ep2"
kind = "moe"
moe = { experts = 4, router = "switch", capacity_factor = 1.25, every = 2 }
parallel = { expert = 2 }
sweep = { world_size = [2] }
"""
STEP_TOLERANCE = 0.25
# Collectives the model leaves out, a few bytes each: the pipeline's loss all-reduce (4 B) and DDP's
# broadcast of the MoE router's buffers (76 B).
UNMODELLED_BYTES = 100
COMPUTE = ("compute.matmul", "compute.attention", "compute.recompute", "tensor_parallel", "expert_parallel")


def run_config(rec: dict) -> RunConfig:
    return RunConfig.from_dict({k: ({f: v for f, v in sec.items() if v is not None} if isinstance(sec, dict) else sec)
                                for k, sec in rec["config"].items()})


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> dict:
    """{workload: (record path, record)} of one run of the suite, one thread per rank."""
    folder = tmp_path_factory.mktemp("predict-cpu")
    suite = folder / "suite.toml"
    suite.write_text(SUITE)
    done = subprocess.run([sys.executable, "-m", "benchsuite.cli", "run", str(suite), "--out", str(folder / "out")],
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    records = {}
    for path in (folder / "out").glob("*.json"):
        rec = json.loads(path.read_text())
        records[rec["workload"]] = (path, rec)
    return records


def predictions(measured: dict) -> dict:
    system = calibrate(load_system(CPU), measured["ref"][0])
    return {name: predict_run(run_config(rec), system) for name, (_, rec) in measured.items() if name != "ref"}


@pytest.mark.procs
@pytest.mark.xfail(strict=False, reason="acceptance not met yet (issue 34): at load ~2 on 2 shared cores the "
                   "world-2 runs measured 19-47 % above prediction (pp2 -19 %, ep2 -37 %, zero3 -35 %, tp2-sp -47 %; "
                   "bubble 0.356 vs 0.267): a rank computes slower beside a second rank than the world-1 "
                   "calibration alone, and DTensor/FSDP2's host time per collective is not modelled. The byte "
                   "checks pass")
def test_predicted_step_time_and_components_match_the_measured_runs(measured):
    load = os.getloadavg()
    rows, misses = [], []
    for name, p in predictions(measured).items():
        rec = measured[name][1]
        step = rec["metrics"]["step_time_s"]["median"]
        line = f"{name}: predicted {p.step_s:.4f} s, measured {step:.4f} s ({p.step_s / step - 1:+.1%})"
        rows.append(line)
        by_kind = rec["metrics"]["comm"]["bytes_per_step_by_kind"] or {}
        m = p.workload.microbatches
        predicted = {"pp2": 0.0, "tp2-sp": p.tp_bytes_per_microbatch * m, "zero3": p.dp_bytes_per_step,
                     "ep2": p.dp_bytes_per_step + p.ep_bytes_per_microbatch * m}[name]
        assert abs(sum(by_kind.values()) - predicted) <= UNMODELLED_BYTES, f"{name}: {by_kind} vs {predicted}"
        if name == "ep2":
            assert by_kind["all_to_all"] == pytest.approx(p.ep_bytes_per_microbatch * m, rel=1e-12)
        if name == "pp2":
            pipe = rec["metrics"]["pipeline"]
            assert pipe["p2p_bytes_per_step"] == p.p2p_bytes_per_step
            busy = sum(p.seconds(c) for c in COMPUTE)  # a rank's time in its chunks over the step
            bubble = (p.seconds("pipeline_bubble") + p.seconds("pipeline_p2p")) / busy
            rows.append(f"  bubble predicted {bubble:.3f} (formula {p.bubble_fraction:.3f}), "
                        f"measured {pipe['bubble_measured']:.3f}")
            misses += [rows[-1]] if abs(pipe["bubble_measured"] / bubble - 1) > STEP_TOLERANCE else []
        misses += [line] if abs(p.step_s / step - 1) > STEP_TOLERANCE else []
    print(f"\nload average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}\n" + "\n".join(rows))
    assert not misses, f"load average {load[0]:.2f}: " + "; ".join(misses)


@pytest.mark.procs
def test_sequence_parallel_record_expects_the_bytes_it_counted(measured):
    """metrics.comm of the measured tensor 2 + sequence parallel run: the expected volume (paper_bytes, now
    the all-gather / reduce-scatter form) is the counted one, byte for byte."""
    comm = measured["tp2-sp"][1]["metrics"]["comm"]
    assert set(comm["bytes_per_step_by_kind"]) == {"all_gather", "reduce_scatter", "all_reduce"}
    assert comm["paper_bytes_per_step"] == comm["total_bytes_per_step"]
    assert "all-gather" in comm["paper_formula"] and "reduce-scatter" in comm["paper_formula"]
