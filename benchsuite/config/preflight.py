"""A suite's checks that open things, run after parsing and reported with its problems in one ConfigError.

They are train.data's token file (it exists, its ids are below model.vocab, it holds enough tokens for
model.seq_len) and carbon.country / carbon.region against codecarbon's offline data (a typo must not become
the world average). They sit above the rest of the config package, reading benchsuite.data and
benchsuite.energy, and below measure() (which checks its carbon= here). Every verb that runs, launches or
reads a suite (run, slurm, flops, memory, predict) loads it with `load_suite` here: the config package's,
with these checks added.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

from benchsuite.config.problems import show
from benchsuite.record.sections import CarbonConfig
from benchsuite.config.suite import Draft, Suite, read_suite, read_suite_file
from benchsuite.config.workload import WorkloadDraft
from benchsuite.energy.carbon import place_problems


PLACES = ("carbon.country", "carbon.region")


def check_carbon(carbon: CarbonConfig, refused: Collection[str], where: str,
                 problems: list[tuple[str, str]]) -> set[str]:
    """carbon.country and carbon.region against codecarbon's offline data (a mistyped place must not silently
    become the world average), each problem appended under `where`; a suite's [carbon] and measure()'s
    carbon= alike. A value refused already ("carbon.country" in `refused`) is not judged, nor a region whose
    country was refused (a region is read within its country). Returns the keys refused ("country", "region")."""
    if "carbon.country" in refused:
        return set()
    found = place_problems(carbon.country, None if "carbon.region" in refused else carbon.region)
    problems += [(f"{where}.{key}", reason) for key, reason in found]
    return {key for key, _ in found}


def _check_places(draft: Draft) -> None:
    """The suite's own [carbon] once; each workload's where it gives country or region itself (a place the
    suite's [carbon] gave and that was refused there is not judged again)."""
    top = draft.problems
    bad = check_carbon(draft.carbon, top.refused, "carbon", top.found)
    for w in draft.workloads:
        if all(w.origins.get(key) == "suite" for key in PLACES):
            continue
        inherited_bad = {f"carbon.{key}" for key in bad if w.origins.get(f"carbon.{key}") == "suite"}
        check_carbon(w.sections["carbon"], w.problems.refused | inherited_bad, w.problems.path("carbon"),
                     w.problems.found)


def _data_problem(w: WorkloadDraft) -> tuple[str, str] | None:
    """(key, reason) of the workload's token data that cannot run: a missing or unreadable file, the builtin
    corpus under a vocabulary too small for it, ids at or above model.vocab, too few tokens for model.seq_len."""
    from benchsuite import data  # only for a suite that names data: it brings torch

    train, model, problems = w.sections["train"], w.sections["model"], w.problems
    try:
        problem = data.check_data_spec(train.data)
    except (OSError, ValueError) as e:  # e.g. a folder on the path that may not be searched
        problem = f"{show(train.data)} cannot be checked: {getattr(e, 'strerror', None) or e}"
    if problem:
        return "train.data", problem.removeprefix("train.data: ")
    if train.data == "builtin" and problems.known("model.vocab") and model.vocab < data.BYTE_VOCAB:
        return "model.vocab", (f"train.data = \"builtin\" is byte-level: it needs model.vocab >= {data.BYTE_VOCAB}, "
                               f"got {model.vocab}")
    if problems.known("model.vocab", "model.seq_len"):
        try:  # what the worker checks when it opens the data: ids below model.vocab, enough tokens for seq_len
            data.make_source(train.data, model.vocab, model.seq_len, train.seed)
        except (OSError, ValueError) as e:
            return "train.data", str(e).removeprefix("train.data: ")
    return None


def _check_data(draft: Draft) -> None:
    """Each workload's train.data opened as its runs will open it (relative paths against the working
    directory, as in the worker)."""
    for w in draft.workloads:
        if w.sections["train"].data == "synthetic" or not w.problems.known("train.data"):
            continue
        found = _data_problem(w)
        if found:
            w.problems.add(*found)


def preflight(draft: Draft) -> Suite:
    """The draft's suite once the checks that open things passed too; else a ConfigError listing every
    problem, parsing's and these together."""
    _check_places(draft)
    _check_data(draft)
    return draft.accept()


def parse_suite(doc: dict, path: str | Path = "<string>") -> Suite:
    """The config package's parse_suite with the checks that open things."""
    return preflight(read_suite(doc, path))


def load_suite(path: str | Path) -> Suite:
    """The config package's load_suite with the checks that open things: what a verb that runs or reads a
    suite calls."""
    return preflight(read_suite_file(path))
