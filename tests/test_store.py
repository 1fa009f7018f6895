import json
import os
import signal
import stat
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from benchsuite.record import SCHEMA_VERSION, RecordError
from benchsuite.record import write_record
from benchsuite.results.model import results_at
from benchsuite.results.store import load_records, loaded, record_files
from helpers.records import make_record





WRITER = """
import json, sys
from benchsuite.record import write_record
rec = json.load(open(sys.argv[2]))
while True:
    write_record(sys.argv[1], rec)
"""


@pytest.mark.procs
def test_killing_the_writer_mid_write_leaves_no_truncated_record(tmp_path):
    out = tmp_path / "out"
    src = tmp_path / "rec.json"
    src.write_text(json.dumps(make_record(steps=200_000)))
    for delay in (0.0, 0.05, 0.1, 0.2, 0.3):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(out), str(src)])
        deadline = time.monotonic() + 120
        while not any(out.glob("*.json")) and time.monotonic() < deadline:  # one whole write done
            time.sleep(0.02)
        time.sleep(delay)  # then kill it somewhere inside one of its next writes
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a corrupt record would warn
            recs = load_records(out)
        assert len(recs) == 1 and len(recs[0].record.steps) == 200_000
    assert len(load_records(out)) == 1
    leftovers = [p.name for p in out.iterdir() if p.suffix == ".tmp"]
    assert all(name.startswith(".") for name in leftovers)  # hidden temp files only, never loaded


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_records_get_the_permissions_a_plain_open_would_give(tmp_path, umask):
    """Results on a shared file system stay readable by the team (a temp file alone would be 0600)."""
    old = os.umask(umask)
    try:
        path = write_record(tmp_path, make_record())
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


def test_loader_skips_corrupt_and_future_files_and_names_them(tmp_path):
    write_record(tmp_path, make_record("good"))
    (tmp_path / "truncated.json").write_text(json.dumps(make_record("t"))[:50])
    (tmp_path / "future.json").write_text(json.dumps({**make_record("f"), "schema_version": SCHEMA_VERSION + 1}))
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.warns(UserWarning) as caught:
        recs = load_records(tmp_path)
    assert [r.record.run_key for r in recs] == ["good"]
    messages = " ".join(str(w.message) for w in caught)
    for name in ("truncated.json", "future.json", "list.json"):
        assert name in messages
    assert "newer than this benchsuite reads" in messages


def test_dataframe_has_headline_columns_and_scaling_efficiency(tmp_path):
    write_record(tmp_path, make_record("a1", world_size=1, tokens_per_s=100.0, step=1.0))
    write_record(tmp_path, make_record("a2", world_size=2, tokens_per_s=180.0, step=1.1))
    write_record(tmp_path, make_record("a4", world_size=4, status="failed"))
    write_record(tmp_path, make_record("s1", workload="st", world_size=1, step=1.0, scaling="strong"))
    write_record(tmp_path, make_record("s4", workload="st", world_size=4, step=0.4, scaling="strong"))
    df = results_at(tmp_path).df.set_index("run_key")
    assert df.loc["a2", "scaling_efficiency"] == pytest.approx(180 / (2 * 100))
    assert df.loc["s4", "scaling_efficiency"] == pytest.approx(1.0 / (4 * 0.4))
    assert df.loc["a1", "scaling_efficiency"] == pytest.approx(1.0)
    assert df.loc["a4", "status"] == "failed" and df.loc["a4", "error_rank"] == 1
    assert df.loc["a2", "metrics.step_time_s.median"] == pytest.approx(1.1)


def test_the_dashboard_frames_are_the_results_models_plus_labels():
    """One results model: every column of its record and run frames, in their row order, is in the
    dashboard's frames unchanged; `rec` points each row back at its record; J/token is read where the
    harness writes it."""
    import pandas as pd

    from benchsuite.results.model import results_of
    from benchsuite.dashboard.data import load
    from helpers import REPO

    records = load_records(REPO / "tests/fixtures/results")
    model, site = results_of(records), load(REPO / "tests/fixtures/results")
    pd.testing.assert_frame_equal(site.df[list(model.df.columns)], model.df)
    pd.testing.assert_frame_equal(site.runs[list(model.runs.columns)], model.runs)
    assert [records[i].record.run_key for i in model.df["rec"]] == list(model.df["run_key"])
    assert site.df["j_per_token"].equals(pd.to_numeric(site.df["metrics.energy.j_per_token"]).astype(float))

    only_elsewhere = make_record("d1")
    only_elsewhere["metrics"]["derived"] = {"j_per_token": 0.5}   # a shape the harness never wrote
    with pytest.raises(RecordError, match="derived"):  # refused by the types: never read as a figure
        loaded([only_elsewhere])


def test_a_sweep_whose_figures_are_all_null_reads_as_not_measured(tmp_path, capsys):
    """null throughput and step time in every record of a sweep (valid: not measured) once made
    scaling efficiency divide None by None, a TypeError in report and dashboard."""
    from benchsuite import cli

    for key, world in (("n1", 1), ("n2", 2)):
        rec = make_record(key, world_size=world)
        rec["metrics"].update(tokens_per_s=None, step_time_s=None)
        write_record(tmp_path, rec)
    df = results_at(tmp_path).df
    assert df["tokens_per_s"].isna().all() and df["scaling_efficiency"].isna().all()
    assert cli.main(["report", str(tmp_path), "--json"]) == 0
    assert [r["tokens_per_s"] for r in json.loads(capsys.readouterr().out)["runs"]] == [None, None]
    assert cli.main(["dashboard", str(tmp_path), "-o", str(tmp_path.parent / "site")]) == 0


@pytest.mark.parametrize("top", ["absolute", "trailing slash", "."])
def test_record_files_lists_each_path_as_path_writes_it_in_paths_order(tmp_path, monkeypatch, top):
    """The folder walked a folder at a time (no Path made per file): the same texts, in the same order, as
    sorting Path objects of every record file gives; names that sort apart as text and as parts ("a-b" before
    "a/..." as text, after it as parts) included."""
    names = ["a", "a-b", "a.b", "A", "a b", "z"]
    for i, parts in enumerate([(), ("a",), ("a-b",), ("a", "a"), ("a", "a-b"), ("a.b",), ("A", "z"), ("a b",)]):
        for name in names:
            folder = tmp_path.joinpath(*parts)
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{name}{i}.json").write_text("{}")
    (tmp_path / ".hidden").mkdir()
    (tmp_path / ".hidden" / "x.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    path = {"absolute": str(tmp_path), "trailing slash": f"{tmp_path}/", ".": "."}[top]
    listed = [p for p, problem in record_files(Path(path)) if problem is None]
    assert listed == [str(p) for p in sorted(p for p in Path(path).rglob("*.json") if ".hidden" not in p.parts)]
    assert len(listed) == 8 * len(names)
