"""Config fuzzing: random TOML documents and random mutations of every shipped suite either load
or raise ConfigError naming a key (or the file, for syntax errors); no other exception escapes,
and nothing is launched (no results folder is created) for an invalid file.

Bounded: a few hundred examples per property, no deadline, the whole module well under 30 s.
"""

from __future__ import annotations

import copy
import json
import math
import re
import time
import tomllib
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchsuite import cli
from benchsuite.config import (MAX_RUNS, SECTIONS, SWEEP_KEYS, TOP_KEYS, CarbonConfig, ConfigError, EnergyConfig,
                               RunConfig)
from benchsuite.config.preflight import load_suite
from benchsuite.metrics.flops import flops_per_token
from helpers import REPO, run_cli

SHIPPED = sorted((REPO / "workloads").glob("*.toml"))
FUZZ = settings(max_examples=200, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

# ----------------------------------------------------------------------------- a tiny TOML writer

_BARE = re.compile(r"[A-Za-z0-9_-]+")


def _string(s: str) -> str:
    # JSON string escapes are TOML basic-string escapes; TOML also forbids a raw DEL.
    return json.dumps(s, ensure_ascii=False).replace("\x7f", "\\u007f")


def _key(k: str) -> str:
    return k if _BARE.fullmatch(k) else _string(k)


def _value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return _string(v)
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{_key(k)} = {_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(type(v))


def _is_table_array(v) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(x, dict) for x in v)


def to_toml(doc: dict) -> str:
    """Scalars and inline values at the root first, then [tables], then [[arrays of tables]]."""
    lines = [f"{_key(k)} = {_value(v)}" for k, v in doc.items()
             if not isinstance(v, dict) and not _is_table_array(v)]
    for k, v in doc.items():
        if isinstance(v, dict):
            lines += ["", f"[{_key(k)}]"] + [f"{_key(kk)} = {_value(vv)}" for kk, vv in v.items()]
    for k, v in doc.items():
        if _is_table_array(v):
            for item in v:
                lines += ["", f"[[{_key(k)}]]"] + [f"{_key(kk)} = {_value(vv)}" for kk, vv in item.items()]
    return "\n".join(lines) + "\n"


def test_the_writer_round_trips_what_tomllib_reads():
    for path in SHIPPED:
        doc = tomllib.loads(path.read_text())
        assert tomllib.loads(to_toml(doc)) == doc, path.name
    odd = {"a b": {"ключ": "x\x7f\n\"y", "n": float("-inf"), "t": {"u": [1, "two", 3.5]}}, "w": [{"k": 1}]}
    back = tomllib.loads(to_toml(odd))
    assert back["a b"]["ключ"] == "x\x7f\n\"y" and back["a b"]["n"] == float("-inf") and back["w"] == [{"k": 1}]


# ----------------------------------------------------------------------------- the property


def check_loads_or_names_a_key(path: Path, text_desc: str = "") -> str:
    """load_suite(path) either returns a usable suite or raises ConfigError whose problems each name a
    key (or the file, key "", for a file that is not TOML); anything else fails with the input shown."""
    try:
        suite = load_suite(path)
    except ConfigError as e:
        assert e.problems, "ConfigError without problems"
        assert str(path) in str(e), "the message must name the file"
        for key, reason in e.problems:
            assert isinstance(key, str) and isinstance(reason, str) and reason.strip(), (key, reason)
            if not key:
                assert reason.startswith(("TOML syntax error", "cannot read file", "file not found")), reason
        return "error"
    except Exception as e:  # catch-all: every other exception is a bug
        pytest.fail(f"{type(e).__name__}: {e}\n--- input ---\n{path.read_text(errors='replace')[:3000]}"
                    f"\n{text_desc}")
    try:
        for run in suite.runs:
            d = run.to_dict()
            json.dumps(d, allow_nan=False)  # the record's config must be strict JSON
            assert RunConfig.from_dict(copy.deepcopy(d)) == run
            assert run.nproc_per_node * run.nodes == run.world_size
            # what the launcher and parallel/ take for granted of a validated run
            assert run.data_parallel >= 1 and run.micro_batch_per_rank >= 1
            assert run.world_size % run.parallel.tensor == 0 and run.model.hidden % run.model.heads == 0
            if run.parallel.tensor > 1:
                assert run.model.heads % run.parallel.tensor == 0 and run.model.vocab % run.parallel.tensor == 0
            if run.parallel.expert > 1:
                assert run.kind == "moe" and run.moe.experts % run.parallel.expert == 0
                assert run.data_parallel % run.parallel.expert == 0
            run.run_key({"gpus": [], "cpu": "x", "machine": "y"})
            f = flops_per_token(run.model, run.moe, micro_batch=run.micro_batch_per_rank,
                                recompute=run.train.recompute)
            assert f.model > 0 and math.isfinite(f.model) and f.hardware > 0 and math.isfinite(f.hardware)
    except Exception as e:
        pytest.fail(f"a suite that validated is unusable: {type(e).__name__}: {e}\n--- input ---\n"
                    f"{path.read_text(errors='replace')[:3000]}")
    return "ok"


# ----------------------------------------------------------------------------- strategies

NAMES = st.text(max_size=12) | st.sampled_from(["dense", "sparse", "Ω-модель 🚀", "", " ", "a/b\\c", "..", "<b>x</b>"])
NUMBERS = (st.integers(-3, 9) | st.integers(-2**70, 2**70) | st.sampled_from([0, -1, 2**63 - 1, 2**63, 10**400])
           | st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([0.0, -0.0, 1e308, 1e-320, 0.5]))
CHOICES = st.sampled_from(["gelu", "swiglu", "switch", "gshard", "expert_choice", "none", "full", "auto", "fp32",
                           "bf16", "synthetic", "builtin", "/nonexistent/tokens.bin", "weak", "strong", "dense",
                           "moe", "FRA", "all", "random"])
SCALARS = st.booleans() | NUMBERS | CHOICES | NAMES
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(NAMES, inner, max_size=3),
                      max_leaves=6)


def _section(cls) -> st.SearchStrategy:
    keys = [f.name for f in msgspec.structs.fields(cls)] + ["bogus"]
    return st.dictionaries(st.sampled_from(keys), SCALARS | VALUES, max_size=4)


SECTION_TABLES = {name: _section(cls) for name, cls in SECTIONS.items()}
SWEEP = st.dictionaries(st.sampled_from(sorted(SWEEP_KEYS) + ["bogus"]),
                        st.lists(st.integers(-1, 8) | SCALARS, max_size=4) | SCALARS, max_size=3)
WORKLOAD = st.fixed_dictionaries({"name": NAMES}, optional={
    "kind": st.sampled_from(["dense", "moe"]) | SCALARS, "description": NAMES | SCALARS, "sweep": SWEEP | SCALARS,
    **SECTION_TABLES, "bogus": SCALARS})
SCHEMA_DOCS = st.fixed_dictionaries({}, optional={
    "suite": st.dictionaries(st.sampled_from(["name", "description", "bogus"]), NAMES | SCALARS, max_size=3),
    "defaults": st.fixed_dictionaries({}, optional=SECTION_TABLES) | VALUES,
    "workload": st.lists(WORKLOAD, min_size=1, max_size=3) | VALUES,
    "sweep": SWEEP | SCALARS, "energy": _section(EnergyConfig) | SCALARS, "carbon": _section(CarbonConfig) | SCALARS,
    "bogus": VALUES})
ANY_DOCS = st.dictionaries(st.sampled_from(sorted(TOP_KEYS)) | NAMES, VALUES, max_size=5)


@pytest.fixture(scope="module")
def suite_file(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz") / "suite.toml"


OUTCOMES: dict[str, dict[str, int]] = {}


def _count(kind: str, outcome: str) -> None:
    OUTCOMES.setdefault(kind, {"ok": 0, "error": 0})[outcome] += 1


@pytest.mark.heavy  # 200 documents, over a second in this process: the full pass runs it, the fast tier does not
@FUZZ
@given(doc=SCHEMA_DOCS | ANY_DOCS)
def test_random_documents_load_or_raise_config_error(suite_file, doc):
    suite_file.write_text(to_toml(doc), encoding="utf-8")
    _count("random", check_loads_or_names_a_key(suite_file))


def _paths(node, prefix=()):
    """Every key path in a parsed document (list items by index)."""
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for k, v in items:
        yield prefix + (k,)
        yield from _paths(v, prefix + (k,))


def _parent(doc, path):
    node = doc
    for k in path[:-1]:
        node = node[k]
    return node


WRONG = st.sampled_from([None, "delete"]) | SCALARS | st.lists(SCALARS, max_size=2) | st.just({"x": 1})


@pytest.mark.heavy  # in this process, a second or more: the full pass runs it, the fast tier does not
@FUZZ
@given(data=st.data())
def test_mutated_shipped_suites_load_or_raise_config_error(suite_file, data):
    path = data.draw(st.sampled_from(SHIPPED), label="file")
    doc = tomllib.loads(path.read_text())
    for _ in range(data.draw(st.integers(1, 3), label="mutations")):
        paths = list(_paths(doc))
        if not paths:
            break
        where = data.draw(st.sampled_from(paths), label="path")
        parent, last = _parent(doc, where), where[-1]
        new = copy.deepcopy(data.draw(WRONG, label="value"))  # never mutate a strategy's constant
        if new is None or new == "delete":
            del parent[last]
        elif data.draw(st.booleans(), label="add a sibling key instead") and isinstance(parent, dict):
            parent[data.draw(NAMES, label="new key") or "k"] = new
        else:
            parent[last] = new
    suite_file.write_text(to_toml(doc), encoding="utf-8")
    _count("mutated", check_loads_or_names_a_key(suite_file))


SMALL = st.integers(0, 8)
COMBO_DOCS = st.fixed_dictionaries({
    "defaults": st.fixed_dictionaries({
        "model": st.fixed_dictionaries({"layers": st.integers(1, 3), "hidden": st.sampled_from([24, 32, 48, 64]),
                                        "heads": st.integers(1, 8), "vocab": st.sampled_from([96, 128, 256, 300])}),
        "train": st.fixed_dictionaries({"micro_batch": SMALL, "data": st.sampled_from(["synthetic", "builtin"])}),
        "parallel": st.fixed_dictionaries({"tensor": st.integers(1, 4), "zero": st.integers(0, 3),
                                           "expert": st.integers(1, 4)})}),
    "workload": st.lists(st.fixed_dictionaries({"name": st.sampled_from(["a", "b", "c"]),
                                                "kind": st.sampled_from(["dense", "moe"])},
                                               optional={"moe": st.fixed_dictionaries(
                                                   {"experts": st.integers(1, 8), "every": st.integers(1, 4)})}),
                         min_size=1, max_size=2),
    "sweep": st.fixed_dictionaries({"world_size": st.lists(st.integers(1, 8), min_size=1, max_size=3),
                                    "nodes": st.lists(st.integers(1, 2), min_size=1, max_size=2),
                                    "scaling": st.sampled_from(["weak", "strong", ["weak", "strong"]])}),
})


@pytest.mark.heavy  # in this process, a second or more: the full pass runs it, the fast tier does not
@FUZZ
@given(doc=COMBO_DOCS)
def test_parallel_combinations_are_valid_or_refused_before_launch(suite_file, doc):
    """Plausible values, many impossible together (tensor vs heads, expert vs experts and data parallel,
    strong scaling vs batch, nodes vs world size): a suite that loads satisfies every precondition."""
    suite_file.write_text(to_toml(doc), encoding="utf-8")
    _count("combinations", check_loads_or_names_a_key(suite_file))


@FUZZ
@given(data=st.data())
def test_byte_level_damage_to_shipped_suites_is_a_config_error_naming_the_file(suite_file, data):
    path = data.draw(st.sampled_from(SHIPPED), label="file")
    raw = bytearray(path.read_bytes())
    for _ in range(data.draw(st.integers(1, 4), label="edits")):
        i = data.draw(st.integers(0, max(0, len(raw) - 1)), label="offset")
        op = data.draw(st.sampled_from(["delete", "insert", "truncate", "dup"]), label="op")
        if op == "delete":
            del raw[i:i + data.draw(st.integers(1, 8))]
        elif op == "insert":
            raw[i:i] = data.draw(st.sampled_from([b"[", b"]", b"=", b'"', b"\n", b"\xff\xfe", b"{", b"#", b"\x00",
                                                  b"nan", b"-", b"[[workload]]\n"]))
        elif op == "truncate":
            del raw[i:]
        else:
            line_end = raw.find(b"\n", i) + 1 or len(raw)
            raw[line_end:line_end] = raw[i:line_end]
    suite_file.write_bytes(bytes(raw))
    _count("bytes", check_loads_or_names_a_key(suite_file))


CRASHERS = [  # found by the properties above; each once escaped as another exception or an unclear key
    ({"workload": [{"name": "w", "kind": "moe", "moe": {"capacity_factor": 10**400}}]}, "moe.capacity_factor"),
    ({"workload": [{"name": "w"}], "sweep": {"world_size": False, "scaling": ["weak", "strong"]}},
     "sweep.world_size"),
    ({"workload": [{"name": "w"}], "sweep": {"world_size": [2**64]}}, "sweep.world_size"),
    ({"workload": [{"name": "w", "model": {"layers": 2**64}}]}, "model.layers"),
    ({"carbon": [], "": []}, '""'),
]


@pytest.mark.parametrize("doc, key", CRASHERS, ids=[k for _, k in CRASHERS])
def test_inputs_that_once_crashed_the_loader_are_config_errors(suite_file, doc, key):
    suite_file.write_text(to_toml(doc), encoding="utf-8")
    with pytest.raises(ConfigError) as e:
        load_suite(suite_file)
    assert any(k.endswith(key) for k, _ in e.value.problems), e.value.problems


# ----------------------------------------------------------------------------- defects always refused, in time

DEFECT_SECONDS = 5.0  # one load of a defective suite, on a loaded 2-core box; validation itself takes milliseconds
_DEEP = "@@deep@@"  # replaced in the TOML text by a nested value (the writer itself recurses)


def _nested(data) -> str:
    depth = data.draw(st.integers(100, 3000), label="depth")
    opening, closing = data.draw(st.sampled_from([("[", "]"), ("{ a = ", "}")]), label="nesting")
    return opening * depth + ("1" if opening != "[" else "") + closing * depth


def _data_defect(data) -> str:
    kind = data.draw(st.sampled_from(["nul", "component", "path"]), label="data defect")
    if kind == "nul":
        return data.draw(st.text(max_size=8), label="before") + "\x00" + data.draw(st.text(max_size=8)) + ".bin"
    if kind == "component":
        return "d/" + data.draw(st.sampled_from(["x", "é", "ж"])) * data.draw(st.integers(256, 3000)) + ".bin"
    return "/".join(["p" * 250] * data.draw(st.integers(17, 40))) + ".bin"


def _apply_defect(doc: dict, data, defect: str) -> str:
    """Put one defect into a valid document (each kind in its own place); return the key its problem names."""
    workload = data.draw(st.sampled_from(doc["workload"]), label="workload")
    train = workload.setdefault("train", {})
    if defect == "data":
        train["data"] = _data_defect(data)
        return "train.data"
    if defect == "warmup":
        train["warmup_steps"] = data.draw(st.integers(-3, 1), label="warmup")
        if data.draw(st.booleans(), label="compile"):
            train.update(warmup_steps=2, compile=True)
        return "train.warmup_steps"
    if defect == "duplicate":
        key = data.draw(st.sampled_from(["world_size", "nodes", "scaling"]), label="key")
        values = {"world_size": [1, 2, 4], "nodes": [1, 2], "scaling": ["weak", "strong"]}[key]
        twice = data.draw(st.permutations(values + [data.draw(st.sampled_from(values))]), label="list")
        doc["sweep"][key] = twice  # the suite's sweep; "runs" below sets a workload's own
        return f"sweep.{key}"
    if defect == "runs":
        n = data.draw(st.integers(1, 5000), label="world sizes")
        workload["sweep"] = {"world_size": list(range(1, n + 1)), "nodes": list(range(1, MAX_RUNS // n + 2)),
                             "scaling": ["weak", "strong"]}
        return "sweep"
    if defect == "deep":
        section = data.draw(st.sampled_from(["model", "train", "parallel"]), label="section")
        workload.setdefault(section, {})[data.draw(st.sampled_from(["layers", "steps", "tensor", "bogus"]))] = _DEEP
        return section
    raise AssertionError(defect)


VALID_DOC = {"suite": {"name": "d"}, "defaults": {"model": {"layers": 1, "hidden": 32, "heads": 2, "vocab": 64,
                                                            "seq_len": 8}},
             "workload": [{"name": "a"}, {"name": "b", "kind": "moe", "moe": {"experts": 4, "every": 1}}],
             "sweep": {"world_size": [1, 2]}}


@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large])
@given(data=st.data())
def test_defective_suites_are_config_errors_naming_every_defect_within_a_time_bound(suite_file, data):
    """NUL bytes and over-long names in train.data, warm-up below the minimum, duplicate sweep values, sweeps
    over the run limit and values nested hundreds or thousands deep, one to four at once: always one
    ConfigError naming each defect's key (all in one pass), never a traceback, within DEFECT_SECONDS."""
    doc = copy.deepcopy(VALID_DOC)
    defects = data.draw(st.lists(st.sampled_from(["data", "warmup", "duplicate", "runs", "deep"]), min_size=1,
                                 max_size=4, unique=True), label="defects")
    keys = [_apply_defect(doc, data, d) for d in defects]
    text = to_toml(doc)
    while f'"{_DEEP}"' in text:
        text = text.replace(f'"{_DEEP}"', _nested(data), 1)
    suite_file.write_text(text, encoding="utf-8")
    start = time.perf_counter()
    assert check_loads_or_names_a_key(suite_file) == "error", f"{defects} loaded"
    assert time.perf_counter() - start < DEFECT_SECONDS
    with pytest.raises(ConfigError) as e:
        load_suite(suite_file)
    found = [k for k, _ in e.value.problems]
    if found == [""]:  # nested beyond what the TOML parser reads: the file is refused as a whole
        assert "deep" in defects and "nested too deeply" in e.value.problems[0][1]
        return
    for defect, key in zip(defects, keys):
        assert any(f".{key}" in k or k.startswith(key) for k in found), (defect, key, found)


@pytest.mark.heavy  # in this process, a second or more: the full pass runs it, the fast tier does not
def test_fuzzing_explored_both_outcomes(suite_file):
    """The generators are not degenerate: some inputs load and many are refused. Unless all four properties
    ran before it in this session, it runs them itself (derandomized: the same counts as a run of the module)."""
    props = {"random": test_random_documents_load_or_raise_config_error,
             "mutated": test_mutated_shipped_suites_load_or_raise_config_error,
             "combinations": test_parallel_combinations_are_valid_or_refused_before_launch,
             "bytes": test_byte_level_damage_to_shipped_suites_is_a_config_error_naming_the_file}
    if set(OUTCOMES) != set(props):
        OUTCOMES.clear()
        for prop in props.values():
            prop(suite_file)
    print("fuzz outcomes:", OUTCOMES)
    assert sum(o["error"] for o in OUTCOMES.values()) > 100
    assert sum(o["ok"] for o in OUTCOMES.values()) > 10


# ----------------------------------------------------------------------------- nothing launched

INVALID = {
    "syntax": ("[suite\nname = 'x'\n", "<file>"),
    "wrong type": ("[[workload]]\nname = 'w'\nmodel = { layers = 'two' }\n", "model.layers"),
    "huge float": ("[[workload]]\nname = 'w'\nkind = 'moe'\nmoe = { capacity_factor = " + "9" * 400 + " }\n",
                   "moe.capacity_factor"),
    "nan": ("[[workload]]\nname = 'w'\ntrain = { lr = nan }\n", "train.lr"),
    "impossible": ("[[workload]]\nname = 'w'\nparallel = { tensor = 3 }\n[sweep]\nworld_size = [2]\n",
                   "parallel.tensor"),
    "missing data": ("[[workload]]\nname = 'w'\ntrain = { data = 'no/such/tokens.bin' }\n", "train.data"),
    "nul in data": ('[[workload]]\nname = "w"\ntrain = { data = "a\\u0000.bin" }\n', "train.data"),
    "long name in data": (f'[[workload]]\nname = "w"\ntrain = {{ data = "{"x" * 300}.bin" }}\n', "train.data"),
    "deep nesting": ("[[workload]]\nname = 'w'\nmodel = { layers = " + "[" * 3000 + "]" * 3000 + " }\n", "<file>"),
    "warm-up": ("[[workload]]\nname = 'w'\ntrain = { warmup_steps = 1 }\n", "train.warmup_steps"),
    "duplicate sweep": ("[[workload]]\nname = 'w'\n[sweep]\nworld_size = [1, 2, 1]\n", "sweep.world_size"),
    "too many runs": ("[[workload]]\nname = 'w'\n[sweep]\nworld_size = " + str(list(range(1, 3000))) +
                      "\nnodes = [1, 2]\n", "sweep"),
    # the idle baseline is measured within the run's time limit: it would be killed while measuring idle power
    "idle past the time limit": ("[[workload]]\nname = 'w'\ntrain = { timeout_s = 60 }\n[energy]\n"
                                 "idle_baseline_s = 1e300\n", "energy.idle_baseline_s"),
}


@pytest.mark.parametrize("case", sorted(INVALID))
def test_run_refuses_an_invalid_suite_before_creating_anything(tmp_path, capsys, case):
    text, key = INVALID[case]
    bad, out = tmp_path / "bad.toml", tmp_path / "out"
    bad.write_text(text)
    assert cli.main(["run", str(bad), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert key in err and str(bad) in err
    assert not out.exists()


DATA_DEFECTS = {  # a token file that exists and is well formed, but that the worker cannot train model on
    "ids beyond model.vocab": (list(range(1000)), "needs model.vocab >= 1000"),
    "too few tokens for seq_len": ([1, 2, 3], "has 3 tokens, too few for model.seq_len = 16"),
}


@pytest.mark.parametrize("case", sorted(DATA_DEFECTS))
def test_a_token_file_that_does_not_fit_the_model_is_refused_before_launch(tmp_path, capsys, case):
    from benchsuite.data import write_bin

    ids, reason = DATA_DEFECTS[case]
    data, bad, out = tmp_path / "tokens.bin", tmp_path / "bad.toml", tmp_path / "out"
    write_bin(data, ids)
    bad.write_text(f"[[workload]]\nname = 'w'\nmodel = {{ vocab = 512, seq_len = 16 }}\n"
                   f"train = {{ data = '{data}' }}\n")
    with pytest.raises(ConfigError) as e:  # the old loader checked only the file's size: the run failed in the worker
        load_suite(bad)
    assert [(key, reason in why) for key, why in e.value.problems] == [("workload[0] (w).train.data", True)]
    assert cli.main(["run", str(bad), "--out", str(out)]) == 2 and not out.exists()
    assert reason in capsys.readouterr().err


@pytest.mark.procs
@pytest.mark.parametrize("case", ["syntax", "wrong type", "deep nesting", "nul in data", "long name in data"])
def test_run_refuses_an_invalid_suite_as_a_process_exit_2_no_traceback(tmp_path, case):
    text, key = INVALID[case]
    bad, out = tmp_path / "bad.toml", tmp_path / "out"
    bad.write_text(text)
    res = run_cli("run", str(bad), "--out", str(out), timeout=120)
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr and key in res.stderr
    assert not out.exists()
