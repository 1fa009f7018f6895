"""The config package: run keys of every shipped suite unchanged by its split into modules (recorded before
it in tests/fixtures/run_keys.json), each function short, nothing imported from above it but by preflight,
and the checks that open things reported with parsing's, in one ConfigError, by every verb that reads a suite."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import tomllib

import pytest

from benchsuite import cli
from benchsuite.config import ConfigError, load_suite, parse_suite, preflight
from helpers import REPO

CONFIG = REPO / "benchsuite" / "config"
RUN_KEYS = json.loads((REPO / "tests" / "fixtures" / "run_keys.json").read_text(encoding="utf-8"))
SUITES = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "workloads").rglob("*.toml")
                if "workload" in tomllib.loads(p.read_text(encoding="utf-8")))  # system files hold no [[workload]]


def run_label(run) -> str:
    return (f"{run.workload}/w{run.world_size}n{run.nodes}/{run.scaling}/seed{run.train.seed}/"
            f"{run.moe.routing if run.moe else '-'}")


@pytest.mark.parametrize("suite", SUITES)
def test_every_shipped_suite_keeps_the_run_keys_it_had_before_the_split(suite):
    assert suite in RUN_KEYS["suites"], (f"{suite} is not in tests/fixtures/run_keys.json: record its runs' "
                                         f"keys there (run_label -> run_key with the fixture's hardware)")
    runs = load_suite(REPO / suite).runs
    assert {run_label(r): r.run_key(RUN_KEYS["hardware"]) for r in runs} == RUN_KEYS["suites"][suite]


def _functions(tree: ast.AST):
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def test_every_function_of_the_config_package_is_at_most_60_lines():
    long = [f"{path.name}:{f.lineno} {f.name} ({f.end_lineno - f.lineno + 1} lines)"
            for path in sorted(CONFIG.glob("*.py")) for f in _functions(ast.parse(path.read_text(encoding="utf-8")))
            if f.end_lineno - f.lineno + 1 > 60]
    assert long == []


def _imported(path) -> set[str]:
    """The modules a file imports, anywhere in it (relative imports resolved within benchsuite.config)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(["benchsuite", "config"][:3 - node.level] + ([base] if base else []))
            out |= {f"{base}.{a.name}" for a in node.names}
    return out


def test_only_preflight_imports_benchsuite_beyond_the_config_package_and_the_record():
    allowed = ("benchsuite.config.", "benchsuite.record.")
    above = {f"{path.name}: {name}" for path in sorted(CONFIG.glob("*.py")) if path.name != "preflight.py"
             for name in _imported(path) if name.startswith("benchsuite") and not name.startswith(allowed)}
    assert above == set()


@pytest.mark.procs
def test_importing_the_config_package_brings_neither_torch_nor_the_data_or_energy_packages():
    code = ("import sys, benchsuite.config; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch' "
            "or m.startswith(('benchsuite.data', 'benchsuite.energy', 'benchsuite.models'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "[]", out.stdout


BAD = {"carbon": {"country": "fr"},
       "workload": [{"name": "w", "train": {"data": "no/such/tokens.bin", "lr": -1.0}}]}


def test_parsing_opens_nothing_and_preflight_adds_its_problems_to_parsings_in_one_error():
    with pytest.raises(ConfigError) as parsed:
        parse_suite(BAD, "s.toml")
    assert [key for key, _ in parsed.value.problems] == ["workload[0] (w).train.lr"]
    with pytest.raises(ConfigError) as checked:
        preflight.parse_suite(BAD, "s.toml")
    assert sorted(key for key, _ in checked.value.problems) == [
        "carbon.country", "workload[0] (w).train.data", "workload[0] (w).train.lr"]


@pytest.mark.parametrize("argv", [["flops"], ["memory"], ["predict", "--system", "workloads/systems/cpu-gloo.toml"]])
def test_a_verb_that_reads_a_suite_refuses_what_run_refuses(argv, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    suite = tmp_path / "s.toml"
    suite.write_text('[carbon]\ncountry = "fr"\n[[workload]]\nname = "w"\ntrain = { data = "no/such/tokens.bin" }\n')
    assert cli.main([argv[0], str(suite), *argv[1:]]) == 2
    err = capsys.readouterr().err
    assert "carbon.country: fr: not an ISO 3166 alpha-3 code; did you mean FRA?" in err
    assert "workload[0] (w).train.data:" in err and "does not exist" in err
