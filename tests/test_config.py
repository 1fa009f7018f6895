import pytest

from benchsuite.config import ConfigError
from benchsuite.config.preflight import load_suite, parse_suite
from helpers import run_cli, write_suite


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


@pytest.mark.procs
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


# ----------------------------------------------------------------------------- minimum warm-up

@pytest.mark.parametrize("train, words", [
    ({"warmup_steps": 1}, "must be >= 2: the first two unmeasured steps are instrumented"),
    ({"warmup_steps": 0, "compile": True}, "must be >= 2"),
    ({"warmup_steps": 2, "compile": True}, "must be >= 3 with train.compile = true"),
])
def test_warmup_below_what_the_worker_runs_is_refused_with_the_reason(train, words):
    problems = _problems({"workload": [{"name": "a", "train": train}]})
    assert list(problems) == ["workload[0] (a).train.warmup_steps"]
    assert words in problems["workload[0] (a).train.warmup_steps"]


def test_warmup_at_the_minimum_is_what_runs():
    from benchsuite.worker import unmeasured_steps

    plain, compiled = (parse_suite({"workload": [{"name": "a", "train": t}]}).runs[0]
                       for t in ({"warmup_steps": 2}, {"warmup_steps": 3, "compile": True}))
    assert unmeasured_steps(plain) == plain.train.warmup_steps == 2  # the record's value is the value used
    assert unmeasured_steps(compiled) == compiled.train.warmup_steps == 3


# ----------------------------------------------------------------------------- one pass reports all

def test_one_pass_reports_every_problem_of_every_kind_in_every_workload(tmp_path):
    """Unknown keys, types, impossible combinations, data paths and sweep problems, in several sections and
    workloads, all in one error; a mistake in one section never hides a check of another."""
    doc = {
        "suite": {"name": "s", "colour": "red"},                                       # unknown key
        "defaults": {"model": {"hidden": 96, "heads": 4, "vocab": 130}},
        "workload": [
            {"name": "tp", "parallel": {"tensor": 3}, "train": {"steps": "many"}},     # type + combinations
            {"name": "ep", "parallel": {"expert": 2}, "flavour": 1, "moe": {"experts": 4}},  # kind and table
            {"name": "data", "train": {"data": str(tmp_path / "missing.bin"), "lr": -1.0}},  # path + value
            {"name": "sw", "sweep": {"scaling": ["strong", "fast"], "nodes": [1, 1]},   # own sweep problems
             "train": {"micro_batch": 3}},
            "not a table",
        ],
        "sweep": {"world_size": [2, 4]},
    }
    problems, text = _problems(doc), _message(doc)
    assert set(problems) == {
        "suite.colour",
        "workload[0] (tp).train.steps", "workload[0] (tp).parallel.tensor",
        "workload[0] (tp) (world_size=2, nodes=1).parallel.tensor",
        "workload[0] (tp) (world_size=4, nodes=1).parallel.tensor",
        "workload[1] (ep).flavour", "workload[1] (ep).moe", "workload[1] (ep).parallel.expert",
        "workload[2] (data).train.data", "workload[2] (data).train.lr",
        "workload[3] (sw).sweep.scaling", "workload[3] (sw).sweep.nodes",
        "workload[4]",
    }, problems
    assert "tensor (3) must divide model.heads (4)" in text and "tensor (3) must divide model.vocab (130)" in text
    assert "world_size (2) must be divisible by tensor (3)" in \
        problems["workload[0] (tp) (world_size=2, nodes=1).parallel.tensor"]
    assert "does not exist" in problems["workload[2] (data).train.data"]
    assert "'fast'" in problems["workload[3] (sw).sweep.scaling"]
    assert "duplicate value(s) 1" in problems["workload[3] (sw).sweep.nodes"]


def test_a_refused_value_is_never_judged_as_its_default():
    """hidden = -5 is refused; the default hidden (64) must not then be reported as not divisible by heads = 3,
    nor a refused world size give divisibility problems."""
    problems = _problems({"workload": [{"name": "a", "model": {"hidden": -5, "heads": 3, "vocab": 258},
                                        "parallel": {"tensor": 3}}],
                          "sweep": {"world_size": [0]}})
    assert set(problems) == {"workload[0] (a).model.hidden", "sweep.world_size"}


def test_a_problem_repeated_by_the_sweep_is_reported_once():
    with pytest.raises(ConfigError) as e:
        parse_suite({"workload": [{"name": "a", "model": {"hidden": 96, "heads": 3, "vocab": 258},
                                   "parallel": {"tensor": 3}}],
                     "sweep": {"world_size": [2], "scaling": ["weak", "strong"]}})
    assert [k for k, _ in e.value.problems] == ["workload[0] (a) (world_size=2, nodes=1).parallel.tensor"]


# ----------------------------------------------------------------------------- bounded before expanded

def test_runs_are_counted_before_expansion_and_refused_over_the_limit():
    import time

    from benchsuite.config import MAX_RUNS

    doc = {"workload": [{"name": "a"}, {"name": "b"}],
           "sweep": {"world_size": list(range(1, 200_001)), "nodes": list(range(1, 51)),
                     "scaling": ["weak", "strong"]}}
    start = time.perf_counter()
    problems = _problems(doc)
    assert time.perf_counter() - start < 5  # 40 million runs are counted, never built
    assert list(problems) == ["sweep"]
    assert f"would expand to {2 * 200_000 * 50 * 2} runs" in problems["sweep"] and str(MAX_RUNS) in problems["sweep"]
    at_limit = {"workload": [{"name": "a"}], "sweep": {"world_size": list(range(1, MAX_RUNS + 1))}}
    assert len(parse_suite(at_limit).runs) == MAX_RUNS


def test_duplicate_sweep_values_are_an_error_naming_the_key():
    problems = _problems({"workload": [{"name": "a", "sweep": {"world_size": [1, 2, 2]}}],
                          "sweep": {"scaling": ["weak", "weak"]}})
    assert "duplicate value(s) 2" in problems["workload[0] (a).sweep.world_size"]
    assert "duplicate value(s) 'weak'" in problems["sweep.scaling"]
    assert "launched twice" in problems["sweep.scaling"]


@pytest.mark.parametrize("data, words", [
    ("a\x00b.bin", "NUL byte"),
    ("d/" + "x" * 256 + ".bin", "path component of 260 bytes"),
    ("é" * 128 + ".bin", "path component of 260 bytes"),  # bytes, not characters
    ("/".join(["d" * 200] * 21) + ".bin", "paths hold at most 4096 bytes"),
])
def test_impossible_data_paths_are_config_errors(data, words):
    problems = _problems({"workload": [{"name": "a", "train": {"data": data}}]})
    assert words in problems["workload[0] (a).train.data"]


def test_a_data_path_the_file_system_refuses_is_a_config_error(monkeypatch):
    """stat() failing (a folder on the path that may not be searched: EACCES, which root never sees) is a
    problem of train.data, not a traceback."""
    import benchsuite.data

    def refuse(data):
        raise PermissionError(13, "Permission denied", data)

    monkeypatch.setattr(benchsuite.data, "check_data_spec", refuse)
    problems = _problems({"workload": [{"name": "a", "train": {"data": "locked/t.bin"}}]})
    assert problems["workload[0] (a).train.data"] == "'locked/t.bin' cannot be checked: Permission denied"


def test_huge_integers_validate_at_once():
    import time

    start = time.perf_counter()
    suite = parse_suite({"workload": [{"name": "a", "model": {"layers": 10**12, "seq_len": 2**62,
                                                              "hidden": 2**62, "vocab": 2**62}}],
                         "sweep": {"world_size": [2**62]}})
    assert time.perf_counter() - start < 1 and suite.runs[0].model.layers == 10**12


@pytest.mark.parametrize("text, words", [
    ("a = " + "[" * 5000 + "]" * 5000 + "\n", "nested too deeply"),
    ("a = " + "{b = " * 3000 + "1" + "}" * 3000 + "\n", "nested too deeply"),
    ("# " + "x" * (1 << 20) + "\n", "larger than 1048576 bytes"),
    (b"[suite]\nname = '\xff'\n", "not UTF-8"),
])
def test_pathological_files_are_config_errors(tmp_path, text, words):
    path = tmp_path / "bad.toml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ConfigError) as e:
        load_suite(path)
    assert e.value.problems[0][0] == "" and words in e.value.problems[0][1]


@pytest.mark.procs
def test_a_fifo_is_refused_not_read(tmp_path):
    import os

    fifo = tmp_path / "suite.toml"
    os.mkfifo(fifo)
    res = run_cli("flops", str(fifo), timeout=60)  # reading it would block forever
    assert res.returncode == 2 and "not a regular file" in res.stderr and "Traceback" not in res.stderr


# ----------------------------------------------------------------------------- what this machine starts

def test_ranks_per_node_over_the_limit_are_refused_with_the_fix():
    from benchsuite.config import check_ranks_per_node

    suite = parse_suite({"workload": [{"name": "a"}], "sweep": {"world_size": [2, 8, 16], "nodes": [1, 2]}},
                        "s.toml")
    check_ranks_per_node(suite, [r for r in suite.runs if r.nodes == 2], 8, "4 × 2 usable cores")  # 16 / 2 = 8
    with pytest.raises(ConfigError) as e:
        check_ranks_per_node(suite, [r for r in suite.runs if r.nodes == 1], 4, "4 × 1 usable cores")
    assert [k for k, _ in e.value.problems] == ["a (world_size=8, nodes=1).sweep.world_size",
                                                "a (world_size=16, nodes=1).sweep.world_size"]
    reason = e.value.problems[0][1]
    assert "8 ranks per node, more than this machine starts (4: 4 × 1 usable cores)" in reason
    assert "--max-ranks-per-node N" in reason and "sweep.nodes" in reason


@pytest.mark.procs
def test_run_refuses_more_ranks_than_the_cores_allow_before_launch(tmp_path):
    from benchsuite.config import RANKS_PER_CORE, usable_cores

    too_many = RANKS_PER_CORE * usable_cores() + 1
    suite = write_suite(tmp_path / "s.toml", f"[[workload]]\nname = 'a'\n[sweep]\nworld_size = [{too_many}]\n")
    res = run_cli("run", str(suite), "--out", str(tmp_path / "out"), timeout=120)
    assert res.returncode == 2, res.stderr
    assert f"{too_many} ranks per node" in res.stderr and "--max-ranks-per-node" in res.stderr
    assert "Traceback" not in res.stderr and not (tmp_path / "out").exists()
    res = run_cli("run", str(suite), "--out", str(tmp_path / "out"), "--max-ranks-per-node", "0", timeout=120)
    assert res.returncode == 2 and "--max-ranks-per-node must be >= 1" in res.stderr


def test_max_ranks_per_node_overrides_the_core_bound(tmp_path):
    import argparse

    from benchsuite.commands.run import _check_ranks_per_node
    from benchsuite.config import RANKS_PER_CORE, usable_cores

    too_many = RANKS_PER_CORE * usable_cores() + 1
    suite = parse_suite({"workload": [{"name": "a"}], "sweep": {"world_size": [too_many]}}, "s.toml")
    with pytest.raises(ConfigError):
        _check_ranks_per_node(suite, argparse.Namespace(max_ranks_per_node=None, nnodes=1))
    _check_ranks_per_node(suite, argparse.Namespace(max_ranks_per_node=too_many, nnodes=1))
    _check_ranks_per_node(suite, argparse.Namespace(max_ranks_per_node=None, nnodes=2))  # another job's runs


def test_defaults_that_are_not_a_table_leave_their_keys_unjudged():
    """The user's defaults are lost: the class defaults (heads 4) must not be judged against tensor = 3."""
    for defaults in ("big", {"model": "big"}):
        problems = _problems({"defaults": defaults, "workload": [{"name": "a", "parallel": {"tensor": 3}}],
                              "sweep": {"world_size": [3]}})
        assert list(problems) == ["defaults" if defaults == "big" else "defaults.model"], problems


def test_a_seed_sweep_gives_one_run_per_seed_with_one_seed_free_identity():
    import msgspec

    from benchsuite.record.types import Config, Env
    from benchsuite.results.identity import run_identity
    from helpers.records import make_record, records_of

    (base,) = records_of([make_record()])

    def identity(run):  # the results model's: the config less its seed (and text), on one machine
        return run_identity(msgspec.structs.replace(base, config=msgspec.convert(run.to_dict(), Config), env=Env()))

    suite = parse_suite({"workload": [{"name": "a"}, {"name": "b", "sweep": {"seed": [5]}}],
                         "sweep": {"seed": [0, 1, 2], "world_size": [1, 2]}})
    a = [r for r in suite.runs if r.workload == "a" and r.world_size == 1]
    assert [r.train.seed for r in a] == [0, 1, 2]  # the sweep sets train.seed
    assert len({r.run_key({}) for r in a}) == 3  # each seed its own run and record
    assert len({identity(r) for r in a}) == 1
    assert {identity(r) for r in suite.runs if r.world_size == 2}.isdisjoint({identity(a[0])})
    assert [r.train.seed for r in suite.runs if r.workload == "b"] == [5, 5]  # a workload's own sweep wins
    no_sweep = parse_suite({"workload": [{"name": "a", "train": {"seed": 7}}]})
    assert [r.train.seed for r in no_sweep.runs] == [7]


def test_bad_seed_lists_are_refused_naming_the_key():
    problems = _problems({"workload": [{"name": "a", "sweep": {"seed": [0, -1, "x"]}}],
                          "sweep": {"seed": [3, 1, 3]}})
    assert "duplicate value(s) 3" in problems["sweep.seed"]
    assert "integers >= 0" in problems["workload[0] (a).sweep.seed"] and "-1" in problems["workload[0] (a).sweep.seed"]
    assert "× seed" in _problems({"workload": [{"name": "a"}],
                                  "sweep": {"seed": list(range(5000))}})["sweep"]


# ----------------------------------------------------------------------------- MoE keys

def _moe_workload(moe: dict) -> dict:
    return {"workload": [{"name": "m", "kind": "moe", "moe": moe}]}


def test_moe_keys_resolve_k_and_dropless():
    runs = parse_suite({"workload": [
        {"name": "tc", "kind": "moe", "moe": {"router": "token_choice", "top_k": 3, "capacity_factor": 0,
                                              "shared_experts": 2, "score": "sigmoid", "experts": 16,
                                              "expert_hidden": 32}},
        {"name": "tc2", "kind": "moe", "moe": {"router": "token_choice", "min_capacity": 4}},
        {"name": "g", "kind": "moe", "moe": {"router": "gshard", "top_k": 2}},  # the preset's own k is fine
        {"name": "s", "kind": "moe"}]}).runs
    tc, tc2, g, s = (r.moe for r in runs)
    assert (tc.k, tc.dropless, tc.shared_experts, tc.score, tc.capacity_factor) == (3, True, 2, "sigmoid", 0.0)
    assert (tc2.k, tc2.dropless, tc2.min_capacity) == (2, False, 4)
    assert (g.k, s.k, s.top_k, s.min_capacity, s.shared_experts, s.score) == (2, 1, None, 0, 0, "softmax")


@pytest.mark.parametrize("moe, key, words", [
    ({"router": "switch", "top_k": 2}, "top_k", "router = 'switch' is top-1; for top-2 use router = \"token_choice\""),
    ({"router": "gshard", "top_k": 4}, "top_k", "for top-4 use router = \"token_choice\""),
    ({"router": "expert_choice", "top_k": 2}, "top_k", "expert choice has no top_k"),
    ({"router": "token_choice", "top_k": 9, "experts": 8}, "top_k", "chooses 9 experts, more than moe.experts (8)"),
    ({"router": "gshard", "experts": 1}, "top_k", "chooses 2 experts, more than moe.experts (1)"),
    ({"router": "token_choice", "top_k": 0}, "top_k", "must be > 0"),
    ({"router": "switch", "score": "sigmoid"}, "score", "needs router = \"token_choice\""),
    ({"router": "token_choice", "score": "tanh"}, "score", "must be one of 'softmax', 'sigmoid'"),
    ({"router": "expert_choice", "capacity_factor": 0}, "capacity_factor", "expert choice needs capacity_factor > 0"),
    ({"capacity_factor": -1.0}, "capacity_factor", "must be >= 0"),
    ({"capacity_factor": 0, "min_capacity": 4}, "min_capacity", "dropless: there is no capacity"),
    ({"min_capacity": -1}, "min_capacity", "must be >= 0"),
    ({"shared_experts": -1}, "shared_experts", "must be >= 0"),
    ({"router": "gshard", "capacity_factor": 0, "second_expert_policy": "random"}, "second_expert_policy",
     "dropless) keeps every assignment"),
    ({"router": "top_k"}, "router", "must be one of 'switch', 'gshard', 'expert_choice', 'token_choice'"),
])
def test_moe_key_errors_name_the_key_and_the_fix(moe, key, words):
    problems = _problems(_moe_workload(moe))
    assert list(problems) == [f"workload[0] (m).moe.{key}"], problems
    assert words in problems[f"workload[0] (m).moe.{key}"]


def test_moe_problems_come_in_one_pass_and_a_refused_value_hides_no_other_check():
    problems = _problems({"workload": [
        {"name": "a", "kind": "moe", "moe": {"router": "switch", "top_k": 3, "score": "sigmoid"}},
        {"name": "b", "kind": "moe", "moe": {"router": "expert_choice", "capacity_factor": 0, "top_k": "two"}},
        {"name": "c", "kind": "moe", "moe": {"router": "nope", "top_k": 99, "min_capacity": 1,
                                             "capacity_factor": 0}}]})
    assert set(problems) == {"workload[0] (a).moe.top_k", "workload[0] (a).moe.score",
                             "workload[1] (b).moe.top_k", "workload[1] (b).moe.capacity_factor",
                             "workload[2] (c).moe.router", "workload[2] (c).moe.min_capacity"}, problems
    assert "expected int" in problems["workload[1] (b).moe.top_k"]


# ----------------------------------------------------------------------------- names a person can tell apart


@pytest.mark.parametrize("first, second, why", [
    ("café", "cafe\u0301", "duplicate workload name"),  # NFC vs NFD: one name once normalised
    ("dense", "Dense", "cannot be told apart from 'dense'"),  # case only
    ("dense", "\uff44\uff45\uff4e\uff53\uff45", "cannot be told apart from 'dense'"),  # fullwidth forms
])
def test_workload_names_a_person_cannot_tell_apart_are_refused_naming_both(first, second, why):
    problems = _problems({"workload": [{"name": first}, {"name": second}]})
    (key, reason), = [(k, r) for k, r in problems.items() if k.startswith("workload[1]")]
    assert key.endswith(".name") and why in reason
    if "told apart" in why:
        assert "(workload[0])" in reason and "rename one" in reason


@pytest.mark.parametrize("name, code", [("de\u200bnse", "U+200B"), ("\u202edense", "U+202E"), ("dense\u2066", "U+2066"),
                                        ("den\tse", "U+0009"), ("a\x1bb", "U+001B"), ("x\ufeff", "U+FEFF")])
def test_an_invisible_character_in_a_name_is_refused_naming_it(name, code):
    problems = _problems({"suite": {"name": name}, "workload": [{"name": name}]})
    for key in ("suite.name", "workload[0].name"):
        assert code in problems[key] and "invisible or control character" in problems[key], problems


def test_names_are_kept_in_one_normal_form():
    suite = parse_suite({"suite": {"name": "cafe\u0301s"}, "workload": [{"name": "cafe\u0301"}]}, "s.toml")
    assert suite.name == "cafés" and [r.workload for r in suite.runs] == ["café"]
    assert suite.runs[0].suite == "cafés"
