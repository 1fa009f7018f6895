"""RunConfig: one fully resolved run (its sections are the record's, record/sections.py) and its run key."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import msgspec

from benchsuite.record.sections import (CarbonConfig, EnergyConfig, ModelConfig, MoEConfig, ParallelConfig, TrainConfig,
                                        hashed)
from benchsuite.record.types import Config


class RunConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One fully resolved run: what a worker needs and what the run key hashes."""

    suite: str
    workload: str
    kind: str
    model: ModelConfig
    train: TrainConfig
    parallel: ParallelConfig
    energy: EnergyConfig
    carbon: CarbonConfig
    moe: MoEConfig | None = None
    world_size: int = 1
    nodes: int = 1
    scaling: str = "weak"
    description: str = ""
    sweep_id: str = ""

    @property
    def label(self) -> str:
        """'switch · forced routing · w4 · 2 nodes · weak': the run as the launcher's lines, its log and record
        names and predict name it (what tells it from the suite's other runs of its workload, seeds apart)."""
        routing = " · forced routing" if self.moe is not None and self.moe.routing == "forced" else ""
        nodes = f" · {self.nodes} nodes" if self.nodes > 1 else ""
        return f"{self.workload}{routing} · w{self.world_size}{nodes} · {self.scaling}"

    @property
    def nproc_per_node(self) -> int:
        return self.world_size // self.nodes

    @property
    def data_parallel(self) -> int:
        return self.world_size // (self.parallel.tensor * self.parallel.pipeline)

    @property
    def micro_batch_per_rank(self) -> int:
        """Sequences per rank per micro-step; strong scaling splits the global batch."""
        if self.scaling == "strong":
            return self.train.micro_batch // self.data_parallel
        return self.train.micro_batch

    @property
    def routed_micro_batch(self) -> int:
        """Sequences an MoE layer routes at once (its capacity's tokens, with seq_len): one of the rank's pipeline
        microbatches, and with context parallelism the whole context-parallel group's (the layer gathers them)."""
        return self.micro_batch_per_rank // self.parallel.n_microbatches * self.parallel.context

    @property
    def global_batch(self) -> int:
        return self.micro_batch_per_rank * self.data_parallel * self.train.grad_accum

    def to_dict(self) -> dict[str, Any]:
        return msgspec.to_builtins(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunConfig:
        """A run from its to_dict (the worker's spec file), every section checked by its type."""
        return msgspec.convert(d, cls)

    @classmethod
    def from_record(cls, config: Config) -> RunConfig:
        """The run a harness record's config describes."""
        return cls(**{f: getattr(config, f) for f in cls.__struct_fields__})

    def run_key(self, hardware: dict[str, Any]) -> str:
        """Content hash of the resolved config plus the hardware identity; keys added since schema version
        4 are hashed only where they differ from their default (a section's LATER), so an earlier run's
        key is unchanged."""
        blob = json.dumps({"config": hashed(self.to_dict()), "hardware": hardware}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]
