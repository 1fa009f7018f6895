"""`benchsuite export --format codecarbon`: a file codecarbon's own users can concatenate with
theirs, checked against codecarbon's own writer (EmissionsData + FileOutput, offline)."""

import csv
import dataclasses
import datetime as dt
import json
import time

import msgspec
import pandas as pd
import pytest

from benchsuite.config import CarbonConfig
from benchsuite.energy import carbon
from benchsuite.results import export
from helpers import run_cli
from helpers.records import records_of


def codecarbon_columns():
    from codecarbon.output_methods.emissions_data import EmissionsData
    return [f.name for f in dataclasses.fields(EmissionsData)]


def record(run_key="abc", workload="dense", pue=1.1, env_host=True, started_at="2025-01-01T00:00:00+00:00"):
    """An ok record: 2 ranks on one H200 (GPU 800 J, CPU 200 J over a 10 s window), France."""
    env = {"world_size": 2, "python": "3.11.7",
           "devices": [{"type": "cuda", "name": "NVIDIA H200", "uuid": "GPU-a", "rank": 0},
                       {"type": "cuda", "name": "NVIDIA H200", "uuid": "GPU-a", "rank": 1}]}
    if env_host:
        env.update(os="Linux-6.8.0-x86_64-with-glibc2.39", cpu_count=16, ram_total_gb=125.5, gpu_count=1)
    energy = {"gpu_j": 800.0, "cpu_j": 200.0, "dram_j": None, "total_j": 1000.0, "window_s": 10.0,
              "total_includes": ["gpu", "cpu"], "source": "measured",
              "per_device": [{"uuid": "GPU-a", "name": "NVIDIA H200", "energy_j": 800.0}]}
    return {"schema_version": 1, "status": "ok", "error": None, "run_key": run_key, "suite": "s",
            "workload": workload, "started_at": started_at, "duration_s": 60.0, "steps": [],
            "config": {"carbon": {"country": "FRA", "region": None, "pue": pue}, "world_size": 2,
                       "nodes": 1, "scaling": "weak"},
            "env": env, "metrics": {"tokens_per_s": 1000.0}, "energy": energy,
            "carbon": carbon.carbon_section(1000.0, CarbonConfig(country="FRA", pue=pue))}


def write_records(folder, records):
    folder.mkdir(exist_ok=True)
    for i, rec in enumerate(records):
        (folder / f"r{i}.json").write_text(json.dumps(rec))
    return folder


def codecarbon_file(folder):
    """emissions.csv as codecarbon itself writes it after a tracked run (its own classes, offline)."""
    from codecarbon.output_methods.emissions_data import EmissionsData
    from codecarbon.output_methods.file import FileOutput

    data = EmissionsData(
        timestamp=dt.datetime.now().strftime("%Y-%m-%dT%H:%M:%S"), project_name="theirs", run_id="5b0fa12a",
        experiment_id="exp", duration=120.0, emissions=0.002, emissions_rate=0.002 / 120, cpu_power=42.5,
        gpu_power=300.0, ram_power=10.0, cpu_energy=0.0014, gpu_energy=0.01, ram_energy=0.0003,
        energy_consumed=0.0117, water_consumed=0.0, country_name="France", country_iso_code="FRA", region=None,
        cloud_provider="", cloud_region="", os="Linux-6.8.0-x86_64-with-glibc2.39", python_version="3.11.7",
        codecarbon_version="3.3.2", cpu_count=16, cpu_model="AMD EPYC", gpu_count=1, gpu_model="1 x NVIDIA H200",
        longitude=None, latitude=None, ram_total_size=125.5, tracking_mode="machine")
    FileOutput("emissions.csv", str(folder)).out(data, None)
    return folder / "emissions.csv", data


def test_rows_follow_codecarbon_units_and_pue_convention():
    row = export.to_codecarbon_rows(records_of([record(), {**record(), "status": "failed"}]))
    assert len(row) == 1 and list(row[0]) == codecarbon_columns()
    row = row[0]
    # codecarbon multiplies power and energy by PUE (emissions_tracker.py: power *= self._pue)
    assert row["cpu_energy"] == pytest.approx(200.0 * 1.1 / 3.6e6) and row["cpu_power"] == pytest.approx(22.0)
    assert row["gpu_energy"] == pytest.approx(800.0 * 1.1 / 3.6e6) and row["gpu_power"] == pytest.approx(88.0)
    assert row["energy_consumed"] == pytest.approx(1000.0 * 1.1 / 3.6e6)
    assert row["ram_energy"] is None and row["ram_power"] is None            # not measured: empty, not 0
    intensity_kg_per_kwh = record()["carbon"]["intensity_g_per_kwh"] / 1000
    assert row["emissions"] / row["energy_consumed"] == pytest.approx(intensity_kg_per_kwh, rel=1e-12)
    assert (row["duration"], row["country_name"], row["country_iso_code"], row["pue"]) == (10.0, "France", "FRA", 1.1)
    assert (row["os"], row["cpu_count"], row["ram_total_size"], row["gpu_count"]) == \
        ("Linux-6.8.0-x86_64-with-glibc2.39", 16, 125.5, 1)
    assert row["gpu_model"] == "1 x NVIDIA H200"                             # codecarbon's "N x name"


def test_schema_1_record_without_host_fields_leaves_them_empty(tmp_path):
    path = export.write_csv(records_of([record(env_host=False)]), tmp_path / "emissions.csv").path
    row = next(csv.DictReader(path.open()))
    assert [row[k] for k in ("os", "cpu_count", "ram_total_size", "gpu_count")] == ["", "", "", ""]
    assert row["python_version"] == "3.11.7" and float(row["energy_consumed"]) > 0


def test_timestamp_is_codecarbons_local_time_format_at_the_run_end(monkeypatch):
    monkeypatch.setenv("TZ", "Asia/Kolkata")       # UTC+05:30: a wrong conversion shows
    time.tzset()
    try:
        row = export.to_codecarbon_rows(records_of([record(started_at="2025-01-01T00:00:00+00:00")]))[0]
    finally:
        monkeypatch.undo()
        time.tzset()
    assert row["timestamp"] == "2025-01-01T05:31:00"   # start + duration_s 60, local wall time, no offset


@pytest.mark.procs
def test_export_appends_onto_codecarbons_file_and_the_concatenation_reads_as_one(tmp_path):
    theirs, data = codecarbon_file(tmp_path)
    results = write_records(tmp_path / "results", [record("abc"), record("def", workload="moe")])
    res = run_cli("export", str(results), "--format", "codecarbon", "-o", str(theirs))
    assert res.returncode == 0, res.stderr
    assert f"appended 2 rows to {theirs}" in res.stderr
    df = pd.read_csv(theirs)
    assert list(df.columns) == codecarbon_columns() and len(df) == 3
    assert df.loc[0, "run_id"] == data.run_id and df.loc[0, "emissions"] == data.emissions   # theirs kept
    stamps = pd.to_datetime(df["timestamp"])                  # one format across both: parses
    assert stamps.notna().all() and stamps.dt.tz is None
    ours = df[df.project_name == "s"]
    intensity = record()["carbon"]["intensity_g_per_kwh"] / 1000
    assert (ours.emissions / ours.energy_consumed).tolist() == pytest.approx([intensity] * 2, rel=1e-12)
    assert ours.cpu_count.tolist() == [16, 16] and ours.gpu_count.tolist() == [1, 1]
    # and codecarbon's own writer takes our file as its own: it appends, no backup of "a changed format"
    from codecarbon.output_methods.file import FileOutput
    FileOutput("emissions.csv", str(tmp_path)).out(data, None)
    assert len(pd.read_csv(theirs)) == 4  # (beside the file: export's hidden lock, .emissions.csv.lock)
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == ["emissions.csv", "results"]


@pytest.mark.procs
def test_export_again_does_not_write_a_run_twice(tmp_path):
    results = write_records(tmp_path / "results", [record("abc")])
    for _ in range(2):
        res = run_cli("export", str(results))
        assert res.returncode == 0, res.stderr
    assert "appended 0 rows" in res.stderr and "1 already there" in res.stderr
    assert len(pd.read_csv(results / "emissions.csv")) == 1


def test_export_of_one_record_file_writes_beside_it(tmp_path, capsys):
    """DIR may be one record file (as every reader takes): the default CSV is its folder's emissions.csv,
    not a path under the file."""
    from benchsuite.cli import main

    results = write_records(tmp_path / "results", [record("abc"), record("def")])
    one = next(results.glob("*.json"))
    assert main(["export", str(one)]) == 0
    assert f"wrote {results / 'emissions.csv'}: 1 rows" in capsys.readouterr().err
    assert len(pd.read_csv(results / "emissions.csv")) == 1


@pytest.mark.procs
def test_export_refuses_a_file_with_another_header(tmp_path):
    results = write_records(tmp_path / "results", [record()])
    other = tmp_path / "other.csv"
    other.write_text("timestamp,project_name,emissions\n2025-01-01T00:00:00,x,1.0\n")
    res = run_cli("export", str(results), "-o", str(other))
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert str(other) in res.stderr and "header" in res.stderr
    assert other.read_text() == "timestamp,project_name,emissions\n2025-01-01T00:00:00,x,1.0\n"   # untouched


@pytest.mark.procs
@pytest.mark.parametrize("target, says", [("somefile.txt/x.csv", "is a file, not a folder"),
                                          ("somefile.txt/deeper/x.csv", "is a file, not a folder"),
                                          ("results", "is a folder"), ("missing/x.csv", "does not exist")])
def test_export_refuses_an_impossible_output_path(tmp_path, target, says):
    results = write_records(tmp_path / "results", [record()])
    (tmp_path / "somefile.txt").write_text("mine")
    res = run_cli("export", str(results), "-o", str(tmp_path / target))
    assert res.returncode == 2 and "Traceback" not in res.stderr and says in res.stderr
    assert (tmp_path / "somefile.txt").read_text() == "mine"


def test_cells_a_spreadsheet_would_evaluate_are_neutralised_numbers_are_not(tmp_path):
    hostile = ["=HYPERLINK(\"http://x\")", "+1+cmd|' /C calc'!A0", "-2+3", "@SUM(A1)", "\tx", "\rx"]
    recs = [record(run_key=f"k{i}") for i in range(len(hostile))]
    for rec, w in zip(recs, hostile):
        rec["suite"] = rec["config"]["suite"] = w
    negative = record(run_key="neg")
    negative["energy"]["cpu_j"] = -50.0               # a (flagged) negative figure stays a number
    path = export.write_csv(records_of(recs + [negative]), tmp_path / "emissions.csv").path
    rows = list(csv.DictReader(path.open(newline="")))
    assert [r["project_name"] for r in rows[:-1]] == ["'" + w for w in hostile]
    assert rows[-1]["cpu_energy"] == repr(-50.0 * 1.1 / 3.6e6) and rows[-1]["cpu_energy"].startswith("-")
    assert pd.read_csv(path)["cpu_energy"].iloc[-1] == pytest.approx(-50.0 * 1.1 / 3.6e6)


def _export_after(barrier, folder, target):
    from benchsuite.cli import main

    barrier.wait()
    raise SystemExit(main(["export", str(folder), "-o", str(target)]))


@pytest.mark.procs
def test_concurrent_exports_onto_one_shared_file_lose_no_row_and_keep_its_mode_and_link(tmp_path):
    """Four exports at once onto a team's CSV reached through a symlink, group-writable: every row of every
    export is there once, the file is appended in place (same inode, mode) and the link is still a link."""
    import multiprocessing
    import os
    import stat

    (tmp_path / "team").mkdir()
    theirs, _ = codecarbon_file(tmp_path / "team")
    theirs.chmod(0o664)
    inode = theirs.stat().st_ino
    link = tmp_path / "emissions.csv"
    link.symlink_to(theirs)
    folders = [write_records(tmp_path / f"results{i}", [record(f"p{i}r{j}") for j in range(25)]) for i in range(4)]
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(4)
    procs = [ctx.Process(target=_export_after, args=(barrier, folder, link)) for folder in folders]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0] * 4
    assert link.is_symlink() and os.readlink(link) == str(theirs)
    assert theirs.stat().st_ino == inode and stat.S_IMODE(theirs.stat().st_mode) == 0o664
    df = pd.read_csv(theirs)
    assert len(df) == 1 + 100 and df["run_id"].is_unique  # codecarbon's own row and every one of ours, once


def test_export_again_from_another_time_zone_adds_nothing(tmp_path, monkeypatch):
    """The key of a row is the record's run key, repeat and start in UTC: the local timestamp codecarbon's
    column holds differs by time zone, the key does not."""
    recs = records_of([record("abc"), {**record("abc"), "repeat": 1},
                       record("abc", started_at="2025-01-02T00:00:00+00:00")])
    target = tmp_path / "emissions.csv"
    first = export.write_csv(recs, target)
    assert first.rows_written == 3  # two repeats and a later measurement of one run: three rows
    for tz in ("Asia/Kolkata", "America/Los_Angeles"):
        monkeypatch.setenv("TZ", tz)
        time.tzset()
        again = export.write_csv(recs, target)
        assert (again.rows_written, again.rows_already_there, again.appended) == (0, 3, True)
    monkeypatch.undo()
    time.tzset()
    assert len(pd.read_csv(target)) == 3


def test_run_id_is_a_uuid_of_run_key_repeat_and_utc_start():
    import uuid

    def run_id(doc: dict) -> str:
        return export.run_id(records_of([doc])[0])

    a = run_id(record("abc", started_at="2025-01-01T01:00:00+01:00"))
    assert a == run_id(record("abc", started_at="2025-01-01T00:00:00+00:00"))  # the same instant
    assert uuid.UUID(a).version == 5
    assert a != run_id({**record("abc"), "repeat": 1})
    assert a != run_id(record("abd", started_at="2025-01-01T00:00:00+00:00"))


def test_a_failed_append_leaves_the_file_as_it_was(tmp_path, monkeypatch):
    import os

    target = tmp_path / "emissions.csv"
    export.write_csv(records_of([record("abc")]), target)
    before = target.read_bytes()

    def full(fd, data):
        os.close(os.dup(fd))
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(export.os, "write", full)
    with pytest.raises(export.ExportError, match="No space left on device"):
        export.write_csv(records_of([record("def")]), target)
    assert target.read_bytes() == before


def test_footprint_export_joins_emissions_csv_by_run_id_with_the_bound_and_the_parts(tmp_path, capsys):
    """codecarbon's columns stay codecarbon's; the bound and the parts it has no column for go to footprint.csv,
    one row per record under the same run_id, in codecarbon's units (kWh × PUE, kg)."""
    import csv as csv_module

    from benchsuite.energy.attribution import attribute_energy
    from benchsuite.energy.carbon import record_carbon

    energy = attribute_energy([{"rank": 0, "host": "n0", "window_s": 100.0, "short_window": False, "reasons": [],
                                "gpus": [{"uuid": "GPU-a", "name": "H200", "cuda_index": 0,
                                          "figure": {"energy_j": 36e6, "source": "measured",
                                                     "detail": {"counter_edge_s": 0.001}}}],
                                "cpu": {"energy_j": None, "source": "unavailable", "reason": "none"},
                                "dram": {"energy_j": None, "source": "unavailable", "reason": "none"}}])
    from benchsuite.cli import main
    from benchsuite.record.types import SCHEMA_VERSION

    cfg = CarbonConfig(pue=1.5, intensity_g_per_kwh=400.0, market_intensity_g_per_kwh=100.0, wue_l_per_kwh=0.5)
    rec = {**record("fp"), "schema_version": SCHEMA_VERSION, "energy": energy, "carbon": record_carbon(energy, cfg)}
    rec["config"]["carbon"] = msgspec.to_builtins(cfg)
    folder = write_records(tmp_path / "results", [rec])
    assert main(["export", str(folder), "--format", "footprint"]) == 0
    assert main(["export", str(folder)]) == 0
    [fp] = list(csv_module.DictReader((folder / "footprint.csv").open()))
    [cc] = list(csv_module.DictReader((folder / "emissions.csv").open()))
    assert fp["run_id"] == cc["run_id"] and float(fp["energy_consumed"]) == pytest.approx(float(cc["energy_consumed"]))
    assert float(fp["energy_consumed"]) == pytest.approx(10 * 1.5)
    assert float(fp["energy_consumed_low"]) < 15 < float(fp["energy_consumed_high"])
    assert float(fp["emissions"]) == pytest.approx(float(cc["emissions"])) == pytest.approx(6.0)
    assert float(fp["market_emissions"]) == pytest.approx(1.5) and float(fp["water_onsite"]) == pytest.approx(5.0)
    assert fp["water_offsite"] == "" and "Luccioni" in fp["embodied_source"]
    assert set(cc) == set(export.codecarbon_columns())  # nothing added to codecarbon's file
