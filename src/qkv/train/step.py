"""One optimizer step: the micro-batches' forward and backward, one all-reduce, the gradient
normalised by target tokens, clipping, the non-finite check and the update.

Normalisation: ``loss_fn`` returns a *summed* loss and its number of target tokens; the step
divides the accumulated gradient by the tokens of all micro-batches on all processes, so
accumulating two micro-batches, or sharing them between two processes, gives the gradient of
one batch holding both.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch

from .. import distributed
from ..errors import QkvError
from .checkpointer import LoopState
from .train_settings import TrainSettings

logger = logging.getLogger(__name__)


class NonFiniteLoss(QkvError):
    """A NaN or infinite loss or gradient norm: the step is named; its update was not applied."""


@dataclass(frozen=True)
class StepStats:
    """What one optimizer step measured, summed over the processes.

    ``loss_sum``: the summed loss of all micro-batches (divide by ``tokens`` for the mean);
    ``tokens``: their target tokens; ``grad_norm``: the gradient's norm before clipping;
    ``elapsed``: seconds of training since the run began (the processes' mean), at the end of
    the backward passes; ``lr``: the learning rate applied (``None`` when skipped);
    ``stop_requested``: some process was asked to stop (Ctrl-C, SIGTERM); ``skipped``: the loss
    or the gradient norm was not finite and no update was applied.
    """

    loss_sum: float
    tokens: int
    grad_norm: float
    elapsed: float
    lr: float | None
    stop_requested: bool
    skipped: bool


def budget_used(cfg: TrainSettings, step: int, elapsed_s: float) -> float:
    """The fraction of the first budget to run out that is spent at optimizer step ``step``
    with ``elapsed_s`` seconds of training (what a time-budget schedule decays over)."""
    return max(
        0.0 if cfg.max_steps is None else step / cfg.max_steps,
        0.0 if cfg.max_minutes is None else elapsed_s / (cfg.max_minutes * 60),
    )


class Stepper:
    """Makes optimizer steps of ``model``; call it with each step's micro-batches.

    Built once per run: it wraps the model in ``DistributedDataParallel`` under torchrun and
    compiles it with ``cfg.compile``, for the steps only (validation and checkpoints use the
    module itself, whose state dict has no wrapper prefixes), and starts the clock the steps'
    ``elapsed`` is read from.

    Args:
        lr: (optimizer step from 1, :func:`budget_used`) → learning rate.
        loss_fn: ``(model, micro-batch) → (summed loss (a scalar tensor), target tokens)``.
        precision: ``"bf16"`` (bfloat16 autocast around ``loss_fn``) or ``"fp32"``.
        run_dir: named in the error of a non-finite step (its checkpoint is left untouched).
        elapsed_s: seconds trained before this process began (a resumed run's).
        stop_requested: whether this process was asked to stop; read after the backward passes,
            so a signal during the step still stops after it.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        lr: Callable[[int, float], float],
        loss_fn: Callable[[torch.nn.Module, Any], tuple[torch.Tensor, int]],
        cfg: TrainSettings,
        precision: str,
        run_dir: Path,
        elapsed_s: float = 0.0,
        stop_requested: Callable[[], bool] = lambda: False,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.lr = lr
        self.loss_fn = loss_fn
        self.cfg = cfg
        self.precision = precision
        self.run_dir = run_dir
        self.stop_requested = stop_requested
        self.ctx = distributed.context()
        # Fewer micro-batches per step than processes: each process takes its rows of every one.
        self.split_rows = self.ctx.world_size > cfg.accum_steps
        self.device = next(model.parameters()).device
        # float64 keeps token counts and seconds exact; MPS has no float64
        self.stat_dtype = torch.float32 if self.device.type == "mps" else torch.float64
        self.ddp = (
            torch.nn.parallel.DistributedDataParallel(
                model, device_ids=[self.device.index] if self.device.type == "cuda" else None
            )
            if self.ctx.enabled
            else None
        )
        self.step_model: torch.nn.Module = self.ddp or model
        if cfg.compile:  # a module compiled is a module (OptimizedModule); its stub says callable
            self.step_model = cast(torch.nn.Module, torch.compile(self.step_model))
        self.params = [p for p in model.parameters() if p.requires_grad]
        self._t0 = time.perf_counter() - elapsed_s

    def takes(self, group: Sequence[Any]) -> bool:
        """Whether ``group`` (one step's micro-batches) makes a step: an epoch's short last
        group with fewer micro-batches than processes does not (some would have none)."""
        return self.split_rows or len(group) >= self.ctx.world_size

    def __call__(self, group: Sequence[Any], state: LoopState) -> StepStats:
        """Make the optimizer step after ``state.step`` from the micro-batches ``group`` (the
        same on every process; each takes its share). ``state`` is read, not changed.

        Raises:
            NonFiniteLoss: a non-finite loss or gradient norm when ``state.skipped_nonfinite``
                already reached ``cfg.skip_nonfinite`` (fewer: it is skipped, with a warning).
        """
        loss_sum, n_tokens = self._accumulate(group)
        # [loss, target tokens, seconds, stop] summed over the processes, on the device
        stats = torch.stack(
            [
                loss_sum,
                *torch.tensor(
                    [
                        n_tokens,
                        (time.perf_counter() - self._t0) / self.ctx.world_size,
                        float(self.stop_requested()),
                    ],
                    dtype=self.stat_dtype,
                ).to(self.device),
            ]
        )
        distributed.all_reduce_(stats)
        # DDP's mean over W processes, times W, over all tokens = the 1-process sum / tokens
        divisor = stats[1].clamp(min=1) / self.ctx.world_size
        for p in self.params:
            if p.grad is not None:
                p.grad.div_(divisor)
        # an infinite max_norm measures without clipping
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.cfg.clip_norm or math.inf)
        loss, norm, tokens, elapsed, stop_votes = torch.cat(
            [stats[:1], grad_norm.detach().to(self.stat_dtype).view(1), stats[1:]]
        ).tolist()  # one sync
        if not (math.isfinite(loss) and math.isfinite(norm)):
            self._skip_nonfinite(state, loss, norm)
            return StepStats(loss, int(tokens), norm, elapsed, None, bool(stop_votes), skipped=True)
        lr = self.lr(state.step + 1, budget_used(self.cfg, state.step + 1, state.elapsed_s))
        for g in self.optimizer.param_groups:
            g["lr"] = lr
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return StepStats(loss, int(tokens), norm, elapsed, lr, bool(stop_votes), skipped=False)

    def _accumulate(self, group: Sequence[Any]) -> tuple[torch.Tensor, int]:
        """Forward and backward this process's share of ``group``, summing the gradients;
        return its summed loss (a 0-d ``stat_dtype`` tensor) and target tokens."""
        ctx = self.ctx
        mine = (
            _my_rows(group, ctx.rank, ctx.world_size)
            if self.split_rows
            else [(b, True) for b in group[ctx.rank :: ctx.world_size]]
        )
        losses, n_tokens = [], 0
        for i, (batch, counts) in enumerate(mine):
            # DDP averages gradients over the processes on the last backward only
            with (
                self.ddp.no_sync() if self.ddp is not None and i < len(mine) - 1 else contextlib.nullcontext()
            ):
                with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.precision == "bf16"):
                    loss, n = self.loss_fn(self.step_model, batch)
                if not counts:  # no rows for this process: it joins the step with zeros
                    loss, n = loss * 0.0, 0
                loss.backward()  # summed loss; normalised by all target tokens in __call__
            losses.append(loss.detach().to(self.stat_dtype))
            n_tokens += n
        return sum(losses), n_tokens  # type: ignore[return-value]  # a tensor: losses is never empty

    def _skip_nonfinite(self, state: LoopState, loss: float, grad_norm: float) -> None:
        """Discard the step's gradients; raise unless ``cfg.skip_nonfinite`` allows one more."""
        bad = _first_nonfinite_grad(self.model)
        self.optimizer.zero_grad(set_to_none=True)
        what = f"non-finite loss at step {state.step + 1} (loss {loss}, gradient norm {grad_norm}" + (
            f", first non-finite gradient: {bad})" if bad else ")"
        )
        skipped = state.skipped_nonfinite + 1
        if skipped > self.cfg.skip_nonfinite:
            raise NonFiniteLoss(
                f"{what}; the update was not applied and the last checkpoint in "
                f"{self.run_dir} is untouched (train.skip_nonfinite=N skips up to N such "
                "steps; a lower train.lr often cures a divergence)"
            )
        logger.warning(f"{what}: skipped ({skipped} of train.skip_nonfinite={self.cfg.skip_nonfinite})")


def _first_nonfinite_grad(model: torch.nn.Module) -> str | None:
    for name, p in model.named_parameters():
        if p.grad is not None and not torch.isfinite(p.grad).all():
            return name
    return None


def _my_rows(group: Sequence[Any], rank: int, world_size: int) -> list[tuple[Any, bool]]:
    """``(batch, counts)`` per micro-batch of ``group``: this process's rows of it
    (:func:`qkv.distributed.share`), or, where it has none, the whole micro-batch with
    ``counts`` false (its loss is then multiplied by zero: every process must run a backward
    for DDP's gradient exchange)."""
    out = []
    for batch in group:
        part = distributed.share(batch, rank, world_size)
        out.append((part, True) if len(part) else (batch, False))
    return out
