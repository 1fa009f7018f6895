"""The `benchsuite` command: parse, call, print. Nothing here measures anything; each verb is a
module of benchsuite/commands/.

Exit codes: 0 success, 1 a run failed, 2 bad input (nothing launched) or an output that cannot be
written (named; nothing half-written is left), 130 Ctrl-C.
Under --json, stdout holds exactly one JSON document; progress and warnings go to stderr.
"""

from __future__ import annotations

import argparse
import io
import os
import signal
import sys
import warnings
from pathlib import Path

from benchsuite.atomic import OutputError
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


class _Stdout:
    """sys.stdout while a verb runs: a failed write (stdout redirected to a full disk, or past `ulimit -f`)
    is an OutputError naming where stdout goes."""

    def __init__(self, stream):
        if isinstance(getattr(stream, "buffer", None), io.RawIOBase):  # PYTHONUNBUFFERED: text written straight
            # to the file descriptor, whose short write (the disk full) the text layer would drop unseen
            raw = io.FileIO(stream.fileno(), "w", closefd=False)
            stream = io.TextIOWrapper(io.BufferedWriter(raw), stream.encoding, stream.errors, line_buffering=True)
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError as e:
            raise self._failed(e) from None

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as e:
            raise self._failed(e) from None

    def _failed(self, error: OSError) -> OutputError:
        """The error naming stdout's file; the rest of the output goes to /dev/null (left buffered, it
        would fail again at exit, with a traceback)."""
        try:
            fd = self._stream.fileno()
            where = f"stdout ({os.readlink(f'/proc/self/fd/{fd}')})"
        except (OSError, ValueError, AttributeError):  # not a file descriptor (captured), or no /proc
            return OutputError("stdout", error)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, fd)
        os.close(devnull)
        return OutputError(where, error)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def main(argv: list[str] | None = None) -> int:
    Parser.json_requested = "--json" in (sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate_like_ctrl_c)
    stdout, sys.stdout = sys.stdout, _Stdout(sys.stdout)
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _show_warning
            code = args.fn(args)
        sys.stdout.flush()  # a failure shows here, named, not at exit
        return code
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
    except OutputError as e:  # disk full, file-size limit, name too long, no permission: nothing half-written
        err.print(f"benchsuite: {printable(e)}", markup=False)
        if getattr(args, "json", False):
            print_json({"error": "output", "path": e.filename, "message": str(e)})
        return 2
    except KeyboardInterrupt:
        err.print("interrupted: completed records are kept; rerun the same command to resume")
        return 130
    finally:
        sys.stdout = stdout


if __name__ == "__main__":
    sys.exit(main())
