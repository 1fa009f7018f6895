"""Dense or MoE on this system: each MoE run of a suite ÷ its dense partner, in time, energy and CO2e to the
same N tokens, each ratio with its range and the term that dominates it.

Partner: the dense run (no [moe]) of the same world size and seed, of the same width and depth where the
suite has one, else the first such run. Range: each uncertain input of the prediction moved to the low and
high ends of its stated range (UNCERTAIN), one at a time, both runs re-predicted; a ratio's range is the
widest one-input spread, and that input is the term that dominates its uncertainty. A ratio cancels what
both runs share (a matmul rate a few % off moves both), so what dominates is what the MoE run adds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import msgspec

from benchsuite.config import RunConfig
from benchsuite.metrics.flops import param_counts
from benchsuite.predict.step import CHINCHILLA_TOKENS_PER_PARAM, Prediction, predict_run
from benchsuite.predict.system import System


def _device(**scale: float) -> Callable[[System, float], System]:
    def apply(s: System, f: float) -> System:
        return dataclasses.replace(s, device=msgspec.structs.replace(
            s.device, **{k: getattr(s.device, k) * (1 + (f * v)) for k, v in scale.items()
                         if getattr(s.device, k) is not None}))
    return apply


def _links(s: System, f: float) -> System:
    def scaled(link):
        return msgspec.structs.replace(link, gbps=link.gbps * (1 + 0.3 * f))
    return dataclasses.replace(s, intra_node=scaled(s.intra_node), inter_node=scaled(s.inter_node))


def _half_tokens(s: System, f: float) -> System:
    weight_bytes = 4 if s.device.kind == "cpu" else 2  # fp32 on a CPU, bf16 on a GPU (moe.half_tokens)
    derived = s.device.matmul_tflops * 1e12 * weight_bytes / (2 * s.device.memory_gbps * 1e9)
    half = (s.experts.gemm_half_tokens or derived) * 2.0 ** f
    return dataclasses.replace(s, experts=msgspec.structs.replace(s.experts, gemm_half_tokens=half))


def _load(s: System, f: float) -> System:
    r = s.experts.load_max_over_mean
    return dataclasses.replace(s, experts=msgspec.structs.replace(s.experts, load_max_over_mean=max(1.0, r + 0.25 * f)))


def _floor(s: System, f: float) -> System:
    return dataclasses.replace(s, node=msgspec.structs.replace(s.node, op_floor_us=s.node.op_floor_us * 2.0 ** f))


def _power(s: System, f: float) -> System:
    return dataclasses.replace(s, device=msgspec.structs.replace(
        s.device, idle_w=None if s.device.idle_w is None else s.device.idle_w * (1 + 0.3 * f)))


# The inputs a prediction is uncertain in, each with its stated range (f = −1 low, +1 high).
UNCERTAIN: tuple[tuple[str, Callable[[System, float], System]], ...] = (
    ("matmul rate (±15 %)", _device(matmul_tflops=0.15, fp8_matmul_tflops=0.15)),
    ("attention rate (±25 %)", _device(attention_tflops=0.25)),
    ("memory bandwidth (±20 %)", _device(memory_gbps=0.2)),
    ("links' bandwidth (±30 %)", _links),
    ("grouped-GEMM curve (T½ ×/÷ 2)", _half_tokens),
    ("expert load (r ± 0.25, unless a record gives it)", _load),
    ("operator floor (op_floor_us ×/÷ 2)", _floor),
    ("idle power (±30 %)", _power),
)


@dataclass(frozen=True)
class Ratio:
    value: float
    low: float
    high: float
    dominant: str | None  # the input whose range moves this ratio most; None: none moves it

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class DenseVsMoE:
    moe: str
    dense: str
    tokens: float
    time: Ratio
    energy: Ratio
    co2e: Ratio

    def to_dict(self) -> dict:
        return {"moe": self.moe, "dense": self.dense, "tokens": self.tokens, "time": self.time.to_dict(),
                "energy": self.energy.to_dict(), "co2e": self.co2e.to_dict()}


def partner(run: RunConfig, runs: list[RunConfig]) -> RunConfig | None:
    """The dense run an MoE run is compared with (module docstring), None where the suite has none."""
    dense = [r for r in runs if r.moe is None and r.world_size == run.world_size and r.train.seed == run.train.seed]
    same = [r for r in dense if (r.model.hidden, r.model.layers) == (run.model.hidden, run.model.layers)]
    return (same or dense or [None])[0]


def _figures(p: Prediction) -> tuple[float, float, float]:
    e = p.energy
    return e.run_s, e.run_energy_j, e.run_co2e_g


def dense_vs_moe(runs: list[tuple[str, RunConfig]], system: System, tokens: float | None,
                 predict: Callable[[RunConfig, System, float], Prediction]) -> list[DenseVsMoE]:
    """Each MoE run ÷ its dense partner on `system`, to `tokens` tokens (default: the dense run's 20 per
    parameter); predict(run, system, tokens) is the command's own (its precision and expert load)."""
    configs = [r for _, r in runs]
    names = {id(r): name for name, r in runs}
    out = []
    for name, run in runs:
        dense = partner(run, configs) if run.moe is not None else None
        if dense is None:
            continue
        n = tokens or CHINCHILLA_TOKENS_PER_PARAM * param_counts(dense.model, dense.moe).total

        def ratios(s: System) -> tuple[float, ...]:
            a, b = _figures(predict(run, s, n)), _figures(predict(dense, s, n))
            return tuple(x / y for x, y in zip(a, b))

        central = ratios(system)
        spans = [(label, ratios(move(system, -1.0)), ratios(move(system, 1.0))) for label, move in UNCERTAIN]
        figures = []
        for i, value in enumerate(central):
            label, lo, hi = max(spans, key=lambda t: abs(t[2][i] - t[1][i]))
            moved = abs(hi[i] - lo[i]) > 1e-9 * value
            figures.append(Ratio(value, min(lo[i], hi[i], value), max(lo[i], hi[i], value), label if moved else None))
        out.append(DenseVsMoE(name, names[id(dense)], n, *figures))
    return out


def default_predict(fp8: bool = False, expert_load: float | None = None):
    """predict_run with the command's options."""
    def run(r: RunConfig, s: System, n: float | None) -> Prediction:
        return predict_run(r, s, n, fp8=fp8, expert_load=expert_load,
                           expert_load_source="--expert-load" if expert_load is not None else None)
    return run
