"""`make bench` runs every benchmark: each benchmarks/*.py appears in the bench target's recipe."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _variables(makefile: str) -> dict[str, str]:
    return {m[1]: m[2].strip() for m in re.finditer(r"^([A-Z_]+)\s*[:?]?=(.*)$", makefile, flags=re.M)}


def bench_recipe(makefile: str) -> list[str]:
    """The bench target's commands, with $(VAR) expanded from the Makefile's own assignments."""
    recipe = re.search(r"^bench:[^\n]*\n((?:\t[^\n]*\n)+)", makefile, flags=re.M)
    assert recipe, "Makefile: no bench target"
    variables = _variables(makefile)
    lines = [line.strip() for line in recipe[1].splitlines()]
    for _ in range(5):  # variables may name variables
        lines = [re.sub(r"\$\(([A-Z_]+)\)", lambda m: variables.get(m[1], m[0]), line) for line in lines]
    return lines


def test_every_benchmark_file_is_run_by_make_bench():
    lines = bench_recipe((REPO / "Makefile").read_text())
    run = {word for line in lines for word in line.split() if word.startswith("benchmarks/")}
    assert run == {f"benchmarks/{p.name}" for p in (REPO / "benchmarks").glob("*.py")}


def test_gpu_check_runs_only_as_its_cpu_dry_run():
    lines = bench_recipe((REPO / "Makefile").read_text())
    assert [line for line in lines if "gpu_check.py" in line] == [
        ".venv/bin/python benchmarks/gpu_check.py --tiny --out results/bench/gpu_check"]
    assert any(line.startswith(".venv/bin/python -m pytest benchmarks/test_bench_step.py --benchmark-enable")
               for line in lines)
