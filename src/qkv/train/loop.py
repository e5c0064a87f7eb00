"""The one training loop every recipe shares.

It owns what must be right once: gradient accumulation normalised by target tokens, clipping,
the learning-rate schedule, budgets (steps, minutes, epochs), periodic validation, the best
checkpoint, time-spaced snapshots for averaging, ``metrics.jsonl``, a loss-curve PNG, atomic
checkpoints, exact resume, a stop on a non-finite loss, and a clean stop on Ctrl-C.

The loop itself is short; its pieces are modules of their own: one optimizer step
(:mod:`qkv.train.step`), checkpoints and exact resume (:mod:`qkv.train.checkpointer`, whose
docstring says what resuming repeats bit for bit and what it cannot), and ``metrics.jsonl``, the
progress bar and ``loss.png`` (:mod:`qkv.train.metrics`).
"""

from __future__ import annotations

import logging
import math
import random
import signal
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np
import torch

from .. import cpu_share, distributed
from ..device import resolve_precision
from .checkpointer import Checkpointer, LoopState, rng_state, set_rng_state
from .metrics import TrainMetrics
from .step import NonFiniteLoss, Stepper
from .train_settings import TrainSettings

__all__ = [
    "LoopState",
    "NonFiniteLoss",
    "rng_state",
    "set_rng_state",
    "start_loop",
    "train_loop",
    "validate_and_keep_best",
]

logger = logging.getLogger(__name__)


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
    ctx = distributed.context()
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
    with stop, TrainMetrics(run_dir, cfg, state, resumed=resume, progress=progress) as metrics:
        run = _Run(model, step, validate, cfg, run_dir, state, metrics, checkpoints, several=ctx.enabled)
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
    optimizer step and what follows it (validation, snapshots, checkpoints, a requested stop),
    and what an interruption keeps."""

    def __init__(
        self,
        model: torch.nn.Module,
        step: Stepper,
        validate: Callable[[torch.nn.Module], dict] | None,
        cfg: TrainSettings,
        run_dir: Path,
        state: LoopState,
        metrics: TrainMetrics,
        checkpoints: Checkpointer,
        several: bool,
    ) -> None:
        self.model, self.step, self.validate, self.cfg, self.run_dir = model, step, validate, cfg, run_dir
        self.state, self.metrics, self.checkpoints = state, metrics, checkpoints
        self.several = several  # torchrun's processes: an interrupted one cannot save alone
        self.in_step = self.stopping = False

    def until_out_of_budget(self, batches: Callable[[int], Sequence], resume: bool) -> None:
        """Train epoch after epoch until a budget runs out, then validate, snapshot and save
        the last step; on Ctrl-C or SIGTERM save what can be saved and re-raise."""
        state = self.state
        try:
            if not resume:
                self.checkpoints.save(state)  # from here on, a killed run can always be resumed
            while not _out_of_budget(state, self.cfg):
                self._epoch(batches(state.epoch))
            self._finish()
        except KeyboardInterrupt:
            self._interrupted()
            raise

    def _epoch(self, epoch_batches: Sequence) -> None:
        """The rest of one epoch's batches (from where a resumed run left off), a group of
        ``accum_steps`` micro-batches per optimizer step, while the budget lasts."""
        state, cfg = self.state, self.cfg
        while state.batch_in_epoch < len(epoch_batches) and not _out_of_budget(state, cfg):
            self._group(epoch_batches[state.batch_in_epoch : state.batch_in_epoch + cfg.accum_steps])
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
        stats = self.step(group, state)
        state.batch_in_epoch += len(group)
        if stats.skipped:
            state.skipped_nonfinite += 1
            self.metrics.log({"step": state.step, "skipped_nonfinite": state.skipped_nonfinite})
            self.in_step = False
            return
        state.step += 1
        state.elapsed_s = stats.elapsed
        self.in_step = False
        cpu_share.tick(1)  # between steps: the thread count may follow the machine's load
        self.metrics.train_step(state, stats)
        self._after_step(stop_requested=stats.stop_requested)

    def _after_step(self, stop_requested: bool) -> None:
        """What is due after a step: validation and a checkpoint every ``eval_every`` steps, a
        snapshot every ``snapshot_minutes``, and a checkpoint and stop when a signal asked."""
        state, cfg, checkpoints = self.state, self.cfg, self.checkpoints
        if state.step % cfg.eval_every == 0:
            validate_and_keep_best(self.model, self.validate, state, self.metrics, checkpoints)
            checkpoints.save(state)
        if state.elapsed_s - state.last_snapshot_s >= cfg.snapshot_minutes * 60:
            checkpoints.snapshot(state)
            checkpoints.save(state)
        if stop_requested:
            self.stopping = True
            checkpoints.save(state)
            logger.warning(f"stopped at step {state.step}; checkpoint saved in {self.run_dir}")
            raise KeyboardInterrupt(f"stopped by a signal at step {state.step}")

    def _finish(self) -> None:
        """The end of the budget: validate the last step (unless it just was), snapshot it for
        averaging and save the final checkpoint."""
        state, checkpoints = self.state, self.checkpoints
        if state.step % self.cfg.eval_every != 0:
            validate_and_keep_best(self.model, self.validate, state, self.metrics, checkpoints)
        if not state.snapshots or not state.snapshots[-1].endswith(f"step_{state.step}.safetensors"):
            checkpoints.snapshot(state)
        checkpoints.save(state)

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


def _out_of_budget(state: LoopState, cfg: TrainSettings) -> bool:
    return (
        (cfg.max_steps is not None and state.step >= cfg.max_steps)
        or (cfg.max_minutes is not None and state.elapsed_s >= cfg.max_minutes * 60)
        or (cfg.max_epochs is not None and state.epoch >= cfg.max_epochs)
    )


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
