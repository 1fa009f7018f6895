"""Training quality at equal cost: validation-loss curves, and what it took to reach a target loss.

With ``train.eval_every = E > 0`` the worker evaluates the validation loss after 0, E, 2E, ...
measured steps and after the last one (`eval_points`), on a fixed held-out set of `EVAL_ROWS`
sequences (`eval_rows`). Training runs in energy windows "train-k" between evaluations, each
evaluation in its own window "eval-k" and outside the step timer, so every figure at an
evaluation point is training only:

- step: measured steps done (0 = before the first measured step);
- tokens: global tokens per step x step. Step 0 (the FLOP-counting step) and the warm-up steps
  are excluded: they train the model too, but are not timed or metered, so counting their
  tokens without their time and energy would flatter every run alike. With few warm-up steps
  (a handful against hundreds) the bias is small and the same for dense and sparse runs;
- seconds: sum of the measured step times (the slowest rank's per step) up to that point;
- model_flops: tokens x analytic model FLOPs per token;
- energy_j: sum of the training windows up to that point (all devices and nodes, as the
  record's energy section), None once any window has no figure.

`to_target` (pure) then gives the step, tokens, seconds, model FLOPs, energy and CO2e at which
the validation loss first reaches ``train.target_loss``, linearly interpolated between the two
evaluations that straddle it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from benchsuite.energy.carbon import co2e_g

EVAL_ROWS = 64  # held-out sequences per evaluation: the same set for every batch size and world size

COUNTING = ("measured steps only: step 0 and the warm-up steps are excluded; tokens = global tokens per step x "
            "steps; seconds = sum of measured step times (slowest rank); energy = training windows only; "
            "evaluation time and energy are kept apart (eval_seconds, eval_energy_j)")
INTERPOLATION = "linear between the two evaluations that straddle the target"


def eval_points(steps: int, every: int) -> list[int]:
    """Measured-step counts after which validation loss is evaluated: 0, every, 2*every, ..., and steps."""
    if every <= 0:
        return []
    points = list(range(0, steps, every))
    return points + [steps]


def eval_rows(val_batches: Iterable, rows: int = EVAL_ROWS) -> Iterator:
    """The first `rows` sequences of a source's val_batches(...), the last batch trimmed to fit."""
    left = rows
    for inputs, targets in val_batches:
        if left <= 0:
            return
        yield inputs[:left], targets[:left]
        left -= len(inputs)


def curve(points: list[int], val_losses: list[float], step_times_s: list[float], tokens_per_step: float,
          model_flops_per_token: float, segment_energy_j: list[float | None]) -> list[dict]:
    """The eval points with cumulative training figures. segment_energy_j[j] is the training energy
    between points[j] and points[j + 1] (len(points) - 1 entries)."""
    if len(val_losses) != len(points) or len(segment_energy_j) != max(0, len(points) - 1):
        raise ValueError(f"{len(points)} eval points need as many losses and one segment fewer; got "
                         f"{len(val_losses)} losses and {len(segment_energy_j)} segments")
    out = []
    # 0 J before any training only when training energy was measured at all: never a 0 for "unknown".
    energy: float | None = None if segment_energy_j and all(e is None for e in segment_energy_j) else 0.0
    for j, (k, loss) in enumerate(zip(points, val_losses)):
        if j > 0:
            seg = segment_energy_j[j - 1]
            energy = None if energy is None or seg is None else energy + seg
        tokens = k * tokens_per_step
        out.append({"step": k, "tokens": tokens, "seconds": sum(step_times_s[:k]),
                    "model_flops": tokens * model_flops_per_token, "energy_j": energy, "val_loss": loss})
    return out


def _fmt(v: float) -> str:
    return f"{v:.4g}"


def to_target(points: list[dict], target: float | None, carbon: dict | None = None,
              energy_reason: str | None = None) -> dict:
    """What it took to first reach validation loss <= target on a curve (see `curve`).

    Between the last evaluation above the target (a) and the first at or below it (b), every
    figure is interpolated linearly at fraction f = (loss_a - target) / (loss_a - loss_b).
    Returns reached (True/False, None when there is no curve or target), step (fractional),
    reached_step (the first evaluation at or below the target), tokens, seconds, model_flops,
    energy_j, co2e_g, and reason (why the figures are None) / energy_reason (why only energy is).
    """
    out = {"target_loss": target, "reached": None, "step": None, "reached_step": None, "tokens": None,
           "seconds": None, "model_flops": None, "energy_j": None, "co2e_g": None, "reason": None,
           "energy_reason": None}
    if target is None:
        out["reason"] = "no target: train.target_loss is not set"
        return out
    if not points:
        out["reason"] = "no validation loss: train.eval_every is 0"
        return out
    i = next((i for i, p in enumerate(points) if p["val_loss"] <= target), None)
    if i is None:
        best = min(points, key=lambda p: p["val_loss"])
        out["reached"] = False
        out["reason"] = f"target {_fmt(target)} not reached; best {_fmt(best['val_loss'])} at step {best['step']}"
        return out
    b = points[i]
    a = points[i - 1] if i > 0 else b
    f = 0.0 if a is b else (a["val_loss"] - target) / (a["val_loss"] - b["val_loss"])

    def lerp(key):
        if a[key] is None or b[key] is None:
            return None
        return a[key] + f * (b[key] - a[key])

    out.update(reached=True, step=lerp("step"), reached_step=b["step"], tokens=lerp("tokens"),
               seconds=lerp("seconds"), model_flops=lerp("model_flops"), energy_j=lerp("energy_j"))
    if out["energy_j"] is None:
        out["energy_reason"] = f"energy unavailable: {energy_reason or 'no training energy figure'}"
    else:
        carbon = carbon or {}
        out["co2e_g"] = co2e_g(out["energy_j"], float(carbon.get("pue") or 1.0), carbon.get("intensity_g_per_kwh"))
        if out["co2e_g"] is None:
            out["energy_reason"] = "CO2e unavailable: no grid intensity in the carbon section"
    return out
