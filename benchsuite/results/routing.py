"""Learned vs forced routing side by side: the MoE runs that differ only by moe.routing, on one row.

Frameworks publish MoE throughput measured with forced, balanced routing (Megatron's
force-load-balancing); a trained router is slower, by how much its imbalance costs. A pair is two runs
of one identity but for moe.routing; its `speedup` is forced tok/s ÷ learned tok/s (the learned
router's slowdown), the ratio of their medians with Welch's 95 % interval over their seeds.
"""

from __future__ import annotations

from dataclasses import dataclass

from benchsuite.record.columns import view_columns
from benchsuite.record.values import num
from benchsuite.results.frames import rows_of
from benchsuite.results.stats import ConfidenceInterval, welch_ratio

(ROUTING_COLUMN,) = view_columns("config.moe.routing")
FIGURES = ("tokens_per_s", "mfu", "j_per_token")


@dataclass(frozen=True)
class RoutingPair:
    label: str  # the learned run's label
    learned: dict[str, float | None]  # FIGURES of the learned run (its medians)
    forced: dict[str, float | None]
    speedup: ConfidenceInterval  # forced tok/s ÷ learned tok/s
    identities: tuple[str, str]  # (learned, forced)

    def to_dict(self) -> dict:
        s = self.speedup
        return {"label": self.label, "learned": self.learned, "forced": self.forced,
                "speedup": s.point, "speedup_lo": s.lo, "speedup_hi": s.hi, "speedup_reason": s.reason,
                "identities": list(self.identities)}


def routing_pairs(results) -> list[RoutingPair]:
    """Every learned/forced pair of ok runs in the results model, in the runs' order."""
    runs = results.ok_runs_of(["identity", "label", ROUTING_COLUMN, *FIGURES])  # the columns read, not its ~400
    if runs.empty or ROUTING_COLUMN not in runs:
        return []
    by_key: dict[str, dict[str, dict]] = {}
    moe = runs[runs[ROUTING_COLUMN].isin(("learned", "forced"))]
    pair_key = dict(zip(results.df["identity"], results.df["routing_identity"]))  # one per run: no record read
    for row in rows_of(moe):
        by_key.setdefault(pair_key[row["identity"]], {})[row[ROUTING_COLUMN]] = row
    pairs = []
    for both in by_key.values():
        if len(both) < 2:
            continue
        learned, forced = both["learned"], both["forced"]
        pairs.append(RoutingPair(
            label=learned["label"], learned={f: num(learned.get(f)) for f in FIGURES},
            forced={f: num(forced.get(f)) for f in FIGURES},
            speedup=welch_ratio(_seed_values(results, forced["identity"]), _seed_values(results, learned["identity"])),
            identities=(learned["identity"], forced["identity"])))
    return pairs


def _seed_values(results, identity: str) -> list[float]:
    """tok/s of each seed of a run (the median over its repeats)."""
    seeds = results.per_seed.loc[identity, "tokens_per_s"] if identity in results.per_seed.index else []
    return [v for v in (num(x) for x in seeds) if v is not None]
