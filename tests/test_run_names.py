"""Every view tells runs apart the same way: a folder of pairs of records that differ by exactly one identity
key each (routing, threads per rank, seed, repeat, precision, a model key and each sweepable key), read by
list, report (text and --json), load()/load_runs(), export, compare and the dashboard's runs table."""

from __future__ import annotations

import csv
import json
import re
import shutil
from pathlib import Path

import pytest

import benchsuite
from benchsuite import cli
from benchsuite.dashboard.build import build_site
from benchsuite.record import write_record
from helpers import runs_rows
from helpers.records import make_record

BASE_CONFIG = {"model": {"layers": 2}, "train": {"seed": 0, "precision": "fp32"}, "parallel": {}}
# pair name -> (what changes in the second record, whether the two are one run (seeds and repeats pool))
PAIRS = {
    "routing": (lambda d: d["config"]["moe"].update(routing="forced"), False),
    "precision": (lambda d: d["config"]["train"].update(precision="bf16"), False),
    "threads": (lambda d: d["env"].update(threads_per_rank=2), False),
    "layers": (lambda d: d["config"]["model"].update(layers=4), False),
    "world": (lambda d: d["config"].update(world_size=2), False),
    "nodes": (lambda d: d["config"].update(nodes=2), False),
    "scaling": (lambda d: d["config"].update(scaling="strong"), False),
    "seed": (lambda d: d["config"]["train"].update(seed=1), True),
    "repeat": (lambda d: d.update(repeat=1), True),
}


def _doc(pair: str, second: bool) -> dict:
    doc = make_record(f"{pair}{int(second)}", workload=pair, world_size=2 if pair == "nodes" else 1)
    doc["config"].update(json.loads(json.dumps(BASE_CONFIG)))
    doc["env"] = {"threads_per_rank": 1, "devices": [{"type": "cpu", "name": "Test CPU", "rank": 0}]}
    if pair == "routing":
        doc["config"].update(kind="moe", moe={"router": "switch", "experts": 4})
    if second:
        PAIRS[pair][0](doc)
        if pair == "repeat":
            doc["run_key"] = f"{pair}0"
    return doc


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("pairs")
    for pair in PAIRS:
        for second in (False, True):
            write_record(out, _doc(pair, second))
    return out


def _cli(capsys, *argv) -> str:
    assert cli.main(list(argv)) == 0
    return capsys.readouterr().out


@pytest.mark.heavy  # in this process, a second or more: the full pass runs it, the fast tier does not
def test_every_record_has_a_name_of_its_own_in_load_list_and_the_dashboard(folder, capsys, tmp_path):
    df = benchsuite.load(folder)
    assert len(df) == 2 * len(PAIRS) and df["name"].is_unique, df["name"].tolist()
    listed = json.loads(_cli(capsys, "list", str(folder), "--json"))
    assert len({r["record_name"] for r in listed}) == len(listed) == len(df)
    build_site(folder, tmp_path / "site")
    rows = runs_rows(tmp_path / "site")
    assert len({json.dumps(r[4]) for r in rows}) == len(rows) == len(df)  # no two rows read the same
    titles = [re.search(r"<title>(.*?) · benchsuite</title>", (tmp_path / "site" / r[0]).read_text()).group(1)
              for r in rows]
    assert len(set(titles)) == len(titles)  # each record's page has a title of its own


def test_every_run_has_a_label_of_its_own_in_load_runs_report_and_compare(folder, capsys, tmp_path):
    runs = benchsuite.load_runs(folder)
    one_run = [p for p, (_, pooled) in PAIRS.items() if pooled]
    assert len(runs) == 2 * len(PAIRS) - len(one_run) and runs["label"].is_unique, runs["label"].tolist()
    by_workload = runs.groupby("workload")["label"].apply(list)
    assert any("train.precision bf16" in lbl for lbl in by_workload["precision"])  # the key that differs, said
    assert any("forced" in lbl for lbl in by_workload["routing"])
    assert any("2 threads" in lbl for lbl in by_workload["threads"])
    report = json.loads(_cli(capsys, "report", str(folder), "--json"))
    assert len({r["label"] for r in report["runs"]}) == len(report["runs"]) == len(runs)
    text = _cli(capsys, "report", str(folder), "--columns", "workload,world,nodes,scaling,seed")
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "benchsuite results")
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("└"))
    table = [line for line in lines[start:end] if line.startswith("│")]
    assert len(set(table)) == len(table) == len(runs), table  # the text report's rows too
    shutil.copytree(folder, tmp_path / "b")
    compared = json.loads(_cli(capsys, "compare", str(folder), str(tmp_path / "b"), "--json"))
    names = [r["run"] for r in compared["runs"]]
    # compare matches by config and threads per rank, seeds apart: the seed pair is two rows, the threads pair too
    assert len(set(names)) == len(names) == len(runs) + 1
    threads = sorted((r["hardware_a"], r["hardware_b"], r["run"]) for r in compared["runs"] if "/threads " in r["run"])
    assert [(a, b) for a, b, _ in threads] == [("1× Test CPU, 1 thread per rank",) * 2,
                                               ("1× Test CPU, 2 threads per rank",) * 2]
    assert "threads_per_rank 2" in threads[1][2]


def test_every_export_row_tells_its_record_apart(folder, tmp_path, capsys):
    for fmt in ("codecarbon", "footprint"):
        out = tmp_path / f"{fmt}.csv"
        _cli(capsys, "export", str(folder), "--format", fmt, "-o", str(out))
        rows = list(csv.DictReader(out.open(encoding="utf-8")))
        assert len(rows) == 2 * len(PAIRS)
        assert len({row["run_id"] for row in rows}) == len(rows), fmt


def test_export_rows_carry_the_run_seed_repeat_and_routing(folder, tmp_path, capsys):
    out = tmp_path / "footprint.csv"
    _cli(capsys, "export", str(folder), "--format", "footprint", "-o", str(out))
    rows = {row["run_id"]: row for row in csv.DictReader(out.open(encoding="utf-8"))}
    runs = benchsuite.load(folder).set_index("identity")
    by_pair = {}
    for row in rows.values():
        by_pair.setdefault(row["workload"], []).append(row)
    for pair, (_, one_run) in PAIRS.items():
        first, second = by_pair[pair]
        assert (first["experiment_id"] == second["experiment_id"]) == one_run, pair  # the run's identity
        assert {first["experiment_id"], second["experiment_id"]} <= {f"{pair} · {i}" for i in runs.index}
    assert sorted(r["routing"] for r in by_pair["routing"]) == ["forced", "learned"]
    assert sorted(r["seed"] for r in by_pair["seed"]) == ["0", "1"]
    assert sorted(r["repeat"] for r in by_pair["repeat"]) == ["0", "1"]


def test_every_view_shows_each_derived_figure_as_its_one_definition(tmp_path, capsys):
    """Over MoE, pipeline, tensor-parallel, energy and user-loop runs: report --json, load_runs() and the
    dashboard's results give each run's figures equal (==), each derived figure as the record states it."""
    from benchsuite.dashboard.data import load as site_load
    from helpers import REPO

    folder = tmp_path / "mixed"
    fixtures = REPO / "tests" / "fixtures"
    for path in [*(fixtures / "results").glob("make_*.json"), *(fixtures / "golden").glob("*.json")]:
        (folder / path.name).parent.mkdir(exist_ok=True)
        (folder / path.name).write_bytes(path.read_bytes())
    loop = make_record("loop1", workload="my-loop", tokens_per_s=5000.0)
    loop["config"]["kind"] = "user"
    write_record(folder, loop)
    report = {r["label"]: r for r in json.loads(_cli(capsys, "report", str(folder), "--json"))["runs"]}
    runs = benchsuite.load_runs(folder).set_index("label")
    data = site_load(folder)
    site = data.runs.set_index("label")
    for part in ("my-loop", "pipe", "tp", "switch"):  # user loop, pipeline, tensor parallel, MoE
        assert [label for label in report if label.split("/")[-1].startswith(part + " ")], (part, list(report))
    assert set(report) == set(runs.index) == set(site.index)

    def same(*values) -> bool:
        return len({"nan" if v is None or (isinstance(v, float) and v != v) else v for v in values}) == 1

    for label, row in report.items():
        for column, in_runs in (("tokens_per_s",) * 2, ("mfu",) * 2, ("step_time_median_s",) * 2, ("j_per_token",) * 2,
                                ("gco2e_per_mtok",) * 2, ("scaling_efficiency",) * 2, ("metrics.hfu", "hfu")):
            assert same(row[column], runs.at[label, in_runs], site.at[label, column]), (label, column)
        per_device = runs.at[label, "tokens_per_s_per_device"]
        assert same(per_device, site.at[label, "metrics.tokens_per_s_per_device"]), label
        if row["status"] == "ok" and row["tokens_per_s"] is not None and runs.at[label, "repeats"] == 1:
            assert per_device == row["tokens_per_s"] / row["world_size"], label  # one record: its own figure
        busiest = "metrics.moe.load_max_over_mean"
        if busiest in site and not same(site.at[label, busiest], None):
            mine = data.df.loc[data.df["identity"] == row["identity"]]  # the records' own figure, its median
            assert site.at[label, busiest] == float(mine[busiest].median()), label


SUITE = """
[suite]
name = "pairs"
[defaults]
model = { layers = 2, hidden = 32, heads = 2, vocab = 64, seq_len = 16 }
[[workload]]
name = "moe"
kind = "moe"
moe = { router = "switch", experts = 4 }
[[workload]]
name = "moe-bf16"
kind = "moe"
moe = { router = "switch", experts = 4 }
train = { precision = "bf16" }
[sweep]
world_size = [1, 2]
scaling = ["weak", "strong"]
seed = [0, 1]
routing = ["learned", "forced"]
"""


def test_a_suites_runs_each_have_a_name_and_log_files_of_their_own(tmp_path, capsys):
    """Before any record exists: predict names every run of a suite apart (routing, world, scaling, seed and the
    workload a precision or any other key makes), and the log files of each run × threads per rank × repeat
    differ, each saying its seed and repeat."""
    from benchsuite.config import load_suite
    from benchsuite.launch import Threads, key_of, log_stem, record_path

    path = tmp_path / "pairs.toml"
    path.write_text(SUITE)
    runs = load_suite(path).runs
    assert len(runs) == 2 * 2 * 2 * 2 * 2
    predicted = json.loads(_cli(capsys, "predict", str(path), "--system", "workloads/systems/cpu-gloo.toml",
                                "--json"))["runs"]
    names = [r["run"] for r in predicted]
    assert len(set(names)) == len(names) == len(runs), names
    stems = []
    for run in runs:
        for threads in (Threads(1, "sweep rule"), Threads(2, "OMP_NUM_THREADS from the user")):
            key = key_of(run, {"devices": "cpu: Test CPU"}, threads)
            for repeat in (0, 1):
                stem = log_stem(record_path(tmp_path, run, key, repeat), key, repeat, node_rank=0)
                assert f"-seed{run.train.seed}-r{repeat}__" in stem, stem
                stems.append(stem)
    assert len(set(stems)) == len(stems) == len(runs) * 2 * 2
