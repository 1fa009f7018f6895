"""The run record, defined once: every section and field a record holds, as typed, closed structs.

The worker's record passes through these types before it is written (a key they do not declare
fails the write, so a test catches it), the loader decodes every file into them after migrating
it (results/migrate.py), the shipped JSON Schema (`benchsuite schema`) is generated from them, and
the column list of `load()` derives from them. msgspec, not pydantic: one small compiled package
whose decoding of a 10,000-record folder costs milliseconds, with closed structs
(forbid_unknown_fields) and JSON Schema generation built in.

Conventions: a figure a run could not measure is null (never 0), with its reason in the field
beside it (`*_reason`) or in the section's `reasons`; numbers are finite (NaN and infinities are
refused: a record is strict JSON); units are in field names (`_j`, `_w`, `_s`, `_bytes`).
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from benchsuite.record.kinds import Source
from benchsuite.record.scalars import MAX_FLOAT, Count, Index, Int, Name, Num, Pue, Text, Time, doc
from benchsuite.record.sections import CarbonConfig, EnergyConfig, ModelConfig, MoEConfig, ParallelConfig, TrainConfig

SCHEMA_VERSION = 9




@dataclasses.dataclass(frozen=True)
class Bound:
    """A figure's physical range: record/sanity.py flags a value outside it, saying `why`. Not a decoding
    constraint: a record with an impossible figure still loads, flagged, so the reader sees it."""
    label: str
    why: str
    low: float | None = 0.0
    high: float | None = None
    above_low: bool = False  # the figure must exceed low (a step takes some time), not merely reach it


MAX_DEVICE_W = 2000.0  # average power of one GPU, or one node's CPU or DRAM, over a window
MFU_VS_CEILING_MAX = 1.05  # above the matmul ceiling measured on the same device, past timing noise
_FINITE = Meta(ge=-MAX_FLOAT, le=MAX_FLOAT, description="a finite number")
Joules = Annotated[float, _FINITE, Bound("energy", "a counter wrapped or was reset mid-window")]
Watts = Annotated[float, _FINITE, Bound("average power", f"one device, or one node's CPU or DRAM, draws at most "
                                        f"{MAX_DEVICE_W:g} W: a counter wrapped or the window is wrong",
                                        0.0, MAX_DEVICE_W)]
Power = Annotated[float, _FINITE, Bound("power", "a draw cannot be negative: a meter or an idle fit is wrong")]
Seconds = Annotated[float, _FINITE, Bound("time", "a step or window cannot take zero, negative or unbounded "
                                          "time: the timer is broken", above_low=True)]
Elapsed = Annotated[float, _FINITE, Bound("time", "elapsed time cannot be negative: the timer is broken")]
Rate = Annotated[float, _FINITE, Bound("throughput", "must be a positive finite number", above_low=True)]
Mfu = Annotated[float, _FINITE, Bound("MFU", "the device would be doing more FLOP/s than its datasheet peak "
                                      "(or, below 0, a step time or FLOP count is negative)", 0.0, 1.0)]
Hfu = Annotated[float, _FINITE, Bound("HFU", "the device would be executing more FLOP/s than its datasheet peak "
                                      "(or, below 0, a step time or FLOP count is negative)", 0.0, 1.0)]
VsCeiling = Annotated[float, _FINITE, Bound(
    "share of the matmul ceiling", "the run would beat the matmul ceiling measured on the same device: the ceiling "
    "measurement is unreliable (the device was busy while it was timed), not the run's step time", 0.0,
    MFU_VS_CEILING_MAX)]
FlopRate = Annotated[float, _FINITE, Bound("FLOP/s", "a rate of work cannot be negative")]
Peak = Annotated[float, _FINITE, Bound("peak FLOP/s", "a device's peak or ceiling is positive", above_low=True)]
PerToken = Annotated[float, _FINITE, Bound("FLOPs per token", "a token's training step does some work",
                                           above_low=True)]
Amount = Annotated[float, _FINITE, Bound("amount", "a count, size or total cannot be negative")]
Bytes = Annotated[float, _FINITE, Bound("bytes", "memory and traffic cannot be negative")]
Fraction = Annotated[float, _FINITE, Bound("fraction", "a share of tokens, slots or time lies in [0, 1]", 0.0, 1.0)]
Ratio = Annotated[float, _FINITE, Bound("ratio", "a ratio of non-negative figures cannot be negative")]
MaxOverMean = Annotated[float, _FINITE, Bound("max over mean", "the largest of several figures is at least their "
                                              "mean", 1.0)]
Loss = Annotated[float, _FINITE, Bound("loss", "cross-entropy and the router losses cannot be negative")]
PerWorkJ = Annotated[float, _FINITE, Bound("energy per unit of work", "energy cannot be negative: a counter "
                                           "wrapped or was reset mid-window")]
Grams = Annotated[float, _FINITE, Bound("CO2e", "emissions cannot be negative: a negative energy or grid "
                                        "intensity went into them")]
Intensity = Annotated[float, _FINITE, Bound("grid intensity", "grams of CO2e per kWh cannot be negative")]
Percent = Annotated[float, _FINITE, Bound("load", "a share in percent lies in [0, 100]", 0.0, 100.0)]


class Status(enum.StrEnum):
    OK = "ok"
    FAILED = "failed"


class Kind(enum.StrEnum):
    DENSE = "dense"
    MOE = "moe"
    USER = "user"  # measured in the user's own training loop (benchsuite.measure), not a model benchsuite built


class Scaling(enum.StrEnum):
    """Weak keeps micro_batch sequences per data-parallel rank; strong splits micro_batch over them."""
    WEAK = "weak"
    STRONG = "strong"


class Section(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, gc=False):
    """A closed part of the record: a key not declared here is an error, on write and on load. Never part of a
    reference cycle, so never tracked by the cyclic collector (gc=False): a folder of 10,000 records is
    millions of these, which each collection would otherwise walk."""


# ----------------------------------------------------------------------------- config (resolved)

class Config(Section):
    """The run's resolved config (config.RunConfig.to_dict); its hash with the hardware is the run key."""
    world_size: Count
    nodes: Count
    scaling: Scaling
    suite: Text | None = None
    workload: Text | None = None
    kind: Kind | None = None
    description: Text | None = None
    sweep_id: Text | None = None
    model: ModelConfig | None = None
    moe: MoEConfig | None = None
    parallel: ParallelConfig | None = None
    train: TrainConfig | None = None
    energy: EnergyConfig | None = None
    carbon: CarbonConfig | None = None


# ----------------------------------------------------------------------------- env

class Device(Section):
    """One rank's device: a GPU by name and UUID, or the CPU it ran on."""
    rank: Int | None = None
    node_rank: Int | None = None
    host: Text | None = None
    type: Text | None = None
    name: Text | None = None
    uuid: Text | None = None
    index: Int | None = None
    cpu_threads: Int | None = None


class Hardware(Section):
    """What makes two runs comparable (environment.hardware_identity), in a failed run's env."""
    gpus: list[Text] = []
    cpu: Text | None = None
    machine: Text | None = None


class Env(Section):
    hosts: list[Text] | None = None
    nodes: Int | None = None
    world_size: Int | None = None
    backend: Text | None = None
    devices: list[Device] | None = None
    torch: Text | None = None
    cuda: Text | None = None
    nccl: Text | None = None
    driver: Text | None = None
    python: Text | None = None
    git_commit: Text | None = None
    os: Text | None = None
    cpu_count: Int | None = None
    cpu_model: Text | None = None
    ram_total_gb: Num | None = None
    gpu_count: Int | None = None
    threads_per_rank: Int | None = None
    threads_source: Text | None = None
    hardware: Hardware | None = None


# ----------------------------------------------------------------------------- metrics

class StepTime(Section):
    """Seconds per step over the measured steps (the slowest rank's), ci95 of the median."""
    median: Seconds | None = None
    p10: Seconds | None = None
    p90: Seconds | None = None
    n: Int | None = None
    cv: Ratio | None = None  # sample standard deviation / mean: how steady the steps were
    ci95: Annotated[list[Num | None], Meta(min_length=2, max_length=2)] | None = None  # [low, high]


class Flops(Section):
    """Per token. Model FLOPs exclude recompute (MFU), hardware FLOPs count it (HFU)."""
    model_per_token: PerToken | None = None
    hardware_per_token: PerToken | None = None
    hardware_source: Text | None = None
    counted_per_token: Amount | None = None
    counted_source: Text | None = None
    upgraded_from: Text | None = None


class Params(Section):
    total: Amount | None = None
    active: Amount | None = None
    non_embedding: Amount | None = None


class PerRank(Section):
    step_time_median_s: list[Seconds] | None = None
    straggler_ratio: Ratio | None = None


class PrecisionPolicy(Section):
    """The dtype of each part of a training step ("fp32" | "bf16"): what parallel.zero.precision_policy gives a
    run and the record states."""
    params: Text | None = None  # stored parameters, the ones AdamW updates
    compute: Text | None = None  # matmuls (autocast)
    forward_params: Text | None = None  # parameters as the forward reads them (what FSDP2 gathers)
    gradients: Text | None = None  # gradients as kept and reduced
    residual: Text | None = None  # the residual stream between blocks


class MemoryParts(Section):
    params: Bytes | None = None
    grads: Bytes | None = None
    optimizer: Bytes | None = None
    total: Bytes | None = None


class PaperMemory(Section):
    K: Amount | None = None
    constants: Text | None = None
    formula: Text | None = None
    total: Bytes | None = None


class ModelStateBytes(Section):
    """Model-state bytes per device measured beside the ZeRO paper's formulas."""
    measured: MemoryParts | None = None
    analytic: MemoryParts | None = None
    measured_per_rank_total: list[Bytes | None] | None = None
    formula: Text | None = None
    method: Text | None = None
    note: Text | None = None
    paper: PaperMemory | None = None
    K: Amount | None = None
    N: Amount | None = None
    psi: Amount | None = None
    stage: Int | None = None
    tensor: Int | None = None
    ratio: Ratio | None = None


class ActivationEstimate(Section):
    none: Bytes | None = None
    selective: Bytes | None = None
    full: Bytes | None = None
    configured: Text | None = None
    formula: Text | None = None
    source: Text | None = None


class RankMemory(Section):
    peak_allocated_bytes: Bytes | None = None
    peak_reserved_bytes: Bytes | None = None
    peak_rss_bytes: Bytes | None = None
    source: Text | None = None


class Memory(Section):
    peak_allocated_bytes: Bytes | None = None
    peak_reserved_bytes: Bytes | None = None
    source: Text | None = None
    per_rank: list[RankMemory] | None = None
    model_state_bytes: ModelStateBytes | None = None
    activation_estimate_bytes: ActivationEstimate | None = None


class AllToAllBytes(Section):
    mean: Bytes | None = None
    min: Bytes | None = None
    max: Bytes | None = None
    per_rank_mean: list[Bytes] | None = None
    steps: Int | None = None
    source: Text | None = None


class Comm(Section):
    """Collective bytes per step, counted on the wire, beside the papers' formulas."""
    total_bytes_per_step: Bytes | None = None
    paper_bytes_per_step: Bytes | None = None
    ratio: Ratio | None = None
    paper_formula: Text | None = None
    method: Text | None = None
    note: Text | None = None
    bytes_per_step_by_kind: dict[Name, Bytes | None] | None = None
    payload_bytes_per_step_by_kind: dict[Name, Bytes | None] | None = None
    calls_per_step_by_kind: dict[Name, Amount | None] | None = None
    per_rank_total_bytes: list[Bytes] | None = None
    all_to_all_bytes_by_step: AllToAllBytes | None = None
    all_to_all_bytes_by_step_reason: Text | None = None


class MoEMetrics(Section):
    dropped_frac: Fraction | None = None
    padding_frac: Fraction | None = None
    load_max_over_mean: doc(MaxOverMean | None, "busiest expert ÷ mean (each rank's tokens, last measured step, mean "
                                                "over MoE layers and ranks)") = None
    aux_loss: Loss | None = None
    z_loss: Loss | None = None
    all_to_all_share: Fraction | None = None
    expert_impl: Text | None = None
    source: Text | None = None
    upgraded_from: Text | None = None
    expert_load: list[list[Amount]] | None = None  # [MoE layer][expert]
    tokens_per_expert: list[list[Amount]] | None = None  # [MoE layer][expert]
    tokens_per_expert_max: doc(Amount | None, "tokens of the busiest expert (all ranks' tokens, last measured step, "
                                              "busiest of any MoE layer)") = None
    tokens_per_expert_mean: doc(Amount | None, "tokens per expert (all ranks' tokens, last measured step, mean over "
                                               "MoE layers and experts)") = None
    imbalance_by_step: list[Ratio] | None = None
    imbalance_mean: doc(Ratio | None, "busiest expert ÷ mean (all ranks' tokens before capacity, mean over MoE "
                                      "layers, mean over measured steps)") = None
    imbalance_max: doc(Ratio | None, "busiest expert ÷ mean (all ranks' tokens before capacity, mean over MoE "
                                     "layers, worst measured step)") = None


class Pipeline(Section):
    stages: Int | None = None
    virtual_stages: Int | None = None
    microbatches: Int | None = None
    schedule: Text | None = None
    bubble_measured: Fraction | None = None
    bubble_per_rank: list[Fraction | None] | None = None
    bubble_formula: Fraction | None = None
    bubble_source: Text | None = None
    p2p_bytes_per_step: Bytes | None = None
    p2p_bytes_formula: Bytes | None = None
    p2p_source: Text | None = None
    activation_bytes_per_stage: Bytes | None = None
    activation_reason: Text | None = None


class DataFacts(Section):
    """The token source the run trained and evaluated on (data.describe)."""
    kind: Text | None = None
    corpus: Text | None = None
    tokens: Int | None = None
    train_tokens: Int | None = None
    val_tokens: Int | None = None
    sha256: Text | None = None
    vocab_size: Int | None = None
    seq_len: Int | None = None
    seed: Int | None = None


class CurvePoint(Section):
    step: Amount | None = None
    tokens: Amount | None = None
    seconds: Elapsed | None = None
    val_loss: Loss | None = None
    energy_j: Joules | None = None
    model_flops: Amount | None = None


class Quality(Section):
    """The validation curve and what it took to reach train.target_loss (metrics/quality.py)."""
    target_loss: Loss | None = None
    reached: bool | None = None
    reason: Text | None = None
    step: Amount | None = None
    reached_step: Int | None = None
    tokens: Amount | None = None
    seconds: Elapsed | None = None
    model_flops: Amount | None = None
    energy_j: Joules | None = None
    energy_bound: Interval | None = None  # the record's relative bound on its training energy, applied
    energy_reason: Text | None = None
    energy_source: Source | None = None
    co2e_g: Grams | None = None
    initial_val_loss: Loss | None = None
    final_val_loss: Loss | None = None
    best_val_loss: Loss | None = None
    best_step: Amount | None = None
    eval_every: Int | None = None
    eval_count: Int | None = None
    eval_rows: Int | None = None
    eval_tokens: Amount | None = None
    eval_seconds: Elapsed | None = None
    eval_energy_j: Joules | None = None
    counting: Text | None = None
    interpolation: Text | None = None
    data: DataFacts | None = None
    curve: list[CurvePoint] | None = None


class Interval(Section):
    """Where a figure proportional to an energy lies, as the meters bound that energy (high null: unbounded)."""
    low: Amount | None = None
    high: Amount | None = None


class PerWork(Section):
    """Energy and carbon per unit of work over the measured steps (metrics/energy.py)."""
    j_per_token: PerWorkJ | None = None
    j_per_pflop: PerWorkJ | None = None
    avg_w_per_device: Watts | None = None
    gco2e_per_mtok: Grams | None = None
    gpu_j_per_token: PerWorkJ | None = None
    gpu_j_per_token_reason: Text | None = None
    gpu_energy_source: Source | None = None
    energy_source: Source | None = None
    energy_includes: list[Text] | None = None
    j_per_token_bound: Interval | None = None  # from energy.bounds.total
    gpu_j_per_token_bound: Interval | None = None  # from energy.bounds.gpu


class Metrics(Section):
    tokens_per_s: Rate | None = None
    tokens_per_s_per_device: doc(Rate | None, "tokens per second per device: tokens_per_s ÷ the world size") = None
    tokens_per_step: Rate | None = None
    step_time_s: StepTime | None = None
    flops: Flops | None = None
    params: Params | None = None
    mfu: Mfu | None = None
    hfu: Hfu | None = None
    tflops_per_device: FlopRate | None = None
    hardware_tflops_per_device: FlopRate | None = None
    peak_tflops: Peak | None = None
    peak_source: Text | None = None
    matmul_ceiling_tflops: Peak | None = None
    matmul_ceiling_source: Text | None = None
    mfu_vs_ceiling: VsCeiling | None = None
    mfu_vs_ceiling_reason: Text | None = None
    memory: Memory | None = None
    comm: Comm | None = None
    per_rank: PerRank | None = None
    precision: Text | None = None
    precision_policy: PrecisionPolicy | None = None
    implementation: dict[Name, Text] | None = None  # applied wrapper by name, in order
    speed_valid: bool | None = None
    energy: PerWork | None = None
    moe: MoEMetrics | None = None
    pipeline: Pipeline | None = None
    quality: Quality | None = None
    reasons: list[Text] | None = None  # why figures are null that a user's loop could not tell (benchsuite.measure)


# ----------------------------------------------------------------------------- energy and carbon

class MeterDetail(Section):
    """What a meter adds to its figure: the estimate's inputs, RAPL zones, NVML's power API, and what its
    bound needs (energy/bounds.py): edges, the samples' range, the counter's range."""
    watts: Power | None = None
    load_percent: Percent | None = None
    cpu_max_w: Power | None = None
    windows: Int | None = None
    power_api: Text | None = None
    rapl_zones: list[Text] | None = None
    counter_edge_s: Elapsed | None = None  # edges aligned to a counter update, each read within this
    sample_min_w: Power | None = None
    sample_max_w: Power | None = None
    rapl_range_j: Joules | None = None


class BoundPart(Section):
    """One source of a figure's error, as a half-width in joules (null: named but not quantifiable)."""
    part: Text
    j: Joules | None = None
    basis: Text | None = None  # how it was set, with its source


class EnergyBound(Section):
    """Where the true energy lies, as the meters can tell: [low_j, high_j] (high null: unbounded), the
    half-width's share of the figure, its parts, and whether it is flagged (above BOUND_SHARE, a short
    window, a possibly missed counter wrap) with why."""
    low_j: Joules | None = None
    high_j: Joules | None = None
    share: Ratio | None = None
    parts: list[BoundPart] = []
    exceeds: bool = False
    reason: Text | None = None


class EnergyBounds(Section):
    gpu: EnergyBound | None = None
    cpu: EnergyBound | None = None
    dram: EnergyBound | None = None
    total: EnergyBound | None = None


class PartEnergy(Section):
    """One node's CPU or DRAM over the energy window, read by one rank."""
    energy_j: Joules | None = None
    avg_w: Watts | None = None
    idle_w: Power | None = None
    above_idle_j: Num | None = None
    sampled_energy_j: Joules | None = None
    source: Source | None = None
    reason: Text | None = None
    reading_rank: Int | None = None
    detail: MeterDetail | None = None
    bound: EnergyBound | None = None


class DeviceEnergy(PartEnergy):
    """One physical GPU (by UUID, counted once whichever ranks share it)."""
    uuid: Text | None = None
    name: Text | None = None
    host: Text | None = None
    type: Text | None = None
    cuda_index: Int | None = None
    ranks: list[Int] | None = None


class NodeEnergy(Section):
    host: Text | None = None
    ranks: list[Int] | None = None
    cpu: PartEnergy | None = None
    dram: PartEnergy | None = None


class SourcesByPart(Section):
    gpu: Source | None = None
    cpu: Source | None = None
    dram: Source | None = None


class Energy(Section):
    """Joules over the measured steps' window; a part is null unless every device / node has a figure."""
    gpu_j: Joules | None = None
    cpu_j: Joules | None = None
    dram_j: Joules | None = None
    total_j: Joules | None = None
    total_includes: list[Text] | None = None
    source: Source | None = None
    sources: SourcesByPart | None = None
    window_s: Seconds | None = None
    short_window: bool | None = None
    idle_w: Power | None = None
    above_idle_j: Num | None = None
    idle_w_parts: dict[Name, Power | None] | None = None
    per_device: list[DeviceEnergy] | None = None
    per_node: list[NodeEnergy] | None = None
    reasons: list[Text] | None = None
    bounds: EnergyBounds | None = None  # of gpu_j, cpu_j, dram_j and total_j


class MarketBased(Section):
    """Scope 2 market-based: the same energy at the user's contractual factor, beside the location-based
    figure and never added to it (GHG Protocol Scope 2 Guidance)."""
    intensity_g_per_kwh: Intensity | None = None
    co2e_g: Grams | None = None
    source: Text | None = None
    reason: Text | None = None


class Embodied(Section):
    """Scope 3: the devices' manufacturing emissions spread over their service life, per device-hour used."""
    kg_per_device: Amount | None = None
    lifetime_years: Amount | None = None
    devices: Int | None = None
    device_hours: Amount | None = None
    co2e_g: Grams | None = None
    source: Text | None = None
    reason: Text | None = None


class Water(Section):
    """Litres: on-site (IT energy × WUE) and off-site (facility energy × the grid's water intensity)."""
    wue_l_per_kwh: Amount | None = None
    onsite_l: Amount | None = None
    grid_l_per_kwh: Amount | None = None
    offsite_l: Amount | None = None
    reason: Text | None = None


class Carbon(Section):
    """CO2e = kWh x PUE x grid intensity; the intensity's value and source are stated."""
    kwh: Joules | None = None
    pue: Pue = 1.0
    intensity_g_per_kwh: Intensity | None = None
    co2e_g: Grams | None = None
    intensity_source: Text | None = None
    intensity_note: Text | None = None
    energy_source: Source | None = None
    co2e_g_bound: Interval | None = None  # from the energy's bound (energy.bounds.total)
    market: MarketBased | None = None
    embodied: Embodied | None = None
    water: Water | None = None


# ----------------------------------------------------------------------------- the record

class Step(Section):
    """One measured step: its time (the slowest rank's), rank 0's loss, tokens, validation loss after it."""
    step: Int
    time_s: Seconds | None = None
    loss: Loss | None = None
    val_loss: Loss | None = None
    tokens: Int | None = None


class Flag(Section):
    """A figure no real run can produce (record/sanity.py): published with the reason, never silently."""
    field: Text
    value: Num | Text | bool | None = None
    reason: Text | None = None


class Error(Section):
    """What failed, where (rank) and why."""
    type: Text | None = None
    message: Text | None = None
    rank: Int | None = None
    traceback: Text | None = None
    log: Text | None = None


class Record(Section):
    """One run's measurement: a JSON file per run, the project's product."""
    schema_version: Literal[9]
    run_key: Text
    suite: Text
    workload: Text
    status: Status
    error: Error | None
    started_at: Time
    duration_s: Elapsed | None
    config: Config
    env: Env
    metrics: Metrics | None
    energy: Energy | None
    carbon: Carbon | None
    steps: list[Step]
    repeat: Index = 0  # which measurement of its run (0 to N-1 of `run --repeat N`)
    flags: list[Flag] = []
