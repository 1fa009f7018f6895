"""Time of reading a results folder, each beside a plain standard-library parse of the same files (the floor
a reader of JSON files cannot beat by much): `benchsuite.load()` cold (no index: every file decoded, the
folder's index written) and warm (the index present: no file decoded), the records alone as the index gives
them (load_records), a filtered load() (one suite), and `benchsuite report` warm; over 1,000 and 10,000
records, in two shapes: distinct runs (four-point sweeps, bench_dashboard's synthetic records, five to a
suite) and repeats of one run (one run key, repeat 0 … N−1, as `run --repeat N` writes them).

    python benchmarks/bench_load.py                               # 1,000 and 10,000; both shapes (minutes)
    python benchmarks/bench_load.py --at-scale                    # and 100,000: growth and peak memory
    python benchmarks/bench_load.py --records 1000 --shapes runs  # quick
    python benchmarks/bench_load.py --report-only --records 10000 100000 --shapes runs  # report alone, each size

Targets: warm load() no slower than the standard-library parse that keeps its documents (a plain reader), report
within 2× of it, judged at the largest size that parse is measured at (10,000: 100,000 documents would hold ~8 GB),
and beside them each reader's time over the floor, a parse that keeps nothing (no target); on this reference box,
load() ≤ 1 s warm and ≤ 5 s cold, report ≤ 3 s at 10,000 records; each step of 10× the records takes at most 11× the
time of every reader (a little slack over linear for noise), and each reader's peak resident memory stays ≤ 2 GB
(and each decoding worker's); `report` over 5,000 dense and 5,000 MoE workloads in one suite takes at most 2× its
time over the same records in 1,000 suites (each MoE workload paired with the dense one of its backbone, found by
key). The script prints each figure beside its target and exits 1 when one is missed.
At each size the records are written and parsed in one process, then each reader runs in a process of its own
(the cold one first), as a command does (its time and peak memory its own, on a heap no other reader left: run one
after another in one process, they leave it some 10 % larger); each time is the best of ROUNDS (a single timing of
a 0.2 s reader moves by half on a shared box). The records are written 2,000 at a time (at 100,000, 1.7 GB of JSON
at once in the temporary folder); a first read's decoding workers (results/decoding.py) are measured apart (their
peak from /proc).
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
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchsuite  # noqa: E402
from bench_dashboard import synthetic_records  # noqa: E402
from benchsuite import cli  # noqa: E402
from benchsuite.results import decoding, index, rows  # noqa: E402
from benchsuite.results.store import load_records  # noqa: E402

TARGET_PER_10X = 11.0
WARM_LOAD_VS_PARSE = 1.0  # warm load() / the standard-library parse of the same files
REPORT_VS_PARSE = 2.0
PAIRS, ONE_SUITE_VS_SPREAD = 5000, 2.0  # report over 5,000 dense and 5,000 MoE workloads: one suite / 1,000 suites
AT_10K = {"load_warm_s": 1.0, "load_cold_s": 5.0, "report_s": 3.0}  # seconds at 10,000 records, this box
FIGURES = ("parse_s", "load_cold_s", "load_warm_s", "runs_warm_s", "steps_warm_s", "records_warm_s", "load_suite_s",
           "report_s")


KEPT_UP_TO = 10_000
CHUNK = 2000  # records generated and written at a time: 100,000 documents at once would hold gigabytes


def suites_of_runs(start: int, n: int) -> list[dict]:
    """Records start … start+n−1 of distinct runs: bench_dashboard's four-point sweeps, five sweeps to a suite (a
    suite holds a handful of workloads whatever the folder's size: the report's dense-vs-sparse pairs are per
    suite). start is a multiple of 20, so a chunk's sweeps and suites continue the previous chunk's."""
    records = synthetic_records(n, steps=50)
    for j, rec in enumerate(records):
        i = start + j
        suite = f"bench-{i // 20}"
        workload = f"{rec['workload'].rsplit('-', 1)[0]}-{i // 4}"  # (synthetic_records counts from 0)
        rec.update(suite=suite, workload=workload, run_key=f"{i:016x}")
        rec["config"].update(suite=suite, workload=workload, sweep_id=f"{suite}/{workload}/{rec['config']['scaling']}")
    return records


def repeats_of_one_run(start: int, n: int) -> list[dict]:
    """Repeats start … start+n−1 of one run: one run key, each with its own start and step times."""
    (template,) = synthetic_records(1, steps=50)
    records = []
    for i in range(start, start + n):
        rec = copy.deepcopy(template)
        rec["repeat"] = i
        rec["started_at"] = f"2026-11-{1 + i // 1440 % 28:02d}T{i // 60 % 24:02d}:{i % 60:02d}:00+00:00"
        rec["steps"] = [dict(s, time_s=s["time_s"] * (1 + 0.001 * (i % 17))) for s in rec["steps"]]
        records.append(rec)
    return records


def pairs_of_workloads(pairs: int, suites: int) -> list[dict]:
    """`pairs` dense workloads and as many MoE ones (Switch), one record each, in `suites` suites: MoE workload i
    has dense workload i's backbone (config.model: its layers and width), which no other workload has, and the
    two share a suite. One suite of 5,000 of each against the same records in 1,000 suites: the report's
    dense-vs-sparse pairs are found by key, so the one suite costs no more (the issue's n² case)."""
    base = synthetic_records(8, steps=50)
    dense, moe = base[0], base[4]  # (the first point of the first two sweeps: dense, Switch; one device)
    records = []
    for i in range(pairs):
        suite = f"bench-{i * suites // pairs}"
        for kind, template in (("dense", dense), ("switch", moe)):
            rec = copy.deepcopy(template)
            workload, j = f"{kind}-{i}", len(records)
            rec.update(suite=suite, workload=workload, run_key=f"{j:016x}")
            rec["config"].update(suite=suite, workload=workload, sweep_id=f"{suite}/{workload}/weak")
            rec["config"]["model"].update(layers=2 + i % 50, hidden=64 * (1 + i // 50))
            records.append(rec)
    return records


def measure_pairs(pairs: int, work: Path) -> dict:
    """`report` warm over `pairs` dense and MoE workloads in one suite and in pairs / 5 suites, each folder's
    index built first."""
    figures = {}
    for what, suites in (("one_suite_s", 1), ("spread_s", pairs // 5)):
        folder = work / what
        folder.mkdir()
        for rec in pairs_of_workloads(pairs, suites):
            (folder / f"{rec['run_key']}.json").write_text(json.dumps(rec, allow_nan=False))
        time.sleep(index.RACY_NS / 1e9)
        benchsuite.load(folder)
        figures[what] = timed(lambda: cli.main(["report", str(folder)]), 2)
        shutil.rmtree(folder)
    return figures


def write(shape: str, n: int, folder: Path) -> str:
    """n records of the shape written into folder, CHUNK at a time; the suite of the first."""
    folder.mkdir(parents=True, exist_ok=True)
    make = repeats_of_one_run if shape == "repeats" else suites_of_runs
    suite = None
    for start in range(0, n, CHUNK):
        for i, rec in enumerate(make(start, min(CHUNK, n - start)), start):
            (folder / f"r{i:06d}.json").write_text(json.dumps(rec, allow_nan=False))
            suite = suite or rec["suite"]
    time.sleep(index.RACY_NS / 1e9)  # files written this last second are trusted by the index only after it
    return suite


def parse_with_the_standard_library(folder: Path) -> int:
    """The floor of any reader of the folder: read and parse each file (json, no types, no checks), nothing
    kept."""
    return sum(len(json.loads(p.read_bytes())) for p in sorted(folder.glob("*.json")))


def parse_keeping_the_documents(folder: Path) -> list:
    """What a plain reader of the folder does: the parsed documents, kept (the targets' baseline: the issue's
    "standard-library parse"; keeping them, Python's cyclic collector scans the growing heap, some 2.5× the
    floor's time at 10,000 records). Measured up to KEPT_UP_TO records: 100,000 documents hold ~8 GB."""
    return [json.loads(p.read_bytes()) for p in sorted(folder.glob("*.json"))]


ROUNDS = 3  # timings of each reader at each size, the best kept


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


# The readers, each timed in a process of its own (reader_alone): what each runs over a folder and its suite; the
# first with no index before each round, the others over the index it wrote.
READERS = {"load_cold_s": lambda folder, suite: benchsuite.load(folder),
           "load_warm_s": lambda folder, suite: benchsuite.load(folder),
           "runs_warm_s": lambda folder, suite: benchsuite.load_runs(folder),
           "steps_warm_s": lambda folder, suite: benchsuite.load_steps(folder),
           "records_warm_s": lambda folder, suite: load_records(folder),
           "load_suite_s": lambda folder, suite: benchsuite.load(folder, suite=suite),
           "report_s": lambda folder, suite: cli.main(["report", str(folder)])}


def written(shape: str, n: int, work: Path) -> dict:
    """n records written and parsed by the standard library (a process of its own: --write-alone)."""
    folder = work / f"{shape}{n}"
    suite = write(shape, n, folder)
    return {"records": n, "suite": suite, "parse_s": timed(lambda: parse_with_the_standard_library(folder), ROUNDS),
            "parse_kept_s": timed(lambda: parse_keeping_the_documents(folder), ROUNDS) if n <= KEPT_UP_TO else None}


def reader_alone(name: str, folder: Path, suite: str) -> dict:
    """One reader (READERS) in a process of its own (--reader-alone: its time and peak memory on a heap that no
    other reader, nor the writer, left): the best of ROUNDS timings, the records it decoded, its peak memory and
    its decoding workers'."""
    decoded = []
    real = rows.record_of_blob
    rows.record_of_blob = lambda blob: decoded.append(1) or real(blob)
    os.environ.setdefault("COLUMNS", "200")
    no_index = lambda: shutil.rmtree(folder / index.INDEX_DIR, ignore_errors=True)  # noqa: E731
    seconds = timed(lambda: READERS[name](folder, suite), ROUNDS,
                    before=no_index if name == "load_cold_s" else lambda: None)
    return {"seconds": seconds, "decoded": len(decoded) // ROUNDS, "peak_mb": peak_mb(),
            "worker_peak_mb": WORKER_PEAK_MB[0]}


def apart(*args) -> dict:
    """This script run with args in a process of its own, and the JSON it prints last."""
    done = subprocess.run([sys.executable, __file__, *map(str, args)], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"bench_load.py {' '.join(map(str, args))} failed:\n{done.stderr}")
    return json.loads(done.stdout.splitlines()[-1])


def measure(shape: str, n: int, work: Path) -> dict:
    """n records written and parsed in one process, then each reader in a process of its own (the cold one first:
    it leaves the index the others read); each one's peak memory (`peaks`), and the decoding workers'."""
    figures, peaks = apart("--write-alone", shape, n, work), {}
    folder = work / f"{shape}{n}"
    for name in READERS:
        r = apart("--reader-alone", name, folder, figures["suite"])
        figures[name], peaks[name] = r["seconds"], r["peak_mb"]
        figures["worker_peak_mb"] = max(figures.get("worker_peak_mb", 0.0), r["worker_peak_mb"])
    shutil.rmtree(folder)
    return figures | {"peaks": peaks}


def measure_report(shape: str, n: int, work: Path) -> dict:
    """n records written, their index built (a cold load(), in a process of its own), then `report` alone."""
    folder = work / f"{shape}{n}"
    write(shape, n, folder)
    subprocess.run([sys.executable, "-c", f"import benchsuite; benchsuite.load({str(folder)!r})"], check=True)
    r = apart("--reader-alone", "report_s", folder, "")
    shutil.rmtree(folder)
    return {"records": n, "report_s": r["seconds"], "decoded": r["decoded"], "peak_mb": r["peak_mb"]}


def report_only(shapes: list[str], sizes: list[int]) -> int:
    """`report` warm at each size, with its growth and the process's peak memory (no other reader timed)."""
    failures: list[str] = []
    for shape in shapes:
        results = []
        with tempfile.TemporaryDirectory() as tmp:
            for n in sizes:
                results.append(r := measure_report(shape, n, Path(tmp)))
                print(f"{shape:>8} {n:>7} records: report warm {r['report_s']:6.2f} s, {r['decoded']:,} records "
                      f"decoded, peak memory {r['peak_mb']:,.0f} MB (target ≤ 2,048 MB) "
                      + verdict(r["peak_mb"] <= 2048, failures, f"{shape} report memory at {n}")
                      + f" | load average {os.getloadavg()[0]:.2f}", flush=True)
        for small, large in zip(results, results[1:]):
            scale = large["records"] / small["records"]
            allowed = TARGET_PER_10X * scale / 10
            ratio = large["report_s"] / small["report_s"]
            print(f"{shape:>8} report: {ratio:5.2f}× the time for {scale:.0f}× the records (target ≤ {allowed:.1f}×) "
                  + verdict(ratio <= allowed, failures, f"{shape} report growth"))
    if failures:
        print("missed: " + "; ".join(failures))
    return 1 if failures else 0


def peak_mb(pid: int | str = "self") -> float:
    """A process's peak resident memory (this one's: generating the records included, CHUNK documents at a time):
    VmHWM, its memory's own high-water mark, where Linux says it (ru_maxrss of a process started by another keeps
    the memory of the process it was forked from: the benchmark's, at the start of each reader's)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        return int(next(line for line in status.splitlines() if line.startswith("VmHWM:")).split()[1]) / 1024
    except (OSError, StopIteration, ValueError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 if pid == "self" else 0.0


WORKER_PEAK_MB = [0.0]  # the largest peak of a first read's decoding workers (results/decoding.py)


def _worker_peak_noted(next_batch):
    """A worker's peak resident memory so far, read from /proc before each batch is read from it (it is at work or
    waiting to write then; the kernel's figure for a waited child, RUSAGE_CHILDREN, counts the memory of the
    parent it was forked from)."""
    def noted(worker):
        if worker.process is not None:
            WORKER_PEAK_MB[0] = max(WORKER_PEAK_MB[0], peak_mb(worker.process.pid))
        return next_batch(worker)
    return noted


decoding._Worker.next_batch = _worker_peak_noted(decoding._Worker.next_batch)


def verdict(ok: bool, failures: list[str], what: str) -> str:
    if not ok:
        failures.append(what)
    return "ok" if ok else "FAIL"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--records", type=int, nargs="+", default=[1000, 10000])
    p.add_argument("--at-scale", action="store_true",
                   help="100,000 records too: their growth over 10,000 and the peak memory (some 15 minutes, 1.7 GB "
                        "of records in the temporary folder at a time)")
    p.add_argument("--shapes", nargs="+", default=["runs", "repeats"], choices=["runs", "repeats"])
    p.add_argument("--no-pairs", action="store_true",
                   help=f"leave out {PAIRS:,} dense and {PAIRS:,} MoE workloads in one suite against 1,000 suites")
    p.add_argument("--report-only", action="store_true",
                   help="time `report` alone (warm, each size in a process of its own: its peak memory), not the "
                        "other readers")
    p.add_argument("--write-alone", nargs=3, help=argparse.SUPPRESS)  # (the processes measure starts)
    p.add_argument("--reader-alone", nargs=3, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.write_alone:
        shape, n, work = args.write_alone
        print(json.dumps(written(shape, int(n), Path(work))))
        return 0
    if args.reader_alone:
        name, folder, suite = args.reader_alone
        print(json.dumps(reader_alone(name, Path(folder), suite)))
        return 0
    sizes = sorted({*args.records, *([100_000] if args.at_scale else [])})
    print(f"load average {os.getloadavg()[0]:.2f} (1 min) at the start; {os.cpu_count()} CPUs", flush=True)
    if args.report_only:
        return report_only(args.shapes, sizes)
    failures: list[str] = []
    if not args.no_pairs:
        with tempfile.TemporaryDirectory() as tmp:
            r = measure_pairs(PAIRS, Path(tmp))
        ratio = r["one_suite_s"] / r["spread_s"]
        print(f"{PAIRS:,} dense and {PAIRS:,} MoE workloads: report warm in one suite {r['one_suite_s']:.2f} s, in "
              f"{PAIRS // 5:,} suites {r['spread_s']:.2f} s: {ratio:.2f}× (target ≤ {ONE_SUITE_VS_SPREAD:.0f}×) "
              + verdict(ratio <= ONE_SUITE_VS_SPREAD, failures, "one suite's report") +
              f" | load average {os.getloadavg()[0]:.2f}", flush=True)
    every: dict[str, list[dict]] = {}  # shape -> each size's figures
    for shape in args.shapes:
        results = every[shape] = []
        with tempfile.TemporaryDirectory() as tmp:
            for n in sizes:
                results.append(r := measure(shape, n, Path(tmp)))
                kept_s = "—" if r["parse_kept_s"] is None else f"{r['parse_kept_s']:.2f} s"
                print(f"{shape:>8} {n:>7} records: stdlib parse {r['parse_s']:6.2f} s (documents kept {kept_s}) | "
                      f"load() cold "
                      f"{r['load_cold_s']:6.2f} s, warm {r['load_warm_s']:6.2f} s (records alone "
                      f"{r['records_warm_s']:5.2f} s, one suite {r['load_suite_s']:5.2f} s) | load_runs() warm "
                      f"{r['runs_warm_s']:5.2f} s | load_steps() warm {r['steps_warm_s']:5.2f} s | report warm "
                      f"{r['report_s']:6.2f} s | peak memory: cold {r['peaks']['load_cold_s']:,.0f} MB (a decoding "
                      f"worker {r['worker_peak_mb']:,.0f} MB), the warm readers up to "
                      f"{max(r['peaks'][name] for name in READERS if name != 'load_cold_s'):,.0f} MB | load average "
                      f"{os.getloadavg()[0]:.2f}", flush=True)
        # the targets' ratios: against the plain parse that keeps its documents, at the largest size it is
        # measured at; beside them, against the floor that keeps nothing, at the largest size
        kept = max((r for r in results if r["parse_kept_s"] is not None), key=lambda r: r["records"], default=None)
        largest = results[-1]
        for what, target in (("load_warm_s", WARM_LOAD_VS_PARSE), ("report_s", REPORT_VS_PARSE),
                             ("load_cold_s", None), ("runs_warm_s", None), ("steps_warm_s", None),
                             ("records_warm_s", None)):
            if kept is not None:
                ratio = kept[what] / kept["parse_kept_s"]
                shown = f"(target ≤ {target:.1f}×) " + verdict(ratio <= target, failures, f"{shape} {what} vs parse")\
                    if target else "(no target)"
                print(f"{shape:>8} {what[:-2]:>12} at {kept['records']:,}: {ratio:5.2f}× the stdlib parse, documents "
                      f"kept {shown}")
            print(f"{shape:>8} {what[:-2]:>12} at {largest['records']:,}: {largest[what] / largest['parse_s']:5.2f}× "
                  f"the stdlib parse, nothing kept (no target: the floor)")
        for at_10k in (r for r in results if r["records"] == 10_000):
            for what, limit in AT_10K.items():
                print(f"{shape:>8} {what[:-2]:>12} at 10,000: {at_10k[what]:6.2f} s (target ≤ {limit:.0f} s on "
                      f"this box) " + verdict(at_10k[what] <= limit, failures, f"{shape} {what} ≤ {limit} s"))
        for small, large in zip(results, results[1:]):
            scale = large["records"] / small["records"]
            allowed = TARGET_PER_10X * scale / 10
            for what in FIGURES[1:]:  # (every reader's; the parses' growth is the files')
                ratio = large[what] / small[what]
                print(f"{shape:>8} {what[:-2]:>12}: {ratio:5.2f}× the time for {scale:.0f}× the records "
                      f"(target ≤ {allowed:.1f}×) " + verdict(ratio <= allowed, failures, f"{shape} {what} growth"))
    for shape, measured in every.items():
        largest = measured[-1]
        for name, peak in largest["peaks"].items():
            print(f"{shape:>8} {name[:-2]:>12} at {largest['records']:,}: peak memory {peak:,.0f} MB (target ≤ "
                  "2,048 MB) " + verdict(peak <= 2048, failures, f"{shape} {name} memory"))
        worker = largest["worker_peak_mb"]
        print(f"{shape:>8} a first read's decoding worker at {largest['records']:,}: peak memory {worker:,.0f} MB "
              "(target ≤ 2,048 MB) " + verdict(worker <= 2048, failures, f"{shape} decoding worker memory"))
    print(f"load average {os.getloadavg()[0]:.2f} (1 min) at the end")
    if failures:
        print("missed: " + "; ".join(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
