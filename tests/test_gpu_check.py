"""benchmarks/gpu_check.py --tiny: the GPU check's whole path on CPU (tiny models, no compile)."""

import json
import subprocess
import sys

from conftest import REPO


def test_gpu_check_dry_run_prints_the_table_and_writes_records(tmp_path):
    res = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--tiny", "--out", str(tmp_path)], cwd=REPO,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    records = json.loads((tmp_path / "gpu_check_records.json").read_text())
    names = {r["workload"] for r in records}
    assert names == {"dense-eager", "dense-compiled", "switch-compiled", "gshard-compiled", "expert-choice-compiled",
                     "switch-eager"}
    assert all(r["status"] == "ok" for r in records)
    table = (tmp_path / "gpu_check_table.txt").read_text()
    assert "harness overhead" in table and "expert-choice-compiled" in table
    overhead = json.loads((tmp_path / "gpu_check_overhead.json").read_text())
    assert overhead["overhead_ratio"] == overhead["harness_step_s"] / overhead["bare_step_s"]
