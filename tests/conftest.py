"""Shared fixtures (a tiny suite, the reaper of a run's processes), the fast tier's guard and the skip
of the CUDA tests on a machine without a GPU. The helpers test modules import live in tests/helpers/."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import TINY_SUITE, processes_matching, write_suite

# OpenMP threads that spin while they wait hold a core the other thread of the same op, a rank of the same
# run or another process needs: on a busy 2-core box a tiny model's forward took 370 ms instead of 2 ms.
# Waiting threads sleep instead, here and in every process a test starts (they inherit the environment);
# thread counts and results are unchanged. Set before this process imports torch (libgomp reads it once).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# What a launch is: another Python (the CLI, torchrun, a rank), a shell, or a browser (Chromium, Playwright's
# driver). The programs libraries run to learn the machine (git, uname, lscpu, nvidia-smi, and the Python
# py-cpuinfo starts to read CPUID for codecarbon's power model) take milliseconds: probes, not launches.
LAUNCHED_PROGRAMS = {"torchrun", "bash", "sh", "chromium", "chrome", "node"}
CPUID_PROBE = ["-m", "cpuinfo", "--internal-cpuid"]
LAUNCH_MESSAGE = "this test launches processes: mark it procs"
NO_CUDA = "needs a CUDA device (benchmarks/gpu_check.py runs these on a GPU: pytest -m cuda)"


def pytest_collection_modifyitems(config, items):
    """Tests marked cuda skip, saying why, where torch sees no GPU."""
    import torch

    if torch.cuda.is_available():
        return
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(pytest.mark.skip(reason=NO_CUDA))


def _fast_tier(config) -> bool:
    """True when the run leaves out the tests marked procs (`make test-fast`)."""
    return "not procs" in (config.getoption("markexpr") or "")


def _is_launch(args) -> bool:
    if isinstance(args, (list, tuple)) and list(args[1:]) == CPUID_PROBE:
        return False
    program = Path(str(args if isinstance(args, (str, os.PathLike)) else args[0])).name
    return program.startswith("python") or program == Path(sys.executable).name or program in LAUNCHED_PROGRAMS


@pytest.fixture(autouse=True)
def _no_launch_in_fast_tier(request, monkeypatch):
    """In the fast tier a test that launches a process fails, naming the mark it lacks."""
    if not _fast_tier(request.config):
        return
    import torch.multiprocessing

    popen_init = subprocess.Popen.__init__

    def guarded_popen(self, args, *rest, **kwargs):
        if _is_launch(args):
            pytest.fail(f"{LAUNCH_MESSAGE} (it ran {args})")
        popen_init(self, args, *rest, **kwargs)

    def refuse(*args, **kwargs):
        pytest.fail(f"{LAUNCH_MESSAGE} (it spawned ranks)")

    monkeypatch.setattr(subprocess.Popen, "__init__", guarded_popen)
    monkeypatch.setattr(torch.multiprocessing, "spawn", refuse)
    monkeypatch.setattr(torch.multiprocessing, "start_processes", refuse)


@pytest.fixture
def tiny_suite(tmp_path):
    def make(name="tiny", world_sizes=(1,), timeout=120, extra=""):
        text = TINY_SUITE.format(name=name, world_sizes=list(world_sizes), timeout=timeout) + extra
        return write_suite(tmp_path / f"{name}.toml", text)

    return make


@pytest.fixture
def reap():
    """Kills, by pid, any process of the given run keys still alive when a test ends (pass or fail)."""
    keys: list[str] = []
    yield keys
    for key in keys:
        for pid in processes_matching(f"benchsuite-{key}"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
