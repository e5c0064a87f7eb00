"""The training loop's pieces, each on its own: one optimizer step (qkv.train.step), the
checkpoints and resume (qkv.train.checkpointer) and the metrics (qkv.train.metrics).

The loop as a whole (resume, signals, non-finite steps through it) is tested in test_train.py.
"""

from __future__ import annotations

import json
import logging
import random

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from qkv.errors import QkvError
from qkv.files import save_weights
from qkv.train.checkpointer import Checkpointer, LoopState
from qkv.train.metrics import TrainMetrics
from qkv.train.step import NonFiniteLoss, Stepper, StepStats
from qkv.train.train_settings import TrainSettings


def _sq_loss(model, batch):
    """Summed squared error and the number of rows (the 'target tokens' of this toy task)."""
    x, y = batch
    return ((model(x) - y) ** 2).sum(), len(x)


def _micro_batches():
    g = torch.Generator().manual_seed(0)
    # 3 rows and 5 rows: a mean of per-micro-batch means would weight them wrongly
    return [(torch.randn(n, 4, generator=g), torch.randn(n, 2, generator=g)) for n in (3, 5)]


def _linear():
    torch.manual_seed(0)
    return torch.nn.Linear(4, 2)


def _stepper(model, tmp_path, lr=lambda step, used: 1.0, loss_fn=_sq_loss, **settings):
    cfg = TrainSettings(**{"max_steps": 10, "clip_norm": None, "precision": "fp32", **settings})
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # SGD: the update is lr times the gradient
    return Stepper(model, opt, lr, loss_fn, cfg, "fp32", tmp_path)


def _reference_grad(batches):
    """The gradient of the summed loss of all rows over the number of rows, in one batch."""
    model = _linear()
    x, y = (torch.cat(t) for t in zip(*batches, strict=True))
    ((model(x) - y) ** 2).sum().div(len(x)).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}, model.state_dict()


# ---------------------------------------------------------------------------- one step


def test_a_step_normalises_accumulated_gradients_by_all_target_tokens(tmp_path):
    batches = _micro_batches()
    grads, before = _reference_grad(batches)
    model = _linear()
    seen = []
    step = _stepper(model, tmp_path, lr=lambda s, used: seen.append((s, used)) or 1.0, accum_steps=2)
    stats = step(batches, LoopState(step=4))
    assert seen == [(5, 0.5)], "the schedule gets the step being made and the budget then used"
    assert not stats.skipped and stats.lr == 1.0 and stats.tokens == 8
    assert stats.loss_sum == pytest.approx(sum(_sq_loss(_linear(), b)[0].item() for b in batches))
    assert stats.grad_norm == pytest.approx(torch.cat([g.flatten() for g in grads.values()]).norm().item())
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.detach(), before[name] - grads[name], rtol=0, atol=1e-6)
        assert p.grad is None, "the gradients are cleared for the next step"


def test_a_step_clips_the_gradient_to_clip_norm(tmp_path):
    batches = _micro_batches()
    grads, before = _reference_grad(batches)
    norm = torch.cat([g.flatten() for g in grads.values()]).norm().item()
    assert norm > 0.5  # so that clipping to 0.1 changes something
    model = _linear()
    stats = _stepper(model, tmp_path, clip_norm=0.1, accum_steps=2)(batches, LoopState())
    assert stats.grad_norm == pytest.approx(norm), "the norm reported is the one before clipping"
    update = torch.cat([(before[n] - p.detach()).flatten() for n, p in model.named_parameters()])
    assert update.norm().item() == pytest.approx(0.1, rel=1e-4)
    # clipping scales the whole gradient: its direction is kept
    torch.testing.assert_close(
        update / update.norm(), torch.cat([g.flatten() for g in grads.values()]) / norm
    )


def test_a_stop_asked_for_during_the_backward_is_reported_by_that_step(tmp_path):
    asked = []

    def loss_fn(model, batch):
        asked.append(True)  # as Ctrl-C during the forward would
        return _sq_loss(model, batch)

    step = _stepper(_linear(), tmp_path, loss_fn=loss_fn)
    step.stop_requested = lambda: bool(asked)
    assert step(_micro_batches()[:1], LoopState()).stop_requested


def _nan_loss(model, batch):
    loss, n = _sq_loss(model, batch)
    return loss * float("nan"), n


def test_a_nan_step_is_skipped_up_to_skip_nonfinite_then_raises(tmp_path, caplog):
    model = _linear()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    step = _stepper(model, tmp_path, loss_fn=_nan_loss, skip_nonfinite=1)
    with caplog.at_level(logging.WARNING, logger="qkv.train.step"):
        stats = step(_micro_batches()[:1], LoopState(step=6))
    assert stats.skipped and stats.lr is None and stats.loss_sum != stats.loss_sum  # nan
    assert "non-finite loss at step 7" in caplog.text
    assert "skipped (1 of train.skip_nonfinite=1)" in caplog.text
    assert all(p.grad is None for p in model.parameters()), "the bad gradients are discarded"
    with pytest.raises(
        NonFiniteLoss,
        match=r"non-finite loss at step 7 \(loss nan.*first non-finite "
        r"gradient: weight\).*is untouched",
    ):
        step(_micro_batches()[:1], LoopState(step=6, skipped_nonfinite=1))
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), f"{k} was updated by a non-finite step"


# ---------------------------------------------------------------------------- checkpoints


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(self.lin(x))


def _trained(tmp_path, seed=0):
    """A model and Adam after two steps, and its Checkpointer."""
    torch.manual_seed(seed)
    model = _Net()
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    for _ in range(2):
        model(torch.randn(3, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
    return model, opt, Checkpointer(model, opt, tmp_path, TrainSettings(keep_snapshots=2))


def _draws():
    return random.random(), np.random.rand(), torch.rand(3)


def _reseed(seed):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def test_resume_restores_weights_optimizer_loop_state_and_every_rng(tmp_path):
    model, opt, checkpoints = _trained(tmp_path)
    state = LoopState(
        step=7,
        epoch=1,
        batch_in_epoch=3,
        elapsed_s=12.5,
        best_score=0.25,
        snapshots=["snapshots/step_5.safetensors"],
        skipped_nonfinite=1,
    )
    _reseed(11)
    checkpoints.save(state)
    expected = _draws()
    assert set(load_file(str(tmp_path / "last.safetensors"))) == set(model.state_dict())

    other, other_opt, resumed = _trained(tmp_path, seed=1)  # other weights and moments
    _reseed(12)
    assert resumed.resume() == state
    got = _draws()
    assert got[:2] == expected[:2] and torch.equal(got[2], expected[2])
    for k, v in model.state_dict().items():
        assert torch.equal(other.state_dict()[k], v), k
    saved, loaded = opt.state_dict()["state"], other_opt.state_dict()["state"]
    assert saved.keys() == loaded.keys()
    for i in saved:
        for k in saved[i]:
            assert torch.equal(torch.as_tensor(saved[i][k]), torch.as_tensor(loaded[i][k])), (i, k)


def test_resume_of_an_old_state_reads_last_safetensors_and_leaves_numpy_alone(tmp_path):
    """A state written before the weights and per-process streams moved into it."""
    model, opt, _ = _trained(tmp_path)
    save_weights(model, tmp_path / "last.safetensors")
    _reseed(11)
    torch.save(
        {
            "optimizer": opt.state_dict(),
            "loop": {"step": 3},
            "py_rng": random.getstate(),
            "torch_rng": torch.get_rng_state(),
        },
        tmp_path / "train_state.pt",
    )
    expected_py, expected_torch = random.random(), torch.rand(3)

    other, _, resumed = _trained(tmp_path, seed=1)
    _reseed(12)
    expected_np = np.random.RandomState(12).rand()  # NumPy's stream as it was before resuming
    assert resumed.resume().step == 3
    assert random.random() == expected_py and torch.equal(torch.rand(3), expected_torch)
    assert np.random.rand() == expected_np
    for k, v in model.state_dict().items():
        assert torch.equal(other.state_dict()[k], v), k


def test_resume_on_another_number_of_processes_is_refused(tmp_path):
    _, _, checkpoints = _trained(tmp_path)
    checkpoints.save(LoopState())
    saved = torch.load(tmp_path / "train_state.pt", weights_only=True)
    torch.save({**saved, "world_size": 2}, tmp_path / "train_state.pt")
    with pytest.raises(QkvError, match=r"trained on 2 process\(es\); resume it on as many .* not 1"):
        checkpoints.resume()


def test_resume_with_other_trained_weights_is_refused_in_one_line(tmp_path):
    """The same model, but an optimizer over fewer parameters (some frozen, as a probe or LoRA
    freezes them): the saved moments belong to other weights."""
    _, _, checkpoints = _trained(tmp_path)
    checkpoints.save(LoopState())
    model = _Net()
    frozen = torch.optim.Adam([next(model.parameters())], lr=0.1)
    with pytest.raises(QkvError, match="holds the optimizer state of other trained weights"):
        Checkpointer(model, frozen, tmp_path, TrainSettings()).resume()


def test_snapshots_keep_only_the_newest_keep_snapshots(tmp_path):
    _, _, checkpoints = _trained(tmp_path)  # keep_snapshots=2
    state = LoopState()
    for step in (5, 10, 15):
        state.step, state.elapsed_s = step, step * 60.0
        checkpoints.snapshot(state)
    names = ["step_10.safetensors", "step_15.safetensors"]
    assert sorted(p.name for p in (tmp_path / "snapshots").iterdir()) == names
    assert state.snapshots == [f"snapshots/{n}" for n in names]  # relative to the run directory
    assert state.last_snapshot_s == 900.0


@pytest.mark.parametrize(
    ("higher_is_better", "scores", "best"),
    [
        (False, [3.0, 2.0, 2.5, 2.0], [True, True, False, False]),
        (True, [1.0, 2.0, 1.5, 2.0], [True, True, False, False]),
    ],
)
def test_best_safetensors_follows_the_score_direction(tmp_path, higher_is_better, scores, best):
    model, opt, _ = _trained(tmp_path)
    checkpoints = Checkpointer(model, opt, tmp_path, TrainSettings(), "acc", higher_is_better)
    state, kept = LoopState(), []
    for i, score in enumerate(scores):
        with torch.no_grad():
            model.lin.bias.fill_(float(i))  # which call's weights best.safetensors holds
        kept.append(checkpoints.keep_best(state, {"acc": score, "other": -score}))
    assert kept == best
    assert state.best_score == scores[1]
    assert torch.equal(load_file(str(tmp_path / "best.safetensors"))["lin.bias"], torch.ones(4))


# ---------------------------------------------------------------------------- metrics


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_resumed_metrics_drop_the_rows_after_the_checkpoint(tmp_path):
    path = tmp_path / "metrics.jsonl"
    rows = [
        {"step": 10, "train_loss": 2.0},
        {"step": 20, "train_loss": 1.5},
        {"step": 20, "val_loss": 1.7},
        {"step": 25, "skipped_nonfinite": 1},
        {"step": 30, "train_loss": 1.2},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = TrainSettings(max_steps=40)
    with TrainMetrics(tmp_path, cfg, LoopState(step=20), resumed=True, progress=False):
        pass
    assert _rows(path) == rows[:3]
    assert (tmp_path / "loss.png").read_bytes()[:4] == b"\x89PNG"
    with TrainMetrics(tmp_path, cfg, LoopState(), resumed=False, progress=False):
        assert not path.exists(), "a fresh run starts a new metrics.jsonl"


def test_the_train_row_every_20_steps_averages_the_loss_over_their_tokens(tmp_path):
    state = LoopState()
    with TrainMetrics(tmp_path, TrainSettings(max_steps=100), state, resumed=False, progress=False) as m:
        for step in range(1, 41):
            state.step, state.epoch, state.elapsed_s = step, step // 30, step * 3.0
            m.train_step(
                state,
                StepStats(
                    loss_sum=2.0,
                    tokens=step,
                    grad_norm=1.0,
                    elapsed=0.0,
                    lr=step / 1000,
                    stop_requested=False,
                    skipped=False,
                ),
            )
    rows = _rows(tmp_path / "metrics.jsonl")
    keys = ["step", "epoch", "train_loss", "lr", "tokens_per_s", "elapsed_min"]
    assert [list(r) for r in rows] == [keys, keys]
    assert [(r["step"], r["epoch"], r["train_loss"], r["lr"], r["elapsed_min"]) for r in rows] == [
        (20, 0, 40 / 210, 0.02, 1.0),
        (40, 1, 40 / 610, 0.04, 2.0),
    ]  # summed loss / summed tokens
    assert rows[0]["tokens_per_s"] > 0
