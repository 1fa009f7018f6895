"""`benchsuite predict`: each component against its formula, the system file's errors, calibration
from a record, and the verb's JSON."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil

import msgspec
import pytest

from benchsuite.cli import main
from benchsuite.config import CarbonConfig, ConfigError, ModelConfig, MoEConfig
from benchsuite.metrics.memory import activation_bytes
from benchsuite.predict import load_system, predict
from benchsuite.predict.system import parse_system
from benchsuite.layout import ParallelDims, Schedule
from benchsuite.predict.workload import Implementation, Recompute, Workload

H100 = "workloads/systems/h100-8x.toml"
MODEL = ModelConfig(layers=8, hidden=1024, heads=16, vocab=32000, seq_len=1024)


def workload(layout=ParallelDims(1), recompute=Recompute.NONE, moe=None, micro_batch=2, microbatches=1,
             impl=Implementation.MEGATRON, model=MODEL) -> Workload:
    return Workload(model=model, moe=moe, layout=layout, micro_batch=micro_batch, microbatches=microbatches,
                    recompute=recompute, compute_bytes=2, implementation=impl)


def run(w, system=None):
    return predict(w, system or load_system(H100), carbon=CarbonConfig(intensity_g_per_kwh=400, pue=1.2),
                   run_tokens=1e12)


def no_floor(system):
    """The system without its per-operator floor (tests of the device terms' formulas)."""
    return dataclasses.replace(system, node=msgspec.structs.replace(system.node, op_floor_us=0.0))


def test_single_device_is_compute_plus_optimizer():
    p = run(workload(microbatches=3), no_floor(load_system(H100)))
    busy = {c.name for c in p.components if c.seconds > 0}
    assert busy == {"compute.matmul", "compute.attention", "optimizer"}
    s = load_system(H100).device
    tokens = 2 * 1024 * 3
    from benchsuite.metrics.flops import flop_parts
    f = flop_parts(MODEL, None, micro_batch=2, recompute="none")
    assert p.seconds("compute.matmul") == pytest.approx(tokens * f.executed_matmul / (s.matmul_tflops * 1e12))
    assert p.seconds("compute.attention") == pytest.approx(tokens * f.attention / (s.attention_tflops * 1e12))


def test_tensor_parallel_bytes_are_megatrons_4l_plus_2_all_reduces_and_sp_gathers_again_off_the_path():
    t, b, s, h = 4, 2, 1024, 1024
    plain = run(workload(ParallelDims.from_degrees(tp=t)))
    sp = run(workload(ParallelDims.from_degrees(tp=t, sequence_parallel=True)))
    ring = 2 * (t - 1) / t * b * s * h * 2  # one bf16 all-reduce of b·s·h per rank, ring
    loss = 3 * 2 * (t - 1) / t * b * s * 4  # the vocab-parallel cross-entropy's three fp32 all-reduces of b·s
    assert plain.tp_bytes_per_microbatch == pytest.approx((4 * MODEL.layers + 2) * ring + loss)
    # SP: each all-reduce is a reduce-scatter + an all-gather (half the ring bytes each), and the 2L + 1
    # column-parallel inputs (QKV, MLP up, LM head) are gathered again in backward, beside the GEMM
    assert sp.tp_bytes_per_microbatch == pytest.approx(plain.tp_bytes_per_microbatch + (2 * MODEL.layers + 1) * ring / 2)
    assert "37 collectives" in plain.components[3].detail and "88 collectives" in sp.components[3].detail
    latency = 10e-6 * (88 - 17 - 37)  # twice the calls for the same exposed bytes; the 17 re-gathers overlap
    assert sp.seconds("tensor_parallel") - plain.seconds("tensor_parallel") == pytest.approx(latency)
    full = run(workload(ParallelDims.from_degrees(tp=t), recompute=Recompute.FULL))
    assert full.tp_bytes_per_microbatch == pytest.approx((6 * MODEL.layers + 2) * ring + loss)  # forward ones again


@pytest.mark.parametrize("schedule,v,bubble", [(Schedule.ONE_F_ONE_B, 1, 3 / 8), (Schedule.GPIPE, 1, 3 / 8),
                                               (Schedule.INTERLEAVED, 2, 3 / 16)])
def test_pipeline_bubble_by_schedule(schedule, v, bubble):
    p = run(workload(ParallelDims.from_degrees(pp=4, schedule=schedule, virtual_stages=v), microbatches=8))
    per_micro = sum(p.seconds(n) for n in ("compute.matmul", "compute.attention", "compute.recompute",
                                           "pipeline_stages", "tensor_parallel", "expert_parallel"))
    assert p.bubble_fraction == bubble
    assert p.seconds("pipeline_bubble") == pytest.approx(bubble * per_micro)


def test_memory_in_flight_microbatches_and_korthikanti_sp_selective():
    gpipe = run(workload(ParallelDims.from_degrees(pp=4, schedule=Schedule.GPIPE), microbatches=8)).memory
    one = run(workload(ParallelDims.from_degrees(pp=4), microbatches=8)).memory
    assert (gpipe.inflight_microbatches, one.inflight_microbatches) == (8, 4)
    assert gpipe.activation_bytes == pytest.approx(2 * one.activation_bytes)
    sp = run(workload(ParallelDims.from_degrees(tp=8, sequence_parallel=True), recompute=Recompute.SELECTIVE)).memory
    s, b, h, L, t = 1024, 2, 1024, 8, 8
    assert sp.activation_bytes == pytest.approx(L * 34 * s * b * h / t + 4 * s * b * h / t * (1 + 32000 / h))
    # selective + SP saves the attention core's 5·a·s/h and splits the rest over t (Korthikanti, table 2)
    none = activation_bytes(s, b, h, 16, L, 32000, tp=8)["per_layer_bytes"]
    assert none == pytest.approx(s * b * h * (10 + 24 / 8 + 5 * 16 * s / (h * 8)))


def test_data_parallel_overlap_hides_what_backward_covers():
    system = load_system(H100)
    w = workload(ParallelDims.from_degrees(dp=8), impl=Implementation.BENCHSUITE)
    hidden = run(w, system)
    exposed = run(w, dataclasses.replace(system, node=msgspec.structs.replace(system.node, dp_overlap=0.0)))
    from benchsuite.predict.compute import params_per_device
    assert exposed.dp_bytes_per_step == pytest.approx(2 * 7 / 8 * 4 * params_per_device(w))  # DDP: fp32 grads
    buckets = 1 + math.ceil((4 * params_per_device(w) - 2 ** 20) / (25 * 2 ** 20))  # DDP's 1 MiB, then 25 MiB
    dp_s = buckets * 10e-6 + exposed.dp_bytes_per_step / 370e9  # all-reduces inside the node: latency + bytes / bw
    assert exposed.seconds("data_parallel") == pytest.approx(dp_s)
    backward = 2 / 3 * (hidden.seconds("compute.matmul") + hidden.seconds("compute.attention"))
    assert hidden.seconds("data_parallel") == pytest.approx(max(0.0, dp_s - backward))


def test_framework_time_is_added_to_the_collectives_dtensor_and_fsdp2_issue_only():
    """node.framework_us on each call of benchsuite's tensor parallelism (DTensor) and of its FSDP2 data
    parallelism (ZeRO-2/3, replicate_with_fsdp beside TP or PP); DDP, ZeRO-1, the expert all-to-alls,
    the pipeline's sends and Megatron's own collectives stay at the link's cost."""
    from benchsuite.predict.communication import data_parallel, tensor_parallel
    from benchsuite.predict.compute import params_per_device

    base = no_floor(load_system(H100))
    base = dataclasses.replace(base, node=msgspec.structs.replace(base.node, dp_overlap=0.0))
    slow = dataclasses.replace(base, node=msgspec.structs.replace(base.node, framework_us=1000.0))
    moe = MoEConfig(experts=8, router="switch", capacity_factor=1.0, every=2)
    bench = Implementation.BENCHSUITE
    calls = {"tensor_parallel": lambda w: tensor_parallel(w, base).calls * w.microbatches,
             "data_parallel": lambda w: data_parallel(w, base, params_per_device(w)).calls}
    cases = {  # workload: the components whose calls pay the framework's time
        "tp": (workload(ParallelDims.from_degrees(tp=2), impl=bench), {"tensor_parallel"}),
        "zero3": (workload(ParallelDims.from_degrees(dp=2, zero=3), impl=bench), {"data_parallel"}),
        "tp+dp": (workload(ParallelDims.from_degrees(tp=2, dp=2), impl=bench), {"tensor_parallel", "data_parallel"}),
        "pp+dp": (workload(ParallelDims.from_degrees(pp=2, dp=2), microbatches=4, impl=bench), {"data_parallel"}),
        "ddp": (workload(ParallelDims.from_degrees(dp=2), impl=bench), set()),
        "zero1": (workload(ParallelDims.from_degrees(dp=2, zero=1), impl=bench), set()),
        "ep": (workload(ParallelDims.from_degrees(dp=2, ep=2), moe=moe, impl=bench), set()),
        "megatron tp": (workload(ParallelDims.from_degrees(tp=2)), set()),
    }
    for name, (w, paying) in cases.items():
        fast, dear = run(w, base), run(w, slow)
        for c in fast.components:
            expected = calls[c.name](w) * 1e-3 if c.name in paying else 0.0
            assert dear.seconds(c.name) - c.seconds == pytest.approx(expected, abs=1e-12), (name, c.name)
        assert paying <= {c.name for c in fast.components if c.seconds > 0}, name
        host = {c.name for c in dear.components if "host time" in c.detail}
        assert host == paying and not any("host time" in c.detail for c in fast.components), name
    with pytest.raises(ConfigError) as e:
        parse_system({"system": {"framework_us": -1}}, "s.toml")
    assert dict(e.value.problems)["system.framework_us"] == "must be >= 0"


def test_a_data_parallel_pipeline_reduces_the_bytes_its_record_expects():
    """benchsuite PP 2 × DP 2: the predicted data-parallel bytes are metrics.comm's expected volume less
    the loss's all-reduce (Ψ of the pipeline rank holding the most, not the layers' even share)."""
    from benchsuite.config import TrainConfig
    from benchsuite.metrics.comm import paper_bytes, ring_bytes
    from benchsuite.parallel.zero import precision_policy

    w = workload(ParallelDims.from_degrees(pp=2, dp=2), microbatches=4, impl=Implementation.BENCHSUITE)
    expected, formula = paper_bytes(model=MODEL, moe=None, train=TrainConfig(), dims=ParallelDims(world=4, pp=2),
                                    micro_batch=2, precision=precision_policy("fp32"))
    assert run(w).dp_bytes_per_step == pytest.approx(expected - ring_bytes("all_reduce", 4, 2)), formula


def test_expert_parallel_all_to_all_carries_the_routed_slots():
    moe = MoEConfig(experts=8, router="switch", capacity_factor=1.0, every=2)
    p = run(workload(ParallelDims.from_degrees(dp=4, ep=4), moe=moe))
    tokens, h = 2 * 1024, 1024
    slots = 8 * (tokens // 8)  # E · C, C = cf·N/E
    assert p.ep_bytes_per_microbatch == pytest.approx(4 * (MODEL.layers // 2) * 3 / 4 * slots * h * 2)


def test_energy_is_power_at_utilisation_times_time():
    p = run(workload(ParallelDims.from_degrees(tp=8)))
    s = load_system(H100).device
    e = p.energy
    assert e.device_w == pytest.approx(s.idle_w + (s.max_w - s.idle_w) * e.utilisation)
    assert e.j_per_token == pytest.approx(e.device_w * 8 * p.step_s / p.tokens_per_step)
    assert e.run_facility_j == pytest.approx(e.j_per_token * 1e12 * 1.2)
    assert e.run_co2e_g == pytest.approx(e.run_facility_j / 3.6e6 * 400)


def test_system_file_problems_name_the_key_and_the_fix(tmp_path):
    with pytest.raises(ConfigError) as e:
        parse_system({"system": {"name": "x", "devices_per_node": 0}, "device": {"max_w": 100, "idle_w": 200},
                      "intra_node": {"gbps": "fast"}, "extra": {}}, "s.toml")
    problems = dict(e.value.problems)
    assert problems["extra"].startswith("unknown section")
    assert problems["system.devices_per_node"] == "must be > 0"
    assert "add it" in problems["device.peak_tflops"] and "workloads/systems" in problems["device.peak_tflops"]
    assert "above device.max_w" in problems["device.idle_w"]
    assert problems["intra_node.gbps"].startswith("expected float")
    assert problems["inter_node"].startswith("missing section")
    bad = tmp_path / "bad.toml"
    bad.write_text("[system\n")
    assert main(["predict", "workloads/smoke.toml", "--system", str(bad)]) == 2


def test_calibrate_reproduces_the_records_step_time(tmp_path, capsys):
    """A world-1 record (the fixture's dense run): after calibration the prediction of that same run is
    its measured median step time."""
    record = shutil.copy("tests/fixtures/results/make_dvs-dense-w1.json", tmp_path / "r.json")
    rec = json.loads(open(record).read())
    suite = tmp_path / "s.toml"
    m = rec["config"]["model"]
    suite.write_text(f"""[suite]\nname = "s"\n[[workload]]\nname = "dense"\nkind = "dense"
model = {{ layers = {m['layers']}, hidden = {m['hidden']}, heads = {m['heads']}, vocab = {m['vocab']}, seq_len = {m['seq_len']} }}
train = {{ micro_batch = {rec['config']['train']['micro_batch']}, precision = "bf16" }}\n""")
    assert main(["predict", str(suite), "--system", H100, "--calibrate", str(record), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["runs"][0]["step_time_s"] == pytest.approx(rec["metrics"]["step_time_s"]["median"])
    assert "calibrated from" in doc["system_source"]
    assert sum(c["seconds"] for c in doc["runs"][0]["components"]) == pytest.approx(doc["runs"][0]["step_time_s"])
    w2 = shutil.copy("tests/fixtures/results/make_dvs-dense-w2.json", tmp_path / "w2.json")
    assert main(["predict", str(suite), "--system", H100, "--calibrate", str(w2)]) == 2
    assert "single-device record" in capsys.readouterr().err


def test_calibrate_refuses_a_record_of_another_device_or_without_a_step_time(tmp_path, capsys):
    """An A100's record does not calibrate an H100 file, a CPU's not a GPU file, and a record whose median
    step time is null says so (it was a TypeError)."""
    rec = json.loads(open("tests/fixtures/results/make_dvs-dense-w1.json").read())
    m = rec["config"]["model"]
    suite = tmp_path / "s.toml"
    suite.write_text(f"""[suite]\nname = "s"\n[[workload]]\nname = "dense"\nkind = "dense"
model = {{ layers = {m['layers']}, hidden = {m['hidden']}, heads = {m['heads']}, vocab = {m['vocab']}, seq_len = {m['seq_len']} }}
train = {{ micro_batch = {rec['config']['train']['micro_batch']}, precision = "bf16" }}\n""")
    cases = {"NVIDIA A100-SXM4-80GB": "the record ran on NVIDIA A100-SXM4-80GB, the system file describes NVIDIA H100",
             "cpu": "the record ran on a CPU", "null step": "no median step time"}
    for case, said in cases.items():
        doc = json.loads(json.dumps(rec))
        if case == "cpu":
            doc["env"]["devices"][0].update(type="cpu", name="AMD EPYC")
        elif case == "null step":
            doc["metrics"]["step_time_s"]["median"] = None
        else:
            doc["env"]["devices"][0]["name"] = case
        (tmp_path / "r.json").write_text(json.dumps(doc))
        assert main(["predict", str(suite), "--system", H100, "--calibrate", str(tmp_path / "r.json")]) == 2, case
        assert said in capsys.readouterr().err, case


def test_tokens_past_float_range_are_refused_naming_the_option(tmp_path, capsys):
    suite = tmp_path / "s.toml"
    suite.write_text('[suite]\nname = "s"\n[[workload]]\nname = "dense"\n'  # twice GPT-3 175B: about 2 J a token
                     'model = { layers = 192, hidden = 12288, heads = 96, vocab = 51200, seq_len = 2048 }\n')
    assert main(["predict", str(suite), "--system", H100, "--tokens", "1.7e308", "--json"]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert doc["error"] == "usage" and doc["message"].startswith("--tokens 1.7e+308: the training run of dense")


def test_a_runs_nodes_set_the_link_its_collectives_cross_and_its_name(tmp_path, capsys):
    """A 2-rank data-parallel run on 2 nodes: once predicted on the intra-node link, under the 1-node run's name."""
    suite = tmp_path / "s.toml"
    suite.write_text('[suite]\nname = "s"\n[[workload]]\nname = "dense"\n'
                     'model = { layers = 8, hidden = 1024, heads = 16, vocab = 32000, seq_len = 1024 }\n'
                     '[workload.sweep]\nworld_size = [2]\nnodes = [1, 2]\n')
    assert main(["predict", str(suite), "--system", H100, "--json"]) == 0
    runs = {r["run"]: r for r in json.loads(capsys.readouterr().out)["runs"]}
    assert set(runs) == {"dense · w2 · weak · seed 0", "dense · w2 · 2 nodes · weak · seed 0"}
    one = workload(ParallelDims(2))
    dp_one, dp_two = (next(c for c in run(w).components if c.name == "data_parallel").detail
                      for w in (one, dataclasses.replace(one, nodes=2)))
    assert "inside a node" in dp_one and "across nodes" in dp_two
    assert runs["dense · w2 · 2 nodes · weak · seed 0"]["step_time_s"] > runs["dense · w2 · weak · seed 0"]["step_time_s"]


def test_a_measured_host_becomes_a_system_file_named_as_the_harness_records_its_cpu(tmp_path):
    """`predict --system host`: measure_host's figures (here given) written as a system file that loads as
    any other, its device named as a CPU run's record names it (so report --predict compares the two), the
    slower link fit and the larger latency kept, every unmeasured figure marked an assumption."""
    import torch

    from benchsuite.environment import device_info
    from benchsuite.predict.host import host_system, system_toml

    figures = {"peak_tflops": 0.2, "matmul_tflops": 0.25, "memory_gbps": 30.0, "op_floor_us": 2.5,
               "gloo_latency_us": -40.0, "gloo_gbps": 3.0, "back_to_back_latency_us": 300.0, "back_to_back_gbps": 1.2,
               "framework_us": 1500.0, "framework_us_by_framework": {"dtensor": 1700.0, "fsdp2": 1300.0}}
    doc = {"figures": figures, "loadavg_before": (1.0, 1.0, 1.0), "loadavg_after": (1.5, 1.0, 1.0), "torch": "x",
           "cores": 4, "memory_gb": 32.0}
    path = tmp_path / "host.toml"
    path.write_text(system_toml(doc))
    s = load_system(path)
    assert s == dataclasses.replace(host_system(doc), source=str(path))
    assert s.device.name == device_info(torch.device("cpu"))["name"] and s.device.kind == "cpu"
    device, node = s.device, s.node
    assert (device.peak_tflops, device.matmul_tflops, device.memory_gbps, device.memory_gb) == (0.2, 0.2, 30.0, 8.0)
    assert (s.intra_node.gbps, s.intra_node.latency_us, node.op_floor_us, node.framework_us) == (1.2, 300.0, 2.5, 1500.0)
    assert s.node.devices_per_node == 4
    assert "assumption" in path.read_text().split("max_w")[1].splitlines()[0]
