"""`benchsuite report DIR`: the results table, its sections and the verdicts over seeds."""

from __future__ import annotations

from benchsuite.commands.common import JSON, UsageError, err, load_results, out, path_arg, print_json
from benchsuite.terminal import printable


ROWS = 50  # rows a table draws by default: a screen or two; a team's folder holds thousands of runs


def add_parser(sub) -> None:
    rp = sub.add_parser("report", parents=[JSON], help="table of results: throughput, MFU, step time, scaling")
    rp.add_argument("dir", type=path_arg, nargs="?", default="results", help="results folder (default: results)")
    rp.add_argument("--columns", metavar="A,B,...",
                    help="the columns to show, by name (e.g. workload,world,seed,tok_s,mfu,hfu); default: the most "
                         "important that fit the console width, the others named under each table")
    rp.add_argument("--all", action="store_true",
                    help=f"draw every row (default: the first {ROWS} of each table, the rest summed up under it)")
    rp.add_argument("--predict", metavar="SYSTEM.toml", type=path_arg,
                    help="a system file (benchsuite predict): each run's measured step time beside its prediction, "
                         "a run far slower flagged with the component most likely responsible")
    rp.set_defaults(fn=run)


def run(args) -> int:
    from benchsuite.results.model import results_of
    from benchsuite.results.report import ColumnError, Fit
    from benchsuite.results.store import cyclic_gc_paused

    fit = Fit(width=out.width, columns=None if args.columns is None else
              tuple(c.strip().lower() for c in args.columns.split(",") if c.strip()), rows=None if args.all else ROWS)
    try:
        fit.check()
    except ColumnError as e:
        raise UsageError(str(e)) from None
    system = None
    if args.predict is not None:
        from benchsuite.predict import load_system

        system = load_system(args.predict)  # a ConfigError names the file, key and fix (exit 2)
    with cyclic_gc_paused():  # thousands of rows of small objects, none in a cycle (store.cyclic_gc_paused)
        return _report(args, fit, results_of(load_results(args.dir), source=str(args.dir)), system)


def _report(args, fit, results, system) -> int:
    from benchsuite.results.predicted import beside, beside_table
    from benchsuite.results.report import (ENERGY_COLUMNS, ENERGY_WHEN, answer_table, report_rows, report_table,
                                           section_rows, section_tables, verdict_tables)
    from benchsuite.results.verdicts import verdicts, verdicts_doc

    predicted = beside(results, system) if system is not None else None
    v = verdicts(results)
    if args.json:
        print_json({"runs": report_rows(results), "verdicts": verdicts_doc(v),
                    "energy": section_rows(results, ENERGY_COLUMNS, ENERGY_WHEN),
                    "routing": [p.to_dict() for p in results.routing_pairs],
                    **({"predicted": [b.to_dict() for b in predicted]} if predicted is not None else {})})
        return 0
    if results.runs.empty:
        err.print(f"no records in {printable(args.dir)}", markup=False)
        return 0
    answer = answer_table(v, fit)  # the answer first, then the runs and their sections
    for table in ([answer] if answer else []) + [report_table(results, fit)] + section_tables(results, fit) + \
            ([beside_table(predicted)] if predicted else []) + verdict_tables(v, fit):
        out.print(table)
    return 0
