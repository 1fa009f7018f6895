"""A run's fixed cost: the launcher learns the GPUs without torch (NVML as CUDA shows them), and the
host's constants (matmul ceiling, idle power) are measured once per suite and reused, saying so."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from benchsuite.environment import NotLikeCuda, driver_version, nvml_gpu_names
from benchsuite.metrics import ceiling as ce
from benchsuite.suite_constants import NOT_SHARED, SuiteConstants

H200 = [("GPU-aaaa1111", "NVIDIA H200"), ("GPU-bbbb2222", "NVIDIA H200"), ("GPU-cccc3333", "NVIDIA H200")]


class FakeNvml:
    """pynvml's calls gpu_names makes, over a list of (UUID, name); mig: the indices in MIG mode."""

    NVMLError = RuntimeError

    def __init__(self, devices, mig=()):
        self.devices, self.mig, self.shut = devices, set(mig), False

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        self.shut = True

    def nvmlDeviceGetCount(self):
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetUUID(self, h):
        return self.devices[h][0].encode()  # old pynvml: bytes

    def nvmlDeviceGetName(self, h):
        return self.devices[h][1]

    def nvmlDeviceGetMigMode(self, h):
        return (1 if h in self.mig else 0), 0

    def nvmlSystemGetDriverVersion(self):
        return b"570.86.15"  # old pynvml: bytes


@pytest.mark.parametrize("visible, expected", [
    (None, ["NVIDIA H200"] * 3),
    ("", []),
    ("2,0", ["NVIDIA H200"] * 2),
    ("1,7,0", ["NVIDIA H200"]),  # CUDA stops at the first index it does not have
    ("-1", []),
    ("GPU-cccc,0", ["NVIDIA H200"] * 2),  # a unique UUID prefix
    ("GPU-,0", []),  # a prefix of every UUID is no device
    ("0,0", ["NVIDIA H200"]),  # a repeated device ends the list
])
def test_gpu_names_are_the_devices_cuda_visible_devices_lets_cuda_see(visible, expected):
    lib = FakeNvml(H200)
    assert nvml_gpu_names(visible, None, lib) == expected
    assert lib.shut


def test_visible_devices_keep_their_order_with_two_models_numbered_by_pci_bus():
    lib = FakeNvml([("GPU-a", "NVIDIA A100"), ("GPU-b", "NVIDIA H100")])
    assert nvml_gpu_names("1,0", "PCI_BUS_ID", lib) == ["NVIDIA H100", "NVIDIA A100"]


@pytest.mark.parametrize("lib, visible, order", [
    (FakeNvml([("GPU-a", "NVIDIA A100"), ("GPU-b", "NVIDIA H100")]), None, None),  # CUDA: fastest first
    (FakeNvml(H200, mig=[1]), None, None),
    (FakeNvml(H200), "MIG-0f1e", None),
])
def test_what_nvml_cannot_answer_as_cuda_would_goes_to_torch(lib, visible, order):
    with pytest.raises(NotLikeCuda):
        nvml_gpu_names(visible, order, lib)


def test_a_box_without_nvml_is_not_like_cuda():
    class Missing:
        NVMLError = RuntimeError

        def nvmlInit(self):
            raise OSError("libnvidia-ml.so.1: cannot open shared object file")

    with pytest.raises(NotLikeCuda, match="NVML unavailable"):
        nvml_gpu_names(None, None, Missing())


def test_the_driver_version_is_nvmls_text_and_none_without_nvml():
    lib = FakeNvml(H200)
    assert driver_version(lib) == "570.86.15" and lib.shut

    class Refusing(FakeNvml):
        def nvmlSystemGetDriverVersion(self):
            raise RuntimeError("NVML_ERROR_UNKNOWN")

    refusing = Refusing(H200)
    assert driver_version(refusing) is None and refusing.shut


def test_the_gpu_names_stand_below_the_energy_layer():
    """The run key's GPU names come from benchsuite/nvml.py, which imports nothing of benchsuite: the hardware
    identity needs no meter."""
    import ast
    from pathlib import Path

    import benchsuite.environment
    import benchsuite.nvml

    def imports(module) -> set[str]:
        tree = ast.parse(Path(module.__file__).read_text(encoding="utf-8"))
        return {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module} | \
            {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}

    assert not {m for m in imports(benchsuite.nvml) if m.startswith("benchsuite")}
    assert "benchsuite.nvml" in imports(benchsuite.environment)
    assert not {m for m in imports(benchsuite.environment) if m.startswith("benchsuite.energy")}


def test_a_constant_is_measured_once_per_key_and_its_reuse_names_the_run_that_measured_it(tmp_path):
    calls = []

    def measure():
        calls.append(1)
        return {"flops_per_s": 1e12 + len(calls)}

    first = SuiteConstants(tmp_path, "suite__a__KEY1")
    assert first.reuse_or_measure("matmul-ceiling", {"dtype": "bf16"}, measure) == ({"flops_per_s": 1e12 + 1}, None)
    value, reuse = SuiteConstants(tmp_path, "suite__b__KEY2").reuse_or_measure("matmul-ceiling", {"dtype": "bf16"},
                                                                                  measure)
    assert value == {"flops_per_s": 1e12 + 1} and len(calls) == 1
    assert reuse.run == "suite__a__KEY1"
    assert reuse.label() == f"measured once for this suite by run suite__a__KEY1 at {reuse.at}, reused"
    assert first.reuse_or_measure("matmul-ceiling", {"dtype": "fp32"}, measure) == ({"flops_per_s": 1e12 + 2}, None)
    assert first.reuse_or_measure("idle-power", {"dtype": "bf16"}, measure)[1] is None  # another kind
    assert len(calls) == 3


def test_an_unreadable_constant_is_measured_again_and_without_a_folder_every_time(tmp_path):
    constants = SuiteConstants(tmp_path, "r")
    constants.reuse_or_measure("idle-power", {"k": 1}, lambda: {"cpu": 5.0})
    (path,) = tmp_path.iterdir()
    path.write_text("{\"key\": {\"k\": 1}, \"val")  # cut short: never written so (atomic), but a disk can lie
    assert constants.reuse_or_measure("idle-power", {"k": 1}, lambda: {"cpu": 7.0}) == ({"cpu": 7.0}, None)
    assert json.loads(path.read_text())["value"] == {"cpu": 7.0}
    calls = []
    for _ in range(2):
        assert NOT_SHARED.reuse_or_measure("idle-power", {"k": 1}, lambda: calls.append(1) or {"cpu": 1.0})[1] is None
    assert len(calls) == 2


def test_a_suites_second_run_reuses_the_ceiling_with_its_source(tmp_path, monkeypatch):
    import torch

    measured = []

    def fake(device, dtype):
        measured.append(dtype)
        return ce.MatmulCeiling(3e11, "512^3 float32 matmul: best of 3 windows")

    monkeypatch.setattr(ce, "measure_matmul_ceiling", fake)
    cpu = torch.device("cpu")
    first = ce.suite_ceiling(SuiteConstants(tmp_path, "s__dense__K1"), cpu, torch.float32)
    second = ce.suite_ceiling(SuiteConstants(tmp_path, "s__moe__K2"), cpu, torch.float32)
    assert first == ce.MatmulCeiling(3e11, "512^3 float32 matmul: best of 3 windows")
    assert second.flops_per_s == 3e11 and measured == [torch.float32]
    assert second.source.startswith("512^3 float32 matmul: best of 3 windows; measured once for this suite by run "
                                    "s__dense__K1 at ")
    ce.suite_ceiling(SuiteConstants(tmp_path, "s__bf16__K3"), cpu, torch.bfloat16)  # another precision: measured
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # beside another rank: measured again
    ce.suite_ceiling(SuiteConstants(tmp_path, "s__w2__K4"), cpu, torch.float32)
    assert measured == [torch.float32, torch.bfloat16, torch.float32]


def test_the_idle_baseline_of_an_earlier_run_is_reused_and_said_in_the_energy_reasons(tmp_path):
    from benchsuite.worker import idle_baseline

    class Monitor:
        host, gpu_meters = "node1", []

        def __init__(self):
            self.idle_w, self.notes, self.measured = None, [], 0

        def measure_idle(self, seconds):
            self.measured += 1
            self.idle_w = {"cpu": 41.5, "dram": None}
            return self.idle_w

    first, second = Monitor(), Monitor()
    idle_baseline(first, 2.0, SuiteConstants(tmp_path, "s__a__K1"))
    idle_baseline(second, 2.0, SuiteConstants(tmp_path, "s__b__K2"))
    assert (first.measured, second.measured) == (1, 0)
    assert second.idle_w == {"cpu": 41.5, "dram": None} and first.notes == []
    (note,) = second.notes
    assert note.startswith("idle baseline measured once for this suite by run s__a__K1 at ") and note.endswith(", reused")


@pytest.mark.procs
def test_the_launcher_and_the_run_verb_import_no_torch():
    """The CLI's start before the first run: importing torch there cost a torch import per suite."""
    code = ("import sys, benchsuite.cli, benchsuite.launch, benchsuite.commands.run\n"
            "from benchsuite.environment import hardware_identity, gpu_names\n"
            "hardware_identity(); gpu_names()\n"
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
