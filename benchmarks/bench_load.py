"""Time of reading a results folder, each beside a plain standard-library parse of the same files (the floor
a reader of JSON files cannot beat by much): `benchsuite.load()` cold (no index: every file decoded, the
folder's index written) and warm (the index present: no file decoded), the records alone as the index gives
them (load_records), a filtered load() (one suite), and `benchsuite report` warm; over 1,000 and 10,000
records, in two shapes: distinct runs (four-point sweeps, bench_dashboard's synthetic records, five to a
suite) and repeats of one run (one run key, repeat 0 … N−1, as `run --repeat N` writes them).

    python benchmarks/bench_load.py                               # 1,000 and 10,000; both shapes (minutes)
    python benchmarks/bench_load.py --records 1000 10000 100000   # growth up to 100,000 (about an hour)
    python benchmarks/bench_load.py --records 1000 --shapes runs  # quick

Targets, at the largest size: warm load() no slower than the standard-library parse, report within 2× of it
(and, on this reference box, load() ≤ 1 s warm and ≤ 5 s cold, report ≤ 3 s at 10,000 records); each step of
10× the records takes at most 11× the time (a little slack over linear for noise). The script prints each
figure beside its target and exits 1 when one is missed. Measured in one process, one after the other, so
the ratios compare like with like; up to 2,000 records each time is the best of three.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import os
import resource
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchsuite  # noqa: E402
from bench_dashboard import synthetic_records  # noqa: E402
from benchsuite import cli  # noqa: E402
from benchsuite.results import index  # noqa: E402
from benchsuite.results.store import load_records  # noqa: E402

TARGET_PER_10X = 11.0
WARM_LOAD_VS_PARSE = 1.0  # warm load() / the standard-library parse of the same files
REPORT_VS_PARSE = 2.0
AT_10K = {"load_warm_s": 1.0, "load_cold_s": 5.0, "report_s": 3.0}  # seconds at 10,000 records, this box
FIGURES = ("parse_s", "load_cold_s", "load_warm_s", "records_warm_s", "load_suite_s", "report_s")


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
    time.sleep(index.RACY_NS / 1e9)  # files written this last second are trusted by the index only after it


def parse_with_the_standard_library(folder: Path) -> list:
    """What any reader of the folder must do at least: read and parse each file (json, no types, no checks)."""
    return [json.loads(p.read_bytes()) for p in sorted(folder.glob("*.json"))]


def timed(fn, rounds: int, before=lambda: None) -> float:
    """The best of `rounds` timings of fn (`before` runs untimed ahead of each)."""
    best = float("inf")
    for _ in range(rounds):
        before()
        t0 = time.perf_counter()
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("error")  # every record must load: a skipped one would flatter the time
            fn()
        best = min(best, time.perf_counter() - t0)
    return best


def measure(shape: str, n: int, work: Path) -> dict:
    folder = work / f"{shape}{n}"
    records = repeats_of_one_run(n) if shape == "repeats" else suites_of_runs(n)
    suite = records[0]["suite"]
    write(records, folder)
    del records
    os.environ.setdefault("COLUMNS", "200")
    rounds = 3 if n <= 2000 else 1
    no_index = lambda: shutil.rmtree(folder / index.INDEX_DIR, ignore_errors=True)  # noqa: E731
    figures = {"records": n, "parse_s": timed(lambda: parse_with_the_standard_library(folder), rounds),
               "load_cold_s": timed(lambda: benchsuite.load(folder), rounds, before=no_index)}
    rows = len(benchsuite.load(folder))  # the index complete, and every record read
    assert rows == n, (rows, n)
    figures |= {"load_warm_s": timed(lambda: benchsuite.load(folder), rounds),
                "records_warm_s": timed(lambda: load_records(folder), rounds),
                "load_suite_s": timed(lambda: benchsuite.load(folder, suite=suite), rounds),
                "report_s": timed(lambda: cli.main(["report", str(folder)]), rounds)}
    shutil.rmtree(folder)
    return figures


def verdict(ok: bool, failures: list[str], what: str) -> str:
    if not ok:
        failures.append(what)
    return "ok" if ok else "FAIL"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--records", type=int, nargs="+", default=[1000, 10000])
    p.add_argument("--shapes", nargs="+", default=["runs", "repeats"], choices=["runs", "repeats"])
    args = p.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f} (1 min) at the start; {os.cpu_count()} CPUs", flush=True)
    failures: list[str] = []
    for shape in args.shapes:
        results = []
        with tempfile.TemporaryDirectory() as tmp:
            for n in sorted(args.records):
                results.append(r := measure(shape, n, Path(tmp)))
                print(f"{shape:>8} {n:>7} records: stdlib parse {r['parse_s']:6.2f} s | load() cold "
                      f"{r['load_cold_s']:6.2f} s, warm {r['load_warm_s']:6.2f} s (records alone "
                      f"{r['records_warm_s']:5.2f} s, one suite {r['load_suite_s']:5.2f} s) | report warm "
                      f"{r['report_s']:6.2f} s", flush=True)
        largest = results[-1]
        parse = largest["parse_s"]
        for what, target in (("load_warm_s", WARM_LOAD_VS_PARSE), ("report_s", REPORT_VS_PARSE),
                             ("load_cold_s", None), ("records_warm_s", None)):
            ratio = largest[what] / parse
            shown = f"(target ≤ {target:.1f}×) " + verdict(ratio <= target, failures, f"{shape} {what} vs parse")\
                if target else "(no target)"
            print(f"{shape:>8} {what[:-2]:>12} at {largest['records']:,}: {ratio:5.2f}× the stdlib parse {shown}")
        if largest["records"] == 10_000:
            for what, limit in AT_10K.items():
                print(f"{shape:>8} {what[:-2]:>12} at 10,000: {largest[what]:6.2f} s (target ≤ {limit:.0f} s on "
                      f"this box) " + verdict(largest[what] <= limit, failures, f"{shape} {what} ≤ {limit} s"))
        for small, large in zip(results, results[1:]):
            scale = large["records"] / small["records"]
            allowed = TARGET_PER_10X * scale / 10
            for what in FIGURES[1:]:
                ratio = large[what] / small[what]
                print(f"{shape:>8} {what[:-2]:>12}: {ratio:5.2f}× the time for {scale:.0f}× the records "
                      f"(target ≤ {allowed:.1f}×) " + verdict(ratio <= allowed, failures, f"{shape} {what} growth"))
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak resident memory {peak_mb:,.0f} MB (target ≤ 2,048 MB) "
          + verdict(peak_mb <= 2048, failures, "memory"))
    print(f"load average {os.getloadavg()[0]:.2f} (1 min) at the end")
    if failures:
        print("missed: " + "; ".join(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
