"""The constrained scalars records and suites are made of: finite numbers, 64-bit integers, bounded text.

msgspec checks them when a record is decoded, and config/specs.py states them as a suite's problems, so a
value is valid in a suite file exactly when it is valid in a record.
"""

from __future__ import annotations

import datetime as dt
import sys
from typing import Annotated, Any

from msgspec import Meta

MAX_FLOAT = sys.float_info.max
INT_MIN, INT_MAX = -(2**63), 2**63 - 1  # TOML's integers and the record's are 64-bit

Num = Annotated[float, Meta(ge=-MAX_FLOAT, le=MAX_FLOAT, description="a finite number")]
Int = Annotated[int, Meta(ge=INT_MIN, le=INT_MAX)]
Count = Annotated[int, Meta(ge=1, lt=2**31, description="a positive integer")]
Index = Annotated[int, Meta(ge=0, lt=2**31, description="an integer >= 0")]
Pue = Annotated[float, Meta(ge=1.0, le=MAX_FLOAT, description="power usage effectiveness, >= 1")]
Time = Annotated[dt.datetime, Meta(tz=True, description="RFC 3339 date and time with an offset (UTC)")]
Text = Annotated[str, Meta(max_length=1_000_000)]
Name = Annotated[str, Meta(pattern=r"^[^.]+$", max_length=200, description="a key: no dots (flattened names use them)")]



def doc(value_type: Any, text: str, **extra: str) -> Any:
    """`value_type` with its doc (the JSON Schema's description; the label every view gives a figure) and, in
    `extra`, a `fix` a suite's refusal adds."""
    return Annotated[value_type, Meta(description=text, extra=extra or None)]


PositiveInt = Annotated[int, Meta(gt=0, le=INT_MAX)]
NonNegativeInt = Annotated[int, Meta(ge=0, le=INT_MAX)]
PositiveNum = Annotated[float, Meta(gt=0, le=MAX_FLOAT)]
NonNegativeNum = Annotated[float, Meta(ge=0, le=MAX_FLOAT)]
