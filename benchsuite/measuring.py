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
and the harness's record (benchsuite/assembly/: attribution over every rank, each physical GPU and each
node's CPU/DRAM once, the carbon section, the sanity flags). Under torchrun every rank calls it inside the
job's process group; rank 0 gathers every rank's figures (a RankResult each, as the worker's) and writes
one record of kind "user", which report, compare, export, carbon project and the dashboard read as any run.
What benchsuite cannot know about a loop it did not build (model FLOPs unless given, hardware and counted
FLOPs, the matmul ceiling, communication, parameters) is null, the reason in metrics.reasons.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import msgspec
import torch
import torch.distributed as dist

from benchsuite import config as cfg
from benchsuite.assembly import RankResult, RunFacts, UserLoop, user_record
from benchsuite.config.preflight import check_carbon
from benchsuite.config.problems import Problems
from benchsuite.config.sinks import Sinks, read_sinks
from benchsuite.config.specs import type_problem
from benchsuite.device import peak_memory, pick_device, resolve_precision
from benchsuite.energy.attribution import attribute_energy
from benchsuite.energy.meters import NodeEnergyMonitor
from benchsuite.energy.windows import combine_windows
from benchsuite.environment import device_info
from benchsuite.metrics import flops as fl
from benchsuite.metrics.timing import StepTimer
from benchsuite.record.scalars import NonNegativeInt, PositiveInt, PositiveNum
from benchsuite.record import Record, record_filename, to_dict, utc_now, write_record
from benchsuite.record.names import record_name
from benchsuite.sinks import Sender

SUITE = "user"
PRECISIONS = ("fp32", "bf16")  # the peak table's columns (metrics/flops.py)


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


def _checked(cls, value, where: str):
    """A CarbonConfig or EnergyConfig from itself, a dict of its keys or None, checked as a suite's [carbon]
    and [energy] are (benchsuite.config): a mistyped country must not silently become the world average."""
    if value is None:
        return cls()
    problems: list = []
    raw = msgspec.to_builtins(value) if isinstance(value, cls) else value
    section, refused = cfg.build_section(cls, raw, where, problems)
    if cls is cfg.CarbonConfig:
        check_carbon(section, {f"carbon.{k}" for k in refused}, where, problems)
    if problems:
        raise cfg.ConfigError(f"benchsuite.measure({where}=...)", problems)
    return section


def _checked_sinks(sinks: Sinks | dict | None) -> Sinks:
    """The trackers as a suite's [sinks] gives them, checked alike (an unknown sink, a package not installed)."""
    problems = Problems()
    chosen = read_sinks(msgspec.to_builtins(sinks) if isinstance(sinks, Sinks) else sinks, problems)
    problems.raise_any("benchsuite.measure(sinks=...)")
    return chosen


def _checked_value(name: str, value: object, value_type: object) -> None:
    """value judged as a suite's key of that type is (config.specs.type_problem); ValueError naming it."""
    problem = type_problem(value_type, value)
    if problem:
        raise ValueError(f"benchsuite.measure: {name} = {value!r}: {problem}")


def _named(what: str, name: object) -> str:
    """A name a person reads (the loop's, its suite's, a window's): a non-empty string with no invisible or
    control character, as a suite's names are checked."""
    problem = cfg.name_problem(name) if isinstance(name, str) and name.strip() else "must be a non-empty string"
    if problem:
        raise ValueError(f"benchsuite.measure: {what} {name!r} {problem}")
    return name


def _results_folder(out: object) -> Path:
    """out as a folder a record can be written to: a path that is no file, under a folder this process may
    write in, checked before the loop runs (a file there once failed only at stop(), the loop lost)."""
    if not isinstance(out, (str, os.PathLike)) or not str(out):
        raise ValueError(f"benchsuite.measure: out must be a folder path, got {out!r}")
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise ValueError(f"benchsuite.measure: out {str(path)!r} is a file, not a folder: give a results folder")
    parent = next((p for p in (path, *path.parents) if p.exists()), Path("."))
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"benchsuite.measure: out {str(path)!r}: {str(parent)!r} is not a folder this process "
                         f"can write in; give another results folder")
    return path


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

    def __init__(self, loop: UserLoop, *, out: str | Path, warmup_steps: int, precision: str | None,
                 peak_tflops: float | None, device: torch.device | None, sinks: Sinks = Sinks()):
        self.loop, self.out = loop, Path(out)
        self.sinks = sinks
        self.warmup_steps, self.precision, self.peak_tflops, self.device = warmup_steps, precision, peak_tflops, device
        self.windows: list[Window] = []  # every window this rank closed, in order
        self.record: Record | None = None  # rank 0's record once stopped
        self.path: Path | None = None  # where rank 0 wrote it
        self._monitor: NodeEnergyMonitor | None = None
        self._timer: StepTimer | None = None
        self._tokens: list = []
        self._losses: list = []
        self._segments: list[dict] = []  # the closed training segments' windows
        self._segment: str | None = None  # the open training segment
        self._outside: str | None = None  # the open window outside training
        self._open: list[str] = []  # the user's open windows, in the order begun
        self._left_out: list[dict] = []  # the energy windows outside training (training=False), in order
        self._warmup_left = warmup_steps

    # -- the job ---------------------------------------------------------------------------------

    def start(self) -> Measurement:
        """Open the measurement: meters on this rank's device, the first training segment (after the
        warm-up steps, if any). Every rank of the job calls it, once: a Measurement measures one job."""
        if self._monitor is not None:
            raise RuntimeError(f"benchsuite.measure({self.loop.name!r}) has measured a job already: a second "
                               f"start() or `with` would mix two jobs' steps; call benchsuite.measure() again")
        self.rank, self.world_size, self.backend = _world()
        if self.device is None:
            self.device = pick_device(int(os.environ.get("LOCAL_RANK", "0")))[0]
        self.precision = self.precision or resolve_precision("auto", self.device)
        self.started_at, self._t0 = utc_now(), time.perf_counter()
        # On GPU the NVML counter is the figure; integrated power samples ride along as its cross-check.
        self._monitor = NodeEnergyMonitor.create([self.device], self.loop.energy, rank=self.rank,
                                                 sample_power=self.device.type == "cuda")
        if self.loop.energy.idle_baseline_s > 0:
            self._monitor.measure_idle(self.loop.energy.idle_baseline_s)
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
        if tokens is not None and not isinstance(tokens, torch.Tensor):
            _checked_value("step(tokens=)", tokens, PositiveInt)
        if loss is not None and not isinstance(loss, torch.Tensor) and (
                isinstance(loss, bool) or not isinstance(loss, (int, float))):
            raise ValueError(f"benchsuite.measure: step(loss=) must be a number or a tensor, got {loss!r}")
        self._timer.mark()
        self._tokens.append(tokens)
        self._losses.append(loss.detach() if isinstance(loss, torch.Tensor) else loss)

    def begin_step(self) -> None:
        """Start a step here rather than at the end of the one before (a window per step, as a framework's
        step-begin hook gives): the time since is in no step."""
        if self._segment is not None:
            self._timer.pause()
            self._timer.mark()

    def stop(self) -> Record | None:
        """Close the measurement: the windows still open, the meters; gather every rank's figures to rank 0,
        which writes the record (returned; None on the other ranks). Every rank of the job calls it."""
        for name in reversed(list(self._open)):  # a window left open ends with the job
            self.end(name)
        if self._segment is not None:
            self._close_segment()
        self._monitor.close()
        if not self._segments:
            raise RuntimeError(f"benchsuite.measure({self.loop.name!r}): the loop ended during its "
                               f"{self.warmup_steps} warm-up steps; nothing was measured")
        ranks = self._gather(self._figures())
        if self.rank == 0:
            record = user_record(self.loop, self._facts(ranks), ranks, started_at=self.started_at,
                                 duration_s=time.perf_counter() - self._t0)
            self.record = next_repeat(self.out, record)
            self.path = write_record(self.out, self.record)
            Sender(self.sinks, self.out).send(self.record, record_name(self.loop.name, 0, self.record.repeat),
                                              self.path)
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
        _named("window name", name)
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
            self._left_out.append(result.to_dict())
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
        self._timer.resume()  # a step a window outside training split goes on: its two parts are its time

    def _close_segment(self) -> None:
        self._timer.suspend()
        self._segments.append(self._monitor.end(self._segment).to_dict())
        self._segment = None

    def _figures(self) -> RankResult:
        """This rank's figures: the step times (the one device sync), the tokens and losses read; what only
        the harness measures is None (assembly.inputs.UNKNOWN says why)."""
        times = self._timer.durations_s()
        return RankResult(
            rank=self.rank, node_rank=int(os.environ.get("GROUP_RANK", "0")), device=device_info(self.device),
            step_times_s=times, losses=[None if v is None else float(v) for v in self._losses],
            memory=peak_memory(self.device),
            energy_window=combine_windows(self._segments, "measure", self.loop.energy.min_window_s),
            tokens=[None if t is None else int(t) for t in self._tokens], left_out=self._left_out)

    def _gather(self, mine: RankResult) -> list[RankResult]:
        """Every rank's figures on rank 0, in rank order (a list of one in a world of one)."""
        if self.world_size == 1:
            return [mine]
        out = [None] * self.world_size if self.rank == 0 else None
        dist.gather_object(mine, out, dst=0)
        return out

    def _facts(self, ranks: list[RankResult]) -> RunFacts:
        """What holds for the whole job, on rank 0: rank 0's device's peak, ranks sharing a GPU."""
        peak, peak_source = fl.peak_flops(ranks[0].device["name"], self.precision, self.peak_tflops,
                                          option="measure(peak_tflops=)")
        return RunFacts(world_size=self.world_size, precision=self.precision, peak_flops=peak, peak_source=peak_source,
                        backend=self.backend, shared_device=shares_a_gpu(ranks))


def measure(name: str, *, flops_per_token: float | None = None, tokens_per_step: int | None = None,
            out: str | Path = "results", carbon: cfg.CarbonConfig | dict | None = None,
            energy: cfg.EnergyConfig | dict | None = None, description: str = "", suite: str = SUITE,
            warmup_steps: int = 0, precision: str | None = None, peak_tflops: float | None = None,
            device: torch.device | str | None = None, sinks: Sinks | dict | None = None) -> Measurement:
    """Measure a training job: `with benchsuite.measure(name, ...) as m:` around it, m.step() after each
    optimizer step. Every argument is checked here, before anything runs.

    flops_per_token: model FLOPs per token (forward + backward, no recompute) for MFU; None: MFU is null.
    tokens_per_step: tokens of one step over the whole job (global batch × sequence length); m.step(tokens=)
    gives a step's own. out: the results folder. carbon / energy: a suite's [carbon] / [energy] (benchsuite.config),
    as the dataclass or a dict of its keys. description: the model, in words. warmup_steps: steps left out
    of the figures (compilation, allocator warm-up). precision: "bf16" or "fp32", the peak MFU divides by
    (default: bf16 on GPU, fp32 on CPU); peak_tflops: a peak of your own. device: this rank's (default: the
    harness's choice, LOCAL_RANK's GPU, else the CPU). sinks: trackers the record is sent to once written, a
    suite's [sinks] (benchsuite.config.sinks) as the Sinks value or a dict of its tables."""
    _named("name", name)
    _named("suite", suite)
    if not isinstance(description, str):
        raise ValueError(f"benchsuite.measure: description must be a string, got {description!r}")
    for arg, value, value_type in (("flops_per_token", flops_per_token, PositiveNum | None),
                                   ("tokens_per_step", tokens_per_step, PositiveInt | None),
                                   ("peak_tflops", peak_tflops, PositiveNum | None),
                                   ("warmup_steps", warmup_steps, NonNegativeInt)):
        _checked_value(arg, value, value_type)
    if precision not in (None, *PRECISIONS):
        raise ValueError(f"benchsuite.measure: precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    loop = UserLoop(name, suite, description, flops_per_token, tokens_per_step,
                    carbon=_checked(cfg.CarbonConfig, carbon, "carbon"),
                    energy=_checked(cfg.EnergyConfig, energy, "energy"))
    return Measurement(loop, out=_results_folder(out), warmup_steps=warmup_steps, precision=precision,
                       peak_tflops=peak_tflops, device=_device(device), sinks=_checked_sinks(sinks))


def _device(device: object) -> torch.device | None:
    """None (the harness's choice), or this rank's device as a torch.device or its name ("cuda:1", "cpu")."""
    if device is None or isinstance(device, torch.device):
        return device
    try:
        return torch.device(device)
    except (RuntimeError, TypeError, ValueError) as e:
        raise ValueError(f"benchsuite.measure: device {device!r} is not a device torch knows ({e})") from None


# ----------------------------------------------------------------------------- the record


def shares_a_gpu(ranks: list[RankResult]) -> bool:
    """Several ranks on one GPU (by UUID): correct, but not a speed figure."""
    uuids = [r.device["uuid"] for r in ranks if r.device["type"] == "cuda"]
    return len(set(uuids)) < len(uuids)


def next_repeat(out: Path, record: Record) -> Record:
    """The record as the first repeat of its run key with no file in out: measuring one loop again (same
    name and settings, same hardware) adds a repeat of its run, as `run --repeat` does."""
    doc, repeat = to_dict(record), 0
    while (out / record_filename({**doc, "repeat": repeat})).exists():
        repeat += 1
    return msgspec.structs.replace(record, repeat=repeat)


__all__ = ["Measurement", "Window", "measure"]
