"""Energy meters on a CPU box: NVML is replaced by an autospec double of the pynvml
library, RAPL by a fake powercap tree; codecarbon's power model is looked up for real."""

import time
from pathlib import Path
from unittest import mock

import pytest

from benchsuite import nvml as nvml_devices
from benchsuite.energy import common, estimate, meters, nvml, rapl
from benchsuite.energy.attribution import attribute_energy
from benchsuite.energy.estimate import EstimateSensor
from benchsuite.energy.common import EmptyCpuSensor, EnergyError, Reading
from benchsuite.energy.meters import FirstAvailable, NodeEnergyMonitor
from helpers.meters import FIXED, UUIDS, FakeGpus, make_zone, torch_uuids

# ----------------------------------------------------------------------------- NVML (its double: helpers/meters.py)


def meter_on(gpus, handle, **kwargs):
    """An NvmlGpuMeter for cuda:0 when it is NVML's device `handle`, sampling every 5 ms."""
    with torch_uuids({0: UUIDS[handle]}):
        return nvml.NvmlGpuMeter(0, lib=gpus.lib, interval_s=0.005, **kwargs)


def test_handle_chosen_by_uuid_under_reordered_visible_devices(monkeypatch):
    # CUDA_VISIBLE_DEVICES=2,0: cuda:0 is NVML's third device, cuda:1 its first.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    gpus = FakeGpus()
    with torch_uuids({0: "cccccccc-2222-2222-2222-222222222222", 1: "AAAAAAAA-0000-0000-0000-000000000000"}):
        m0 = nvml.NvmlGpuMeter(0, lib=gpus.lib)
        m1 = nvml.NvmlGpuMeter(1, lib=gpus.lib)
    assert (m0.handle, m0.uuid) == ("h2", UUIDS["h2"])
    assert (m1.handle, m1.uuid) == ("h0", UUIDS["h0"])
    m0.begin("w")
    fig = m0.end("w")
    # each edge reads until the counter moves (the double adds a step per read): two steps in the window
    assert fig.source == "measured" and fig.energy_j == pytest.approx(6.0)   # h2's 3000 mJ steps
    assert fig.detail["counter_edge_s"] <= 2 * nvml.EDGE_POLL_S  # read within a poll of an update
    assert m0.name == "NVIDIA H200"


def test_unknown_uuid_gives_empty_meter_with_reason():
    gpus = FakeGpus()
    with torch_uuids({0: "dddddddd-9999-9999-9999-999999999999"}):
        meter = nvml.make_gpu_meter(0, lib=gpus.lib)
    assert isinstance(meter, common.EmptyGpuMeter)
    assert meter.uuid == "GPU-dddddddd-9999-9999-9999-999999999999"
    meter.begin("w")
    fig = meter.end("w")
    assert fig.energy_j is None and fig.source == "unavailable" and "no NVML device has UUID" in fig.reason


def test_nvmls_errors_reach_the_meters_caller_as_energy_errors():
    gpus = FakeGpus()
    with torch_uuids({0: "dddddddd-9999-9999-9999-999999999999"}), \
            pytest.raises(EnergyError, match="no NVML device has UUID") as caught:
        nvml.NvmlGpuMeter(0, lib=gpus.lib)
    assert isinstance(caught.value.__cause__, nvml_devices.NvmlError)


def test_missing_pynvml_is_unavailable_not_an_error():
    with torch_uuids({0: "aaaaaaaa-0000-0000-0000-000000000000"}), \
            mock.patch.object(nvml_devices, "load_nvml", side_effect=nvml_devices.NvmlError("pynvml not importable")):
        meter = nvml.make_gpu_meter(0)
    fig = meter.end("w")
    assert fig.energy_j is None and "pynvml not importable" in fig.reason


def test_counter_unsupported_integrates_sampled_power_average_api():
    gpus = FakeGpus(counter_supported=False, instant_supported=False)
    meter = meter_on(gpus, "h1")
    meter.begin("w")
    t0 = time.monotonic()
    time.sleep(0.1)
    fig = meter.end("w")
    dt = time.monotonic() - t0
    assert fig.source == "sampled" and "counter unsupported" in fig.reason
    assert fig.energy_j == pytest.approx(200.0 * dt, rel=0.2)
    assert fig.detail["power_api"] == "average"


def test_sample_power_beside_counter_uses_instant_field():
    gpus = FakeGpus()
    meter = meter_on(gpus, "h0", sample_power=True)
    meter.begin("w")
    time.sleep(0.05)
    fig = meter.end("w")
    assert fig.source == "measured" and fig.energy_j == pytest.approx(2.0)  # two steps: an aligned edge reads twice
    assert fig.sampled_energy_j == pytest.approx(100.0 * 0.05, rel=0.5)
    assert fig.detail["sample_min_w"] == fig.detail["sample_max_w"] == 100.0
    assert fig.detail["power_api"] == "instant"


def test_counter_raising_at_end_degrades_to_sampler_then_unavailable():
    gpus = FakeGpus()
    sampled, plain = meter_on(gpus, "h0", sample_power=True), meter_on(gpus, "h0")
    sampled.begin("w")
    plain.begin("w")
    time.sleep(0.03)
    gpus.fail_counter = True
    fig = sampled.end("w")
    assert fig.source == "sampled" and fig.energy_j > 0
    assert "counter failed at window end" in fig.reason
    fig = plain.end("w")
    assert fig.source == "unavailable" and fig.energy_j is None
    assert "counter failed at window end" in fig.reason


def test_overlapping_windows_on_one_sampler():
    sampler = nvml.PowerSampler(lambda: 50.0, interval_s=0.005)
    a = sampler.open()
    time.sleep(0.02)
    b = sampler.open()
    time.sleep(0.02)
    (ea, low, high), (eb, _, _) = sampler.close(a), sampler.close(b)
    assert ea > eb > 0 and low == high == 50.0
    assert sampler._thread is None and sampler._samples == []


def test_trapezoid_exact():
    assert nvml.trapezoid([(0.0, 100.0), (1.0, 200.0), (3.0, 200.0)]) == pytest.approx(150.0 + 400.0)


def test_normalize_uuid():
    assert nvml_devices.normalize_uuid(b"GPU-ABC") == nvml_devices.normalize_uuid(" abc ") == "abc"


# ----------------------------------------------------------------------------- RAPL


@pytest.fixture
def powercap(tmp_path):
    root = tmp_path / "powercap"
    make_zone(root / "intel-rapl:0", "package-0", 900_000)
    make_zone(root / "intel-rapl:0" / "intel-rapl:0:0", "core", 5)
    make_zone(root / "intel-rapl:0" / "intel-rapl:0:1", "dram", 10_000)
    make_zone(root / "intel-rapl:1", "package-1", 100)
    make_zone(root / "intel-rapl:2", "psys", 7)
    return root


def set_uj(root: Path, zone: str, value: int):
    matches = list(root.glob(f"**/{zone}"))
    (matches[0] / "energy_uj").write_text(f"{value}\n")


def test_rapl_wraparound_and_zone_selection(powercap):
    sensor = rapl.RaplSensor(powercap)
    assert sorted(z.name for z in sensor.zones) == ["dram", "package-0", "package-1"]
    sensor.begin("w")
    set_uj(powercap, "intel-rapl:0", 100_000)          # wrapped: 900k -> 1M -> 100k = 200k uJ
    set_uj(powercap, "intel-rapl:1", 50_100)           # 50k uJ
    set_uj(powercap, "intel-rapl:0:1", 30_000)         # 20k uJ
    figs = sensor.end("w")
    assert figs["cpu"].source == "measured" and figs["cpu"].energy_j == pytest.approx(0.25)
    assert figs["dram"].source == "measured" and figs["dram"].energy_j == pytest.approx(0.02)


def test_rapl_permission_denied_is_energy_error(powercap, monkeypatch):
    real = Path.read_text

    def deny(self, *a, **k):
        if self.name == "energy_uj":
            raise PermissionError(13, "Permission denied")
        return real(self, *a, **k)

    monkeypatch.setattr(Path, "read_text", deny)
    with pytest.raises(EnergyError, match="permission denied"):
        rapl.RaplSensor(powercap)


def test_rapl_missing_root(tmp_path):
    with pytest.raises(EnergyError, match="does not exist"):
        rapl.RaplSensor(tmp_path / "nope")


# ----------------------------------------------------------------------------- monitor



class BrokenGpu:
    uuid, name, cuda_index = "GPU-broken", "broken", 0

    def begin(self, name):
        pass

    def end(self, name):
        raise RuntimeError("driver fell over")


def test_cpu_only_monitor_without_rapl_is_estimated_or_unavailable_never_zero(tmp_path):
    mon = NodeEnergyMonitor.create([], rapl_root=tmp_path / "no-powercap")
    mon.begin("w")
    r = mon.end("w")
    assert r.gpus == []
    for fig in (r.cpu, r.dram):
        assert fig.source in ("estimated", "unavailable")
        assert "RAPL unavailable" in fig.reason
        assert fig.energy_j is None or fig.energy_j > 0
    section = attribute_energy([r.to_dict()])
    assert section["gpu_j"] is None and section["sources"]["gpu"] == "unavailable"


def test_cpu_only_monitor_when_codecarbon_lookup_fails(tmp_path, monkeypatch):
    monkeypatch.setattr(estimate, "codecarbon_power_model", mock.Mock(side_effect=EnergyError("lookup failed")))
    mon = NodeEnergyMonitor.create(["cpu"], rapl_root=tmp_path / "no-powercap")
    mon.begin("w")
    r = mon.end("w")
    assert r.cpu.energy_j is None and r.cpu.source == "unavailable"
    assert "RAPL unavailable" in r.cpu.reason and "lookup failed" in r.cpu.reason


def test_rapl_failing_mid_window_degrades_to_estimate(powercap):
    chain = FirstAvailable([rapl.RaplSensor(powercap), EstimateSensor(FIXED)])
    mon = NodeEnergyMonitor([], chain, min_window_s=0.0)
    mon.begin("w")
    (powercap / "intel-rapl:1" / "energy_uj").unlink()
    r = mon.end("w")
    assert r.cpu.source == "estimated" and r.cpu.energy_j > 0
    assert "RaplSensor failed at window end" in r.cpu.reason
    assert r.dram.source == "estimated"


def test_rapl_without_dram_zone_takes_dram_from_estimate(tmp_path):
    root = tmp_path / "powercap"
    make_zone(root / "intel-rapl:0", "package-0", 0)
    mon = NodeEnergyMonitor([], FirstAvailable([rapl.RaplSensor(root), EstimateSensor(FIXED)]))
    mon.begin("w")
    r = mon.end("w")
    assert r.cpu.source == "measured"
    assert r.dram.source == "estimated" and "no RAPL dram zone" in r.dram.reason


def test_gpu_meter_raising_is_recorded_not_raised():
    mon = NodeEnergyMonitor([BrokenGpu()], EmptyCpuSensor("none here"))
    mon.begin("w")
    r = mon.end("w")
    assert r.gpus[0].figure.energy_j is None and "driver fell over" in r.gpus[0].figure.reason
    assert r.cpu.energy_j is None and r.cpu.reason == "none here"


def test_short_window_flagged_and_sync_at_both_edges():
    sync = mock.Mock()
    mon = NodeEnergyMonitor([], EstimateSensor(FIXED), min_window_s=1.0, sync=sync)
    mon.begin("w")
    assert sync.call_count == 1
    r = mon.end("w")
    assert sync.call_count == 2
    assert r.short_window and any("shorter than min_window_s" in t for t in r.reasons)
    mon.min_window_s = 0.0
    mon.begin("w")
    assert not mon.end("w").short_window


def test_nested_overlapping_windows_and_misuse():
    mon = NodeEnergyMonitor([], EstimateSensor(FIXED), min_window_s=0.0)
    mon.begin("outer")
    mon.begin("inner")
    with pytest.raises(ValueError):
        mon.begin("inner")
    inner = mon.end("inner")
    mon.begin("late")
    outer = mon.end("outer")
    late = mon.end("late")
    assert outer.window_s >= inner.window_s and late.cpu.source == "estimated"
    with pytest.raises(ValueError):
        mon.end("outer")


def test_idle_baseline_reports_energy_above_idle():
    mon = NodeEnergyMonitor([], EstimateSensor(FIXED), min_window_s=0.0)
    idle = mon.measure_idle(0.25)  # long enough that a loaded box's scheduling delay at the edges stays under 5 %
    assert idle["dram"] == pytest.approx(10.0, rel=0.05)   # sensor edges sit inside the window
    mon.begin("w")
    r = mon.end("w")
    assert r.dram.idle_w == idle["dram"]
    assert r.dram.above_idle_j == pytest.approx(r.dram.energy_j - idle["dram"] * r.window_s)


def test_cuda_indices_parsing():
    import torch
    devs = [torch.device("cuda", 1), "cuda:2", "cuda", 3, torch.device("cpu"), "cpu"]
    assert meters._cuda_indices(devs) == [1, 2, 0, 3]


# ----------------------------------------------------------------------------- attribution


def fig(e, source, reason=None, idle_w=None, window=10.0):
    f = Reading(e, source, reason, idle_w=idle_w)
    if e is not None and idle_w is not None:
        f.above_idle_j = e - idle_w * window
    return f


def rank_result(rank, host, gpus, cpu, dram, window=10.0):
    return common.WindowResult("measure", rank, host, window, False,
                               [common.GpuReading(u, "NVIDIA H200", i, f) for i, (u, f) in enumerate(gpus)],
                               cpu, dram).to_dict()


def test_two_ranks_sharing_one_gpu_count_it_once():
    shared = ("GPU-a", fig(700.0, "measured"))
    per_rank = [rank_result(0, "n1", [shared], fig(50.0, "measured"), fig(5.0, "measured")),
                rank_result(1, "n1", [("GPU-a", fig(710.0, "measured"))], fig(51.0, "measured"),
                            fig(5.1, "measured"))]
    s = attribute_energy(per_rank)
    assert len(s["per_device"]) == 1
    dev = s["per_device"][0]
    assert dev["ranks"] == [0, 1] and dev["reading_rank"] == 0 and dev["energy_j"] == 700.0
    assert dev["avg_w"] == pytest.approx(70.0) and dev["host"] == "n1"
    assert s["gpu_j"] == 700.0 and s["cpu_j"] == 50.0 and s["dram_j"] == 5.0
    assert s["total_j"] == pytest.approx(755.0) and s["source"] == "measured"
    assert s["per_node"][0]["ranks"] == [0, 1]


def test_shared_gpu_prefers_the_rank_that_measured_it():
    per_rank = [rank_result(0, "n1", [("GPU-a", fig(None, "unavailable", "counter failed"))],
                            fig(1.0, "measured"), fig(1.0, "measured")),
                rank_result(1, "n1", [("GPU-a", fig(300.0, "measured"))], fig(1.0, "measured"), fig(1.0, "measured"))]
    s = attribute_energy(per_rank)
    assert s["gpu_j"] == 300.0 and s["per_device"][0]["reading_rank"] == 1


def test_energy_section_totals_with_mixed_sources():
    per_rank = [
        rank_result(0, "n1", [("GPU-a", fig(100.0, "measured", idle_w=5.0))],
                    fig(50.0, "estimated", "RAPL unavailable", idle_w=2.0), fig(None, "unavailable", "no dram")),
        rank_result(1, "n1", [("GPU-b", fig(200.0, "measured", idle_w=5.0))],
                    fig(52.0, "estimated", idle_w=2.0), fig(None, "unavailable", "no dram")),
        rank_result(2, "n2", [("GPU-c", fig(300.0, "sampled", "counter unsupported", idle_w=5.0))],
                    fig(40.0, "measured", idle_w=1.0), fig(10.0, "measured", idle_w=1.0)),
    ]
    s = attribute_energy(per_rank)
    assert s["gpu_j"] == pytest.approx(600.0) and s["sources"]["gpu"] == "sampled"
    assert s["cpu_j"] == pytest.approx(90.0) and s["sources"]["cpu"] == "estimated"   # n1 counted once
    assert s["dram_j"] is None and s["sources"]["dram"] == "unavailable"                # n1 has none
    assert s["total_includes"] == ["gpu", "cpu"]
    assert s["total_j"] == pytest.approx(690.0) and s["source"] == "estimated"
    assert s["idle_w"] == pytest.approx(15.0 + 3.0)
    assert s["above_idle_j"] == pytest.approx(690.0 - 18.0 * 10.0)
    assert any("no dram" in t for t in s["reasons"])


def test_gpu_unavailable_total_is_the_cpu_estimate():
    per_rank = [rank_result(0, "n1", [("GPU-a", fig(None, "unavailable", "NVML unavailable"))],
                            fig(30.0, "estimated"), fig(20.0, "estimated"))]
    s = attribute_energy(per_rank)
    assert s["gpu_j"] is None and s["total_j"] == pytest.approx(50.0)
    assert s["total_includes"] == ["cpu", "dram"] and s["source"] == "estimated"
    assert s["sources"] == {"gpu": "unavailable", "cpu": "estimated", "dram": "estimated"}
    assert s["idle_w"] is None and s["above_idle_j"] is None


def test_nothing_measured_total_is_none():
    r = rank_result(0, "n1", [], fig(None, "unavailable", "x"), fig(None, "unavailable", "y"))
    s = attribute_energy([r])
    assert s["total_j"] is None and s["source"] == "unavailable" and s["total_includes"] == []


# ----------------------------------------------------------------------------- layering


def _benchsuite_imports(module) -> set[str]:
    """The benchsuite modules a module imports anywhere in its source (also inside functions)."""
    import ast

    found = set()
    for node in ast.walk(ast.parse(Path(module.__file__).read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("benchsuite"):
            found |= {f"{node.module}.{a.name}" if node.module == "benchsuite.energy" else node.module
                      for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("benchsuite")}
    return found


def test_energy_modules_import_one_way():
    """common <- vendors (nvml, rapl, estimate) <- meters: no vendor module imports another or meters, and
    below the energy layer each knows only the bottom of the house (the record's types and kinds, NVML's
    devices)."""
    from benchsuite.energy import attribution, bounds, windows

    bottom = {"benchsuite.record.types", "benchsuite.record.kinds", "benchsuite.nvml"}

    def energy_imports(module) -> set[str]:
        found = _benchsuite_imports(module)
        assert found - bottom == {m for m in found if m.startswith("benchsuite.energy")}, module.__name__
        return found - bottom

    assert energy_imports(common) == set()
    for vendor in (nvml, rapl, estimate, windows):
        assert energy_imports(vendor) == {"benchsuite.energy.common"}, vendor.__name__
    assert energy_imports(attribution) == {"benchsuite.energy.common", "benchsuite.energy.bounds"}
    assert energy_imports(bounds) == {"benchsuite.energy.common"}
    assert "benchsuite.nvml" in _benchsuite_imports(nvml)
    assert {"benchsuite.energy.nvml", "benchsuite.energy.rapl", "benchsuite.energy.estimate"} <= \
        _benchsuite_imports(meters)


KNOWN_CPUS = ["Intel(R) Xeon(R) Gold 6148 CPU @ 2.40GHz", "AMD EPYC 7763 64-Core Processor",
              "Intel(R) Core(TM) i7-8700K CPU @ 3.70GHz", "Apple M1", "Intel(R) Xeon(R) Processor"]


@pytest.mark.parametrize("name", KNOWN_CPUS)
def test_registry_tdp_equals_codecarbons_own_pandas_lookup(name):
    from codecarbon.core.cpu import TDP
    reference = TDP.__new__(TDP)._get_cpu_power_from_registry(name)   # codecarbon's pandas path
    assert estimate.registry_tdp(name) == reference


def test_cpu_brand_is_codecarbons_detected_model():
    from codecarbon.core.util import detect_cpu_model
    assert estimate.cpu_brand() == detect_cpu_model()


@pytest.fixture
def fresh_power_model():
    estimate.codecarbon_power_model.cache_clear()
    yield estimate.codecarbon_power_model
    estimate.codecarbon_power_model.cache_clear()


def test_power_model_pinned_for_a_known_cpu(fresh_power_model, monkeypatch):
    import codecarbon.core.util as cc_util
    monkeypatch.setattr(estimate, "cpu_brand", lambda: "Intel(R) Xeon(R) Gold 6148 CPU @ 2.40GHz")
    monkeypatch.setattr(cc_util, "count_physical_cpus", lambda: 2)
    m = fresh_power_model()
    assert m.cpu_max_w == 300.0
    assert m.cpu_basis == ("TDP from codecarbon cpu_power.csv: Intel(R) Xeon(R) Gold 6148 CPU @ 2.40GHz"
                           " = 150.0 W x 2 socket(s)")


def test_power_model_unknown_cpu_is_4_w_per_thread(fresh_power_model, monkeypatch):
    import codecarbon.core.util as cc_util
    import psutil
    monkeypatch.setattr(estimate, "cpu_brand", lambda: "Intel(R) Xeon(R) Processor")
    monkeypatch.setattr(cc_util, "count_physical_cpus", lambda: 1)
    m = fresh_power_model()
    assert m.cpu_max_w == 4.0 * psutil.cpu_count()
    assert m.cpu_basis == ("codecarbon fallback 4 W per thread (CPU not in cpu_power.csv): "
                           f"Intel(R) Xeon(R) Processor = {4 * psutil.cpu_count()} W x 1 socket(s)")


@pytest.mark.procs
def test_power_model_lookup_does_not_import_pandas():
    """pandas' import was most of the lookup's cost, paid by every rank of every run."""
    import subprocess
    import sys
    code = ("import sys; from benchsuite.energy.estimate import codecarbon_power_model; "
            "codecarbon_power_model(); print('pandas' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_gpu_nodes_energy_section_is_one_the_record_types_accept(powercap):
    """What a GPU node writes (NVML counter with sampled power beside it, RAPL package and DRAM), as the worker
    assembles it (windows combined, devices attributed), fits the record's types: no key the types leave out,
    which on CPU-only machines (CI) no run would write."""
    import msgspec

    from benchsuite.energy.windows import combine_windows
    from benchsuite.record.types import Energy

    gpus = FakeGpus()
    mon = NodeEnergyMonitor([meter_on(gpus, "h0", sample_power=True)], FirstAvailable([rapl.RaplSensor(powercap)]),
                            min_window_s=0.0)
    windows = []
    for k in range(2):
        mon.begin(f"train-{k}")
        time.sleep(0.02)
        windows.append(mon.end(f"train-{k}").to_dict())
    mon.close()
    section = attribute_energy([combine_windows(windows, "measure", 0.0)])
    dev, node = section["per_device"][0], section["per_node"][0]
    assert dev["source"] == "measured" and dev["sampled_energy_j"] > 0 and dev["detail"]["windows"] == 2
    assert node["cpu"]["source"] == node["dram"]["source"] == "measured"
    typed = msgspec.convert(section, Energy, strict=True)
    assert typed.per_device[0].cuda_index == 0 and typed.sources.gpu == "measured"
