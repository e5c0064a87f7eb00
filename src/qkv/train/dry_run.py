"""What a run will cost, measured before it starts (``qkv train RECIPE ... --dry-run``).

A dry run is the run itself, shortened, in a temporary directory removed at the end: the run's
:meth:`~qkv.train.run.TrainingRun.start`, its training loop (:func:`~qkv.train.loop.train_loop`:
settings, data, model, batches, loss, optimizer) under a budget of a few steps (:class:`Steps`),
and its :meth:`~qkv.train.run.TrainingRun.finish` (final weights, summary, test scores). The
loop's clock is read as it goes (:class:`~qkv.train.loop.LoopRecord`): one epoch's batches, the
warm-up steps (the first allocate the optimizer's moments and, with ``train.compile``, compile),
the timed steps, and its end's validation, snapshot and saves. Where an epoch's batches differ in
length (translation, the protein and text tasks), the steps take a sample of every length
(:func:`spread`), the shortest and the longest first. The run's own
:class:`~qkv.train.schedule.Schedule`, replayed over its budgets with those seconds, is the
estimate (:meth:`~qkv.train.schedule.Schedule.plan`). Memory is measured: the process's peak.

What the few steps cannot know: how long a model that has learnt makes its outputs, where
validation or the summary generates text (translation's greedy BLEU, captioning, beam search):
decoding stops at ``eos``, which a model of a few steps may emit sooner or later than a trained
one. And on the CPU with glibc's allocator, a run over batches of many shapes keeps growing its
resident set for its first hundred steps or so, beyond what a short dry run sees.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import random
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from .. import distributed
from ..cpu_share import CpuShare
from ..errors import QkvError
from ..runs.record import prepare_run_dir
from .checkpointer import LoopState
from .estimate import DryRun, Memory
from .loop import LoopRecord
from .run import TrainingRun
from .schedule import Schedule, Timings
from .train_state import check_state

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Steps:
    """The dry run's budget: ``warmup`` steps (1 or more) untimed, then ``least`` to ``most``
    timed ones, until ``seconds`` of them have passed on the loop's clock."""

    warmup: int = 2
    least: int = 5
    most: int = 20
    seconds: float = 20.0


def dry_run(
    run_class: type[TrainingRun],
    settings: Any,
    out: str | Path | None = None,
    *,
    startup_s: float = 0.0,
    steps: Steps = Steps(),
    cpu: CpuShare | None = None,
) -> DryRun:
    """What a run of ``settings`` into ``out`` will cost, measured on its own model, data and
    batches, writing nothing: ``out`` (optional) is checked as the run would check it, never
    created or changed; the run's files go to a temporary directory, removed at the end.

    Args:
        run_class: the recipe's run (:func:`qkv.train.run.run_class`).
        startup_s: seconds the process spent before (interpreter, imports), which the real
            run spends too (the CLI measures them).
        cpu: the entry point's :class:`~qkv.cpu_share.CpuShare`, as the run takes it.

    Raises:
        QkvError: what the run would refuse (a non-empty ``out``, bad inputs), and under
            torchrun (a dry run is one process).
    """
    if distributed.context().enabled or int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:
        raise QkvError("--dry-run runs in one process: start it without torchrun")
    with _no_empty_torch_cache_left(), tempfile.TemporaryDirectory(prefix="qkv-dry-run-") as tmp:
        run = run_class(settings, Path(tmp) / "run", resume=False, progress=False, cpu=cpu)
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
    empty (the first optimizer step imports ``torch._dynamo``, whose disk cache makes it:
    ``TORCHINDUCTOR_CACHE_DIR`` or ``<temp dir>/torchinductor_<user>``). One that existed before
    is left alone, and so is what a compiled dry run cached there, which the real run reuses."""
    named = os.environ.get("TORCHINDUCTOR_CACHE_DIR")

    def folders() -> set[Path]:  # found, not computed: torch's own function makes the folder
        found = {p.absolute() for p in Path(tempfile.gettempdir()).glob("torchinductor_*")}
        return found | ({Path(named).absolute()} if named and Path(named).is_dir() else set())

    before = folders()
    try:
        yield
    finally:
        for folder in folders() - before:
            for path in sorted([*folder.rglob("*"), folder], key=lambda p: len(p.parts), reverse=True):
                with contextlib.suppress(OSError):  # not empty (a cached compile), or not a folder
                    path.rmdir()


def _rehearse(run: TrainingRun, startup_s: float, steps: Steps) -> DryRun:
    """The run in its (temporary) directory, its loop under the budget ``steps``, timed."""
    started = time.perf_counter()
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # an earlier run in this process
        torch.cuda.reset_peak_memory_stats()
    model = run.start()
    train = run.loop_settings()
    in_training = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    prepare_s = time.perf_counter() - started
    epochs, rehearsal = _Epochs(run, train.accum_steps, steps.warmup + steps.most), _Rehearsal(budget=steps)
    state = run.fit(model, epochs, rehearsal, observe=rehearsal.record)
    loop_end_s = time.perf_counter() - rehearsal.record.ended  # loss.png, drawn as the metrics close
    timings = replace(rehearsal.timings(), startup_s=startup_s, prepare_s=prepare_s)
    schedule = Schedule.of(train)
    plan = schedule.plan(timings, epochs.per_epoch, run.step_budget_key())
    # the snapshots the run keeps (translation's final weights average them): the end's, as often
    state.snapshots += state.snapshots[-1:] * (min(plan.snapshots, train.keep_snapshots) - 1)
    final_started = time.perf_counter()
    summary = run.finish(model, state)
    timings = replace(timings, final_s=loop_end_s + time.perf_counter() - final_started)
    if plan.total_s is not None:  # the replay is the same: only the end of the run is now measured
        total_s = plan.total_s + timings.final_s
        plan = replace(plan, total_s=total_s, wall_s=timings.startup_s + total_s)
    run.context.cpu.mark()
    return DryRun(
        recipe=run.name,
        device=str(run.device),
        precision=run.context.precision,
        parameters=summary["parameters"],
        trainable_parameters=summary["trainable_parameters"],
        frozen_parameters=in_training - trainable,
        adapter_parameters=max(in_training - summary["parameters"], 0),
        target_unit=run.target_unit,
        longest_batch=None if epochs.lengths is None else max(epochs.lengths),
        timings=timings,
        plan=plan,
        memory=Memory.peak(run.device),
        seconds=time.perf_counter() - started,
        cpu_share=run.context.cpu.report(),  # the load since the run started, as one stretch
    )


@dataclass(frozen=True)
class _Rehearsal(Schedule):
    """The dry run's schedule: nothing due between steps, and the end of every run (a
    validation, a snapshot, a save) once the loop's ``record`` holds the steps of ``budget``."""

    eval_every: int = sys.maxsize
    snapshot_s: float = math.inf
    budget: Steps = Steps()
    record: LoopRecord = field(default_factory=LoopRecord)

    def out_of_budget(self, state: LoopState) -> bool:
        w, timed = self.budget.warmup, self.record.steps - self.budget.warmup
        if timed < self.budget.least:
            return False
        return timed >= self.budget.most or self.record.stretch(w, w + timed)[0] >= self.budget.seconds

    def timings(self) -> Timings:
        """What the steps and actions took (``startup_s``, ``prepare_s``, ``final_s``: 0)."""
        w, made, saves = self.budget.warmup, self.record.steps, self.record.seconds("save")
        timed_s, targets = self.record.stretch(w, made)
        return Timings(
            startup_s=0.0,
            prepare_s=0.0,
            batches_s=self.record.seconds("batches")[0],
            warmup_steps=w,
            warmup_s=self.record.stretch(0, w)[0],
            timed_steps=made - w,
            step_s=timed_s / (made - w),
            targets_per_s=targets / max(timed_s, 1e-9),
            save_s=sum(saves) / len(saves),
            validation_s=sum(self.record.seconds("validate")),
            snapshot_s=sum(self.record.seconds("snapshot")),
            final_s=0.0,
        )


class _Epochs:
    """The rehearsal's batches: the run's own, or where the first epoch's differ in length, ``k``
    of its groups of ``accum`` (:func:`spread`) at every epoch."""

    def __init__(self, run: TrainingRun, accum: int, k: int) -> None:
        self.run, self.accum, self.k = run, accum, k
        self.per_epoch = 1  # known with the first epoch, as its batches' lengths (None: alike)
        self.lengths: list[int] | None = None
        self.sample: list | None = None

    def __call__(self, epoch: int) -> Sequence:
        if epoch > 0:
            return self.run.batches(epoch) if self.sample is None else self.sample
        first = self.run.batches(0)
        if not len(first):
            raise QkvError("the first epoch has no training batches")
        self.per_epoch = math.ceil(len(first) / self.accum)
        self.lengths = batch_lengths(first, self.run.batch_length)
        if self.lengths is None:
            return first
        groups = [range(i, min(i + self.accum, len(first))) for i in range(0, len(first), self.accum)]
        seed = self.run.settings.train.seed
        picks = spread([max(self.lengths[j] for j in g) for g in groups], self.k, seed)
        picks.sort(key=lambda g: len(groups[g]) < self.accum)  # a short group last: the loop slices
        self.sample = [first[j] for g in picks for j in groups[g]]
        return self.sample


def spread(lengths: list[int], k: int, seed: int) -> list[int]:
    """``k`` positions of ``lengths`` (batches' padded lengths) evenly spaced in length order:
    the shortest and the longest first (a dry run's warm-up steps: ``torch.compile`` compiles
    for a new shape there, and the peak memory is the longest's), then the others shuffled by
    ``seed``: a stratified sample, whose mean step time varies less than that of ``k`` batches
    taken at random, and whose shapes are as various as the epoch's."""
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
    return None if len(known) < len(lengths) or min(known) == max(known) else known
