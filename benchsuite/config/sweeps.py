"""A suite's sweeps: the lists a [sweep] table gives, checked before anything is expanded, and the runs of
one workload expanded from them (world size × nodes × scaling × seed × routing)."""

from __future__ import annotations

import collections
import itertools
import math
from typing import Any, Iterator

import msgspec

from benchsuite.config.problems import Problems, few, qkey
from benchsuite.record.kinds import ROUTERS
from benchsuite.record.scalars import INT_MAX

SWEEP_KEYS = {"world_size", "nodes", "scaling", "seed", "routing"}
SWEEP_DEFAULTS = {"world_size": [1], "nodes": [1], "scaling": ["weak"]}  # seed: the workload's train.seed


def _list_problem(key: str, values: list) -> str | None:
    if not values:
        return "must not be empty"
    if key in ("scaling", "routing"):
        choices = ("weak", "strong") if key == "scaling" else ("learned", "forced")
        bad = [x for x in values if x not in choices]
        if bad:
            return f"must be {' or '.join(map(repr, choices))}, got {few(bad)}"
    else:
        low = 0 if key == "seed" else 1
        bad = [x for x in values if not isinstance(x, int) or isinstance(x, bool) or not low <= x <= INT_MAX]
        if bad:
            kind = "integers >= 0" if key == "seed" else "positive integers"
            return f"expected {kind} (64-bit), got {few(bad)}"
    repeated = [x for x, n in collections.Counter(values).items() if n > 1]
    if repeated:
        return f"duplicate value(s) {few(repeated)}: each run would be launched twice; list each value once"
    return None


def sweep_lists(raw: Any, problems: Problems) -> dict[str, list]:
    """The sweep keys given in raw, each as a checked list (defaults are applied by the caller); a list that
    is refused is reported ("sweep.<key>" refused), never expanded."""
    out: dict[str, list] = {}
    if raw is None:
        return out
    if not isinstance(raw, dict):
        problems.add("sweep", "expected a table")
        problems.refused |= {f"sweep.{key}" for key in SWEEP_KEYS}
        return out
    for key, v in raw.items():
        if key not in SWEEP_KEYS:
            problems.add(f"sweep.{qkey(key)}", f"unknown key; valid keys: {', '.join(sorted(SWEEP_KEYS))}")
            continue
        values = v if isinstance(v, list) else [v]
        problem = _list_problem(key, values)
        if problem:
            problems.refuse(f"sweep.{key}", problem)
        else:
            out[key] = values
    return out


def _routings(swept: list | None, sections: dict[str, Any], origins: dict[str, str], own: dict[str, list],
              problems: Problems) -> tuple[list, bool]:
    """The routings a workload runs, and whether a sweep's routing list gave them: the list where routing
    applies (an MoE workload with a token-choice router), else its own moe.routing (None: dense)."""
    moe = sections.get("moe")
    applies = moe is not None and problems.known("kind", "moe.router") and ROUTERS[moe.router].token_choice
    if swept is None or not applies:
        if swept is not None and "routing" in own:
            problems.add("sweep.routing", "a routing list needs kind = \"moe\" with a token-choice router "
                                          "(switch, gshard, token_choice): remove it")
        return [moe.routing if moe is not None else None], False
    if origins.get("moe.routing") == "workload":
        problems.add("moe.routing", "the sweep's routing list sets each run's routing: remove moe.routing or the "
                                    "sweep's routing")
    return swept, True


def workload_sweep(suite: dict[str, list], own: dict[str, list], sections: dict[str, Any],
                   origins: dict[str, str], problems: Problems) -> tuple[dict[str, list], bool]:
    """A workload's sweep lists, its own over the suite's over the defaults (its train.seed when no seed list
    is given), and whether a routing list applied to it."""
    sweep = {**SWEEP_DEFAULTS, "seed": [sections["train"].seed], **suite, **own}
    sweep["routing"], swept = _routings(sweep.pop("routing", None), sections, origins, own, problems)
    return sweep, swept


def run_count(sweep: dict[str, list]) -> int:
    """The runs a sweep expands to, counted from its lists' lengths (nothing is expanded)."""
    return math.prod(len(v) for v in sweep.values())


def expand(sweep: dict[str, list], sections: dict[str, Any]) -> Iterator[tuple[int, int, str, dict[str, Any]]]:
    """Each run of a sweep: world size, nodes, scaling, and the sections with the run's seed and routing."""
    for ws, nodes, scaling, seed, routing in itertools.product(sweep["world_size"], sweep["nodes"], sweep["scaling"],
                                                               sweep["seed"], sweep["routing"]):
        seeded = {**sections, "train": msgspec.structs.replace(sections["train"], seed=seed)}
        if routing is not None:
            seeded["moe"] = msgspec.structs.replace(sections["moe"], routing=routing)
        yield ws, nodes, scaling, seeded
