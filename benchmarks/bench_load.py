"""Time of `benchsuite.load()` and `benchsuite report` over 150, 1,200 and 10,000 records, in two shapes:
distinct runs (four-point sweeps, bench_dashboard's synthetic records, five to a suite) and repeats of
one run (one run key, repeat 0 … N−1, as `run --repeat N` writes them, the shape that grew
quadratically before).

    python benchmarks/bench_load.py                       # 150, 1,200, 10,000; both shapes
    python benchmarks/bench_load.py --records 150 1500    # quicker

Target: each step of 10× the records (well, 8× from 150 to 1,200) takes at most 11× the time (a little
slack over linear for noise); the script prints each ratio beside its target and exits 1 above one.
Measured in one process, one after the other, so the ratios compare like with like; up to 2,000 records
each time is the best of three.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchsuite  # noqa: E402
from bench_dashboard import synthetic_records  # noqa: E402
from benchsuite import cli  # noqa: E402

TARGET_PER_10X = 11.0


def suites_of_runs(n: int) -> list[dict]:
    """n records of distinct runs: bench_dashboard's four-point sweeps, five sweeps to a suite (a suite holds
    a handful of workloads whatever the folder's size: the report's dense-vs-sparse pairs are per suite)."""
    records = synthetic_records(n, steps=50)
    for i, rec in enumerate(records):
        suite = f"bench-{i // 20}"
        rec["suite"] = rec["config"]["suite"] = suite
        rec["config"]["sweep_id"] = f"{suite}/{rec['workload']}/{rec['config']['scaling']}"
    return records


def repeats_of_one_run(n: int) -> list[dict]:
    """n repeats of one run: one run key, repeat 0 … n−1, each with its own start and step times."""
    (template,) = synthetic_records(1, steps=50)
    records = []
    for i in range(n):
        rec = copy.deepcopy(template)
        rec["repeat"] = i
        rec["started_at"] = f"2026-11-{1 + i // 1440 % 28:02d}T{i // 60 % 24:02d}:{i % 60:02d}:00+00:00"
        rec["steps"] = [dict(s, time_s=s["time_s"] * (1 + 0.001 * (i % 17))) for s in rec["steps"]]
        records.append(rec)
    return records


def write(records: list[dict], folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for i, rec in enumerate(records):
        (folder / f"r{i:06d}.json").write_text(json.dumps(rec, allow_nan=False))


def timed(fn, rounds: int) -> float:
    """The best of `rounds` timings (the small folders take a second or two: one round is all noise)."""
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("error")  # every record must load: a skipped one would flatter the time
            fn()
        best = min(best, time.perf_counter() - t0)
    return best


def measure(shape: str, n: int, work: Path) -> dict:
    folder = work / f"{shape}{n}"
    write(repeats_of_one_run(n) if shape == "repeats" else suites_of_runs(n), folder)
    rows = len(benchsuite.load(folder))
    assert rows == n, (rows, n)
    os.environ.setdefault("COLUMNS", "200")
    rounds = 3 if n <= 2000 else 1
    return {"records": n, "load_s": timed(lambda: benchsuite.load(folder), rounds),
            "report_s": timed(lambda: cli.main(["report", str(folder), "--json"]), rounds)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--records", type=int, nargs="+", default=[150, 1200, 10000])
    p.add_argument("--shapes", nargs="+", default=["runs", "repeats"], choices=["runs", "repeats"])
    args = p.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f} (1 min) at the start")
    failures = []
    for shape in args.shapes:
        results = []
        with tempfile.TemporaryDirectory() as tmp:
            for n in sorted(args.records):
                results.append(measure(shape, n, Path(tmp)))
                r = results[-1]
                print(f"{shape:>8} {n:>6} records: load() {r['load_s']:7.2f} s   report {r['report_s']:7.2f} s",
                      flush=True)
        for small, large in zip(results, results[1:]):
            scale = large["records"] / small["records"]
            allowed = TARGET_PER_10X * scale / 10
            for what in ("load_s", "report_s"):
                ratio = large[what] / small[what]
                verdict = "ok" if ratio <= allowed else "FAIL"
                print(f"{shape:>8} {what[:-2]:>6}: {ratio:5.2f}× the time for {scale:.1f}× the records "
                      f"(target ≤ {allowed:.1f}×) {verdict}")
                if ratio > allowed:
                    failures.append(f"{shape} {what}: {ratio:.2f} > {allowed:.1f}")
    print(f"load average {os.getloadavg()[0]:.2f} (1 min) at the end")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
