"""`benchsuite predict` against this host's own measurements: one `benchsuite run` of a small CPU suite
(gloo, one thread per rank) at world 1 and 2 — pipeline 2 (1F1B), tensor 2 with sequence parallelism,
ZeRO-3 and expert 2 (the box has 2 cores, so world 2 only). The compute rate is calibrated from the
suite's world-1 run (`--calibrate`), the links are workloads/systems/cpu-gloo.toml's (measured by
benchmarks/bench_cpu_system.py, not fit to these runs).

    python benchmarks/bench_predict_cpu.py        # predicted against measured, the load average; exit 1 on a miss
    python benchmarks/bench_predict_cpu.py --moe  # the MoE suite only

Target (issue 34): each world-2 median step time, and the pipeline's bubble, within 25 % of its
prediction. MoE (issue 46, MOE_SUITE): switch, gshard, dropless top-2, expert choice and EP 2, calibrated
from the dense world-1 run, each step within 25 % of its prediction (its expert load the record's own), and
each measured dense ÷ MoE step ratio within 25 % of the predicted one. A timing, so a benchmark run on a
quiet box rather than a test: other processes on the two cores slow the measured runs and not the
prediction. tests/test_predict_cpu.py checks the byte counts of
the same runs, which do not depend on the load.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchsuite.config import RunConfig
from benchsuite.predict import load_system, predict_run
from benchsuite.predict.calibrate import calibrate
from benchsuite.predict.step import Prediction, record_expert_load
from benchsuite.results.store import Loaded, load_records

REPO = Path(__file__).resolve().parent.parent
CPU = REPO / "workloads" / "systems" / "cpu-gloo.toml"
HEADER = """
[defaults]
model = { layers = 4, hidden = 256, heads = 4, vocab = 512, seq_len = 128 }
train = { micro_batch = 8, steps = 10, warmup_steps = 2, timeout_s = 300 }

[[workload]]
name = "ref"
sweep = { world_size = [1] }
"""  # both suites: the model, the steps and the one-device reference
SUITE = """
[suite]
name = "predict-cpu"
""" + HEADER + """
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
MOE_SUITE = """
[suite]
name = "predict-cpu-moe"
""" + HEADER + """
[[workload]]
name = "switch"
kind = "moe"
moe = { experts = 4, router = "switch", capacity_factor = 1.25, every = 2 }
sweep = { world_size = [1] }

[[workload]]
name = "gshard"
kind = "moe"
moe = { experts = 4, router = "gshard", capacity_factor = 1.25, every = 2 }
sweep = { world_size = [1] }

[[workload]]
name = "dropless-top2"
kind = "moe"
moe = { experts = 4, router = "token_choice", top_k = 2, capacity_factor = 0, every = 2 }
sweep = { world_size = [1] }

[[workload]]
name = "expert-choice"
kind = "moe"
moe = { experts = 4, router = "expert_choice", capacity_factor = 2.0, every = 2 }
sweep = { world_size = [1] }

[[workload]]
name = "ep2"
kind = "moe"
moe = { experts = 4, router = "token_choice", top_k = 2, capacity_factor = 0, every = 2 }
parallel = { expert = 2 }
sweep = { world_size = [2] }

[[workload]]
name = "dense2"
sweep = { world_size = [2] }
"""
STEP_TOLERANCE = 0.25
# A rank's time in its own forward and backward chunks over the step (what the measured bubble divides by)
BUSY = ("compute.matmul", "compute.attention", "compute.recompute", "tensor_parallel", "expert_parallel")


def measure(folder: Path, text: str = SUITE) -> dict[str, Loaded]:
    """{workload: the record and its file} of one run of the suite `text`, one thread per rank."""
    suite = folder / "suite.toml"
    suite.write_text(text)
    done = subprocess.run([sys.executable, "-m", "benchsuite.cli", "run", str(suite), "--out", str(folder / "out")],
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"the suite's run failed:\n{done.stderr[-3000:]}")
    return {one.record.workload: one for one in load_records(folder / "out")}


def predictions(measured: dict) -> dict[str, Prediction]:
    """Each other run's prediction on cpu-gloo.toml, calibrated from the suite's world-1 dense record; an MoE
    run's expert load its record's own."""
    system = calibrate(load_system(CPU), measured["ref"].record, str(measured["ref"].path))
    return {name: predict_run(RunConfig.from_record(one.record.config), system,
                              expert_load=record_expert_load(one.record), expert_load_source=str(one.path))
            for name, one in measured.items() if name != "ref"}


def predicted_bubble(p: Prediction) -> float:
    """The pipeline's idle share as metrics.pipeline measures it: its bubble and point-to-point time over
    the rank's busy time."""
    return (p.seconds("pipeline_bubble") + p.seconds("pipeline_p2p")) / sum(p.seconds(c) for c in BUSY)


def compare(measured: dict) -> tuple[list[str], list[str]]:
    """(a line per figure, the lines of the figures more than STEP_TOLERANCE off)."""
    rows, misses = [], []
    for name, p in predictions(measured).items():
        m = measured[name].record.metrics
        figures = [("step", p.step_s, m.step_time_s.median, "s")]
        if name == "pp2":
            figures.append(("bubble", predicted_bubble(p), m.pipeline.bubble_measured, ""))
        for what, predicted, got, unit in figures:
            line = (f"{name:7s} {what:6s} predicted {predicted:.4f}{unit}, measured {got:.4f}{unit} "
                    f"({predicted / got - 1:+.1%})")
            rows.append(line)
            misses += [line] if abs(predicted / got - 1) > STEP_TOLERANCE else []
        rows += [f"          {c.name:18s} {c.seconds:.4f} s  {c.detail}" for c in p.components if c.seconds]
    return rows, misses


def moe_ratios(measured: dict) -> tuple[list[str], list[str]]:
    """Each MoE run's step ÷ its dense partner's (same world size, same tokens per step), measured against
    predicted; (a line per ratio, the lines more than STEP_TOLERANCE apart)."""
    predicted = {name: p.step_s for name, p in predictions(measured).items()} | {"ref": predict_ref(measured)}
    steps = {name: (predicted[name], one.record.metrics.step_time_s.median) for name, one in measured.items()}
    rows, misses = [], []
    for name in ("switch", "gshard", "dropless-top2", "expert-choice", "ep2"):
        dense = "dense2" if name == "ep2" else "ref"
        predicted = steps[name][0] / steps[dense][0]
        got = steps[name][1] / steps[dense][1]
        line = (f"{name:14s} MoE ÷ dense step: predicted {predicted:.3f}, measured {got:.3f} "
                f"({predicted / got - 1:+.1%})")
        rows.append(line)
        misses += [line] if abs(predicted / got - 1) > STEP_TOLERANCE else []
    return rows, misses


def predict_ref(measured: dict) -> float:
    """The calibration run's own prediction (its measured step, by construction of the calibration)."""
    system = calibrate(load_system(CPU), measured["ref"].record, str(measured["ref"].path))
    return predict_run(RunConfig.from_record(measured["ref"].record.config), system).step_s


def main() -> int:
    before = os.getloadavg()
    rows, misses = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for text in ([] if "--moe" in sys.argv else [SUITE]) + [MOE_SUITE]:
            folder = Path(tmp) / str(len(rows))
            folder.mkdir()
            measured = measure(folder, text)
            got, missed = compare(measured)
            rows += [f"calibrated from the world-1 run's {measured['ref'].record.metrics.step_time_s.median:.4f} s "
                     f"per step"] + got
            misses += missed
            if text is MOE_SUITE:
                got, missed = moe_ratios(measured)
                rows += got
                misses += missed
    after = os.getloadavg()
    print(f"load average before {before[0]:.2f} {before[1]:.2f} {before[2]:.2f}, after {after[0]:.2f}")
    print("\n".join(rows))
    if misses:
        print(f"{len(misses)} figure(s) more than {STEP_TOLERANCE:.0%} from the prediction: ABOVE TARGET")
        return 1
    print(f"every figure within {STEP_TOLERANCE:.0%} of its prediction")
    return 0


if __name__ == "__main__":
    sys.exit(main())
