"""One measured training step of the smoke model (pytest-benchmark; `make bench`)."""

import torch

from benchsuite.config import load_suite
from benchsuite.data import make_source
from benchsuite.models.transformer import build_model
from benchsuite.parallel import Parallelized
from benchsuite.parallel.zero import make_adamw
from benchsuite.worker import train_step


def test_smoke_training_step(benchmark):
    run = load_suite("workloads/smoke.toml").runs[0]
    model = build_model(run.model, seed=0)
    par = Parallelized(model, make_adamw(model.parameters(), run.train))
    source = make_source("synthetic", run.model.vocab, run.model.seq_len, seed=0)
    batch = [source.batch(0, 0, 1, run.train.micro_batch)]
    result = benchmark(train_step, par, batch, "fp32", torch.device("cpu"))
    assert torch.isfinite(result.loss)
