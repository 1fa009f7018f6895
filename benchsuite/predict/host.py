"""`benchsuite predict --system host`: this host's figures, measured, as a system file's (one CPU rank per
core, one thread each, gloo between ranks on this host, as the harness runs its CPU suites).

- peak_tflops: the best of several fp32 1024³ matmuls on one thread (the rank's ceiling).
- matmul_tflops: fp32 matmuls of a training step's shapes (tokens × hidden by hidden × 4·hidden, the MLP's
  up projection of a CPU suite), one thread; `--calibrate RECORD` replaces it with a run's own rate.
- memory_gbps: torch's fused AdamW over 4 M fp32 parameters, as 28 bytes per parameter per step
  (compute.py's convention), so the optimizer term reproduces the measured step.
- op_floor_us: the host time of one operator of a training step whose compute is negligible: width-8
  Linear + GELU stacks of 4 and 16 layers, forward and backward, the step-time difference over the
  difference in aten operators run (counted with a TorchDispatchMode).
- intra_node: gloo all-reduce, all-gather, reduce-scatter and all-to-all between two ranks, each size
  timed as a training step issues it: after a matmul of a step's shape on the same rank, less that
  matmul's time alone (median of several calls); the bytes one rank sends (metrics.comm's ring
  convention) against the time, least squares t = latency + bytes / bandwidth over every kind and size
  (the back-to-back fit beside it: a collective right after compute costs more than back to back).
- framework_us: the host time DTensor and FSDP2 add to each collective they issue. Stacks of width-16
  MLPs under DTensor tensor parallelism and under FSDP2, 4 and 8 of them: the step-time difference over
  the difference in collectives (counted with CommDebugMode), less the back-to-back latency of the link;
  the mean of the two frameworks.

Every figure is a median over repeats; the load average is kept beside them (other processes on the cores
slow every figure down). What is not measured here (power, the link across hosts) is an assumption the
written file says so of.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil
import torch
import torch.utils._python_dispatch

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
SIZES = [2 ** k for k in range(2, 23, 2)]  # payload bytes, 4 B .. 4 MiB
CALLS = 40
RATE_MATMUL = (1024, 128, 512)  # the matmul_tflops figure's shape (tokens × hidden @ hidden × 2·hidden)
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


class _CountOps(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts the aten operators run under it (forward and, on a CPU, the backward run on this thread)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def op_floor_us(repeats: int = 200) -> float:
    """Host seconds per operator (module docstring), in µs."""
    steps = {}
    for layers in (4, 16):
        model = torch.nn.Sequential(*[m for _ in range(layers) for m in (torch.nn.Linear(8, 8), torch.nn.GELU())])
        x = torch.randn(4, 8)

        def step(model=model, x=x):
            model(x).sum().backward()

        step()
        with _CountOps() as counter:
            step()
        steps[layers] = (statistics.median(best_s(step, repeats)), counter.count)
    (t4, n4), (t16, n16) = steps[4], steps[16]
    return (t16 - t4) / (n16 - n4) * 1e6


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


def measure_host() -> dict:
    """Every figure of this host (module docstring), with the load average before and after."""
    torch.set_num_threads(1)
    load_before = os.getloadavg()
    figures = {"peak_tflops": matmul_tflops(1024, 1024, 1024, 10, best=True),
               "matmul_tflops": matmul_tflops(*RATE_MATMUL, 50, best=False),
               "memory_gbps": adamw_gbps(), "op_floor_us": op_floor_us()}
    measured = gloo_rows()
    rows = measured["rows"]
    latency_us, gbps = fit_link(rows)
    alone_us, alone_gbps = fit_link(rows, "back_to_back_s")
    framework = {k: v * 1e6 - alone_us for k, v in measured["framework_per_call_s"].items()}
    figures.update(gloo_latency_us=latency_us, gloo_gbps=gbps, back_to_back_latency_us=alone_us,
                   back_to_back_gbps=alone_gbps, framework_us=max(0.0, statistics.fmean(framework.values())),
                   framework_us_by_framework=framework)
    return {"figures": figures, "collectives": rows, "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
            "torch": torch.__version__, "cores": len(os.sched_getaffinity(0)),
            "memory_gb": psutil.virtual_memory().total / 1e9}


def system_toml(doc: dict) -> str:
    """A system file of measure_host's figures, each with where it comes from."""
    from benchsuite.environment import device_info

    f, when = doc["figures"], dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    load = f"load average {doc['loadavg_before'][0]:.2f} to {doc['loadavg_after'][0]:.2f}"
    measured = f"measured by `benchsuite predict --system host` on {when}, {load}, torch {doc['torch']}"
    name = json.dumps(device_info(torch.device("cpu"))["name"] or "unknown CPU")
    by, rate = f["framework_us_by_framework"], min(f["matmul_tflops"], f["peak_tflops"])
    shape = "x".join(map(str, RATE_MATMUL))
    return f"""# This host, one rank per core (one thread each), gloo between ranks: {measured}.
[system]
name = {json.dumps(f"this host, {doc['cores']} cores, one rank per core, gloo")}
devices_per_node = {doc['cores']}    # the cores this process may run on (os.sched_getaffinity)
dp_overlap = 0.0        # assumption: a rank has one thread, so a collective takes the core the backward needs
framework_us = {f['framework_us']:.4g}    # measured: DTensor {by['dtensor']:.4g}, FSDP2 {by['fsdp2']:.4g}
op_floor_us = {f['op_floor_us']:.4g}    # measured: host time per aten operator of a negligible-compute step
ep_overlap = 0.0        # gloo's all-to-all takes the rank's one thread: nothing is hidden

[device]
name = {name}    # as the harness records this host's CPU (environment.device_info)
kind = "cpu"
peak_tflops = {f['peak_tflops']:.4g}    # measured: fp32 1024^3 matmul, one thread, best of 10
matmul_tflops = {rate:.4g}    # measured: fp32 {shape} matmul, one thread, median of 50
attention_tflops = {rate:.4g}    # assumption: the matmul rate (--calibrate sets both)
memory_gb = {doc['memory_gb'] / doc['cores']:.4g}    # this host's memory (psutil), shared by its {doc['cores']} ranks
memory_gbps = {f['memory_gbps']:.4g}    # measured: fused AdamW over 4 M fp32 parameters, as 28 B/parameter
max_w = 10              # assumption: a server core's share of a 200-350 W socket; replace with RAPL's reading
idle_w = 2              # assumption: likewise

[intra_node]
# measured: gloo collectives of 4 B-4 MiB, least squares t = latency + bytes / bandwidth, after a step's matmul
# ({f['gloo_gbps']:.4g} GB/s, {f['gloo_latency_us']:.4g} us) and back to back ({f['back_to_back_gbps']:.4g} GB/s,
# {f['back_to_back_latency_us']:.4g} us): the slower bandwidth and the larger latency (after compute a call costs
# more than back to back; a fit below that is noise)
gbps = {min(f['gloo_gbps'], f['back_to_back_gbps']):.4g}
latency_us = {max(f['gloo_latency_us'], f['back_to_back_latency_us'], 1.0):.4g}

[inter_node]
gbps = 1.1              # assumption: 10 GbE TCP between hosts (1.25 GB/s line rate, ~90 % reached)
latency_us = 500        # assumption: gloo over TCP across a switch; not measured (one host here)

[experts]
load_max_over_mean = 1.05    # assumption (the GPU files'); --calibrate RECORD of an MoE run uses its own
"""


def host_system(doc: dict):
    """The System of measure_host's figures (the file system_toml writes, parsed as any system file)."""
    import tomllib

    from benchsuite.predict.system import parse_system

    return parse_system(tomllib.loads(system_toml(doc)), "this host (measured by --system host)")
