"""The six sections of a suite's workload and RunConfig, one fully resolved run with its run key.

Each field is a spec (specs.py): its default, the check of a given value and its doc, read by the README's
key table and by other packages. Keys added after schema version 4 are a section's LATER: the run key hashes
them only where they differ from their default, so an earlier run keeps its key.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, fields
from typing import Any

from benchsuite.config.specs import non_negative, one_of, positive, spec
from benchsuite.record.kinds import ROUTERS

# The worker's first two unmeasured steps are instrumented (step 0 counts FLOPs, step 1 measures
# model-state and collective bytes, both eager); compile needs one more so it never lands in a measured step.
MIN_WARMUP_STEPS = 2


def _warmup(v: int) -> str | None:
    return None if v >= MIN_WARMUP_STEPS else (
        f"must be >= {MIN_WARMUP_STEPS}: the first two unmeasured steps are instrumented (step 0 counts FLOPs, "
        f"step 1 measures model-state and communication bytes); set warmup_steps = {MIN_WARMUP_STEPS} or more")


@dataclass(frozen=True)
class ModelConfig:
    layers: int = spec(2, positive)
    hidden: int = spec(64, positive)
    heads: int = spec(4, positive)
    vocab: int = spec(256, positive)
    seq_len: int = spec(64, positive)
    ffn_hidden: int | None = spec(None, positive, "default 4 * hidden")
    activation: str = spec("gelu", one_of("gelu", "swiglu"))
    # The architecture of the block (the defaults are the GPT-2-style decoder every earlier record ran).
    preset: str | None = spec(None, None, "a published architecture by name (config/presets.py)")
    norm: str = spec("layernorm", one_of("layernorm", "rmsnorm"))
    norm_eps: float = spec(1e-5, positive)
    position: str = spec("learned", one_of("learned", "rope"))
    rope_theta: float = spec(10000.0, positive, "with position = \"rope\"")
    kv_heads: int | None = spec(None, positive, "grouped-query attention; default heads")
    head_dim: int | None = spec(None, positive, "default hidden / heads")
    qk_norm: str = spec("none", one_of("none", "per_head", "full"), "RMSNorm of queries and keys")
    bias: bool = spec(False, None, "biases in the attention and FFN projections (GPT-2/3)")
    tie_embeddings: bool = spec(False, None, "the LM head shares the token embedding")

    # Keys added after schema version 4, left out of the run key at their defaults: a run that does not
    # use them keeps the run key it had, so resume and identities span the upgrade.
    LATER = ("preset", "norm", "norm_eps", "position", "rope_theta", "kv_heads", "head_dim", "qk_norm", "bias",
             "tie_embeddings")

    @property
    def ffn(self) -> int:
        return self.ffn_hidden if self.ffn_hidden is not None else 4 * self.hidden

    @property
    def n_kv_heads(self) -> int:
        return self.kv_heads if self.kv_heads is not None else self.heads

    @property
    def dim_head(self) -> int:
        """Width of one attention head: head_dim where given (Qwen3), else hidden / heads."""
        return self.head_dim if self.head_dim is not None else self.hidden // self.heads


@dataclass(frozen=True)
class MoEConfig:
    experts: int = spec(8, positive)
    router: str = spec("switch", one_of(*ROUTERS))
    top_k: int | None = spec(None, positive, "token_choice's k (default 2); switch is 1 and gshard 2")
    capacity_factor: float = spec(1.25, non_negative, "0: dropless (token-choice routers)")
    min_capacity: int = spec(0, non_negative, "slots per expert at least this, when dropping")
    every: int = spec(2, positive, "MoE replaces the FFN of every `every`-th block")
    expert_hidden: int | None = spec(None, positive, "default: the dense FFN width")
    shared_experts: int = spec(0, non_negative, "always-on experts added to the routed output")
    score: str = spec("softmax", one_of("softmax", "sigmoid"), "token_choice's router score")
    aux_loss_coef: float = spec(0.01, non_negative)
    z_loss_coef: float = spec(0.0, non_negative)
    second_expert_policy: str = spec("all", one_of("all", "random"), "gshard only")
    normalize_top_k: bool | None = spec(None, None, "token_choice: renormalise the k chosen scores (default true)")
    balance: str = spec("aux_loss", one_of("aux_loss", "aux_free"),
                        "aux_free: DeepSeek-V3's per-expert score bias from the load, outside the gradient")
    bias_update: float = spec(1e-3, positive, "aux_free: the bias's step per update (DeepSeek-V3's gamma)")
    routing: str = spec("learned", one_of("learned", "forced"),
                        "forced: tokens spread evenly over the experts (the experts' speed apart from the router)")

    LATER = ("normalize_top_k", "balance", "bias_update", "routing")  # as ModelConfig.LATER

    def __post_init__(self):
        """A config read back from a record (RunConfig.from_dict) must name a router this code knows:
        every MoE figure depends on it."""
        if self.router not in ROUTERS:
            raise ValueError(f"moe.router: unknown router {self.router!r}")

    @property
    def k(self) -> int | None:
        """Experts each token chooses (None for expert choice, where experts choose tokens)."""
        if self.router == "token_choice" and self.top_k is not None:
            return self.top_k
        return ROUTERS[self.router].k

    @property
    def dropless(self) -> bool:
        """capacity_factor = 0: every token reaches its k experts (token-choice routers only)."""
        return self.capacity_factor == 0


@dataclass(frozen=True)
class TrainConfig:
    micro_batch: int = spec(8, positive, "per rank (weak scaling) or global (strong)")
    steps: int = spec(20, positive)
    warmup_steps: int = spec(3, _warmup, "at least 2, and 3 with compile = true")
    precision: str = spec("auto", one_of("auto", "fp32", "bf16"), "auto: bf16 on GPU, fp32 on CPU")
    grad_accum: int = spec(1, positive)
    recompute: str = spec("none", one_of("none", "selective", "full"),
                          "selective: the attention core only (Korthikanti et al. 2022)")
    compile: bool = spec(False)
    data: str = spec("synthetic", None, "synthetic | builtin | path to a .bin token file")
    seed: int = spec(0, non_negative)
    lr: float = spec(3e-4, positive)
    eval_every: int = spec(0, non_negative, "0: no evaluation")
    target_loss: float | None = spec(None, positive)
    timeout_s: float = spec(900.0, positive, "per run; the run is killed and recorded failed")

    @property
    def min_warmup_steps(self) -> int:
        """The unmeasured steps the worker needs (MIN_WARMUP_STEPS, one more to compile)."""
        return MIN_WARMUP_STEPS + 1 if self.compile else MIN_WARMUP_STEPS


PIPELINE_SCHEDULES = ("1f1b", "interleaved", "gpipe")


@dataclass(frozen=True)
class ParallelConfig:
    tensor: int = spec(1, positive)
    zero: int = spec(0, one_of(0, 1, 2, 3), "0 = DDP")
    expert: int = spec(1, positive)
    pipeline: int = spec(1, positive, "pipeline stages P")
    microbatches: int | None = spec(None, positive, "per step with pipeline > 1; default 2 * pipeline")
    schedule: str = spec("1f1b", one_of(*PIPELINE_SCHEDULES))
    virtual_stages: int = spec(1, positive, "stages per rank V; > 1 with schedule = \"interleaved\"")
    sequence_parallel: bool = spec(False, None, "Megatron's sequence parallelism with tensor > 1")

    LATER = ("sequence_parallel",)  # as ModelConfig.LATER

    @property
    def n_microbatches(self) -> int:
        """Microbatches per step: the per-rank batch is split into this many (1 without a pipeline)."""
        if self.pipeline == 1:
            return 1
        return self.microbatches if self.microbatches is not None else 2 * self.pipeline


@dataclass(frozen=True)
class EnergyConfig:
    idle_baseline_s: float = spec(0.0, non_negative)
    min_window_s: float = spec(1.0, non_negative)


@dataclass(frozen=True)
class CarbonConfig:
    pue: float = spec(1.0, lambda v: None if v >= 1.0 else "must be >= 1.0")
    intensity_g_per_kwh: float | None = spec(None, non_negative)
    country: str | None = spec(None, None, "ISO 3166 alpha-3, e.g. FRA")
    region: str | None = spec(None)
    # Beside the location-based CO2e, never added to it (energy/footprint.py).
    market_intensity_g_per_kwh: float | None = spec(None, non_negative, "contractual factor (market-based Scope 2)")
    embodied_kg_per_device: float | None = spec(None, non_negative, "default: a GPU's share of its server")
    device_lifetime_years: float = spec(5.0, positive, "the years embodied emissions are spread over")
    wue_l_per_kwh: float | None = spec(None, non_negative, "on-site water per kWh of IT energy")
    water_intensity_l_per_kwh: float | None = spec(None, non_negative, "the grid's water per kWh (off-site)")

    LATER = ("market_intensity_g_per_kwh", "embodied_kg_per_device", "device_lifetime_years", "wue_l_per_kwh",
             "water_intensity_l_per_kwh")  # as ModelConfig.LATER


SECTIONS: dict[str, type] = {"model": ModelConfig, "train": TrainConfig, "parallel": ParallelConfig,
                             "moe": MoEConfig, "energy": EnergyConfig, "carbon": CarbonConfig}


def later_keys(section: type) -> tuple[str, ...]:
    """The keys a config section gained after schema version 4 (its LATER; none for most sections)."""
    return getattr(section, "LATER", ())


@dataclass(frozen=True)
class RunConfig:
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
    def global_batch(self) -> int:
        return self.micro_batch_per_rank * self.data_parallel * self.train.grad_accum

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunConfig:
        kw = dict(d)
        for name, typ in SECTIONS.items():
            if kw.get(name) is not None:
                kw[name] = typ(**kw[name])
        return cls(**kw)

    @classmethod
    def from_record(cls, config: dict[str, Any]) -> RunConfig:
        """A record's `config` as the run it describes: a section key the record holds as null (a key its
        schema did not have, or one left unset) is the run's default."""
        return cls.from_dict({k: ({f: v for f, v in sec.items() if v is not None} if isinstance(sec, dict) else sec)
                              for k, sec in config.items()})

    def run_key(self, hardware: dict[str, Any]) -> str:
        """Content hash of the resolved config plus the hardware identity; keys added since schema version
        4 are hashed only where they differ from their default (a section's LATER), so an earlier run's
        key is unchanged."""
        config = self.to_dict()
        for sec, cls in SECTIONS.items():
            if config.get(sec) is not None and later_keys(cls):
                defaults = {f.name: f.default for f in fields(cls)}
                config[sec] = {k: v for k, v in config[sec].items() if k not in cls.LATER or v != defaults[k]}
        blob = json.dumps({"config": config, "hardware": hardware}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]
