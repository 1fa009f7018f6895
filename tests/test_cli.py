"""The CLI as a user meets it: --json documents on stdout, figures that match a hand computation."""

import json
from types import SimpleNamespace

import pytest

from helpers import run_cli


@pytest.mark.procs
def test_carbon_estimate_json_matches_hand_computation():
    res = run_cli("carbon", "estimate", "--chips", "8", "--hours", "24", "--watts", "400", "--pue", "1.1",
                  "--intensity", "400", "--json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["energy_j"] / 3.6e6 == pytest.approx(8 * 24 * 400 / 1000)
    assert doc["co2e_g"] / 1000 == pytest.approx(8 * 24 * 400 / 1000 * 1.1 * 400 / 1000)
    assert (doc["pue"], doc["intensity_source"]) == (1.1, "explicit")


@pytest.mark.procs
def test_carbon_estimate_unknown_country_exits_2():
    res = run_cli("carbon", "estimate", "--chips", "1", "--hours", "1", "--watts", "1000", "--country", "XXX",
                  "--json")
    assert res.returncode == 2 and "--country XXX" in res.stderr
    assert "--country XXX" in json.loads(res.stdout)["message"]  # --json: one error document on stdout


@pytest.mark.procs
def test_flops_json_is_one_document_with_every_run():
    res = run_cli("flops", "workloads/scaling.toml", "--json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert len(doc["runs"]) == 6
    r = doc["runs"][0]
    l, h, s, v = 2, 128, 64, 512
    assert r["model_flops_per_token"] == 72 * l * h * h + 12 * l * s * h + 6 * v * h


# ----------------------------------------------------------------------------- numeric options

from benchsuite import cli  # noqa: E402
from helpers import REPO  # noqa: E402

FIXTURES = str(REPO / "tests" / "fixtures" / "results")
BASE = {  # each verb's valid command line; a bad option value is appended (the last one wins)
    "run": ["run", "workloads/smoke.toml"],
    "carbon estimate": ["carbon", "estimate", "--chips", "1", "--hours", "1", "--watts", "1"],
    "carbon project": ["carbon", "project", FIXTURES, "--tokens", "1e9"],
    "memory": ["memory", "--params", "1e9", "--dp", "2"],
    "slurm": ["slurm", "workloads/smoke.toml", "--nodes", "1", "--gpus-per-node", "8"],
}
NOT_FINITE = ["nan", "NaN", "inf", "-inf", "1e400", "", "ten", "0x10"]
BAD = {  # what each kind of option refuses
    "count": [*NOT_FINITE, "-1", "0", "1.5", "1e3"],
    "index": [*NOT_FINITE, "-1", "0.5"],
    "positive": [*NOT_FINITE, "-1", "0", "-0", "-1e-9"],
    "params": [*NOT_FINITE, "-1", "0", "0.5", "1e308"],  # 1e308 parameters: 16 bytes each overflowed to inf
    "pue": [*NOT_FINITE, "-1", "0", "0.99"],
    "non-negative": [*NOT_FINITE, "-1", "-1e-9"],
}
OPTIONS = {
    "run": {"--peak-tflops": "positive", "--nnodes": "count", "--node-rank": "index", "--repeat": "count"},
    "carbon estimate": {"--chips": "positive", "--hours": "positive", "--watts": "positive", "--pue": "pue",
                        "--intensity": "non-negative"},
    "carbon project": {"--tokens": "positive", "--devices": "count", "--pue": "pue", "--intensity": "non-negative"},
    "memory": {"--params": "params", "--dp": "count"},
    "slurm": {"--nodes": "count", "--gpus-per-node": "count"},
}
CASES = [(verb, opt, bad) for verb, opts in OPTIONS.items() for opt, kind in opts.items() for bad in BAD[kind]]


def exit_code(argv: list[str]) -> int:
    """cli.main's exit code, argparse's SystemExit included; any other exception fails the test."""
    try:
        return cli.main(argv)
    except SystemExit as e:
        return e.code


@pytest.mark.parametrize("verb,option,bad", CASES)
def test_every_bad_numeric_option_exits_2_naming_the_option(verb, option, bad, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    assert exit_code([*BASE[verb], f"{option}={bad}"]) == 2
    err = capsys.readouterr().err
    assert f"argument {option}: expected " in err and repr(bad) in err, err  # what is wrong and what it needs


@pytest.mark.parametrize("argv, message", [
    (["memory", "--json", "--dp", "0"], "argument --dp: expected an integer >= 1, got '0'"),
    (["report", FIXTURES, "--json", "--columns"], "argument --columns: expected one argument"),
    (["carbon", "estimate", "--json", "--chips", "1"], "the following arguments are required: --hours, --watts"),
])
def test_a_refused_argument_under_json_is_still_one_document(argv, message, capsys):
    """Once stdout stayed empty when argparse refused an argument: a jq pipeline got no document."""
    assert exit_code(argv) == 2
    captured = capsys.readouterr()
    assert json.loads(captured.out) == {"error": "usage", "message": message}
    assert message in captured.err


def test_numeric_messages_say_what_is_needed(capsys):
    for argv, want in ((["memory", "--dp", "0"], "argument --dp: expected an integer >= 1, got '0'"),
                       ([*BASE["carbon estimate"], "--pue", "0.9"], "argument --pue: expected a finite number >= 1"),
                       ([*BASE["carbon estimate"], "--hours", "1e400"], "expected a finite number > 0, got '1e400'")):
        assert exit_code(argv) == 2
        assert want in capsys.readouterr().err


@pytest.mark.procs
@pytest.mark.parametrize("argv", [
    ["memory", "--params", "nan", "--dp", "1"],
    [*BASE["carbon estimate"], "--watts", "inf"],
    ["run", "workloads/smoke.toml", "--peak-tflops", "-1"],
    ["run", "workloads/smoke.toml", "--nnodes", "2", "--node-rank", "2", "--rdzv-endpoint", "h:1"],
    ["slurm", "workloads/scaling.toml", "--nodes", "1", "--gpus-per-node", "2"],
])
def test_bad_numbers_as_a_process_exit_2_without_traceback(argv):
    res = run_cli(*argv)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert any(a in res.stderr for a in argv if a.startswith("--")), res.stderr


def test_node_rank_must_be_below_nnodes(capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    assert exit_code(["run", "workloads/smoke.toml", "--nnodes", "2", "--node-rank", "2",
                      "--rdzv-endpoint", "h:1"]) == 2
    assert "--node-rank 2 must be < --nnodes 2" in capsys.readouterr().err


def test_repeat_is_refused_past_the_measurements_a_suite_may_plan_and_its_help_says_the_order(capsys, monkeypatch):
    monkeypatch.chdir(REPO)  # workloads/smoke.toml: 2 runs
    assert exit_code(["run", "workloads/smoke.toml", "--repeat", "2049"]) == 2
    assert "--repeat 2049: 2 runs × 2049 is more measurements than a suite may plan (4096)" in capsys.readouterr().err
    assert exit_code(["run", "--help"]) == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--repeat N measure each run N times" in help_text and "every run once, then every run again" in help_text


def test_slurm_gpus_per_node_must_hold_the_suites_ranks_per_node(capsys, monkeypatch):
    monkeypatch.chdir(REPO)  # workloads/scaling.toml: world sizes up to 4 on one node
    assert exit_code(["slurm", "workloads/scaling.toml", "--nodes", "1", "--gpus-per-node", "3"]) == 2
    assert "--gpus-per-node 4 or more" in capsys.readouterr().err
    assert exit_code(["slurm", "workloads/scaling.toml", "--nodes", "1", "--gpus-per-node", "4"]) == 0
    assert "#SBATCH --gpus-per-node=4" in capsys.readouterr().out


def test_carbon_estimate_whose_product_overflows_exits_2_naming_the_options(capsys):
    """Each input finite, their product not: once a traceback under --json, inf kWh in the text."""
    argv = ["carbon", "estimate", "--chips", "1e308", "--hours", "1e308", "--watts", "1", "--intensity", "1"]
    for json_flag in ([], ["--json"]):
        assert exit_code([*argv, *json_flag]) == 2
        captured = capsys.readouterr()
        assert "--chips × --hours × --watts × --pue × the intensity is beyond float range" in captured.err
    assert json.loads(captured.out)["error"] == "usage"


def test_json_output_is_strict_json_whatever_overflowed(capsys):
    from benchsuite.commands.common import print_json

    print_json({"a": float("inf"), "b": [float("nan"), 1.5], "c": {"d": -float("inf")}})
    assert json.loads(capsys.readouterr().out) == {"a": None, "b": [None, 1.5], "c": {"d": None}}


def test_compare_of_folders_that_share_no_run_exits_2_even_under_fail_on_regression(tmp_path, capsys):
    """Once exit 0: a CI gate comparing against the wrong folder passed with nothing compared."""
    rec = json.loads((REPO / "tests" / "fixtures" / "results" / "make_dvs-dense-w1.json").read_text())
    folders = []
    for name, steps in (("a", rec["config"]["train"]["steps"]), ("b", rec["config"]["train"]["steps"] + 1)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "r.json").write_text(json.dumps({**rec, "config": {
            **rec["config"], "train": {**rec["config"]["train"], "steps": steps}}}))
        folders.append(str(tmp_path / name))
    for extra in ([], ["--fail-on-regression"], ["--json"]):
        assert exit_code(["compare", *folders, *extra]) == 2
        captured = capsys.readouterr()
        assert (f"no run of {folders[0]} matches a run of {folders[1]} (same resolved config): nothing to compare"
                in captured.err)
    assert json.loads(captured.out)["runs"] == []  # --json still prints its one document


def test_compare_given_a_record_file_says_it_is_not_a_folder(capsys):
    record = str(REPO / "tests" / "fixtures" / "results" / "make_dvs-dense-w1.json")
    assert exit_code(["compare", record, FIXTURES]) == 2
    assert f"{record}: not a folder: compare takes two results folders" in capsys.readouterr().err  # not "no such"


# ----------------------------------------------------------------------------- paths and endpoints

SUITE = "workloads/smoke.toml"
PATH_ARGUMENTS = {  # every path argument of every verb, given as '' (the rest of the line valid)
    "run SUITE": (["run", ""], "suite"), "run --out": (["run", SUITE, "--out", "", "--nnodes", "3", "--rdzv-endpoint", "h:1"], "--out"),
    "list DIR": (["list", ""], "dir"), "report DIR": (["report", ""], "dir"),
    "dashboard DIR": (["dashboard", "", "-o", "site"], "dir"), "dashboard -o": (["dashboard", FIXTURES, "-o", ""], "-o/--out"),
    "compare A": (["compare", "", FIXTURES], "a"), "compare B": (["compare", FIXTURES, ""], "b"),
    "slurm SUITE": (["slurm", "", "--nodes", "1", "--gpus-per-node", "2"], "suite"),
    "slurm --out": ([*BASE["slurm"], "--out", ""], "--out"), "slurm -o": ([*BASE["slurm"], "-o", ""], "-o/--output"),
    "slurm --job-output": ([*BASE["slurm"], "--job-output", ""], "--job-output"),
    "carbon project RECORDS": (["carbon", "project", "", "--tokens", "1"], "records"),
    "export DIR": (["export", ""], "dir"), "export -o": (["export", FIXTURES, "-o", ""], "-o/--output"),
    "tokenize FILES": (["tokenize", "", "-o", "x.bin"], "files"), "tokenize -o": (["tokenize", SUITE, "-o", ""], "-o/--output"),
    "flops SUITE": (["flops", ""], "suite"), "memory SUITE": (["memory", ""], "suite"),
}


@pytest.mark.parametrize("case", sorted(PATH_ARGUMENTS))
def test_an_empty_path_is_refused_by_every_verb_not_taken_as_the_current_folder(case, tmp_path, monkeypatch,
                                                                                  capsys):
    """'' was Path('') = '.': `run --out ''` wrote records where the command was typed, `dashboard -o ''` a site."""
    argv, name = PATH_ARGUMENTS[case]
    (tmp_path / "workloads").symlink_to(REPO / "workloads")  # (the lines' suites; a folder no other test writes in)
    monkeypatch.chdir(tmp_path)
    assert exit_code(argv) == 2
    assert f"argument {name}: expected a path, got ''" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["workloads"]


@pytest.mark.parametrize("value, problem", [
    ("node1:abc", "the port must be an integer 1-65535, got 'abc'"),
    ("node1:99999", "the port must be an integer 1-65535, got '99999'"),
    ("node1:0", "the port must be an integer 1-65535, got '0'"),
    ("node1:", "the port must be an integer 1-65535, got ''"),
    (":29500", "the host must be a host name or an IP address"),
    ("a b:29500", "the host must be a host name or an IP address"),
    ("node1:29500;reboot", "the port must be an integer 1-65535"),
])
def test_a_bad_rdzv_endpoint_exits_2_before_any_run_fails_in_torchrun(value, problem, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    out = tmp_path / "out"
    assert exit_code(["run", SUITE, "--nnodes", "2", "--rdzv-endpoint", value, "--out", str(out)]) == 2
    assert f"argument --rdzv-endpoint: expected HOST:PORT (e.g. node001:29500), got {value!r}: {problem}" in (
        capsys.readouterr().err)
    assert not out.exists()


def test_good_rdzv_endpoints_are_what_torchrun_parses():
    from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

    from benchsuite.commands.common import endpoint

    for value in ("node1:29500", "node1", "10.0.0.1:1", "[::1]:29500", "[fe80::1]", "my-host.example.org:65535"):
        assert endpoint(value) == value
        parse_rendezvous_endpoint(value, default_port=29400)  # torchrun takes it too


# ----------------------------------------------------------------------------- output paths


@pytest.mark.procs
@pytest.mark.parametrize("where", ["file", "under-file", "folder"])
def test_tokenize_output_at_or_under_an_existing_file_or_folder_exits_2(tmp_path, where):
    text, existing = tmp_path / "a.txt", tmp_path / "taken.bin"
    text.write_text("hello")
    existing.write_text("x")
    target = {"file": existing / "x.bin", "under-file": existing / "sub" / "x.bin", "folder": tmp_path}[where]
    if where == "folder":
        target = tmp_path / "d.bin"
        target.mkdir()
    res = run_cli("tokenize", str(text), "-o", str(target))
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert str(target) in res.stderr and ("not a folder" in res.stderr or "is a folder" in res.stderr)
    assert existing.read_text() == "x"


# ----------------------------------------------------------------------------- one of each


def test_top_level_help_lists_every_verb(capsys):
    """`benchsuite --help` expands every verb's help (a bare `%` in one once made it a traceback)."""
    assert exit_code(["--help"]) == 0
    shown = capsys.readouterr().out
    assert all(f"    {verb} " in shown for verb in ("run", "list", "report", "dashboard", "compare", "slurm",
                                                   "carbon", "export", "tokenize", "flops", "memory")), shown
    assert "95 % intervals over the repeats" in " ".join(shown.split())


def _subparsers(parser, name="benchsuite"):
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for verb, sub in action.choices.items():
                yield f"{name} {verb}", sub
                yield from _subparsers(sub, f"{name} {verb}")


def test_json_is_one_option_shared_by_every_verb_that_prints_a_document():
    from benchsuite.commands.common import JSON

    (shared,) = [a for a in JSON._actions if "--json" in a.option_strings]
    with_json = {verb: [a for a in sub._actions if "--json" in a.option_strings]
                 for verb, sub in _subparsers(cli.build_parser())}
    assert {verb for verb, actions in with_json.items() if actions} == {
        f"benchsuite {v}" for v in ("run", "list", "report", "dashboard", "compare", "carbon estimate",
                                    "carbon project", "tokenize", "flops", "memory", "schema", "predict")}
    assert all(actions in ([], [shared]) for actions in with_json.values())  # the same action, not a copy


@pytest.mark.parametrize("argv", [["list"], ["report"], ["dashboard", "-o", "SITE"], ["export"],
                                  ["carbon", "project", "--tokens", "1e9"]])
def test_every_reader_refuses_a_missing_results_folder_alike(argv, tmp_path, capsys):
    missing = tmp_path / "nope"
    argv = [str(tmp_path / "site") if a == "SITE" else a for a in argv]
    argv.insert(2 if argv[0] == "carbon" else 1, str(missing))
    assert exit_code([*argv, *(["--json"] if argv[0] != "export" else [])]) == 2
    captured = capsys.readouterr()
    message = (f"{missing}: no such results folder or record file "
               f"(run `benchsuite run SUITE.toml --out {missing}` first)")
    assert captured.err == f"benchsuite: {message}\n"
    assert argv[0] == "export" or json.loads(captured.out) == {"error": "usage", "message": message}
    assert not (tmp_path / "site").exists()  # refused before anything is written


@pytest.mark.parametrize("argv", [["list", FIXTURES, "--json"], ["export", FIXTURES, "-o", "CSV"],
                                  ["carbon", "project", FIXTURES, "--tokens", "1e9", "--json"]])
def test_a_reader_loads_the_folder_once_through_the_store(argv, tmp_path, monkeypatch, capsys):
    from benchsuite.results import store

    calls = []
    load = store.load_records
    monkeypatch.setattr(store, "load_records", lambda path: calls.append(str(path)) or load(path))
    assert exit_code([str(tmp_path / "e.csv") if a == "CSV" else a for a in argv]) == 0
    assert calls == [FIXTURES]


def test_memory_table_is_the_papers_example_and_the_cli_prints_its_lines(capsys):
    """Ψ = 7.5e9 over N = 64 (ZeRO paper, Figure 1): 120, 31.4, 16.6 and 1.9 GB per device."""
    from benchsuite.metrics.tables import memory_table_for_params

    table = memory_table_for_params(7.5e9, 64, None)
    assert [r["total"] for r in table.doc["stages"]] == [16 * 7.5e9, 4 * 7.5e9 + 12 * 7.5e9 / 64,
                                                        2 * 7.5e9 + 14 * 7.5e9 / 64, 16 * 7.5e9 / 64]
    assert (table.doc["precision"], table.doc["K"], table.doc["formulas"]["ZeRO-1"]) == ("mixed", 12, "4Ψ + KΨ/N")
    assert table.lines[2] == (" " * 25 + "Ψ 7,500,000,000  N 64   DDP        120 GB  ZeRO-1      31.41 GB  "
                              "ZeRO-2      16.64 GB  ZeRO-3      1.875 GB")
    assert exit_code(["memory", "--params", "7.5e9", "--dp", "64"]) == 0
    assert capsys.readouterr().out.splitlines() == table.lines


def test_flops_table_lines_are_the_documents_figures(monkeypatch, capsys):
    from benchsuite.config import load_suite
    from benchsuite.metrics.tables import flops_table

    monkeypatch.chdir(REPO)
    table = flops_table(load_suite("workloads/scaling.toml"))
    first = table.doc["runs"][0]
    name = f"{first['workload']} · seed {first['seed']}"
    assert table.lines[1] == (f"{name:<24} w{first['world_size']:<3} params {first['params']:10.4g}  "
                              f"active {first['params_active']:10.4g}  model {first['model_flops_per_token']:10.4g}"
                              f" FLOP/tok  hardware {first['hardware_flops_per_token']:10.4g} FLOP/tok")
    assert len(table.lines) == 1 + len(table.doc["runs"]) == 7
    assert exit_code(["flops", "workloads/scaling.toml"]) == 0
    assert capsys.readouterr().out.splitlines() == table.lines


@pytest.mark.parametrize("options, named", [
    (["--wue", "1e308"], "--wue × the energy"), (["--water-intensity", "1e308"], "--water-intensity × the facility"),
    (["--market-intensity", "1e308"], "--market-intensity × the energy"),
    (["--embodied-kg", "1e308", "--lifetime-years", "1e-300"], "--embodied-kg × the device hours ÷ --lifetime-years")])
@pytest.mark.parametrize("verb", ["estimate", "project"])
def test_a_carbon_part_beyond_float_range_exits_2_naming_its_option(capsys, verb, options, named):
    """The parts beside the location-based CO2e: once "inf L" and "inf kg CO2e" with exit 0."""
    argv = (["carbon", "estimate", "--chips", "8", "--hours", "1000", "--watts", "700"] if verb == "estimate" else
            ["carbon", "project", str(REPO / "tests" / "fixtures" / "results"), "--tokens", "1e12"])
    for json_flag in ([], ["--json"]):
        assert exit_code([*argv, *options, *json_flag]) == 2
        captured = capsys.readouterr()
        assert named in captured.err and "is beyond float range" in captured.err and "inf" not in captured.out


@pytest.mark.parametrize("options", [["--wue", "1e300"], ["--intensity", "1e300"], ["--market-intensity", "1e290"],
                                     ["--embodied-kg", "1e300"]])
def test_a_carbon_figure_near_float_range_prints_in_scientific_form_not_hundreds_of_digits(capsys, options):
    """Finite but huge: once a 300-digit number of litres on one line."""
    argv = ["carbon", "estimate", "--chips", "1", "--hours", "1", "--watts", "300", "--intensity", "400"]
    assert exit_code([*argv, *options]) == 0
    text = capsys.readouterr().out
    assert max(len(word) for word in text.split()) < 40, text
    assert "e+" in text


def test_a_predicted_training_run_near_float_range_prints_its_hours_in_scientific_form(capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    assert exit_code(["predict", "workloads/smoke.toml", "--system", "workloads/systems/h100-8x.toml",
                      "--tokens", "1e300"]) == 0
    text = capsys.readouterr().out
    assert max(len(word) for word in text.split()) < 40 and " h, " in text


def test_json_output_is_written_as_it_is_encoded_and_equals_one_dump(monkeypatch):
    """A report of 100,000 runs is never one string in memory: many writes, the same text as one dump."""
    from benchsuite.commands.common import print_json

    writes = []
    monkeypatch.setattr("sys.stdout", SimpleNamespace(write=writes.append))
    doc = {"runs": [{"run": i, "tok/s": i / 3, "flags": []} for i in range(1000)], "bad": float("nan")}
    print_json(doc)
    assert len(writes) > 1000
    assert "".join(writes) == json.dumps({**doc, "bad": None}, indent=2) + "\n"


def test_json_is_written_item_by_item_as_the_standard_library_writes_it_whole(capsys):
    """print_json streams each item of a list or iterator that no list holds; its text is json.dumps(indent=2)'s
    of the same document (ASCII escapes, number text), a non-finite figure null, a numpy scalar its value."""
    import numpy as np

    from benchsuite.commands.common import print_json

    def doc(lazy: bool):
        runs = [{"label": "dense · w2", "tok/s": 1e16, "mfu": 2.5e-07, "n": np.int64(3), "bad": float("nan"),
                 "seeds": [0, 1], "none": {}} for _ in range(3)]
        return {"runs": iter(runs) if lazy else runs, "verdicts": {"pairs": iter([]) if lazy else [], "claims": [[]],
                "method": "t"}, "empty": {}, "n": 2}

    print_json(doc(lazy=True))
    plain = json.loads(json.dumps(doc(lazy=False), default=lambda v: v.item()).replace("NaN", "null"))
    assert capsys.readouterr().out == json.dumps(plain, indent=2) + "\n"
    for top in ([], {}, [1, [2, {}]], "x"):
        print_json(top)
        assert capsys.readouterr().out == json.dumps(top, indent=2) + "\n"
