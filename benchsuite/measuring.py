"""Measure your own training loop: the harness's meters, step timing and record around a loop benchsuite
did not build (torchtitan, Lightning, a Hugging Face Trainer, a plain loop).

    with benchsuite.measure("my-gpt", flops_per_token=6 * n_params, tokens_per_step=batch * seq_len) as m:
        for batch in loader:
            train_step(batch)
            m.step()                                    # ends one step: a timer mark, no device sync
            if time_to_evaluate:
                with m.window("eval", training=False):  # its time in no step, its energy not the record's
                    evaluate()

The harness's own pieces (benchsuite/worker.py): a StepTimer (CUDA events or perf_counter marks, read once
at the end, so a step never synchronises the device), the NodeEnergyMonitor's named windows (NVML counter
of each GPU by UUID, RAPL, else codecarbon's estimate; every figure labelled with its source; the device
synchronised at window edges only), the training segments between evaluations summed (energy/windows.py),
attribution over every rank (each physical GPU and each node's CPU/DRAM once), the carbon section, the
sanity flags. Under torchrun every rank calls it inside the job's process group; rank 0 gathers every
rank's figures and writes one record of kind "user", which report, compare, export, carbon project and the
dashboard read as any run. What benchsuite cannot know about a loop it did not build (model FLOPs unless
given, hardware and counted FLOPs, the matmul ceiling, communication, parameters) is null, the reason in
metrics.reasons.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

import torch
import torch.distributed as dist

from benchsuite import config as cfg
from benchsuite.device import peak_memory, pick_device, resolve_precision
from benchsuite.energy.attribution import attribute_energy
from benchsuite.energy.carbon import record_carbon
from benchsuite.energy.meters import NodeEnergyMonitor
from benchsuite.energy.windows import combine_windows
from benchsuite.environment import device_info, hardware_identity
from benchsuite.metrics import flops as fl
from benchsuite.metrics.energy import derived_metrics
from benchsuite.metrics.timing import StepTimer, summarize
from benchsuite.record import SCHEMA_VERSION, record_filename, utc_now, write_record
from benchsuite.record.sanity import finite_or_none, sanity_flags
from benchsuite.record.types import Kind
from benchsuite.record.names import digest

SUITE = "user"
PRECISIONS = ("fp32", "bf16")  # the peak table's columns (metrics/flops.py)
UNKNOWN = {  # what a loop benchsuite did not build cannot tell it, by the field it leaves null
    "hardware_per_token": "not known in a user's loop (recompute and padding are the loop's own)",
    "counted_per_token": "not counted in a user's loop (benchsuite counts FlopCounterMode over a step it runs)",
    "matmul_ceiling": "not measured in a user's loop (the harness measures it after its warm-up steps)",
}


@dataclass(frozen=True)
class Window:
    """One window on this rank (Zeus's Measurement): its seconds and its energy as the record's energy
    section has it (each part with its source, each GPU by UUID, None with a reason where unmeasured)."""

    name: str
    seconds: float
    energy: dict  # attribution.attribute_energy over this one window

    @property
    def total_j(self) -> float | None:
        return self.energy["total_j"]

    @property
    def source(self) -> str:
        return self.energy["source"]

    @property
    def bound(self) -> dict | None:
        """Where the window's true total energy lies as the meters can tell (energy/bounds.py): low_j, high_j,
        share, parts, exceeds and reason; None where a part has no figure."""
        return self.energy["bounds"]["total"]


@dataclass(frozen=True)
class RankFigures:
    """What one rank measured in the loop, gathered to rank 0 (the harness's RankResult for a user's loop)."""

    rank: int
    node_rank: int
    device: dict  # environment.device_info
    step_times_s: list[float]  # each measured step on this rank
    tokens: list[int | None]  # each measured step's tokens as given (None: the default tokens_per_step)
    losses: list[float | None]
    memory: dict  # device.peak_memory
    energy_window: dict  # the training segments combined (energy/windows.py)
    left_out: list[Window]  # the windows outside training (training=False), in order


@dataclass(frozen=True)
class JobFacts:
    """What holds for the whole measurement, known on rank 0 (the harness's RunFacts)."""

    world_size: int
    backend: str | None  # the process group's; None for a world of one
    precision: str
    peak_flops: float | None
    peak_source: str


def _checked(cls, value, where: str):
    """A CarbonConfig or EnergyConfig from itself, a dict of its keys or None, checked as a suite's [carbon]
    and [energy] are (config.py): a mistyped country must not silently become the world average."""
    if value is None:
        return cls()
    problems: list = []
    section, refused = cfg._build_section(cls, asdict(value) if isinstance(value, cls) else value, where, problems)
    if cls is cfg.CarbonConfig:
        cfg._check_carbon(section, {f"carbon.{k}" for k in refused}, where, problems)
    if problems:
        raise cfg.ConfigError(f"benchsuite.measure({where}=...)", problems)
    return section


def _positive(name: str, value: float | None) -> None:
    if value is not None and not (isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0):
        raise ValueError(f"benchsuite.measure: {name} must be a positive number, got {value!r}")


def _world() -> tuple[int, int, str | None]:
    """(rank, world size, backend) of the job's process group; a world of one without one. Under torchrun
    the group must exist before measure() starts: rank 0 gathers every rank's figures over it."""
    if dist.is_available() and dist.is_initialized():
        world = dist.get_world_size()
        return dist.get_rank(), world, dist.get_backend() if world > 1 else None
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise RuntimeError("benchsuite.measure under torchrun: call torch.distributed.init_process_group() before "
                           "measure() starts; rank 0 gathers every rank's figures over the job's process group")
    return 0, 1, None


class Measurement:
    """One measured training job on this rank: start() (or `with`), step() after each optimizer step,
    windows that nest (begin/end or `with window(...)`), stop() writes the record on rank 0."""

    def __init__(self, name: str, *, flops_per_token: float | None, tokens_per_step: int | None, out: str | Path,
                 carbon: cfg.CarbonConfig, energy: cfg.EnergyConfig, description: str, suite: str,
                 warmup_steps: int, precision: str | None, peak_tflops: float | None, device: torch.device | None):
        self.name, self.flops_per_token, self.tokens_per_step = name, flops_per_token, tokens_per_step
        self.out, self.carbon, self.energy, self.description, self.suite = Path(out), carbon, energy, description, suite
        self.warmup_steps, self.precision, self.peak_tflops, self.device = warmup_steps, precision, peak_tflops, device
        self.windows: list[Window] = []  # every window this rank closed, in order
        self.record: dict | None = None  # rank 0's record once stopped
        self.path: Path | None = None  # where rank 0 wrote it
        self._monitor: NodeEnergyMonitor | None = None
        self._timer: StepTimer | None = None
        self._tokens: list = []
        self._losses: list = []
        self._segments: list[dict] = []  # the closed training segments' windows
        self._segment: str | None = None  # the open training segment
        self._outside: str | None = None  # the open window outside training
        self._open: list[str] = []  # the user's open windows, in the order begun
        self._left_out: list[Window] = []
        self._warmup_left = warmup_steps

    # -- the job ---------------------------------------------------------------------------------

    def start(self) -> Measurement:
        """Open the measurement: meters on this rank's device, the first training segment (after the
        warm-up steps, if any). Every rank of the job calls it."""
        self.rank, self.world_size, self.backend = _world()
        if self.device is None:
            self.device = pick_device(int(os.environ.get("LOCAL_RANK", "0")))[0]
        self.precision = self.precision or resolve_precision("auto", self.device)
        self.started_at, self._t0 = utc_now(), time.perf_counter()
        # On GPU the NVML counter is the figure; integrated power samples ride along as its cross-check.
        self._monitor = NodeEnergyMonitor.create([self.device], self.energy, rank=self.rank,
                                                 sample_power=self.device.type == "cuda")
        if self.energy.idle_baseline_s > 0:
            self._monitor.measure_idle(self.energy.idle_baseline_s)
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        self._timer = StepTimer(self.device)
        if self._warmup_left == 0:
            self._open_segment()
        return self

    def step(self, tokens: int | torch.Tensor | None = None, loss: float | torch.Tensor | None = None) -> None:
        """End one training step (call it after the optimizer step). A step runs from the end of the one
        before (or the start of training, or begin_step()) to here: one timer mark, read at stop(), never a
        device sync. tokens: the step's tokens over the whole job (every rank's batch; default
        tokens_per_step); loss: the step's loss. Either may be a device tensor: it is read at stop()."""
        if self._warmup_left:
            self._warmup_left -= 1
            if self._warmup_left == 0 and self._outside is None:
                self._open_segment()
            return
        if self._segment is None:
            raise RuntimeError(f"step() inside window {self._outside!r}, which is outside training (training=False)")
        self._timer.mark()
        self._tokens.append(tokens)
        self._losses.append(loss.detach() if isinstance(loss, torch.Tensor) else loss)

    def begin_step(self) -> None:
        """Start a step here rather than at the end of the one before (a window per step, as a framework's
        step-begin hook gives): the time since is in no step."""
        if self._segment is not None:
            self._timer.pause()
            self._timer.mark()

    def stop(self) -> dict | None:
        """Close the measurement: the windows still open, the meters; gather every rank's figures to rank 0,
        which writes the record (returned; None on the other ranks). Every rank of the job calls it."""
        for name in reversed(list(self._open)):  # a window left open ends with the job
            self.end(name)
        if self._segment is not None:
            self._close_segment()
        self._monitor.close()
        if not self._segments:
            raise RuntimeError(f"benchsuite.measure({self.name!r}): the loop ended during its {self.warmup_steps} "
                               f"warm-up steps; nothing was measured")
        ranks = self._gather(self._figures())
        if self.rank == 0:
            facts = self._facts(ranks[0].device)
            self.record = user_record(self, facts, ranks, duration_s=time.perf_counter() - self._t0)
            self.path = write_record(self.out, self.record)
        return self.record

    def __enter__(self) -> Measurement:
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.stop()
        else:  # the loop failed: nothing to gather (another rank may never get here), no record
            self._monitor.close()

    # -- windows ---------------------------------------------------------------------------------

    def begin(self, name: str, *, training: bool = True) -> None:
        """Open window `name` on this rank (the device synchronised first). Windows nest and overlap, as
        Zeus's do. training=False: a window outside training (an evaluation, a checkpoint): the training
        segment ends at its start and a new one begins at its end, so its time is in no step and its energy
        is left out of the record's, as the harness leaves its evaluations out."""
        if name.startswith("__"):
            raise ValueError(f"window name {name!r}: names starting with '__' are benchsuite's own")
        if name in self._open:
            raise ValueError(f"window {name!r} is already open")
        if not training:
            if self._outside is not None:
                raise ValueError(f"window {name!r} outside training opened inside {self._outside!r}, also outside")
            if self._segment is not None:
                self._close_segment()
            self._outside = name
        self._monitor.begin(name)
        self._open.append(name)

    def end(self, name: str) -> Window:
        """Close window `name` and return what this rank measured over it."""
        result = self._monitor.end(name)
        self._open.remove(name)
        window = Window(name, result.window_s, attribute_energy([result.to_dict()]))
        self.windows.append(window)
        if name == self._outside:
            self._left_out.append(window)
            self._outside = None
            if not self._warmup_left:
                self._open_segment()
        return window

    @contextlib.contextmanager
    def window(self, name: str, *, training: bool = True) -> Iterator[None]:
        """`with m.window(name):` begin(name) ... end(name); the result is m.windows[-1] after it."""
        self.begin(name, training=training)
        try:
            yield
        finally:
            self.end(name)

    # -- inside ----------------------------------------------------------------------------------

    def _open_segment(self) -> None:
        self._segment = f"__train-{len(self._segments)}"
        self._monitor.begin(self._segment)  # a window edge synchronises the device
        self._timer.mark()

    def _close_segment(self) -> None:
        self._timer.pause()
        self._segments.append(self._monitor.end(self._segment).to_dict())
        self._segment = None

    def _figures(self) -> RankFigures:
        """This rank's figures: the step times (the one device sync), the tokens and losses read."""
        times = self._timer.durations_s()
        return RankFigures(
            rank=self.rank, node_rank=int(os.environ.get("GROUP_RANK", "0")), device=device_info(self.device),
            step_times_s=times, tokens=[None if t is None else int(t) for t in self._tokens],
            losses=[None if v is None else float(v) for v in self._losses], memory=peak_memory(self.device),
            energy_window=combine_windows(self._segments, "measure", self.energy.min_window_s),
            left_out=self._left_out)

    def _gather(self, mine: RankFigures) -> list[RankFigures]:
        """Every rank's figures on rank 0, in rank order (a list of one in a world of one)."""
        if self.world_size == 1:
            return [mine]
        out = [None] * self.world_size if self.rank == 0 else None
        dist.gather_object(mine, out, dst=0)
        return out

    def _facts(self, device: dict) -> JobFacts:
        peak, peak_source = fl.peak_flops(device["name"], self.precision, self.peak_tflops)
        return JobFacts(self.world_size, self.backend, self.precision, peak, peak_source)


def measure(name: str, *, flops_per_token: float | None = None, tokens_per_step: int | None = None,
            out: str | Path = "results", carbon: cfg.CarbonConfig | dict | None = None,
            energy: cfg.EnergyConfig | dict | None = None, description: str = "", suite: str = SUITE,
            warmup_steps: int = 0, precision: str | None = None, peak_tflops: float | None = None,
            device: torch.device | str | None = None) -> Measurement:
    """Measure a training job: `with benchsuite.measure(name, ...) as m:` around it, m.step() after each
    optimizer step. Every argument is checked here, before anything runs.

    flops_per_token: model FLOPs per token (forward + backward, no recompute) for MFU; None: MFU is null.
    tokens_per_step: tokens of one step over the whole job (global batch × sequence length); m.step(tokens=)
    gives a step's own. out: the results folder. carbon / energy: a suite's [carbon] / [energy] (config.py),
    as the dataclass or a dict of its keys. description: the model, in words. warmup_steps: steps left out
    of the figures (compilation, allocator warm-up). precision: "bf16" or "fp32", the peak MFU divides by
    (default: bf16 on GPU, fp32 on CPU); peak_tflops: a peak of your own. device: this rank's (default: the
    harness's choice, LOCAL_RANK's GPU, else the CPU)."""
    problem = cfg.name_problem(name) if isinstance(name, str) and name.strip() else "must be a non-empty string"
    if problem:
        raise ValueError(f"benchsuite.measure: name {name!r} {problem}")
    _positive("flops_per_token", flops_per_token)
    _positive("tokens_per_step", tokens_per_step)
    _positive("peak_tflops", peak_tflops)
    if not isinstance(warmup_steps, int) or warmup_steps < 0:
        raise ValueError(f"benchsuite.measure: warmup_steps must be an integer >= 0, got {warmup_steps!r}")
    if precision not in (None, *PRECISIONS):
        raise ValueError(f"benchsuite.measure: precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    return Measurement(name, flops_per_token=flops_per_token, tokens_per_step=tokens_per_step, out=out,
                       carbon=_checked(cfg.CarbonConfig, carbon, "carbon"),
                       energy=_checked(cfg.EnergyConfig, energy, "energy"), description=description, suite=suite,
                       warmup_steps=warmup_steps, precision=precision, peak_tflops=peak_tflops,
                       device=None if device is None else torch.device(device))


# ----------------------------------------------------------------------------- the record


def step_tokens(given: list[int | None], default: int | None) -> list[int | None]:
    """Each measured step's tokens: as given, else the default."""
    return [default if t is None else t for t in given]


def shares_a_gpu(ranks: list[RankFigures]) -> bool:
    """Several ranks on one GPU (by UUID): correct, but not a speed figure."""
    uuids = [r.device["uuid"] for r in ranks if r.device["type"] == "cuda"]
    return len(set(uuids)) < len(uuids)


def _per_rank(ranks: list[RankFigures]) -> dict | None:
    """metrics.per_rank: each rank's median step and the straggler ratio (None when a rank timed no step)."""
    medians = [statistics.median(r.step_times_s) for r in ranks if r.step_times_s]
    if len(medians) < len(ranks):
        return None
    return {"step_time_median_s": medians, "straggler_ratio": max(medians) / statistics.median(medians)}


def metrics_section(m: Measurement, facts: JobFacts, ranks: list[RankFigures], step_times: list[float],
                    tokens: list[int | None], energy: dict, carbon: dict, reasons: list[str]) -> dict:
    """The record's metrics by the harness's formulas (results/record.build_record), from what the loop
    told: the slowest rank's step times, rank 0's tokens, the given FLOPs per token."""
    summary = summarize(step_times) if step_times else None
    tokens_per_step = statistics.fmean(tokens) if tokens and None not in tokens else None
    tokens_per_s = tokens_per_step / summary["median"] if summary and tokens_per_step else None
    f = m.flops_per_token
    per_device = f * tokens_per_s / facts.world_size if f and tokens_per_s else None
    if not step_times:
        reasons.append("no step measured: call m.step() after each optimizer step")
    elif tokens_per_step is None:
        reasons.append("tokens per step not given (measure(tokens_per_step=) or m.step(tokens=)): tokens/s, MFU "
                       "and energy per token are null")
    if f is None:
        reasons.append("model FLOPs per token not given (measure(flops_per_token=)): MFU and TFLOP/s are null")
    if facts.peak_flops is None:
        reasons.append(f"no peak FLOP/s for this device, MFU is null (measure(peak_tflops=) gives one): "
                       f"{facts.peak_source}")
    reasons += [f"{key}: {why}" for key, why in UNKNOWN.items()]
    measured_tokens = sum(tokens) if tokens and None not in tokens else None
    memories = [r.memory for r in ranks]
    return {
        "tokens_per_s": tokens_per_s,
        "tokens_per_step": tokens_per_step,
        "step_time_s": summary,
        "flops": fl.record_flops(f, None, UNKNOWN["hardware_per_token"], None, UNKNOWN["counted_per_token"]),
        **fl.rate_figures(per_device, None, facts.peak_flops),
        "peak_tflops": facts.peak_flops / 1e12 if facts.peak_flops else None,
        "peak_source": facts.peak_source,
        "mfu_vs_ceiling_reason": UNKNOWN["matmul_ceiling"],
        "memory": {"peak_allocated_bytes": max((x["peak_allocated_bytes"] or 0) for x in memories) or None,
                   "peak_reserved_bytes": max((x["peak_reserved_bytes"] or 0) for x in memories) or None,
                   "source": memories[0]["source"], "per_rank": memories},
        "per_rank": _per_rank(ranks),
        "precision": facts.precision,
        "speed_valid": not shares_a_gpu(ranks),
        "energy": derived_metrics(energy, tokens=measured_tokens,
                                  model_flops=measured_tokens * f if measured_tokens and f else None, carbon=carbon),
        "reasons": reasons,
    }


def left_out_note(ranks: list[RankFigures]) -> str | None:
    """What the record's energy leaves out: rank 0's windows outside training, by name."""
    windows = ranks[0].left_out
    if not windows:
        return None
    names = ", ".join(dict.fromkeys(w.name for w in windows))
    return (f"{len(windows)} window(s) outside training ({names}; {sum(w.seconds for w in windows):.3g} s on rank 0) "
            f"left out of the energy, as the harness leaves its evaluations out")


def user_record(m: Measurement, facts: JobFacts, ranks: list[RankFigures], *, duration_s: float) -> dict:
    """The record of one measured user loop (rank 0), in the harness's schema: flagged by the sanity checks
    and made strict JSON."""
    from benchsuite.results.record import env_section

    reasons = []
    counts = {len(r.step_times_s) for r in ranks}
    if len(counts) > 1:
        reasons.append(f"ranks measured different numbers of steps ({sorted(counts)}): the first "
                       f"{min(counts)} are compared")
    step_times = [max(ts) for ts in zip(*(r.step_times_s for r in ranks))]  # a step ends when every rank is done
    tokens = step_tokens(ranks[0].tokens, m.tokens_per_step)[:len(step_times)]
    energy = attribute_energy([r.energy_window for r in ranks])
    note = left_out_note(ranks)
    if note:
        energy["reasons"].append(note)
    carbon = record_carbon(energy, m.carbon)
    config = {"world_size": facts.world_size, "nodes": len({r.node_rank for r in ranks}), "scaling": "weak",
              "suite": m.suite, "workload": m.name, "kind": Kind.USER.value, "description": m.description,
              "sweep_id": "", "model": None, "moe": None, "parallel": None, "train": None,
              "energy": asdict(m.energy), "carbon": asdict(m.carbon)}
    record = {"schema_version": SCHEMA_VERSION, "run_key": digest({"config": config, "hardware": hardware_identity()}),
              "suite": m.suite, "workload": m.name, "status": "ok", "error": None, "started_at": m.started_at,
              "duration_s": duration_s, "config": config,
              "env": env_section(facts, facts, ranks),  # it reads run.world_size and facts.backend: JobFacts has both
              "metrics": metrics_section(m, facts, ranks, step_times, tokens, energy, carbon, reasons),
              "energy": energy, "carbon": carbon,
              "steps": [{"step": i, "time_s": t, "loss": loss, "tokens": n}
                        for i, (t, loss, n) in enumerate(zip(step_times, ranks[0].losses, tokens))]}
    record["repeat"] = next_repeat(m.out, record)
    record["flags"] = sanity_flags(record)
    return finite_or_none(record)


def next_repeat(out: Path, record: dict) -> int:
    """The first repeat index of the record's run key with no file in out: measuring one loop again (same
    name and settings, same hardware) adds a repeat of its run, as `run --repeat` does."""
    repeat = 0
    while (out / record_filename({**record, "repeat": repeat})).exists():
        repeat += 1
    return repeat


__all__ = ["Measurement", "Window", "measure"]
