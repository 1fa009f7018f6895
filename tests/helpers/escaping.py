"""Checks that strings from records reach the dashboard and the terminal as text, never as markup."""

from __future__ import annotations

import unicodedata
from html.parser import HTMLParser
from pathlib import Path


class _Tags(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags, self.text = [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)


def assert_site_escapes(results: Path, site: Path, payloads: list[str]) -> None:
    """Build the dashboard for `results`; no payload appears raw in any page, no element or event
    handler came from one, and the index shows each payload's escaped text."""
    from benchsuite.dashboard import build_site

    res = build_site(results, site)
    pages = sorted(site.rglob("*.html"))
    assert len(pages) == res.records + 1
    for page in pages:
        text = page.read_text(encoding="utf-8")
        p = _Tags()
        p.feed(text)
        for s in payloads:
            assert s not in text, (page.name, s)
        for tag, attrs in p.tags:
            assert tag not in ("img", "svg", "b", "iframe", "object", "embed"), (page.name, tag)
            assert not any(k.startswith("on") for k in attrs), (page.name, tag, attrs)
            urls = [attrs.get(k) or "" for k in ("href", "src", "action", "formaction", "xlink:href")]
            assert not any(u.strip().lower().startswith(("javascript:", "data:text")) for u in urls), (page.name, attrs)
            if tag == "script":
                assert attrs.get("type") == "application/json" or attrs.get("src", "").startswith(
                    ("assets/", "../assets/")), (page.name, attrs)
    shown = "".join(t for page in pages for t in _parse_text(page.read_text(encoding="utf-8")))
    for s in payloads:
        assert s in shown, s  # the reader sees the characters, as text


def _parse_text(text: str) -> list[str]:
    p = _Tags()
    p.feed(text)
    return p.text


def assert_terminal_safe(text: str) -> None:
    """No terminal control sequence (ESC, BEL, C1 controls) from a record reaches the terminal."""
    bad = [hex(ord(c)) for c in text if unicodedata.category(c) == "Cc" and c not in "\n\t"]
    assert not bad, f"control characters in terminal output: {bad}"
