"""`benchsuite list DIR`: one line per record of a results folder."""

from __future__ import annotations

from benchsuite.commands.common import JSON, err, load_results, out, path_arg, print_json
from benchsuite.terminal import printable

COLUMNS = ["run_key", "identity", "record_name", "suite", "workload", "world_size", "nodes", "scaling", "seed",
           "repeat", "status", "flagged", "started_at", "path"]


def add_parser(sub) -> None:
    ls = sub.add_parser("list", parents=[JSON], help="list the records in a results folder")
    ls.add_argument("dir", type=path_arg, nargs="?", default="results", help="results folder (default: results)")
    ls.set_defaults(fn=run)


def run(args) -> int:
    from benchsuite.results.frames import rows_of
    from benchsuite.results.model import results_of
    from benchsuite.results.report import plain

    df = results_of(load_results(args.dir)).df
    rows = [] if df.empty else [{k: plain(v) for k, v in r.items()} for r in rows_of(df, COLUMNS)]
    if args.json:
        print_json(rows)
        return 0
    for r in rows:  # printable: a record's strings never drive the terminal (escape sequences)
        status = f"{r['status']}{' ⚠' if r['flagged'] else ''}"
        # the record's name, as every view names it: what tells its run from the folder's others included
        out.print(printable(f"{r['run_key']}  {status:8}  {r['suite']}  {r['record_name']}  {r['started_at']}"),
                  markup=False)
    if not rows:
        err.print(f"no records in {printable(args.dir)}", markup=False)
    return 0
