"""`benchsuite compare A B`: B against A, run by run, with bootstrap CIs."""

from __future__ import annotations

from benchsuite.commands.common import JSON, UsageError, err, out, path_arg, print_json
from benchsuite.terminal import printable


def add_parser(sub) -> None:
    cm = sub.add_parser("compare", parents=[JSON],
                        help="B against A (two commits, two clusters): ratios of tok/s, MFU, J/token "
                             "and gCO2e/Mtok with bootstrap 95 %% CIs, run by run")
    cm.add_argument("a", type=path_arg, help="results folder A (the baseline)")
    cm.add_argument("b", type=path_arg, help="results folder B (compared against A)")
    cm.add_argument("--threshold", type=float, default=0.05,
                    help="smallest change that counts, as a fraction (default 0.05: 5 %%)")
    cm.add_argument("--fail-on-regression", action="store_true",
                    help="exit 1 when any figure of B is significantly worse than A (for CI)")
    cm.set_defaults(fn=run)


def run(args) -> int:
    """B against A, run by run; exit 1 on a significant regression only with --fail-on-regression, 2 when
    no run of one folder matches a run of the other."""
    from benchsuite.results.compare import CompareError, compare_folders, comparison_doc, comparison_table

    if not 0 <= args.threshold < 1:
        raise UsageError(f"--threshold must be in [0, 1) (a fraction: 0.05 is 5 %), got {args.threshold:g}")
    try:
        c = compare_folders(args.a, args.b, threshold=args.threshold)
    except CompareError as e:
        raise UsageError(str(e)) from None
    if args.json:
        print_json(comparison_doc(c))
    else:
        if c.runs:
            out.print(comparison_table(c))
        for side, folder, runs in (("A", c.a, c.only_a), ("B", c.b, c.only_b)):
            for r in runs:
                out.print(printable(f"only in {side} ({folder}): {r.run} on {r.hardware} "
                                    f"(config {r.identity})"), markup=False)
        for r in c.regressions:
            err.print(printable(f"regression: {r.run}"), markup=False)
    if not c.runs:  # nothing compared is no verdict: a CI gate on the wrong folder must not pass
        err.print(printable(f"no run of {c.a} matches a run of {c.b} (same resolved config): nothing to compare; "
                            f"compare two folders of the same suite and settings"), markup=False)
        return 2
    return 1 if args.fail_on_regression and c.regressions else 0
