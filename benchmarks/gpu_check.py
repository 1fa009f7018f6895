"""The GPU check: benchsuite's own workloads against plain-PyTorch figures and the targets, one script
of at most 7 minutes on one H200.

    python benchmarks/gpu_check.py            # one H200
    python benchmarks/gpu_check.py --tiny     # CPU dry run of the same steps (CI)

Steps, the most wanted first; each writes under $OUT (else --out) as it ends, and the table is
rewritten after every step, so a run cut short still returns what it finished (six files, within
what a device run returns: gpu_check.log, versions.json, gpu_check_records.json,
gpu_check_table.txt, cuda_tests.xml, gpu_check_overhead.json):
1. versions.json: GPU, driver, torch, CUDA.
2. The CHECK workloads of workloads/h200.toml (the plain-PyTorch reference configuration) through `benchsuite
   run`: one torchrun per run, the real harness, each run's result line in the log as it ends;
   their records in gpu_check_records.json.
3. `pytest -m cuda`: the tests that need a GPU (grouped_mm, and TP, EP and ZeRO-3 with two ranks
   on the one GPU over gloo, against one process); its result line and cuda_tests.xml.
4. Harness overhead: in this one process, worker.run_rank() and a bare loop over the same model, optimizer
   and batches (model, cross-entropy, backward, AdamW step), interleaved. Both time their steps
   through the same code (worker.timed_steps with a StepTimer: CUDA events on a GPU) with every
   measured batch on the device before the first step.
A time budget (--budget-s) bounds the whole: the workloads stop (SIGTERM: the run in progress is
recorded failed, every finished record is kept) in time for the later steps, and a step left
without time says so in the table.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from msgspec.structs import replace

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchsuite.atomic import atomic_file  # noqa: E402
from benchsuite.config import RunConfig, load_suite  # noqa: E402
from benchsuite.data import make_source  # noqa: E402
from benchsuite.device import resolve_precision  # noqa: E402
from benchsuite.dist import init_distributed  # noqa: E402
from benchsuite.metrics.timing import StepTimer  # noqa: E402
from benchsuite.models.transformer import build_model  # noqa: E402
from benchsuite.parallel.zero import make_adamw  # noqa: E402
from benchsuite.record import to_dict  # noqa: E402
from benchsuite.results.store import load_records  # noqa: E402
from benchsuite.worker import autocast, run_rank, timed_steps, unmeasured_steps  # noqa: E402

# The workloads of workloads/h200.toml this check runs, most wanted first.
CHECK = ("dense-compiled", "dropless-top2-compiled", "gshard-compiled", "switch-compiled", "expert-choice-compiled",
         "dense-eager", "zero3-bf16")
# The reference: the same workloads trained by a bare PyTorch loop on one H200: (tok/s, MFU, mJ/token).
REFERENCE = {
    "dense-eager": (104_900, 0.491, None),
    "dense-compiled": (118_300, 0.554, 5.81),
    "gshard-compiled": (77_200, 0.456, 8.96),
    "expert-choice-compiled": (84_600, 0.500, 8.20),
}


@dataclass(frozen=True)
class Target:
    mfu: float | None = None  # model FLOPs (no recompute) / 989.4 TFLOP/s
    max_dropped: float | None = None  # share of token-expert assignments dropped


TARGETS = {"dense-compiled": Target(0.58), "expert-choice-compiled": Target(0.52),
           "switch-compiled": Target(0.50, 0.15), "gshard-compiled": Target(0.50, 0.15),
           "dropless-top2-compiled": Target(0.50)}
MAX_OVERHEAD = 1.01  # harness step time / bare loop step time
NVML_AGREEMENT, NVML_MIN_WINDOW_S = 0.02, 9.0  # counter vs integrated samples, on windows at least this long
RESERVE_S = {"cuda tests": 90.0, "overhead": 45.0}  # kept back from the workloads for the later steps
OVERHEAD_STEPS = 30  # measured steps per round of the overhead comparison (GPU)

TINY = {"model": {"layers": 2, "hidden": 64, "heads": 4, "ffn_hidden": 256, "vocab": 512, "seq_len": 32},
        "train": {"micro_batch": 2, "steps": 3, "warmup_steps": 2, "precision": "fp32", "timeout_s": 240}}


class Log:
    """Every line to stdout and to gpu_check.log under the output folder."""

    def __init__(self, path: Path):
        self.file = path.open("a", encoding="utf-8")

    def __call__(self, msg: str) -> None:
        print(msg, flush=True)
        self.file.write(msg + "\n")
        self.file.flush()


class Budget:
    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()


def run_logged(cmd: list[str], log: Callable[[str], None], timeout_s: float) -> int | None:
    """Run cmd with its output in the log; past timeout_s SIGTERM its process group (benchsuite run then
    records the run in progress and stops; mp.spawn's ranks go with pytest), SIGKILL 30 s later. The
    exit code, or None when it was stopped."""
    log(f"$ {' '.join(cmd)}   (at most {timeout_s:.0f} s)")
    if timeout_s <= 0:
        return None
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, encoding="utf-8",
                            errors="replace", start_new_session=True)  # a stray byte must not stop the reader
    reader = threading.Thread(target=lambda: [log(line.rstrip("\n")) for line in proc.stdout], daemon=True)
    reader.start()
    try:
        code = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        log(f"time budget: stopping after {timeout_s:.0f} s")
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        code = None
    reader.join(timeout=5)
    return code


def write(path: Path, text: str) -> None:
    """Whole or not at all: the check may be killed at its limit while it writes."""
    with atomic_file(path, "w", encoding="utf-8", durable=False) as f:
        f.write(text)


def versions() -> dict:
    """What the figures were measured with."""
    out = {"torch": torch.__version__, "cuda": torch.version.cuda, "gpu": None, "driver": None, "date": time.strftime(
        "%Y-%m-%d %H:%M UTC", time.gmtime())}
    if torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name(0)
        try:
            import pynvml

            pynvml.nvmlInit()
            out["driver"] = pynvml.nvmlSystemGetDriverVersion()
        except Exception as e:  # noqa: BLE001 - the table says why
            out["driver"] = f"unknown ({e})"
    return out


def inline_table(values: dict) -> str:
    """A flat dict as a TOML inline table (JSON scalars are valid TOML scalars)."""
    return "{ " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in values.items()) + " }"


def suite_file(tiny: bool, workdir: Path) -> Path:
    """The CHECK workloads of workloads/h200.toml in CHECK's order; for --tiny shrunk to CPU size and
    uncompiled (each keeps its kind, MoE, parallel layout and world sizes: the path stays the same)."""
    doc = tomllib.loads((REPO / "workloads" / "h200.toml").read_text())
    chosen = sorted((w for w in doc["workload"] if w["name"] in CHECK), key=lambda w: CHECK.index(w["name"]))
    lines = ["[suite]", f'name = "{"h200-tiny" if tiny else "h200-check"}"', "[defaults]"]
    defaults = TINY if tiny else doc["defaults"]
    lines += [f"{section} = {inline_table(values)}" for section, values in defaults.items()]
    for w in chosen:
        lines.append("[[workload]]")
        lines += [f"{key} = {inline_table(v) if isinstance(v, dict) else json.dumps(v)}" for key, v in w.items()
                  if not (tiny and key in TINY)]
    path = workdir / "h200-check.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def cuda_tests(out: Path, log: Log, timeout_s: float) -> dict:
    """pytest -m cuda; its result line ("7 passed in 40.1s") and exit code."""
    lines: list[str] = []

    def keep(msg: str) -> None:
        lines.append(msg)
        log(msg)

    code = run_logged([sys.executable, "-m", "pytest", "-m", "cuda", "-q", "-rs", "-p", "no:cacheprovider",
                       f"--junitxml={out / 'cuda_tests.xml'}", "tests"], keep, timeout_s)
    summary = next((ln.strip("= ") for ln in reversed(lines) if re.search(r"\d+ (passed|failed|skipped|error)", ln)),
                   None)
    return {"returncode": code, "summary": summary or "no result line (stopped by the time budget)"}


def bare_step_times(run: RunConfig, device: torch.device) -> list[float]:
    """The plain-PyTorch loop: model, cross-entropy, backward, AdamW step, nothing else. Same model,
    optimizer, batches, warm-up count and step timing as run_rank()."""
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


def bare_loop_vs_harness(suite: Path, rounds: int, steps: int | None = None) -> dict:
    """Same process, same model, optimizer and batches: benchsuite's measured median step vs a bare loop.
    steps: measured steps per round (the suite's when None)."""
    run = next(r for r in load_suite(suite).runs if r.workload == "dense-eager")
    if steps:
        run = replace(run, train=replace(run.train, steps=steps))
    ctx = init_distributed(run)
    harness, bare = [], []
    for _ in range(rounds):
        harness.append(run_rank(run, ctx, None)[0].step_times_s)
        bare.append(bare_step_times(run, ctx.device))
    h = statistics.median(statistics.median(t) for t in harness)
    b = statistics.median(statistics.median(t) for t in bare)
    return {"harness_step_s": h, "bare_step_s": b, "overhead_ratio": h / b, "rounds": rounds,
            "harness_step_times_s": harness, "bare_step_times_s": bare,
            "timing": "worker.timed_steps + StepTimer for both loops; batches on the device before the loop"}


def fmt(v, spec: str, scale: float = 1.0) -> str:
    return "—" if v is None else format(v * scale, spec)


@dataclass(frozen=True)
class Row:
    """One record's figures for the table, and the targets it misses (with by how much)."""

    workload: str
    status: str
    tokens_per_s: float | None
    mfu: float | None
    mfu_vs_ceiling: float | None
    dropped: float | None
    j_per_token: float | None
    gpu_j_per_token: float | None
    avg_w: float | None
    nvml_vs_sampled: float | None  # NVML counter / integrated power samples - 1
    window_s: float | None
    speed_valid: bool  # False: several ranks shared the GPU (their speed is not a figure)
    error: str | None
    gpu_bound: float | None = None  # the meters' bound on the first GPU's energy, ± share (energy/bounds.py)
    edges_aligned: bool | None = None  # its counter edges waited for an update (None: no counter figure)

    @classmethod
    def of(cls, r: dict) -> Row:
        m = r.get("metrics") or {}
        e = m.get("energy") or {}
        energy = r.get("energy") or {}
        dev = (energy.get("per_device") or [{}])[0]
        cross = dev["energy_j"] / dev["sampled_energy_j"] - 1 if dev.get("energy_j") and dev.get("sampled_energy_j") \
            else None
        err = r.get("error") or {}
        world = r["config"].get("world_size", 1)
        name = r["workload"] + (f" w{world}" if world > 1 else "")
        measured = dev.get("source") == "measured"
        return cls(name, r["status"], m.get("tokens_per_s"), m.get("mfu"), m.get("mfu_vs_ceiling"),
                   (m.get("moe") or {}).get("dropped_frac"), e.get("j_per_token"), e.get("gpu_j_per_token"),
                   e.get("avg_w_per_device"), cross, energy.get("window_s"), m.get("speed_valid", True) is not False,
                   f"{err.get('type')}: {str(err.get('message'))[:200]}" if r["status"] != "ok" else None,
                   (dev.get("bound") or {}).get("share"),
                   (dev.get("detail") or {}).get("counter_edge_s") is not None if measured else None)

    def misses(self) -> list[str]:
        target = TARGETS.get(self.workload, Target())
        out = []
        if target.mfu is not None and self.mfu is not None and self.mfu < target.mfu:
            out.append(f"MFU {self.mfu:.1%} < {target.mfu:.0%} by {(target.mfu - self.mfu) * 100:.1f} pp")
        if target.max_dropped is not None and self.dropped is not None and self.dropped > target.max_dropped:
            out.append(f"dropped {self.dropped:.1%} > {target.max_dropped:.0%} by "
                       f"{(self.dropped - target.max_dropped) * 100:.1f} pp")
        if self.nvml_vs_sampled is not None and self.window_s is not None and self.window_s >= NVML_MIN_WINDOW_S \
                and abs(self.nvml_vs_sampled) > NVML_AGREEMENT:
            out.append(f"NVML vs sampled {self.nvml_vs_sampled:+.2%} on {self.window_s:.1f} s, beyond "
                       f"±{NVML_AGREEMENT:.0%} by {(abs(self.nvml_vs_sampled) - NVML_AGREEMENT) * 100:.2f} pp")
        if self.edges_aligned is False:
            out.append("NVML counter edges not aligned to an update (the counter did not move within 0.25 s)")
        return out


def table(records: list[dict], overhead: dict | None, tests: dict | None, info: dict) -> str:
    head = (f"{'workload':<26}{'status':<8}{'tok/s':>10}{'anchor':>10}{'MFU':>8}{'anchor':>8}{'target':>8}"
            f"{'MFU/ceil':>9}{'dropped':>9}{'mJ/tok':>8}{'GPU mJ/tok':>11}{'anchor':>8}{'avg W':>7}"
            f"{'NVML vs sampled':>17}{'window':>8}{'GPU ±':>7}")
    lines = [f"GPU: {info.get('gpu') or 'none'} · driver {info.get('driver') or '—'} · torch {info['torch']} · "
             f"CUDA {info.get('cuda') or '—'} · {info['date']}", head, "-" * len(head)]
    rows = [Row.of(r) for r in sorted(records, key=lambda r: (CHECK.index(r["workload"]) if r["workload"] in CHECK
                                                              else len(CHECK), r["config"].get("world_size", 1)))]
    for row in rows:
        a_tps, a_mfu, a_mj = REFERENCE.get(row.workload, (None, None, None))
        target = TARGETS.get(row.workload, Target())
        lines.append(
            f"{row.workload:<26}{row.status:<8}{fmt(row.tokens_per_s, ',.0f'):>10}{fmt(a_tps, ',.0f'):>10}"
            f"{fmt(row.mfu, '.1%'):>8}{fmt(a_mfu, '.1%'):>8}{fmt(target.mfu, '.0%'):>8}"
            f"{fmt(row.mfu_vs_ceiling, '.1%'):>9}{fmt(row.dropped, '.1%'):>9}{fmt(row.j_per_token, '.2f', 1e3):>8}"
            f"{fmt(row.gpu_j_per_token, '.2f', 1e3):>11}{fmt(a_mj, '.2f'):>8}{fmt(row.avg_w, '.0f'):>7}"
            f"{fmt(row.nvml_vs_sampled, '+.2%'):>17}{fmt(row.window_s, '.1f'):>7}s{fmt(row.gpu_bound, '.1%'):>7}")
        if row.error:
            lines.append(f"    error: {row.error}")
        if not row.speed_valid:
            lines.append("    ranks shared the one GPU (gloo): a correctness and memory run, its speed is not a figure")
    ran = {r["workload"] for r in records}
    missing = [w for w in CHECK if w not in ran]
    if missing:
        lines.append(f"not run (time budget or the suite stopped first): {', '.join(missing)}")
    ceil = next((r["metrics"]["matmul_ceiling_tflops"] for r in records if r.get("metrics")), None)
    lines.append(f"matmul ceiling (measured): {fmt(ceil, '.3g')} TFLOP/s   (reference: 660-666 on an H200)")
    lines.append("MFU: model FLOPs without recompute / peak (989.4 TFLOP/s bf16 on an H200); mJ/tok: GPU + CPU + "
                 "DRAM (CPU/DRAM may be estimated); GPU mJ/tok: NVML GPU counter alone (the reference's figure); dropped: "
                 "share of token-expert assignments over capacity; GPU ±: the meters' bound on the first GPU's energy "
                 "(docs/explanation/energy.md)")
    misses = [f"{row.workload}: {m}" for row in rows for m in row.misses()]
    if overhead:
        lines.append(f"harness overhead: benchsuite {overhead['harness_step_s'] * 1e3:.2f} ms vs bare loop "
                     f"{overhead['bare_step_s'] * 1e3:.2f} ms per step → ratio {overhead['overhead_ratio']:.4f} "
                     f"(target ≤ {MAX_OVERHEAD}; median of {overhead['rounds']} interleaved rounds)")
        if overhead["overhead_ratio"] > MAX_OVERHEAD:
            misses.append(f"harness overhead {overhead['overhead_ratio']:.4f} > {MAX_OVERHEAD} by "
                          f"{(overhead['overhead_ratio'] - MAX_OVERHEAD) * 100:.2f} pp")
    else:
        lines.append("harness overhead: not run (time budget)")
    lines.append(f"CUDA tests (pytest -m cuda): {tests['summary'] if tests else 'not run (time budget)'}")
    short = [row.workload for row in rows if row.window_s is not None and row.window_s < NVML_MIN_WINDOW_S
             and row.nvml_vs_sampled is not None]
    if short:
        lines.append(f"NVML vs sampled not held to ±{NVML_AGREEMENT:.0%} (window under {NVML_MIN_WINDOW_S:g} s): "
                     f"{', '.join(short)}")
    lines.append("targets missed: " + ("; ".join(misses) if misses else "none of those measured"))
    return "\n".join(lines)


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds > 0 (e.g. --budget-s 420)")
    return value


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="CPU dry run: tiny models, no compile")
    p.add_argument("--out", default=os.environ.get("OUT") or "results/gpu_check")
    p.add_argument("--budget-s", type=positive_seconds, default=None,
                   help="seconds for the whole check (default 430 on a GPU, 1200 with --tiny)")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    budget = Budget(args.budget_s or (1200.0 if args.tiny else 430.0))
    log = Log(out / "gpu_check.log")
    info = versions()
    write(out / "versions.json", json.dumps(info, indent=1))
    records: list[dict] = []
    overhead = tests = None

    def write_table() -> str:
        report = table(records, overhead, tests, info)
        write(out / "gpu_check_table.txt", report + "\n")
        return report

    with tempfile.TemporaryDirectory() as tmp:
        suite = suite_file(args.tiny, Path(tmp))
        log(f"suite:\n{suite.read_text()}")
        run_logged([sys.executable, "-m", "benchsuite.cli", "run", str(suite), "--out", str(Path(tmp) / "records"),
                    "--no-resume"], log, budget.left() - sum(RESERVE_S.values()))
        # as documents: the table reads them as gpu_check_records.json holds them
        records = [to_dict(one.record) for one in load_records(Path(tmp) / "records")]
        write(out / "gpu_check_records.json", json.dumps(records, indent=1))
        write_table()
        tests = cuda_tests(out, log, budget.left() - RESERVE_S["overhead"])
        write_table()
        if budget.left() > 0:
            log("harness overhead: run_rank() vs bare loop, interleaved")
            overhead = bare_loop_vs_harness(suite, rounds=1 if args.tiny else 2,
                                            steps=None if args.tiny else OVERHEAD_STEPS)
            write(out / "gpu_check_overhead.json", json.dumps(overhead, indent=1))
    log("\n" + write_table())
    ok = bool(records) and all(r["status"] == "ok" for r in records) and tests["returncode"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
