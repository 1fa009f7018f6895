"""The figures of workloads/systems/cpu-gloo.toml, measured on this host: one CPU rank per core (one
thread each), two ranks over gloo on one host, as the harness runs its CPU suites. The measurements are
benchsuite/predict/host.py's (what `benchsuite predict --system host` runs); this prints them.

    python benchmarks/bench_cpu_system.py            # prints each figure, the load average, and the fit
    python benchmarks/bench_cpu_system.py --json     # the same as one JSON document
"""

from __future__ import annotations

import argparse
import json
import sys

from benchsuite.predict.host import KINDS, RATE_MATMUL, measure_host


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="one JSON document on stdout")
    args = ap.parse_args()
    doc = measure_host()
    figures, rows, load_before = doc["figures"], doc["collectives"], doc["loadavg_before"]
    latency_us, gbps = figures["gloo_latency_us"], figures["gloo_gbps"]
    alone_us, alone_gbps = figures["back_to_back_latency_us"], figures["back_to_back_gbps"]
    framework = figures["framework_us_by_framework"]
    if args.json:
        print(json.dumps(doc))
        return 0
    print(f"load average before {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}, "
          f"after {doc['loadavg_after'][0]:.2f}; torch {doc['torch']}, {doc['cores']} cores, 1 thread per rank")
    print(f"peak_tflops     {figures['peak_tflops']:.4g}   (fp32 1024³ matmul, best of 10)")
    m, k, n = RATE_MATMUL
    print(f"matmul_tflops   {figures['matmul_tflops']:.4g}   (fp32 {m}×{k} @ {k}×{n}, median of 50)")
    print(f"memory_gbps     {figures['memory_gbps']:.4g}   (fused AdamW, 28 B/parameter, median of 20)")
    print(f"op_floor_us     {figures['op_floor_us']:.4g}   (host time per operator of a negligible-compute step)")
    print(f"gloo link fit   latency {latency_us:.4g} µs, {gbps:.4g} GB/s (after a step's matmul; bytes sent per "
          f"rank, ring convention)")
    print(f"  back to back  latency {alone_us:.4g} µs, {alone_gbps:.4g} GB/s (not what a step sees)")
    print(f"framework_us    {figures['framework_us']:.4g}   (host time per collective beyond the link's: "
          + ", ".join(f"{k} {v:.4g}" for k, v in framework.items()) + ")")
    for kind in KINDS:
        cells = "  ".join(f"{r['payload']:>8d} B {r['seconds'] * 1e6:8.1f} µs" for r in rows if r["kind"] == kind
                          and r["payload"] in (4, 4096, 2 ** 18, 2 ** 22))
        print(f"  {kind:<15} {cells}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
