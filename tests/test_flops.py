import pytest
import torch

from benchsuite.config import ModelConfig, parse_suite
from benchsuite.metrics import flops as fl
from benchsuite.models.transformer import build_model


def _run(recompute="none", **model):
    return parse_suite({"workload": [{"name": "a", "model": model, "train": {"recompute": recompute}}]}).runs[0]


@pytest.mark.parametrize("l, h, s, v", [(2, 64, 32, 256), (12, 2048, 2048, 32768), (24, 1024, 1024, 50304)])
def test_analytic_equals_narayanan_formula(l, h, s, v):
    """72·l·h²(1 + s/6h + V/12lh) per token without recompute, 96·l·h²(1 + s/6h + V/16lh) with it."""
    heads = h // 64 if h >= 64 else 1
    plain = fl.flops_per_token(_run(layers=l, hidden=h, heads=heads, seq_len=s, vocab=v))
    assert plain["model_per_token"] == pytest.approx(72 * l * h * h * (1 + s / (6 * h) + v / (12 * l * h)), rel=1e-12)
    full = fl.flops_per_token(_run("full", layers=l, hidden=h, heads=heads, seq_len=s, vocab=v))
    assert full["model_per_token"] == pytest.approx(96 * l * h * h * (1 + s / (6 * h) + v / (16 * l * h)), rel=1e-12)
    assert plain["executed_per_token"] == plain["model_per_token"]  # dense: nothing padded


def test_swiglu_and_custom_ffn_by_hand():
    l, h, f, s, v = 3, 96, 256, 40, 300
    got = fl.flops_per_token(_run(layers=l, hidden=h, heads=4, ffn_hidden=f, seq_len=s, vocab=v, activation="swiglu"))
    assert got["model_per_token"] == 6 * (l * (4 * h * h + 3 * h * f) + v * h) + 12 * l * s * h


def test_param_count_matches_the_model():
    cfg = ModelConfig(layers=3, hidden=48, heads=4, vocab=100, seq_len=20, activation="swiglu")
    model = build_model(cfg)
    assert fl.param_counts(cfg).total == sum(p.numel() for p in model.parameters())


def test_analytic_within_5_percent_of_flop_counter_on_a_real_step():
    from benchsuite.worker import train_step
    from benchsuite.parallel import Parallelized

    run = _run(layers=2, hidden=128, heads=4, seq_len=64, vocab=512)
    model = build_model(run.model)
    par = Parallelized(model, torch.optim.AdamW(model.parameters()))
    x = torch.randint(0, 512, (4, 64))
    with fl.flop_counter() as counter:
        train_step(par, [(x, x)], "fp32", torch.device("cpu"))
    counted = counter.get_total_flops() / x.numel()
    analytic = fl.flops_per_token(run)["model_per_token"]
    assert counted == pytest.approx(analytic, rel=0.05)


def test_peak_table_and_mfu():
    peak, source = fl.peak_flops("NVIDIA H200", "bf16")
    assert peak == 989.4e12 and "H200" in source
    assert fl.peak_flops("NVIDIA H100 PCIe", "bf16")[0] == 756e12
    with pytest.warns(UserWarning, match="no peak"):
        assert fl.peak_flops("Some CPU", "fp32") == (None, "unknown device")
    assert fl.peak_flops("Some CPU", "fp32", override_tflops=2.0) == (2e12, "given")
    assert fl.mfu(494.7e12, peak) == pytest.approx(0.5)
    assert fl.mfu(1e12, None) is None
