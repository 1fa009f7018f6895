"""The reference pages' tables, generated from the code at every docs build (mkdocs.yml's `hooks:`).

A page's `<!-- reference: NAME -->` line is replaced by the table NAME names, read from what the program
itself reads: the CLI's argument parsers, the suite's section types and key rules, the record's types and the
system file's types. So the reference cannot go stale, and an option, key or field added to the code is in
the next build; a CLI option without help, or a suite key the tables below do not describe, stops the build
naming it (tests/test_docs.py builds the same text).
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import tokenize
import types
from pathlib import Path
from typing import Any, Literal, get_args, get_origin, get_type_hints

import msgspec

from benchsuite.config.specs import type_parts

MARKER = re.compile(r"^<!-- reference: ([a-z-]+) -->$", re.M)

# The suite file's keys outside the six typed sections (config/suite.py, workload.py, sweeps.py hold them as
# key sets without types): described here; a key added to those sets without a line here stops the build.
STRUCTURE = {
    "suite": "`[suite]`: `name` (text) and `description` (text) of the suite",
    "defaults": "`[defaults]`: any of the six sections' tables, merged under every `[[workload]]`, key by key",
    "workload": "`[[workload]]`: one workload; holds the keys below",
    "sweep": "`[sweep]`: the values each workload runs at (a workload's own `sweep` table overrides it)",
    "energy": "`[energy]`: the energy section for every workload (under `[defaults]` and the workload's own)",
    "carbon": "`[carbon]`: the carbon section for every workload (under `[defaults]` and the workload's own)",
    "sinks": "`[sinks]`: the trackers each run's figures and per-step loss and throughput are also sent to "
             "(MLflow, TensorBoard, W&B; each an optional extra, never required)",
}
WORKLOAD = {
    "name": "the workload's name (required; NFC, no invisible or control character, unique up to case)",
    "kind": "`\"dense\"` or `\"moe\"` (a `model.preset` sets it where not given)",
    "description": "free text, kept in the record; not part of the run's identity",
    "sweep": "this workload's own `[sweep]`, replacing the suite's",
    "model": "the section `[model]` below", "moe": "the section `[moe]` below", "train": "the section `[train]` below",
    "parallel": "the section `[parallel]` below", "energy": "the section `[energy]` below",
    "carbon": "the section `[carbon]` below",
}
SWEEP = {
    "world_size": "list of total ranks (default `[1]`)",
    "nodes": "list of node counts (default `[1]`)",
    "scaling": "`\"weak\"`, `\"strong\"` or a list of both (default `\"weak\"`)",
    "seed": "list of seeds ≥ 0, one run each (sets `train.seed`; default: `train.seed` alone)",
    "routing": "`[\"learned\", \"forced\"]`: each token-choice MoE workload both ways (sets `moe.routing`)",
}


def cell(text: Any) -> str:
    """Text fit for one table cell: no newline, pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


# -- the CLI ---------------------------------------------------------------------------------------------------

def verbs(parser: argparse.ArgumentParser, prefix: str = "benchsuite") -> list[tuple[str, str, Any]]:
    """Every verb's parser, carbon's sub-verbs included, with its one-line help, in --help's order."""
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                out.append((f"{prefix} {name}", helps.get(name) or "", sub))
                out += verbs(sub, f"{prefix} {name}")
    return out


def options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The arguments a verb documents: every one but -h and the sub-verb chooser."""
    return [a for a in parser._actions
            if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))]


def option_help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """An argument's help as --help prints it (%(default)s and %% expanded)."""
    return parser._get_formatter()._expand_help(action) if action.help else ""


def cli_reference() -> str:
    from benchsuite.cli import build_parser

    root = build_parser()
    parts = ["Every option of every verb, from the argument parsers (`benchsuite VERB --help` prints the same)."]
    missing = []
    for name, summary, parser in verbs(root):
        rows = []
        for a in options(parser):
            text = option_help(parser, a)
            if not text or a.help == argparse.SUPPRESS:
                missing.append(f"{name} {'/'.join(a.option_strings) or a.dest}")
            if a.option_strings:
                what = ", ".join(f"`{s}`" for s in a.option_strings)
                takes = ("" if a.nargs == 0 else " \\| ".join(f"`{c}`" for c in a.choices) if a.choices
                         else f"`{a.metavar or a.dest.upper()}`")
            else:  # a positional argument
                what = f"`{a.metavar or a.dest.upper()}`" + (" (optional)" if a.nargs in ("?", "*") else "")
                takes = "one or more" if a.nargs == "+" else ""
            rows.append(f"| {what} | {takes} | {cell(text)} |")
        usage = " ".join(parser.format_usage().split())[len("usage: "):]
        parts.append(f"### `{name}`\n\n{cell(summary)}\n\n```\n{usage}\n```\n")
        if rows:
            parts.append("| argument | takes | what it does |\n|---|---|---|\n" + "\n".join(rows))
    if missing:
        raise ValueError(f"CLI arguments without help (give each a help= text): {', '.join(missing)}")
    return "\n\n".join(parts)


# -- types in words ----------------------------------------------------------------------------------------

def _bounds(metas: list[msgspec.Meta]) -> str:
    limits = []
    for m in metas:
        for attr, op in (("gt", ">"), ("ge", "≥"), ("lt", "<"), ("le", "≤")):
            value = getattr(m, attr)
            if value is not None and abs(value) < 1e9:  # 32/64-bit and float-range limits say nothing to a reader
                limits.append(f"{op} {value:g}")
    return " ".join(limits)


PLAIN = {int: "integer", float: "number", str: "text", bool: "true/false"}


def type_words(t: Any) -> str:
    """A field type as a reader states it: `integer > 0`, `one of "gelu", "swiglu"`, `list of number`."""
    options_, extras = type_parts(t)
    metas = [e for e in extras if isinstance(e, msgspec.Meta)]
    words = []
    for opt in options_:
        if opt is type(None):
            continue
        if get_origin(opt) is Literal:
            values = [f"`{v!r}`".replace("'", '"') for v in get_args(opt)]
            words.append(values[0] if len(values) == 1 else "one of " + ", ".join(values))
        elif get_origin(opt) in (list, tuple):
            words.append(f"list of {type_words(get_args(opt)[0])}")
        elif get_origin(opt) is dict:
            words.append(f"map of name → {type_words(get_args(opt)[1])}")
        elif isinstance(opt, type) and issubclass(opt, msgspec.Struct):
            words.append("object (below)")
        elif isinstance(opt, type) and issubclass(opt, str) and opt is not str:  # an enum
            words.append("one of " + ", ".join(f'`"{m.value}"`' for m in opt))
        else:
            name = PLAIN.get(opt, getattr(opt, "__name__", str(opt)))
            bound = _bounds(metas) if opt in (int, float) else ""
            words.append(f"{name} {bound}".strip())
    text = " or ".join(dict.fromkeys(words))
    return f"{text} or null" if type(None) in options_ else text


def described(t: Any) -> str:
    """The descriptions a type carries (msgspec Meta) less the scalars' generic ones, which type_words says."""
    generic = {"a finite number", "a positive integer", "an integer >= 0"}
    texts = [e.description for e in type_parts(t)[1] if isinstance(e, msgspec.Meta) and e.description]
    return "; ".join(dict.fromkeys(x for x in texts if x not in generic))


def default_words(value: Any) -> str:
    if value is msgspec.NODEFAULT:
        return "required"
    if value is None:
        return "—"
    return f"`{value!r}`".replace("'", '"').replace("True", "true").replace("False", "false")


# -- suite keys ------------------------------------------------------------------------------------------

def suite_keys() -> str:
    from benchsuite.config.key_rules import BY_KEY
    from benchsuite.config.sinks import SINK_TYPES
    from benchsuite.config.suite import TOP_KEYS
    from benchsuite.config.sweeps import SWEEP_KEYS
    from benchsuite.config.workload import WORKLOAD_KEYS
    from benchsuite.record.sections import SECTIONS

    undescribed = (TOP_KEYS - STRUCTURE.keys()) | (WORKLOAD_KEYS - WORKLOAD.keys()) | (SWEEP_KEYS - SWEEP.keys())
    if undescribed:
        raise ValueError(f"suite keys without a description in docs/reference_hook.py: "
                         f"{', '.join(sorted(undescribed))}")
    parts = ["## The file\n\n" + "\n".join(f"- {STRUCTURE[k]}" for k in sorted(TOP_KEYS)),
             key_table("`[[workload]]`", WORKLOAD, WORKLOAD_KEYS), key_table("`[sweep]`", SWEEP, SWEEP_KEYS)]
    for section, cls in SECTIONS.items():
        parts.append(section_table(section, cls, BY_KEY))
    parts += [section_table(f"sinks.{name}", cls, {}) for name, cls in SINK_TYPES.items()]
    return "\n\n".join(parts)


def key_table(heading: str, described_keys: dict[str, str], keys: set[str]) -> str:
    rows = "\n".join(f"| `{k}` | {described_keys[k]} |" for k in sorted(keys))
    return f"## {heading}\n\n| key | what it is |\n|---|---|\n{rows}"


def section_table(section: str, cls: type, rules: dict) -> str:
    """One table of a suite file: each key with what it accepts, its default, its doc and where it applies."""
    hints = get_type_hints(cls, include_extras=True)
    rows = []
    for f in msgspec.structs.fields(cls):
        rule = rules.get(f"{section}.{f.name}")
        rows.append(f"| `{section}.{f.name}` | {cell(type_words(hints[f.name]))} | {cell(default_words(f.default))} "
                    f"| {cell(described(hints[f.name]))} | {cell(rule.applies_when) if rule else 'always'} |")
    return (f"## `[{section}]`\n\n| key | accepts | default | what it is | applies when |\n|---|---|---|---|---|\n"
            + "\n".join(rows))


def key_rules() -> str:
    from benchsuite.config.key_rules import table

    return table()


# -- record fields ------------------------------------------------------------------------------------------

def _comments(module: types.ModuleType) -> dict[tuple[str, str], str]:
    """The comment at the end of each field line of the module's classes: (class, field) → text."""
    source = Path(module.__file__).read_text(encoding="utf-8")
    by_line = {tok.start[0]: tok.string.lstrip("# ").strip()
               for tok in tokenize.generate_tokens(io.StringIO(source).readline) if tok.type == tokenize.COMMENT}
    out = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef):
            for stmt in node.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.end_lineno in by_line:
                    out[(node.name, stmt.target.id)] = by_line[stmt.end_lineno]
    return out


def _structs_in(t: Any) -> list[tuple[str, type]]:
    """The structs a field holds, each with how its path continues: `.` for one, `[].` in a list, `{}.` in a map."""
    options_, _ = type_parts(t)
    out = []
    for opt in options_:
        if isinstance(opt, type) and issubclass(opt, msgspec.Struct):
            out.append((".", opt))
        elif get_origin(opt) in (list, dict):
            inner = get_args(opt)[-1]
            out += [(("[]" if get_origin(opt) is list else "{}") + join, s) for join, s in _structs_in(inner)]
    return out


def record_rows() -> list[tuple[str, type, str]]:
    """Every field of the record as (path, the struct declaring it, its name), depth first in the types' order."""
    from benchsuite.record.types import Record

    rows = []

    def walk(prefix: str, cls: type) -> None:
        hints = get_type_hints(cls, include_extras=True)
        for f in msgspec.structs.fields(cls):
            rows.append((prefix + f.name, cls, f.name))
            for join, inner in _structs_in(hints[f.name]):
                walk(prefix + f.name + join, inner)

    walk("", Record)
    return rows


def record_fields() -> str:
    from benchsuite.record import sections as sections_module
    from benchsuite.record import types as types_module

    comments = _comments(types_module) | _comments(sections_module)
    blocks: dict[str, list[str]] = {}
    docs: dict[str, str] = {}
    for path, cls, name in record_rows():
        hint = get_type_hints(cls, include_extras=True)[name]
        bound = next((e for e in type_parts(hint)[1] if type(e).__name__ == "Bound"), None)
        what = "; ".join(x for x in (described(hint), comments.get((cls.__name__, name), ""),
                                     f"flagged outside its range ({bound.label})" if bound else "") if x)
        parent = path.rpartition(".")[0] or "(top level)"
        blocks.setdefault(parent, []).append(f"| `{path}` | {cell(type_words(hint))} | {cell(what)} |")
        docs.setdefault(parent, " ".join(cls.__doc__.split()) if cls.__doc__ and parent != "(top level)" else "")
    parts = []
    for parent, rows in blocks.items():
        heading = f"## `{parent}`" if parent != "(top level)" else "## The record"
        intro = f"{docs[parent]}\n\n" if docs[parent] else ""
        parts.append(f"{heading}\n\n{intro}| field | type | what it is |\n|---|---|---|\n" + "\n".join(rows))
    return "\n\n".join(parts)


# -- the system file --------------------------------------------------------------------------------------

def system_keys() -> str:
    from benchsuite.predict.system import OPTIONAL, SECTIONS

    parts = []
    for section, cls in SECTIONS.items():
        hints = get_type_hints(cls, include_extras=True)
        rows = []
        for f in msgspec.structs.fields(cls):
            key = f"{section}.{f.name}"
            text = described(hints[f.name])
            if not text:
                raise ValueError(f"system-file key without a description: {key} (give its type a doc())")
            default = f"optional, default {default_words(f.default)}" if key in OPTIONAL else "required"
            accepts = type_words(hints[f.name]).removesuffix(" or null")  # null in the type: the key is checked apart
            rows.append(f"| `{key}` | {cell(accepts)} | {default} | {cell(text)} |")
        intro = " ".join((cls.__doc__ or "").split()) + "\n\n" if cls.__doc__ else ""
        parts.append(f"## `[{section}]`\n\n{intro}| key | accepts | required | what it is |\n|---|---|---|---|\n"
                     + "\n".join(rows))
    return "\n\n".join(parts)


# -- measure() ---------------------------------------------------------------------------------------------------

def measure_reference() -> str:
    """measure()'s signature and docstring, as `help(benchsuite.measure)` shows them."""
    import inspect

    import benchsuite

    signature = f"benchsuite.measure{inspect.signature(benchsuite.measure)}".replace("'", "")  # string annotations
    return f"```python\n{signature}\n```\n\n{inspect.getdoc(benchsuite.measure)}"


GENERATORS = {"cli": cli_reference, "suite-keys": suite_keys, "key-rules": key_rules, "record": record_fields,
              "system": system_keys, "measure": measure_reference}


def render(markdown: str) -> str:
    """A page with each reference marker replaced by its generated text."""
    def table(match: re.Match) -> str:
        name = match.group(1)
        if name not in GENERATORS:
            raise ValueError(f"unknown reference marker {name!r}; known: {', '.join(GENERATORS)}")
        return GENERATORS[name]()

    return MARKER.sub(table, markdown)


def on_page_markdown(markdown: str, page, config, files) -> str:
    """mkdocs' hook: every page passes through render."""
    return render(markdown)
