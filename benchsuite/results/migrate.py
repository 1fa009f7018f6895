"""Upgrading records of older schema versions, as asv's results.py does: one `update_to_N` per
version, applied in order to the raw document before the types see it (record/codec.decode), so a
reader only ever sees the current version. Every upgrade step of every version lives here.

A version's upgrade is a list of small steps, each `step(rec) -> rec` owning one part of the record
it changed, named with the field it reads. A step that meets a damaged field (a hand-edited or
truncated record) makes the record a RecordError naming that field and the version, never a
traceback; the loader skips it with a warning. Steps that need model code import it on first use
(it imports torch): a folder of current records never loads it.
"""

from __future__ import annotations

import copy
import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass

import msgspec

from benchsuite.record.codec import RecordError, check_version
from benchsuite.record.kinds import experts_choose
from benchsuite.record.sections import SECTIONS, CarbonConfig, MoEConfig, defaults
from benchsuite.record.types import SCHEMA_VERSION
from benchsuite.record.values import coefficient_of_variation, num


@dataclass(frozen=True)
class Upgrade:
    step: Callable[[dict], dict]
    field: str  # the part of the record it reads and rewrites, named when that part is damaged


# ----------------------------------------------------------------------------- version 1 -> 2


def _v1_model_per_token(run) -> float:
    """What schema 1 stored as model_per_token: expert choice at cf experts per token, and with
    full recompute a blanket 8x / 16x on the blocks."""
    from benchsuite.metrics.flops import param_counts
    from benchsuite.models.moe import active_experts_per_token

    cfg, tokens = run.model, run.micro_batch_per_rank * run.model.seq_len
    pc = param_counts(cfg, run.moe, tokens)
    active = pc.active_matmul
    if run.moe is not None and experts_choose(run.moe.router):
        active += pc.moe_layers * pc.expert * (run.moe.capacity_factor - active_experts_per_token(run.moe, tokens))
    mult, attn = (8, 16) if run.train.recompute == "full" else (6, 12)
    return mult * active + 6 * pc.lm_head + attn * cfg.layers * cfg.seq_len * cfg.hidden


def upgrade_v1_flops(rec: dict) -> dict:
    """A schema-1 record's FLOP figures in schema 2's meaning; returns an upgraded copy.

    Schema 1 counted the recomputed forward in model FLOPs (and so in MFU, TFLOP/s, J/PFLOP,
    mfu_vs_ceiling and the quality figures), gave expert choice cf experts per token, matched
    the peak table by substring, and had executed_per_token (padded slots, recompute as a blanket
    8x / 16x) where schema 2 has hardware_per_token and hfu. The stored measurements are kept and
    corrected by exact ratios from the stored config (new model or hardware FLOPs / schema 1's
    model FLOPs), and the peak is looked up again by exact device name. When the config no longer
    parses, model figures stay only where schema 1 had them right (no recompute, not expert
    choice), hardware figures are null, and metrics.flops.upgraded_from says so.
    """
    from benchsuite.metrics.flops import lookup_peak, rate_figures, record_flops  # brings torch: only when upgrading

    metrics = rec.get("metrics") or {}
    if not isinstance(metrics.get("flops"), dict):
        return rec  # a failed run: no figures
    rec = copy.deepcopy(rec)
    m = rec["metrics"]
    old = m["flops"]
    to_model, to_hardware, basis, note = _v1_ratios(rec.get("config") or {}, m.get("moe") or {})
    stored = old.get("model_per_token")
    m["flops"] = dict(record_flops(_times(stored, to_model), _times(stored, to_hardware), basis,
                                   old.get("counted_per_token"), old.get("counted_source")), upgraded_from=note)
    devices = (rec.get("env") or {}).get("devices") or [{}]
    if m.get("peak_source") == "given" and m.get("peak_tflops"):
        peak, source = m["peak_tflops"] * 1e12, "given (--peak-tflops)"
    else:
        peak, source = lookup_peak(str(devices[0].get("name")), m.get("precision"))
    achieved = _times(m.get("tflops_per_device"), 1e12)  # stored model FLOP/s per device
    m.update(rate_figures(_times(achieved, to_model), _times(achieved, to_hardware), peak),
             peak_tflops=None if peak is None else peak / 1e12, peak_source=source)
    if "mfu_vs_ceiling" in m:
        m["mfu_vs_ceiling"] = _times(m["mfu_vs_ceiling"], to_model)
    if isinstance(m.get("energy"), dict) and "j_per_pflop" in m["energy"]:
        m["energy"]["j_per_pflop"] = _times(m["energy"]["j_per_pflop"], None if not to_model else 1 / to_model)
    quality = m.get("quality")
    if isinstance(quality, dict):
        for part in [quality, *(quality.get("curve") or [])]:
            if "model_flops" in part:
                part["model_flops"] = _times(part["model_flops"], to_model)
    return rec


def _times(v: float | None, k: float | None) -> float | None:
    return None if v is None or k is None else v * k


def _v1_ratios(cfg: dict, moe: dict) -> tuple[float | None, float | None, str, str]:
    """(schema 2's model FLOPs ÷ schema 1's, hardware FLOPs ÷ schema 1's model FLOPs, the hardware figure's
    basis, the note) for a schema-1 record's stored config; where the config no longer parses, 1 where
    schema 1 was right (no recompute, not expert choice), else unknown."""
    from benchsuite.config import RunConfig
    from benchsuite.metrics.flops import computed_slot_share, flops_per_token, hardware_basis

    try:
        run = RunConfig.from_dict(cfg)
    except (TypeError, ValueError, KeyError, AttributeError) as e:
        exact = ((cfg.get("train") or {}).get("recompute") != "full"
                 and not experts_choose((cfg.get("moe") or {}).get("router")))
        return ((1.0 if exact else None), None, "not known: the stored config no longer parses",
                f"schema 1, config no longer parses ({type(e).__name__}: {e}): model FLOPs "
                + ("kept (no recompute, no expert choice)" if exact else "unknown (schema 1 counted recompute)"))
    f = flops_per_token(run.model, run.moe, micro_batch=run.micro_batch_per_rank, recompute=run.train.recompute,
                        slot_share=computed_slot_share(moe.get("expert_impl"), moe.get("padding_frac")))
    v1 = _v1_model_per_token(run)
    return (f.model / v1, f.hardware / v1,
            hardware_basis(run.moe, recompute=run.train.recompute, expert_impl=moe.get("expert_impl")),
            "schema 1, corrected from the stored config")


def upgrade_v1_ceiling(rec: dict) -> dict:
    """A version-1 record's ceiling figures as version 2 states them: how the ceiling was measured
    (a 10-matmul burst then), and mfu_vs_ceiling null with the reason where the run outpaced it."""
    from benchsuite.metrics.ceiling import vs_ceiling

    m = rec.get("metrics")
    if rec.get("status") != "ok" or not isinstance(m, dict):
        return rec
    m.setdefault("matmul_ceiling_source", "10 back-to-back matmuls after 3 unmeasured (before version 2)")
    ratio, ceiling = m.get("mfu_vs_ceiling"), m.get("matmul_ceiling_tflops")
    if isinstance(ratio, (int, float)) and isinstance(ceiling, (int, float)) and ceiling > 0:
        m["mfu_vs_ceiling"], m["mfu_vs_ceiling_reason"] = vs_ceiling(ratio * ceiling * 1e12, ceiling * 1e12)
    else:
        m.setdefault("mfu_vs_ceiling_reason", None if ratio is not None else "no matmul ceiling measured")
    return rec


def upgrade_v1_env(rec: dict) -> dict:
    """A version-1 record's env as version 2 states it: threads_per_rank and threads_source. Version 1
    recorded each rank's torch threads in env.devices[].cpu_threads (when it did), under the old
    launcher rule (cores ÷ that run's own ranks); that count is kept, or null with the reason."""
    env = rec.get("env")
    if not isinstance(env, dict) or "threads_per_rank" in env:
        return rec
    counts = {d.get("cpu_threads") for d in env.get("devices") or [] if isinstance(d, dict)}
    (count,) = counts if len(counts) == 1 else (None,)
    if isinstance(count, int) and not isinstance(count, bool):
        env["threads_per_rank"] = count
        env["threads_source"] = "env.devices[].cpu_threads (version 1: cores ÷ this run's own ranks)"
    else:
        env["threads_per_rank"] = None
        env["threads_source"] = "not recorded (version 1 record)"
    return rec


def upgrade_v1_energy_metrics(rec: dict) -> dict:
    """A copy of a version-1 record whose metrics.energy gains gpu_j_per_token (+ reason, source) from its own
    energy.gpu_j over the measured tokens (tokens_per_step x measured steps, as the worker counts)."""
    from benchsuite.metrics.energy import gpu_j_per_token

    derived = (rec.get("metrics") or {}).get("energy")
    if not isinstance(derived, dict) or "gpu_j_per_token" in derived:
        return rec
    energy = rec.get("energy") or {}
    per_step = rec["metrics"].get("tokens_per_step")
    tokens = per_step * len(rec.get("steps") or []) if per_step else None
    value, reason = gpu_j_per_token(energy, tokens)
    derived = {**derived, "gpu_j_per_token": value, "gpu_j_per_token_reason": reason,
               "gpu_energy_source": (energy.get("sources") or {}).get("gpu", "unavailable")}
    return {**rec, "metrics": {**rec["metrics"], "energy": derived}}


def upgrade_v1_precision_policy(record: dict) -> dict:
    """metrics.precision_policy for a version-1 record, from what that version ran: bf16 ZeRO-2/3 on a
    GPU gathered bf16 parameters (its implementation name says MixedPrecisionPolicy), whose bf16
    embedding output kept the residual stream in bf16; every other run is today's policy."""
    from benchsuite.parallel.zero import precision_policy

    metrics = record.get("metrics")
    if not metrics or "precision_policy" in metrics or "precision" not in metrics:
        return record
    policy = msgspec.to_builtins(precision_policy(metrics["precision"]))
    if "MixedPrecisionPolicy" in str((metrics.get("implementation") or {}).get("data", "")):
        policy.update(forward_params="bf16", residual="bf16")
    return {**record, "metrics": {**metrics, "precision_policy": policy}}


def update_to_2(rec: dict) -> dict:
    """Version 1 -> 2, in order: model FLOPs without recompute and hardware FLOPs / HFU (the ceiling
    ratio is rescaled first, then judged), the ceiling's method, threads per rank, GPU-only J/token,
    the typed precision policy."""
    return _apply(rec, 2, [Upgrade(upgrade_v1_flops, "metrics (flops, moe, quality, energy), config or env.devices"),
                           Upgrade(upgrade_v1_ceiling, "metrics.mfu_vs_ceiling"),
                           Upgrade(upgrade_v1_env, "env.devices"),
                           Upgrade(upgrade_v1_energy_metrics, "metrics.energy"),
                           Upgrade(upgrade_v1_precision_policy, "metrics.precision_policy")])


# ----------------------------------------------------------------------------- version 2 -> 3


NEW_MOE_CONFIG_KEYS = ("top_k", "min_capacity", "shared_experts", "score")  # MoEConfig keys schema 2 did not have


def upgrade_v2_moe(rec: dict) -> dict:
    """A schema-2 record's MoE parts in schema 3's shape; returns an upgraded copy.

    config.moe gains the new keys at their defaults (what every schema-2 run ran: softmax, no
    shared experts, no min_capacity, the router's own k), so its identity matches a new run's.
    metrics.moe gains the per-expert figures: tokens_per_expert is the stored expert_load where that
    is what the experts computed (expert choice, or no token dropped), else null; the imbalance over
    steps was not recorded (null). upgraded_from says so.
    """
    from benchsuite.models.moe import load_figures

    cfg_moe = (rec.get("config") or {}).get("moe")
    stats = (rec.get("metrics") or {}).get("moe")
    if not isinstance(cfg_moe, dict) and not isinstance(stats, dict):
        return rec
    rec = copy.deepcopy(rec)
    cfg_moe, stats = (rec.get("config") or {}).get("moe"), (rec.get("metrics") or {}).get("moe")
    if isinstance(cfg_moe, dict):
        cfg_moe.update({k: v for k, v in defaults(MoEConfig).items() if k in NEW_MOE_CONFIG_KEYS and k not in cfg_moe})
    if isinstance(stats, dict):
        load = stats.get("expert_load")
        exact = experts_choose((cfg_moe or {}).get("router")) or stats.get("dropped_frac") == 0
        stats.update(load_figures(load if exact and isinstance(load, list) else None, None))
        stats["upgraded_from"] = ("schema 2: tokens_per_expert " + ("from expert_load (no token dropped)" if exact
                                  else "unknown (expert_load counts dropped tokens)")
                                  + "; imbalance over steps not recorded")
    return rec


def upgrade_v2_comm(rec: dict) -> dict:
    """A copy of a version-2 record whose metrics.comm gains all_to_all_bytes_by_step: null, with the
    reason that version 2 did not measure it (its expert parallelism had fixed splits only)."""
    comm = (rec.get("metrics") or {}).get("comm")
    if not isinstance(comm, dict) or "all_to_all_bytes_by_step" in comm:
        return rec
    comm = {**comm, "all_to_all_bytes_by_step": None,
            "all_to_all_bytes_by_step_reason": "not measured before schema version 3 (fixed splits only)"}
    return {**rec, "metrics": {**rec["metrics"], "comm": comm}}


def upgrade_v2_repeat(rec: dict) -> dict:
    """A version-2 record as version 3 states it: a record written before `run --repeat` was the one
    measurement of its run, repeat 0 (its file name, the bare run key, is repeat 0's)."""
    rec.setdefault("repeat", 0)
    return rec


def update_to_3(rec: dict) -> dict:
    """Version 2 -> 3: the MoE keys and per-expert figures of dropless top-k routing, the dropless
    all-to-all's bytes per step, the repeat index of `run --repeat`."""
    return _apply(rec, 3, [Upgrade(upgrade_v2_moe, "metrics.moe"), Upgrade(upgrade_v2_comm, "metrics.comm"),
                           Upgrade(upgrade_v2_repeat, "repeat")])


# ----------------------------------------------------------------------------- version 3 -> 4


LEGACY_METRICS = ("j_per_token", "j_per_pflop", "avg_w_per_device", "gco2e_per_mtok")  # version 1's copies


def upgrade_v3_legacy_keys(rec: dict) -> dict:
    """Version 4 closes the schema (record/types.py): the copies of metrics.energy's figures that version 1
    also kept at metrics' top level (and under metrics.derived) go, metrics.energy keeps them, and version
    1's executed_per_token, replaced by hardware_per_token in version 2, goes."""
    m = rec.get("metrics")
    if isinstance(m, dict):
        derived = m.pop("derived", None)
        if isinstance(derived, dict) and not isinstance(m.get("energy"), dict):
            m["energy"] = derived
        for key in LEGACY_METRICS:
            m.pop(key, None)
        if isinstance(m.get("flops"), dict):
            m["flops"].pop("executed_per_token", None)
    return rec


def upgrade_v3_started_at(rec: dict) -> dict:
    """started_at as version 4 types it: RFC 3339 with an offset. Records stamp UTC (record/codec.utc_now);
    a time without an offset is taken as UTC, a space between date and time as the T."""
    value = rec.get("started_at")
    if isinstance(value, str):
        t = dt.datetime.fromisoformat(value)  # ValueError: not a time, named as started_at
        t = t if t.tzinfo else t.replace(tzinfo=dt.timezone.utc)
        rec["started_at"] = t.astimezone(dt.timezone.utc).isoformat()
    return rec


def upgrade_v3_flags(rec: dict) -> dict:
    """flags as version 4 types them: version 3 read any list and kept the well-formed flags (the sanity
    guard derives them again on load); the others go."""
    flags = rec.get("flags")
    if "flags" in rec and not isinstance(flags, list):
        rec.pop("flags")
    elif isinstance(flags, list):
        rec["flags"] = [f for f in flags if isinstance(f, dict) and isinstance(f.get("field"), str)
                        and set(f) <= {"field", "value", "reason"} and isinstance(f.get("reason", ""), str)
                        and isinstance(f.get("value"), (int, float, str, bool, type(None)))]
    return rec


def upgrade_v3_step_time_cv(rec: dict) -> dict:
    """metrics.step_time_s.cv, new in version 4, from the record's own steps[].time_s (the measured step
    times step_time_s summarises): the same figure the worker computes."""
    summary, steps = (rec.get("metrics") or {}).get("step_time_s"), rec.get("steps")
    if isinstance(summary, dict) and "cv" not in summary and isinstance(steps, list):  # (else the types say why)
        times = [s["time_s"] for s in steps if isinstance(s, dict) and type(s.get("time_s")) in (int, float)]
        summary["cv"] = coefficient_of_variation(times)
    return rec


def update_to_4(rec: dict) -> dict:
    """Version 3 -> 4: the typed, closed record (no legacy copies, started_at with its offset, well-formed
    flags), and the step times' coefficient of variation."""
    return _apply(rec, 4, [Upgrade(upgrade_v3_legacy_keys, "metrics"), Upgrade(upgrade_v3_started_at, "started_at"),
                           Upgrade(upgrade_v3_flags, "flags"), Upgrade(upgrade_v3_step_time_cv, "steps")])


# ----------------------------------------------------------------------------- version 4 -> 5


def upgrade_later_keys(rec: dict) -> dict:
    """Every config section gains the keys added since version 4 (its LATER) at their defaults: what
    every older run ran (the GPT-2-style decoder, the learned loss-balanced router, no market-based or
    embodied carbon), so an older run's identity matches a new run's."""
    config = rec.get("config") or {}
    for sec, section in SECTIONS.items():
        if isinstance(config.get(sec), dict):
            added = {k: v for k, v in defaults(section).items() if k in section.LATER and k not in config[sec]}
            config[sec].update(added)
    return rec


def update_to_5(rec: dict) -> dict:
    """Version 4 -> 5: the model's architecture keys (norm, positions, grouped-query attention, presets)
    and the router's balancing and forced routing."""
    return _apply(rec, 5, [Upgrade(upgrade_later_keys, "config.model / config.moe")])


# ----------------------------------------------------------------------------- version 5 -> 6


def _well_formed(step: Callable[[dict], object], section: object) -> bool:
    """Whether `step` ran on `section` (changing it in place): False for a section of the wrong shape or
    types, which the upgrade leaves as it is for the decoder to name the field (a record/types error, not
    an upgrade's)."""
    if not isinstance(section, dict):
        return False
    trial = copy.deepcopy(section)
    try:
        step(trial)
    except (TypeError, ValueError, KeyError, AttributeError, ArithmeticError):
        return False
    section.clear()
    section.update(trial)
    return True


def upgrade_v5_energy_bounds(rec: dict) -> dict:
    """Every energy figure gains its bound (energy/bounds.py), computed from what the record holds: the
    figure, its source and window, the summed windows and, where recorded, sampled power. Counter edges
    were not aligned to an update before version 6, so the bound counts a whole update period at each."""
    from benchsuite.energy.bounds import add_bounds, scaled, to_target_bound

    energy = rec.get("energy")
    if not _well_formed(add_bounds, energy):
        return rec
    per_work = (rec.get("metrics") or {}).get("energy")
    if isinstance(per_work, dict):
        per_work["j_per_token_bound"] = scaled(energy["bounds"]["total"], energy.get("total_j"),
                                               per_work.get("j_per_token"))
        per_work["gpu_j_per_token_bound"] = scaled(energy["bounds"]["gpu"], energy.get("gpu_j"),
                                                   per_work.get("gpu_j_per_token"))
    quality = (rec.get("metrics") or {}).get("quality")
    if isinstance(quality, dict) and num(quality.get("energy_j")) is not None:
        quality["energy_bound"] = to_target_bound(energy, quality["energy_j"])
    return rec


def upgrade_v5_carbon_parts(rec: dict) -> dict:
    """The carbon section gains the CO2e's bound and, beside it, the market-based, embodied and water parts
    as a new run would state them from the same energy and the (upgraded) config's [carbon] keys."""
    from benchsuite.energy import footprint
    from benchsuite.energy.bounds import scaled
    from benchsuite.energy.carbon import usage_of

    carbon, energy, config = rec.get("carbon"), rec.get("energy"), rec.get("config") or {}
    if not isinstance(energy, dict):
        return rec

    def fill(section: dict) -> None:
        cfg = CarbonConfig(**(config.get("carbon") or {}))
        section["co2e_g_bound"] = scaled((energy.get("bounds") or {}).get("total"), energy.get("total_j"),
                                         section.get("co2e_g"))
        section.update(footprint.parts(usage_of(energy, float(section.get("pue") or 1.0)), cfg))

    _well_formed(fill, carbon)  # a malformed section is left for the decoder to name
    return rec


def update_to_6(rec: dict) -> dict:
    """Version 5 -> 6: a bound on every energy figure, and the carbon parts beside the location-based
    CO2e (market-based, embodied, water) with their [carbon] keys."""
    return _apply(rec, 6, [Upgrade(upgrade_later_keys, "config.carbon"), Upgrade(upgrade_v5_energy_bounds, "energy"),
                           Upgrade(upgrade_v5_carbon_parts, "carbon")])


# ----------------------------------------------------------------------------- version 6 -> 7


def upgrade_v6_config_nulls(rec: dict) -> dict:
    """A config section's null keys dropped, so they read as the key's default: before version 7 the record's
    sections were their own types, every key nullable; since then they are the suite's types (record/sections.py),
    whose keys hold what the run ran. A null a run wrote is a key its config left at a null default."""
    config = rec.get("config") or {}
    for sec in SECTIONS:
        if isinstance(config.get(sec), dict):
            config[sec] = {k: v for k, v in config[sec].items() if v is not None}
    return rec


def upgrade_v6_per_device_rate(rec: dict) -> dict:
    """metrics.tokens_per_s_per_device from the record's own tokens/s and world size, as a new run states it."""
    metrics, world = rec.get("metrics"), (rec.get("config") or {}).get("world_size")
    if isinstance(metrics, dict) and num(metrics.get("tokens_per_s")) is not None and num(world):
        metrics["tokens_per_s_per_device"] = metrics["tokens_per_s"] / world
    return rec


def update_to_7(rec: dict) -> dict:
    """Version 6 -> 7: the config's sections are the suite's types (defaults, ranges and choices checked), and
    the throughput per device."""
    return _apply(rec, 7, [Upgrade(upgrade_v6_config_nulls, "config"),
                           Upgrade(upgrade_v6_per_device_rate, "metrics.tokens_per_s")])


def update_to_8(rec: dict) -> dict:
    """Version 7 -> 8: the parallel section gains context, first_stage_layers and last_stage_layers (context
    parallelism and uneven pipeline stages). An earlier run had neither: their defaults (1, null, null), which the
    types fill in, state what it ran; nothing stored changes but the version."""
    return _apply(rec, 8, [])


def update_to_9(rec: dict) -> dict:
    """Version 8 -> 9: the parallel section gains expert_tensor (expert tensor parallelism). An earlier run split
    no expert's FFN: its default (1), which the types fill in, states what it ran; nothing stored changes but
    the version."""
    return _apply(rec, 9, [])


# ----------------------------------------------------------------------------- the chain


def _apply(rec: dict, version: int, upgrades: list[Upgrade]) -> dict:
    for u in upgrades:
        try:
            rec = u.step(rec)
        except RecordError:
            raise
        except Exception as e:  # a damaged field of an older record: named, never a traceback
            raise RecordError(f"{u.field}: cannot be upgraded to schema version {version} "
                              f"({type(e).__name__}: {str(e)[:200]})") from None
    rec["schema_version"] = version
    return rec


UPDATES: dict[int, Callable[[dict], dict]] = {2: update_to_2, 3: update_to_3, 4: update_to_4, 5: update_to_5,
                                               6: update_to_6, 7: update_to_7, 8: update_to_8,
                                               9: update_to_9}  # version reached


def migrate(doc: object) -> dict:
    """A parsed document of any version this benchsuite knows, upgraded to SCHEMA_VERSION (not yet
    checked by the types: record/codec.decode does that). RecordError for a newer version, a document
    that is no record, or a damaged field an upgrade step reads."""
    version = check_version(doc)
    if version < SCHEMA_VERSION and not isinstance(doc.get("config"), dict):
        raise RecordError(f"config: expected an object, got {type(doc.get('config')).__name__}")
    for v in range(version + 1, SCHEMA_VERSION + 1):
        doc = UPDATES[v](doc)
    return doc
