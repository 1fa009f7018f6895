"""Typed schema of suite TOML files: validation, [defaults] merging, sweep expansion.

Every mistake in a file is collected and reported together (file, key path, reason),
so a user fixes a suite in one pass and nothing is launched for an invalid one.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import itertools
import json
import math
import re
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

    @property
    def ffn(self) -> int:
        return self.ffn_hidden if self.ffn_hidden is not None else 4 * self.hidden


@dataclass(frozen=True)
class MoEConfig:
    experts: int = _spec(8, _positive)
    router: str = _spec("switch", _one_of("switch", "gshard", "expert_choice"))
    capacity_factor: float = _spec(1.25, _positive)
    every: int = _spec(2, _positive, "MoE replaces the FFN of every `every`-th block")
    expert_hidden: int | None = _spec(None, _positive, "default: the dense FFN width")
    aux_loss_coef: float = _spec(0.01, _non_negative)
    z_loss_coef: float = _spec(0.0, _non_negative)
    second_expert_policy: str = _spec("all", _one_of("all", "random"), "gshard only")


@dataclass(frozen=True)
class TrainConfig:
    micro_batch: int = _spec(8, _positive, "per rank (weak scaling) or global (strong)")
    steps: int = _spec(20, _positive)
    warmup_steps: int = _spec(3, _non_negative)
    precision: str = _spec("auto", _one_of("auto", "fp32", "bf16"), "auto: bf16 on GPU, fp32 on CPU")
    grad_accum: int = _spec(1, _positive)
    recompute: str = _spec("none", _one_of("none", "full"))
    compile: bool = _spec(False)
    data: str = _spec("synthetic", None, "synthetic | builtin | path to a .bin token file")
    seed: int = _spec(0, _non_negative)
    lr: float = _spec(3e-4, _positive)
    eval_every: int = _spec(0, _non_negative, "0: no evaluation")
    target_loss: float | None = _spec(None, _positive)
    timeout_s: float = _spec(900.0, _positive, "per run; the run is killed and recorded failed")


@dataclass(frozen=True)
class ParallelConfig:
    tensor: int = _spec(1, _positive)
    zero: int = _spec(0, _one_of(0, 1, 2, 3), "0 = DDP")
    expert: int = _spec(1, _positive)


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
        return self.world_size // self.parallel.tensor

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
        sections = {"model": ModelConfig, "train": TrainConfig, "parallel": ParallelConfig,
                    "energy": EnergyConfig, "carbon": CarbonConfig, "moe": MoEConfig}
        kw = dict(d)
        for name, typ in sections.items():
            if kw.get(name) is not None:
                kw[name] = typ(**kw[name])
        return cls(**kw)

    def run_key(self, hardware: dict[str, Any]) -> str:
        """Content hash of the resolved config plus the hardware identity."""
        blob = json.dumps({"config": self.to_dict(), "hardware": hardware}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


@dataclass
class Suite:
    name: str
    description: str
    path: str
    runs: list[RunConfig]


SECTIONS = {"model": ModelConfig, "train": TrainConfig, "parallel": ParallelConfig,
            "moe": MoEConfig, "energy": EnergyConfig, "carbon": CarbonConfig}
WORKLOAD_KEYS = {"name", "kind", "description", "sweep", *SECTIONS}
SWEEP_KEYS = {"world_size", "nodes", "scaling"}
TOP_KEYS = {"suite", "defaults", "workload", "sweep", "energy", "carbon"}


_INT_MIN, _INT_MAX = -(2**63), 2**63 - 1
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


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
    return f"expected {names}, got {type(v).__name__} {v!r}"


def _build_section(cls, raw: Any, where: str, problems: list) -> Any:
    if not isinstance(raw, dict):
        problems.append((where, f"expected a table, got {type(raw).__name__}"))
        return None
    hints = get_type_hints(cls)
    known = {f.name: f for f in fields(cls)}
    values, ok = {}, True
    for key, v in raw.items():
        if key not in known:
            problems.append((f"{where}.{_qkey(key)}", f"unknown key; valid keys: {', '.join(known)}"))
            ok = False
            continue
        err = _check_value(hints[key], v)
        if err is None and v is not None and known[key].metadata.get("check"):
            err = known[key].metadata["check"](v)
        if err:
            problems.append((f"{where}.{key}", err))
            ok = False
        else:
            values[key] = float(v) if hints[key] in (float, float | None) and v is not None else v
    return cls(**values) if ok else None


def _merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def _check_model(model: ModelConfig, where: str, problems: list) -> None:
    if model.hidden % model.heads:
        problems.append((f"{where}.model.heads", f"heads ({model.heads}) must divide hidden ({model.hidden})"))


def _check_data(train: TrainConfig, model: ModelConfig, where: str, problems: list) -> None:
    """train.data must exist and fit model.vocab before anything is launched (data.py, imported only
    when needed: it brings torch). Relative paths resolve against the working directory, as in the worker."""
    if train.data == "synthetic":
        return
    from benchsuite.data import BYTE_VOCAB, check_data_spec

    problem = check_data_spec(train.data)
    if problem:
        problems.append((f"{where}.train.data", problem.removeprefix("train.data: ")))
    elif train.data == "builtin" and model.vocab < BYTE_VOCAB:
        problems.append((f"{where}.model.vocab", f"train.data = \"builtin\" is byte-level: it needs model.vocab "
                                                 f">= {BYTE_VOCAB}, got {model.vocab}"))


def _check_carbon(carbon: CarbonConfig | None, where: str, problems: list) -> None:
    """country/region must be in codecarbon's offline data (a typo must not become the world average)."""
    from benchsuite.energy.carbon import place_problems

    if carbon is not None:
        problems += [(f"{where}.{key}", reason) for key, reason in place_problems(carbon.country, carbon.region)]


def _check_run(run: RunConfig, where: str, problems: list) -> None:
    """Combinations that cannot run; found here so nothing is launched."""
    p, m = run.parallel, run.model
    tag = f"{where} (world_size={run.world_size}, nodes={run.nodes})"
    if run.world_size % run.nodes:
        problems.append((f"{tag}.sweep.nodes", f"nodes ({run.nodes}) must divide world_size ({run.world_size})"))
    if p.tensor > 1:
        for name, size in (("heads", m.heads), ("ffn_hidden", m.ffn), ("vocab", m.vocab)):
            if size % p.tensor:
                problems.append((f"{tag}.parallel.tensor", f"tensor ({p.tensor}) must divide model.{name} ({size})"))
        if p.zero:
            problems.append((f"{tag}.parallel.zero", "ZeRO stages 1-3 with tensor > 1 are not supported; "
                                                     "set zero = 0 or tensor = 1"))
    if run.world_size % p.tensor:
        problems.append((f"{tag}.parallel.tensor",
                         f"world_size ({run.world_size}) must be divisible by tensor ({p.tensor})"))
        return  # the checks below need a whole data-parallel degree
    if p.expert > 1:
        if p.tensor > 1:
            problems.append((f"{tag}.parallel.expert", "expert parallelism with tensor > 1 is not supported; "
                                                       "set tensor = 1 or expert = 1"))
        if p.zero:
            problems.append((f"{tag}.parallel.zero", "ZeRO stages 1-3 would shard expert shards as if replicated; "
                                                     "use zero = 0 with expert > 1"))
        if run.kind != "moe":
            problems.append((f"{tag}.parallel.expert", "expert parallelism needs kind = \"moe\""))
        elif run.moe and run.moe.experts % p.expert:
            problems.append((f"{tag}.parallel.expert",
                             f"expert ({p.expert}) must divide moe.experts ({run.moe.experts})"))
        if run.data_parallel % p.expert:
            problems.append((f"{tag}.parallel.expert",
                             f"expert ({p.expert}) must divide the data-parallel size ({run.data_parallel})"))
    if run.scaling == "strong" and run.train.micro_batch % run.data_parallel:
        problems.append((f"{tag}.train.micro_batch",
                         f"strong scaling splits the global batch ({run.train.micro_batch}) over "
                         f"{run.data_parallel} data-parallel ranks: it must divide evenly"))
    if run.kind == "moe" and run.moe and run.moe.every > m.layers:
        problems.append((f"{where}.moe.every", f"every ({run.moe.every}) exceeds model.layers ({m.layers})"))


SWEEP_DEFAULTS = {"world_size": [1], "nodes": [1], "scaling": ["weak"]}


def _sweep_lists(raw: Any, where: str, problems: list) -> dict[str, list]:
    """The sweep keys given in raw, each as a validated list (defaults are applied by the caller)."""
    out: dict[str, list] = {}
    if raw is None:
        return out
    if not isinstance(raw, dict):
        problems.append((where, "expected a table"))
        return out
    for key, v in raw.items():
        if key not in SWEEP_KEYS:
            problems.append((f"{where}.{_qkey(key)}", f"unknown key; valid keys: {', '.join(sorted(SWEEP_KEYS))}"))
            continue
        values = v if isinstance(v, list) else [v]
        if not values:
            problems.append((f"{where}.{key}", "must not be empty"))
            continue
        bad = False
        for x in values:
            if key == "scaling":
                if x not in ("weak", "strong"):
                    problems.append((f"{where}.{key}", f"must be 'weak' or 'strong', got {x!r}"))
                    bad = True
            elif not isinstance(x, int) or isinstance(x, bool) or not 1 <= x <= _INT_MAX:
                problems.append((f"{where}.{key}", f"expected positive integers (64-bit), got {x!r}"))
                bad = True
        if not bad:  # an invalid list is reported, never expanded (a false world size would divide by zero)
            out[key] = values
    return out


def parse_suite(doc: dict, path: str | Path = "<string>") -> Suite:
    """Validate a parsed TOML document and expand it into runs; raise ConfigError listing all problems."""
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
    description = suite.get("description", "")
    if not isinstance(description, str):
        problems.append(("suite.description", "expected a string"))
        description = ""

    defaults = doc.get("defaults", {})
    if not isinstance(defaults, dict):
        problems.append(("defaults", "expected a table"))
        defaults = {}
    for key in defaults:
        if key not in SECTIONS:
            problems.append((f"defaults.{_qkey(key)}", f"unknown key; valid keys: {', '.join(SECTIONS)}"))

    suite_energy = _build_section(EnergyConfig, doc.get("energy", {}), "energy", problems)
    suite_carbon = _build_section(CarbonConfig, doc.get("carbon", {}), "carbon", problems)
    _check_carbon(suite_carbon, "carbon", problems)
    suite_sweep = _sweep_lists(doc.get("sweep"), "sweep", problems)

    workloads = doc.get("workload")
    if workloads is None:
        problems.append(("workload", "no [[workload]] defined; add at least one"))
        workloads = []
    elif not isinstance(workloads, list) or not all(isinstance(w, dict) for w in workloads):
        problems.append(("workload", "expected an array of tables ([[workload]])"))
        workloads = []

    runs: list[RunConfig] = []
    seen_names: set[str] = set()
    for i, raw in enumerate(workloads):
        where = f"workload[{i}]"
        wname = raw.get("name")
        if not isinstance(wname, str) or not wname.strip():
            problems.append((f"{where}.name", "every workload needs a non-empty string name"))
            wname = f"workload{i}"
        elif wname in seen_names:
            problems.append((f"{where}.name", f"duplicate workload name {wname!r}"))
        seen_names.add(wname)
        where = f"workload[{i}] ({wname})"
        for key in raw:
            if key not in WORKLOAD_KEYS:
                problems.append((f"{where}.{_qkey(key)}",
                                 f"unknown key; valid keys: {', '.join(sorted(WORKLOAD_KEYS))}"))
        kind = raw.get("kind", "dense")
        if kind not in ("dense", "moe"):
            problems.append((f"{where}.kind", f"must be 'dense' or 'moe', got {kind!r}"))
        wdesc = raw.get("description", "")
        if not isinstance(wdesc, str):
            problems.append((f"{where}.description", "expected a string"))
            wdesc = ""
        merged = _merge({k: v for k, v in defaults.items() if isinstance(v, dict)},
                        {k: v for k, v in raw.items() if k in SECTIONS})
        for k, v in defaults.items():
            if k in SECTIONS and not isinstance(v, dict):
                problems.append((f"defaults.{k}", "expected a table"))
        if kind != "moe" and "moe" in raw:
            problems.append((f"{where}.moe", "a [moe] table needs kind = \"moe\""))
        built = {}
        for sec, cls in SECTIONS.items():
            if sec == "moe" and kind != "moe":
                continue
            if sec in ("energy", "carbon") and sec not in merged:
                built[sec] = suite_energy if sec == "energy" else suite_carbon
                continue
            built[sec] = _build_section(cls, merged.get(sec, {}), f"{where}.{sec}", problems)
            if sec == "carbon":
                _check_carbon(built[sec], f"{where}.carbon", problems)
        own_sweep = _sweep_lists(raw["sweep"], f"{where}.sweep", problems) if "sweep" in raw else {}
        if built.get("model") is not None:  # checked even when another section has mistakes
            _check_model(built["model"], where, problems)
        if any(v is None for v in built.values()) or kind not in ("dense", "moe"):
            continue
        _check_data(built["train"], built["model"], where, problems)
        sweep = {**SWEEP_DEFAULTS, **suite_sweep, **own_sweep}
        sweep_id = f"{name}/{wname}"
        for ws, nodes, scaling in itertools.product(sweep["world_size"], sweep["nodes"], sweep["scaling"]):
            run = RunConfig(suite=name, workload=wname, kind=kind, description=wdesc or description,
                            world_size=ws, nodes=nodes, scaling=scaling,
                            sweep_id=f"{sweep_id}/{scaling}", **built)
            _check_run(run, where, problems)
            runs.append(run)
    if problems:
        raise ConfigError(path, problems)
    return Suite(name=name, description=description, path=str(path), runs=runs)


def load_suite(path: str | Path) -> Suite:
    """Read and validate a suite file; every failure is a ConfigError naming the file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(path, [("", "file not found; pass the path of a suite .toml (see workloads/)")])
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(path, [("", f"cannot read file: {e}")])
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(path, [("", f"TOML syntax error: {e}")])
    return parse_suite(doc, path)
