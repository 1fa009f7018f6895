"""The figures of workloads/systems/cpu-gloo.toml, measured on this host: one CPU rank per core (one
thread each), two ranks over gloo on one host, as the harness runs its CPU suites.

    python benchmarks/bench_cpu_system.py            # prints each figure, the load average, and the fit
    python benchmarks/bench_cpu_system.py --json     # the same as one JSON document

- peak_tflops: the best of several fp32 1024³ matmuls on one thread (the rank's ceiling).
- matmul_tflops: fp32 matmuls of a training step's shapes (tokens × hidden by hidden × 4·hidden, the MLP's
  up projection of a CPU suite), one thread; `benchsuite predict --calibrate RECORD` replaces it.
- memory_gbps: torch's fused AdamW over 4 M fp32 parameters, as 28 bytes per parameter per step
  (benchsuite/predict/compute.py's convention), so the optimizer term reproduces the measured step.
- intra_node: gloo all-reduce, all-gather, reduce-scatter and all-to-all between two ranks, each size
  timed as a training step issues it: after a matmul of a step's shape on the same rank, less that
  matmul's time alone (median of several calls). On this 2-core guest a collective costs 2-3 times
  its back-to-back latency there (why is not measured here: gloo's threads waking, cold caches), so the
  back-to-back figure alone under-predicts a step. The bytes one rank sends (metrics.comm's ring
  convention) against the time, least squares t = latency + bytes / bandwidth over every kind and size;
  the back-to-back fit is printed beside it.
- framework_us: the host time DTensor and FSDP2 add to each collective they issue. Stacks of width-16
  MLPs (payloads of bytes, compute of microseconds) under DTensor tensor parallelism (Colwise/Rowwise)
  and under FSDP2 (fully_shard per MLP), 4 and 8 of them: the step-time difference over the difference
  in collectives (counted with CommDebugMode), less the back-to-back latency of the same link; the mean
  of the two frameworks (each printed).

Every figure is a median over repeats, and the load average is printed beside them (other processes on
the cores slow every figure down).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
SIZES = [2 ** k for k in range(2, 23, 2)]  # payload bytes, 4 B .. 4 MiB
CALLS = 40
STEP_MATMUL = (1024, 256, 1024)  # tokens × hidden @ hidden × 4·hidden: the MLP's up projection of a CPU suite


def best_s(fn, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def matmul_tflops(m: int, k: int, n: int, repeats: int, best: bool) -> float:
    a, b = torch.randn(m, k), torch.randn(k, n)
    a @ b  # warm-up
    times = best_s(lambda: a @ b, repeats)
    return 2 * m * k * n / (min(times) if best else statistics.median(times)) / 1e12


def adamw_gbps(params: int = 4 * 2 ** 20, repeats: int = 20) -> float:
    p = torch.nn.Parameter(torch.randn(params))
    p.grad = torch.randn(params)
    opt = torch.optim.AdamW([p], lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    opt.step()
    return 28 * params / statistics.median(best_s(opt.step, repeats)) / 1e9


def _collective(kind: str, payload: int, world: int):
    """A callable running one collective of `payload` bytes (the full tensor, metrics.comm's convention)."""
    import torch.distributed as dist

    n = payload // 4
    if kind == "all_reduce":
        t = torch.ones(n)
        return lambda: dist.all_reduce(t)
    if kind == "all_gather":
        out, shard = torch.empty(n), torch.ones(n // world)
        return lambda: dist.all_gather_into_tensor(out, shard)
    if kind == "reduce_scatter":
        inp, out = torch.ones(n), torch.empty(n // world)
        return lambda: dist.reduce_scatter_tensor(out, inp)
    inp, out = torch.ones(n), torch.empty(n)
    return lambda: dist.all_to_all_single(out, inp)


def _median_s(fn, calls: int) -> float:
    """Median time of `calls` calls of fn, each started together on every rank (a barrier before)."""
    import torch.distributed as dist

    times = []
    for _ in range(calls):
        dist.barrier()
        times.append(best_s(fn, 1)[0])
    return statistics.median(times)


FRAMEWORK_WIDTH, FRAMEWORK_DEPTHS = 16, (4, 8)


def _mlp_stack(layers: int, framework: str, mesh) -> torch.nn.Module:
    width = FRAMEWORK_WIDTH
    stack = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
                                                      torch.nn.Linear(4 * width, width)) for _ in range(layers)])
    if framework == "dtensor":
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        for mlp in stack:
            parallelize_module(mlp, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
        return stack
    from torch.distributed.fsdp import fully_shard

    for mlp in stack:
        fully_shard(mlp, mesh=mesh)
    return fully_shard(stack, mesh=mesh)


def _framework_step(layers: int, framework: str, mesh) -> tuple[float, int]:
    """(median step time, collectives per step) of a tiny MLP stack under `framework`."""
    from torch.distributed.tensor.debug import CommDebugMode

    from benchsuite.parallel.zero import dtensor_param_groups

    stack = _mlp_stack(layers, framework, mesh)
    opt = torch.optim.AdamW(dtensor_param_groups(stack.parameters()), fused=True)
    x = torch.randn(64, FRAMEWORK_WIDTH, requires_grad=True)  # (CommDebugMode's backward hooks warn without)

    def step():
        stack(x).sum().backward()
        opt.step()
        opt.zero_grad()

    for _ in range(3):
        step()
    with CommDebugMode() as counted:
        step()
    return _median_s(step, CALLS), counted.get_total_counts()


def _rank(rank: int, world: int, port: int, out: str) -> None:
    import torch.distributed as dist

    from benchsuite.metrics.comm import ring_bytes

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    a, b = torch.randn(*STEP_MATMUL[:2]), torch.randn(*STEP_MATMUL[1:])
    compute = _median_s(lambda: a @ b, CALLS)
    rows = []
    for kind in KINDS:
        for payload in SIZES:
            run = _collective(kind, max(payload, 4 * world), world)
            run()
            rows.append({"kind": kind, "payload": payload, "sent": ring_bytes(kind, payload, world),
                         "seconds": _median_s(lambda: (a @ b, run()), CALLS) - compute,
                         "back_to_back_s": _median_s(run, CALLS)})
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (world,))
    per_call = {}
    for framework in ("dtensor", "fsdp2"):
        (t0, n0), (t1, n1) = (_framework_step(layers, framework, mesh) for layers in FRAMEWORK_DEPTHS)
        per_call[framework] = (t1 - t0) / (n1 - n0)
    if rank == 0:
        Path(out).write_text(json.dumps({"rows": rows, "framework_per_call_s": per_call}))
    dist.destroy_process_group()


def gloo_rows(world: int = 2) -> dict:
    """{"rows": a row per collective kind and size, "framework_per_call_s": {framework: seconds}}."""
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rows.json")
        mp.spawn(_rank, args=(world, port, out), nprocs=world, join=True)
        return json.loads(Path(out).read_text())


def fit_link(rows: list[dict], key: str = "seconds") -> tuple[float, float]:
    """(latency µs, GB/s) of t = latency + sent / bandwidth, least squares over every row."""
    sent = np.array([r["sent"] for r in rows])
    t = np.array([r[key] for r in rows])
    (slope, latency), *_ = np.linalg.lstsq(np.stack([sent, np.ones_like(sent)], axis=1), t, rcond=None)
    return latency * 1e6, 1 / slope / 1e9


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="one JSON document on stdout")
    args = ap.parse_args()
    torch.set_num_threads(1)
    load_before = os.getloadavg()
    figures = {
        "peak_tflops": matmul_tflops(1024, 1024, 1024, 10, best=True),
        "matmul_tflops": matmul_tflops(1024, 128, 512, 50, best=False),
        "memory_gbps": adamw_gbps(),
    }
    measured = gloo_rows()
    rows = measured["rows"]
    latency_us, gbps = fit_link(rows)
    alone_us, alone_gbps = fit_link(rows, "back_to_back_s")
    framework = {k: v * 1e6 - alone_us for k, v in measured["framework_per_call_s"].items()}
    figures.update(gloo_latency_us=latency_us, gloo_gbps=gbps, back_to_back_latency_us=alone_us,
                   back_to_back_gbps=alone_gbps, framework_us=statistics.fmean(framework.values()),
                   framework_us_by_framework=framework)
    doc = {"figures": figures, "collectives": rows, "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
           "torch": torch.__version__, "cores": len(os.sched_getaffinity(0))}
    if args.json:
        print(json.dumps(doc))
        return 0
    print(f"load average before {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}, "
          f"after {doc['loadavg_after'][0]:.2f}; torch {torch.__version__}, {doc['cores']} cores, 1 thread per rank")
    print(f"peak_tflops     {figures['peak_tflops']:.4g}   (fp32 1024³ matmul, best of 10)")
    print(f"matmul_tflops   {figures['matmul_tflops']:.4g}   (fp32 1024×128 @ 128×512, median of 50)")
    print(f"memory_gbps     {figures['memory_gbps']:.4g}   (fused AdamW, 28 B/parameter, median of 20)")
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
