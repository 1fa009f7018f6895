"""The GPU check: benchsuite's own workloads against plain-PyTorch figures, in one run.

    python benchmarks/gpu_check.py            # one H200: workloads/h200.toml, about 6 minutes
    python benchmarks/gpu_check.py --tiny     # CPU dry run of the same steps (CI)

1. Runs workloads/h200.toml through `benchsuite run` (one torchrun per run, the real harness).
2. Harness overhead: in this one process, benchsuite's measure() and a bare loop over the same
   model, optimizer and batches (model, cross-entropy, backward, AdamW step), interleaved. Both
   time their steps through the same code (worker.timed_steps with a StepTimer: CUDA events on a
   GPU) with every measured batch on the device before the first step.
3. Prints a final table: tok/s, MFU, MFU vs measured matmul ceiling, mJ/token (GPU + CPU + DRAM)
   and GPU-only mJ/token (NVML, what ANCHORS.md measured), average W, NVML counter vs integrated
   power samples, and the ANCHORS.md value beside each.
Writes its log and records under $OUT when set (else --out).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchsuite.config import RunConfig, load_suite  # noqa: E402
from benchsuite.data import make_source  # noqa: E402
from benchsuite.dist import init_distributed, resolve_precision  # noqa: E402
from benchsuite.metrics.timing import StepTimer  # noqa: E402
from benchsuite.models.transformer import build_model  # noqa: E402
from benchsuite.parallel.zero import make_adamw  # noqa: E402
from benchsuite.results.store import load_records  # noqa: E402
from benchsuite.worker import autocast, measure, timed_steps, unmeasured_steps  # noqa: E402

# ANCHORS.md, one H200, plain PyTorch: (tok/s, MFU, mJ/token) per workload.
ANCHORS = {
    "dense-eager": (104_900, 0.491, None),
    "dense-compiled": (118_300, 0.554, 5.81),
    "switch-eager": (74_300, 0.348, 9.00),
    "switch-compiled": (None, None, None),
    "gshard-compiled": (77_200, 0.456, 8.96),
    "expert-choice-compiled": (84_600, 0.500, 8.20),
}
TARGET_MFU = {"dense": 0.58, "expert_choice": 0.52, "switch": 0.50, "gshard": 0.50}

TINY = {"model": {"layers": 2, "hidden": 64, "heads": 4, "ffn_hidden": 256, "vocab": 512, "seq_len": 32},
        "train": {"micro_batch": 2, "steps": 3, "warmup_steps": 2, "precision": "fp32", "timeout_s": 240}}


def log(msg: str) -> None:
    print(msg, flush=True)


def inline_table(values: dict) -> str:
    """A flat dict as a TOML inline table (JSON scalars are valid TOML scalars)."""
    return "{ " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in values.items()) + " }"


def suite_file(tiny: bool, workdir: Path) -> Path:
    """workloads/h200.toml, or for --tiny its workloads with an ANCHORS.md figure (the ones the
    table compares) shrunk to CPU size and uncompiled: the others take the same path, a run each."""
    src = REPO / "workloads" / "h200.toml"
    if not tiny:
        return src
    doc = tomllib.loads(src.read_text())
    lines = ["[suite]", 'name = "h200-tiny"', "[defaults]"]
    lines += [f"{section} = {inline_table(values)}" for section, values in TINY.items()]
    for w in (w for w in doc["workload"] if w["name"] in ANCHORS):
        lines += ["[[workload]]", f"name = {json.dumps(w['name'])}", f"kind = {json.dumps(w['kind'])}"]
        if "moe" in w:
            lines.append(f"moe = {inline_table(w['moe'])}")
    path = workdir / "h200-tiny.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def run_suite(suite: Path, out: Path) -> list[dict]:
    cmd = [sys.executable, "-m", "benchsuite.cli", "run", str(suite), "--out", str(out), "--no-resume"]
    log(f"$ {' '.join(cmd)}")
    subprocess.run(cmd, cwd=REPO, check=False)
    return load_records(out)


def bare_step_times(run: RunConfig, device: torch.device) -> list[float]:
    """The plain-PyTorch loop: model, cross-entropy, backward, AdamW step, nothing else. Same model,
    optimizer, batches, warm-up count and step timing as measure()."""
    precision = resolve_precision(run.train.precision, device)
    model = build_model(run.model, seed=run.train.seed).to(device)
    opt = make_adamw(model.parameters(), run.train)
    source = make_source(run.train.data, run.model.vocab, run.model.seq_len, run.train.seed)
    warm = unmeasured_steps(run)
    batches = [tuple(t.to(device) for t in source.batch(i, 0, 1, run.train.micro_batch))
               for i in range(warm + run.train.steps)]

    def step(batch):
        x, y = batch
        with autocast(precision, device):
            logits = model(x)[0]
        F.cross_entropy(logits.flatten(0, 1).float(), y.flatten()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for batch in batches[:warm]:
        step(batch)
    timer = StepTimer(device)
    timed_steps(timer, step, batches[warm:])
    return timer.durations_s()


def bare_loop_vs_harness(suite: Path, rounds: int) -> dict:
    """Same process, same model, optimizer and batches: benchsuite's measured median step vs a bare loop."""
    run = next(r for r in load_suite(suite).runs if r.workload == "dense-eager")
    ctx = init_distributed(run)
    harness, bare = [], []
    for _ in range(rounds):
        harness.append(measure(run, ctx, None)[0].step_times_s)
        bare.append(bare_step_times(run, ctx.device))
    h = statistics.median(statistics.median(t) for t in harness)
    b = statistics.median(statistics.median(t) for t in bare)
    return {"harness_step_s": h, "bare_step_s": b, "overhead_ratio": h / b, "rounds": rounds,
            "harness_step_times_s": harness, "bare_step_times_s": bare,
            "timing": "worker.timed_steps + StepTimer for both loops; batches on the device before the loop"}


def fmt(v, spec: str, scale: float = 1.0) -> str:
    return "—" if v is None else format(v * scale, spec)


def table(records: list[dict], overhead: dict) -> str:
    head = (f"{'workload':<24}{'status':<8}{'tok/s':>10}{'anchor':>10}{'MFU':>8}{'anchor':>8}{'target':>8}"
            f"{'MFU/ceil':>9}{'mJ/tok':>8}{'GPU mJ/tok':>11}{'anchor':>8}{'avg W':>7}{'NVML vs sampled':>17}")
    rows = [head, "-" * len(head)]
    for r in sorted(records, key=lambda r: r["workload"]):
        m = r.get("metrics") or {}
        e = m.get("energy") or {}
        a_tps, a_mfu, a_mj = ANCHORS.get(r["workload"], (None, None, None))
        router = (r["config"].get("moe") or {}).get("router", "dense")
        dev = ((r.get("energy") or {}).get("per_device") or [{}])[0]
        cross = None
        if dev.get("energy_j") and dev.get("sampled_energy_j"):
            cross = dev["energy_j"] / dev["sampled_energy_j"] - 1
        rows.append(
            f"{r['workload']:<24}{r['status']:<8}{fmt(m.get('tokens_per_s'), ',.0f'):>10}{fmt(a_tps, ',.0f'):>10}"
            f"{fmt(m.get('mfu'), '.1%'):>8}{fmt(a_mfu, '.1%'):>8}"
            f"{fmt(TARGET_MFU.get(router) if 'compiled' in r['workload'] else None, '.0%'):>8}"
            f"{fmt(m.get('mfu_vs_ceiling'), '.1%'):>9}{fmt(e.get('j_per_token'), '.2f', 1e3):>8}"
            f"{fmt(e.get('gpu_j_per_token'), '.2f', 1e3):>11}{fmt(a_mj, '.2f'):>8}"
            f"{fmt(e.get('avg_w_per_device'), '.0f'):>7}{fmt(cross, '+.2%'):>17}")
        if r["status"] != "ok":
            rows.append(f"    error: {r['error']['type']}: {r['error']['message'][:200]}")
    ceil = next((r["metrics"]["matmul_ceiling_tflops"] for r in records if r.get("metrics")), None)
    rows.append(f"matmul ceiling (measured): {fmt(ceil, '.0f')} TFLOP/s   (ANCHORS: 660-666 on an H200)")
    rows.append("mJ/tok: GPU + CPU + DRAM (CPU/DRAM may be estimated); GPU mJ/tok: NVML GPU counter alone "
                "(ANCHORS' figure)")
    rows.append(f"harness overhead: benchsuite {overhead['harness_step_s'] * 1e3:.2f} ms vs bare loop "
                f"{overhead['bare_step_s'] * 1e3:.2f} ms per step → ratio {overhead['overhead_ratio']:.4f} "
                f"(target ≤ 1.01; median of {overhead['rounds']} interleaved rounds)")
    return "\n".join(rows)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="CPU dry run: tiny models, no compile")
    p.add_argument("--out", default=os.environ.get("OUT") or "results/gpu_check")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        suite = suite_file(args.tiny, Path(tmp))
        records = run_suite(suite, Path(tmp) / "records")
        log("harness overhead: measure() vs bare loop, interleaved")
        overhead = bare_loop_vs_harness(suite, rounds=2 if not args.tiny else 1)
    report = table(records, overhead)
    (out / "gpu_check_table.txt").write_text(report + "\n")
    (out / "gpu_check_records.json").write_text(json.dumps(records, indent=1))
    (out / "gpu_check_overhead.json").write_text(json.dumps(overhead, indent=1))
    log("\n" + report)
    return 0 if all(r["status"] == "ok" for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
