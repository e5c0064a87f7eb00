"""The one training loop every recipe shares.

It owns what must be right once: gradient accumulation normalised by target tokens, clipping,
the learning-rate schedule, budgets (steps, minutes, epochs), periodic validation, the best
checkpoint, time-spaced snapshots for averaging, ``metrics.jsonl``, a loss-curve PNG, atomic
checkpoints, exact resume, a stop on a non-finite loss, and a clean stop on Ctrl-C.

The loop itself is short; its pieces are modules of their own: when it validates, snapshots,
saves and stops (:class:`~qkv.train.schedule.Schedule`, which the dry run replays too), one
optimizer step (:mod:`qkv.train.step`), checkpoints and exact resume
(:mod:`qkv.train.checkpointer`, whose docstring says what resuming repeats bit for bit and what
it cannot), and ``metrics.jsonl``, the progress bar and ``loss.png`` (:mod:`qkv.train.metrics`).
"""

from __future__ import annotations

import logging
import math
import random
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from .. import distributed
from ..device import resolve_precision
from .checkpointer import Checkpointer, LoopState, rng_state, set_rng_state
from .metrics import TrainMetrics
from .schedule import Action, Schedule
from .step import NonFiniteLoss, Stepper
from .train_settings import TrainSettings

if TYPE_CHECKING:
    from ..cpu_share import CpuShare
    from .trackers import Trackers

__all__ = [
    "LoopEvent",
    "LoopRecord",
    "LoopState",
    "NonFiniteLoss",
    "rng_state",
    "set_rng_state",
    "start_loop",
    "train_loop",
    "validate_and_keep_best",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoopEvent:
    """What the loop just did, for an observer of :func:`train_loop` (the dry run's clock).

    Attributes:
        kind: ``"step"`` (an optimizer step applied), ``"batches"`` (an epoch's batches made)
            or an :class:`~qkv.train.schedule.Action`'s value (``"validate"``, ``"snapshot"``,
            ``"save"``).
        seconds: how long it took (a step: its micro-batches' forward and backward passes and
            the update).
        step: the optimizer steps made so far.
        elapsed_s: the loop's clock (:attr:`LoopState.elapsed_s`): seconds from its start to
            the end of the last step's backward passes.
        targets: a step's target tokens, summed over the processes (0 for the others).
    """

    kind: str
    seconds: float
    step: int
    elapsed_s: float
    targets: int = 0


class LoopRecord:
    """What a :func:`train_loop` did, as its ``observe`` hears it (every :class:`LoopEvent`),
    read as the loop's clock: how the dry run times a run's steps and actions."""

    def __init__(self) -> None:
        self.events: list[LoopEvent] = []
        self.ended = time.perf_counter()  # when the last event ended

    def __call__(self, event: LoopEvent) -> None:
        self.events.append(event)
        self.ended = time.perf_counter()

    @property
    def steps(self) -> int:
        """The optimizer steps made."""
        return sum(e.kind == "step" for e in self.events)

    def seconds(self, kind: str) -> list[float]:
        """The seconds of each event of ``kind``, in order."""
        return [e.seconds for e in self.events if e.kind == kind]

    def stretch(self, first: int, last: int) -> tuple[float, int]:
        """The seconds and targets of steps ``first + 1`` to ``last``: the loop's clock across
        them (from its start for ``first`` 0) less what else it held (batches, actions)."""
        ends = {e.step: e.elapsed_s for e in self.events if e.kind == "step"}
        other_s = sum(e.seconds for e in self.events if e.kind != "step" and first <= e.step < last)
        targets = sum(e.targets for e in self.events if e.kind == "step" and first < e.step <= last)
        return ends[last] - ends.get(first, 0.0) - other_s, targets


class _StopRequests:
    """Ctrl-C (SIGINT) and SIGTERM (``kill``, a job scheduler, torchrun) ask the loop to stop
    at the end of the current step, where the checkpoint it writes is exact; a second signal
    stops at once (the last checkpoint is then kept as it was). Outside the main thread no
    handler can be set and Python's defaults apply."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:
            raise KeyboardInterrupt(f"signal {signum} (second)")
        self.requested = True
        logger.warning(f"signal {signum}: stopping after this step (again to stop at once)")

    def __enter__(self) -> _StopRequests:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def train_loop(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    lr: Callable[[int, float], float],
    batches: Callable[[int], Sequence],
    loss_fn: Callable[[torch.nn.Module, object], tuple[torch.Tensor, int]],
    validate: Callable[[torch.nn.Module], dict] | None,
    run_dir: Path,
    cfg: TrainSettings,
    progress: bool = True,
    score_key: str = "val_loss",
    higher_is_better: bool = False,
    resume: bool = False,
    precision: str | None = None,
    *,
    schedule: Schedule | None = None,
    cpu: CpuShare | None = None,
    observe: Callable[[LoopEvent], None] | None = None,
    trackers: Trackers | None = None,
) -> LoopState:
    """Train ``model`` until a budget runs out; return the final :class:`LoopState`.

    Args:
        lr: (optimizer step from 1, fraction of the budget used 0..1) → learning rate.
        batches: epoch number → the epoch's batches (a list, or any sequence with ``len`` and
            slicing that makes them on demand), the same on every call and every process
            (the loop remembers its position for resume and shares each step's batches out
            among torchrun's processes, see :mod:`qkv.distributed`).
        loss_fn: ``(model, batch) → (summed loss, number of target tokens)``.
        validate: ``model → metrics dict`` (run in eval mode, no grad, by rank 0) or ``None``.
        cfg: budgets, accumulation, clipping, cadence, seed, precision, ``compile``.
        progress: show a progress bar (stderr).
        score_key / higher_is_better: which validation metric picks ``best.safetensors``.
        resume: continue from ``run_dir/train_state.pt`` (see "exact resume" in
            :mod:`qkv.train.checkpointer`).
        precision: ``"bf16"`` (bfloat16 autocast) or ``"fp32"``, as resolved by
            :func:`qkv.device.resolve_precision`; ``None`` resolves ``cfg.precision`` here.
        schedule: when to validate, snapshot, save and stop; ``None``: ``cfg``'s
            (:meth:`Schedule.of <qkv.train.schedule.Schedule.of>`).
        cpu: the run's :class:`~qkv.cpu_share.CpuShare`, told of every step (it may change the
            thread count if it manages it) and read for the progress bar; ``None``: none.
        observe: called with a :class:`LoopEvent` after every step, action and epoch's batches.
        trackers: the run's experiment trackers (:class:`~qkv.train.trackers.Trackers`), opened
            as the loop starts and fed every ``metrics.jsonl`` row; their owner closes them.

    Files in ``run_dir`` (written by rank 0 only): ``train_state.pt`` (resume; the one it
    replaced is kept as ``train_state.prev.pt``), ``last.safetensors`` (its weights, for
    loading), ``best.safetensors``, ``snapshots/step_N.safetensors``, ``metrics.jsonl``,
    ``loss.png``.

    Raises:
        KeyboardInterrupt: Ctrl-C or SIGTERM, after the step in progress and a checkpoint.
        NonFiniteLoss: a NaN/inf loss or gradient norm beyond ``cfg.skip_nonfinite`` such steps
            (the last checkpoint is left as it was).
        QkvError: ``resume`` with a missing, truncated or corrupt ``train_state.pt``, one from a
            run on another number of processes, or one holding another model's weights.
    """
    run_dir = Path(run_dir)
    checkpoints, state = start_loop(model, optimizer, run_dir, cfg, score_key, higher_is_better, resume)
    if precision is None:
        precision = resolve_precision(cfg.precision, next(model.parameters()).device)[0]
    model.train()
    stop = _StopRequests()
    step = Stepper(
        model,
        optimizer,
        lr,
        loss_fn,
        cfg,
        precision,
        run_dir,
        elapsed_s=state.elapsed_s,
        stop_requested=lambda: stop.requested,
    )
    metrics = TrainMetrics(run_dir, cfg, state, resumed=resume, progress=progress, cpu=cpu, trackers=trackers)
    with stop, metrics:
        plan = schedule or Schedule.of(cfg)
        run = _Run(model, step, validate, state, metrics, checkpoints, plan, cpu=cpu, observe=observe)
        run.until_out_of_budget(batches, resume)
    if not math.isfinite(sum(p.detach().float().sum().item() for p in model.parameters())):
        raise NonFiniteLoss(f"training diverged: parameters contain NaN/inf after step {state.step}")
    return state


def start_loop(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    run_dir: Path,
    cfg: TrainSettings,
    score_key: str,
    higher_is_better: bool,
    resume: bool,
) -> tuple[Checkpointer, LoopState]:
    """The run's :class:`Checkpointer` and the state the loop starts from: the saved one
    (``resume``), or a fresh one with every RNG seeded."""
    ctx = distributed.context()
    if ctx.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
    checkpoints = Checkpointer(model, optimizer, run_dir, cfg, score_key, higher_is_better)
    if resume:
        state = checkpoints.resume()
        logger.info(f"resumed at step {state.step} (epoch {state.epoch}, batch {state.batch_in_epoch})")
    else:
        state = LoopState()
        # Rank r draws dropout from seed + r; the weights are rank 0's (DDP broadcasts them).
        torch.manual_seed(cfg.seed + ctx.rank)
        random.seed(cfg.seed + ctx.rank)
        np.random.seed(cfg.seed + ctx.rank)
    return checkpoints, state


class _Run:
    """One call of :func:`train_loop` from its first checkpoint to its last: the epochs, each
    optimizer step and the actions its schedule says are due (validation, snapshots,
    checkpoints), a requested stop, and what an interruption keeps."""

    def __init__(
        self,
        model: torch.nn.Module,
        step: Stepper,
        validate: Callable[[torch.nn.Module], dict] | None,
        state: LoopState,
        metrics: TrainMetrics,
        checkpoints: Checkpointer,
        schedule: Schedule,
        *,
        cpu: CpuShare | None,
        observe: Callable[[LoopEvent], None] | None,
    ) -> None:
        self.model, self.step, self.validate, self.state = model, step, validate, state
        self.metrics, self.checkpoints, self.schedule = metrics, checkpoints, schedule
        # torchrun's processes: an interrupted one cannot save alone
        self.several = distributed.context().enabled
        self.cpu, self.observe = cpu, observe
        self.in_step = self.stopping = False

    def until_out_of_budget(self, batches: Callable[[int], Sequence], resume: bool) -> None:
        """Train epoch after epoch until a budget runs out, with the schedule's actions at the
        start and the end; on Ctrl-C or SIGTERM save what can be saved and re-raise."""
        state, schedule = self.state, self.schedule
        try:
            self._do(schedule.at_start(resume))
            while not schedule.out_of_budget(state):
                started = time.perf_counter()
                epoch_batches = batches(state.epoch)
                self._observed("batches", time.perf_counter() - started)
                self._epoch(epoch_batches)
            self._do(schedule.at_end(state))
        except KeyboardInterrupt:
            self._interrupted()
            raise

    def _epoch(self, epoch_batches: Sequence) -> None:
        """The rest of one epoch's batches (from where a resumed run left off), a group of
        ``accum_steps`` micro-batches per optimizer step, while the budget lasts."""
        state, accum = self.state, self.step.cfg.accum_steps
        while state.batch_in_epoch < len(epoch_batches) and not self.schedule.out_of_budget(state):
            self._group(epoch_batches[state.batch_in_epoch : state.batch_in_epoch + accum])
        if state.batch_in_epoch >= len(epoch_batches):
            state.epoch += 1
            state.batch_in_epoch = 0

    def _group(self, group: Sequence) -> None:
        """One optimizer step on ``group``; a step skipped for a non-finite loss is counted and
        logged instead, and an epoch's short last group is passed over."""
        state = self.state
        if not self.step.takes(group):  # an epoch's short last group
            state.batch_in_epoch += len(group)
            return
        self.in_step = True
        started = time.perf_counter()
        stats = self.step(group, state)
        took = time.perf_counter() - started
        state.batch_in_epoch += len(group)
        if stats.skipped:
            state.skipped_nonfinite += 1
            self.metrics.log({"step": state.step, "skipped_nonfinite": state.skipped_nonfinite})
            self.in_step = False
            return
        state.step += 1
        state.elapsed_s = stats.elapsed
        self.in_step = False
        if self.cpu is not None:  # between steps: the thread count may follow the machine's load
            self.cpu.tick(1)
        self.metrics.train_step(state, stats)
        self._observed("step", took, stats.tokens)
        self._do(self.schedule.after_step(state))
        if stats.stop_requested:
            self.stopping = True
            self.checkpoints.save(state)
            logger.warning(f"stopped at step {state.step}; checkpoint saved in {self.checkpoints.run_dir}")
            raise KeyboardInterrupt(f"stopped by a signal at step {state.step}")

    def _do(self, actions: tuple[Action, ...]) -> None:
        """Carry out the schedule's ``actions``, in order."""
        for action in actions:
            started = time.perf_counter()
            if action is Action.VALIDATE:
                validate_and_keep_best(self.model, self.validate, self.state, self.metrics, self.checkpoints)
            elif action is Action.SNAPSHOT:
                self.checkpoints.snapshot(self.state)
            else:
                self.checkpoints.save(self.state)
            self._observed(action.value, time.perf_counter() - started)

    def _observed(self, kind: str, seconds: float, targets: int = 0) -> None:
        if self.observe is not None:
            self.observe(LoopEvent(kind, seconds, self.state.step, self.state.elapsed_s, targets))

    def _interrupted(self) -> None:
        """Between steps the state is whole and can be saved; within a step (a second signal)
        it is not, and with several processes they may be at different points: then the last
        checkpoint stands."""
        state = self.state
        if not self.stopping and not self.in_step and not self.several:
            logger.warning(f"interrupted at step {state.step}; saving {self.checkpoints.state_path}")
            self.checkpoints.save(state)
        elif self.in_step:
            logger.warning(f"stopped within step {state.step + 1}; the last checkpoint stands")


def validate_and_keep_best(
    model: torch.nn.Module,
    validate: Callable[[torch.nn.Module], dict] | None,
    state: LoopState,
    metrics: TrainMetrics,
    checkpoints: Checkpointer,
) -> None:
    """Run ``validate`` on rank 0 (eval mode, no grad), log its scores and keep the best
    weights; elsewhere, or without ``validate``, do nothing."""
    if validate is None or not distributed.is_main():
        return
    model.eval()
    with torch.no_grad():
        scores = validate(model)
    model.train()
    metrics.log({"step": state.step, "elapsed_min": round(state.elapsed_s / 60, 2), **scores})
    better = checkpoints.keep_best(state, scores)
    logger.info(
        f"step {state.step}: "
        + ", ".join(f"{k} {v:.4g}" for k, v in scores.items())
        + (" (best)" if better else "")
    )
