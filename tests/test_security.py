"""Security: records are JSON only (nothing in the package unpickles, evaluates or runs a shell);
every string a record carries reaches the dashboard and the terminal as text (no markup, no escape
sequences); data and output paths are checked before anything runs, with a message, not a traceback.
(tests/test_slurm.py covers quoting in sbatch scripts, newlines and backticks included;
tests/test_dashboard.py the fixture folder's hostile record.)"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from benchsuite import cli
from benchsuite.commands import run as run_verb
from benchsuite.config import ConfigError
from benchsuite.config.preflight import load_suite
from benchsuite.record import write_record
from helpers import REPO, run_cli, write_suite
from helpers.escaping import assert_site_escapes, assert_terminal_safe
from helpers.records import make_record

PACKAGES = [REPO / "benchsuite"]

# ----------------------------------------------------------------------------- no code from data

UNSAFE_MODULES = {"pickle", "cPickle", "dill", "shelve", "marshal", "cloudpickle", "joblib"}
UNSAFE_CALLS = {"eval", "exec", "__import__"}


def _dotted(node) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def unsafe_uses(source: str, filename: str) -> list[str]:
    """pickle-like imports, eval/exec, torch.load without weights_only=True, a shell for subprocess, os.system/popen,
    yaml.load: each a way for a crafted results folder or config to run code."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        where = f"{filename}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Import):
            found += [f"{where}: import {a.name}" for a in node.names if a.name.split(".")[0] in UNSAFE_MODULES]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in UNSAFE_MODULES:
            found.append(f"{where}: from {node.module} import ...")
        elif isinstance(node, ast.Call):
            name = _dotted(node.func)
            kw = {k.arg: k.value for k in node.keywords}
            if name in UNSAFE_CALLS:
                found.append(f"{where}: {name}()")
            if name.endswith("torch.load") or name == "load" and "weights_only" in kw:
                wo = kw.get("weights_only")
                if not (isinstance(wo, ast.Constant) and wo.value is True):
                    found.append(f"{where}: {name}() without weights_only=True")
            if "shell" in kw and not (isinstance(kw["shell"], ast.Constant) and kw["shell"].value is False):
                found.append(f"{where}: {name}(shell=...)")
            if name in ("os.system", "os.popen", "yaml.load", "yaml.unsafe_load", "numpy.load", "np.load"):
                if name.endswith("load") and "np" in name:
                    ap = kw.get("allow_pickle")
                    if ap is None or (isinstance(ap, ast.Constant) and ap.value is False):
                        continue
                found.append(f"{where}: {name}()")
    return found


def test_the_guard_itself_finds_each_pattern():
    bad = ("import pickle\nfrom dill import loads\nimport torch\ntorch.load(f)\ntorch.load(f, weights_only=False)\n"
           "eval('1')\nexec('x=1')\nimport subprocess\nsubprocess.run('ls', shell=" "True)\nos.system('ls')\n"
           "np.load(f, allow_pickle=True)\n")
    assert len(unsafe_uses(bad, "bad.py")) == 9
    fine = ("torch.load(f, weights_only=True)\nmodel.eval()\nsubprocess.run(['ls'])\nnp.load(f)\n"
            "json.loads(s)\nre.compile('x').search(s)\n")
    assert unsafe_uses(fine, "fine.py") == []


def test_no_module_unpickles_evaluates_or_runs_a_shell():
    found = []
    for pkg in PACKAGES:
        for path in sorted(pkg.rglob("*.py")):
            found += unsafe_uses(path.read_text(encoding="utf-8"), str(path.relative_to(REPO)))
    assert found == [], "records and configs must stay data: " + "; ".join(found)


def test_page_script_never_evaluates_strings():
    for js in sorted((REPO / "benchsuite" / "dashboard" / "assets").glob("*.js")):
        text = js.read_text(encoding="utf-8")
        for pattern in (r"\beval\s*\(", r"new\s+Function\s*\(", r"document\.write\s*\(", r"setTimeout\s*\(\s*['\"]",
                        r"insertAdjacentHTML", r"\.outerHTML\s*="):
            assert not re.search(pattern, text), (js.name, pattern)


# ----------------------------------------------------------------------------- escaped outputs

PAYLOADS = {
    "suite": '<script>alert("suite")</script>',
    "workload": "<img src=x onerror=alert(1)>",
    "description": '"><svg onload=alert(2)>',
    "error": "</script><script>alert('err')</script><iframe src=javascript:alert(7)>",
}


def _hostile_records(out: Path) -> None:
    ok = make_record("ok1", workload=PAYLOADS["workload"])
    ok["suite"] = ok["config"]["suite"] = PAYLOADS["suite"]
    ok["config"]["description"] = PAYLOADS["description"]
    ok["config"]["kind"], ok["config"]["moe"] = "moe", {"router": "switch"}  # a router is one of four names
    failed = make_record("bad1", workload=PAYLOADS["workload"] + " 2", status="failed")
    failed["error"]["message"] = PAYLOADS["error"]
    failed["error"]["type"] = "<i onclick=alert(8)>Err</i>"
    for rec in (ok, failed):
        write_record(out, rec)


def test_dashboard_escapes_suite_workload_description_and_error_text(tmp_path):
    out = tmp_path / "results"
    _hostile_records(out)
    assert_site_escapes(out, tmp_path / "site", list(PAYLOADS.values()) + ["<i onclick=alert(8)>Err</i>"])


def test_terminal_report_and_list_show_markup_and_escape_sequences_as_text(tmp_path, capsys):
    rec = make_record("esc1", workload="w [red]red[/red] \x1b]0;pwned\x07\x1b[2J\x9b31m")
    rec["suite"] = "[link=https://evil.example]click[/link]"
    rec["energy"] = {"source": "estimated", "total_j": 1.0}  # (a source is one of four words: the types refuse others)
    rec["carbon"] = {"intensity_source": "grid\x1b]8;;https://evil.example\x07", "pue": 1.0}
    write_record(tmp_path, rec)
    failed = make_record("esc2", workload="f", status="failed")
    failed["error"]["type"] = "Boom\x1b[31m"
    write_record(tmp_path, failed)
    for verb in ("report", "list"):
        assert cli.main([verb, str(tmp_path)]) == 0
        shown = capsys.readouterr().out
        assert_terminal_safe(shown)
        if verb == "list":  # (the report's table cuts long names to the terminal's width)
            assert "[red]red[/red]" in shown and "\\x1b]0;pwned\\x07" in shown
            assert "[link=https://evil.example]click[/link]" in shown  # markup shown as text, not a link


# ----------------------------------------------------------------------------- paths


def test_out_pointing_at_a_file_is_refused_with_a_message(tmp_path, tiny_suite, capsys):
    suite, existing = tiny_suite(), tmp_path / "results.txt"
    existing.write_text("not a folder")
    assert cli.main(["run", str(suite), "--out", str(existing)]) == 2
    assert "exists and is not a folder" in capsys.readouterr().err
    assert existing.read_text() == "not a folder"
    assert cli.main(["run", str(suite), "--out", str(existing / "sub")]) == 2
    assert f"{existing} is a file, not a folder" in capsys.readouterr().err


@pytest.mark.procs
def test_out_pointing_at_a_file_as_a_process_exits_2_without_traceback(tmp_path, tiny_suite):
    existing = tmp_path / "results.txt"
    existing.write_text("x")
    res = run_cli("run", str(tiny_suite()), "--out", str(existing), timeout=120)
    assert res.returncode == 2 and "Traceback" not in res.stderr and "not a folder" in res.stderr


def test_train_data_is_checked_before_launch(tmp_path, monkeypatch):
    from benchsuite.data import write_bin

    monkeypatch.chdir(tmp_path)
    text = """
    [defaults]
    model = {{ vocab = {vocab} }}
    [[workload]]
    name = "w"
    train = {{ data = "{data}" }}
    """
    cases = {"missing.bin": "does not exist", "empty.bin": "not a positive multiple", "notes.txt": "not a .bin",
             "folder.bin": "is not a file"}
    (tmp_path / "empty.bin").write_bytes(b"")
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "folder.bin").mkdir()
    for data, words in cases.items():
        with pytest.raises(ConfigError) as e:
            load_suite(write_suite(tmp_path / "s.toml", text.format(vocab=256, data=data)))
        (key, reason), = e.value.problems
        assert key.endswith(".train.data") and words in reason and data in reason, (key, reason)
    with pytest.raises(ConfigError) as e:
        load_suite(write_suite(tmp_path / "s.toml", text.format(vocab=128, data="builtin")))
    (key, reason), = e.value.problems
    assert key.endswith(".model.vocab") and "257" in reason
    write_bin(tmp_path / "tokens.bin", list(range(100)) * 10)
    assert load_suite(write_suite(tmp_path / "s.toml", text.format(vocab=256, data="tokens.bin"))).runs
    assert load_suite(write_suite(tmp_path / "s.toml", text.format(vocab=300, data="builtin"))).runs


# ----------------------------------------------------------------------------- one renderer for the terminal

from benchsuite.terminal import printable  # noqa: E402

# a right-to-left override, an isolate, rich markup, an emoji code, an OSC retitle + BEL, clear-screen
HOSTILE = "\u202e\u2066[/bold]w[red]:warning:\x1b]0;pwned\x07\x1b[2J"
HOSTILE_TOML = r'"\u202e\u2066[/bold]w[red]:warning:\u001b]0;pwned\u0007\u001b[2J"'
SHOWN = r"\u202e\u2066[/bold]w[red]:warning:\x1b]0;pwned\x07\x1b[2J"  # what the terminal shows
RAW = ["\x1b]0;pwned", "\x07", "\x1b[2J", "\u202e", "\u2066"]
# what a suite may name a workload (no invisible or control character: config.name_problem) that a
# terminal library might still act on: rich markup, an emoji code, HTML
VISIBLE_HOSTILE = "[/bold]w[red]:warning:<b>x</b>"


def test_printable_shows_controls_bidi_overrides_and_surrogates_escaped():
    assert printable(HOSTILE) == SHOWN
    assert printable("\x00\t\n\r\x7f\x9b") == r"\x00\x09\x0a\x0d\x7f\x9b"
    assert printable("".join(map(chr, [0x61c, 0x200e, 0x200f, *range(0x202a, 0x202f), *range(0x2066, 0x206a)]))) == (
        r"\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
    assert printable("bad\udcff") == r"bad\udcff"  # a lone surrogate (a non-UTF-8 file name) cannot break stdout
    assert printable("é → ✓ 日本 [b]") == "é → ✓ 日本 [b]" and printable(None) == "None"


def _hostile_suite(path: Path, name_toml: str = HOSTILE_TOML) -> Path:
    return write_suite(path, f"""
    [suite]
    name = {name_toml}
    [defaults]
    model = {{ layers = 1, hidden = 16, heads = 2, vocab = 64, seq_len = 8 }}
    train = {{ micro_batch = 2, steps = 3, warmup_steps = 2, timeout_s = 120 }}
    [[workload]]
    name = {name_toml}
    kind = "dense"
    """)


def _hostile_results(out: Path) -> Path:
    rec = make_record("h1", workload=HOSTILE)
    rec["suite"] = rec["config"]["suite"] = HOSTILE
    write_record(out, rec)
    return out


def _verb_argv(verb: str, tmp_path: Path) -> tuple[list[str], int, str]:
    """The command line that shows a hostile name through `verb`, its exit code, and what the
    terminal must show of the name."""
    if verb == "warning: unreadable record":  # the reader's warning names the file
        (tmp_path / "bad").mkdir()
        name = HOSTILE.replace("/", "-")
        (tmp_path / "bad" / f"{name}.json").write_text("{not json")
        return ["list", str(tmp_path / "bad")], 0, SHOWN.replace("/", "-")
    suite = str(_hostile_suite(tmp_path / "hostile.toml"))
    results = str(_hostile_results(tmp_path / "results"))
    if verb in ("flops", "memory"):  # a suite naming a workload with invisible characters is refused, naming them
        return [verb, suite], 2, "U+202E (RIGHT-TO-LEFT OVERRIDE) at position 0"
    argv, code = {"report": (["report", results], 0), "list": (["list", results], 0),
                  "carbon project": (["carbon", "project", results, "--tokens", "1e9"], 0),
                  "error: no results folder": (["list", str(tmp_path / HOSTILE)], 2),
                  "error: suite file": (["flops", str(tmp_path / HOSTILE)], 2),
                  "error: option": (["memory", "--dp", HOSTILE], 2),
                  "dashboard -o": (["dashboard", results, "-o", str(tmp_path / "site" / HOSTILE)], 0)}[verb]
    return argv, code, SHOWN


@pytest.mark.parametrize("verb", ["report", "list", "flops", "memory", "carbon project", "error: no results folder",
                                  "error: suite file", "error: option", "dashboard -o",
                                  "warning: unreadable record"])
def test_every_verb_shows_a_hostile_name_as_text(tmp_path, capsys, verb):
    argv, code, name = _verb_argv(verb, tmp_path)
    try:
        assert cli.main(argv) == code
    except SystemExit as e:  # argparse's own errors
        assert e.code == code
    shown = "".join(capsys.readouterr())
    assert_terminal_safe(shown)
    assert not [r for r in RAW if r in shown], shown
    if verb != "report":  # (the report's table may cut a long name short)
        assert name in shown.replace("\n", ""), shown


@pytest.mark.procs
def test_run_on_a_terminal_shows_a_hostile_workload_name(tmp_path, monkeypatch):
    """rich's live progress and the outcome lines, as on a TTY: `[/bold]` once crashed the run."""
    import io

    from rich.console import Console

    buf = io.StringIO()
    monkeypatch.setattr(run_verb, "err", Console(file=buf, force_terminal=True, width=300, highlight=False,
                                                 emoji=False, soft_wrap=True))
    suite = _hostile_suite(tmp_path / "s.toml", json.dumps(VISIBLE_HOSTILE))
    assert cli.main(["run", str(suite), "--out", str(tmp_path / "r")]) == 0
    shown = buf.getvalue()
    assert f"✓ {VISIBLE_HOSTILE} · w1 · weak · seed 0 · repeat 0" in re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", shown)
    assert [r["workload"] for r in map(json.loads, map(Path.read_text, (tmp_path / "r").glob("*.json")))] \
        == [VISIBLE_HOSTILE]
    # a name with invisible characters never reaches a terminal or a record: refused before anything runs
    assert cli.main(["run", str(_hostile_suite(tmp_path / "h.toml")), "--out", str(tmp_path / "h")]) == 2
    assert not (tmp_path / "h").exists() or not list((tmp_path / "h").glob("*.json"))
