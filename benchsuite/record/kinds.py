"""Classifications every layer and every view asks, each defined once at the bottom of the house:
which energy sources were read from a meter, what each MoE router is. A view that needs one of
these asks here; it never keeps a list of its own (two lists drift: one view called "sampled"
metered, another not measured)."""

from __future__ import annotations

from dataclasses import dataclass

from benchsuite.record.types import Source


@dataclass(frozen=True)
class RouterKind:
    """What an MoE router is, as every part of benchsuite needs to know it."""

    name: str
    k: int | None  # experts each token chooses (token_choice: its default top_k); None: experts choose tokens
    token_choice: bool  # tokens choose experts (a capacity drops tokens; capacity_factor = 0 is dropless)
    label: str  # how a person reads its name


ROUTERS = {r.name: r for r in (
    RouterKind("switch", 1, True, "Switch (top-1)"),
    RouterKind("gshard", 2, True, "GShard (top-2)"),
    RouterKind("token_choice", 2, True, "token choice (top-k)"),
    RouterKind("expert_choice", None, False, "expert choice"),
)}

# Energy read from a meter: the GPU's energy counter, RAPL, or integrated power samples.
METERED = frozenset({Source.MEASURED, Source.SAMPLED})
