"""Which suite keys apply to which workloads: a key that would change nothing is refused, not ignored.

A key applies everywhere unless a rule here says when it applies. A workload's own key that does
not apply is refused naming the key, what it needs and the fix, unless its value is what the run
does anyway (the default, or a router's own k): `expert = 1` on a dense model states a fact.
A key inherited from [defaults] or the suite's [energy]/[carbon] is applied where it applies and
left at its default elsewhere, so each record holds what ran; one that applies to no workload is
refused. The docs' table of where keys apply (docs/reference/suite-keys.md) is `table()`; `apply_rules` applies
them to one workload.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import msgspec

from benchsuite.config.merging import Inherited, inherited_path
from benchsuite.config.problems import Problems
from benchsuite.record.kinds import ROUTERS
from benchsuite.record.sections import defaults


@dataclass(frozen=True)
class BuiltWorkload:
    """What the rules read of one workload: its kind, built sections and whether its sweep sets seeds."""

    kind: str
    sections: dict[str, Any]
    seed_swept: bool

    @property
    def model(self):
        return self.sections["model"]

    @property
    def train(self):
        return self.sections["train"]

    @property
    def parallel(self):
        return self.sections["parallel"]

    @property
    def moe(self):
        return self.sections["moe"]

    @property
    def carbon(self):
        return self.sections["carbon"]


@dataclass(frozen=True)
class KeyRule:
    key: str  # "section.key"
    applies_when: str  # the condition as the docs' table states it
    reads: tuple[str, ...]  # keys the condition reads: a rule is not judged when one of them was refused
    applies: Callable[[BuiltWorkload], bool]
    why: Callable[[BuiltWorkload, Any], str]  # the refusal: why the value changes nothing, and the fix
    also_runs: Callable[[BuiltWorkload], Any] = lambda w: None  # a value besides the default that the run does anyway
    default_ok: bool = True  # False: even the default is not what the record would hold (train.seed)


def _router(w: BuiltWorkload) -> str:
    return w.moe.router


def _token_choice(w: BuiltWorkload) -> bool:
    """Tokens choose experts (switch, gshard, token_choice): a load-balancing loss and routing apply."""
    return ROUTERS[w.moe.router].token_choice


def _no_pipeline(what: str) -> Callable[[BuiltWorkload, Any], str]:
    return lambda w, v: (f"{what} a pipeline; parallel.pipeline is 1, so {v!r} would change nothing: "
                         f"set pipeline > 1 or remove it")


def _top_k_why(w: BuiltWorkload, v) -> str:
    if not _token_choice(w):
        return ("expert choice has no top_k (each expert takes capacity_factor·N/E tokens); remove top_k "
                "or use router = \"token_choice\"")
    k = ROUTERS[w.moe.router].k
    return f"router = {w.moe.router!r} is top-{k}; for top-{v} use router = \"token_choice\""


def _second_expert_why(w: BuiltWorkload, v) -> str:
    if w.moe.router != "gshard":
        return (f"applies to router = \"gshard\" (whether a capacity keeps each token's second expert); "
                f"{w.moe.router} has no second expert to drop: remove it")
    return ("capacity_factor = 0 (dropless) keeps every assignment; use second_expert_policy = \"all\" or "
            "capacity_factor > 0")


def _ffn_applies(w: BuiltWorkload) -> bool:
    return not (w.kind == "moe" and w.moe.every == 1 and w.moe.expert_hidden is not None)


RULES = (
    KeyRule("parallel.microbatches", "`parallel.pipeline` > 1", ("parallel.pipeline",),
            lambda w: w.parallel.pipeline > 1, _no_pipeline("microbatches split the batch of")),
    KeyRule("parallel.schedule", "`parallel.pipeline` > 1", ("parallel.pipeline",),
            lambda w: w.parallel.pipeline > 1, _no_pipeline("a schedule orders the microbatches of")),
    KeyRule("parallel.virtual_stages", "`parallel.pipeline` > 1", ("parallel.pipeline",),
            lambda w: w.parallel.pipeline > 1,
            lambda w, v: "virtual stages need a pipeline; set pipeline > 1 or virtual_stages = 1"),
    KeyRule("parallel.first_stage_layers", "`parallel.pipeline` > 1", ("parallel.pipeline",),
            lambda w: w.parallel.pipeline > 1, _no_pipeline("first_stage_layers sets the first stage of")),
    KeyRule("parallel.last_stage_layers", "`parallel.pipeline` > 1", ("parallel.pipeline",),
            lambda w: w.parallel.pipeline > 1, _no_pipeline("last_stage_layers sets the last stage of")),
    KeyRule("parallel.sequence_parallel", "`parallel.tensor` > 1", ("parallel.tensor",),
            lambda w: w.parallel.tensor > 1,
            lambda w, v: "sequence parallelism splits the tensor-parallel ranks' norms and dropouts over the "
                         "sequence; parallel.tensor is 1, so it would change nothing: set tensor > 1 or remove it"),
    KeyRule("parallel.expert", "`kind = \"moe\"`", ("kind",), lambda w: w.kind == "moe",
            lambda w, v: "expert parallelism needs kind = \"moe\" (a dense model has no experts to shard); "
                         "remove expert or set it to 1"),
    KeyRule("parallel.expert_tensor", "`kind = \"moe\"`", ("kind",), lambda w: w.kind == "moe",
            lambda w, v: "expert tensor parallelism splits the experts' FFNs and needs kind = \"moe\" (a dense "
                         "model's FFN is split by parallel.tensor); remove expert_tensor or set it to 1"),
    KeyRule("moe.top_k", "`moe.router = \"token_choice\"` (switch is top-1, gshard top-2)", ("moe.router",),
            lambda w: _router(w) == "token_choice", _top_k_why, also_runs=lambda w: ROUTERS[_router(w)].k),
    KeyRule("moe.score", "`moe.router = \"token_choice\"` (the others score with softmax)", ("moe.router",),
            lambda w: _router(w) == "token_choice",
            lambda w, v: f"score = {v!r} needs router = \"token_choice\" ({w.moe.router} scores with softmax)"),
    KeyRule("moe.second_expert_policy", "`moe.router = \"gshard\"` and `moe.capacity_factor` > 0",
            ("moe.router", "moe.capacity_factor"),
            lambda w: _router(w) == "gshard" and w.moe.capacity_factor > 0, _second_expert_why),
    KeyRule("moe.aux_loss_coef", "a token-choice router (`switch`, `gshard`, `token_choice`)", ("moe.router",),
            _token_choice,
            lambda w, v: "expert choice is balanced by construction and has no load-balancing loss: remove "
                         "aux_loss_coef (z_loss_coef applies to every router)"),
    KeyRule("moe.min_capacity", "`moe.capacity_factor` > 0", ("moe.capacity_factor",),
            lambda w: w.moe.capacity_factor > 0,
            lambda w, v: "capacity_factor = 0 is dropless: there is no capacity; remove min_capacity or set "
                         "capacity_factor > 0"),
    KeyRule("model.rope_theta", "`model.position = \"rope\"`", ("model.position",),
            lambda w: w.model.position == "rope",
            lambda w, v: "rope_theta is the base of rotary positions; with position = \"learned\" it changes "
                         "nothing: set position = \"rope\" or remove it"),
    KeyRule("moe.normalize_top_k", "`moe.router = \"token_choice\"`", ("moe.router",),
            lambda w: _router(w) == "token_choice",
            lambda w, v: f"normalize_top_k applies to router = \"token_choice\" ({w.moe.router} fixes its own "
                         f"gates): remove it"),
    KeyRule("moe.balance", "a token-choice router (`switch`, `gshard`, `token_choice`)", ("moe.router",),
            _token_choice,
            lambda w, v: "expert choice is balanced by construction: remove balance"),
    KeyRule("moe.bias_update", "`moe.balance = \"aux_free\"`", ("moe.balance",),
            lambda w: w.moe.balance == "aux_free",
            lambda w, v: "bias_update is the step of aux-free balancing's expert bias: set balance = "
                         "\"aux_free\" or remove it"),
    KeyRule("moe.routing", "a token-choice router (`switch`, `gshard`, `token_choice`)", ("moe.router",),
            _token_choice,
            lambda w, v: "expert choice already gives each expert the same number of tokens: forced routing "
                         "changes nothing; remove routing"),
    KeyRule("model.ffn_hidden", "a dense FFN or an expert is that wide: not (`moe.every = 1` with "
            "`moe.expert_hidden` set)", ("kind", "moe.every", "moe.expert_hidden"), _ffn_applies,
            lambda w, v: "every block's FFN is an MoE layer (moe.every = 1) whose experts are moe.expert_hidden "
                         "wide, so no FFN is ffn_hidden wide: remove ffn_hidden or expert_hidden"),
    KeyRule("train.target_loss", "`train.eval_every` > 0", ("train.eval_every",),
            lambda w: w.train.eval_every > 0,
            lambda w, v: "time to target reads the validation loss, which train.eval_every = 0 never measures: "
                         "set eval_every > 0 or remove target_loss"),
    KeyRule("train.seed", "no `seed` list in the sweep", ("sweep.seed",), lambda w: not w.seed_swept,
            lambda w, v: "the sweep's seed list sets each run's seed: remove train.seed or the sweep's seed",
            default_ok=False),
    KeyRule("carbon.country", "no `carbon.intensity_g_per_kwh`", ("carbon.intensity_g_per_kwh",),
            lambda w: w.carbon.intensity_g_per_kwh is None,
            lambda w, v: "intensity_g_per_kwh is given and is the figure used, so country changes nothing: "
                         "remove country or intensity_g_per_kwh"),
    KeyRule("carbon.region", "no `carbon.intensity_g_per_kwh`", ("carbon.intensity_g_per_kwh",),
            lambda w: w.carbon.intensity_g_per_kwh is None,
            lambda w, v: "intensity_g_per_kwh is given and is the figure used, so region changes nothing: "
                         "remove region or intensity_g_per_kwh"),
)
BY_KEY = {rule.key: rule for rule in RULES}


def default_of(section: Any, key: str) -> Any:
    """The value a section's key has when a suite does not set it."""
    return defaults(type(section))[key]


def runs_anyway(rule: KeyRule, w: BuiltWorkload, value: Any) -> bool:
    """Whether a value of a key that does not apply is what the run does anyway (so stating it misleads no one)."""
    default = default_of(w.sections[rule.key.partition(".")[0]], rule.key.partition(".")[2])
    return (rule.default_ok and value == default) or (value is not None and value == rule.also_runs(w))


def table() -> str:
    """The docs' table (docs/reference/suite-keys.md): each key that applies only somewhere, and where."""
    rows = ["| key | applies when |", "|---|---|"]
    rows += [f"| `{rule.key}` | {rule.applies_when} |" for rule in RULES]
    return "\n".join(rows)


def apply_rules(w: BuiltWorkload, origins: dict[str, str], problems: Problems, inherited: Inherited) -> None:
    """Refuse the workload's own keys that would change nothing; set an inherited key that does not apply
    back to its default, so the record holds what ran, and note why it took no effect there."""
    for key, origin in origins.items():
        sec, _, name = key.partition(".")
        path = inherited_path(key, origin)
        rule = BY_KEY.get(key)
        if sec not in w.sections:  # [defaults.moe] under a dense workload
            inherited.unused(path, "applies to no workload of this suite: it needs kind = \"moe\"")
        elif rule is None or not problems.known(key, *rule.reads) or rule.applies(w):
            if origin != "workload":
                inherited.used.add(path)
        elif origin != "workload":
            w.sections[sec] = msgspec.structs.replace(w.sections[sec], **{name: default_of(w.sections[sec], name)})
            inherited.unused(path, f"applies to no workload of this suite: it needs "
                                   f"{rule.applies_when.replace('`', '')}", specific=1)
        elif not runs_anyway(rule, w, getattr(w.sections[sec], name)):
            problems.refuse(key, rule.why(w, getattr(w.sections[sec], name)))
