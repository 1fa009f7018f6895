"""Each run's record sent to the trackers a suite's [sinks] names (config/sinks.py): MLflow, TensorBoard, W&B.

A record is sent after it is written, so the record on disk is the source and a tracker a copy. A tracker that
fails (a server down, a full disk, a bad URI) warns once, naming it, the error and where the record is kept,
and is not tried again for the rest of the suite: a tracker never costs a measurement.
"""

from __future__ import annotations

import warnings
from pathlib import Path

from benchsuite.config.sinks import Sinks
from benchsuite.record.types import Record
from benchsuite.sinks import to_mlflow, to_tensorboard, to_wandb

SENDERS = {"mlflow": to_mlflow.send, "tensorboard": to_tensorboard.send, "wandb": to_wandb.send}


class SinkWarning(UserWarning):
    """A tracker could not take a record (the record itself is kept)."""


class Sender:
    """Sends records to the chosen trackers, each record once, each failing tracker warned about once."""

    def __init__(self, sinks: Sinks, out: Path):
        self.sinks = sinks
        self.out = Path(out)
        self.failed: set[str] = set()

    def send(self, record: Record, name: str, path: Path) -> None:
        for sink, options in self.sinks.chosen():
            if sink in self.failed:
                continue
            try:
                SENDERS[sink](record, name, Path(path), options, self.out)
            except Exception as e:  # noqa: BLE001 - a tracker's failure of any kind must never lose the record
                self.failed.add(sink)
                warnings.warn(f"sinks.{sink}: could not send {name} ({type(e).__name__}: {e}); the record is kept "
                              f"at {path}; {sink} is skipped for the rest of this suite", SinkWarning, stacklevel=2)
