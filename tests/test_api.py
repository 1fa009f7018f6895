"""benchsuite.load / load_steps: the documented columns, their dtypes, NaN for what was not measured."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import benchsuite
from benchsuite.record.columns import field_columns
from benchsuite.results.api import COLUMNS, RUN_COLUMNS, STEP_COLUMNS

FIXTURES = Path(__file__).parent / "fixtures" / "results"
RESULTS_API_PAGE = Path(__file__).parents[1] / "docs" / "reference" / "results-api.md"
SMOKE_W2 = "smoke__dense-tiny__w2n1-weak__6a7938ff8f2a1420.json"  # an ok run with no energy or carbon

EXPECTED = ["run_key", "identity", "name", "seed", "repeat", "suite", "workload", "status", "kind", "router", "world_size", "nodes", "scaling", "tensor",
            "zero", "expert", "started_at", "duration_s", "tokens_per_s", "tokens_per_s_per_device", "mfu", "step_time_median_s",
            "step_time_ci95_lo_s", "step_time_ci95_hi_s", "scaling_efficiency", "scaling_baseline", "tflops_per_device",
            "model_flops_per_token", "params_active", "peak_memory_bytes", "energy_j", "gpu_energy_j",
            "energy_source", "j_per_token", "gpu_j_per_token", "gco2e_per_mtok", "co2e_g", "intensity_g_per_kwh",
            "energy_low_j", "energy_high_j", "energy_bound_share", "energy_bound_exceeds", "j_per_token_low",
            "j_per_token_high", "co2e_low_g", "co2e_high_g", "market_co2e_g", "embodied_co2e_g", "water_onsite_l",
            "water_offsite_l", "flagged", "error_type", "path",
            *(p for p in field_columns() if p.startswith(("config.", "env.")))]


def test_load_has_the_documented_columns_in_order_with_their_dtypes():
    df = benchsuite.load(FIXTURES)
    assert list(df.columns) == EXPECTED
    assert len(df) == len(list(FIXTURES.glob("*.json")))
    assert str(df["started_at"].dtype) == "datetime64[ns, UTC]"
    assert df["started_at"].min() == pd.Timestamp("2026-11-20T10:00:00Z")
    assert isinstance(df["status"].dtype, pd.CategoricalDtype)
    assert list(df["status"].cat.categories) == ["ok", "failed"]
    assert df["status"].value_counts()["failed"] == 1
    for col in ("tokens_per_s", "mfu", "j_per_token", "gco2e_per_mtok", "energy_j", "scaling_efficiency"):
        assert df[col].dtype == np.float64, col
    assert df["world_size"].dtype == pd.Int64Dtype() and df["flagged"].dtype == bool
    assert df["repeat"].tolist() == [0] * len(df)  # recorded before run --repeat: the upgrade chain's 0
    assert {c.name: str(df[c.name].dtype) for c in COLUMNS} == {c.name: c.typed()[0] for c in COLUMNS}


def test_the_column_list_is_stable_for_any_folder(tmp_path):
    """A folder whose records lack whole sections, or no records at all: the same columns and dtypes."""
    shutil.copy(FIXTURES / SMOKE_W2, tmp_path)
    full, sparse, empty = benchsuite.load(FIXTURES), benchsuite.load(tmp_path), benchsuite.load(tmp_path / SMOKE_W2)
    (tmp_path / "none").mkdir()
    nothing = benchsuite.load(tmp_path / "none")
    for df in (sparse, empty, nothing):
        assert list(df.columns) == EXPECTED
        assert (df.dtypes == full.dtypes).all()
    assert len(nothing) == 0 and len(empty) == 1


def test_missing_figures_are_nan_not_zero(tmp_path):
    shutil.copy(FIXTURES / SMOKE_W2, tmp_path)  # CPU run: no MFU; written before energy was recorded
    row = benchsuite.load(tmp_path).iloc[0]
    for col in ("mfu", "j_per_token", "gco2e_per_mtok", "energy_j", "co2e_g", "gpu_j_per_token"):
        assert np.isnan(row[col]), col
    assert row["tokens_per_s"] == pytest.approx(json.loads((FIXTURES / SMOKE_W2).read_text())["metrics"]
                                                ["tokens_per_s"])
    assert pd.isna(row["energy_source"])


def test_load_steps_one_row_per_measured_step():
    steps = benchsuite.load_steps(FIXTURES)
    records = [json.loads(p.read_text()) for p in FIXTURES.glob("*.json")]
    assert list(steps.columns) == [c.name for c in STEP_COLUMNS] == [
        "run_key", "name", "suite", "workload", "path", "step", "time_s", "loss", "tokens", "val_loss"]
    assert len(steps) == sum(len(r.get("steps") or []) for r in records)
    rec = json.loads((FIXTURES / "make_dense-q.json").read_text())
    mine = steps[steps["path"] == str(FIXTURES / "make_dense-q.json")]
    assert mine["time_s"].tolist() == [s["time_s"] for s in rec["steps"]]
    assert mine["val_loss"].isna().sum() == sum("val_loss" not in s for s in rec["steps"]) > 0
    assert steps["time_s"].dtype == np.float64 and steps["step"].dtype == pd.Int64Dtype()
    # the record's columns: categorical (each record's text once), each step's its own record's, as load() has it
    records = benchsuite.load(FIXTURES).set_index("path")
    of_record = records.loc[steps["path"].astype(str)]
    for column in ("run_key", "name", "suite", "workload", "path"):
        assert steps[column].dtype == "category", column
    for column in ("run_key", "name", "suite", "workload"):
        assert steps[column].astype(str).tolist() == of_record[column].astype(str).tolist(), column


@pytest.mark.parametrize("loader", [benchsuite.load, benchsuite.load_runs, benchsuite.load_steps])
def test_a_folder_whose_every_file_is_skipped_gives_the_columns_and_no_rows(loader, tmp_path):
    (tmp_path / "not-a-record.json").write_text('{"x": 1}')
    with pytest.warns(UserWarning, match="not-a-record.json"):
        frame = loader(tmp_path)
    assert frame.empty and len(frame.columns) > 0


def test_missing_folder_is_an_error_naming_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope"):
        benchsuite.load(tmp_path / "nope")


@pytest.mark.procs
def test_import_benchsuite_stays_light():
    code = "import sys, benchsuite; print('pandas' in sys.modules, callable(benchsuite.load))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "True"]


@pytest.mark.procs
def test_a_rank_does_not_load_pandas():
    """Every rank of every run imports the worker; pandas (~0.3 s) is for readers of records only."""
    code = "import sys, benchsuite.worker; print('pandas' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split() \
        == ["False"]


def test_the_docs_document_every_column():
    section = RESULTS_API_PAGE.read_text(encoding="utf-8")
    documented = re.findall(r"^\| `([a-z0-9_]+)` \| `([^`]+)` \|", section, flags=re.M)
    record_columns = [(c.name, c.typed()[0]) for c in COLUMNS if not c.name.startswith(("config.", "env."))]
    assert documented == record_columns + [(c.name, c.typed()[0]) for c in RUN_COLUMNS]
    assert "`config.*` and `env.*`" in section  # the rest of load()'s columns, named by their dotted path


def test_throughput_per_device_is_the_records_tokens_per_s_over_its_world_in_every_frame():
    """One figure end to end: the record states it (an older record's upgrade computes it the same way),
    load() and load_runs() read it, carbon project projects from it."""
    df = benchsuite.load(FIXTURES)
    ok = df[df["tokens_per_s"].notna()]
    assert len(ok) > 5
    assert (ok["tokens_per_s_per_device"] == ok["tokens_per_s"] / ok["world_size"].astype(float)).all()
    runs = benchsuite.load_runs(FIXTURES).set_index("identity")
    for identity, group in ok.groupby("identity"):
        assert runs.loc[identity, "tokens_per_s_per_device"] == pytest.approx(group["tokens_per_s_per_device"].median())
