"""`benchsuite memory`: per-device model-state bytes of DDP and ZeRO 1/2/3 (ZeRO paper formulas), and
activations (metrics/tables.py). With a suite, each run's own precision sets the constants, as in its
record; --precision overrides."""

from __future__ import annotations

from benchsuite.commands.common import COUNT, JSON, PARAMS, UsageError, path_arg, print_json, print_lines
from benchsuite.config.preflight import load_suite


def add_parser(sub) -> None:
    mm = sub.add_parser("memory", parents=[JSON], help="per-device model-state bytes of DDP and ZeRO stages 1/2/3")
    mm.add_argument("suite", type=path_arg, nargs="?", default=None, help="suite TOML: use its models' parameter counts")
    mm.add_argument("--params", type=PARAMS, default=None, help="parameter count Ψ (e.g. 7.5e9)")
    mm.add_argument("--dp", type=COUNT, default=None,
                    help="data-parallel degree N (default with a suite: each run's own)")
    mm.add_argument("--precision", choices=("mixed", "fp32"), default=None,
                    help="mixed: 2+2+K with K = 12 (the paper); fp32: 4+4+8. Default: each run's train.precision "
                         "(\"auto\": bf16 with a CUDA device here, else fp32); with --params only, mixed")
    mm.set_defaults(fn=run)


def run(args) -> int:
    from benchsuite.metrics.tables import memory_table_for_params, memory_table_for_suite

    if args.suite is None and args.params is None:
        raise UsageError("give a suite (its models' parameter counts) or --params N")
    if args.suite is None and args.dp is None:
        raise UsageError("--dp N (the data-parallel degree) is needed with --params")
    if args.suite is None:
        table = memory_table_for_params(args.params, args.dp, args.precision)
    else:
        import torch

        suite = load_suite(args.suite)
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # what "auto" resolves to here
        table = memory_table_for_suite(suite, device, args.precision, args.params, args.dp)
    if args.json:
        print_json(table.doc)
    else:
        print_lines(table.lines)
    return 0
