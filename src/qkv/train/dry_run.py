"""What a run will cost, measured before it starts (``qkv train RECIPE ... --dry-run``).

A dry run is the run itself, shortened: the same settings, data, tokenizer, model, batches,
loss, optimizer and schedule, in a temporary directory that is removed at the end
(:func:`dry_run` drives it through the run's own :meth:`~qkv.train.run.TrainingRun.start` and
:meth:`~qkv.train.run.TrainingRun.finish`). It measures, once each, what the real run repeats,
and what it does once:

- the preparation (data, tokenizer, model: everything before the first step);
- a few optimizer steps on the run's own batches: :data:`WARMUP_STEPS` first, untimed per step
  (the first steps allocate the optimizer's moments and, with ``train.compile``, compile), then
  :data:`MIN_STEPS` to :data:`MAX_STEPS` timed ones (until :data:`TIMED_SECONDS` have passed).
  Where an epoch's batches differ in length (a token budget per batch: translation, the
  protein and text tasks), the steps take a sample of every length (:func:`spread`), the
  longest batch among them;
- one validation pass (with the ``best.safetensors`` it writes), one checkpoint
  (``train_state.pt`` and ``last.safetensors``), one snapshot, one epoch's batches;
- the end of the run, whole: the recipe's final weights and summary (test scores, samples,
  baselines), on the weights of the few steps.

:func:`plan_run` turns these into the run's estimate: the steps its budgets allow (a time budget,
``train.max_minutes``, counts validations and checkpoints too: the loop's clock runs through
them), the validations and checkpoints that follow from ``train.eval_every`` and
``train.snapshot_minutes``, and the wall time. Memory is measured, not estimated: the peak of
the process, whose batches, validation and end are the real run's.

What the few steps cannot know: how long a model that has learnt makes its outputs, where
validation or the summary generates text (translation's greedy BLEU, captioning, a test set
decoded with beam search): decoding stops at ``eos``, which a model of a few steps may emit
sooner or later than a trained one. And on the CPU with glibc's allocator, a run over batches of
many shapes keeps growing its resident set for its first hundred steps or so (freed blocks of
one size that the next shapes do not fit), beyond what a short dry run sees.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import math
import os
import random
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from .. import cpu_share, distributed
from ..errors import QkvError
from ..runs.record import prepare_run_dir
from .checkpointer import Checkpointer, LoopState
from .loop import start_loop, validate_and_keep_best
from .metrics import TrainMetrics
from .run import TrainingRun
from .step import Stepper
from .train_settings import TrainSettings
from .train_state import check_state

logger = logging.getLogger(__name__)

WARMUP_STEPS = 2
MIN_STEPS = 5
MAX_STEPS = 20
TIMED_SECONDS = 20.0


@dataclass(frozen=True)
class Timings:
    """Seconds a dry run measured.

    Attributes:
        startup_s: the process's start to the run's (interpreter, imports, the command line);
            0 where unknown (a dry run from Python).
        prepare_s: the run's checks, data, tokenizer and model, up to its first step.
        batches_s: one epoch's batches (the real run makes them at every epoch's start).
        warmup_steps / warmup_s: the first optimizer steps and their seconds together.
        timed_steps / step_s: the steps timed after them and their mean seconds each.
        targets_per_s: the loss's targets (tokens, examples) per second of the timed steps.
        save_s: one checkpoint (``train_state.pt`` and ``last.safetensors``).
        validation_s: one validation pass, ``best.safetensors`` included.
        snapshot_s: one snapshot for averaging.
        final_s: the end of the run: the final weights, the summary and ``summary.json``.
    """

    startup_s: float
    prepare_s: float
    batches_s: float
    warmup_steps: int
    warmup_s: float
    timed_steps: int
    step_s: float
    targets_per_s: float
    save_s: float
    validation_s: float
    snapshot_s: float
    final_s: float

    def steps_s(self, k: int) -> float:
        """Seconds of ``k`` optimizer steps from the first (the warm-up's cost included)."""
        w = min(k, self.warmup_steps)
        first = self.warmup_s * w / self.warmup_steps if self.warmup_steps else 0.0
        return first + (k - w) * self.step_s


@dataclass(frozen=True)
class Plan:
    """What a run's settings imply, with a dry run's :class:`Timings`.

    Attributes:
        steps: the optimizer steps it makes (``None``: no budget, it trains until stopped).
        bound: what ends it: ``"max_steps"``, ``"max_epochs"``, ``"max_minutes"`` (those
            ``train`` settings), ``"one_epoch"`` (the sequence-classification recipes' budget
            when none is set); ``None`` without a budget.
        step_budget: the steps the step and epoch budgets allow (``None``: unlimited); fewer
            when the time budget binds.
        steps_per_epoch: optimizer steps in one pass over the training data.
        validations: validation passes in the loop (the last step's included).
        snapshots / checkpoints: snapshots and checkpoint saves the loop writes.
        train_s: the training loop's clock at the end of the last step (steps, validations,
            checkpoints; ``summary.json``'s ``train_minutes``).
        after_s: the loop's work after it: the last validation, snapshot and checkpoints.
        total_s: the run's seconds: preparation, loop and end of the run (``summary.json``'s
            ``total_minutes``).
        wall_s: the command's: ``total_s`` and the process's start-up (what ``time`` measures).
    """

    steps: int | None
    bound: str | None
    step_budget: int | None
    steps_per_epoch: int
    validations: int
    snapshots: int
    checkpoints: int
    train_s: float | None
    after_s: float | None
    total_s: float | None
    wall_s: float | None

    @property
    def epochs(self) -> float | None:
        """Passes over the training data (``None`` without a budget)."""
        return None if self.steps is None else self.steps / self.steps_per_epoch


def plan_run(
    cfg: TrainSettings, steps_per_epoch: int, t: Timings, step_budget_key: str = "max_steps"
) -> Plan:
    """The steps, validations, checkpoints and seconds of a run of ``cfg`` (its ``max_steps``
    the run's step count, as :meth:`~qkv.train.run.TrainingRun.total_steps` resolved it)
    with the measured :class:`Timings` ``t``.

    The loop (:func:`qkv.train.loop.train_loop`) saves a checkpoint before its first step,
    makes an epoch's batches at each epoch's start, validates and saves after every
    ``eval_every``-th step, snapshots and saves every ``snapshot_minutes`` (after every step at
    0); at the end it validates the last step (unless it just did), snapshots and saves it. Its
    clock runs through all of it, and before each step it compares with ``max_minutes`` the
    clock as the step before ended (its backward pass, before what followed it): the first step
    that ends at or past the budget is the last. ``step_budget_key`` names the setting behind
    ``cfg.max_steps`` in :attr:`Plan.bound`.

    Raises:
        ValueError: ``steps_per_epoch`` below 1.
    """
    if steps_per_epoch < 1:
        raise ValueError(f"steps_per_epoch ({steps_per_epoch}) must be >= 1")
    budgets = {}
    if cfg.max_steps is not None:
        budgets[step_budget_key] = cfg.max_steps
    if cfg.max_epochs is not None:  # (the recipe may have counted them in steps already)
        by_epochs = cfg.max_epochs * steps_per_epoch
        budgets["max_epochs"] = min(by_epochs, budgets.get("max_epochs", by_epochs))
    bound = min(budgets, key=lambda k: budgets[k]) if budgets else None
    step_budget = budgets[bound] if bound is not None else None

    clock = _LoopClock(cfg, steps_per_epoch, t)
    steps = step_budget
    if cfg.max_minutes is not None:
        in_time = clock.first_step_at(cfg.max_minutes * 60, step_budget)
        if in_time is not None and (step_budget is None or in_time < step_budget):
            steps, bound = in_time, "max_minutes"
    if steps is None:
        return Plan(None, None, None, steps_per_epoch, 0, 0, 0, None, None, None, None)
    periodic_validations = steps // cfg.eval_every
    periodic_snapshots = clock.snapshots_before(steps + 1)
    train_s = clock.at_step(steps)
    # after the last step: one validation (periodic, with its save, or the final one), a
    # snapshot (periodic, with its save, or the final one) and the final save
    snapped_last = periodic_snapshots > clock.snapshots_before(steps)
    after_s = (
        t.validation_s
        + (t.save_s if steps % cfg.eval_every == 0 else 0.0)
        + t.snapshot_s
        + (t.save_s if snapped_last else 0.0)
        + t.save_s
    )
    total_s = t.prepare_s + train_s + after_s + t.final_s
    return Plan(
        steps=steps,
        bound=bound,
        step_budget=step_budget,
        steps_per_epoch=steps_per_epoch,
        validations=periodic_validations + (1 if steps % cfg.eval_every else 0),
        snapshots=periodic_snapshots + (0 if snapped_last else 1),
        checkpoints=2 + periodic_validations + periodic_snapshots,
        train_s=train_s,
        after_s=after_s,
        total_s=total_s,
        wall_s=t.startup_s + total_s,
    )


class _LoopClock:
    """The training loop's clock (seconds from its start) as :func:`plan_run` describes it."""

    def __init__(self, cfg: TrainSettings, steps_per_epoch: int, t: Timings) -> None:
        self.cfg, self.steps_per_epoch, self.t = cfg, steps_per_epoch, t

    def _without_snapshots(self, k: int) -> float:
        t = self.t
        return (
            t.save_s  # before the first step
            + math.ceil(k / self.steps_per_epoch) * t.batches_s
            + t.steps_s(k)
            + ((k - 1) // self.cfg.eval_every) * (t.validation_s + t.save_s)
        )

    def snapshots_before(self, k: int) -> int:
        """Snapshots taken after the steps before step ``k`` (the final one not counted)."""
        if self.cfg.snapshot_minutes == 0:
            return k - 1
        return int(self._without_snapshots(k - 1) // (self.cfg.snapshot_minutes * 60)) if k > 1 else 0

    def at_step(self, k: int) -> float:
        """The clock as step ``k`` (from 1) ends its backward pass: what the loop reads as the
        training time (``summary.json``'s ``train_minutes``) and checks the budget against."""
        return self._without_snapshots(k) + self.snapshots_before(k) * (self.t.snapshot_s + self.t.save_s)

    def first_step_at(self, budget_s: float, step_budget: int | None) -> int | None:
        """The first step whose clock reaches ``budget_s`` (the loop's last), at most
        ``step_budget``; ``None`` when the steps allowed end before it."""
        hi = self.t.warmup_steps + math.ceil(budget_s / max(self.t.step_s, 1e-9)) + 1
        if step_budget is not None:
            hi = min(hi, step_budget)
        if self.at_step(hi) < budget_s:
            return None
        lo = 1
        while lo < hi:  # at_step grows with k
            mid = (lo + hi) // 2
            if self.at_step(mid) >= budget_s:
                hi = mid
            else:
                lo = mid + 1
        return lo


@dataclass(frozen=True)
class Memory:
    """Peak memory of a dry run, in MiB (2**20 bytes).

    Attributes:
        peak_rss_mib: the process's peak resident set size (``getrusage``'s ``ru_maxrss``, what
            ``/usr/bin/time -v`` reports as "Maximum resident set size"), from the process's
            start, imports included; ``None`` where the platform has no ``resource`` module.
        cuda_allocated_mib / cuda_reserved_mib: on CUDA, the most memory tensors held
            (``torch.cuda.max_memory_allocated``) and the most the caching allocator reserved
            from the GPU (``max_memory_reserved``, what ``nvidia-smi`` sees, without the CUDA
            context), since the dry run started; ``None`` elsewhere.
    """

    peak_rss_mib: float | None
    cuda_allocated_mib: float | None = None
    cuda_reserved_mib: float | None = None


def peak_rss_mib() -> float | None:
    """The process's peak resident set size so far in MiB (``None``: not measurable here)."""
    try:
        import resource
    except ImportError:  # Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10  # bytes on macOS, KiB on Linux


def process_age_s() -> float:
    """Seconds since this process started (interpreter, imports), or 0 where unknown: what a
    command spends before its run starts, which the run it estimates spends too."""
    try:  # psutil is optional (and ships no types)
        psutil = importlib.import_module("psutil")
        return max(time.time() - psutil.Process().create_time(), 0.0)
    except ImportError:
        pass
    try:  # Linux without psutil: the start time in clock ticks after boot
        with open("/proc/self/stat", encoding="ascii") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime", encoding="ascii") as f:
            uptime = float(f.read().split()[0])
        return max(uptime - start_ticks / os.sysconf("SC_CLK_TCK"), 0.0)
    except (OSError, ValueError, IndexError, AttributeError):
        return 0.0


@dataclass(frozen=True)
class DryRun:
    """A dry run's report: the model, the measured speed and memory, and the run's estimate.

    Attributes:
        recipe / device / precision: the run's, as resolved on this machine.
        parameters / trainable_parameters: what the run's ``summary.json`` reports under these
            keys (the saved model's parameters; those that trained).
        frozen_parameters: parameters of the model in training that do not train (a probe's
            encoder, a LoRA run's pretrained weights).
        adapter_parameters: LoRA adapters: trained, then merged into the saved weights (so not
            among ``parameters``); 0 without them.
        target_unit: what the loss counts (``"tokens"``, ``"examples"``): the unit of
            :attr:`Timings.targets_per_s`.
        longest_batch: the padded length of the epoch's longest batch, which the dry run
            stepped on too (its memory is in the peak); ``None`` when batches are all alike or
            their lengths unknown (:func:`batch_lengths`).
        timings / plan / memory: what was measured and what the settings imply.
        seconds: the dry run's own duration.
        cpu_share: the machine's load while the dry run ran
            (:meth:`qkv.cpu_share.CpuShare.report`): its speed, and so the estimate, is that of
            this load; ``busy`` when other processes kept a CPU or more busy.
    """

    recipe: str
    device: str
    precision: str
    parameters: int
    trainable_parameters: int
    frozen_parameters: int
    adapter_parameters: int
    target_unit: str
    longest_batch: int | None
    timings: Timings
    plan: Plan
    memory: Memory
    seconds: float
    cpu_share: dict

    def to_dict(self) -> dict:
        """The report as JSON-ready values: the figures at the top level (``steps``,
        ``train_minutes`` and ``total_minutes`` estimate ``summary.json``'s keys of those
        names; ``wall_minutes`` adds the process's start-up), the measured seconds under
        ``"timings"``."""
        plan = self.plan

        def minutes(s: float | None) -> float | None:
            return None if s is None else round(s / 60, 2)

        return {
            "recipe": self.recipe,
            "device": self.device,
            "precision": self.precision,
            "parameters": self.parameters,
            "trainable_parameters": self.trainable_parameters,
            "frozen_parameters": self.frozen_parameters,
            "adapter_parameters": self.adapter_parameters,
            **asdict(self.memory),
            "seconds_per_step": self.timings.step_s,
            "targets_per_s": self.timings.targets_per_s,
            "target_unit": self.target_unit,
            "longest_batch": self.longest_batch,
            "steps": plan.steps,
            "bound": plan.bound,
            "step_budget": plan.step_budget,
            "steps_per_epoch": plan.steps_per_epoch,
            "epochs": None if plan.epochs is None else round(plan.epochs, 3),
            "validations": plan.validations,
            "snapshots": plan.snapshots,
            "checkpoints": plan.checkpoints,
            "train_minutes": minutes(plan.train_s),
            "total_minutes": minutes(plan.total_s),
            "wall_minutes": minutes(plan.wall_s),
            "timings": asdict(self.timings),
            "dry_run_seconds": round(self.seconds, 2),
            "cpu_share": self.cpu_share,
        }


def time_steps(
    stepper: Stepper,
    batches: Callable[[int], Sequence],
    first_epoch: Sequence,
    cfg: TrainSettings,
    state: LoopState,
    metrics: TrainMetrics,
    warmup_steps: int = WARMUP_STEPS,
    min_steps: int = MIN_STEPS,
    max_steps: int = MAX_STEPS,
    seconds: float = TIMED_SECONDS,
    lengths: list[int] | None = None,
) -> tuple[float, list[float], int]:
    """Make optimizer steps as the loop does (groups of ``cfg.accum_steps`` micro-batches;
    ``state`` counts them): ``warmup_steps``, then timed ones until ``max_steps``, or
    ``min_steps`` once ``seconds`` have passed.

    Which groups: with the padded ``lengths`` of ``first_epoch``'s batches, those starting at
    :func:`spread` (every length of the epoch, in a shuffled order), then, untimed unless it
    came up, the one starting at the longest batch, so that the peak memory is the epoch's;
    otherwise ``first_epoch``'s from its start, then ``batches(1)``'s, ...

    Returns:
        ``(seconds of the warm-up steps, seconds of each timed step, targets of the timed steps)``.

    Raises:
        QkvError: an epoch without batches. NonFiniteLoss: as the loop's steps.
    """
    if not len(first_epoch):
        raise QkvError("the first epoch has no training batches")
    accum = cfg.accum_steps
    starts = spread(lengths, warmup_steps + max_steps, cfg.seed) if lengths else []
    epoch_batches = first_epoch

    def next_group() -> Sequence:
        nonlocal epoch_batches
        if starts:
            i = starts[state.step % len(starts)]
            return first_epoch[i : i + accum]
        while state.batch_in_epoch >= len(epoch_batches):
            state.epoch += 1
            state.batch_in_epoch = 0
            epoch_batches = batches(state.epoch)
            if not len(epoch_batches):
                raise QkvError(f"epoch {state.epoch} has no training batches")
        group = epoch_batches[state.batch_in_epoch : state.batch_in_epoch + accum]
        state.batch_in_epoch += len(group)
        return group

    def one_step(group: Sequence) -> tuple[float, int]:
        started = time.perf_counter()
        stats = stepper(group, state)
        took = time.perf_counter() - started
        state.step += 1
        state.elapsed_s = stats.elapsed
        metrics.train_step(state, stats)
        return took, stats.tokens

    def step_next() -> tuple[float, int]:
        return one_step(next_group())

    warmup_s = sum(step_next()[0] for _ in range(warmup_steps))
    times: list[float] = []
    targets = 0
    while len(times) < max_steps and (len(times) < min_steps or sum(times) < seconds):
        took, n = step_next()
        times.append(took)
        targets += n
    if lengths:
        longest = max(range(len(lengths)), key=lengths.__getitem__)
        if longest not in starts[: state.step]:
            one_step(first_epoch[longest : longest + accum])  # for the peak memory, not timed
    return warmup_s, times, targets


def spread(lengths: list[int], k: int, seed: int) -> list[int]:
    """``k`` positions of ``lengths`` (batches' padded lengths) evenly spaced in length order:
    the shortest and the longest first (a dry run's warm-up steps: ``torch.compile`` compiles
    for a new shape there, not in the timed steps), then the others shuffled by ``seed``. A
    stratified sample of an epoch's batches: its mean step time varies less than that of ``k``
    batches taken at random, and its shapes are as various as the epoch's (the CPU allocator's
    resident set grows with them)."""
    by_length = sorted(range(len(lengths)), key=lengths.__getitem__)
    n, m = len(by_length), min(k, len(by_length))
    picks = [by_length[round(j * (n - 1) / max(m - 1, 1))] for j in range(m)]
    ends, middle = picks[:1] + picks[-1:] if m > 1 else picks, picks[1:-1]
    random.Random(seed).shuffle(middle)
    return ends + middle


def batch_lengths(epoch_batches: Sequence, length: Callable[[Any], int | None]) -> list[int] | None:
    """The padded length (by ``length``) of each batch of ``epoch_batches`` (a list: batches
    made on demand are not read); ``None`` where one is unknown or all are alike."""
    if not isinstance(epoch_batches, list) or not epoch_batches:
        return None
    lengths = [length(b) for b in epoch_batches]
    known = [n for n in lengths if n is not None]
    if len(known) < len(lengths) or min(known) == max(known):
        return None
    return known


def timed(fn: Callable[..., object], *args: object) -> float:
    """Seconds ``fn(*args)`` took."""
    started = time.perf_counter()
    fn(*args)
    return time.perf_counter() - started


@dataclass(frozen=True)
class Steps:
    """How many optimizer steps a dry run makes (:func:`time_steps`): ``warmup`` untimed, then
    ``least`` to ``most`` timed ones, until ``seconds`` have passed."""

    warmup: int = WARMUP_STEPS
    least: int = MIN_STEPS
    most: int = MAX_STEPS
    seconds: float = TIMED_SECONDS


def dry_run(
    run_class: type[TrainingRun],
    settings: Any,
    out: str | Path | None = None,
    *,
    startup_s: float = 0.0,
    steps: Steps = Steps(),
) -> DryRun:
    """What a run of ``settings`` into ``out`` will cost, measured on its own model, data and
    batches, writing nothing: ``out`` (optional) is checked as the run would check it, never
    created or changed; the run's files go to a temporary directory, removed at the end. The
    flow is the run's own (:meth:`~qkv.train.run.TrainingRun.start`, then ``steps`` optimizer
    steps instead of the budget, one validation, :meth:`~qkv.train.run.TrainingRun.finish`).

    Args:
        run_class: the recipe's run (:func:`qkv.train.run.run_class`).
        startup_s: seconds the process spent before (interpreter, imports), which the real
            run spends too (:func:`process_age_s`, from the CLI).

    Raises:
        QkvError: what the run would refuse (a non-empty ``out``, bad inputs), and under
            torchrun (a dry run is one process).
    """
    if distributed.context().enabled or int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:
        raise QkvError("--dry-run runs in one process: start it without torchrun")
    with _no_empty_torch_cache_left(), tempfile.TemporaryDirectory(prefix="qkv-dry-run-") as tmp:
        run = run_class(settings, Path(tmp) / "run", resume=False, progress=False)
        if out is not None:
            prepare_run_dir(out, False, run.name, check_state)
        logger.info(
            f"dry run in {tmp} (removed at the end): the run's data, model and batches, "
            f"{steps.warmup} + {steps.least}-{steps.most} steps, one validation, the end of the run"
        )
        return _rehearse(run, startup_s, steps)


@contextlib.contextmanager
def _no_empty_torch_cache_left() -> Iterator[None]:
    """Remove torch's compile cache folder after the dry run if the dry run made it and left it
    empty. (The first optimizer step imports ``torch._dynamo``, whose disk cache makes the folder,
    ``TORCHINDUCTOR_CACHE_DIR`` or ``<temp dir>/torchinductor_<user>``, whether or not anything
    is compiled.) One that existed before is left alone, and so is what a compiled dry run
    (``train.compile``) cached there: torch's cache, which the real run reuses."""
    before = _torch_cache_folders()
    try:
        yield
    finally:
        for folder in _torch_cache_folders() - before:
            for path in sorted([*folder.rglob("*"), folder], key=lambda p: len(p.parts), reverse=True):
                with contextlib.suppress(OSError):  # not empty (a cached compile), or not a folder
                    path.rmdir()


def _torch_cache_folders() -> set[Path]:
    """The compile cache folders of torch that exist: ``TORCHINDUCTOR_CACHE_DIR`` (torch sets it
    when it makes its default one) and ``torchinductor_*`` in the temporary directory. Found,
    not computed: importing torch's own function for the path makes the folder."""
    named = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    found = {p.absolute() for p in Path(tempfile.gettempdir()).glob("torchinductor_*")}
    return found | ({Path(named).absolute()} if named and Path(named).is_dir() else set())


def _rehearse(run: TrainingRun, startup_s: float, steps: Steps) -> DryRun:
    """The run in its (temporary) directory, shortened and timed."""
    started = time.perf_counter()
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # an earlier run in this process
        torch.cuda.reset_peak_memory_stats()
    model = run.start()
    train, optimizer, lr = run.loop_settings(model)
    in_training = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    prepare_s = time.perf_counter() - started
    # the loop's start for a new run: its checkpointer, every RNG seeded
    checkpoints, state = start_loop(
        model, optimizer, run.run_dir, train, run.score_key, run.higher_is_better, resume=False
    )
    stepper = Stepper(model, optimizer, lr, run.loss, train, run.context.precision, run.run_dir)
    model.train()
    with TrainMetrics(run.run_dir, train, state, resumed=False, progress=False) as metrics:
        timings, lengths, per_epoch = _time_the_loop(
            run, model, train, stepper, checkpoints, state, metrics, steps
        )
        timings = replace(timings, startup_s=startup_s, prepare_s=prepare_s)
        plan = plan_run(train, per_epoch, timings, run.step_budget_key())
        # the snapshots the run keeps (translation's final weights average them)
        for _ in range(min(plan.snapshots, train.keep_snapshots) - 1):
            checkpoints.snapshot(state)
        final_started = time.perf_counter()  # loss.png, drawn when the loop's metrics close
    summary = run.finish(model, state)
    timings = replace(timings, final_s=time.perf_counter() - final_started)
    return DryRun(
        recipe=run.name,
        device=str(run.device),
        precision=run.context.precision,
        parameters=summary["parameters"],
        trainable_parameters=summary["trainable_parameters"],
        frozen_parameters=in_training - trainable,
        adapter_parameters=max(in_training - summary["parameters"], 0),
        target_unit=run.target_unit,
        longest_batch=None if lengths is None else max(lengths),
        timings=timings,
        plan=plan_run(train, per_epoch, timings, run.step_budget_key()),
        memory=_memory(run.device),
        seconds=time.perf_counter() - started,
        cpu_share=_load_so_far(),
    )


def _time_the_loop(
    run: TrainingRun,
    model: torch.nn.Module,
    train: TrainSettings,
    stepper: Stepper,
    checkpoints: Checkpointer,
    state: LoopState,
    metrics: TrainMetrics,
    steps: Steps,
) -> tuple[Timings, list[int] | None, int]:
    """What the loop repeats, timed once each: a checkpoint, the first epoch's batches, the
    steps (:func:`time_steps`), a validation, a snapshot. Returns the timings (``startup_s``,
    ``prepare_s`` and ``final_s`` 0: the caller's), the first epoch's padded batch lengths
    (``None``: unknown) and the optimizer steps of an epoch."""
    saves = [timed(checkpoints.save, state)]
    t = time.perf_counter()
    first = run.batches(0)
    batches_s = time.perf_counter() - t
    lengths = batch_lengths(first, run.batch_length)
    warmup_s, step_times, targets = time_steps(
        stepper,
        run.batches,
        first,
        train,
        state,
        metrics,
        steps.warmup,
        steps.least,
        steps.most,
        steps.seconds,
        lengths,
    )
    validation_s = timed(validate_and_keep_best, model, run.validate, state, metrics, checkpoints)
    saves.append(timed(checkpoints.save, state))
    snapshot_s = timed(checkpoints.snapshot, state)
    timings = Timings(
        startup_s=0.0,
        prepare_s=0.0,
        batches_s=batches_s,
        warmup_steps=steps.warmup,
        warmup_s=warmup_s,
        timed_steps=len(step_times),
        step_s=sum(step_times) / len(step_times),
        targets_per_s=targets / max(sum(step_times), 1e-9),
        save_s=sum(saves) / len(saves),
        validation_s=validation_s,
        snapshot_s=snapshot_s,
        final_s=0.0,
    )
    return timings, lengths, math.ceil(len(first) / train.accum_steps)


def _memory(device: torch.device) -> Memory:
    cuda = device.type == "cuda"
    return Memory(
        peak_rss_mib(),
        torch.cuda.max_memory_allocated(device) / 2**20 if cuda else None,
        torch.cuda.max_memory_reserved(device) / 2**20 if cuda else None,
    )


def _load_so_far() -> dict:
    """The machine's load since the run started (:func:`qkv.cpu_share.start`), as one stretch:
    what a dry run's speed was measured under."""
    share = cpu_share.current()
    share.mark()
    return share.report()
