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
                   help="system file (TOML), e.g. workloads/systems/h100-8x.toml; `host`: measure this host's CPU "
                        "rates, links and framework time first (about a minute)")
    p.add_argument("--write-system", type=path_arg, default=None, metavar="PATH",
                   help="with --system host: also write the measured system file here, to reuse and edit")
    p.add_argument("--calibrate", type=path_arg, default=None, metavar="RECORD",
                   help="take the achieved compute rate from this single-device record of your own")
    p.add_argument("--tokens", type=POSITIVE, default=None,
                   help="tokens of the whole training run (default: 20 per parameter, Chinchilla)")
    p.add_argument("--precision", choices=("as-run", "fp8"), default="as-run",
                   help="fp8: the weight matmuls in FP8 at the system file's device.fp8_matmul_tflops, with the "
                        "casts' cost (prediction only: the harness trains in fp32 or bf16)")
    p.add_argument("--expert-load", type=POSITIVE, default=None, metavar="RATIO",
                   help="busiest expert ÷ mean token load of the MoE runs (default: the system file's "
                        "experts.load_max_over_mean, an assumption each prediction states)")
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


HOST = "host"


def host_system_measured(write_to: str | None):
    """This host's System, measured (predict/host.py), its file written to `write_to` when given."""
    from benchsuite.commands.common import err
    from benchsuite.predict.host import host_system, measure_host, system_toml

    err.print("measuring this host: matmul, memory, operator floor, gloo collectives (about a minute) …")
    doc = measure_host()
    if write_to:
        Path(write_to).write_text(system_toml(doc), encoding="utf-8")
        err.print(f"wrote {write_to}")
    return host_system(doc)


def run(args) -> int:
    from benchsuite.predict import load_system
    from benchsuite.predict.calibrate import calibrate
    from benchsuite.predict.compare import default_predict, dense_vs_moe
    from benchsuite.predict.table import comparison_lines, prediction_doc, prediction_lines

    suite = load_suite(args.suite)
    if args.write_system and args.system != HOST:
        raise UsageError(f"--write-system writes what --system {HOST} measures; give --system {HOST}")
    system = host_system_measured(args.write_system) if args.system == HOST else load_system(args.system)
    fp8 = args.precision == "fp8"
    if fp8 and system.device.fp8_matmul_tflops is None:
        raise ConfigError(args.system, [("device.fp8_matmul_tflops", "needed by --precision fp8: add the device's "
                                                                     "achieved FP8 matmul rate (and fp8_peak_tflops), "
                                                                     "or predict as run")])
    if args.expert_load is not None and args.expert_load < 1:
        raise UsageError(f"--expert-load {args.expert_load:g}: the busiest expert carries at least the mean load; "
                         f"give a ratio >= 1 (e.g. 1.2)")
    if args.calibrate:
        system = calibrate(system, calibration_record(args.calibrate), args.calibrate)
    predict_one = default_predict(fp8, args.expert_load)
    named = [(f"{r.label} · seed {r.train.seed}", r) for r in suite.runs]
    runs = [(name, predict_one(r, system, args.tokens)) for name, r in named]
    for name, p in runs:
        if not all(map(math.isfinite, (p.energy.run_s, p.energy.run_facility_j, p.energy.run_co2e_g))):
            raise UsageError(f"--tokens {args.tokens:g}: the training run of {name} would take hours, kWh or CO2e "
                             f"past float range; give a number of tokens a training run has (e.g. 1e12)")
    pairs = dense_vs_moe(named, system, args.tokens, predict_one)
    label = " (FP8: prediction only)" if fp8 else ""
    if args.json:
        print_json({"suite": suite.name, "system": system.name, "system_source": system.source,
                    "precision": "fp8 (prediction only)" if fp8 else "as run",
                    "runs": [prediction_doc(name, p) for name, p in runs],
                    "dense_vs_moe": [c.to_dict() for c in pairs]})
        return 0
    lines = [f"{suite.name} on {system.name} ({system.source}){label}"]
    for name, p in runs:
        lines += prediction_lines(name, p)
    lines += comparison_lines(pairs)
    print_lines(lines)
    return 0
