"""The `benchsuite` command: parse, call, print. Nothing here measures anything; each verb is a
module of benchsuite/commands/.

Exit codes: 0 success, 1 a run failed, 2 bad input (nothing launched), 130 Ctrl-C.
Under --json, stdout holds exactly one JSON document; progress and warnings go to stderr.
"""

from __future__ import annotations

import argparse
import signal
import sys
import warnings
from pathlib import Path

from benchsuite.commands import VERBS
from benchsuite.commands.common import UsageError, err, print_json
from benchsuite.config import ConfigError
from benchsuite.terminal import printable


def package_version() -> str:
    """The installed package's version; the source tree's pyproject.toml when it is not installed."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("benchsuite")
    except PackageNotFoundError:
        import tomllib
        pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
        return tomllib.loads(pyproject.read_text())["project"]["version"]


class Parser(argparse.ArgumentParser):
    """argparse, with its messages (which quote what was typed) shown through `printable`; on a
    command line with --json, a refused argument is also the one JSON document on stdout."""

    json_requested = False  # set by main from the command line, before parsing

    def error(self, message: str):
        if Parser.json_requested:
            print_json({"error": "usage", "message": message})
        super().error(printable(message))


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="benchsuite", description="What training a transformer really costs: "
               "throughput, FLOPs/MFU, scaling, memory, energy and CO2e.")
    p.add_argument("--version", action="version", version=f"benchsuite {package_version()}",
                   help="print the version and exit")
    sub = p.add_subparsers(dest="verb", required=True)
    for verb in VERBS:
        verb.add_parser(sub)
    return p


def _terminate_like_ctrl_c(signum, frame):
    """SIGTERM (Slurm's scancel, a job's time limit) stops the suite as Ctrl-C does: the run in
    progress is recorded as interrupted and its processes are reaped."""
    raise KeyboardInterrupt


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """A warning (e.g. a skipped record, named by its file) as one line, through `printable`."""
    err.print(f"warning: {printable(message)}", markup=False)


def main(argv: list[str] | None = None) -> int:
    Parser.json_requested = "--json" in (sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate_like_ctrl_c)
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _show_warning
            return args.fn(args)
    except ConfigError as e:  # one problem a line (keys and values inside are quoted by the loader)
        err.print("\n".join(printable(line) for line in str(e).split("\n")), markup=False)
        if getattr(args, "json", False):  # a jq pipeline still gets its one document
            print_json({"error": "config", "file": e.path,
                        "problems": [{"key": key, "reason": reason} for key, reason in e.problems]})
        return 2
    except UsageError as e:
        err.print(f"benchsuite: {printable(e)}", markup=False)
        if getattr(args, "json", False):
            print_json({"error": "usage", "message": str(e)})
        return 2
    except KeyboardInterrupt:
        err.print("interrupted: completed records are kept; rerun the same command to resume")
        return 130


if __name__ == "__main__":
    sys.exit(main())
