"""`benchsuite predict SUITE.toml --system SYSTEM.toml`: each run's predicted step time by component,
memory per device and the energy and CO2e of a training run (benchsuite/predict/)."""

from __future__ import annotations

import math
import warnings
from pathlib import Path

from benchsuite.commands.common import JSON, POSITIVE, UsageError, path_arg, print_json, print_lines
from benchsuite.config import ConfigError
from benchsuite.config.preflight import load_suite
from benchsuite.record.types import Record


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


def calibration_record(path: str) -> Record:
    """The one record of the file `--calibrate` names, read as every reader reads records; ConfigError
    naming the file when it holds none."""
    from benchsuite.results.store import load_records

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        records = load_records(path) if Path(path).is_file() else []
    if not records:
        why = f": {caught[0].message}" if caught else ": not a record file"
        raise ConfigError(path, [("--calibrate", f"cannot read the record{why}; give one record file "
                                                 f"(a .json that `benchsuite run` wrote)")])
    return records[0].record


def run(args) -> int:
    from benchsuite.predict import load_system, predict_run
    from benchsuite.predict.calibrate import calibrate
    from benchsuite.predict.table import prediction_doc, prediction_lines

    suite = load_suite(args.suite)
    system = load_system(args.system)
    if args.calibrate:
        system = calibrate(system, calibration_record(args.calibrate), args.calibrate)
    runs = [(f"{r.label} · seed {r.train.seed}", predict_run(r, system, args.tokens)) for r in suite.runs]
    for name, p in runs:
        if not all(map(math.isfinite, (p.energy.run_s, p.energy.run_facility_j, p.energy.run_co2e_g))):
            raise UsageError(f"--tokens {args.tokens:g}: the training run of {name} would take hours, kWh or CO2e "
                             f"past float range; give a number of tokens a training run has (e.g. 1e12)")
    if args.json:
        print_json({"suite": suite.name, "system": system.name, "system_source": system.source,
                    "runs": [prediction_doc(name, p) for name, p in runs]})
        return 0
    lines = [f"{suite.name} on {system.name} ({system.source})"]
    for name, p in runs:
        lines += prediction_lines(name, p)
    print_lines(lines)
    return 0
