"""Typed schema of suite TOML files: validation, [defaults] merging, sweep expansion.

Every mistake in a file is collected and reported together (file, key path, reason),
so a user fixes a suite in one pass and nothing is launched for an invalid one.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import itertools
import json
import math
import os
import re
import unicodedata
import reprlib
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints


class ConfigError(Exception):
    """All problems found in one suite file; `problems` holds (key path, reason) pairs."""

    def __init__(self, path: str | Path, problems: list[tuple[str, str]]):
        self.path = str(path)
        self.problems = problems
        lines = [f"{self.path}: {len(problems)} problem(s)"]
        lines += [f"  {key or '<file>'}: {reason}" for key, reason in problems]
        super().__init__("\n".join(lines))


def _positive(v):
    return None if v > 0 else "must be > 0"


def _non_negative(v):
    return None if v >= 0 else "must be >= 0"


# The worker's first two unmeasured steps are instrumented (step 0 counts FLOPs, step 1 measures
# model-state and collective bytes, both eager); compile needs one more so it never lands in a measured step.
MIN_WARMUP_STEPS = 2


def _warmup(v):
    return None if v >= MIN_WARMUP_STEPS else (
        f"must be >= {MIN_WARMUP_STEPS}: the first two unmeasured steps are instrumented (step 0 counts FLOPs, "
        f"step 1 measures model-state and communication bytes); set warmup_steps = {MIN_WARMUP_STEPS} or more")


def _one_of(*choices):
    def check(v):
        return None if v in choices else f"must be one of {', '.join(map(repr, choices))}"

    return check


def _spec(default, check=None, doc=""):
    return field(default=default, metadata={"check": check, "doc": doc})


@dataclass(frozen=True)
class ModelConfig:
    layers: int = _spec(2, _positive)
    hidden: int = _spec(64, _positive)
    heads: int = _spec(4, _positive)
    vocab: int = _spec(256, _positive)
    seq_len: int = _spec(64, _positive)
    ffn_hidden: int | None = _spec(None, _positive, "default 4 * hidden")
    activation: str = _spec("gelu", _one_of("gelu", "swiglu"))
    # The architecture of the block (the defaults are the GPT-2-style decoder every earlier record ran).
    preset: str | None = _spec(None, None, "a published architecture by name (models/presets.py)")
    norm: str = _spec("layernorm", _one_of("layernorm", "rmsnorm"))
    norm_eps: float = _spec(1e-5, _positive)
    position: str = _spec("learned", _one_of("learned", "rope"))
    rope_theta: float = _spec(10000.0, _positive, "with position = \"rope\"")
    kv_heads: int | None = _spec(None, _positive, "grouped-query attention; default heads")
    head_dim: int | None = _spec(None, _positive, "default hidden / heads")
    qk_norm: str = _spec("none", _one_of("none", "per_head", "full"), "RMSNorm of queries and keys")
    bias: bool = _spec(False, None, "biases in the attention and FFN projections (GPT-2/3)")
    tie_embeddings: bool = _spec(False, None, "the LM head shares the token embedding")

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


ROUTER_K = {"switch": 1, "gshard": 2, "token_choice": 2}  # experts per token: the presets' k, token_choice's default


@dataclass(frozen=True)
class MoEConfig:
    experts: int = _spec(8, _positive)
    router: str = _spec("switch", _one_of("switch", "gshard", "expert_choice", "token_choice"))
    top_k: int | None = _spec(None, _positive, "token_choice's k (default 2); switch is 1 and gshard 2")
    capacity_factor: float = _spec(1.25, _non_negative, "0: dropless (token-choice routers)")
    min_capacity: int = _spec(0, _non_negative, "slots per expert at least this, when dropping")
    every: int = _spec(2, _positive, "MoE replaces the FFN of every `every`-th block")
    expert_hidden: int | None = _spec(None, _positive, "default: the dense FFN width")
    shared_experts: int = _spec(0, _non_negative, "always-on experts added to the routed output")
    score: str = _spec("softmax", _one_of("softmax", "sigmoid"), "token_choice's router score")
    aux_loss_coef: float = _spec(0.01, _non_negative)
    z_loss_coef: float = _spec(0.0, _non_negative)
    second_expert_policy: str = _spec("all", _one_of("all", "random"), "gshard only")
    normalize_top_k: bool | None = _spec(None, None, "token_choice: renormalise the k chosen scores (default true)")
    balance: str = _spec("aux_loss", _one_of("aux_loss", "aux_free"),
                         "aux_free: DeepSeek-V3's per-expert score bias from the load, outside the gradient")
    bias_update: float = _spec(1e-3, _positive, "aux_free: the bias's step per update (DeepSeek-V3's gamma)")
    routing: str = _spec("learned", _one_of("learned", "forced"),
                         "forced: tokens spread evenly over the experts (the experts' speed apart from the router)")

    LATER = ("normalize_top_k", "balance", "bias_update", "routing")  # as ModelConfig.LATER

    def __post_init__(self):
        """A config read back from a record (RunConfig.from_dict) must name a router this code knows:
        every MoE figure depends on it."""
        if self.router not in (*ROUTER_K, "expert_choice"):
            raise ValueError(f"moe.router: unknown router {self.router!r}")

    @property
    def k(self) -> int | None:
        """Experts each token chooses (None for expert choice, where experts choose tokens)."""
        if self.router == "expert_choice":
            return None
        return self.top_k if self.router == "token_choice" and self.top_k is not None else ROUTER_K[self.router]

    @property
    def dropless(self) -> bool:
        """capacity_factor = 0: every token reaches its k experts (token-choice routers only)."""
        return self.capacity_factor == 0


@dataclass(frozen=True)
class TrainConfig:
    micro_batch: int = _spec(8, _positive, "per rank (weak scaling) or global (strong)")
    steps: int = _spec(20, _positive)
    warmup_steps: int = _spec(3, _warmup, "at least 2, and 3 with compile = true")
    precision: str = _spec("auto", _one_of("auto", "fp32", "bf16"), "auto: bf16 on GPU, fp32 on CPU")
    grad_accum: int = _spec(1, _positive)
    recompute: str = _spec("none", _one_of("none", "selective", "full"),
                           "selective: the attention core only (Korthikanti et al. 2022)")
    compile: bool = _spec(False)
    data: str = _spec("synthetic", None, "synthetic | builtin | path to a .bin token file")
    seed: int = _spec(0, _non_negative)
    lr: float = _spec(3e-4, _positive)
    eval_every: int = _spec(0, _non_negative, "0: no evaluation")
    target_loss: float | None = _spec(None, _positive)
    timeout_s: float = _spec(900.0, _positive, "per run; the run is killed and recorded failed")

    @property
    def min_warmup_steps(self) -> int:
        """The unmeasured steps the worker needs (MIN_WARMUP_STEPS, one more to compile)."""
        return MIN_WARMUP_STEPS + 1 if self.compile else MIN_WARMUP_STEPS


PIPELINE_SCHEDULES = ("1f1b", "interleaved", "gpipe")


@dataclass(frozen=True)
class ParallelConfig:
    tensor: int = _spec(1, _positive)
    zero: int = _spec(0, _one_of(0, 1, 2, 3), "0 = DDP")
    expert: int = _spec(1, _positive)
    pipeline: int = _spec(1, _positive, "pipeline stages P")
    microbatches: int | None = _spec(None, _positive, "per step with pipeline > 1; default 2 * pipeline")
    schedule: str = _spec("1f1b", _one_of(*PIPELINE_SCHEDULES))
    virtual_stages: int = _spec(1, _positive, "stages per rank V; > 1 with schedule = \"interleaved\"")
    sequence_parallel: bool = _spec(False, None, "Megatron's sequence parallelism with tensor > 1")

    LATER = ("sequence_parallel",)  # as ModelConfig.LATER

    @property
    def n_microbatches(self) -> int:
        """Microbatches per step: the per-rank batch is split into this many (1 without a pipeline)."""
        if self.pipeline == 1:
            return 1
        return self.microbatches if self.microbatches is not None else 2 * self.pipeline


@dataclass(frozen=True)
class EnergyConfig:
    idle_baseline_s: float = _spec(0.0, _non_negative)
    min_window_s: float = _spec(1.0, _non_negative)


@dataclass(frozen=True)
class CarbonConfig:
    pue: float = _spec(1.0, lambda v: None if v >= 1.0 else "must be >= 1.0")
    intensity_g_per_kwh: float | None = _spec(None, _non_negative)
    country: str | None = _spec(None, None, "ISO 3166 alpha-3, e.g. FRA")
    region: str | None = _spec(None)
    # Beside the location-based CO2e, never added to it (energy/footprint.py).
    market_intensity_g_per_kwh: float | None = _spec(None, _non_negative, "contractual factor (market-based Scope 2)")
    embodied_kg_per_device: float | None = _spec(None, _non_negative, "default: a GPU's share of its server")
    device_lifetime_years: float = _spec(5.0, _positive, "the years embodied emissions are spread over")
    wue_l_per_kwh: float | None = _spec(None, _non_negative, "on-site water per kWh of IT energy")
    water_intensity_l_per_kwh: float | None = _spec(None, _non_negative, "the grid's water per kWh (off-site)")

    LATER = ("market_intensity_g_per_kwh", "embodied_kg_per_device", "device_lifetime_years", "wue_l_per_kwh",
             "water_intensity_l_per_kwh")  # as ModelConfig.LATER


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


SECTIONS = {"model": ModelConfig, "train": TrainConfig, "parallel": ParallelConfig, "energy": EnergyConfig,
            "carbon": CarbonConfig, "moe": MoEConfig}


def later_keys(section: type) -> tuple[str, ...]:
    """The keys a config section gained after schema version 4 (its LATER; none for most sections)."""
    return getattr(section, "LATER", ())


@dataclass
class Suite:
    name: str
    description: str
    path: str
    runs: list[RunConfig]


SECTIONS = {"model": ModelConfig, "train": TrainConfig, "parallel": ParallelConfig,
            "moe": MoEConfig, "energy": EnergyConfig, "carbon": CarbonConfig}
WORKLOAD_KEYS = {"name", "kind", "description", "sweep", *SECTIONS}
SWEEP_KEYS = {"world_size", "nodes", "scaling", "seed", "routing"}
TOP_KEYS = {"suite", "defaults", "workload", "sweep", "energy", "carbon"}


_INT_MIN, _INT_MAX = -(2**63), 2**63 - 1
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
MAX_RUNS = 4096  # runs one suite may expand to: a benchmark plan has thousands at most, a runaway sweep millions
MAX_SUITE_BYTES = 1 << 20  # a suite is a few KB; a larger file is not one
NAME_MAX, PATH_MAX = 255, 4096  # bytes of one path component and of a whole path (Linux file systems)
_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = _SHORT.maxlong = 60


def _show(v) -> str:
    """A value as a problem quotes it: bounded in length and nesting, whatever the file holds."""
    return _SHORT.repr(v)


# Characters a reader cannot see or that move the text around: control, format (zero-width, bidi marks),
# private use, unassigned, line and paragraph separators. Two names that differ by one look the same.
INVISIBLE_CATEGORIES = ("Cc", "Cf", "Co", "Cs", "Cn", "Zl", "Zp")


def name_problem(name: str) -> str | None:
    """Why a suite or workload name cannot be read as written (None when it can): an invisible character,
    or whitespace other than a plain space."""
    for i, ch in enumerate(name):
        if unicodedata.category(ch) in INVISIBLE_CATEGORIES or (ch.isspace() and ch != " "):
            what = unicodedata.name(ch, "a control character" if unicodedata.category(ch) == "Cc" else "unnamed")
            return (f"contains an invisible or control character, U+{ord(ch):04X} ({what}) at position {i}: a name "
                    f"that differs by it looks the same; remove it")
    return None


def name_skeleton(name: str) -> str:
    """What a reader tells names apart by: compatibility forms folded (NFKC: fullwidth, ligatures), case
    folded, runs of spaces as one. Two names with one skeleton are one name to a person."""
    return " ".join(unicodedata.normalize("NFKC", name).casefold().split())


def _few(values: list) -> str:
    shown = ", ".join(_show(v) for v in values[:5])
    return shown + (f" (and {len(values) - 5} more)" if len(values) > 5 else "")


def _qkey(key: str) -> str:
    """A key as TOML would quote it, so an empty or odd key is visible in a problem's path."""
    return key if _BARE_KEY.fullmatch(key) else json.dumps(key)


def _type_name(t) -> str:
    return getattr(t, "__name__", str(t))


def _check_value(t, v) -> str | None:
    """None when v fits the annotated type t (int | None, float, str, bool)."""
    options = get_args(t) if get_origin(t) is not None else (t,)
    for opt in options:
        if opt is type(None) and v is None:
            return None
        if opt is bool and isinstance(v, bool):
            return None
        if opt is int and isinstance(v, int) and not isinstance(v, bool):
            return None if _INT_MIN <= v <= _INT_MAX else "out of range: TOML integers are 64-bit"
        if opt is float and isinstance(v, (int, float)) and not isinstance(v, bool):
            if isinstance(v, int) and not _INT_MIN <= v <= _INT_MAX:
                return "out of range: TOML integers are 64-bit"
            if isinstance(v, float) and not math.isfinite(v):
                return "must be a finite number"
            return None
        if opt is str and isinstance(v, str):
            return None
    names = " or ".join(_type_name(o) for o in options if o is not type(None))
    return f"expected {names}, got {type(v).__name__} {_show(v)}"


def _build_section(cls, raw: Any, where: str, problems: list) -> tuple[Any, set[str]]:
    """The section built from its valid values (defaults for the rest) and the keys whose value was refused:
    the checks that read a refused key are skipped, so no problem is reported about a default the user never
    chose, and every other check still runs."""
    known = {f.name: f for f in fields(cls)}
    if not isinstance(raw, dict):
        problems.append((where, f"expected a table, got {type(raw).__name__}"))
        return cls(), set(known)
    hints = get_type_hints(cls)
    values, refused = {}, set()
    for key, v in raw.items():
        if key not in known:
            problems.append((f"{where}.{_qkey(key)}", f"unknown key; valid keys: {', '.join(known)}"))
            continue
        err = _check_value(hints[key], v)
        if err is None and v is not None and known[key].metadata.get("check"):
            err = known[key].metadata["check"](v)
        if err:
            problems.append((f"{where}.{key}", err))
            refused.add(key)
        else:
            values[key] = float(v) if hints[key] in (float, float | None) and v is not None else v
    return cls(**values), refused


def _merge_sections(suite_level: dict, defaults: dict, workload: dict) -> tuple[dict, dict[str, str]]:
    """Each section of a workload, key by key: the suite's [energy]/[carbon] under [defaults] under the
    workload's own table; and where each "section.key" came from ("suite", "defaults" or "workload"). A
    suite's values are scalars, so nothing deeper is merged or copied (walking a pathological file's nesting
    could exhaust the stack)."""
    out, origins = {}, {}
    for sec in SECTIONS:
        if sec in workload and not isinstance(workload[sec], dict):
            out[sec] = workload[sec]  # refused by _build_section, naming the workload's key
            continue
        layers = [(origin, table) for origin, table in (("suite", suite_level.get(sec)), ("defaults", defaults.get(sec)),
                                                        ("workload", workload.get(sec))) if isinstance(table, dict)]
        if layers:
            out[sec] = {}
        for origin, table in layers:
            out[sec].update(table)
            origins.update({f"{sec}.{key}": origin for key in table})
    return out, origins


def _apply_preset(merged: dict, origins: dict[str, str], refused: set[str], where: str, problems: list):
    """The preset model.preset names, laid under the keys given beside it (in the workload or [defaults]),
    its [moe] too; origins get "preset" for the keys it gives. None without one (or with an unknown one,
    refused naming the presets there are)."""
    from benchsuite.models.presets import lookup

    model = merged.get("model")
    name = model.get("preset") if isinstance(model, dict) else None
    if not isinstance(name, str):
        return None  # no preset, or a value _build_section refuses
    preset, problem = lookup(name)
    if problem:
        problems.append((f"{where}.model.preset", problem))
        refused.add("model.preset")
        return None
    for sec, values in (("model", preset.model), ("moe", preset.moe)):
        if not values or not isinstance(merged.get(sec, {}), dict):
            continue  # nothing to lay, or a section that is not a table (refused by _build_section)
        given = merged.get(sec, {})
        merged[sec] = {**values, **given}
        origins.update({f"{sec}.{key}": "preset" for key in values if key not in given})
    return preset


def _inherited_path(key: str, origin: str) -> str:
    """Where a key a workload inherits is written: [defaults] or the suite's own [energy]/[carbon]."""
    return f"defaults.{key}" if origin == "defaults" else key


@dataclass
class Inherited:
    """The keys of [defaults] and of the suite's [energy]/[carbon] ("defaults.train.lr", "carbon.pue" ->
    "section.key"), which of them took effect in some workload (or were refused there: told once), and
    why each other one did not."""

    given: dict[str, str]
    used: set[str] = field(default_factory=set)
    unused_because: dict[str, str] = field(default_factory=dict)

    def problems(self) -> list[tuple[str, str]]:
        out = []
        for path, key in self.given.items():
            if path in self.used:
                continue
            where = "[defaults]" if path.startswith("defaults.") else f"[{key.partition('.')[0]}]"
            reason = self.unused_because.get(path, f"every workload sets its own {key}")
            out.append((path, f"{reason}, so it changes nothing; remove it from {where}"))
        return out


def _apply_key_rules(w, origins: dict[str, str], refused: set[str], where: str, problems: list,
                     inherited: Inherited) -> None:
    """Refuse the workload's own keys that would change nothing (key_rules.py); set an inherited key that
    does not apply back to its default, so the record holds what ran."""
    from benchsuite.key_rules import BY_KEY, default_of, runs_anyway

    for key, origin in origins.items():
        sec, _, name = key.partition(".")
        path = _inherited_path(key, origin)
        rule = BY_KEY.get(key)
        if sec not in w.sections:  # [defaults.moe] under a dense workload
            inherited.unused_because.setdefault(path, "applies to no workload of this suite: it needs kind = \"moe\"")
        elif key in refused or rule is None or not _known(refused, *rule.reads) or rule.applies(w):
            if origin != "workload":
                inherited.used.add(path)
        elif origin != "workload":
            w.sections[sec] = dataclasses.replace(w.sections[sec], **{name: default_of(w.sections[sec], name)})
            inherited.unused_because.setdefault(path, f"applies to no workload of this suite: it needs "
                                                      f"{rule.applies_when.replace('`', '')}")
        elif not runs_anyway(rule, w, getattr(w.sections[sec], name)):
            problems.append((f"{where}.{key}", rule.why(w, getattr(w.sections[sec], name))))
            refused.add(key)


def _known(refused: set[str], *keys: str) -> bool:
    """True when none of `keys` ("section.key") had its value refused: checks judge only values the user gave."""
    return refused.isdisjoint(keys)


def _check_model(model: ModelConfig, refused: set[str], where: str, problems: list) -> None:
    if _known(refused, "model.hidden", "model.heads", "model.head_dim") and model.head_dim is None \
            and model.hidden % model.heads:
        problems.append((f"{where}.model.heads", f"heads ({model.heads}) must divide hidden ({model.hidden}), "
                                                 f"or give model.head_dim"))
    if _known(refused, "model.heads", "model.kv_heads") and model.heads % model.n_kv_heads:
        problems.append((f"{where}.model.kv_heads", f"kv_heads ({model.n_kv_heads}) must divide heads "
                                                    f"({model.heads}): each key/value head serves a whole group"))
    if (_known(refused, "model.position", "model.hidden", "model.heads", "model.head_dim")
            and model.position == "rope" and model.dim_head % 2):
        problems.append((f"{where}.model.position", f"rotary positions rotate pairs of a head's dimensions: the "
                                                    f"head width ({model.dim_head}) must be even"))


def _check_train(train: TrainConfig, refused: set[str], where: str, problems: list) -> None:
    if _known(refused, "train.warmup_steps", "train.compile") and train.warmup_steps < train.min_warmup_steps:
        problems.append((f"{where}.train.warmup_steps",
                         f"must be >= {train.min_warmup_steps} with train.compile = true: one more unmeasured "
                         f"step so that compilation never lands in a measured step"))


def _check_energy(energy: EnergyConfig, train: TrainConfig, refused: set[str], where: str, problems: list) -> None:
    """The idle baseline is measured inside the run's time limit: one as long as the limit never ends."""
    if (_known(refused, "energy.idle_baseline_s", "train.timeout_s")
            and energy.idle_baseline_s >= train.timeout_s):
        problems.append((f"{where}.energy.idle_baseline_s",
                         f"the idle baseline ({energy.idle_baseline_s:g} s) is measured within train.timeout_s "
                         f"({train.timeout_s:g} s): the run would be killed while measuring idle power; lower "
                         f"idle_baseline_s or raise train.timeout_s"))


def _path_problem(data: str) -> str | None:
    """What makes train.data impossible as a path on any file system (checked before the file system is asked)."""
    if "\x00" in data:
        return "contains a NUL byte, which no file name can hold; give the path of a .bin token file"
    try:
        raw = os.fsencode(data)
    except UnicodeError:
        return "cannot be encoded as a file name; give the path of a .bin token file"
    longest = max(raw.split(b"/"), key=len)
    if len(longest) > NAME_MAX:
        return (f"has a path component of {len(longest)} bytes; file names hold at most {NAME_MAX} bytes: "
                f"give the path of a .bin token file")
    if len(raw) > PATH_MAX:
        return f"is {len(raw)} bytes long; paths hold at most {PATH_MAX} bytes: give a shorter path"
    return None


def _check_data(train: TrainConfig, model: ModelConfig, refused: set[str], where: str, problems: list) -> None:
    """train.data must exist and fit model.vocab before anything is launched (data.py, imported only
    when needed: it brings torch). Relative paths resolve against the working directory, as in the worker."""
    if train.data == "synthetic" or not _known(refused, "train.data"):
        return
    from benchsuite.data import BYTE_VOCAB, check_data_spec, make_source

    problem = _path_problem(train.data)
    if problem is None:
        try:
            problem = check_data_spec(train.data)
        except (OSError, ValueError) as e:  # e.g. a folder on the path that may not be searched
            problem = f"{_show(train.data)} cannot be checked: {getattr(e, 'strerror', None) or e}"
    if problem:
        problems.append((f"{where}.train.data", problem.removeprefix("train.data: ")))
    elif train.data == "builtin" and _known(refused, "model.vocab") and model.vocab < BYTE_VOCAB:
        problems.append((f"{where}.model.vocab", f"train.data = \"builtin\" is byte-level: it needs model.vocab "
                                                 f">= {BYTE_VOCAB}, got {model.vocab}"))
    elif _known(refused, "model.vocab", "model.seq_len"):
        try:  # what the worker checks when it opens the data: ids below model.vocab, enough tokens for seq_len
            make_source(train.data, model.vocab, model.seq_len, train.seed)
        except (OSError, ValueError) as e:
            problems.append((f"{where}.train.data", str(e).removeprefix("train.data: ")))


def _check_moe(moe: MoEConfig | None, refused: set[str], where: str, problems: list) -> None:
    """The MoE values that cannot run together (k and experts, expert choice and dropless)."""
    if moe is None:
        return
    key = f"{where}.moe"
    router_known = _known(refused, "moe.router")
    if (router_known and _known(refused, "moe.top_k", "moe.experts") and moe.k is not None
            and moe.k > moe.experts):
        problems.append((f"{key}.top_k", f"each token chooses {moe.k} experts, more than moe.experts "
                                         f"({moe.experts}); lower top_k or raise experts"))
    if router_known and _known(refused, "moe.capacity_factor") and moe.dropless and moe.router == "expert_choice":
        problems.append((f"{key}.capacity_factor", "expert choice needs capacity_factor > 0 (each expert "
                                                   "takes capacity_factor·N/E tokens); 0 (dropless) is for "
                                                   "token-choice routers"))


def _check_carbon(carbon: CarbonConfig, refused: set[str], where: str, problems: list) -> set[str]:
    """country/region must be in codecarbon's offline data (a typo must not become the world average);
    returns the keys refused."""
    from benchsuite.energy.carbon import place_problems

    if not _known(refused, "carbon.country", "carbon.region"):
        return set()
    found = place_problems(carbon.country, carbon.region)
    problems += [(f"{where}.{key}", reason) for key, reason in found]
    return {key for key, _ in found}


def _check_layout(kind: str, sec: dict, refused: set[str], where: str, problems: list) -> None:
    """Parallel layouts that cannot run at any world size; checked once per workload."""
    p, m, moe = sec["parallel"], sec["model"], sec.get("moe")
    if p.tensor > 1 and _known(refused, "parallel.tensor"):
        for name, size, keys in (("heads", m.heads, ("model.heads",)), ("vocab", m.vocab, ("model.vocab",)),
                                 ("kv_heads", m.n_kv_heads, ("model.kv_heads", "model.heads")),
                                 ("ffn_hidden", m.ffn, ("model.ffn_hidden", "model.hidden"))):
            if _known(refused, *keys) and size % p.tensor:
                problems.append((f"{where}.parallel.tensor", f"tensor ({p.tensor}) must divide model.{name} ({size})"))
        if m.qk_norm == "full" and _known(refused, "model.qk_norm"):
            problems.append((f"{where}.parallel.tensor", "model.qk_norm = \"full\" normalises over all heads, which "
                                                         "parallel.tensor > 1 splits over ranks: not supported; set "
                                                         "tensor = 1"))
        if p.zero and _known(refused, "parallel.zero"):
            problems.append((f"{where}.parallel.zero", "ZeRO stages 1-3 with tensor > 1 are not supported; "
                                                       "set zero = 0 or tensor = 1"))
        if p.sequence_parallel and kind == "moe" and _known(refused, "parallel.sequence_parallel", "kind"):
            problems.append((f"{where}.parallel.sequence_parallel", "sequence parallelism supports dense models "
                                                                    "(an MoE layer is not split over the sequence); "
                                                                    "set sequence_parallel = false"))
        if p.sequence_parallel and p.pipeline > 1 and _known(refused, "parallel.sequence_parallel",
                                                              "parallel.pipeline"):
            problems.append((f"{where}.parallel.sequence_parallel", "sequence parallelism with pipeline > 1 is not "
                                                                    "supported; set sequence_parallel = false or "
                                                                    "pipeline = 1"))
    if p.expert > 1 and _known(refused, "parallel.expert"):
        if p.tensor > 1 and _known(refused, "parallel.tensor"):
            problems.append((f"{where}.parallel.expert", "expert parallelism with tensor > 1 is not supported; "
                                                         "set tensor = 1 or expert = 1"))
        if p.zero and _known(refused, "parallel.zero"):
            problems.append((f"{where}.parallel.zero", "ZeRO stages 1-3 would shard expert shards as if "
                                                       "replicated; use zero = 0 with expert > 1"))
        if moe and _known(refused, "moe.experts") and moe.experts % p.expert:
            problems.append((f"{where}.parallel.expert",
                             f"expert ({p.expert}) must divide moe.experts ({moe.experts})"))
    if moe and _known(refused, "moe.every", "model.layers") and moe.every > m.layers:
        problems.append((f"{where}.moe.every", f"every ({moe.every}) exceeds model.layers ({m.layers})"))
    _check_pipeline(kind, sec, refused, where, problems)


def _check_pipeline(kind: str, sec: dict, refused: set[str], where: str, problems: list) -> None:
    """Pipeline layouts that cannot run, and the features not combined with a pipeline (yet)."""
    p, m, t = sec["parallel"], sec["model"], sec["train"]
    key = f"{where}.parallel"
    if not _known(refused, "parallel.pipeline", "parallel.virtual_stages", "parallel.schedule"):
        return
    if p.pipeline == 1:
        return
    stages = p.pipeline * p.virtual_stages
    if _known(refused, "model.layers") and m.layers % stages:
        problems.append((f"{key}.pipeline", f"pipeline × virtual_stages ({p.pipeline} × {p.virtual_stages}) must "
                                            f"divide model.layers ({m.layers}): choose stages whose product "
                                            f"divides the layers, or change model.layers"))
    if p.schedule == "interleaved" and p.virtual_stages < 2:
        problems.append((f"{key}.virtual_stages", "schedule = \"interleaved\" needs virtual_stages >= 2 "
                                                  "(several stages per rank); or use schedule = \"1f1b\""))
    if p.schedule != "interleaved" and p.virtual_stages > 1:
        problems.append((f"{key}.virtual_stages", f"virtual_stages > 1 needs schedule = \"interleaved\" "
                                                  f"(got {p.schedule!r}); or set virtual_stages = 1"))
    n = p.n_microbatches
    if _known(refused, "parallel.microbatches") and p.schedule != "gpipe" and n < p.pipeline:
        problems.append((f"{key}.microbatches", f"schedule {p.schedule!r} needs microbatches >= pipeline "
                                                f"({n} < {p.pipeline}): raise microbatches or use "
                                                f"schedule = \"gpipe\""))
    rounds = max(1, n // p.pipeline)
    if _known(refused, "parallel.microbatches") and p.schedule == "interleaved" and n % rounds:
        problems.append((f"{key}.microbatches", f"interleaved 1F1B runs microbatches in rounds of pipeline "
                                                f"({p.pipeline}): {n} is not a multiple of {rounds} rounds; "
                                                f"use a multiple of pipeline"))
    refusals = [  # (refused, the key named, reason): each judged only when the key's value was accepted
        (p.expert > 1, "parallel.expert", "pipeline with expert parallelism is not supported; set expert = 1 "
                                          "or pipeline = 1"),
        (kind == "moe", "kind", "pipeline parallelism supports dense models (the MoE auxiliary loss is not "
                                "carried between stages); use kind = \"dense\" or pipeline = 1"),
        (p.zero > 0, "parallel.zero", "ZeRO stages 1-3 with pipeline > 1 are not supported; set zero = 0 or "
                                      "pipeline = 1"),
        (t.grad_accum > 1, "train.grad_accum", "with pipeline > 1 the microbatches are the accumulation: set "
                                               "grad_accum = 1 and raise parallel.microbatches"),
        (t.compile, "train.compile", "compile with pipeline > 1 is not supported; set compile = false"),
        (t.eval_every > 0, "train.eval_every", "validation with pipeline > 1 is not supported; set eval_every = 0"),
        (m.tie_embeddings, "model.tie_embeddings", "model.tie_embeddings shares the LM head with the token "
                                                   "embedding, which parallel.pipeline > 1 puts on another stage: "
                                                   "not supported; set tie_embeddings = false or pipeline = 1"),
    ]
    for bad, name, reason in refusals:
        if bad and _known(refused, name):
            problems.append((f"{where}.{name}", reason))


def _check_run(run: RunConfig, refused: set[str], where: str, problems: list) -> None:
    """Combinations of one world size with the layout that cannot run; found here so nothing is launched."""
    p = run.parallel
    tag = f"{where} (world_size={run.world_size}, nodes={run.nodes})"
    if _known(refused, "sweep.world_size", "sweep.nodes") and run.world_size % run.nodes:
        problems.append((f"{tag}.sweep.nodes", f"nodes ({run.nodes}) must divide world_size ({run.world_size})"))
    whole_dp = _known(refused, "sweep.world_size", "parallel.tensor")  # the checks below read data_parallel
    if whole_dp and run.world_size % p.tensor:
        problems.append((f"{tag}.parallel.tensor",
                         f"world_size ({run.world_size}) must be divisible by tensor ({p.tensor})"))
        whole_dp = False
    if whole_dp and _known(refused, "parallel.pipeline") and run.world_size % (p.tensor * p.pipeline):
        problems.append((f"{tag}.parallel.pipeline",
                         f"world_size ({run.world_size}) must be divisible by tensor × pipeline "
                         f"({p.tensor} × {p.pipeline}); change the sweep's world_size or the degrees"))
        whole_dp = False
    if whole_dp and p.expert > 1 and _known(refused, "parallel.expert") and run.data_parallel % p.expert:
        problems.append((f"{tag}.parallel.expert",
                         f"expert ({p.expert}) must divide the data-parallel size ({run.data_parallel})"))
    if (whole_dp and run.scaling == "strong" and _known(refused, "sweep.scaling", "train.micro_batch")
            and run.train.micro_batch % run.data_parallel):
        problems.append((f"{tag}.train.micro_batch",
                         f"strong scaling splits the global batch ({run.train.micro_batch}) over "
                         f"{run.data_parallel} data-parallel ranks: it must divide evenly"))
    elif (whole_dp and p.pipeline > 1 and _known(refused, "train.micro_batch", "parallel.microbatches")
          and run.micro_batch_per_rank % p.n_microbatches):
        problems.append((f"{tag}.parallel.microbatches",
                         f"the per-rank batch ({run.micro_batch_per_rank} sequences) is split into "
                         f"{p.n_microbatches} pipeline microbatches: it must divide evenly; change "
                         f"train.micro_batch or parallel.microbatches"))


def _routings(swept: list | None, built: dict, refused: set[str], origins: dict[str, str], own_sweep: dict,
              where: str, problems: list) -> tuple[list, bool]:
    """The routings a workload runs, and whether a sweep's routing list gave them: the list where routing
    applies (an MoE workload with a token-choice router), else its own moe.routing (None: dense)."""
    moe = built.get("moe")
    applies = moe is not None and _known(refused, "kind", "moe.router") and moe.router != "expert_choice"
    if swept is None or not applies:
        if swept is not None and "routing" in own_sweep:
            problems.append((f"{where}.sweep.routing", "a routing list needs kind = \"moe\" with a token-choice "
                                                       "router (switch, gshard, token_choice): remove it"))
        return [moe.routing if moe is not None else None], False
    if origins.get("moe.routing") == "workload":
        problems.append((f"{where}.moe.routing", "the sweep's routing list sets each run's routing: remove "
                                                 "moe.routing or the sweep's routing"))
    return swept, True


SWEEP_DEFAULTS = {"world_size": [1], "nodes": [1], "scaling": ["weak"]}  # seed: the workload's train.seed


def _sweep_list_problem(key: str, values: list) -> str | None:
    if not values:
        return "must not be empty"
    if key in ("scaling", "routing"):
        choices = ("weak", "strong") if key == "scaling" else ("learned", "forced")
        bad = [x for x in values if x not in choices]
        if bad:
            return f"must be {' or '.join(map(repr, choices))}, got {_few(bad)}"
    else:
        low = 0 if key == "seed" else 1
        bad = [x for x in values if not isinstance(x, int) or isinstance(x, bool) or not low <= x <= _INT_MAX]
        if bad:
            kind = "integers >= 0" if key == "seed" else "positive integers"
            return f"expected {kind} (64-bit), got {_few(bad)}"
    repeated = [x for x, n in collections.Counter(values).items() if n > 1]
    if repeated:
        return f"duplicate value(s) {_few(repeated)}: each run would be launched twice; list each value once"
    return None


def _sweep_lists(raw: Any, where: str, problems: list) -> tuple[dict[str, list], set[str]]:
    """The sweep keys given in raw, each as a validated list (defaults are applied by the caller), and the
    keys whose list was refused. An invalid list is reported, never expanded."""
    out: dict[str, list] = {}
    if raw is None:
        return out, set()
    if not isinstance(raw, dict):
        problems.append((where, "expected a table"))
        return out, set(SWEEP_KEYS)
    refused = set()
    for key, v in raw.items():
        if key not in SWEEP_KEYS:
            problems.append((f"{where}.{_qkey(key)}", f"unknown key; valid keys: {', '.join(sorted(SWEEP_KEYS))}"))
            continue
        values = v if isinstance(v, list) else [v]
        problem = _sweep_list_problem(key, values)
        if problem:
            problems.append((f"{where}.{key}", problem))
            refused.add(key)
        else:
            out[key] = values
    return out, refused


def parse_suite(doc: dict, path: str | Path = "<string>") -> Suite:
    """Validate a parsed TOML document and expand it into runs; raise ConfigError listing all problems.

    One pass finds every problem: a refused value is built as its default and every check that reads it
    is skipped, so no problem hides another and none is a consequence of another. The number of runs is
    counted from the sweep lists before anything is expanded (at most MAX_RUNS)."""
    problems: list[tuple[str, str]] = []
    for key in doc:
        if key not in TOP_KEYS:
            problems.append((_qkey(key), f"unknown top-level key; valid keys: {', '.join(sorted(TOP_KEYS))}"))
    suite = doc.get("suite", {})
    if not isinstance(suite, dict):
        problems.append(("suite", "expected a table"))
        suite = {}
    for key in suite:
        if key not in ("name", "description"):
            problems.append((f"suite.{_qkey(key)}", "unknown key; valid keys: name, description"))
    name = suite.get("name", Path(str(path)).stem)
    if not isinstance(name, str) or not name.strip():
        problems.append(("suite.name", "expected a non-empty string"))
        name = "suite"
    elif name_problem(name):
        problems.append(("suite.name", name_problem(name)))
    name = unicodedata.normalize("NFC", name)  # one spelling of "café", however the file's editor wrote it
    description = suite.get("description", "")
    if not isinstance(description, str):
        problems.append(("suite.description", "expected a string"))
        description = ""

    defaults = doc.get("defaults", {})
    refused_defaults = set()  # [defaults] or a section of it that is not a table leaves every key of it unknown
    if not isinstance(defaults, dict):
        problems.append(("defaults", "expected a table"))
        defaults = {}
        refused_defaults = {f"{sec}.{f.name}" for sec, cls in SECTIONS.items() for f in fields(cls)}
    for key, v in defaults.items():
        if key not in SECTIONS:
            problems.append((f"defaults.{_qkey(key)}", f"unknown key; valid keys: {', '.join(SECTIONS)}"))
        elif not isinstance(v, dict):
            problems.append((f"defaults.{key}", "expected a table"))
            refused_defaults |= {f"{key}.{f.name}" for f in fields(SECTIONS[key])}

    suite_level, suite_refused = {}, set()  # the suite's own [energy]/[carbon]: its accepted keys, under [defaults]
    for sec, cls in (("energy", EnergyConfig), ("carbon", CarbonConfig)):
        raw_sec = doc.get(sec, {})
        built_sec, bad = _build_section(cls, raw_sec, sec, problems)
        if sec == "carbon":
            bad |= _check_carbon(built_sec, set(), "carbon", problems)
        suite_refused |= {f"{sec}.{key}" for key in bad}
        if isinstance(raw_sec, dict):
            suite_level[sec] = {key: getattr(built_sec, key) for key in raw_sec if f"{sec}.{key}" not in suite_refused
                                and key in built_sec.__dataclass_fields__}
    inherited = Inherited({f"{sec}.{key}": f"{sec}.{key}" for sec, table in suite_level.items() for key in table}
                          | {f"defaults.{sec}.{key}": f"{sec}.{key}" for sec, table in defaults.items()
                             if sec in SECTIONS and isinstance(table, dict) for key in table
                             if key in SECTIONS[sec].__dataclass_fields__})
    suite_sweep, suite_sweep_refused = _sweep_lists(doc.get("sweep"), "sweep", problems)

    workloads = doc.get("workload")
    if workloads is None:
        problems.append(("workload", "no [[workload]] defined; add at least one"))
        workloads = []
    elif not isinstance(workloads, list):
        problems.append(("workload", "expected an array of tables ([[workload]])"))
        workloads = []

    runs: list[RunConfig] = []
    routing_swept = False  # whether the suite's [sweep] routing list applied to some workload
    run_count = 0  # counted from the list lengths, whether or not the runs are expanded
    seen_names: dict[str, tuple[int, str]] = {}  # name_skeleton -> (index, name) of the workload that has it
    for i, raw in enumerate(workloads):
        where = f"workload[{i}]"
        if not isinstance(raw, dict):
            problems.append((where, f"expected a table ([[workload]]), got {type(raw).__name__}"))
            continue
        wname = raw.get("name")
        if not isinstance(wname, str) or not wname.strip():
            problems.append((f"{where}.name", "every workload needs a non-empty string name"))
            wname = f"workload{i}"
        elif name_problem(wname):
            problems.append((f"{where}.name", name_problem(wname)))
        wname = unicodedata.normalize("NFC", wname)
        if name_skeleton(wname) in seen_names:
            j, other = seen_names[name_skeleton(wname)]
            problems.append((f"{where}.name", (f"duplicate workload name {_show(wname)}" if other == wname else
                                               f"workload name {_show(wname)} cannot be told apart from "
                                               f"{_show(other)} (workload[{j}]): they differ only by case, "
                                               f"Unicode normalisation or compatibility forms; rename one")))
        seen_names.setdefault(name_skeleton(wname), (i, wname))
        where = f"workload[{i}] ({wname})"
        for key in raw:
            if key not in WORKLOAD_KEYS:
                problems.append((f"{where}.{_qkey(key)}",
                                 f"unknown key; valid keys: {', '.join(sorted(WORKLOAD_KEYS))}"))
        refused = set(refused_defaults)
        merged, origins = _merge_sections(suite_level, defaults, raw)
        refused |= suite_refused - origins.keys()  # a refused suite-level value the workload does not replace
        preset = _apply_preset(merged, origins, refused, where, problems)
        kind = raw.get("kind", preset.kind if preset else "dense")
        if kind not in ("dense", "moe"):
            problems.append((f"{where}.kind", f"must be 'dense' or 'moe', got {_show(kind)}"))
            refused.add("kind")
            kind = "moe" if "moe" in raw else "dense"  # to check the rest as the file reads
        elif kind != "moe" and "moe" in raw:
            problems.append((f"{where}.moe", "a [moe] table needs kind = \"moe\""))
        elif kind != "moe" and preset and preset.kind == "moe":
            problems.append((f"{where}.kind", f"model.preset = {merged['model']['preset']!r} is a mixture of "
                                              f"experts: set kind = \"moe\" (or leave kind out)"))
        wdesc = raw.get("description", "")
        if not isinstance(wdesc, str):
            problems.append((f"{where}.description", "expected a string"))
            wdesc = ""
        built = {}
        for sec, cls in SECTIONS.items():
            if sec == "moe" and kind != "moe":
                continue
            built[sec], bad = _build_section(cls, merged.get(sec, {}), f"{where}.{sec}", problems)
            refused |= {f"{sec}.{k}" for k in bad}
        if any(origins.get(key) != "suite" for key in ("carbon.country", "carbon.region")):
            refused |= {f"carbon.{k}" for k in _check_carbon(built["carbon"], refused, f"{where}.carbon", problems)}
        own_sweep, own_refused = _sweep_lists(raw.get("sweep"), f"{where}.sweep", problems)
        refused |= {f"sweep.{k}" for k in own_refused | (suite_sweep_refused - own_sweep.keys())}
        from benchsuite.key_rules import Workload

        _apply_key_rules(Workload(kind, built, seed_swept="seed" in {**suite_sweep, **own_sweep}), origins, refused,
                         where, problems, inherited)
        _check_model(built["model"], refused, where, problems)
        _check_train(built["train"], refused, where, problems)
        _check_energy(built["energy"], built["train"], refused, where, problems)
        _check_data(built["train"], built["model"], refused, where, problems)
        _check_layout(kind, built, refused, where, problems)
        _check_moe(built.get("moe"), refused, where, problems)
        sweep = {**SWEEP_DEFAULTS, "seed": [built["train"].seed], **suite_sweep, **own_sweep}
        sweep["routing"], swept = _routings(sweep.pop("routing", None), built, refused, origins, own_sweep, where,
                                            problems)
        routing_swept |= swept
        run_count += math.prod(len(v) for v in sweep.values())
        if run_count > MAX_RUNS:
            continue  # never expanded: the count alone is reported below
        sweep_id = f"{name}/{wname}"
        for ws, nodes, scaling, seed, routing in itertools.product(sweep["world_size"], sweep["nodes"],
                                                                   sweep["scaling"], sweep["seed"], sweep["routing"]):
            seeded = {**built, "train": dataclasses.replace(built["train"], seed=seed)}
            if routing is not None:
                seeded["moe"] = dataclasses.replace(built["moe"], routing=routing)
            run = RunConfig(suite=name, workload=wname, kind=kind, description=wdesc or description,
                            world_size=ws, nodes=nodes, scaling=scaling,
                            sweep_id=f"{sweep_id}/{scaling}", **seeded)
            _check_run(run, refused, where, problems)
            runs.append(run)
    if any(isinstance(raw, dict) for raw in workloads):
        problems += inherited.problems()
        if "routing" in suite_sweep and not routing_swept:
            problems.append(("sweep.routing", "applies to no workload of this suite: it needs kind = \"moe\" with a "
                                              "token-choice router, so it changes nothing; remove it"))
    if run_count > MAX_RUNS:
        problems.append(("sweep", f"the suite would expand to {run_count} runs (world_size × nodes × scaling × seed "
                                  f"× routing of each workload), more than the limit of {MAX_RUNS}; shorten the sweep lists "
                                  f"or split the suite into several files"))
    if problems:
        raise ConfigError(path, list(dict.fromkeys(problems)))  # a problem repeated by the sweep is told once
    return Suite(name=name, description=description, path=str(path), runs=runs)


def load_suite(path: str | Path) -> Suite:
    """Read and validate a suite file; every failure is a ConfigError naming the file."""
    path = Path(path)
    try:
        if path.exists() and not path.is_file():  # a FIFO or a device would block or never end
            raise ConfigError(path, [("", "cannot read file: not a regular file; pass the path of a suite .toml")])
        with path.open("rb") as f:
            data = f.read(MAX_SUITE_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError(path, [("", "file not found; pass the path of a suite .toml (see workloads/)")])
    except OSError as e:
        raise ConfigError(path, [("", f"cannot read file: {e}")])
    if len(data) > MAX_SUITE_BYTES:
        raise ConfigError(path, [("", f"cannot read file: larger than {MAX_SUITE_BYTES} bytes, "
                                      f"which no suite needs; pass the path of a suite .toml")])
    try:
        doc = tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ConfigError(path, [("", f"cannot read file: not UTF-8 ({e})")])
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(path, [("", f"TOML syntax error: {e}")])
    except RecursionError:
        raise ConfigError(path, [("", "TOML syntax error: arrays or tables nested too deeply to parse; "
                                      "a suite nests them a few levels at most")])
    return parse_suite(doc, path)


# CPU ranks a node starts per usable core unless told otherwise: gloo ranks beyond a few per core only
# time-slice (each also needs memory and file descriptors), and a runaway world size would exhaust the host.
RANKS_PER_CORE = 4


def usable_cores() -> int:
    """Cores this process may run on (its affinity mask, e.g. a Slurm allocation), not the whole machine's."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def check_ranks_per_node(suite: Suite, runs: list[RunConfig], limit: int, limit_source: str) -> None:
    """Refuse, before anything is launched, runs that need more ranks on one node than `limit`
    (limit_source says where the limit comes from, for the message)."""
    problems = [(f"{r.workload} (world_size={r.world_size}, nodes={r.nodes}).sweep.world_size",
                 f"{r.nproc_per_node} ranks per node, more than this machine starts ({limit}: {limit_source}); "
                 f"lower sweep.world_size, raise sweep.nodes, or pass --max-ranks-per-node N")
                for r in runs if r.nproc_per_node > limit]
    if problems:
        raise ConfigError(suite.path, list(dict.fromkeys(problems)))
