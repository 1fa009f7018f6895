"""`benchsuite export DIR`: the records as codecarbon's emissions.csv, or what it has no column for
(footprint.csv: the energy's bound, market-based, embodied, water)."""

from __future__ import annotations

from pathlib import Path

from benchsuite.commands.common import OUTPUT, UsageError, err, load_results, not_an_input, path_arg


def add_parser(sub) -> None:
    ex = sub.add_parser("export", help="export records, e.g. as codecarbon's emissions.csv")
    ex.add_argument("dir", type=path_arg, nargs="?", default="results", help="results folder (default: results)")
    ex.add_argument("--format", choices=["codecarbon", "footprint"], default="codecarbon",
                    help="codecarbon: its emissions.csv columns and units; footprint: the energy's bound, "
                         "market-based, embodied and water per run, joined to emissions.csv by run_id")
    ex.add_argument("-o", "--output", type=path_arg, help=OUTPUT + "the CSV file (default: DIR/emissions.csv or "
                    "DIR/footprint.csv, or beside the "
                    "record when DIR is one record file); an existing codecarbon file gets the rows appended, as "
                    "codecarbon does")
    ex.set_defaults(fn=run)


def run(args) -> int:
    from benchsuite.atomic import naming
    from benchsuite.results.export import FORMATS, ExportError, write_csv

    records = [one.record for one in load_results(args.dir)]
    folder = Path(args.dir) if not Path(args.dir).is_file() else Path(args.dir).parent
    output = Path(args.output or folder / ("emissions.csv" if args.format == "codecarbon" else "footprint.csv"))
    not_an_input("-o", output, args.dir)
    if output.name.endswith(".json") and folder.resolve() in output.resolve().parents:
        raise UsageError(f"-o {output}: a .json file in the results folder {folder} is read as a record by every "
                         "verb; name the CSV *.csv, or write it elsewhere")
    try:
        with naming(output):  # its checks looking at a name too long for the file system
            res = write_csv(records, output, FORMATS[args.format])
    except ExportError as e:
        raise UsageError(str(e)) from None
    if res.appended:
        skipped = f" ({res.rows_already_there} already there)" if res.rows_already_there else ""
        err.print(f"appended {res.rows_written} rows to {res.path}{skipped}", markup=False)
    else:
        err.print(f"wrote {res.path}: {res.rows_written} rows", markup=False)
    return 0
