"""A suite's [sinks] table (and measure(sinks=...)): the trackers a team already uses, to which each run's figures
and per-step loss and throughput are sent once its record is written (benchsuite/sinks/ sends them).

    [sinks]
    mlflow = { experiment = "moe-study" }          # tracking_uri: default sqlite:///<results folder>/mlflow.db
    tensorboard = { log_dir = "tensorboard" }       # under the results folder unless absolute
    wandb = { project = "moe-study" }               # mode = "offline" by default: files under <results>/wandb

Each is an optional extra (pip install 'benchsuite[mlflow]', '[tensorboard]', '[wandb]'): a suite that names a
sink whose package is not installed is refused before anything runs, naming the extra to install. A sink is
never part of a run (its options change no run key), and one that fails warns once and never loses a record.
"""

from __future__ import annotations

import importlib
from typing import Any, Literal

import msgspec

from benchsuite.config.problems import Problems, qkey
from benchsuite.config.specs import read_section
from benchsuite.record.scalars import Text, doc


class SinkOptions(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One tracker's options; PACKAGE is the module it needs, EXTRA the pip extra that installs it."""

    PACKAGE = ""
    EXTRA = ""


class MLflowSink(SinkOptions, frozen=True, forbid_unknown_fields=True):
    tracking_uri: doc(Text | None, "MLflow tracking URI (sqlite:///..., http://...); default: "
                                   "sqlite:///<results folder>/mlflow.db") = None
    experiment: doc(Text | None, "MLflow experiment; default: the suite's name") = None

    PACKAGE = "mlflow"
    EXTRA = "mlflow"


class TensorBoardSink(SinkOptions, frozen=True, forbid_unknown_fields=True):
    log_dir: doc(Text, "folder of the event files (one subfolder per record), under the results folder unless "
                       "absolute") = "tensorboard"

    PACKAGE = "tensorboard"
    EXTRA = "tensorboard"


class WandbSink(SinkOptions, frozen=True, forbid_unknown_fields=True):
    project: doc(Text | None, "W&B project; default: the suite's name") = None
    entity: doc(Text | None, "W&B entity (team or user); default: W&B's own") = None
    mode: doc(Literal["offline", "online"], "offline writes run files to sync later (`wandb sync`); online "
                                            "needs a login") = "offline"
    dir: doc(Text, "folder of the run files, under the results folder unless absolute") = "wandb"

    PACKAGE = "wandb"
    EXTRA = "wandb"


class Sinks(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The trackers to send each run to; none by default."""

    mlflow: MLflowSink | None = None
    tensorboard: TensorBoardSink | None = None
    wandb: WandbSink | None = None

    def chosen(self) -> list[tuple[str, SinkOptions]]:
        return [(f.name, getattr(self, f.name)) for f in msgspec.structs.fields(self) if getattr(self, f.name)]


SINK_TYPES: dict[str, type[SinkOptions]] = {"mlflow": MLflowSink, "tensorboard": TensorBoardSink, "wandb": WandbSink}


def missing_package(name: str, options: SinkOptions) -> str | None:
    """Why the sink cannot run here (its package is not importable), with the extra that installs it; None
    when it can."""
    try:
        importlib.import_module(options.PACKAGE)
    except ImportError as e:
        return (f"needs the {options.PACKAGE} package, which cannot be imported here ({e}); install it with "
                f"pip install 'benchsuite[{options.EXTRA}]', or remove sinks.{name}")
    return None


def read_sinks(raw: Any, problems: Problems) -> Sinks:
    """The [sinks] table checked key by key (every problem reported), each chosen sink's package checked."""
    if raw is None:
        return Sinks()
    if not isinstance(raw, dict):
        problems.add("sinks", "expected a table of trackers, e.g. [sinks] tensorboard = {}")
        return Sinks()
    chosen = {}
    for name, table in raw.items():
        if name not in SINK_TYPES:
            problems.add(f"sinks.{qkey(name)}", f"unknown sink; valid sinks: {', '.join(SINK_TYPES)}")
            continue
        options = read_section(SINK_TYPES[name], table, f"sinks.{name}", problems)
        why = missing_package(name, options)
        if why:
            problems.add(f"sinks.{name}", why)
        chosen[name] = options
    return Sinks(**chosen)
