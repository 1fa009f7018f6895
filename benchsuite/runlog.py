"""A run's log lines: one event, written twice from one formatter.

Each event is a text line in the run's log (torchrun sends every rank's stdout there) and a JSON
object in the JSON-lines twin beside it (DIR/logs/NAME.jsonl), with the same fields:

    2026-12-02T07:55:01.123Z rank0 header workload=dense preset=none params=44608 ... device="Intel(R) Xeon(R)"
    2026-12-02T07:55:03.456Z rank0 step 3/10 loss 5.8912 tok/s 11,080 TFLOP/s 0.0024 MFU n/a ...
    {"time": "2026-12-02T07:55:03.456Z", "rank": 0, "event": "step", "step": 3, "steps": 10, "loss": 5.8912, ...}

A text line is `TIME rankN EVENT BODY`: an ISO 8601 UTC time with milliseconds, the rank, the
event (header, warm-up, step, eval, warning, error, and the run's summary last) and its body, so `grep ' rank0 step '` finds the
steps and a log shipper splits the first three fields on spaces. Torch-free: the launcher imports it.
"""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TextIO

Value = str | int | float | bool | None

HEADER, WARM_UP, STEP, EVAL, WARNING, ERROR, SUMMARY = ("header", "warm-up", "step", "eval", "warning", "error",
                                                         "summary")
LINE = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z) rank(\d+) (\S+)(?: (.*))?$")
FIX_VERBS = ("pass ", "set ", "unset ", "use ", "install ", "remove ", "add ", "rerun ", "run ")


def utc_stamp(now: datetime | None = None) -> str:
    """'2026-12-02T07:55:01.123Z': ISO 8601, UTC, milliseconds (what log shippers parse without a pattern)."""
    now = (now or datetime.now(timezone.utc)).astimezone(timezone.utc)
    return now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}Z"


def text_value(value: Value) -> str:
    """A field's value in a text line: `none` for None; quoted (JSON string) when it holds a space,
    quote or '=', so `key=value` pairs split on spaces."""
    if value is None:
        return "none"
    if isinstance(value, float):
        return f"{value:.6g}"
    text = str(value)
    return json.dumps(text) if not text or re.search(r'[\s"=]', text) else text


def key_values(fields: dict[str, Value]) -> str:
    """'workload=dense seed=0 device="Intel(R) Xeon(R)"': the header's body."""
    return " ".join(f"{k}={text_value(v)}" for k, v in fields.items())


@dataclass(frozen=True)
class LogEvent:
    """One event of a run's log: its text body (what a reader sees after the rank) and its typed fields
    (the JSON-lines object); `time` is when it was made."""

    rank: int
    event: str
    body: str
    fields: dict[str, Value]
    time: str = field(default_factory=utc_stamp)

    def text(self) -> str:
        return f"{self.time} rank{self.rank} {self.event} {self.body}"

    def json(self) -> str:
        return json.dumps({"time": self.time, "rank": self.rank, "event": self.event, **self.fields})


@dataclass(frozen=True)
class ParsedLine:
    """A text line read back from a log: TIME rankN EVENT BODY."""

    time: str
    rank: int
    event: str
    body: str

    @classmethod
    def parse(cls, line: str) -> ParsedLine | None:
        m = LINE.match(line)
        return cls(m[1], int(m[2]), m[3], m[4] or "") if m else None


def split_fix(message: str) -> tuple[str, str | None]:
    """(what happened, the fix): benchsuite's warnings end with '; <fix>' (e.g. '; pass --peak-tflops')."""
    what, sep, last = message.rpartition("; ")
    return (what, last) if sep and last.startswith(FIX_VERBS) else (message, None)


class RunLog:
    """Where one rank writes its events: stdout (the run's log) and, when the launcher named one,
    the JSON-lines twin (opened for appending, never through a symlink: every rank of the node
    appends whole lines to it)."""

    def __init__(self, rank: int, json_path: str | None = None, out: TextIO | None = None):
        self.rank, self.out = rank, out
        self._json = None
        if json_path:
            fd = os.open(json_path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)
            self._json = os.fdopen(fd, "w", buffering=1)

    def emit(self, event: str, body: str, fields: dict[str, Value]) -> LogEvent:
        e = LogEvent(self.rank, event, body, fields)
        print(e.text(), file=self.out or sys.stdout, flush=True)
        if self._json is not None:
            self._json.write(e.json() + "\n")
        return e

    def header(self, fields: dict[str, Value]) -> LogEvent:
        return self.emit(HEADER, key_values(fields), fields)

    def summary(self, fields: dict[str, Value]) -> LogEvent:
        """The run's last line: its headline figures and the record's path, as the record states them."""
        return self.emit(SUMMARY, key_values(fields), fields)

    def warning(self, message: str, category: str) -> LogEvent:
        """A Python warning as one line: the message (newlines folded) and the fix it names; no source line."""
        what, fix = split_fix(" ".join(message.split()))
        return self.emit(WARNING, what + (f" (fix: {fix})" if fix else ""),
                         {"category": category, "message": what, "fix": fix})

    def showwarning(self, message, category, filename, lineno, file=None, line=None) -> None:
        """warnings.showwarning's signature: installed in the worker so every warning is a log line."""
        self.warning(str(message), category.__name__)

    def close(self) -> None:
        if self._json is not None:
            self._json.close()
