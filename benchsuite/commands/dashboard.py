"""`benchsuite dashboard DIR -o SITE`: the static, offline Plotly site."""

from __future__ import annotations

from benchsuite.commands.common import (JSON, OUTPUT, UsageError, err, make_folder, out, path_arg, print_json,
                                        results_path)
from benchsuite.terminal import printable


def add_parser(sub) -> None:
    db = sub.add_parser("dashboard", parents=[JSON],
                        help="build the static, offline Plotly site from a results folder")
    db.add_argument("dir", type=path_arg, nargs="?", default="results", help="results folder (default: results)")
    db.add_argument("-o", "--out", type=path_arg, default="site",
                    help=OUTPUT + "the site folder (default: site); opens as OUT/index.html")
    db.add_argument("--predict", metavar="SYSTEM.toml", type=path_arg,
                    help="a system file (benchsuite predict): each run page shows its measured step time beside its "
                         "prediction, a run far slower flagged with the component most likely responsible")
    db.set_defaults(fn=run)


def run(args) -> int:
    from benchsuite.dashboard import build_site
    from benchsuite.dashboard.build import SiteError

    results_path(args.dir)  # checked here; the site reads it (and names it as its source)
    system = None
    if args.predict is not None:
        from benchsuite.predict import load_system

        system = load_system(args.predict)  # a ConfigError names the file, key and fix (exit 2)
    make_folder("-o", args.out, "site folder")
    try:
        res = build_site(args.dir, args.out, system=system)
    except SiteError as e:
        raise UsageError(f"-o {e}") from None
    except OSError as e:  # a page's path taken by a folder, the disk full, ...: never a half-written file
        raise UsageError(f"-o {args.out}: the site is not fully rebuilt ({e}); each file in it is whole, and its "
                         "index.html, written last, links only pages that exist") from None
    if args.json:
        print_json({"index": str(res.index), "records": res.records, "pages": res.pages})
        return 0
    if not res.records:
        err.print(f"no records in {printable(args.dir)}: the site says so", markup=False)
    err.print(f"{res.records} runs, {len(res.pages)} pages, {res.bytes / 2**20:.1f} MiB → {printable(args.out)}",
              markup=False)
    out.print(printable(res.index), markup=False)
    return 0
