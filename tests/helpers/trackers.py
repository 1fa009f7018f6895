"""Read a run back from each tracker with the tracker's own library: MLflow's client, TensorBoard's event
reader, and a W&B offline run's records decoded with W&B's own protobuf types."""

from __future__ import annotations

import json
import struct
from pathlib import Path

BLOCK = 32 * 1024  # W&B's run file is a LevelDB log: 32 KiB blocks of (crc32c, length, type, data) records
HEADER = 7  # ':W&B', a magic of two bytes and the version


def mlflow_run(tracking_uri: str, experiment: str, name: str) -> tuple[dict, dict, dict, dict]:
    """(latest metrics, params, tags, metric histories: key -> step -> value) of the one run called name."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    (run,) = [r for r in client.search_runs([exp.experiment_id]) if r.info.run_name == name]
    history = {key: {m.step: m.value for m in client.get_metric_history(run.info.run_id, key)}
               for key in run.data.metrics}
    return run.data.metrics, run.data.params, run.data.tags, history


def tensorboard_scalars(folder: Path) -> dict[str, dict[int, float]]:
    """tag -> step -> value of every scalar under folder (double precision, as written)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    events = EventAccumulator(str(folder), size_guidance={"tensors": 0})
    events.Reload()
    return {tag: {e.step: tensor_util.make_ndarray(e.tensor_proto).item() for e in events.Tensors(tag)}
            for tag in events.Tags()["tensors"] if tag != "run/text_summary"}


def _records(path: Path):
    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    pos, pending = HEADER, b""
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 0 and length == 0:
            continue
        pending += chunk
        if kind in (1, 4):  # FULL or LAST
            yield pending
            pending = b""


def wandb_offline_run(folder: Path) -> tuple[dict, dict, dict]:
    """(config, summary, history: key -> step -> value) of the one offline run under folder."""
    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = folder.rglob("offline-run-*/run-*.wandb")
    config, summary, history = {}, {}, {}
    for data in _records(path):
        rec = pb.Record()
        rec.ParseFromString(data)
        kind = rec.WhichOneof("record_type")
        if kind in ("run", "config"):
            updates = rec.run.config.update if kind == "run" else rec.config.update
            config.update({i.key: json.loads(i.value_json) for i in updates})
        elif kind == "summary":
            summary.update({key: json.loads(i.value_json) for i in rec.summary.update
                            if not (key := i.key or ".".join(i.nested_key)).startswith("_")})
        elif kind == "history":
            items = {i.key or ".".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item}
            step = items.pop("_step")
            for key, value in items.items():
                if not key.startswith("_"):
                    history.setdefault(key, {})[step] = value
    return config, summary, history
