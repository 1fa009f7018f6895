"""Measured beside predicted: each ok run's median step time against benchsuite.predict's on a system
file, and, where the measurement is far slower than its prediction, the component most likely to blame.

A run far below its prediction (FAR) points at the setup more often than at the model: a network that is
not the one the system file describes (a collective far slower than predicted), a stage slower than the
others (a bubble far above the schedule's), an expert layer whose all-to-all takes more of the step than
predicted, or a device below the achieved rate the file states. The suspect is named from what the record
measured where it measured it (the bubble, the all-to-all share), else from the prediction's own largest
communication term, else the compute rate.
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass

from rich.markup import escape
from rich.table import Table

from benchsuite.config import RunConfig
from benchsuite.record.types import Kind, Record
from benchsuite.record.values import num
from benchsuite.results.frames import rows_of
from benchsuite.results.identity import hardware_label
from benchsuite.results.model import Results
from benchsuite.terminal import printable

FAR = 1.5  # measured step time ÷ predicted above this: the run is flagged as far below its prediction
EXCESS_SHARE = 0.15  # a measured bubble or all-to-all share this far above its prediction is the suspect
COMMUNICATION = ("tensor_parallel", "expert_parallel", "context_parallel", "data_parallel", "pipeline_p2p")


@dataclass(frozen=True)
class Beside:
    identity: str
    label: str
    hardware: str  # what the run measured on
    measured_step_s: float | None
    predicted_step_s: float | None  # None with `reason`: the run is not one the system file can predict
    ratio: float | None  # measured ÷ predicted
    components: dict[str, float]  # predicted seconds per component
    flagged: bool = False
    suspect: str | None = None  # the component most likely responsible, and why
    reason: str | None = None  # why there is no comparison

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _suspect(rec: Record, prediction) -> str:
    """The component most likely responsible for a measurement far slower than its prediction."""
    step = prediction.step_s
    m = rec.metrics
    bubble = num(m.pipeline.bubble_measured) if m and m.pipeline else None
    if bubble is not None and bubble - prediction.bubble_fraction > EXCESS_SHARE:
        return (f"pipeline bubble: measured {bubble:.2f} of the step vs {prediction.bubble_fraction:.2f} predicted "
                f"(a stage slower than the others, or another schedule than the file's)")
    a2a = num(m.moe.all_to_all_share) if m and m.moe else None
    predicted_a2a = prediction.seconds("expert_parallel") / step
    if a2a is not None and a2a - predicted_a2a > EXCESS_SHARE:
        return (f"expert all-to-all: measured {a2a:.0%} of the step vs {predicted_a2a:.0%} predicted (the network "
                f"between expert ranks, or a routed load far from balanced)")
    comm = max(COMMUNICATION, key=prediction.seconds)
    if prediction.seconds(comm) > 0:
        return (f"{comm.replace('_', ' ')}: the largest predicted collective ({prediction.seconds(comm) / step:.0%} "
                f"of the step); a network slower than the system file's (another topology, a link down, "
                f"NCCL over sockets) shows there first")
    return ("compute: no communication is predicted on the critical path, so the device ran below the system "
            "file's achieved rate (calibrate it with `predict --calibrate` from a record of this device)")


def beside_table(rows: list[Beside]) -> Table:
    """One line per run: measured and predicted step time, their ratio, and the suspect or the reason."""
    table = Table(title="Measured beside predicted (benchsuite predict)", header_style="bold",
                  caption=f"flagged: a step over {FAR:g}× its prediction; the suspect is the component most likely "
                          f"responsible")
    for header in ("run", "hardware", "measured step", "predicted step", "measured ÷ predicted", "note"):
        table.add_column(header, justify="right" if "step" in header or "÷" in header else "left")
    for b in rows:
        ms = lambda s: "—" if s is None else f"{s * 1e3:,.4g} ms"  # noqa: E731
        note = (f"⚠ {b.suspect}" if b.flagged else b.reason or "within its prediction's range")
        table.add_row(*[escape(printable(x)) for x in (b.label, b.hardware, ms(b.measured_step_s),
                                                       ms(b.predicted_step_s),
                                                       "—" if b.ratio is None else f"{b.ratio:.2f}×", note)],
                      style="red" if b.flagged else None)
    return table


BESIDE_READS = ["identity", "label", "step_time_median_s"]  # the columns beside() reads of each ok run


def beside(results: Results, system) -> list[Beside]:
    """Each ok run's median step time beside its prediction on `system` (benchsuite.predict)."""
    from benchsuite.predict import predict_run
    from benchsuite.predict.step import record_expert_load

    out = []
    for row in rows_of(results.ok_runs_of(BESIDE_READS), BESIDE_READS):  # (the columns read, not the runs' ~400)
        recs = results.run_records(row["identity"])
        rec, hardware, measured = recs[0], hardware_label(recs), num(row["step_time_median_s"])
        head = (row["identity"], str(row["label"]), hardware, measured)
        why = _not_comparable(rec, hardware, system)
        if why is None:
            try:
                loads = [x for x in map(record_expert_load, recs) if x is not None]
                prediction = predict_run(RunConfig.from_record(rec.config), system,
                                         expert_load=statistics.median(loads) if loads else None,
                                         expert_load_source="this run's records (metrics.moe)" if loads else None)
            except (ValueError, TypeError, ZeroDivisionError) as e:  # a config no harness run could have had
                why = f"cannot be predicted: {e}"
        if why is not None:
            out.append(Beside(*head, None, None, {}, reason=why))
            continue
        ratio = None if measured is None else measured / prediction.step_s
        flagged = ratio is not None and ratio > FAR
        out.append(Beside(*head, prediction.step_s, ratio, {c.name: c.seconds for c in prediction.components},
                          flagged, _suspect(rec, prediction) if flagged else None))
    return out


def _not_comparable(rec: Record, hardware: str, system) -> str | None:
    """Why a run's measurement cannot stand beside a prediction on `system`, or None."""
    if rec.config.kind == Kind.USER:
        return "a benchsuite.measure() loop: its model is the user's, not one benchsuite.predict describes"
    names = {str(d.name).lower() for d in rec.env.devices or []}
    if system.device.name and system.device.name.lower() not in names:
        return f"measured on {hardware}; the system file describes {system.device.name}"
    return None
