"""Helpers shared by the test modules (one place: a test module never imports another): write a suite,
run the CLI, find stray processes, spawn ranks and gather their results, read the dashboard's runs table.
Themed ones live beside: records, launcher, parallel, escaping, meters."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def per_token(run, slot_share: float = 1.0):
    """metrics.flops.flops_per_token with a RunConfig's own sections."""
    from benchsuite.metrics.flops import flops_per_token

    return flops_per_token(run.model, run.moe, micro_batch=run.micro_batch_per_rank, recompute=run.train.recompute,
                           slot_share=slot_share)


def write_suite(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    return path


def run_cli(*args: str, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """The real `benchsuite` entry point in a child process (exit codes and streams as a user sees them)."""
    return subprocess.run([sys.executable, "-m", "benchsuite.cli", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=timeout, cwd=REPO)


def processes_matching(marker: str) -> list[int]:
    """Live pids whose command line contains marker (zombies excluded: they hold no resources)."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in cmd and state != "Z":
            pids.append(int(d.name))
    return pids


TINY_SUITE = """
[suite]
name = "{name}"

[defaults]
model = {{ layers = 2, hidden = 32, heads = 2, vocab = 128, seq_len = 16 }}
train = {{ micro_batch = 2, steps = 3, warmup_steps = 2, timeout_s = {timeout} }}

[[workload]]
name = "dense"
kind = "dense"

[sweep]
world_size = {world_sizes}
"""


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn_entry(rank, world, port, fn, args):
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    fn(rank, world, *args)


def spawn(fn, world: int, *args) -> None:
    """Run fn(rank, world, *args) in `world` real processes with torchrun's environment variables."""
    import torch.multiprocessing as mp

    mp.spawn(_spawn_entry, args=(world, free_port(), fn, args), nprocs=world, join=True)


def _gather_entry(rank, world, out_dir, fn, *args):
    result = fn(rank, world, *args)
    (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(result))


def spawn_gather(fn, world: int, *args) -> list:
    """Run fn(rank, world, *args) as `spawn` does and return each rank's return value, in rank order.

    The values travel as JSON through a temporary folder (ranks are separate processes), so they come
    back as JSON makes them: tuples as lists, dict keys as strings. A rank that returned nothing fails
    here, by name, rather than as a missing file further down the test."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="spawn_gather_") as out_dir:
        spawn(_gather_entry, world, out_dir, fn, *args)
        paths = [Path(out_dir) / f"rank{rank}.json" for rank in range(world)]
        missing = [rank for rank, path in enumerate(paths) if not path.exists()]
        if missing:
            raise AssertionError(f"rank {', '.join(map(str, missing))} of {world} returned no result from "
                                 f"{fn.__name__}: it ended before the function returned (see its output above)")
        return [json.loads(path.read_text()) for path in paths]


def runs_rows(site: Path) -> list:
    """The runs table's rows, [page, status, model, note, cells], as assets/runs.js holds them."""
    text = (site / "assets" / "runs.js").read_text(encoding="utf-8")
    assert text.startswith("window.BENCHSUITE_RUNS = ") and text.endswith(";\n")
    return json.loads(text[len("window.BENCHSUITE_RUNS = "):-2])


def grouped_mm_runs_here() -> bool:
    """Whether torch._grouped_mm has a CPU kernel in this torch (the CPU tests of the grouped expert path)."""
    import torch

    try:
        torch._grouped_mm(torch.ones(2, 8), torch.ones(1, 8, 8), offs=torch.tensor([2], dtype=torch.int32))
        return True
    except (AttributeError, RuntimeError, NotImplementedError):
        return False
