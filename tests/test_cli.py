"""The CLI as a user meets it: --json documents on stdout, figures that match a hand computation."""

import json

import pytest

from helpers import run_cli


@pytest.mark.procs
def test_carbon_estimate_json_matches_hand_computation():
    res = run_cli("carbon", "estimate", "--chips", "8", "--hours", "24", "--watts", "400", "--pue", "1.1",
                  "--intensity", "400", "--json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["energy_kwh"] == pytest.approx(8 * 24 * 400 / 1000)
    assert doc["co2e_kg"] == pytest.approx(8 * 24 * 400 / 1000 * 1.1 * 400 / 1000)
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
    "params": [*NOT_FINITE, "-1", "0", "0.5"],
    "pue": [*NOT_FINITE, "-1", "0", "0.99"],
    "non-negative": [*NOT_FINITE, "-1", "-1e-9"],
}
OPTIONS = {
    "run": {"--peak-tflops": "positive", "--nnodes": "count", "--node-rank": "index"},
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


def test_slurm_gpus_per_node_must_hold_the_suites_ranks_per_node(capsys, monkeypatch):
    monkeypatch.chdir(REPO)  # workloads/scaling.toml: world sizes up to 4 on one node
    assert exit_code(["slurm", "workloads/scaling.toml", "--nodes", "1", "--gpus-per-node", "3"]) == 2
    assert "--gpus-per-node 4 or more" in capsys.readouterr().err
    assert exit_code(["slurm", "workloads/scaling.toml", "--nodes", "1", "--gpus-per-node", "4"]) == 0
    assert "#SBATCH --gpus-per-node=4" in capsys.readouterr().out


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
