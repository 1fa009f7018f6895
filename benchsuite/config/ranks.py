"""The ranks one node may start: refused before anything is launched rather than exhausting the host."""

from __future__ import annotations

import os

from benchsuite.config.problems import ConfigError
from benchsuite.config.run import RunConfig
from benchsuite.config.suite import Suite

# CPU ranks a node starts per usable core unless told otherwise: gloo ranks beyond a few per core only
# time-slice (each also needs memory and file descriptors), and a runaway world size would exhaust the host.
RANKS_PER_CORE = 4


def usable_cores() -> int:
    """Cores this process may run on (its affinity mask, e.g. a Slurm allocation), not the whole machine's."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def check_ranks_per_node(suite: Suite, runs: list[RunConfig], limit: int, limit_source: str) -> None:
    """Refuse, before anything is launched, runs that need more ranks on one node than `limit`
    (limit_source says where the limit comes from, for the message)."""
    problems = [(f"{r.workload} (world_size={r.world_size}, nodes={r.nodes}).sweep.world_size",
                 f"{r.nproc_per_node} ranks per node, more than this machine starts ({limit}: {limit_source}); "
                 f"lower sweep.world_size, raise sweep.nodes, or pass --max-ranks-per-node N")
                for r in runs if r.nproc_per_node > limit]
    if problems:
        raise ConfigError(suite.path, list(dict.fromkeys(problems)))
