"""`benchsuite flops SUITE.toml`: parameters and FLOPs per token of every run (metrics/tables.py)."""

from __future__ import annotations

from benchsuite.commands.common import JSON, path_arg, print_json, print_lines
from benchsuite.config.preflight import load_suite


def add_parser(sub) -> None:
    f = sub.add_parser("flops", parents=[JSON], help="parameters and FLOPs per token of every run of a suite")
    f.add_argument("suite", type=path_arg, help="suite TOML file, e.g. workloads/smoke.toml")
    f.set_defaults(fn=run)


def run(args) -> int:
    from benchsuite.metrics.tables import flops_table

    table = flops_table(load_suite(args.suite))
    if args.json:
        print_json(table.doc)
    else:
        print_lines(table.lines)
    return 0
