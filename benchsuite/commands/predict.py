"""`benchsuite predict SUITE.toml --system SYSTEM.toml`: each run's predicted step time by component,
memory per device and the energy and CO2e of a training run (benchsuite/predict/)."""

from __future__ import annotations

from benchsuite.commands.common import JSON, POSITIVE, path_arg, print_json, print_lines
from benchsuite.config import load_suite


def add_parser(sub) -> None:
    p = sub.add_parser("predict", parents=[JSON], help="predicted step time, memory and energy of every run on a "
                                                       "system (a system file: workloads/systems/)")
    p.add_argument("suite", type=path_arg, help="suite TOML file, e.g. workloads/dense-megatron.toml")
    p.add_argument("--system", type=path_arg, required=True,
                   help="system file (TOML), e.g. workloads/systems/h100-8x.toml")
    p.add_argument("--calibrate", type=path_arg, default=None, metavar="RECORD",
                   help="take the achieved compute rate from this single-device record of your own")
    p.add_argument("--tokens", type=POSITIVE, default=None,
                   help="tokens of the whole training run (default: 20 per parameter, Chinchilla)")
    p.set_defaults(fn=run)


def run(args) -> int:
    from benchsuite.predict import load_system, predict_run
    from benchsuite.predict.calibrate import calibrate
    from benchsuite.predict.table import prediction_doc, prediction_lines

    suite = load_suite(args.suite)
    system = load_system(args.system)
    if args.calibrate:
        system = calibrate(system, args.calibrate)
    runs = [(f"{r.workload} · w{r.world_size} · seed {r.train.seed}", predict_run(r, system, args.tokens))
            for r in suite.runs]
    if args.json:
        print_json({"suite": suite.name, "system": system.name, "system_source": system.source,
                    "runs": [prediction_doc(name, p) for name, p in runs]})
        return 0
    lines = [f"{suite.name} on {system.name} ({system.source})"]
    for name, p in runs:
        lines += prediction_lines(name, p)
    print_lines(lines)
    return 0
