"""qkv.train.schedule: the loop's plan, written once. The loop carries out what its schedule says
and the dry run's estimate replays the same schedule, so the two agree: here the loop runs on a
clock that advances one second a step, and the estimate with one second a step counts the same
steps, validations, snapshots and saves and ends at the same second."""

from __future__ import annotations

import itertools
import time
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

import qkv.train.step
from qkv.train.checkpointer import LoopState
from qkv.train.loop import LoopRecord, train_loop
from qkv.train.schedule import Action, Schedule, Timings
from qkv.train.train_settings import TrainSettings

# one second a step, every other piece free: the clock of a loop whose steps tick it by one
ONE_SECOND_A_STEP = Timings(
    startup_s=0.0,
    prepare_s=0.0,
    batches_s=0.0,
    warmup_steps=0,
    warmup_s=0.0,
    timed_steps=1,
    step_s=1.0,
    targets_per_s=1.0,
    save_s=0.0,
    validation_s=0.0,
    snapshot_s=0.0,
    final_s=0.0,
)


def _epoch(epoch: int) -> list:
    """Five micro-batches of a toy regression."""
    g = torch.Generator().manual_seed(epoch)
    return [(torch.randn(3, 4, generator=g), torch.randn(3, 2, generator=g)) for _ in range(5)]


def _loop(tmp_path, monkeypatch, cfg: TrainSettings) -> tuple[LoopState, LoopRecord]:
    """``cfg``'s loop over :func:`_epoch` on a clock that reads one second more at every step."""
    ticks = itertools.count()
    monkeypatch.setattr(qkv.train.step, "time", SimpleNamespace(perf_counter=lambda: float(next(ticks))))
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    record = LoopRecord()
    state = train_loop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.01),
        lambda step, used: 0.01,
        _epoch,
        lambda m, batch: (((m(batch[0]) - batch[1]) ** 2).sum(), len(batch[0])),
        lambda m: {"val_loss": 1.0},
        tmp_path / "run",
        cfg,
        progress=False,
        observe=record,
    )
    return state, record


@pytest.mark.parametrize(
    "cfg",
    [
        TrainSettings(max_steps=10, eval_every=4, snapshot_minutes=0.0),
        # 5 micro-batches in steps of 2: 3 steps an epoch, the last of one micro-batch
        TrainSettings(max_epochs=2, eval_every=3, snapshot_minutes=1e9, accum_steps=2),
        # a time budget of 13 s and a snapshot 3 s after the last: the clock decides both
        TrainSettings(max_minutes=13 / 60, eval_every=5, snapshot_minutes=3 / 60),
        TrainSettings(max_steps=9, max_minutes=1.0, max_epochs=5, eval_every=2, snapshot_minutes=4 / 60),
    ],
    ids=["steps", "epochs", "minutes", "steps-first"],
)
def test_the_loop_does_what_its_schedule_plans(tmp_path, monkeypatch, cfg):
    state, record = _loop(tmp_path, monkeypatch, replace(cfg, precision="fp32", seed=0))
    per_epoch = -(-5 // cfg.accum_steps)
    plan = Schedule.of(cfg).plan(ONE_SECOND_A_STEP, per_epoch)
    assert plan.steps == state.step == record.steps
    assert plan.validations == len(record.seconds("validate"))
    assert plan.snapshots == len(record.seconds("snapshot"))
    assert plan.checkpoints == len(record.seconds("save"))
    assert plan.train_s == pytest.approx(state.elapsed_s)
    assert len(record.seconds("batches")) == -(-state.step // per_epoch)  # made as each epoch starts


class _StepByStep(Schedule):
    """A schedule that never says a stretch is quiet: its plan replays every step alone."""

    def quiet_until(self, state: LoopState) -> tuple[int, float]:
        return state.step + 1, state.elapsed_s


T = replace(ONE_SECOND_A_STEP, batches_s=0.3, warmup_steps=2, warmup_s=5.0, step_s=0.7, save_s=0.2)
T = replace(T, validation_s=3.1, snapshot_s=0.4, prepare_s=2.0, final_s=4.0)


@pytest.mark.parametrize("eval_every", [1, 7, 50])
@pytest.mark.parametrize("snapshot_minutes", [0.0, 0.05, 1.0, 1e9])
@pytest.mark.parametrize(
    "budget",
    [{"max_steps": 97}, {"max_minutes": 2.5}, {"max_epochs": 3}, {"max_steps": 400, "max_minutes": 1.5}],
)
def test_the_plan_takes_quiet_stretches_at_once_as_step_by_step(eval_every, snapshot_minutes, budget):
    """:meth:`Schedule.quiet_until` promises nothing is due before a step and a second: the
    plan that trusts it is the plan made a step at a time."""
    cfg = TrainSettings(eval_every=eval_every, snapshot_minutes=snapshot_minutes, **budget)
    fast = Schedule.of(cfg)
    slow = _StepByStep(**vars(fast))
    a, b = fast.plan(T, 40), slow.plan(T, 40)
    assert (a.steps, a.bound, a.validations, a.snapshots, a.checkpoints) == (
        b.steps,
        b.bound,
        b.validations,
        b.snapshots,
        b.checkpoints,
    )
    assert a.train_s == pytest.approx(b.train_s) and a.total_s == pytest.approx(b.total_s)


def test_a_budget_of_a_billion_validations_is_planned_in_a_moment():
    """Past a few hundred thousand moments at which something is due, the rest of the run goes
    at the pace of those replayed: the estimate of an absurd budget comes back at once."""
    started = time.perf_counter()
    plan = Schedule.of(TrainSettings(max_steps=10**9, eval_every=1, snapshot_minutes=1e9)).plan(T, 1000)
    assert time.perf_counter() - started < 10
    assert plan.steps == 10**9 and plan.bound == "max_steps"
    assert plan.validations == pytest.approx(10**9, rel=1e-3)
    assert plan.train_s == pytest.approx(10**9 * (0.7 + 3.1 + 0.2), rel=1e-3)


def test_the_schedule_says_what_is_due_and_when():
    schedule = Schedule(eval_every=3, snapshot_s=10.0, max_steps=7)
    assert schedule.at_start(resume=False) == (Action.SAVE,) and schedule.at_start(resume=True) == ()
    assert schedule.after_step(LoopState(step=3, elapsed_s=5.0)) == (Action.VALIDATE, Action.SAVE)
    assert schedule.after_step(LoopState(step=4, elapsed_s=12.0, last_snapshot_s=2.0)) == (
        Action.SNAPSHOT,
        Action.SAVE,
    )
    assert schedule.after_step(LoopState(step=4, elapsed_s=11.0, last_snapshot_s=2.0)) == ()
    assert schedule.quiet_until(LoopState(step=4, last_snapshot_s=2.0)) == (6, 12.0)
    assert schedule.quiet_until(LoopState(step=6)) == (7, 10.0)  # the step budget comes first
    snapped = LoopState(step=7, snapshots=["snapshots/step_7.safetensors"])
    assert schedule.at_end(snapped) == (Action.VALIDATE, Action.SAVE)
    assert schedule.at_end(LoopState(step=6)) == (Action.SNAPSHOT, Action.SAVE)
    assert schedule.out_of_budget(LoopState(step=7)) and not schedule.out_of_budget(LoopState(step=6))
