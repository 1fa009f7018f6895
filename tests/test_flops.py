import json
from pathlib import Path

import pytest
import torch

from benchsuite.results import migrate
from benchsuite.config import ModelConfig, parse_suite
from benchsuite.data import BYTE_VOCAB
from benchsuite.metrics import flops as fl
from benchsuite.models.transformer import build_model
from helpers import per_token, run_cli, runs_rows


def _run(recompute="none", moe=None, micro_batch=2, **model):
    workload = {"name": "a", "model": model, "train": {"recompute": recompute, "micro_batch": micro_batch}}
    if moe:
        workload.update(kind="moe", moe=moe)
    return parse_suite({"workload": [workload]}).runs[0]


@pytest.mark.parametrize("l, h, s, v", [(2, 64, 32, 256), (12, 2048, 2048, 32768), (24, 1024, 1024, 50304)])
def test_model_flops_are_narayanans_72_form_with_or_without_recompute(l, h, s, v):
    """Model FLOPs 72·l·h²(1 + s/6h + V/12lh) per token whatever train.recompute says (MFU's convention);
    hardware FLOPs add the fused attention backward's Q·Kᵀ (2·l·s·h) and, with full recompute,
    Narayanan's 96 form less each block's FFN down-projection (2·l·h·4h), which is never re-run."""
    heads = h // 64 if h >= 64 else 1
    plain = per_token(_run(layers=l, hidden=h, heads=heads, seq_len=s, vocab=v))
    full = per_token(_run("full", layers=l, hidden=h, heads=heads, seq_len=s, vocab=v))
    seventy_two = 72 * l * h * h * (1 + s / (6 * h) + v / (12 * l * h))
    assert plain.model == pytest.approx(seventy_two, rel=1e-12)
    assert full.model == plain.model
    assert plain.hardware == pytest.approx(seventy_two + 2 * l * s * h, rel=1e-12)
    ninety_six = 96 * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))
    assert full.hardware == pytest.approx(ninety_six - 8 * l * h * h + 2 * l * s * h, rel=1e-12)


def test_swiglu_and_custom_ffn_by_hand():
    l, h, f, s, v = 3, 96, 256, 40, 300
    run = _run(layers=l, hidden=h, heads=4, ffn_hidden=f, seq_len=s, vocab=v, activation="swiglu")
    assert per_token(run).model == 6 * (l * (4 * h * h + 3 * h * f) + v * h) + 12 * l * s * h
    full = per_token(_run("full", layers=l, hidden=h, heads=4, ffn_hidden=f, seq_len=s, vocab=v,
                                   activation="swiglu"))
    # the recompute re-runs attention and the gate and up projections, not the down-projection
    assert full.hardware == (6 * (l * (4 * h * h + 3 * h * f) + v * h) + 14 * l * s * h
                             + 2 * l * (4 * h * h + 2 * h * f) + 4 * l * s * h)


def test_param_count_matches_the_model():
    cfg = ModelConfig(layers=3, hidden=48, heads=4, vocab=100, seq_len=20, activation="swiglu")
    model = build_model(cfg)
    assert fl.param_counts(cfg).total == sum(p.numel() for p in model.parameters())


def test_expert_choice_model_flops_use_the_slots_that_exist_not_capacity_factor():
    """3 experts, cf 1, 2 x 32 = 64 tokens per call: each expert takes floor(64/3) = 21, so a token
    passes through 63/64 experts on average, not cf = 1."""
    h, f, s, v = 64, 256, 32, 256
    run = _run(moe={"experts": 3, "router": "expert_choice", "capacity_factor": 1.0, "every": 1},
               layers=1, hidden=h, heads=4, seq_len=s, vocab=v)
    expert, router = 2 * h * f, h * 3
    assert per_token(run).model == 6 * (4 * h * h + 63 / 64 * expert + router + v * h) + 12 * s * h


def test_top_k_model_flops_count_k_routed_and_the_shared_experts_and_dropless_pads_nothing():
    """16 fine-grained experts of width 32, top-3, 2 shared: a token passes through 3 + 2 experts and the
    router; dropless computes no padding, so hardware FLOPs add only the attention backward's Q·Kᵀ."""
    h, f, s, v = 64, 32, 32, 256
    moe = {"experts": 16, "router": "token_choice", "top_k": 3, "shared_experts": 2, "expert_hidden": f,
           "capacity_factor": 0.0, "every": 1}
    run = _run(moe=moe, layers=1, hidden=h, heads=4, seq_len=s, vocab=v)
    expert, router = 2 * h * f, h * 16
    flops = per_token(run)
    assert flops.model == 6 * (4 * h * h + (3 + 2) * expert + router + v * h) + 12 * s * h
    assert flops.hardware == flops.model + 2 * s * h
    assert fl.param_counts(run.model, run.moe).total == sum(p.numel() for p in build_model(run.model, run.moe)
                                                            .parameters())
    capped = per_token(_run(moe=dict(moe, capacity_factor=1.0, min_capacity=40), layers=1, hidden=h,
                                     heads=4, seq_len=s, vocab=v))
    assert capped.model == flops.model  # model FLOPs never count padding
    # 64 tokens, C = max(ceil(3 * 64 / 16), 40) = 40 slots per expert: 16 * 40 / 64 = 10 slots per token
    assert capped.hardware == 6 * (4 * h * h + (10 + 2) * expert + router + v * h) + 14 * s * h


def _counted_per_token(run, expert_impl=None) -> float:
    """FlopCounterMode over one real training step of `run` (checkpointed blocks as the harness wraps them)."""
    from benchsuite.models.moe import MoELayer
    from benchsuite.parallel import Parallelized, apply_activation_checkpointing
    from benchsuite.worker import train_step

    model = build_model(run.model, run.moe)
    if expert_impl:
        for block in model.blocks:
            if isinstance(block.ffn, MoELayer):
                block.ffn = MoELayer(run.model, run.moe, expert_impl=expert_impl)
    if run.train.recompute == "full":
        apply_activation_checkpointing(model, preserve_rng_state=False)
    par = Parallelized(model, torch.optim.AdamW(model.parameters()))
    torch.manual_seed(0)
    x = torch.randint(0, run.model.vocab, (run.micro_batch_per_rank, run.model.seq_len))
    with fl.flop_counter() as counter:
        train_step(par, [(x, x)], "fp32", torch.device("cpu"))
    return counter.get_total_flops() / x.numel()


SMALL = dict(layers=2, hidden=64, heads=4, seq_len=32, vocab=256)
MOE = {"switch": {"experts": 4, "router": "switch", "capacity_factor": 1.5, "every": 2},
       "gshard": {"experts": 4, "router": "gshard", "capacity_factor": 1.0, "every": 1},
       "expert_choice": {"experts": 3, "router": "expert_choice", "capacity_factor": 1.0, "every": 2},
       "top3_capacity": {"experts": 4, "router": "token_choice", "top_k": 3, "capacity_factor": 1.0,
                         "min_capacity": 50, "every": 1},
       "dropless_top2": {"experts": 4, "router": "token_choice", "capacity_factor": 0.0, "every": 1},
       "dropless_fine_shared": {"experts": 8, "router": "token_choice", "top_k": 3, "expert_hidden": 32,
                                "shared_experts": 1, "capacity_factor": 0.0, "every": 2}}


@pytest.mark.parametrize("recompute", ["none", "full"])
@pytest.mark.parametrize("kind", ["dense", "swiglu", *MOE])
def test_hardware_flops_equal_what_a_real_step_executes(kind, recompute):
    """FlopCounterMode over a real (checkpointed) step counts the hardware figure: the early stop
    of the non-reentrant checkpoint skips each dense block's down-projection (a blanket 8x/16x
    overstates by 6 % here), and every padded expert slot is computed (padded_bmm)."""
    model = dict(SMALL, activation="swiglu") if kind == "swiglu" else SMALL
    run = _run(recompute, moe=MOE.get(kind), **model)
    assert _counted_per_token(run) == pytest.approx(per_token(run).hardware, rel=0.02)


def test_grouped_mm_runs_on_cpu_and_counts_only_the_filled_slots():
    """A switch router with capacity = every token (cf = E) leaves 3 of 4 slots empty; grouped_mm
    computes only the filled ones, and both the counted and the hardware figures say so."""
    moe = {"experts": 4, "router": "switch", "capacity_factor": 4.0, "every": 1}
    for recompute in ("none", "full"):
        run = _run(recompute, moe=moe, **SMALL)
        counted = _counted_per_token(run, expert_impl="grouped_mm")
        # capacity clamps to N and no token is dropped: N of the E·N slots are filled
        filled = per_token(run, fl.computed_slot_share("grouped_mm", padding_frac=0.75)).hardware
        padded = per_token(run).hardware
        assert counted == pytest.approx(filled, rel=0.02)
        assert padded > 1.5 * filled  # counting every slot would be far off
        assert _counted_per_token(run, expert_impl="padded_bmm") == pytest.approx(padded, rel=0.02)


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_dropless_grouped_mm_counts_what_loop_mm_counts(recompute):
    """The two sorted paths compute the same rows: one counted figure, the hardware one."""
    run = _run(recompute, moe=MOE["dropless_fine_shared"], **SMALL)
    hardware = per_token(run).hardware
    assert _counted_per_token(run, expert_impl="grouped_mm") == pytest.approx(hardware, rel=0.02)
    assert _counted_per_token(run, expert_impl="loop_mm") == pytest.approx(hardware, rel=0.02)


def test_grouped_mm_formula_counts_rows_up_to_the_last_offset():
    k, n = 16, 8
    a = torch.randn(16, k, requires_grad=True)
    b = torch.randn(4, k, n, requires_grad=True)
    offs = torch.tensor([2, 4, 6, 6], dtype=torch.int32)  # 6 of 16 rows filled
    with fl.flop_counter() as counter:
        out = torch._grouped_mm(a, b, offs=offs)
        out.backward(torch.ones_like(out))
    # forward, input gradient ([M, N] x [G, N, K]) and weight gradient ([K, M] x [M, N]): 2·6·K·N each
    assert counter.get_total_flops() == 3 * 2 * 6 * k * n
    assert fl.grouped_mm_flops(a.detach().t(), out.detach(), offs, out_val=torch.empty(4, k, n)) == 2 * k * 6 * n


# ----------------------------------------------------------------------------- peak table

PEAK_CASES = [
    ("NVIDIA A100-SXM4-80GB", "bf16", 312.0), ("NVIDIA A100-SXM4-40GB", "fp32", 19.5),
    ("NVIDIA A100-PCIE-40GB", "bf16", 312.0), ("NVIDIA A100 80GB PCIe", "bf16", 312.0),
    ("NVIDIA A10", "bf16", 125.0), ("NVIDIA A10", "fp32", 31.2),
    ("NVIDIA L4", "bf16", 121.0), ("NVIDIA L4", "fp32", 30.3),
    ("NVIDIA L40", "bf16", 181.05), ("NVIDIA L40", "fp32", 90.5),  # not the L4's 121
    ("NVIDIA L40S", "bf16", 362.05), ("NVIDIA L40S", "fp32", 91.6),
    ("NVIDIA H100 80GB HBM3", "bf16", 989.5), ("NVIDIA H100 80GB HBM3", "fp32", 67.0),
    ("NVIDIA H100 PCIe", "bf16", 756.5), ("NVIDIA H100 PCIe", "fp32", 51.0),
    ("NVIDIA H100 NVL", "bf16", 835.5), ("NVIDIA H100 NVL", "fp32", 60.0),  # not the SXM's 989.5
    ("NVIDIA H200", "bf16", 989.5), ("NVIDIA H200 NVL", "bf16", 835.5),
    ("NVIDIA GH200 480GB", "bf16", 989.5), ("NVIDIA GH200 144G HBM3e", "fp32", 67.0),
    ("NVIDIA B200", "bf16", 2250.0), ("NVIDIA B200", "fp32", 75.0),
    ("AMD Instinct MI250X", "bf16", 383.0), ("AMD Instinct MI250X", "fp32", 95.7),
    ("AMD Instinct MI300X", "bf16", 1307.4), ("AMD Instinct MI300X", "fp32", 163.4),
    ("nvidia  h100 nvl ", "bf16", 835.5),  # case and whitespace do not matter
]


@pytest.mark.parametrize("name, precision, tflops", PEAK_CASES)
def test_peak_table_matches_the_exact_device(name, precision, tflops):
    peak, source = fl.peak_flops(name, precision)
    assert peak == tflops * 1e12
    assert source.startswith("datasheet: ") and "datasheet" in fl.PEAK_BY_NAME[fl.normalise_device_name(name)].source


def test_every_peak_entry_is_reachable_and_gh200_is_its_own_part():
    """A name listed twice would leave one entry unreachable (a dict keeps the last); a match by
    substring once gave the GH200 the H200's entry ("H200" in "NVIDIA GH200 480GB")."""
    names = [fl.normalise_device_name(n) for p in fl.PEAKS for n in p.names]
    assert len(names) == len(set(names))
    assert {p.part for p in fl.PEAK_BY_NAME.values()} == {p.part for p in fl.PEAKS}
    for name in ("NVIDIA GH200 480GB", "NVIDIA GH200 144G HBM3e"):
        assert fl.lookup_peak(name, "bf16")[1].startswith("datasheet: GH200 bf16 dense (NVIDIA GH200 Grace Hopper")


@pytest.mark.parametrize("name", ["NVIDIA H100", "NVIDIA L40G", "AMD Instinct MI250X/MI250", "Some CPU", "NVIDIA A10G"])
def test_unknown_or_unpublished_devices_get_no_peak_and_say_why(name):
    with pytest.warns(UserWarning, match="MFU and HFU are null"):
        peak, source = fl.peak_flops(name, "bf16")
    assert peak is None and "--peak-tflops" in source
    assert ("no vendor datasheet" if name == "NVIDIA A10G" else "unknown device") in source


def test_every_table_entry_cites_its_source_and_names_are_unique():
    names = [fl.normalise_device_name(n) for p in fl.PEAKS for n in p.names]
    assert len(names) == len(set(names))
    assert all("datasheet" in p.source for p in fl.PEAKS)


def test_override_and_mfu():
    assert fl.peak_flops("Some CPU", "fp32", override_tflops=2.0) == (2e12, "given (--peak-tflops)")
    assert fl.mfu(494.75e12, 989.5e12) == pytest.approx(0.5)
    assert fl.mfu(1e12, None) is None


# ----------------------------------------------------------------------------- records and CLI

def _record(monkeypatch, recompute, moe=None, eval_every=0, data="synthetic", **model):
    from benchsuite import dist as bdist
    from benchsuite import worker
    from benchsuite.assembly import Stamp, harness_record
    from benchsuite.record import to_dict

    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")
    workload = {"name": "w", "kind": "moe" if moe else "dense"} | ({"moe": moe} if moe else {})
    doc = {"suite": {"name": "tf"},
           "defaults": {"model": dict(SMALL, **model), "train": {"micro_batch": 2, "steps": 4, "warmup_steps": 2,
                                                        "precision": "fp32", "recompute": recompute,
                                                        "eval_every": eval_every, "data": data}},
           "workload": [workload]}
    run = parse_suite(doc).runs[0]
    ctx = bdist.init_distributed(run)
    mine, facts = worker.run_rank(run, ctx, 1.0)  # --peak-tflops 1: MFU and HFU are defined on a CPU
    return run, to_dict(harness_record(run, facts, [mine], Stamp("k", 0, "2026-01-01T00:00:00+00:00", 1.0)))


def test_record_of_a_recompute_run_carries_model_and_hardware_figures(monkeypatch):
    run, rec = _record(monkeypatch, "full", eval_every=2)
    m = rec["metrics"]
    f = per_token(run)
    assert m["flops"]["model_per_token"] == per_token(_run(micro_batch=2, **SMALL)).model == f.model
    assert m["flops"]["hardware_per_token"] == f.hardware and "executed_per_token" not in m["flops"]
    assert m["flops"]["counted_per_token"] == pytest.approx(f.hardware, rel=0.02)
    assert "down-projection" in m["flops"]["hardware_source"]
    assert m["tflops_per_device"] == pytest.approx(f.model * m["tokens_per_s"] / 1e12, rel=1e-9)
    assert m["hardware_tflops_per_device"] == pytest.approx(f.hardware * m["tokens_per_s"] / 1e12, rel=1e-9)
    assert m["mfu"] == pytest.approx(m["tflops_per_device"])  # peak 1 TFLOP/s
    assert m["hfu"] == pytest.approx(m["hardware_tflops_per_device"])
    assert m["hfu"] / m["mfu"] == pytest.approx(f.hardware / f.model) and m["hfu"] > 1.2 * m["mfu"]
    q = m["quality"]
    assert q["curve"][-1]["model_flops"] == pytest.approx(q["curve"][-1]["tokens"] * f.model)
    if m["energy"]["j_per_pflop"] is not None:
        tokens = m["tokens_per_step"] * len(rec["steps"])
        assert m["energy"]["j_per_pflop"] == pytest.approx(rec["energy"]["total_j"] / (tokens * f.model / 1e15))


def test_record_of_a_grouped_mm_run_counts_the_filled_slots(monkeypatch):
    from benchsuite.models import moe as moe_mod

    monkeypatch.setattr(moe_mod, "select_expert_impl", lambda device, dtype: "grouped_mm")
    run, rec = _record(monkeypatch, "none", moe={"experts": 4, "router": "switch", "capacity_factor": 4.0})
    m = rec["metrics"]
    assert m["moe"]["expert_impl"] == "grouped_mm" and m["moe"]["padding_frac"] == pytest.approx(0.75)
    share = fl.computed_slot_share("grouped_mm", m["moe"]["padding_frac"])
    assert m["flops"]["hardware_per_token"] == pytest.approx(per_token(run, share).hardware)
    assert m["flops"]["counted_per_token"] == pytest.approx(m["flops"]["hardware_per_token"], rel=0.02)
    assert "filled expert slots" in m["flops"]["hardware_source"]


def test_dropless_run_on_builtin_text_drops_nothing_and_counts_model_flops(monkeypatch):
    """The harness end to end (one process) on the built-in text: top-2 dropless over 4 experts, one
    shared. Nothing is dropped or padded, every token reaches 2 experts in every layer, and the counted
    FLOPs of a real step equal model FLOPs within 2 % (hardware adds only the attention backward's Q·Kᵀ)."""
    moe = {"experts": 4, "router": "token_choice", "capacity_factor": 0.0, "shared_experts": 1, "every": 1}
    run, rec = _record(monkeypatch, "none", moe=moe, data="builtin", vocab=BYTE_VOCAB)
    m, tokens = rec["metrics"], 2 * SMALL["seq_len"]
    assert m["moe"]["dropped_frac"] == 0 and m["moe"]["padding_frac"] == 0
    assert m["moe"]["expert_impl"] == "loop_mm" and "dropless" in m["flops"]["hardware_source"]
    assert [sum(layer) for layer in m["moe"]["tokens_per_expert"]] == [2 * tokens] * SMALL["layers"]
    assert m["moe"]["tokens_per_expert"] == m["moe"]["expert_load"]
    assert m["moe"]["tokens_per_expert_mean"] == 2 * tokens / 4
    assert m["moe"]["tokens_per_expert_max"] == max(max(layer) for layer in m["moe"]["tokens_per_expert"])
    assert len(m["moe"]["imbalance_by_step"]) == run.train.steps
    assert all(1 <= v <= 4 for v in m["moe"]["imbalance_by_step"])
    assert m["moe"]["imbalance_max"] == max(m["moe"]["imbalance_by_step"])
    f = m["flops"]
    assert f["hardware_per_token"] == f["model_per_token"] + 2 * SMALL["layers"] * SMALL["seq_len"] * SMALL["hidden"]
    assert f["counted_per_token"] == pytest.approx(f["model_per_token"], rel=0.02)
    assert f["counted_per_token"] == pytest.approx(f["hardware_per_token"], rel=0.005)


@pytest.mark.procs
def test_flops_command_prints_model_and_hardware_flops(tmp_path):
    suite = tmp_path / "s.toml"
    suite.write_text('[suite]\nname = "s"\n[defaults]\nmodel = { layers = 2, hidden = 64, heads = 4, seq_len = 32, '
                     'vocab = 256 }\ntrain = { micro_batch = 2, recompute = "full" }\n[[workload]]\nname = "d"\n')
    f = per_token(_run("full", **SMALL))
    doc = json.loads(run_cli("flops", str(suite), "--json").stdout)
    r = doc["runs"][0]
    assert r["model_flops_per_token"] == f.model and r["hardware_flops_per_token"] == f.hardware
    assert r["hardware_flops_per_token"] > r["model_flops_per_token"] and r["recompute"] == "full"
    text = run_cli("flops", str(suite))
    assert text.returncode == 0
    assert f"model {f.model:10.4g}" in text.stdout and f"hardware {f.hardware:10.4g}" in text.stdout


# ----------------------------------------------------------------------------- schema 1 records

def _v1_record(run, device="NVIDIA L40", peak_source="datasheet:L4:bf16"):
    """A schema-1 record as the old worker wrote it: model FLOPs with the blanket 8x/16x recompute factor."""
    cfg, h, l, s = run.model, run.model.hidden, run.model.layers, run.model.seq_len
    pc = fl.param_counts(cfg, run.moe, run.micro_batch_per_rank * s)
    active = pc.active_matmul
    if run.moe is not None:  # schema 1: expert choice at cf experts per token
        from benchsuite.models.moe import active_experts_per_token

        active += pc.moe_layers * pc.expert * (run.moe.capacity_factor
                                               - active_experts_per_token(run.moe, run.micro_batch_per_rank * s))
    mult, attn = (8, 16) if run.train.recompute == "full" else (6, 12)
    old_model = mult * active + 6 * pc.lm_head + attn * l * s * h
    tps = 1000.0
    return {"schema_version": 1, "status": "ok", "config": run.to_dict(),
            "env": {"devices": [{"name": device}]},
            "metrics": {"tokens_per_s": tps, "precision": "bf16", "peak_tflops": 121.0, "peak_source": peak_source,
                        "mfu": old_model * tps / 121e12, "tflops_per_device": old_model * tps / 1e12,
                        "mfu_vs_ceiling": 0.5,
                        "flops": {"model_per_token": old_model, "executed_per_token": old_model,
                                  "counted_per_token": 1.0, "counted_source": "FlopCounterMode"},
                        "energy": {"j_per_pflop": 10.0},
                        "quality": {"model_flops": 100.0, "curve": [{"model_flops": 0.0}, {"model_flops": 100.0}]}}}


def test_upgrade_v1_recomputes_flops_peak_and_utilisation_from_the_config():
    run = _run("full", **SMALL)
    old = _v1_record(run)
    new = migrate.upgrade_v1_flops(old)
    f, m = per_token(run), new["metrics"]
    scale = f.model / old["metrics"]["flops"]["model_per_token"]
    assert old["metrics"]["flops"]["model_per_token"] > f.model  # schema 1 counted the recompute; untouched input
    assert m["flops"]["model_per_token"] == f.model and m["flops"]["hardware_per_token"] == f.hardware
    assert "executed_per_token" not in m["flops"] and "corrected from the stored config" in m["flops"]["upgraded_from"]
    assert m["peak_tflops"] == 181.05 and "L40 bf16" in m["peak_source"]  # exact name, not the L4's figure
    assert m["mfu"] == pytest.approx(f.model * 1000 / 181.05e12)
    assert m["hfu"] == pytest.approx(f.hardware * 1000 / 181.05e12)
    assert m["mfu_vs_ceiling"] == pytest.approx(0.5 * scale) and m["energy"]["j_per_pflop"] == pytest.approx(10 / scale)
    assert m["quality"]["model_flops"] == pytest.approx(100 * scale)
    assert m["quality"]["curve"][1]["model_flops"] == pytest.approx(100 * scale)


def test_schema_1_model_flops_as_the_old_code_computed_them():
    """Figures printed by schema 1's flops_per_token for these two runs."""
    assert migrate._v1_model_per_token(_run("full", **SMALL)) == 950272.0
    ec = {"experts": 3, "router": "expert_choice", "capacity_factor": 1.0, "every": 1}
    assert migrate._v1_model_per_token(_run(moe=ec, layers=1, hidden=64, heads=4, seq_len=32, vocab=256)) == 418944.0


def test_upgrade_v1_corrects_stored_measurements_by_exact_ratios():
    """A record whose stored figures are its own (not the config's formula) keeps them where
    nothing changed, and expert choice moves by E·floor(cf·N/E)/N over cf."""
    synthetic = _v1_record(_run(**SMALL), device="NVIDIA H100 80GB HBM3")
    synthetic["metrics"]["flops"]["model_per_token"] = 1.6e9
    synthetic["metrics"]["tflops_per_device"] = 400.0
    m = migrate.upgrade_v1_flops(synthetic)["metrics"]
    assert m["flops"]["model_per_token"] == 1.6e9 and m["tflops_per_device"] == 400.0
    assert m["mfu"] == pytest.approx(400 / 989.5) and m["mfu_vs_ceiling"] == 0.5
    plain = per_token(_run(**SMALL))
    assert m["hfu"] / m["mfu"] == pytest.approx(plain.hardware / plain.model)
    ec = _run(moe={"experts": 3, "router": "expert_choice", "capacity_factor": 1.0, "every": 1}, **SMALL)
    m = migrate.upgrade_v1_flops(_v1_record(ec))["metrics"]
    assert m["flops"]["model_per_token"] == pytest.approx(per_token(ec).model)
    assert m["flops"]["model_per_token"] < _v1_record(ec)["metrics"]["flops"]["model_per_token"]


def test_upgrade_v1_keeps_a_given_peak_and_marks_a_config_that_no_longer_parses():
    run = _run("none", **SMALL)
    given = migrate.upgrade_v1_flops(_v1_record(run, device="Some CPU", peak_source="given"))
    assert given["metrics"]["peak_tflops"] == 121.0 and given["metrics"]["mfu"] is not None
    for recompute, kept in (("none", True), ("full", False)):
        old = _v1_record(_run(recompute, **SMALL))
        old["config"]["train"]["retired_key"] = 1
        m = migrate.upgrade_v1_flops(old)["metrics"]
        assert "no longer parses" in m["flops"]["upgraded_from"] and m["flops"]["hardware_per_token"] is None
        assert m["hfu"] is None
        if kept:
            assert m["flops"]["model_per_token"] == old["metrics"]["flops"]["model_per_token"] and m["mfu"] is not None
        else:
            assert m["flops"]["model_per_token"] is None and m["mfu"] is None and m["energy"]["j_per_pflop"] is None
    failed = {"schema_version": 1, "status": "failed", "metrics": None}
    assert migrate.upgrade_v1_flops(failed) == failed


def test_report_and_dashboard_show_hfu_beside_mfu(tmp_path):
    from rich.console import Console

    from benchsuite.results.model import results_of
    from benchsuite.results.report import report_rows, report_table
    from benchsuite.results.store import loaded
    from benchsuite.dashboard import build_site

    fixture = json.loads((Path(__file__).parent / "fixtures" / "results" / "make_dvs-dense-w1.json").read_text())
    rec = migrate.migrate(fixture)  # the current version: read as it is, not upgraded (and recomputed) again
    rec["metrics"].update(mfu=0.4123, hfu=0.5234)
    row = next(report_rows(results_of(loaded([rec]))))
    assert row["mfu"] == 0.4123 and row["metrics.hfu"] == 0.5234
    console = Console(width=300, record=True)
    console.print(report_table(results_of(loaded([rec]))))
    text = console.export_text()
    assert "HFU" in text and "41.2%" in text and "52.3%" in text
    res = build_site([rec], tmp_path, validate=True)
    index = (tmp_path / res.pages[0]).read_text()
    page = (tmp_path / res.pages[1]).read_text()
    assert "MFU (HFU)" in index and "41.2% (52.3%)" in json.dumps(runs_rows(tmp_path), ensure_ascii=False)
    assert "HFU (hardware FLOPs, recompute included)" in page and "52.3%" in page
    assert "hardware FLOPs / token" in page
