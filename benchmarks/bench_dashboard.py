"""Build time and size of the dashboard for 1,000 and 10,000 synthetic, schema-valid records.

    python benchmarks/bench_dashboard.py              # 1,000 and 10,000 records, and the ratio
    python benchmarks/bench_dashboard.py --records 1000 5000 --keep /tmp/site
    pytest benchmarks/bench_dashboard.py --benchmark-enable

Targets on an idle 2-core box: 1,000 records build in ≤ 10 s into a site of ≤ 20 MB; build time
grows no faster than linearly (≤ 11× the time for 10× the records: a little slack for noise), and
the index page stays ≤ 5 MB at 10,000 records (its runs table loads its rows from assets/runs.js).
The build is one thread, so on an idle box its wall-clock time is its CPU time: the targets are
judged on the process's CPU time (time.process_time), which other processes on a shared box do
not inflate; the wall-clock times are printed beside it, with the load average.
The records are the fixture records (tests/fixtures/results) made into four-point sweeps (1, 2,
4, 8 devices), five sweeps to a suite, 50 steps each, about one in twenty failed: the sections and
list lengths of real runs, not empty shells.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import tempfile
import time
from pathlib import Path

from benchsuite.record import to_dict, validate
from benchsuite.results.store import read_record
from benchsuite.dashboard import build_site

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "results"
TEMPLATES = ("make_dvs-dense-w1.json", "make_dvs-switch-w1.json", "make_zero-zero3-w1.json")
TARGET_S, TARGET_MB = 10.0, 20.0  # for 1,000 records
TARGET_RATIO = 11.0  # build time for 10× the records
TARGET_INDEX_MB = 5.0  # index.html at 10,000 records


def _scale_list(xs, n):
    return [copy.deepcopy(xs[i % len(xs)]) for i in range(n)]


def synthetic_records(n: int = 1000, steps: int = 50) -> list[dict]:
    templates = [to_dict(read_record(FIXTURES / t)) for t in TEMPLATES]  # upgraded, as documents to vary
    records = []
    for i in range(n):
        sweep, size = divmod(i, 4)
        world = 2 ** size
        rec = copy.deepcopy(templates[sweep % len(templates)])
        cfg = rec["config"]
        # five sweeps to a suite: a suite compares a handful of workloads however large the folder (the
        # dense-vs-sparse pairs are per suite and layout, so ten suites of 250 sweeps each would be n² pairs)
        cfg.update(suite=f"bench-{sweep // 5}", workload=f"{cfg['workload']}-{sweep}", world_size=world)
        cfg["sweep_id"] = f"{cfg['suite']}/{cfg['workload']}/{cfg['scaling']}"
        rec.update(suite=cfg["suite"], workload=cfg["workload"], run_key=f"{i:016x}",
                   started_at=f"2026-11-{1 + sweep % 28:02d}T{size:02d}:00:00+00:00")
        rec["env"]["world_size"] = world
        rec["env"]["devices"] = [dict(rec["env"]["devices"][0], rank=r, index=r, uuid=f"GPU-{i:08x}-{r}")
                                 for r in range(world)]
        m = rec["metrics"]
        speed = world * (0.92 ** size) * (1 + 0.01 * (sweep % 7))
        m["tokens_per_s"] *= speed
        m["step_time_s"] = {k: (v / speed * world if isinstance(v, float) else v) for k, v in m["step_time_s"].items()}
        m["per_rank"] = {"step_time_median_s": [m["step_time_s"]["median"] * (1 + 0.01 * r) for r in range(world)],
                         "straggler_ratio": 1 + 0.01 * (world - 1)}
        m["memory"]["per_rank"] = _scale_list(m["memory"]["per_rank"], world)
        rec["steps"] = [dict(rec["steps"][s % len(rec["steps"])], step=s) for s in range(steps)]
        if rec["energy"]:
            rec["energy"]["per_device"] = [dict(rec["energy"]["per_device"][0], uuid=f"GPU-{i:08x}-{r}", ranks=[r])
                                           for r in range(world)]
        if i % 20 == 19:  # a failed run now and then, as a suite has
            rec.update(status="failed", metrics=None, energy=None, carbon=None, steps=[],
                       error={"type": "OutOfMemoryError", "message": "CUDA out of memory", "rank": world - 1})
        validate(rec)
        records.append(rec)
    return records


def write_results(records: list[dict], folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for rec in records:
        (folder / f"{rec['run_key']}.json").write_text(json.dumps(rec, allow_nan=False))


def site_bytes(site: Path) -> int:
    return sum(p.stat().st_size for p in site.rglob("*") if p.is_file())


def measure(n: int, work: Path, keep: Path | None = None) -> dict:
    results = work / "results"
    write_results(synthetic_records(n), results)
    site = keep or work / "site"
    t0, cpu0 = time.perf_counter(), time.process_time()
    res = build_site(results, site)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    size = site_bytes(site)
    run_pages = [p for p in res.pages if p.startswith("runs/")]
    return {"records": res.records, "pages": len(res.pages), "build_s": seconds, "cpu_s": cpu, "site_mb": size / 1e6,
            "index_kb": (site / "index.html").stat().st_size / 1e3,
            "mean_run_page_kb": sum((site / p).stat().st_size for p in run_pages) / max(len(run_pages), 1) / 1e3,
            "plotly_js_mb": (site / "assets" / "plotly.min.js").stat().st_size / 1e6}


def test_dashboard_1000_records(benchmark, tmp_path):
    results = tmp_path / "results"
    write_results(synthetic_records(1000), results)
    res = benchmark.pedantic(build_site, args=(results, tmp_path / "site"), rounds=1, iterations=1)
    assert res.records == 1000
    size_mb = site_bytes(tmp_path / "site") / 1e6
    print(f"\nsite: {size_mb:.1f} MB for {res.records} records")
    assert size_mb <= TARGET_MB


def _report(r: dict) -> None:
    print(f"{r['records']:>6} records: build {r['build_s']:7.2f} s ({r['cpu_s']:.2f} s of CPU), index {r['index_kb'] / 1e3:5.2f} MB, "
          f"site {r['site_mb']:6.1f} MB (plotly.js {r['plotly_js_mb']:.1f} MB, run page "
          f"{r['mean_run_page_kb']:.1f} kB on average)")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--records", type=int, nargs="+", default=[1000, 10000],
                   help="record counts to build, smallest first (default: 1000 10000)")
    p.add_argument("--keep", type=Path, default=None, help="build the largest site here and keep it")
    args = p.parse_args()
    counts = sorted(args.records)
    print("load average (1, 5, 15 min) at the start: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    results = []
    for n in counts:
        with tempfile.TemporaryDirectory() as tmp:
            results.append(measure(n, Path(tmp), args.keep if n == counts[-1] else None))
        _report(results[-1])
    failures = []
    small, large = results[0], results[-1]
    if small["records"] == 1000 and (small["cpu_s"] > TARGET_S or small["site_mb"] > TARGET_MB):
        failures.append(f"1,000 records: over {TARGET_S:.0f} s or {TARGET_MB:.0f} MB")
    if len(results) > 1:
        scale = large["records"] / small["records"]
        ratio = large["cpu_s"] / small["cpu_s"]
        print(f"wall-clock ratio {large['build_s'] / small['build_s']:.2f} (the load of other processes moves it)")
        allowed = TARGET_RATIO * scale / 10
        print(f"CPU time ratio {ratio:.2f} for {scale:.0f}× the records (target ≤ {allowed:.1f})")
        if ratio > allowed:
            failures.append(f"build time grows faster than linearly: {ratio:.2f} > {allowed:.1f}")
    if large["records"] >= 10000 and large["index_kb"] / 1e3 > TARGET_INDEX_MB:
        failures.append(f"index.html {large['index_kb'] / 1e3:.2f} MB > {TARGET_INDEX_MB:.0f} MB")
    print("load average (1, 5, 15 min) at the end: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    for f in failures:
        print(f"FAIL: {f}")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
