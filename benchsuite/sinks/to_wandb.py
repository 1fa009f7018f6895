"""A record as a W&B run: the config as the run's config, each step's loss and throughput as history, its
figures as the run's summary. Offline by default (files to `wandb sync` later); W&B's console lines are kept
off the suite's output."""

from __future__ import annotations

from pathlib import Path

from benchsuite.config.sinks import WandbSink
from benchsuite.record.types import Record
from benchsuite.sinks.figures import figures, params, step_rows


def send(record: Record, name: str, path: Path, options: WandbSink, out: Path) -> str:
    """Logs the record as one run; returns the run's id."""
    import wandb

    folder = out / options.dir
    folder.mkdir(parents=True, exist_ok=True)
    run = wandb.init(project=options.project or record.suite, entity=options.entity, mode=options.mode,
                     dir=str(folder), name=name, group=record.suite, job_type=record.workload,
                     config=params(record, path), reinit="create_new",
                     settings=wandb.Settings(silent=True, console="off", save_code=False))
    try:
        for step, row in step_rows(record):
            run.log(row, step=step)
        run.summary.update(figures(record))
    finally:
        run.finish(exit_code=0 if record.status.value == "ok" else 1)
    return run.id
