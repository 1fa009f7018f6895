"""The problems of one suite file, collected with their key paths and reported together in one ConfigError.

A user fixes a suite in one pass. A refused value is remembered in the collector, and every check that
reads it asks `known(...)` first: a refused value only skips the checks that read it, so no problem hides
another and none is a consequence of another.
"""

from __future__ import annotations

import json
import re
import reprlib
from dataclasses import dataclass, field
from pathlib import Path


class ConfigError(Exception):
    """All problems found in one suite file; `problems` holds (key path, reason) pairs."""

    def __init__(self, path: str | Path, problems: list[tuple[str, str]]):
        self.path = str(path)
        self.problems = problems
        lines = [f"{self.path}: {len(problems)} problem(s)"]
        lines += [f"  {key or '<file>'}: {reason}" for key, reason in problems]
        super().__init__("\n".join(lines))


_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = _SHORT.maxlong = 60
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def show(v: object) -> str:
    """A value as a problem quotes it: bounded in length and nesting, whatever the file holds."""
    return _SHORT.repr(v)


def few(values: list) -> str:
    """The first five values a problem names, and how many more there are."""
    shown = ", ".join(show(v) for v in values[:5])
    return shown + (f" (and {len(values) - 5} more)" if len(values) > 5 else "")


def qkey(key: str) -> str:
    """A key as TOML would quote it, so an empty or odd key is visible in a problem's path."""
    return key if _BARE_KEY.fullmatch(key) else json.dumps(key)


@dataclass
class Problems:
    """The (key path, reason) pairs found in one file, shared by every part of it, and the keys
    ("section.key") refused in the part being checked: a check judges only the values that were accepted."""

    where: str = ""  # the part being checked, e.g. "workload[0] (a)"; "" for the file's top level
    refused: set[str] = field(default_factory=set)
    found: list[tuple[str, str]] = field(default_factory=list)

    def path(self, key: str) -> str:
        """Where a key of this part is written: "workload[0] (a).model.heads"."""
        return f"{self.where}.{key}" if self.where and key else self.where or key

    def add(self, key: str, reason: str) -> None:
        self.found.append((self.path(key), reason))

    def refuse(self, key: str, reason: str) -> None:
        """A problem with the value of `key`: the checks that read it are skipped from now on."""
        self.add(key, reason)
        self.refused.add(key)

    def known(self, *keys: str) -> bool:
        """True when none of `keys` had its value refused: checks judge only values the user gave."""
        return self.refused.isdisjoint(keys)

    def at(self, where: str, refused: set[str] | None = None) -> Problems:
        """This collector for another part of the file: it shares this part's refused keys, or starts
        from `refused` when given."""
        return Problems(where, self.refused if refused is None else refused, self.found)

    def raise_any(self, path: str | Path) -> None:
        """Raise every problem found, each told once (a problem repeated by a sweep's runs too)."""
        if self.found:
            raise ConfigError(path, list(dict.fromkeys(self.found)))
