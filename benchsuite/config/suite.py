"""A suite file read into runs: its [suite] header, its workloads over the layers under them, their sweeps
expanded (at most MAX_RUNS, counted before anything is expanded), every problem of the file reported together.

One pass finds every problem: a refused value is built as its default and every check that reads it is
skipped, so no problem hides another and none is a consequence of another. The checks that open files run
after parsing, over the same draft (preflight.py).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchsuite.config.merging import Layers, read_layers
from benchsuite.config.names import name_problem, name_skeleton, nfc
from benchsuite.config.problems import ConfigError, Problems, qkey, show
from benchsuite.config.rules import check_run
from benchsuite.config.run import RunConfig
from benchsuite.config.sinks import Sinks, read_sinks
from benchsuite.record.sections import CarbonConfig
from benchsuite.config.sweeps import expand, run_count, workload_sweep
from benchsuite.config.workload import WorkloadDraft, read_workload

TOP_KEYS = {"suite", "defaults", "workload", "sweep", "energy", "carbon", "sinks"}
MAX_RUNS = 4096  # runs one suite may expand to: a benchmark plan has thousands at most, a runaway sweep millions
MAX_SUITE_BYTES = 1 << 20  # a suite is a few KB; a larger file is not one


@dataclass
class Suite:
    name: str
    description: str
    path: str
    runs: list[RunConfig]
    sinks: Sinks = Sinks()  # the trackers each run's record is sent to (never part of a run)


@dataclass
class Draft:
    """A suite as parsed, before it is accepted: its runs, every problem found (the collector's top level
    holds the suite-level refusals), its own [carbon] and each workload as read, which the checks that run
    after parsing read (preflight.py)."""

    suite: Suite
    problems: Problems
    carbon: CarbonConfig
    workloads: list[WorkloadDraft] = field(default_factory=list)

    def accept(self) -> Suite:
        """The suite, or a ConfigError listing every problem found."""
        self.problems.raise_any(self.suite.path)
        return self.suite


@dataclass
class _Tally:
    """What the workloads of one suite add up to: the runs counted (expanded or not), whether the suite's
    routing list applied to one, and the workload names seen (skeleton -> index and name)."""

    runs: int = 0
    routing_swept: bool = False
    names: dict[str, tuple[int, str]] = field(default_factory=dict)


def _header(suite: Any, stem: str, problems: Problems) -> tuple[str, str]:
    """The suite's name (the file's stem unless given) and description."""
    if not isinstance(suite, dict):
        problems.add("suite", "expected a table")
        suite = {}
    for key in suite:
        if key not in ("name", "description"):
            problems.add(f"suite.{qkey(key)}", "unknown key; valid keys: name, description")
    name = suite.get("name", stem)
    if not isinstance(name, str) or not name.strip():
        problems.add("suite.name", "expected a non-empty string")
        name = "suite"
    elif name_problem(name):
        problems.add("suite.name", name_problem(name))
    description = suite.get("description", "")
    if not isinstance(description, str):
        problems.add("suite.description", "expected a string")
        description = ""
    return nfc(name), description


def _workload_tables(workloads: Any, problems: Problems) -> list:
    if workloads is None:
        problems.add("workload", "no [[workload]] defined; add at least one")
        return []
    if not isinstance(workloads, list):
        problems.add("workload", "expected an array of tables ([[workload]])")
        return []
    return workloads


def _workload_name(raw: dict, i: int, tally: _Tally, problems: Problems) -> str:
    """The workload's name, refused when missing, unreadable or one a person cannot tell from another's."""
    name = raw.get("name")
    if not isinstance(name, str) or not name.strip():
        problems.add(f"workload[{i}].name", "every workload needs a non-empty string name")
        name = f"workload{i}"
    elif name_problem(name):
        problems.add(f"workload[{i}].name", name_problem(name))
    name = nfc(name)
    if name_skeleton(name) in tally.names:
        j, other = tally.names[name_skeleton(name)]
        problems.add(f"workload[{i}].name", (f"duplicate workload name {show(name)}" if other == name else
                                             f"workload name {show(name)} cannot be told apart from {show(other)} "
                                             f"(workload[{j}]): they differ only by case, Unicode normalisation "
                                             f"or compatibility forms; rename one"))
    tally.names.setdefault(name_skeleton(name), (i, name))
    return name


def _add_runs(draft: Draft, w: WorkloadDraft, layers: Layers, tally: _Tally) -> None:
    """The workload's runs, each checked at its world size; only counted once the suite is over MAX_RUNS."""
    sweep, swept = workload_sweep(layers.sweep, w.sweep, w.sections, w.origins, w.problems)
    tally.routing_swept |= swept
    tally.runs += run_count(sweep)
    if tally.runs > MAX_RUNS:
        return  # never expanded: the count alone is reported
    suite = draft.suite
    for ws, nodes, scaling, sections in expand(sweep, w.sections):
        run = RunConfig(suite=suite.name, workload=w.name, kind=w.kind, description=w.description or suite.description,
                        world_size=ws, nodes=nodes, scaling=scaling, sweep_id=f"{suite.name}/{w.name}/{scaling}",
                        **sections)
        check_run(run, w.problems)
        suite.runs.append(run)


def _suite_wide(tables: list, layers: Layers, tally: _Tally, problems: Problems) -> None:
    """What only the whole suite shows: inherited keys that took effect nowhere, a routing list that applied
    to no workload, and a sweep over MAX_RUNS."""
    if any(isinstance(raw, dict) for raw in tables):
        layers.inherited.report(problems)
        if "routing" in layers.sweep and not tally.routing_swept:
            problems.add("sweep.routing", "applies to no workload of this suite: it needs kind = \"moe\" with a "
                                          "token-choice router, so it changes nothing; remove it")
    if tally.runs > MAX_RUNS:
        problems.add("sweep", f"the suite would expand to {tally.runs} runs (world_size × nodes × scaling × seed × "
                              f"routing of each workload), more than the limit of {MAX_RUNS}; shorten the sweep "
                              f"lists or split the suite into several files")


def read_suite(doc: dict, path: str | Path = "<string>") -> Draft:
    """A parsed TOML document checked and expanded into runs, with every problem found (none raised)."""
    problems = Problems()
    for key in doc:
        if key not in TOP_KEYS:
            problems.add(qkey(key), f"unknown top-level key; valid keys: {', '.join(sorted(TOP_KEYS))}")
    name, description = _header(doc.get("suite", {}), Path(str(path)).stem, problems)
    layers = read_layers(doc, problems)
    sinks = read_sinks(doc.get("sinks"), problems)
    draft = Draft(Suite(name=name, description=description, path=str(path), runs=[], sinks=sinks), problems,
                  layers.carbon)
    tables, tally = _workload_tables(doc.get("workload"), problems), _Tally()
    for i, raw in enumerate(tables):
        if not isinstance(raw, dict):
            problems.add(f"workload[{i}]", f"expected a table ([[workload]]), got {type(raw).__name__}")
            continue
        wname = _workload_name(raw, i, tally, problems)
        w = read_workload(raw, wname, layers, problems.at(f"workload[{i}] ({wname})", set(layers.unreadable)))
        draft.workloads.append(w)
        _add_runs(draft, w, layers, tally)
    _suite_wide(tables, layers, tally, problems)
    return draft


def parse_suite(doc: dict, path: str | Path = "<string>") -> Suite:
    """Validate a parsed TOML document and expand it into runs; raise ConfigError listing all problems.
    Token files and carbon places are not opened here: preflight.parse_suite adds those checks."""
    return read_suite(doc, path).accept()


def _read_text(path: Path) -> str:
    """The suite file's text; every failure is a ConfigError naming the file."""
    try:
        if path.exists() and not path.is_file():  # a FIFO or a device would block or never end
            raise ConfigError(path, [("", "cannot read file: not a regular file; pass the path of a suite .toml")])
        with path.open("rb") as f:
            data = f.read(MAX_SUITE_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError(path, [("", "file not found; pass the path of a suite .toml (see workloads/)")])
    except OSError as e:
        raise ConfigError(path, [("", f"cannot read file: {e}")])
    if len(data) > MAX_SUITE_BYTES:
        raise ConfigError(path, [("", f"cannot read file: larger than {MAX_SUITE_BYTES} bytes, "
                                      f"which no suite needs; pass the path of a suite .toml")])
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(path, [("", f"cannot read file: not UTF-8 ({e})")])


def read_suite_file(path: str | Path) -> Draft:
    """read_suite of a suite file; a file that cannot be read or is not TOML is a ConfigError naming it."""
    path = Path(path)
    text = _read_text(path)
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(path, [("", f"TOML syntax error: {e}")])
    except RecursionError:
        raise ConfigError(path, [("", "TOML syntax error: arrays or tables nested too deeply to parse; "
                                      "a suite nests them a few levels at most")])
    return read_suite(doc, path)


def load_suite(path: str | Path) -> Suite:
    """Read and validate a suite file; every failure is a ConfigError naming the file. Token files and carbon
    places are not opened here: preflight.load_suite adds those checks."""
    return read_suite_file(path).accept()
