"""A record as TensorBoard event files: one folder per record, its figures as scalars at the last measured
step (tag 'figures/<field>'), each step's loss and throughput as 'train/…' scalars, the config as text. Scalars
are written in double precision, so a figure reads back exactly as the record holds it."""

from __future__ import annotations

import json
from pathlib import Path

from benchsuite.config.sinks import TensorBoardSink
from benchsuite.record.types import Record
from benchsuite.sinks.figures import figures, params, step_rows


def run_dir(path: Path, options: TensorBoardSink, out: Path) -> Path:
    """The record's event folder: log_dir (under the results folder unless absolute) / the record's file stem."""
    return out / options.log_dir / path.stem


def send(record: Record, name: str, path: Path, options: TensorBoardSink, out: Path) -> Path:
    """Writes the record's events; returns their folder."""
    from torch.utils.tensorboard import SummaryWriter

    folder = run_dir(path, options, out)
    last = record.steps[-1].step if record.steps else 0
    with SummaryWriter(str(folder)) as writer:
        writer.add_text("run", f"{name}\n\n    {json.dumps(params(record, path), indent=1)}", last)
        for tag, value in figures(record).items():
            writer.add_scalar(f"figures/{tag}", value, last, new_style=True, double_precision=True)
        for step, row in step_rows(record):
            for tag, value in row.items():
                writer.add_scalar(tag.replace("train.", "train/", 1), value, step, new_style=True,
                                  double_precision=True)
    return folder
