"""A fixed CPU suite (dense at one and two ranks under ZeRO-3, Switch with expert parallelism, a two-stage
pipeline, tensor with sequence parallelism) gives the records it gave before the house was rebuilt
(tests/fixtures/golden/, written by the code of that time): field by field, every field present or null
as it was, and every value equal that does not depend on the clock, the meters or the host. Moving code
must not move a figure."""

from __future__ import annotations

import importlib.util
import json
import math
import re
from pathlib import Path

import pytest

from helpers import run_cli
from helpers.records import schema_problems

GOLDEN = Path(__file__).parent / "fixtures" / "golden"
# What a second run on the same host changes (the clock, the meters, the process's memory) and what another
# host changes (its name, CPU, software, and the run key that hashes its hardware): compared for presence only.
VOLATILE = re.compile(r"^(started_at|duration_s|run_key|env\..*|flags\[\].*|steps\[\]\.time_s|carbon\..*|energy\..*"
                      r"|metrics\.energy\..*|metrics\.(tokens_per_s|tokens_per_s_per_device|tflops_per_device|hardware_tflops_per_device"
                      r"|mfu_vs_ceiling|matmul_ceiling_tflops|matmul_ceiling_source)"
                      r"|metrics\.step_time_s\..*|metrics\.per_rank\..*|metrics\.memory\.per_rank\[\]\.peak_rss_bytes"
                      r"|metrics\.moe\.all_to_all_share|metrics\.pipeline\.bubble_(measured|per_rank\[\]))$")


def flat(value, path: str = ""):
    if isinstance(value, dict):
        for key, v in value.items():
            yield from flat(v, f"{path}.{key}" if path else key)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from flat(v, f"{path}[{i}]")
    else:
        yield path, value


def differences(before: dict, after: dict) -> list[str]:
    a, b = dict(flat(before)), dict(flat(after))
    out = [f"{k}: only {'before' if k in a else 'after'}" for k in sorted(a.keys() ^ b.keys())
           if not VOLATILE.match(re.sub(r"\[\d+\]", "[]", k))]  # a timing flag comes and goes with the timings
    for key in sorted(a.keys() & b.keys()):
        x, y = a[key], b[key]
        if (x is None) != (y is None):
            out.append(f"{key}: {x!r} before, {y!r} after")
        elif VOLATILE.match(re.sub(r"\[\d+\]", "[]", key)) or x is None:
            continue
        elif isinstance(x, float) or isinstance(y, float):  # another host's kernels may round the last bits
            if not math.isclose(x, y, rel_tol=1e-4, abs_tol=1e-12):
                out.append(f"{key}: {x!r} before, {y!r} after")
        elif x != y:
            out.append(f"{key}: {x!r} before, {y!r} after")
    return out


@pytest.mark.procs
def test_a_fixed_cpu_suite_writes_the_records_it_wrote_before(tmp_path):
    r = run_cli("run", str(GOLDEN / "suite.toml"), "--out", str(tmp_path), env={"OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    written = {f"{rec['workload']}-w{rec['config']['world_size']}": rec
               for rec in (json.loads(p.read_text()) for p in tmp_path.glob("*.json"))}
    golden = {p.stem: json.loads(p.read_text()) for p in GOLDEN.glob("*.json")}
    assert sorted(written) == sorted(golden)
    found = {name: differences(golden[name], written[name]) for name in golden}
    assert found == {name: [] for name in golden}
    # the record shapes of this suite (tensor, pipeline, expert parallel, ZeRO-3 at two ranks) against the shipped
    # JSON Schema: tests/test_record_suites.py launches only the shapes this suite does not write
    if importlib.util.find_spec("jsonschema"):  # test-only (pyproject's [test]); absent on the GPU image
        assert not schema_problems(list(written.values()))
    assert any(rec["metrics"]["pipeline"] for rec in written.values())
    assert any(rec["metrics"]["moe"] and rec["config"]["parallel"]["expert"] > 1 for rec in written.values())


def test_the_comparison_sees_a_moved_figure_a_new_field_and_a_lost_value():
    before = json.loads((GOLDEN / "dense-w2.json").read_text())
    after = json.loads(json.dumps(before))
    after["metrics"]["memory"]["model_state_bytes"]["analytic"]["total"] *= 2
    after["metrics"]["params"]["extra"] = 1
    after["metrics"]["flops"]["model_per_token"] = None
    after["metrics"]["tokens_per_s"] *= 3  # volatile: a second run on the same host differs
    assert differences(before, after) == [
        "metrics.params.extra: only after",
        f"metrics.flops.model_per_token: {before['metrics']['flops']['model_per_token']!r} before, None after",
        f"metrics.memory.model_state_bytes.analytic.total: "
        f"{before['metrics']['memory']['model_state_bytes']['analytic']['total']!r} before, "
        f"{after['metrics']['memory']['model_state_bytes']['analytic']['total']!r} after"]
