"""The six sections of a run's config, defined once: a suite's [model], [moe], [train], [parallel], [energy]
and [carbon] tables, the resolved run the worker gets, and the `config` of every record.

Each field's type states its default, the values it accepts (msgspec constraints and literals) and its doc
(the constraint's description): msgspec checks a record's config against it when the record is decoded, and
config/specs.py checks a suite's table against the same type, wording each refusal for a person. Keys added
after schema version 4 are a section's LATER: the run key hashes them only where they differ from their
default, so an earlier run keeps its key.
"""

import functools
from collections.abc import Mapping
from types import MappingProxyType
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from benchsuite.record.kinds import ROUTERS
from benchsuite.record.scalars import (INT_MAX, NonNegativeInt, NonNegativeNum, PositiveInt, PositiveNum, Pue,
                                       Text, doc)

# The worker's first two unmeasured steps are instrumented (step 0 counts FLOPs, step 1 measures
# model-state and collective bytes, both eager); compile needs one more so it never lands in a measured step.
MIN_WARMUP_STEPS = 2
PIPELINE_SCHEDULES = ("1f1b", "interleaved", "gpipe")


WarmupSteps = doc(Annotated[int, Meta(ge=MIN_WARMUP_STEPS, le=INT_MAX)], "at least 2, and 3 with compile = true",
                  fix=f"the first two unmeasured steps are instrumented (step 0 counts FLOPs, step 1 measures "
                      f"model-state and communication bytes); set warmup_steps = {MIN_WARMUP_STEPS} or more")
Router = Literal[tuple(ROUTERS)]


class ConfigSection(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True, gc=False):
    """A closed section: a key not declared here is an error in a suite and in a record (untracked by the cyclic
    collector, as record.types.Section)."""

    LATER = ()  # keys added after schema version 4 (unannotated: a class constant, not a field)


class ModelConfig(ConfigSection):
    layers: PositiveInt = 2
    hidden: PositiveInt = 64
    heads: PositiveInt = 4
    vocab: PositiveInt = 256
    seq_len: PositiveInt = 64
    ffn_hidden: doc(PositiveInt | None, "default 4 * hidden") = None
    activation: Literal["gelu", "swiglu"] = "gelu"
    # The architecture of the block (the defaults are the GPT-2-style decoder every earlier record ran).
    preset: doc(Text | None, "a published architecture by name (config/presets.py)") = None
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    norm_eps: PositiveNum = 1e-5
    position: Literal["learned", "rope"] = "learned"
    rope_theta: doc(PositiveNum, "with position = \"rope\"") = 10000.0
    kv_heads: doc(PositiveInt | None, "grouped-query attention; default heads") = None
    head_dim: doc(PositiveInt | None, "default hidden / heads") = None
    qk_norm: doc(Literal["none", "per_head", "full"], "RMSNorm of queries and keys") = "none"
    bias: doc(bool, "biases in the attention and FFN projections (GPT-2/3)") = False
    tie_embeddings: doc(bool, "the LM head shares the token embedding") = False

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


class MoEConfig(ConfigSection):
    experts: PositiveInt = 8
    router: Router = "switch"
    top_k: doc(PositiveInt | None, "token_choice's k (default 2); switch is 1 and gshard 2") = None
    capacity_factor: doc(NonNegativeNum, "0: dropless (token-choice routers)") = 1.25
    min_capacity: doc(NonNegativeInt, "slots per expert at least this, when dropping") = 0
    every: doc(PositiveInt, "MoE replaces the FFN of every `every`-th block") = 2
    expert_hidden: doc(PositiveInt | None, "default: the dense FFN width") = None
    shared_experts: doc(NonNegativeInt, "always-on experts added to the routed output") = 0
    score: doc(Literal["softmax", "sigmoid"], "token_choice's router score") = "softmax"
    aux_loss_coef: NonNegativeNum = 0.01
    z_loss_coef: NonNegativeNum = 0.0
    second_expert_policy: doc(Literal["all", "random"], "gshard only") = "all"
    normalize_top_k: doc(bool | None, "token_choice: renormalise the k chosen scores (default true)") = None
    balance: doc(Literal["aux_loss", "aux_free"],
                 "aux_free: DeepSeek-V3's per-expert score bias from the load, outside the gradient") = "aux_loss"
    bias_update: doc(PositiveNum, "aux_free: the bias's step per update (DeepSeek-V3's gamma)") = 1e-3
    routing: doc(Literal["learned", "forced"],
                 "forced: tokens spread evenly over the experts (the experts' speed apart from the router)") = "learned"

    LATER = ("normalize_top_k", "balance", "bias_update", "routing")  # as ModelConfig.LATER

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


class TrainConfig(ConfigSection):
    micro_batch: doc(PositiveInt, "per rank (weak scaling) or global (strong)") = 8
    steps: PositiveInt = 20
    warmup_steps: WarmupSteps = 3
    precision: doc(Literal["auto", "fp32", "bf16"], "auto: bf16 on GPU, fp32 on CPU") = "auto"
    grad_accum: PositiveInt = 1
    recompute: doc(Literal["none", "selective", "full"],
                   "selective: the attention core only (Korthikanti et al. 2022)") = "none"
    compile: bool = False
    data: doc(Text, "synthetic | builtin | path to a .bin token file") = "synthetic"
    seed: NonNegativeInt = 0
    lr: PositiveNum = 3e-4
    eval_every: doc(NonNegativeInt, "0: no evaluation") = 0
    target_loss: PositiveNum | None = None
    timeout_s: doc(PositiveNum, "per run; the run is killed and recorded failed") = 900.0

    @property
    def min_warmup_steps(self) -> int:
        """The unmeasured steps the worker needs (MIN_WARMUP_STEPS, one more to compile)."""
        return MIN_WARMUP_STEPS + 1 if self.compile else MIN_WARMUP_STEPS


class ParallelConfig(ConfigSection):
    tensor: PositiveInt = 1
    zero: doc(Literal[0, 1, 2, 3], "0 = DDP") = 0
    expert: PositiveInt = 1
    pipeline: doc(PositiveInt, "pipeline stages P") = 1
    microbatches: doc(PositiveInt | None, "per step with pipeline > 1; default 2 * pipeline") = None
    schedule: Literal[PIPELINE_SCHEDULES] = "1f1b"
    virtual_stages: doc(PositiveInt, "stages per rank V; > 1 with schedule = \"interleaved\"") = 1
    sequence_parallel: doc(bool, "Megatron's sequence parallelism with tensor > 1") = False
    first_stage_layers: doc(PositiveInt | None, "blocks of the first pipeline stage; the others split the rest "
                                                "(default: even, first and last stages lighter)") = None
    last_stage_layers: doc(PositiveInt | None, "blocks of the last pipeline stage, as first_stage_layers") = None
    context: doc(PositiveInt, "context parallelism: ranks sharing each sequence, K/V all-gathered") = 1
    expert_tensor: doc(PositiveInt, "expert tensor parallelism: ranks splitting each expert's FFN width "
                                    "(Megatron's expert_tensor_parallel_size)") = 1

    LATER = ("sequence_parallel", "first_stage_layers", "last_stage_layers", "context",
             "expert_tensor")  # as ModelConfig.LATER

    @property
    def n_microbatches(self) -> int:
        """Microbatches per step: the per-rank batch is split into this many (1 without a pipeline)."""
        if self.pipeline == 1:
            return 1
        return self.microbatches if self.microbatches is not None else 2 * self.pipeline


class EnergyConfig(ConfigSection):
    idle_baseline_s: NonNegativeNum = 0.0
    min_window_s: NonNegativeNum = 1.0


class CarbonConfig(ConfigSection):
    pue: Pue = 1.0
    intensity_g_per_kwh: NonNegativeNum | None = None
    country: doc(Text | None, "ISO 3166 alpha-3, e.g. FRA") = None
    region: Text | None = None
    # Beside the location-based CO2e, never added to it (energy/footprint.py).
    market_intensity_g_per_kwh: doc(NonNegativeNum | None, "contractual factor (market-based Scope 2)") = None
    embodied_kg_per_device: doc(NonNegativeNum | None, "default: a GPU's share of its server") = None
    device_lifetime_years: doc(PositiveNum, "the years embodied emissions are spread over") = 5.0
    wue_l_per_kwh: doc(NonNegativeNum | None, "on-site water per kWh of IT energy") = None
    water_intensity_l_per_kwh: doc(NonNegativeNum | None, "the grid's water per kWh (off-site)") = None

    LATER = ("market_intensity_g_per_kwh", "embodied_kg_per_device", "device_lifetime_years", "wue_l_per_kwh",
             "water_intensity_l_per_kwh")  # as ModelConfig.LATER


SECTIONS: dict[str, type[ConfigSection]] = {"model": ModelConfig, "train": TrainConfig, "parallel": ParallelConfig,
                                            "moe": MoEConfig, "energy": EnergyConfig, "carbon": CarbonConfig}


@functools.cache
def defaults(section: type[ConfigSection]) -> Mapping[str, Any]:
    """Each key of a section with its default (read-only: one mapping per section, asked once per record by
    the hashes of every reader)."""
    return MappingProxyType({f.name: f.default for f in msgspec.structs.fields(section)})


def hashed(config: dict[str, Any]) -> dict[str, Any]:
    """A config's JSON values as its hashes (run key, run identity) see them: each section's LATER keys left
    out where they hold their default, so a key added since schema version 4 changes no earlier run's key or
    identity, in this version or the next."""
    out = dict(config)
    for name, section in SECTIONS.items():
        if isinstance(out.get(name), dict) and section.LATER:
            default = defaults(section)
            out[name] = {k: v for k, v in out[name].items() if k not in section.LATER or v != default[k]}
    return out
