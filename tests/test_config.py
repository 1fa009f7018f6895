import pytest

from benchsuite.config import ConfigError, load_suite, parse_suite
from conftest import run_cli, write_suite


def _problems(doc) -> dict:
    with pytest.raises(ConfigError) as e:
        parse_suite(doc, "s.toml")
    return dict(e.value.problems)


def _message(doc) -> str:
    with pytest.raises(ConfigError) as e:
        parse_suite(doc, "s.toml")
    return str(e.value)


def test_defaults_merge_under_workloads_and_sweep_expands():
    suite = parse_suite({
        "suite": {"name": "s"},
        "defaults": {"model": {"hidden": 128, "heads": 4}, "train": {"steps": 7}},
        "workload": [{"name": "a", "model": {"layers": 3}},
                     {"name": "b", "kind": "moe", "moe": {"experts": 4, "router": "gshard"}}],
        "sweep": {"world_size": [1, 2], "scaling": ["weak", "strong"]},
    })
    assert len(suite.runs) == 8
    a = suite.runs[0]
    assert (a.model.hidden, a.model.heads, a.model.layers, a.train.steps) == (128, 4, 3, 7)
    assert a.model.ffn == 512  # default 4 * hidden
    b = [r for r in suite.runs if r.workload == "b"][0]
    assert b.moe.router == "gshard" and b.moe.experts == 4 and b.moe.capacity_factor == 1.25
    assert sorted({(r.world_size, r.scaling) for r in suite.runs}) == [(1, "strong"), (1, "weak"),
                                                                        (2, "strong"), (2, "weak")]


def test_every_mistake_is_reported_with_its_key():
    problems = _problems({
        "suite": {"name": "s", "colour": "red"},
        "defaults": {"model": {"hidden": 100, "heads": 3, "layers": "two"}},
        "workload": [{"name": "a", "train": {"steps": -1, "precision": "fp8", "lr": 1e-3, "bogus": 1}}],
        "sweep": {"world_size": [1, 0]},
    })
    assert "unknown key" in problems["suite.colour"]
    assert "expected int" in problems["workload[0] (a).model.layers"]
    assert "> 0" in problems["workload[0] (a).train.steps"]
    assert "one of" in problems["workload[0] (a).train.precision"]
    assert "unknown key" in problems["workload[0] (a).train.bogus"]
    assert "positive integers" in problems["sweep.world_size"]
    assert "heads (3) must divide hidden (100)" in problems["workload[0] (a).model.heads"]
    assert len(problems) == 7


def test_model_shape_is_checked_even_when_another_section_is_wrong():
    problems = _problems({"defaults": {"model": {"hidden": 100, "heads": 3}},
                          "workload": [{"name": "a", "train": {"steps": "many"}}]})
    assert "heads (3) must divide hidden (100)" in problems["workload[0] (a).model.heads"]
    assert "expected int" in problems["workload[0] (a).train.steps"]


def test_impossible_combinations_are_rejected_before_launch():
    text = _message({
        "defaults": {"model": {"hidden": 96, "heads": 4, "vocab": 130}},
        "workload": [{"name": "tp", "parallel": {"tensor": 4}},
                     {"name": "bad-heads", "model": {"heads": 5}, "train": {"micro_batch": 3}}],
        "sweep": {"world_size": [2], "scaling": "strong"},
    })
    assert "world_size (2) must be divisible by tensor (4)" in text
    assert "must divide model.vocab (130)" in text
    assert "heads (5) must divide hidden (96)" in text
    assert "strong scaling splits the global batch (3)" in text


def test_run_key_is_stable_and_sensitive():
    doc = {"workload": [{"name": "a"}], "sweep": {"world_size": [1, 2]}}
    r1, r2 = parse_suite(doc).runs
    hw = {"gpus": [], "cpu": "x"}
    assert r1.run_key(hw) == parse_suite(doc).runs[0].run_key(hw)
    assert r1.run_key(hw) != r2.run_key(hw)
    assert r1.run_key(hw) != r1.run_key({"gpus": ["NVIDIA H200"], "cpu": "x"})


def test_strong_scaling_splits_the_global_batch():
    runs = parse_suite({"defaults": {"train": {"micro_batch": 8}}, "workload": [{"name": "a"}],
                        "sweep": {"world_size": [1, 2, 4], "scaling": "strong"}}).runs
    assert [r.micro_batch_per_rank for r in runs] == [8, 4, 2]
    assert {r.global_batch for r in runs} == {8}


def test_shipped_workloads_load():
    from pathlib import Path

    files = sorted(Path(__file__).parents[1].glob("workloads/*.toml"))
    assert files
    for f in files:
        assert load_suite(f).runs, f


@pytest.mark.parametrize("content, key, words", [
    (None, "", "file not found"),
    ("[suite\nname = 1", "", "TOML syntax error"),
    ("[[workload]]\nname = 'a'\nflavour = 1\n", "workload[0] (a).flavour", "unknown key"),
    ("[[workload]]\nname = 'a'\ntrain = { steps = 'many' }\n", "workload[0] (a).train.steps", "expected int"),
])
def test_bad_input_gives_one_clear_message_and_exit_2(tmp_path, content, key, words):
    path = tmp_path / "bad.toml"
    if content is not None:
        write_suite(path, content)
    res = run_cli("run", str(path), "--out", str(tmp_path / "out"))
    assert res.returncode == 2
    assert str(path) in res.stderr and key in res.stderr and words in res.stderr
    assert "Traceback" not in res.stderr
    assert not (tmp_path / "out").exists()  # nothing launched, nothing written
