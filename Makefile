# Two commands from a fresh clone: `make demo` and `make test` (each sets itself up).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
OUT    ?= results/smoke

.PHONY: setup demo test test-fast docs bench clean chromium gpu-wheels

$(BIN)/benchsuite: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# The CPU build of torch first, so pip never pulls a multi-GB CUDA build here.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

setup: $(BIN)/benchsuite

demo: setup
	$(BIN)/benchsuite run workloads/smoke.toml --out $(OUT)
	$(BIN)/benchsuite report $(OUT)
	$(BIN)/benchsuite dashboard $(OUT) -o $(OUT)/site

# The dashboard's browser tests drive Debian's Chromium (tests/test_dashboard_browser.py); as root
# with apt (CI, containers) it is installed here, elsewhere those tests say why they skip.
chromium:
	@if [ ! -x /usr/bin/chromium ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; fi

# Two pytest workers (pytest-xdist), each taking whole test files (--dist loadfile: a module's shared launch
# runs once): 8–9 min for the whole pass (the slowest 15 tests listed at its end) and under a minute for
# test-fast on an idle 2-core box.
# TEST_JOBS=0 runs in one process.
TEST_JOBS ?= 2
PYTEST := $(BIN)/python -m pytest -q -n $(TEST_JOBS) --dist loadfile --durations=15

test: setup chromium
	$(PYTEST)

# The documentation site (mkdocs.yml, docs/) into site/, strict: a broken link or anchor, a page missing from
# the nav or a CLI option without help fails. `make test` builds it too (tests/test_docs.py); `.[test]` holds mkdocs.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict

# Everything that runs in the pytest processes themselves (no torchrun, spawned ranks, CLI child or browser)
# and is not heavy (torch.compile). tests/conftest.py fails a test here that starts a process without the
# procs mark.
test-fast: setup
	$(PYTEST) -m "not procs and not heavy"

# Every benchmark in benchmarks/: the pytest-benchmark file, then each script in its CPU mode (the
# ones that default to CUDA on a GPU box use it there). tests/test_bench_targets.py checks that
# every benchmarks/*.py is run here.
BENCH_OUT ?= results/bench
bench: setup
	$(BIN)/python -m pytest benchmarks/test_bench_step.py --benchmark-enable -q
	$(BIN)/python benchmarks/bench_dashboard.py
	$(BIN)/python benchmarks/bench_load.py
	$(BIN)/python benchmarks/bench_measure.py
	$(BIN)/python benchmarks/bench_meter_overhead.py
	$(BIN)/python benchmarks/bench_moe.py
	$(BIN)/python benchmarks/bench_overhead.py
	$(BIN)/python benchmarks/bench_cpu_system.py
	$(BIN)/python benchmarks/bench_predict_cpu.py
	$(BIN)/python benchmarks/gpu_check.py --tiny --out $(BENCH_OUT)/gpu_check

# The packages a run imports that the GPU machine's image lacks (its Python 3.12 has torch, pandas, rich,
# psutil, nvidia-ml-py, requests), at the versions tested here, as wheels in .whl/ (ignored by git): the
# device run carries .whl and installs them first (benchmarks/NOTES.md, "Running the GPU check").
GPU_WHEELS := codecarbon pycountry rapidfuzz msgspec
gpu-wheels: setup
	rm -rf .whl
	$(BIN)/python -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
		--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
		--platform manylinux2014_x86_64 -d .whl \
		$$($(BIN)/python -m pip freeze | grep -iE '^($(shell echo $(GPU_WHEELS) | tr ' ' '|'))==')

clean:
	rm -rf $(VENV) results site .pytest_cache
