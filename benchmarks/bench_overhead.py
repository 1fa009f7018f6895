"""A run's fixed cost: the wall time of `benchsuite run` on a tiny one-run suite minus its measured
steps, in units of `python -c "import torch"` timed in the same script (so the ratio holds on a
slow or loaded box).

    python benchmarks/bench_overhead.py             # world 1 (the target), world 2, world 1 with compile
    python benchmarks/bench_overhead.py --rounds 3  # each figure the median of 3

Target: world 1 at most 2.5 torch imports (a run costs the launcher's start, torchrun's torch import,
the rank's torch import with the optimizer's torch._dynamo, the model, warm-up, the record); the script
prints each ratio and exits 1 above the target. World 2 (two ranks importing torch at once) and compile
(warm-up includes torch.compile) are reported beside it, without a target. Rounds alternate the
import timing and the runs, so drift in the box's load lands on both.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET = 2.5
SUITE = """
[suite]
name = "overhead"

[defaults]
model = {{ layers = 2, hidden = 32, heads = 2, vocab = 128, seq_len = 16 }}
train = {{ micro_batch = 2, steps = 4, warmup_steps = {warmup}, timeout_s = 600, compile = {compile} }}

[[workload]]
name = "dense"
kind = "dense"

[sweep]
world_size = [{world}]
"""
CASES = {"world 1": (1, False), "world 2": (2, False), "world 1, compile": (1, True)}


def wall_s(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        sys.exit(f"bench_overhead: {' '.join(cmd)} exited {done.returncode}:\n{done.stderr}")
    return time.perf_counter() - t0


def import_torch_s() -> float:
    return wall_s([sys.executable, "-c", "import torch"])


def fixed_cost_s(folder: Path, world: int, compile_: bool) -> tuple[float, float]:
    """(wall time of one `benchsuite run`, its measured steps' time from the record). With compile, the
    one more warm-up step a compiled run must have (benchsuite.config)."""
    suite = folder / f"w{world}-{compile_}.toml"
    suite.write_text(SUITE.format(world=world, compile=str(compile_).lower(), warmup=3 if compile_ else 2))
    out = Path(tempfile.mkdtemp(dir=folder))
    wall = wall_s([sys.executable, "-m", "benchsuite.cli", "run", str(suite), "--out", str(out)])
    (record,) = out.glob("*.json")
    steps = sum(s["time_s"] for s in json.loads(record.read_text())["steps"])
    return wall, steps


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=1, help="rounds; each figure is the median over them")
    args = p.parse_args()
    imports, costs = [], {case: [] for case in CASES}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.rounds):
            imports.append(import_torch_s())
            for case, (world, compile_) in CASES.items():
                costs[case].append(fixed_cost_s(Path(tmp), world, compile_))
                imports.append(import_torch_s())
    unit = statistics.median(imports)
    print(f"python -c 'import torch': {unit:.2f} s (median of {len(imports)})")
    failed = False
    for case, runs in costs.items():
        wall = statistics.median(w for w, _ in runs)
        steps = statistics.median(s for _, s in runs)
        ratio = (wall - steps) / unit
        target = f"target <= {TARGET}" if case == "world 1" else "no target"
        verdict = "" if case != "world 1" else ("  ok" if ratio <= TARGET else "  ABOVE TARGET")
        print(f"{case:17s} run {wall:6.2f} s, measured steps {steps:.3f} s, fixed cost {wall - steps:6.2f} s "
              f"= {ratio:.2f} torch imports ({target}){verdict}")
        failed |= case == "world 1" and ratio > TARGET
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
