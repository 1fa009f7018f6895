"""Suite and workload names as a person reads them: a name with a character nobody sees is refused, and two
names a person cannot tell apart are one name."""

from __future__ import annotations

import unicodedata

# Characters a reader cannot see or that move the text around: control, format (zero-width, bidi marks),
# private use, unassigned, line and paragraph separators. Two names that differ by one look the same.
INVISIBLE_CATEGORIES = ("Cc", "Cf", "Co", "Cs", "Cn", "Zl", "Zp")


def name_problem(name: str) -> str | None:
    """Why a suite or workload name cannot be read as written (None when it can): an invisible character,
    or whitespace other than a plain space."""
    for i, ch in enumerate(name):
        if unicodedata.category(ch) in INVISIBLE_CATEGORIES or (ch.isspace() and ch != " "):
            what = unicodedata.name(ch, "a control character" if unicodedata.category(ch) == "Cc" else "unnamed")
            return (f"contains an invisible or control character, U+{ord(ch):04X} ({what}) at position {i}: a name "
                    f"that differs by it looks the same; remove it")
    return None


def name_skeleton(name: str) -> str:
    """What a reader tells names apart by: compatibility forms folded (NFKC: fullwidth, ligatures), case
    folded, runs of spaces as one. Two names with one skeleton are one name to a person."""
    return " ".join(unicodedata.normalize("NFKC", name).casefold().split())


def nfc(name: str) -> str:
    """One spelling of "café", however the file's editor wrote it."""
    return unicodedata.normalize("NFC", name)
