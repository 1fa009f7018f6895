"""Build time and size of the dashboard for 1,000 synthetic, schema-valid records.

    python benchmarks/bench_dashboard.py              # 1,000 records; prints time and size
    python benchmarks/bench_dashboard.py --records 5000 --keep /tmp/site
    pytest benchmarks/bench_dashboard.py --benchmark-enable

Targets on a 2-core box: build ≤ 10 s, site ≤ 20 MB. The records are the fixture records
(tests/fixtures/results) made into 250 four-point sweeps (1, 2, 4, 8 devices), 50 steps each,
about one in twenty failed: the sections and list lengths of real runs, not empty shells.
"""

from __future__ import annotations

import argparse
import copy
import json
import tempfile
import time
from pathlib import Path

from benchsuite.results.schema import check_record
from dashboard import build_site

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "results"
TEMPLATES = ("make_dvs-dense-w1.json", "make_dvs-switch-w1.json", "make_zero-zero3-w1.json")
TARGET_S, TARGET_MB = 10.0, 20.0


def _scale_list(xs, n):
    return [copy.deepcopy(xs[i % len(xs)]) for i in range(n)]


def synthetic_records(n: int = 1000, steps: int = 50) -> list[dict]:
    templates = [json.loads((FIXTURES / t).read_text()) for t in TEMPLATES]
    records = []
    for i in range(n):
        sweep, size = divmod(i, 4)
        world = 2 ** size
        rec = copy.deepcopy(templates[sweep % len(templates)])
        cfg = rec["config"]
        cfg.update(suite=f"bench-{sweep % 10}", workload=f"{cfg['workload']}-{sweep}", world_size=world)
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
        assert check_record(rec) is None
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
    t0 = time.perf_counter()
    res = build_site(results, site)
    seconds = time.perf_counter() - t0
    size = site_bytes(site)
    run_pages = [p for p in res.pages if p.startswith("runs/")]
    return {"records": res.records, "pages": len(res.pages), "build_s": seconds, "site_mb": size / 1e6,
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


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--records", type=int, default=1000)
    p.add_argument("--keep", type=Path, default=None, help="build the site here and keep it")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        r = measure(args.records, Path(tmp), args.keep)
    print(f"records {r['records']}, pages {r['pages']}")
    print(f"build   {r['build_s']:.2f} s   (target ≤ {TARGET_S:.0f} s for 1,000)")
    print(f"site    {r['site_mb']:.1f} MB  (target ≤ {TARGET_MB:.0f} MB for 1,000; "
          f"plotly.js {r['plotly_js_mb']:.1f} MB, index {r['index_kb']:.0f} kB, "
          f"run page {r['mean_run_page_kb']:.1f} kB on average)")
    ok = args.records != 1000 or (r["build_s"] <= TARGET_S and r["site_mb"] <= TARGET_MB)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
