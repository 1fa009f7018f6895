"""HTML building blocks shared by every page: escaping, number formats, tables, figures.

Two escaping rules, used everywhere a string from a record reaches the page:
- `esc` for HTML text and attribute values (html.escape, quotes included);
- `script_json` for JSON inside a <script> element: "<", ">" and "&" become \\u003c,
  \\u003e and \\u0026, so no string can close the element or open a comment.
Strings inside a figure (trace names, category labels, hover text) go through `ptext`:
Plotly reads them as its own small HTML subset and decodes entities back to text, so an
escaped `<img ...>` is drawn as the characters `<img ...>`, never as markup.
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass, field
from typing import Any

from benchsuite.record.sanity import finite_or_none
from benchsuite.record.values import format_step_ms, num, present

NOT_MEASURED = "not measured"


def esc(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def ptext(value: Any) -> str:
    """A user string for Plotly text (entities it decodes: &lt; &gt; &amp;)."""
    return html.escape("" if value is None else str(value), quote=False)


def short(v: float | None, digits: int = 5) -> float | None:
    """Fewer significant digits for figure data: the site stays small, the plot looks the same."""
    return None if v is None else float(f"{v:.{digits}g}")


def clean(obj: Any) -> Any:
    """JSON-ready: NaN/inf → null, numpy scalars → Python, tuples → lists, anything else → its text."""
    return finite_or_none(obj, str)


_SCRIPT_SAFE = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028",
                              "\u2029": "\\u2029"})


def script_json(obj: Any, lists: bool = False) -> str:
    """JSON that is safe inside <script type="application/json">…</script>. lists: obj is lists (and tuples) of
    text, numbers, bools and None, no dict (a data file's rows): encoded as it is where JSON takes it (the copy
    `clean` makes would give the same text; a non-finite number or any other value still goes through it)."""
    if lists:
        try:
            return json.dumps(obj, separators=(",", ":"), allow_nan=False).translate(_SCRIPT_SAFE)
        except (TypeError, ValueError):
            pass
    return json.dumps(clean(obj), separators=(",", ":"), allow_nan=False).translate(_SCRIPT_SAFE)


# -- number formats (None/NaN → an em dash) ------------------------------------------------

DASH = "—"


def f_num(v, fmt="{:,.0f}") -> str:
    v = num(v)
    return DASH if v is None else fmt.format(v)


def f_pct(v) -> str:
    return f_num(v, "{:.1%}")


def f_sig(v, digits=3) -> str:
    v = num(v)
    if v is None:
        return DASH
    if v != 0 and (abs(v) >= 1e6 or abs(v) < 1e-3):
        return f"{v:.{digits}e}"
    return f"{v:,.{digits}g}" if abs(v) < 1000 else f"{v:,.0f}"


def f_bytes(v) -> str:
    v = num(v)
    if v is None:
        return DASH
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(v) < 1024 or unit == "TiB":
            return f"{v:,.0f} {unit}" if unit == "B" else f"{v:,.2f} {unit}"
        v /= 1024
    return DASH


def f_ms(median, lo=None, hi=None) -> str:
    """Milliseconds with the CI in brackets, compact: 420.0 (407.4–436.8)."""
    return format_step_ms(num(median), num(lo), num(hi)) or DASH


_SI = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"), (1, ""), (1e-3, "m"), (1e-6, "µ"))


def f_si(v, unit: str, digits: int = 3) -> str:
    """A figure in its unit with an SI prefix, `digits` significant: 1.70 GFLOP, 33.9 mJ, 520 W."""
    v = num(v)
    if v is None:
        return DASH
    if v == 0:
        return f"0 {unit}"
    scale, prefix = next(((s, p) for s, p in _SI if abs(v) >= s), _SI[-1])
    return f"{v / scale:.{digits}g} {prefix}{unit}"


def f_count(v) -> str:
    """A count as people say it: 950, 12.3 k, 380 M, 1.20 B (parameters, tokens)."""
    v = num(v)
    if v is None:
        return DASH
    for scale, suffix in ((1e12, " T"), (1e9, " B"), (1e6, " M"), (1e3, " k")):
        if abs(v) >= scale:
            return f"{v / scale:.3g}{suffix}"
    return f"{v:,.0f}" if v == int(v) else f"{v:.3g}"


def f_duration(v) -> str:
    """Seconds as a reader wants them: 316 ms, 7.92 s, 12.5 min, 3.2 h."""
    v = num(v)
    if v is None:
        return DASH
    if abs(v) < 1:
        return f_si(v, "s")
    if abs(v) < 120:
        return f"{v:.3g} s"
    return f"{v / 60:.3g} min" if abs(v) < 7200 else f"{v / 3600:.3g} h"


# -- HTML pieces --------------------------------------------------------------------------

def missing(what: str, why: str = NOT_MEASURED) -> str:
    """The placeholder where a figure or table has no data: says what and why, never a blank."""
    return f'<div class="missing"><strong>{esc(what)}</strong>: {esc(why)}</div>'


def says_nothing(v: Any) -> bool:
    """A value with nothing to say: missing, or only dashes and separators ("—", "— / —")."""
    if isinstance(v, str):  # most values: formatted text (no pandas NA check needed)
        return not v.strip(" —/·,()")
    return not present(v)


def kv_table(rows: list[tuple[str, Any]], cls: str = "kv", empty: str = "not recorded") -> str:
    """Label/value rows, one line each (values are escaped here: pass plain strings); the rows with
    nothing to say are one last line, `empty: label, label`, not a row of "—" each."""
    said = [(k, v) for k, v in rows if not says_nothing(v)]
    silent = [k for k, v in rows if says_nothing(v)]
    if silent:
        said.append((empty, ", ".join(silent)))
    body = "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in said)
    return f'<table class="{cls}">{body}</table>'


def table(headers: list[str], rows: list[list[Any]], cls: str = "grid", drop_silent: bool = False) -> str:
    """A table with a header row, in a box that scrolls sideways. drop_silent: the columns with nothing to
    say in any row are left out, named on one line under the table."""
    silent = [i for i in range(len(headers)) if rows and all(says_nothing(r[i]) for r in rows)] if drop_silent else []
    if silent:
        kept = [i for i in range(len(headers)) if i not in silent]
        note = f'<p class="note">not recorded: {esc(", ".join(headers[i] for i in silent))}</p>'
        return table([headers[i] for i in kept], [[r[i] for i in kept] for r in rows], cls) + note
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{esc(c if present(c) else DASH)}</td>" for c in r) + "</tr>"
                   for r in rows)
    # in a box of its own that scrolls sideways: a wide table never widens the page (a 900 px window)
    return f'<div class="scroll"><table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


@dataclass
class Figure:
    """One Plotly figure as its JSON spec ({"data": [...], "layout": {...}}), built in Python;
    the page draws it with Plotly.newPlot. `id` is the element id (also what tests look up)."""
    id: str
    data: list[dict]
    layout: dict = field(default_factory=dict)

    def spec(self) -> dict:
        return {"data": self.data, "layout": self.layout}

    def div(self, cls: str = "fig") -> str:
        return f'<div class="{cls}" id="{esc(self.id)}" data-figure></div>'


# Defaults shared by every figure: they travel once, in assets/theme.js (merged into Plotly's
# "plotly_white" template at build time), not in each page's figure JSON.
TEMPLATE_LAYOUT = {"title": {"x": 0.01, "font": {"size": 15}}, "margin": {"l": 60, "r": 20, "t": 44, "b": 40},
                   "height": 360, "xaxis": {"automargin": True}, "yaxis": {"automargin": True},
                   "legend": {"orientation": "h", "yref": "container", "y": 0, "yanchor": "bottom", "x": 0}}


def merge(base: dict, over: dict) -> dict:
    """A copy of base with over's keys set, nested dicts merged key by key (Plotly layouts)."""
    out = dict(base)
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def layout(title: str, xtitle: str = "", ytitle: str = "", **extra) -> dict:
    """A figure's own layout: its title, axis titles and whatever else it sets (merged into them)."""
    return merge({"title": {"text": title}, "xaxis": {"title": {"text": xtitle}}, "yaxis": {"title": {"text": ytitle}}},
                 extra)


def log_axis(values: list, decades: float = 2) -> dict:
    """{"type": "log"} for an axis whose positive values span more than `decades` decades (energy of a
    1-device smoke run and a 64-device run), else {} (a linear axis reads best)."""
    vals = [v for v in values if v is not None and v > 0]
    return {"type": "log"} if vals and max(vals) / min(vals) > 10 ** decades else {}


def series(xs: list, ys: list) -> dict:
    """x/y of a series: x0/dx in place of an x array when x is n, n+1, n+2, … (smaller pages)."""
    if xs and all(isinstance(x, int) and x == xs[0] + i for i, x in enumerate(xs)):
        return {"x0": xs[0], "dx": 1, "y": ys}
    return {"x": xs, "y": ys}


@dataclass
class DataFile:
    """Data a page script reads, as a script of its own: assets/<name>.js sets window.<var> (pages opened
    from file:// may not fetch() a JSON file). Keeps long tables out of the page's HTML. payload: rows, lists of
    text, numbers, bools and None (no dict: script_json's lists)."""
    name: str
    var: str
    payload: list

    @property
    def path(self) -> str:
        return f"assets/{self.name}.js"

    def js(self) -> str:
        return f"window.{self.var} = {script_json(self.payload, lists=True)};\n"


@dataclass
class PageSection:
    """What a page plug-in returns: body HTML (already escaped), the figures it places and the data
    files its script reads."""
    slug: str
    title: str
    html: str
    figures: list[Figure] = field(default_factory=list)
    data_files: list[DataFile] = field(default_factory=list)


def page_html(title: str, body: str, figures: list[Figure], root: str, nav: list[tuple[str, str]],
              subtitle: str = "", data_files: list[DataFile] = ()) -> str:
    """A whole HTML document. root is the relative path to the site root ("" or "../");
    plotly.js, the theme, CSS, the page script and its data files are shared files under assets/."""
    links = "".join(f'<a href="{esc(href)}">{esc(text)}</a>' for text, href in nav)
    plotly = f'<script src="{root}assets/plotly.min.js"></script><script src="{root}assets/theme.js"></script>' \
        if figures else ""
    specs = script_json({f.id: f.spec() for f in figures}) if figures else "{}"
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)} · benchsuite</title>"
        f'<link rel="stylesheet" href="{root}assets/dashboard.css">{plotly}</head>\n'
        f'<body><header><a class="brand" href="{root}index.html">benchsuite</a><nav>{links}</nav></header>\n'
        f'<main><h1>{esc(title)}</h1>{f"<p class=sub>{esc(subtitle)}</p>" if subtitle else ""}\n{body}</main>\n'
        f'<script type="application/json" id="bs-figures">{specs}</script>\n'
        + "".join(f'<script src="{root}{esc(d.path)}"></script>' for d in data_files) +
        f'<script src="{root}assets/dashboard.js"></script></body></html>\n'
    )
