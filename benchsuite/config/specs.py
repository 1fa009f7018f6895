"""Field specs of suite keys (each key's default, check and doc) and a section built from a file's table.

A spec is a dataclass field made by `spec(default, check, doc)`; its metadata's "check" (None: any value of
the key's type) and "doc" are public: the README's key table, predict's system files and measure() read them.
"""

from __future__ import annotations

import math
from dataclasses import field, fields
from typing import Any, Callable, get_args, get_origin, get_type_hints

from benchsuite.config.problems import Problems, qkey, show

Check = Callable[[Any], str | None]  # a given value's problem, or None when it is fine
INT_MIN, INT_MAX = -(2**63), 2**63 - 1  # TOML integers are 64-bit


def spec(default: Any, check: Check | None = None, doc: str = "") -> Any:
    """A section's field: its default, the check of a value a file gives, and its doc."""
    return field(default=default, metadata={"check": check, "doc": doc})


def positive(v: Any) -> str | None:
    return None if v > 0 else "must be > 0"


def non_negative(v: Any) -> str | None:
    return None if v >= 0 else "must be >= 0"


def one_of(*choices: Any) -> Check:
    def check(v: Any) -> str | None:
        return None if v in choices else f"must be one of {', '.join(map(repr, choices))}"

    return check


def _type_name(t: Any) -> str:
    return getattr(t, "__name__", str(t))


def _type_problem(t: Any, v: Any) -> str | None:
    """None when v fits the annotated type t (int | None, float, str, bool)."""
    options = get_args(t) if get_origin(t) is not None else (t,)
    for opt in options:
        if opt is type(None) and v is None:
            return None
        if opt is bool and isinstance(v, bool):
            return None
        if opt is int and isinstance(v, int) and not isinstance(v, bool):
            return None if INT_MIN <= v <= INT_MAX else "out of range: TOML integers are 64-bit"
        if opt is float and isinstance(v, (int, float)) and not isinstance(v, bool):
            if isinstance(v, int) and not INT_MIN <= v <= INT_MAX:
                return "out of range: TOML integers are 64-bit"
            if isinstance(v, float) and not math.isfinite(v):
                return "must be a finite number"
            return None
        if opt is str and isinstance(v, str):
            return None
    names = " or ".join(_type_name(o) for o in options if o is not type(None))
    return f"expected {names}, got {type(v).__name__} {show(v)}"


def build_section(cls: type, raw: Any, where: str, problems: list[tuple[str, str]]) -> tuple[Any, set[str]]:
    """The section `cls` built from the valid values of `raw` (defaults for the rest), and the keys whose
    value was refused (each problem appended to `problems` under `where`): the checks that read a refused
    key are skipped, so no problem is reported about a default the user never chose."""
    known = {f.name: f for f in fields(cls)}
    if not isinstance(raw, dict):
        problems.append((where, f"expected a table, got {type(raw).__name__}"))
        return cls(), set(known)
    hints = get_type_hints(cls)
    values, refused = {}, set()
    for key, v in raw.items():
        if key not in known:
            problems.append((f"{where}.{qkey(key)}", f"unknown key; valid keys: {', '.join(known)}"))
            continue
        err = _type_problem(hints[key], v)
        if err is None and v is not None and known[key].metadata.get("check"):
            err = known[key].metadata["check"](v)
        if err:
            problems.append((f"{where}.{key}", err))
            refused.add(key)
        else:
            values[key] = float(v) if hints[key] in (float, float | None) and v is not None else v
    return cls(**values), refused


def read_section(cls: type, raw: Any, sec: str, problems: Problems) -> Any:
    """build_section for one part of the file: its problems under the part's path, its refused keys
    remembered as "sec.key"."""
    section, bad = build_section(cls, raw, problems.path(sec), problems.found)
    problems.refused |= {f"{sec}.{key}" for key in bad}
    return section
