"""The report fits the console without cutting a number; --columns; report --json's energy rows;
the CLI's conventions (--version, help on every option, one meaning of -o, carbon project's assumptions)."""

from __future__ import annotations

import argparse
import json
import tomllib
from pathlib import Path

import pytest
from rich.console import Console

from benchsuite import cli
from benchsuite.record import to_dict
from benchsuite.results.report import Fit, column_name, report_table, section_tables
from benchsuite.results.model import results_at
from benchsuite.results.store import load_records

FIXTURES = Path(__file__).parent / "fixtures" / "results"
NUMBERS = {  # header → (the field it needs, its value as the report must show it, independently formatted)
    "world": ("world_size", lambda r: f"{r['world_size']}"),
    "tok/s (95% interval)": ("tokens_per_s", lambda r: f"{r['tokens_per_s']:,.0f}"),  # one seed: no interval
    "MFU": ("mfu", lambda r: f"{r['mfu']:.1%}"),
    "seed": ("seed", lambda r: f"{r['seed']}"),
}
MAIN_ORDER = ("suite", "workload", "world", "nodes", "scaling", "seed", "tok/s (95% interval)", "MFU", "HFU",
              "step ms (95% interval)", "efficiency", "baseline", "state MiB meas/model", "to target",
              "repeats (tok/s min–max)", "status")


@pytest.fixture(scope="module")
def df():
    return results_at(FIXTURES)


def render(table, width: int = 80) -> str:
    console = Console(width=width, record=True, highlight=False, emoji=False)
    console.print(table)
    return console.export_text()


def test_report_at_80_columns_keeps_every_number_whole(df):
    table = report_table(df, Fit(width=80))
    lines = render(table).splitlines()
    headers = [c.header for c in table.columns]
    assert set(NUMBERS) | {"workload"} <= set(headers)  # the most important come first
    assert all(len(line) <= 80 for line in lines)
    checked = 0
    for header, (field, shown) in NUMBERS.items():
        for _, row in df.runs[df.runs[field].notna()].iterrows():
            assert any(shown(row) in line for line in lines), f"{header}: {shown(row)!r} cut at 80 columns"
            checked += 1
    assert checked > 25
    left_out = [h for h in MAIN_ORDER if h not in headers]
    assert left_out, "the fixture's full table is wider than 80 columns: something must be left out"
    caption = " ".join(table.caption.split())
    assert "left out to fit the width: " + ", ".join(column_name(h) for h in left_out) in caption
    assert "--columns" in caption


def test_section_tables_fit_80_columns_and_name_what_they_leave_out(df):
    for table in section_tables(df, Fit(width=80)):
        text = render(table)
        assert all(len(line) <= 80 for line in text.splitlines()), table.title
        assert table.columns[0].header == "run"
    energy = next(t for t in section_tables(df, Fit(width=80)) if t.title.startswith("Energy"))
    assert "j_pflop" in energy.caption or "intensity_source" in energy.caption
    wide = next(t for t in section_tables(df, Fit(width=400)) if t.title.startswith("Energy"))
    assert wide.caption is None and len(wide.columns) == 13  # with the meters' ± bound
    assert [len(t.columns) for t in section_tables(df)] == [11, 13, 10]  # no width given: every column
    assert len(report_table(df).columns) == 16 and report_table(df).caption.count("left out") == 0


def test_columns_pick_exactly_those_in_that_order(df):
    table = report_table(df, Fit(width=80, columns=("workload", "seed", "hfu", "tok_s", "to_target")))
    assert [c.header for c in table.columns] == ["workload", "seed", "HFU", "tok/s (95% interval)", "to target"]
    assert "left out" not in (table.caption or "")
    energy = [t for t in section_tables(df, Fit(width=80, columns=("run", "total_j")))
              if t.title.startswith("Energy")][0]
    assert [c.header for c in energy.columns] == ["run", "total J"]
    # a section table keeps the column naming its run beside what --columns picked from it
    moe = [t for t in section_tables(df, Fit(width=80, columns=("workload", "seed", "tok_s")))
           if t.title.startswith("MoE")][0]
    assert [c.header for c in moe.columns] == ["run", "tok/s"]


def test_report_columns_option_on_the_command_line(capsys):
    assert cli.main(["report", str(FIXTURES), "--columns", "workload,HFU"]) == 0
    header = next(line for line in capsys.readouterr().out.splitlines() if "workload" in line)
    assert "HFU" in header and "MFU" not in header and "tok/s" not in header


def test_unknown_column_exits_2_naming_it_and_the_valid_ones(capsys):
    assert cli.main(["report", str(FIXTURES), "--columns", "workload,tokps"]) == 2
    err = capsys.readouterr().err
    assert "--columns" in err and "tokps" in err and "tok_s" in err and "step_ms" in err


def test_report_json_has_the_energy_rows_typed(capsys):
    assert cli.main(["report", str(FIXTURES), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    by_run = {r["identity"]: r for r in doc["energy"]}
    results = results_at(FIXTURES)
    expected = {}  # identity -> its records with an energy source
    for i, identity in zip(results.df["rec"], results.df["identity"]):
        rec = results.records[i]
        if rec.energy and rec.energy.source:
            expected.setdefault(identity, []).append(rec)
    assert set(by_run) == set(expected) and expected
    for identity, recs in expected.items():  # a run of one record: its figures; of several: their median
        row = by_run[identity]
        totals = [r.energy.total_j for r in recs if r.energy.total_j is not None]
        assert row["energy.total_j"] == (pytest.approx(sorted(totals)[len(totals) // 2]) if len(totals) % 2
                                         else pytest.approx(sum(sorted(totals)[len(totals) // 2 - 1:][:2]) / 2)
                                         if totals else None)
        assert row["energy.source"] == recs[-1].energy.source
        assert row["world_size"] == recs[0].config.world_size and isinstance(row["world_size"], int)


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0
    pyproject = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    assert capsys.readouterr().out.strip() == f"benchsuite {pyproject['project']['version']}"


def _options(parser: argparse.ArgumentParser, verb: str = "benchsuite"):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _options(sub, f"{verb} {name}")
        elif not isinstance(action, argparse._HelpAction):
            yield verb, action


def test_every_option_of_every_verb_has_help():
    missing = [f"{verb} {'/'.join(a.option_strings) or a.dest}" for verb, a in _options(cli.build_parser())
               if not (a.help or "").strip()]
    assert missing == []


def test_dash_o_is_the_output_path_of_its_verb_everywhere():
    dash_o = [(verb, a) for verb, a in _options(cli.build_parser()) if "-o" in a.option_strings]
    assert {verb for verb, _ in dash_o} == {"benchsuite dashboard", "benchsuite slurm", "benchsuite export",
                                             "benchsuite tokenize"}
    for verb, a in dash_o:
        assert a.help.startswith("output path of this verb: "), verb


def test_carbon_project_text_states_its_assumptions_and_sources(tmp_path, capsys):
    rec = json.loads((FIXTURES / "make_dvs-dense-w2.json").read_text())
    rec["energy"].update(source="estimated", short_window=True)
    path = tmp_path / "rec.json"
    path.write_text(json.dumps(rec))
    args = ["carbon", "project", str(path), "--tokens", "1e12"]
    assert cli.main([*args, "--devices", "64", "--intensity", "100"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    tps_dev = rec["metrics"]["tokens_per_s"] / rec["config"]["world_size"]
    assert ("J/token, the run's median over its seeds and repeats, from estimated energy of gpu, cpu, dram (an "
            "estimate, not a meter's reading)" in text)
    assert "short window: a record's energy window was shorter than the meters resolve" in text
    assert (f"throughput: {tps_dev:,.0f} tok/s per device as measured at world 2, held constant at 64 devices"
            in text)
    assert f"PUE {rec['carbon']['pue']:g} from the record; intensity 100 g/kWh from explicit" in text

    rec["energy"].update(source="measured", short_window=False)
    path.write_text(json.dumps(rec))
    assert cli.main([*args, "--pue", "1.5"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "from measured energy of gpu, cpu, dram (an energy counter)" in text
    assert "no short-window flag" in text
    assert "PUE 1.5 from --pue" in text


def _answer(capsys, folder) -> tuple[str, str]:
    """The report's text, and its dense-vs-sparse table's (the first table), each on one line."""
    assert cli.main(["report", str(folder)]) == 0
    text = capsys.readouterr().out
    first = text.split("benchsuite results")[0]
    return " ".join(text.split()), " ".join(first.split())


def test_report_gives_the_dense_vs_sparse_answer_first_and_in_words(capsys):
    text, answer = _answer(capsys, FIXTURES)
    assert text.startswith("Dense vs sparse: each sparse run ÷ the dense run of its suite")
    assert text.index("Dense vs sparse") < text.index("benchsuite results") < text.index("Claims")
    recs = {one.path.name: one.record for one in load_records(FIXTURES)}
    ratio = (recs["make_dvs-switch-w1.json"].metrics.tokens_per_s
             / recs["make_dvs-dense-w1.json"].metrics.tokens_per_s)  # one seed each: the ratio of the two
    assert f"│ switch · w1 │ tok/s {ratio:.2f}×" in answer and "│ ÷ dense · w1 │" in answer
    assert "one seed on a side: no interval (sweep train.seed)" in answer
    assert "no dense run of their suite on the same devices and scaling: <img src=x onerror=alert(1)> · w1" in answer
    assert "not compared: energy per token, energy to target, CO2e to target (energy not measured" in answer
    for field in ("tokens_per_s", "j_per_token", "quality.", "final_val_loss", "co2e_g"):
        assert field not in answer, field  # words, not the results model's column names


def test_the_answer_ranks_a_ratio_whose_interval_over_seeds_excludes_one(tmp_path, capsys):
    import copy

    docs = {one.path.name: to_dict(one.record) for one in load_records(FIXTURES)}
    for name, speeds in (("make_dvs-dense-w1.json", (1.0, 1.02, 0.99)), ("make_dvs-switch-w1.json", (1.5, 1.52, 1.49))):
        for seed, speed in enumerate(speeds):
            rec = copy.deepcopy(docs[name])
            rec["config"]["train"]["seed"] = seed
            rec["run_key"] = f"{rec['run_key']}{seed}"
            rec["metrics"]["tokens_per_s"] = 20000 * speed
            (tmp_path / f"{rec['run_key']}.json").write_text(json.dumps(rec))
    _, answer = _answer(capsys, tmp_path)
    assert "│ switch · w1 │ tok/s 1.50× (" in answer and "): switch · w1 higher" in answer


def test_a_long_table_draws_its_first_rows_and_sums_up_the_rest(tmp_path, capsys):
    """A team's folder holds thousands of runs: rich took minutes to lay out a 10,000-row table."""
    from benchsuite.commands.report import ROWS
    from benchsuite.record import write_record
    from helpers.records import make_record

    n = ROWS + 7
    for i in range(n):
        status = "failed" if i == n - 1 else "ok"
        write_record(tmp_path, make_record(f"k{i:03d}", workload=f"w{i:03d}", status=status))
    assert cli.main(["report", str(tmp_path), "--columns", "workload,status"]) == 0
    text = capsys.readouterr().out
    assert sum(f"w{i:03d}" in text for i in range(n)) == ROWS
    assert "… 7 more rows not shown (1 failed, 0 flagged among them): `benchsuite report --all` draws every one" in text
    assert cli.main(["report", str(tmp_path), "--columns", "workload,status", "--all"]) == 0
    text = capsys.readouterr().out
    assert sum(f"w{i:03d}" in text for i in range(n)) == n and "more rows not shown" not in text
    assert cli.main(["report", str(tmp_path), "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["runs"]) == n  # --json gives every run


def test_the_dense_vs_sparse_answer_draws_its_first_pairs_and_counts_the_rest():
    """One dense run against many sparse ones (a sweep over routers or sizes): the answer draws fit.rows pairs
    of runs, and names the rest's count and how to see them."""
    from benchsuite.results.report import answer_table
    from benchsuite.results.verdicts import verdicts

    v = verdicts(results_at(FIXTURES))
    pairs = {(p.suite, p.sparse, p.dense) for p in v.pairs}
    assert len(pairs) >= 3
    cut = render(answer_table(v, Fit(rows=2)), width=200)
    assert sum(f"÷ {dense}" in cut for _, _, dense in pairs) <= 2 * len({d for _, _, d in pairs})
    assert f"… {len(pairs) - 2:,} more pairs of runs not shown: `benchsuite report --all` draws every one" in cut
    whole = render(answer_table(v), width=200)
    assert "more pairs of runs" not in whole
    assert sum(line.startswith("│ ") and "÷" in line for line in whole.splitlines()) == len(pairs)
    assert sum(line.startswith("│ ") and "÷" in line for line in cut.splitlines()) == 2

