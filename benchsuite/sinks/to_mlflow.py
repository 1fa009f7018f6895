"""A record as an MLflow run: figures as metrics, the config as params, each step's loss and throughput as
metric history (MlflowClient, no global state: two suites in one process never share a run)."""

from __future__ import annotations

from pathlib import Path

from benchsuite.config.sinks import MLflowSink
from benchsuite.record.types import Record
from benchsuite.sinks.figures import figures, params, step_rows

BATCH = 1000  # MLflow's log_batch takes at most 1,000 metrics and 100 params a call
PARAM_BATCH = 100


def send(record: Record, name: str, path: Path, options: MLflowSink, out: Path) -> str:
    """Logs the record as one run; returns the run's id."""
    from mlflow.entities import Metric, Param
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=options.tracking_uri or f"sqlite:///{out.resolve() / 'mlflow.db'}")
    experiment_name = options.experiment or record.suite
    experiment = client.get_experiment_by_name(experiment_name)
    experiment_id = experiment.experiment_id if experiment else client.create_experiment(experiment_name)
    facts = params(record, path)
    tags = {k: facts.pop(k) for k in ("run_key", "suite", "workload", "status", "repeat", "record") if k in facts}
    run = client.create_run(experiment_id, run_name=name, tags=tags)
    at = int(record.started_at.timestamp() * 1000)  # the measurement's time, not the upload's
    last = record.steps[-1].step if record.steps else 0
    metrics = [Metric(k, v, at, last) for k, v in figures(record).items()]
    metrics += [Metric(k, v, at, step) for step, row in step_rows(record) for k, v in row.items()]
    items = [Param(k, v) for k, v in facts.items()]
    for i in range(0, len(items), PARAM_BATCH):
        client.log_batch(run.info.run_id, params=items[i:i + PARAM_BATCH])
    for i in range(0, len(metrics), BATCH):
        client.log_batch(run.info.run_id, metrics=metrics[i:i + BATCH])
    client.set_terminated(run.info.run_id, status="FINISHED" if record.status.value == "ok" else "FAILED")
    return run.info.run_id
