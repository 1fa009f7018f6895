"""The house's layers, written down and enforced: a module imports only from its own layer or a lower one,
and no two modules import each other, directly or round a circle. Every import counts, at the top of a
file or inside a function (an import moved into a function still ties the two modules together). The
docs' layout page (docs/explanation/architecture.md) is generated from this table and the modules' docstrings,
and kept current here."""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Bottom first. A module belongs to the layer of the longest prefix that names it.
LAYERS: list[tuple[str, str, tuple[str, ...]]] = [
    ("base", "the record's types and files, and the machine's facts: nothing above them",
     ("benchsuite.record", "benchsuite.atomic", "benchsuite.terminal", "benchsuite.prctl", "benchsuite.runlog",
      "benchsuite.device", "benchsuite.nvml")),
    ("config", "suites: parsing into the record's section types, key rules, run keys",
     ("benchsuite.config",)),
    ("parts", "what a rank is made of: hardware identity, meters, data, models, the layout",
     ("benchsuite.environment", "benchsuite.energy", "benchsuite.data", "benchsuite.models",
      "benchsuite.layout", "benchsuite.suite_constants", "benchsuite.progress", "benchsuite.runlock")),
    ("preflight", "the suite checks that open files: token data, codecarbon's places",
     ("benchsuite.config.preflight",)),
    ("distributed", "process groups and meshes from torchrun's environment", ("benchsuite.dist",)),
    ("metrics", "FLOPs, memory, communication, timing, quality: figures from parts", ("benchsuite.metrics",)),
    ("parallel", "functions that parallelize a plain model", ("benchsuite.parallel",)),
    ("predict", "what a cluster would do, from the same formulas", ("benchsuite.predict",)),
    ("sinks", "trackers a written record is copied to: MLflow, TensorBoard, W&B", ("benchsuite.sinks",)),
    ("measure", "a rank's measured loop, measure() and the record assembled from them",
     ("benchsuite.assembly", "benchsuite.worker", "benchsuite.measuring", "benchsuite.adapters")),
    ("results", "readers: a folder's records, the results model and its views", ("benchsuite.results",)),
    ("dashboard", "the static site", ("benchsuite.dashboard",)),
    ("launch", "running suites: launcher, Slurm scripts", ("benchsuite.launch", "benchsuite.slurm")),
    ("cli", "the command and the package's API", ("benchsuite.commands", "benchsuite.cli", "benchsuite")),
]


def module_names(root: Path) -> dict[str, Path]:
    """Every module of the benchsuite package under root, by dotted name (a package by its own name)."""
    out = {}
    for path in sorted((root / "benchsuite").rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def layer_of(module: str) -> int:
    best = max(((len(prefix), i) for i, (_, _, prefixes) in enumerate(LAYERS) for prefix in prefixes
                if module == prefix or module.startswith(prefix + ".")), default=None)
    if best is None:
        raise AssertionError(f"{module} is in no layer: add it to tests/test_layers.py's LAYERS")
    return best[1]


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> dict[str, int]:
    """The benchsuite modules `name` imports (anywhere in the file) → the first line that does."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:  # `import benchsuite.x.y` names a module; a name in it, its module
                target = target.rpartition(".")[0]
            if target and target != name:
                found.setdefault(target, node.lineno)
    return found


def import_graph(root: Path) -> dict[str, dict[str, int]]:
    modules = module_names(root)
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def upward_imports(graph: dict[str, dict[str, int]]) -> list[str]:
    return [f"{a}:{line} imports {b} ({LAYERS[layer_of(b)][0]}, above {LAYERS[layer_of(a)][0]})"
            for a, targets in sorted(graph.items()) for b, line in targets.items() if layer_of(b) > layer_of(a)]


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Each strongly connected group of two or more modules (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, {})))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    group.append(top)
                    if top == node:
                        break
                if len(group) > 1:
                    out.append(sorted(group))
    return out


def test_no_module_imports_from_a_layer_above_its_own():
    assert upward_imports(import_graph(REPO)) == []


def test_no_import_cycles():
    assert cycles(import_graph(REPO)) == []


def test_a_planted_upward_import_or_cycle_is_caught(tmp_path):
    """The checks themselves can fail: a record module importing a reader (inside a function) is upward,
    and two config modules importing each other are a circle."""
    pkg = tmp_path / "benchsuite"
    for name, text in {"__init__.py": "", "record/__init__.py": "", "results/__init__.py": "",
                       "record/types.py": "def f():\n    from benchsuite.results import model\n",
                       "results/model.py": "",
                       "config/__init__.py": "", "config/a.py": "from benchsuite.config import b\n",
                       "config/b.py": "from . import a\n"}.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(text)
    graph = import_graph(tmp_path)
    assert upward_imports(graph) == ["benchsuite.record.types:2 imports benchsuite.results.model (results, above base)"]
    assert cycles(graph) == [["benchsuite.config.a", "benchsuite.config.b"]]


# -- the docs' layout page, generated from the table and the tree ---------------------------------------------

BEGIN, END = "<!-- layout: generated by tests/test_layers.py -->", "<!-- layout: end -->"
LAYOUT_PAGE = REPO / "docs" / "explanation" / "architecture.md"


def summary(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    first = re.split(r"(?<=[.:;])\s", " ".join(doc.split()), maxsplit=1)[0]
    return first.rstrip(".:;")


def layout_text(root: Path) -> str:
    """One table row per top-level module or package (a package by its __init__'s docstring, with its
    modules), grouped by layer, top layer first: a reader looks for the command before the record. A module
    in another layer than its package has a row of its own."""
    modules = module_names(root)
    entries: dict[int, list[tuple[str, str, list[str]]]] = {}
    for name, path in modules.items():
        parts = name.split(".")
        if len(parts) == 2:
            members = [m.split(".", 2)[2] for m in modules if m.startswith(name + ".") and m.count(".") == 2
                       and layer_of(m) == layer_of(name)]
            where = f"{path.parent.relative_to(root)}/" if path.name == "__init__.py" else str(path.relative_to(root))
            entries.setdefault(layer_of(name), []).append((where, summary(path), members))
        elif len(parts) > 2 and layer_of(name) != layer_of(".".join(parts[:2])):
            entries.setdefault(layer_of(name), []).append((str(path.relative_to(root)), summary(path), []))
    rows = ["| layer | module | what it is |", "|---|---|---|"]
    for i in reversed(range(len(LAYERS))):
        name, what, _ = LAYERS[i]
        for j, (where, text, members) in enumerate(sorted(entries.get(i, []))):
            inside = f" ({', '.join(sorted(members))})" if members else ""
            rows.append(f"| {f'**{name}**: {what}' if j == 0 else ''} | `{where}`{inside} | {text} |")
    return "\n".join(rows)


def test_the_docs_layout_table_is_the_tree():
    page = LAYOUT_PAGE.read_text(encoding="utf-8")
    assert BEGIN in page and END in page, f"{LAYOUT_PAGE} needs the markers {BEGIN} … {END}"
    head, rest = page.split(BEGIN, 1)
    current, tail = rest.split(END, 1)
    expected = layout_text(REPO)
    if os.environ.get("BENCHSUITE_UPDATE_GOLDEN") == "1" and current.strip() != expected:
        LAYOUT_PAGE.write_text(f"{head}{BEGIN}\n{expected}\n{END}{tail}", encoding="utf-8")
        pytest.skip(f"{LAYOUT_PAGE}'s layout table regenerated")
    assert current.strip() == expected, f"{LAYOUT_PAGE}'s layout table is stale: BENCHSUITE_UPDATE_GOLDEN=1 " \
                                        "regenerates it"
