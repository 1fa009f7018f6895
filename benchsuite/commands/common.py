"""What every verb shares: the two consoles, bad input as UsageError, numeric option types, the
output-path checks, the options two verbs share (`--json`, `--repeat`) with their one rule, and the one
results-folder loader."""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec
from rich.console import Console

from benchsuite.config import MAX_RUNS
from benchsuite.terminal import printable

if TYPE_CHECKING:  # the store loads on first use: a verb that reads no record never imports it
    from benchsuite.results.store import Loaded

# Every user string reaches these through benchsuite.terminal.printable; emoji=False: a name like
# ":warning:" is shown as typed (markup=False alone still replaces emoji codes).
err = Console(stderr=True, highlight=False, emoji=False, soft_wrap=True)  # messages are never cut into lines
# Piped into a file or a CI log there is no terminal width: tables get room instead of 80 columns.
out = Console(highlight=False, emoji=False, soft_wrap=True, width=None if sys.stdout.isatty() else 200)

OUTPUT = "output path of this verb: "  # -o means this on every verb that has it

# The one `--json` option: each verb that has it lists this parser in its `parents`.
JSON = argparse.ArgumentParser(add_help=False)
JSON.add_argument("--json", action="store_true",
                  help="print one JSON document on stdout (progress and warnings go to stderr)")


class UsageError(Exception):
    """Bad command-line input: printed as one line, exit code 2."""


def number(kind: type = float, *, above: float | None = None, at_least: float | None = None,
           at_most: float | None = None):
    """An argparse `type=` for a numeric option: a finite `kind` (int or float), > `above` or >=
    `at_least`, and <= `at_most` where set. Anything else is refused by argparse with the option's
    name, exit code 2."""
    what = "an integer" if kind is int else "a finite number"
    bound = f" > {above:g}" if above is not None else f" >= {at_least:g}" if at_least is not None else ""
    bound += f" and <= {at_most:g}" if at_most is not None else ""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not math.isfinite(value) or (above is not None and not value > above) or (
                at_least is not None and not value >= at_least) or (at_most is not None and not value <= at_most):
            raise argparse.ArgumentTypeError(f"expected {what}{bound}, got {text!r}")
        return value

    return parse


def path_arg(text: str) -> str:
    """An argparse `type=` for every path argument: an empty one ('' would silently mean the current
    folder: records, a site or a script written where the command was typed) is refused, exit code 2."""
    if not text:
        raise argparse.ArgumentTypeError("expected a path, got '' (an empty path would mean the current folder)")
    return text


_PORT, _HOST = re.compile(r"[0-9]{1,5}"), re.compile(r"[\w.:-]+")


def endpoint(text: str) -> str:
    """An argparse `type=` for --rdzv-endpoint: HOST or HOST:PORT as torchrun parses it ([an IPv6
    address] in brackets), the port 1-65535. Checked here: a bad one would fail every run in torchrun."""
    t = text.strip()
    host, sep, port = ("", "", "") if t.startswith("[") and t.endswith("]") else t.rpartition(":")
    if not sep:
        host = t
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not _HOST.fullmatch(host):
        problem = "the host must be a host name or an IP address"
    elif sep and not (_PORT.fullmatch(port) and 1 <= int(port) <= 65535):
        problem = f"the port must be an integer 1-65535, got {port!r}"
    else:
        return text
    raise argparse.ArgumentTypeError(f"expected HOST:PORT (e.g. node001:29500), got {text!r}: {problem}")


COUNT = number(int, at_least=1)  # nodes, GPUs per node, devices, data-parallel degree
INDEX = number(int, at_least=0)  # --node-rank
POSITIVE = number(above=0)  # amounts that scale a result: chips, hours, watts, tokens, TFLOP/s
PARAMS = number(at_least=1, at_most=1e18)  # a parameter count, e.g. 7.5e9; 1e18: no overflow in bytes of it
NON_NEGATIVE = number(at_least=0)  # grid intensity (0 g/kWh: a carbon-free supply)
PUE = number(at_least=1)  # facility energy / IT energy, >= 1 by definition

# The one `--repeat` option of `run` and of `slurm` (whose job passes it to run): each lists this parser in
# its `parents` and calls check_repeat, so a value one refuses the other refuses too.
REPEAT = argparse.ArgumentParser(add_help=False)
REPEAT.add_argument("--repeat", type=COUNT, default=1, metavar="N",
                    help="measure each run N times, each repeat its own record (default 1): every run once, then "
                         "every run again, so drift spreads over all runs; resume measures only missing repeats")


def check_repeat(suite, repeat: int) -> None:
    """--repeat N for this suite: its runs × N measurements within what a suite may plan (MAX_RUNS)."""
    if len(suite.runs) * repeat > MAX_RUNS:
        raise UsageError(f"--repeat {repeat}: {len(suite.runs)} runs × {repeat} is more measurements than "
                         f"a suite may plan ({MAX_RUNS}); give a smaller --repeat")


def print_json(doc) -> None:
    """The verb's one JSON document on stdout, as json.dumps(indent=2) writes it (strict, ASCII), a figure that
    overflowed float range null. Written as it is made: each item of a list or an iterator that no list holds
    (a report's runs, its verdicts' pairs) encoded and written in turn, so that a report of 100,000 runs is
    never one document in memory, as values or as text, and a reader piping it sees it start."""
    _write_items(doc, 0, sys.stdout.write)
    sys.stdout.write("\n")


def _write_items(value, depth: int, write) -> None:
    """A dict key by key and a list or iterator an item at a time (each item whole), anything else whole, at
    this depth of indentation."""
    pad = "\n" + "  " * depth
    if isinstance(value, dict) and value:
        for i, (key, v) in enumerate(value.items()):
            write(("{" if not i else ",") + pad + "  " + json.dumps(str(key)) + ": ")
            _write_items(v, depth + 1, write)
        write(pad + "}")
    elif isinstance(value, (list, tuple, Iterator)):
        empty = True
        for item in value:
            write(("[" if empty else ",") + pad + "  " + _json_text(item, depth + 1))
            empty = False
        write("[]" if empty else pad + "]")
    else:
        write(_json_text(value, depth))


def _json_text(value, depth: int) -> str:
    """One value's indented JSON: encoded compact by the standard library's C encoder (its numbers' and
    escapes' text), laid out by msgspec (whitespace alone); a value with a non-finite figure or an odd key
    made plain first (finite_or_none)."""
    from benchsuite.record.sanity import finite_or_none

    try:
        text = _COMPACT.encode(value)
    except (ValueError, TypeError):
        text = _COMPACT.encode(finite_or_none(value, str))
    return msgspec.json.format(text, indent=2).replace("\n", "\n" + "  " * depth)


def _plain(v):
    """What the JSON encoder cannot write: a numpy or pandas scalar as its Python value, anything else as text."""
    return v.item() if hasattr(v, "item") else str(v)


_COMPACT = json.JSONEncoder(separators=(",", ":"), allow_nan=False, default=_plain)


def overflowed(doc: dict, prefix: str = "") -> list[str]:
    """The dotted keys of doc (nested sections included) whose figure is not a finite number: inputs that are
    each finite but whose product leaves float range (1e308 chips x 1e308 hours)."""
    out = []
    for k, v in doc.items():
        if isinstance(v, dict):
            out += overflowed(v, f"{prefix}{k}.")
        elif isinstance(v, float) and not math.isfinite(v):
            out.append(f"{prefix}{k}")
    return out


def print_lines(lines: list[str]) -> None:
    """Text lines on stdout, each made safe for the terminal."""
    for line in lines:
        out.print(printable(line), markup=False)


def results_path(path: str | Path) -> Path:
    """A results folder (or one record file) the verb reads: a path that does not exist is bad input."""
    if not Path(path).exists():
        raise UsageError(f"{path}: no such results folder or record file "
                         f"(run `benchsuite run SUITE.toml --out {path}` first)")
    return Path(path)


def load_results(path: str | Path) -> list[Loaded]:
    """Every readable record under `path` with its file, read once by the store's safe loader (which warns
    once per file it skips)."""
    from benchsuite.results.store import load_records

    return load_records(results_path(path))


def _file_in_the_way(path: Path) -> Path | None:
    """The file (not a folder) at `path` or at the nearest existing folder above it, if any. A path that
    cannot even be looked at (a name too long, a folder not searchable) is left to the write, which names it."""
    nearest = next((p for p in (path, *path.parents) if os.path.lexists(p)), None)
    return None if nearest is None or os.path.isdir(nearest) else nearest


def make_folder(option: str, path: str | Path, what: str) -> Path:
    """The folder an option names, created if missing: a file at or above it is bad input."""
    path = Path(path)
    blocker = _file_in_the_way(path)
    if blocker is not None:
        where = "exists and is not a folder" if blocker == path else f"{blocker} is a file, not a folder"
        raise UsageError(f"{option} {path}: {where}; give a {what} (created if missing)")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"{option} {path}: cannot create the {what}: {e.strerror or e}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise UsageError(f"{option} {path}: the {what} is not writable")
    return path


def not_an_input(option: str, path: str | Path, source: str | Path) -> None:
    """Refuse an output that is the same file as the verb's input `source` (however named: a link, a
    path through another folder): writing it would destroy what the verb reads."""
    if os.path.isfile(path) and os.path.exists(source) and os.path.samefile(path, source):
        raise UsageError(f"{option} {path}: is the input {source}, which writing it would destroy; "
                         f"give another path")


def output_file(option: str, path: str | Path, what: str, source: str | Path | None = None) -> Path:
    """The file an option names, to be (over)written: not a folder, not the verb's input `source`, and its
    folder can be made."""
    path = Path(path)
    if os.path.isdir(path):
        raise UsageError(f"{option} {path}: is a folder; give the {what}'s file name")
    if source is not None:
        not_an_input(option, path, source)
    blocker = _file_in_the_way(path.parent)
    if blocker is not None:
        raise UsageError(f"{option} {path}: {blocker} is a file, not a folder; give a {what} path in a folder")
    make_folder(option, path.parent, f"folder of the {what}")
    return path
