"""The documentation (mkdocs.yml, docs/): it builds in strict mode, its reference (drawn from the code by
docs/reference_hook.py at each build) has an entry for every CLI option, suite key, record field and
system-file key, and its tutorials' code runs: the measure() loop on CPU, every `benchsuite` command line
through the real argument parser, every suite file through the suite loader."""

from __future__ import annotations

import argparse
import importlib.util
import re
import runpy
import shlex
import statistics
import tomllib
import warnings
from pathlib import Path
from typing import get_type_hints

import msgspec
import msgspec.inspect
import pytest

from benchsuite.cli import build_parser
from benchsuite.config import parse_suite

from helpers import REPO

DOCS = REPO / "docs"
_spec = importlib.util.spec_from_file_location("reference_hook", DOCS / "reference_hook.py")
hook = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hook)

ROW = re.compile(r"^\| `([^`]+)`(?:, `[^`]+`)*(?: \(optional\))? \| (.*?) \| (.*) \|$", re.M)


def rendered(page: str) -> str:
    return hook.render((DOCS / page).read_text(encoding="utf-8"))


def sections(text: str) -> dict[str, str]:
    """A page's `##` and `###` sections by their heading text."""
    parts = re.split(r"^#{2,3} (.+)$", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def code_blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"^ *```{language}\n(.*?)^ *```", text, flags=re.M | re.S)


def doc_pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md")) + [REPO / "README.md"]


# -- the reference: an entry for everything the code declares ----------------------------------------------

def parser_arguments(parser: argparse.ArgumentParser, prefix="benchsuite") -> dict[str, list[argparse.Action]]:
    """Every verb's arguments, walked from the parser itself (not through the hook)."""
    out = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out[f"{prefix} {name}"] = [a for a in sub._actions if not isinstance(
                    a, (argparse._HelpAction, argparse._SubParsersAction))]
                out |= parser_arguments(sub, f"{prefix} {name}")
    return out


def test_every_cli_option_of_every_verb_has_its_help_in_the_reference():
    by_verb = sections(rendered("reference/cli.md"))
    verbs = parser_arguments(build_parser())
    assert {"benchsuite run", "benchsuite compare", "benchsuite carbon estimate", "benchsuite slurm"} <= set(verbs)
    for verb, actions in verbs.items():
        rows = {m.group(0).split(" | ")[0]: m.group(3) for m in ROW.finditer(by_verb[f"`{verb}`"])}
        for a in actions:
            name = ", ".join(f"`{s}`" for s in a.option_strings) or f"`{(a.metavar or a.dest.upper())}`"
            row = next(text for key, text in rows.items() if key.removeprefix("| ").startswith(name))
            assert row and row == " ".join(a.help.replace("%%", "%").split()).replace("|", "\\|"), (verb, name)
        assert len(rows) == len(actions), verb


def test_a_cli_option_without_help_stops_the_reference(monkeypatch):
    import benchsuite.cli

    def with_an_undocumented_option():
        parser = build_parser()
        run = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["run"]
        run.add_argument("--fresh-option")
        return parser

    monkeypatch.setattr(benchsuite.cli, "build_parser", with_an_undocumented_option)
    with pytest.raises(ValueError, match="benchsuite run --fresh-option"):
        hook.cli_reference()


def test_every_suite_key_has_its_type_default_doc_and_rule_in_the_reference():
    from benchsuite.config.key_rules import BY_KEY, table
    from benchsuite.config.suite import TOP_KEYS
    from benchsuite.config.sweeps import SWEEP_KEYS
    from benchsuite.config.workload import WORKLOAD_KEYS
    from benchsuite.record.sections import SECTIONS

    page = rendered("reference/suite-keys.md")
    rows = {m.group(1): m.group(2, 3) for m in ROW.finditer(page)}
    for section, cls in SECTIONS.items():
        for f in msgspec.structs.fields(cls):
            key = f"{section}.{f.name}"
            assert key in rows, key
            assert rows[key][1].endswith(BY_KEY[key].applies_when if key in BY_KEY else "always"), key
    plain = sections(page)
    for heading, keys in (("`[[workload]]`", WORKLOAD_KEYS), ("`[sweep]`", SWEEP_KEYS)):
        assert set(re.findall(r"^\| `([a-z_]+)` \| \S", plain[heading], flags=re.M)) == keys, heading
    assert all(f"`[{k}]`" in page or f"`[[{k}]]`" in page for k in TOP_KEYS)
    assert rows["train.warmup_steps"] == ("integer ≥ 2", "`3` | at least 2, and 3 with compile = true | always")
    assert rows["moe.router"][0] == 'one of `"switch"`, `"gshard"`, `"expert_choice"`, `"token_choice"`'
    assert rows["carbon.pue"] == ("number ≥ 1", "`1.0` | power usage effectiveness, >= 1 | always")
    assert table() in page  # the rules' own table of where keys apply, drawn at the build


def test_a_suite_key_the_reference_does_not_describe_stops_it(monkeypatch):
    import benchsuite.config.sweeps

    monkeypatch.setattr(benchsuite.config.sweeps, "SWEEP_KEYS", benchsuite.config.sweeps.SWEEP_KEYS | {"batch"})
    with pytest.raises(ValueError, match="suite keys without a description in docs/reference_hook.py: batch"):
        hook.suite_keys()


def record_paths(cls: type, prefix: str = "") -> list[str]:
    """Every field of the record types by path, walked from the structs (a list's items as `[]`, a map's as `{}`)."""
    out = []
    for f in msgspec.structs.fields(cls):
        out.append(prefix + f.name)
        t = msgspec.inspect.type_info(get_type_hints(cls, include_extras=True)[f.name])
        join = ""
        while True:
            if isinstance(t, msgspec.inspect.Metadata):
                t = t.type
            elif isinstance(t, msgspec.inspect.UnionType):
                inner = [x for x in t.types if not isinstance(x, msgspec.inspect.NoneType)]
                t = inner[0] if len(inner) == 1 else None
            elif isinstance(t, msgspec.inspect.ListType):
                join, t = join + "[]", t.item_type
            elif isinstance(t, msgspec.inspect.DictType):
                join, t = join + "{}", t.value_type
            else:
                break
        if isinstance(t, msgspec.inspect.StructType):
            out += record_paths(t.cls, f"{prefix}{f.name}{join}.")
    return out


def test_every_record_field_has_a_reference_row():
    from benchsuite.record.columns import described, field_columns
    from benchsuite.record.types import Record

    page = rendered("reference/record-fields.md")
    rows = {m.group(1): m.group(2, 3) for m in ROW.finditer(page)}
    paths = record_paths(Record)
    assert len(paths) > 400 and set(paths) == set(rows)
    assert set(field_columns()) <= set(rows)  # every column of the results DataFrame
    assert "energy.per_device[].bound.parts[].basis" in rows
    assert rows["metrics.moe.load_max_over_mean"] == (
        "number or null", f"{described('metrics.moe.load_max_over_mean')}; flagged outside its range (max over mean)")
    assert rows["metrics.step_time_s.cv"][1] == ("sample standard deviation / mean: how steady the steps were; "
                                                 "flagged outside its range (ratio)")
    assert rows["repeat"][0] == "integer ≥ 0"


def test_every_system_file_key_has_its_doc_and_whether_it_is_required():
    from benchsuite.predict.system import OPTIONAL, SECTIONS

    rows = {m.group(1): m.group(3) for m in ROW.finditer(rendered("reference/system-file.md"))}
    keys = {f"{s}.{f.name}" for s, cls in SECTIONS.items() for f in msgspec.structs.fields(cls)}
    assert set(rows) == keys
    for key in keys:
        required, what = rows[key].split(" | ")
        assert (required == "required") == (key not in OPTIONAL), key
        assert what, key
    assert rows["system.dp_overlap"] == ("optional, default `1.0` | share of data-parallel communication hidden "
                                         "behind backward")


def test_every_argument_of_measure_is_in_its_reference():
    import inspect

    import benchsuite

    page = rendered("reference/measure-api.md")
    page = page[page.index("benchsuite.measure(name"):].split("```", 1)[1]  # the text after the signature
    arguments = list(inspect.signature(benchsuite.measure).parameters)[1:]  # the name first, then the keywords
    assert len(arguments) >= 11
    for argument in arguments:
        assert any(f"{argument}{after}" in page for after in (": ", " / ", "=")), argument  # docstring or prose


def test_an_unknown_marker_is_refused():
    with pytest.raises(ValueError, match="unknown reference marker 'cli-options'"):
        hook.render("# x\n\n<!-- reference: cli-options -->\n")


# -- what the pages show a reader runs ----------------------------------------------------------------------

@pytest.mark.heavy
def test_the_tutorial_measure_loop_runs_on_cpu_and_its_record_holds_its_figures(tmp_path, monkeypatch):
    """The own-loop tutorial's script, as a reader saves and runs it (in this process, 1-2 s with the meters'
    start): the record it prints is the loop's."""
    (code,) = code_blocks((DOCS / "tutorials" / "own-loop.md").read_text(encoding="utf-8"), "python")
    (tmp_path / "my_loop.py").write_text(code)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="no peak FLOP/s")  # a CPU has no datasheet peak: said in the page
        scope = runpy.run_path(str(tmp_path / "my_loop.py"), run_name="__main__")
    record = scope["m"].record
    assert Path(scope["m"].path).parent == Path("results/mine") and (tmp_path / scope["m"].path).is_file()
    assert (record.config.kind, record.config.workload, record.config.carbon.country, record.config.carbon.pue) \
        == ("user", "my-mlp", "FRA", 1.2)
    assert len(record.steps) == 10  # 12 steps less warmup_steps=2
    times = [s.time_s for s in record.steps]
    assert record.metrics.step_time_s.median == statistics.median(times)
    assert record.metrics.tokens_per_s == 4 * 32 / statistics.median(times)
    assert record.metrics.flops.model_per_token == 6 * (64 * 256 + 256 * 128)


def command_lines(text: str) -> list[list[str]]:
    """Every `benchsuite ...` line of a page's shell blocks, continuation lines joined, comments dropped."""
    lines = []
    for block in code_blocks(text, "bash"):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            ends = [i for i, w in enumerate(words) if w in (">", ">>", "|", "&&", ";")]  # the shell's, not the verb's
            if words and Path(words[0]).name == "benchsuite":
                lines.append(words[1:ends[0] if ends else None])
    return lines


def test_every_benchsuite_command_in_the_docs_parses_and_names_shipped_files(capsys):
    parser = build_parser()
    seen = 0
    for page in doc_pages():
        for words in command_lines(page.read_text(encoding="utf-8")):
            try:
                parser.parse_args(words)
            except SystemExit:
                pytest.fail(f"{page.relative_to(REPO)}: benchsuite {shlex.join(words)}: {capsys.readouterr().err}")
            for word in words:
                assert not word.startswith("workloads/") or (REPO / word).exists(), (page, word)
            seen += 1
    assert seen >= 25


def test_every_suite_in_the_docs_loads():
    suites = [(page, block) for page in doc_pages() for block in code_blocks(page.read_text(encoding="utf-8"), "toml")
              if block.lstrip().startswith("[suite]")]
    assert len(suites) >= 4
    for page, block in suites:
        assert parse_suite(tomllib.loads(block)).runs, page
    cluster = next(block for page, block in suites if page.name == "slurm.md")
    runs = parse_suite(tomllib.loads(cluster)).runs
    assert {(r.world_size, r.nodes) for r in runs} == {(16, 2)} and len(runs) == 2 * 3


def test_the_readme_links_only_to_pages_that_exist_and_stays_short():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\((docs/[^)#]+)", readme)
    assert len(links) >= 20 and all((REPO / link).is_file() for link in links)
    assert len(readme.splitlines()) <= 150
    assert "make test" in readme and "pip install torch==2.13.0" in readme


@pytest.mark.heavy
def test_the_site_builds_in_strict_mode(tmp_path, monkeypatch):
    """mkdocs build --strict in this process (about 3 s): a broken link or anchor, a page left out of the nav or a
    reference that cannot be drawn fails; the built CLI page holds a generated option."""
    from mkdocs.commands.build import build
    from mkdocs.config import load_config

    monkeypatch.chdir(REPO)
    monkeypatch.setenv("NO_MKDOCS_2_WARNING", "1")  # Material's banner about its successor
    build(load_config(str(REPO / "mkdocs.yml"), site_dir=str(tmp_path / "site"), strict=True))
    cli_page = (tmp_path / "site" / "reference" / "cli" / "index.html").read_text(encoding="utf-8")
    assert "--fail-on-regression" in cli_page and "<!-- reference:" not in cli_page
    assert (tmp_path / "site" / "img" / "dashboard.png").is_file()
