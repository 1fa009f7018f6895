"""Strings from records, suites and the command line, made safe for a terminal.

`printable` is the one function every verb passes such a string through before it reaches the
terminal. What it leaves is plain text: print it with `markup=False`, so that a name like
`[/bold]` is shown, never parsed.
"""

from __future__ import annotations

import re

# C0 and C1 controls and DEL (ESC sequences retitle, clear or recolour a terminal; BEL, CR and
# newlines fake lines), lone surrogates (a terminal's encoder fails on them), and Unicode's
# Bidi_Control characters (U+061C, U+200E/F, U+202A–U+202E, U+2066–U+2069), which reorder
# what is shown ("Trojan Source", CVE-2021-42574).
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def _escaped(match: re.Match) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(value) -> str:
    """`value` as text for a terminal: every unsafe character shown as a \\xNN or \\uNNNN escape."""
    return _UNSAFE.sub(_escaped, str(value))



READABLE_LIMIT = 1e15  # past it, digits grouped by thousands stop being readable


def grouped(value: float, decimals: int = 0) -> str:
    """A figure with its thousands grouped (1,172,160.0), or in scientific form past 10^15: an input at the edge
    of float range would print a 300-digit number."""
    return f"{value:,.{decimals}f}" if abs(value) < READABLE_LIMIT else f"{value:.4g}"
