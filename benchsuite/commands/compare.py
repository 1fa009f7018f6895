"""`benchsuite compare A B`: B against A, run by run, with 95 % intervals over the runs' repeats."""

from __future__ import annotations

from benchsuite.commands.common import JSON, UsageError, err, out, path_arg, print_json
from benchsuite.terminal import printable


def add_parser(sub) -> None:
    cm = sub.add_parser("compare", parents=[JSON],
                        help="B against A (two commits, two clusters): ratios of tok/s, MFU, J/token "
                             "and gCO2e/Mtok with 95 %% intervals over the repeats, run by run")
    cm.add_argument("a", type=path_arg, help="results folder A (the baseline)")
    cm.add_argument("b", type=path_arg, help="results folder B (compared against A)")
    cm.add_argument("--threshold", type=float, default=0.05,
                    help="smallest change that counts, as a fraction (default 0.05: 5 %%)")
    cm.add_argument("--ignore", action="append", default=[], metavar="KEY[,KEY...]",
                    help="config keys left out of the match, e.g. train.seed: runs that differ only by them "
                         "are compared as one, their records pooled; a row that pools several configurations "
                         "names them per side, with the values it holds (repeatable)")
    cm.add_argument("--fail-on-regression", action="store_true",
                    help="exit 1 when any figure of B is significantly worse than A (with no interval, one "
                         "repeat a side: worse beyond --threshold on the point estimate), or a run of A failed "
                         "in B or is missing from B (for CI)")
    cm.set_defaults(fn=run)


def ignore_keys(values: list[str]) -> list[str]:
    """--ignore a,b --ignore c as ['a', 'b', 'c'], each once, in the order given."""
    keys = [k.strip() for v in values for k in v.split(",") if k.strip()]
    return list(dict.fromkeys(keys))


def run(args) -> int:
    """B against A, run by run; exit 1 on a regression only with --fail-on-regression (a figure with no
    interval judged on its point estimate: a gate must not pass what it cannot judge), 2 when no run of one
    folder matches a run of the other."""
    from benchsuite.results.compare import (CompareError, compare_folders, comparison_doc, comparison_table,
                                            left_out_lines, regression_lines)

    if not 0 <= args.threshold < 1:
        raise UsageError(f"--threshold must be in [0, 1) (a fraction: 0.05 is 5 %), got {args.threshold:g}")
    try:
        c = compare_folders(args.a, args.b, threshold=args.threshold, ignore=ignore_keys(args.ignore))
    except ValueError as e:  # identity.ignored_paths: an unknown key
        raise UsageError(f"--ignore: {e}") from None
    except CompareError as e:
        raise UsageError(str(e)) from None
    for line in left_out_lines(c):
        err.print(printable(line), markup=False)
    if args.json:
        print_json(comparison_doc(c))
    else:
        if c.runs:
            out.print(comparison_table(c))
        for f in c.failed_in_b:
            out.print(printable(f"failed in B ({c.b}): {f.run}: {f.error}"), markup=False)
        for side, folder, runs in (("A", c.a, c.only_a), ("B", c.b, c.only_b)):
            for r in runs:
                out.print(printable(f"only in {side} ({folder}): {r.run} on {r.hardware} (config {r.identity}); "
                                    f"{r.closest}"), markup=False)
    for line in regression_lines(c):
        err.print(printable(line), markup=False)
    if not c.runs and not c.failed_in_b:  # nothing compared is no verdict: a gate on the wrong folder must not pass
        err.print(printable(f"no run of {c.a} matches a run of {c.b} (same resolved config): nothing to compare; "
                            f"compare two folders of the same suite and settings, or --ignore the keys that "
                            f"differ (each unmatched run names them)"), markup=False)
        return 2
    return 1 if args.fail_on_regression and c.regressions else 0
