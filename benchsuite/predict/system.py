"""The system file (`benchsuite predict --system SYSTEM.toml`): one node type's devices and links.

A prediction is only as good as these numbers, so each is a key the user can read and replace: the
datasheet figures (peak FLOP/s, memory, power) and the achieved ones (the matmul and attention rates a
training step reaches, the bus bandwidth a collective reaches), which `--calibrate RECORD` replaces with
the user's own measurement. Every problem names the key and the fix (config.ConfigError, as a suite's).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from benchsuite.config import ConfigError, build_section, doc_of
from benchsuite.record.scalars import NonNegativeNum, PositiveInt, PositiveNum, Text, doc
from benchsuite.record.sections import ConfigSection

EXAMPLE = "workloads/systems/h100-8x.toml"


Fraction = Annotated[float, Meta(ge=0, le=1)]


class DeviceSpec(ConfigSection):
    """One accelerator (or one CPU rank): datasheet figures and the rates a training step achieves."""

    name: doc(Text | None, "the device, e.g. NVIDIA H100 80GB HBM3") = None
    kind: doc(Literal["gpu", "cpu"], "cpu: precision \"auto\" is fp32, as the harness runs it") = "gpu"
    peak_tflops: doc(PositiveNum | None, "dense bf16 (fp32 on a CPU) peak, datasheet") = None
    matmul_tflops: doc(PositiveNum | None, "achieved on the weight matmuls of a training step") = None
    attention_tflops: doc(PositiveNum | None, "achieved on the attention core") = None
    memory_gb: doc(PositiveNum | None, "device memory (HBM), GB = 1e9 bytes") = None
    memory_gbps: doc(PositiveNum | None, "memory bandwidth, GB/s (the optimizer step is bound by it)") = None
    max_w: doc(PositiveNum | None, "board power at full load (TDP)") = None
    idle_w: doc(PositiveNum | None, "board power while idle") = None
    fp8_peak_tflops: doc(PositiveNum | None, "dense FP8 peak, datasheet (predict --precision fp8)") = None
    fp8_matmul_tflops: doc(PositiveNum | None, "achieved on the weight matmuls in FP8 (predict --precision fp8)") = None


class Link(ConfigSection):
    """A collective's cost on one kind of link: latency per call plus bytes sent per rank / bandwidth."""

    gbps: doc(PositiveNum | None, "bus bandwidth per device a ring collective achieves, GB/s") = None
    latency_us: doc(PositiveNum | None, "the fixed cost of one collective call, µs") = None


class Node(ConfigSection):
    name: doc(Text | None, "what the file describes, e.g. 8x H100 SXM (DGX H100)") = None
    devices_per_node: doc(PositiveInt | None, "devices one node holds") = None
    dp_overlap: doc(Fraction, "share of data-parallel communication hidden behind backward") = 1.0
    framework_us: doc(NonNegativeNum, "host time DTensor and FSDP2 add to each collective they issue, µs (0 where "
                                      "the host runs ahead of the device)") = 0.0
    op_floor_us: doc(NonNegativeNum, "the least time one operator of a training step takes: kernel launch and the "
                                     "framework's host time, µs (a step is never shorter than its operators' "
                                     "floors)") = 0.0
    ep_overlap: doc(Fraction, "share of the expert all-to-all hidden behind compute (0: on the critical "
                              "path)") = 0.0


class ExpertRates(ConfigSection):
    """How an MoE layer's kernels run on this device (benchsuite/predict/moe.py)."""

    gemm_half_tokens: doc(PositiveNum | None, "tokens per expert at which a grouped expert GEMM runs at half the "
                                              "matmul rate (default: matmul_tflops / memory_gbps, the weights' "
                                              "read time)") = None
    load_max_over_mean: doc(PositiveNum, "busiest expert ÷ mean token load assumed where no record gives it "
                                         "(learned routing)") = 1.0


@dataclass(frozen=True)
class System:
    """What `benchsuite predict` knows of the machine (the typed system file)."""

    node: Node
    device: DeviceSpec
    intra_node: Link
    inter_node: Link
    source: str  # the file, and what calibrated it
    experts: ExpertRates = ExpertRates()

    @property
    def name(self) -> str:
        return self.node.name

    def link(self, crosses_nodes: bool) -> Link:
        return self.inter_node if crosses_nodes else self.intra_node

    def calibrated(self, matmul_tflops: float, attention_tflops: float, how: str) -> System:
        """The same system with the achieved rates of one measurement."""
        device = msgspec.structs.replace(self.device, matmul_tflops=matmul_tflops, attention_tflops=attention_tflops)
        return replace(self, device=device, source=f"{self.source}; {how}")


SECTIONS = {"system": Node, "device": DeviceSpec, "intra_node": Link, "inter_node": Link, "experts": ExpertRates}
OPTIONAL = {"system.dp_overlap", "system.framework_us", "system.op_floor_us", "system.ep_overlap", "device.kind",
            "device.fp8_peak_tflops", "device.fp8_matmul_tflops", "experts"}


def parse_system(doc: dict, path: str | Path) -> System:
    """A parsed system file as the typed System; ConfigError listing every problem (key, reason, fix)."""
    problems: list[tuple[str, str]] = []
    for key in doc:
        if key not in SECTIONS:
            problems.append((key, f"unknown section; valid sections: {', '.join(SECTIONS)}"))
    built = {}
    for sec, cls in SECTIONS.items():
        raw = doc.get(sec)
        if raw is None and sec not in OPTIONAL:
            problems.append((sec, f"missing section [{sec}]; add it (see {EXAMPLE})"))
        raw = {} if raw is None else raw
        built[sec], _ = build_section(cls, raw, sec, problems)
        for f in msgspec.structs.fields(cls):
            given = isinstance(raw, dict) and f.name in raw
            if not given and f"{sec}.{f.name}" not in OPTIONAL and sec not in OPTIONAL and sec in doc:
                problems.append((f"{sec}.{f.name}", f"missing key ({doc_of(f)}); add it "
                                                    f"(see {EXAMPLE})"))
    d = built["device"]
    if d.idle_w is not None and d.max_w is not None and d.idle_w > d.max_w:
        problems.append(("device.idle_w", f"idle power ({d.idle_w:g} W) above device.max_w ({d.max_w:g} W); "
                                          f"give the board's idle and full-load power"))
    for key, peak_key in (("matmul_tflops", "peak_tflops"), ("attention_tflops", "peak_tflops"),
                          ("fp8_matmul_tflops", "fp8_peak_tflops")):
        rate, peak = getattr(d, key), getattr(d, peak_key)
        if rate is not None and peak is not None and rate > peak:
            problems.append((f"device.{key}", f"achieved {rate:g} TFLOP/s above device.{peak_key} "
                                              f"({peak:g}); an achieved rate is at most the peak"))
    if problems:
        raise ConfigError(path, problems)
    return System(node=built["system"], device=d, intra_node=built["intra_node"], inter_node=built["inter_node"],
                  source=str(path), experts=built["experts"])


def load_system(path: str | Path) -> System:
    """Read and check a system file; every failure is a ConfigError naming the file."""
    path = Path(path)
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(path, [("", f"file not found; pass a system file such as {EXAMPLE}")]) from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(path, [("", f"cannot read file: {e}; pass a system .toml")]) from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(path, [("", f"TOML syntax error: {e}")]) from None
    return parse_system(doc, path)
