"""`--calibrate RECORD`: the achieved compute rate from the user's own single-device record.

One device has no communication and no bubble, so its measured median step time is compute plus the
memory-bound terms (optimizer, MoE router and permutation) and the host floor. The rate that makes this
package's prediction of that very run reproduce that time (found by bisection: the prediction falls as the
rate rises) replaces the system file's matmul and attention rates: one measurement cannot tell the two
apart, so both get it. The record comes in as read (the command reads the file), so this package stays
below the readers.
"""

from __future__ import annotations

import dataclasses

from benchsuite.config import CarbonConfig, ConfigError, RunConfig
from benchsuite.predict.step import predict, record_expert_load
from benchsuite.predict.system import System
from benchsuite.predict.workload import from_run
from benchsuite.record.types import Kind, Record, Status

BISECTIONS = 100  # halvings of the rate's log range: far below any rate's noise


def calibrate(system: System, rec: Record, source: str) -> System:
    """The system with the achieved rate measured in `rec` (an ok record of world size 1), read from
    `source` (the file, named in every problem and in the system's source)."""
    if rec.status is not Status.OK or rec.config.kind is Kind.USER:
        raise ConfigError(source, [("--calibrate", "needs an ok record of a benchsuite run (not a failed run or "
                                                   "a benchsuite.measure() loop); give another record")])
    run = RunConfig.from_record(rec.config)
    if run.world_size != 1:
        raise ConfigError(source, [("--calibrate", f"needs a single-device record (world size 1), this one ran "
                                                   f"on {run.world_size}: its time holds communication; give a "
                                                   f"world-1 record of the same device")])
    other = other_device(system, rec)
    if other:
        raise ConfigError(source, [("--calibrate", f"{other}: its rate is not this system's; give a record of "
                                                   f"this system's device (or a system file of the record's)")])
    w = from_run(run, system.device.kind)
    step = rec.metrics.step_time_s.median if rec.metrics and rec.metrics.step_time_s else None
    if step is None:
        raise ConfigError(source, [("--calibrate", "the record has no median step time (metrics.step_time_s.median "
                                                   "is null); give a record of a run that measured its steps")])
    w = dataclasses.replace(w, expert_load=record_expert_load(rec), expert_load_source=source)

    def step_at(rate: float) -> float:
        return predict(w, system.calibrated(rate, rate, ""), carbon=CarbonConfig()).step_s

    top = system.device.peak_tflops or 1e6
    if step_at(top) > step:
        raise ConfigError(source, [("--calibrate", f"the record's step ({step:.4g} s) is shorter than this system "
                                                   f"predicts at its peak ({top:g} TFLOP/s): it is a record of "
                                                   f"another device (or check device.memory_gbps and "
                                                   f"system.op_floor_us); give a record of this one")])
    low, high = top * 1e-9, top
    for _ in range(BISECTIONS):
        mid = (low * high) ** 0.5
        low, high = (mid, high) if step_at(mid) > step else (low, mid)
    rate = high
    device = rec.env.devices[0].name if rec.env.devices else "unknown device"
    return system.calibrated(rate, rate, f"compute rate {rate:.4g} TFLOP/s calibrated from {source} "
                                         f"({device}, {step:.4g} s per step)")


def other_device(system: System, rec: Record) -> str | None:
    """Why the record ran on another device than the system file describes (None when it did not): a CPU
    record for a GPU file or the reverse, or a GPU of another name than the file's. A CPU file is
    calibrated from whichever CPU the user's host has: that is what calibrating a CPU system is for."""
    device = rec.env.devices[0] if rec.env.devices else None
    kind = "gpu" if device is not None and device.type == "cuda" else "cpu" if device is not None else None
    if kind is not None and kind != system.device.kind:
        return (f"the record ran on a {kind.upper()} ({device.name}), the system file describes a "
                f"{system.device.kind.upper()}")
    if kind == "gpu" and system.device.name and (device.name or "").strip().lower() != system.device.name.lower():
        return f"the record ran on {device.name}, the system file describes {system.device.name}"
    return None
