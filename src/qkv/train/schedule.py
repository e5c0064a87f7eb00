"""The training loop's plan, written once: when it validates, snapshots, saves and stops.

:class:`Schedule` is that plan. The loop (:func:`qkv.train.loop.train_loop`) asks it before
every step whether a budget has run out, and at its start, after every step and at its end which
:class:`Action` s are due, and carries them out. The dry run (:mod:`qkv.train.dry_run`) runs the
loop for a few steps, reads the seconds of each step and action off its clock (:class:`Timings`),
and replays the same schedule over the run's whole budget with them (:meth:`Schedule.plan`):
a change of cadence or budget is made here, and the loop and the estimate both follow it.
"""

from __future__ import annotations

import enum
import math
from collections import Counter
from dataclasses import dataclass

from ..runs.layout import snapshot_name
from .checkpointer import LoopState
from .train_settings import TrainSettings

# Past this many moments at which something may be due (millions of validations or snapshots),
# the replay takes the rest of the run at the pace of what it replayed (Schedule.plan).
REPLAY_MOMENTS = 100_000


class Action(str, enum.Enum):
    """What the loop does between its optimizer steps (a ``str``: it hashes at C speed, which
    :meth:`Schedule.plan`'s counts of millions of them feel)."""

    VALIDATE = "validate"  # the validation pass (rank 0), ``best.safetensors`` if it improved
    SNAPSHOT = "snapshot"  # ``snapshots/step_N.safetensors``, for averaging
    SAVE = "save"  # the checkpoint: ``train_state.pt`` and ``last.safetensors``


@dataclass(frozen=True)
class Schedule:
    """When the loop validates, snapshots, saves and stops.

    Attributes:
        eval_every: a validation, then a save, after every ``eval_every``-th step.
        snapshot_s: a snapshot, then a save, after the first step that ends this many seconds
            of the loop's clock after the last snapshot (0: after every step).
        max_steps / max_s / max_epochs: the budgets (``None``: none). The loop checks them
            before every step, against the steps made, its clock as the last step ended (its
            backward passes: the steps and everything between them, validations and checkpoints
            included) and the epochs completed: the first step that ends at or past
            ``max_s`` is the last.
    """

    eval_every: int
    snapshot_s: float
    max_steps: int | None = None
    max_s: float | None = None
    max_epochs: int | None = None

    @classmethod
    def of(cls, cfg: TrainSettings) -> Schedule:
        """The schedule of ``cfg``'s ``eval_every``, ``snapshot_minutes`` and budgets."""
        max_s = None if cfg.max_minutes is None else cfg.max_minutes * 60
        return cls(cfg.eval_every, cfg.snapshot_minutes * 60, cfg.max_steps, max_s, cfg.max_epochs)

    def at_start(self, resume: bool) -> tuple[Action, ...]:
        """Before a new run's first step, a save: from then on a killed run can be resumed (a
        resumed run starts from its checkpoint)."""
        return () if resume else (Action.SAVE,)

    def out_of_budget(self, state: LoopState) -> bool:
        """Whether a budget has run out at ``state`` (the loop asks before every step)."""
        return (
            (self.max_steps is not None and state.step >= self.max_steps)
            or (self.max_s is not None and state.elapsed_s >= self.max_s)
            or (self.max_epochs is not None and state.epoch >= self.max_epochs)
        )

    def after_step(self, state: LoopState) -> tuple[Action, ...]:
        """What is due after the step that made ``state``: every ``eval_every`` steps a
        validation and a save, ``snapshot_s`` after the last snapshot a snapshot and a save."""
        due: tuple[Action, ...] = ()
        if state.step % self.eval_every == 0:
            due += (Action.VALIDATE, Action.SAVE)
        if state.elapsed_s - state.last_snapshot_s >= self.snapshot_s:
            due += (Action.SNAPSHOT, Action.SAVE)
        return due

    def at_end(self, state: LoopState) -> tuple[Action, ...]:
        """Once a budget has run out: a validation and a snapshot of the last step (each unless
        it was just made), then the final save."""
        validated = state.step % self.eval_every == 0
        snapped = bool(state.snapshots) and state.snapshots[-1].endswith(f"step_{state.step}.safetensors")
        return (
            (() if validated else (Action.VALIDATE,))
            + (() if snapped else (Action.SNAPSHOT,))
            + (Action.SAVE,)
        )

    def quiet_until(self, state: LoopState) -> tuple[int, float]:
        """``(step, seconds)``: after the steps that follow ``state``, come before step ``step``
        and end before the clock reads ``seconds``, nothing is due and no budget runs out (but
        the epochs', checked as an epoch ends). What lets :meth:`plan` take such steps at once."""
        step = (state.step // self.eval_every + 1) * self.eval_every
        seconds = state.last_snapshot_s + self.snapshot_s
        return (
            step if self.max_steps is None else min(step, self.max_steps),
            seconds if self.max_s is None else min(seconds, self.max_s),
        )

    def step_budget(self, steps_per_epoch: int) -> int | None:
        """The steps the step and epoch budgets allow (``None``: neither is set)."""
        by_epochs = None if self.max_epochs is None else self.max_epochs * steps_per_epoch
        budgets = [b for b in (self.max_steps, by_epochs) if b is not None]
        return min(budgets) if budgets else None

    def plan(self, t: Timings, steps_per_epoch: int, step_budget_key: str = "max_steps") -> Plan:
        """The steps, actions and seconds of a run under this schedule whose epochs have
        ``steps_per_epoch`` steps, with the seconds ``t`` measured: the loop's course replayed
        on a clock made of them. ``step_budget_key`` names the setting behind ``max_steps`` in
        :attr:`Plan.bound` (a recipe may count its epochs in steps).

        Raises:
            ValueError: ``steps_per_epoch`` below 1.
        """
        if steps_per_epoch < 1:
            raise ValueError(f"steps_per_epoch ({steps_per_epoch}) must be >= 1")
        step_budget = self.step_budget(steps_per_epoch)
        if step_budget is None and self.max_s is None:  # it trains until stopped
            return Plan(None, None, None, steps_per_epoch, 0, 0, 0, None, None, None, None)
        replay = _Replay(self, t, steps_per_epoch)
        replay.run()
        steps = replay.state.step
        if step_budget is not None and steps >= step_budget:
            bound = step_budget_key if self.max_steps == step_budget else "max_epochs"
        else:
            bound = "max_minutes"
        after_s = replay.clock - replay.train_s
        total_s = t.prepare_s + replay.train_s + after_s + t.final_s
        return Plan(
            steps=steps,
            bound=bound,
            step_budget=step_budget,
            steps_per_epoch=steps_per_epoch,
            validations=replay.counts[Action.VALIDATE],
            snapshots=replay.counts[Action.SNAPSHOT],
            checkpoints=replay.counts[Action.SAVE],
            train_s=replay.train_s,
            after_s=after_s,
            total_s=total_s,
            wall_s=t.startup_s + total_s,
        )


@dataclass(frozen=True)
class Timings:
    """Seconds a dry run measured, what :meth:`Schedule.plan` replays a run with.

    Attributes:
        startup_s: the process's start to the run's (interpreter, imports, the command line);
            0 where unknown (a dry run from Python).
        prepare_s: the run's checks, data, tokenizer and model, up to its first step.
        batches_s: one epoch's batches (the loop makes them as every epoch starts).
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

    def of(self, action: Action) -> float:
        """Seconds of one ``action``."""
        if action is Action.VALIDATE:
            return self.validation_s
        return self.snapshot_s if action is Action.SNAPSHOT else self.save_s


@dataclass(frozen=True)
class Plan:
    """What a run's :class:`Schedule` implies, with a dry run's :class:`Timings`.

    Attributes:
        steps: the optimizer steps it makes (``None``: no budget, it trains until stopped).
        bound: what ends it: ``"max_steps"``, ``"max_epochs"``, ``"max_minutes"`` (those
            ``train`` settings), ``"one_epoch"`` (the sequence-classification recipes' budget
            when none is set); ``None`` without a budget.
        step_budget: the steps the step and epoch budgets allow (``None``: unlimited); fewer
            when the time budget binds.
        steps_per_epoch: optimizer steps in one pass over the training data.
        validations / snapshots / checkpoints: the validation passes, snapshots and saves of the
            loop (its end's included).
        train_s: the loop's clock at the end of the last step (``summary.json``'s
            ``train_minutes``).
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


class _Replay:
    """The loop's course under a :class:`Schedule` on a clock of measured seconds: its epochs
    (the batches made as each starts), steps and actions as :func:`~qkv.train.loop.train_loop`
    makes them, the steps between two moments at which something may be due
    (:meth:`Schedule.quiet_until`) taken at once. ``state.batch_in_epoch`` counts steps here."""

    def __init__(self, schedule: Schedule, t: Timings, steps_per_epoch: int) -> None:
        self.schedule, self.t, self.per_epoch = schedule, t, steps_per_epoch
        self.state = LoopState()
        self.clock = self.train_s = 0.0
        self.counts: Counter[Action] = Counter()
        self.moments = 0

    def run(self) -> None:
        """The run from its first save to its last."""
        schedule, state = self.schedule, self.state
        self._act(schedule.at_start(resume=False))
        while not schedule.out_of_budget(state) and self.moments < REPLAY_MOMENTS:
            self.clock += self.t.batches_s
            while state.batch_in_epoch < self.per_epoch and not schedule.out_of_budget(state):
                if self.moments >= REPLAY_MOMENTS:
                    break
                self._steps()
            if state.batch_in_epoch >= self.per_epoch:
                state.epoch, state.batch_in_epoch = state.epoch + 1, 0
        if not schedule.out_of_budget(state):
            self._at_the_same_pace()
        self.train_s = state.elapsed_s
        self._act(schedule.at_end(state))

    def _steps(self) -> None:
        """The steps up to the next one after which something may be due, then what is."""
        state, t = self.state, self.t
        n = 1
        if state.step >= t.warmup_steps:
            step, seconds = self.schedule.quiet_until(state)
            n = min(step - state.step, self.per_epoch - state.batch_in_epoch)
            if seconds < math.inf:  # the last step before the clock reaches it, at the latest
                n = max(1, min(n, math.floor((seconds - self.clock) / max(t.step_s, 1e-9))))
        self.clock += t.steps_s(state.step + n) - t.steps_s(state.step)
        state.step += n
        state.batch_in_epoch += n
        state.elapsed_s = self.clock
        self.moments += 1
        self._act(self.schedule.after_step(state))

    def _act(self, actions: tuple[Action, ...]) -> None:
        for action in actions:
            self.counts[action] += 1
            self.clock += self.t.of(action)
            if action is Action.SNAPSHOT:
                self.state.record_snapshot(snapshot_name(self.state.step), keep=1)

    def _at_the_same_pace(self) -> None:
        """The rest of a run of more than :data:`REPLAY_MOMENTS` moments: its steps at the
        seconds, and with the actions, per step of those replayed."""
        state, schedule = self.state, self.schedule
        done = state.step
        pace = max(self.clock / done, 1e-9)
        steps = schedule.step_budget(self.per_epoch)
        if schedule.max_s is not None:
            in_time = done + max(1, math.ceil((schedule.max_s - state.elapsed_s) / pace))
            steps = in_time if steps is None else min(steps, in_time)
        assert steps is not None  # plan() replays bounded schedules only
        self.counts = Counter({a: round(n * steps / done) for a, n in self.counts.items()})
        state.elapsed_s = self.clock = self.clock + (steps - done) * pace
        state.step = steps
