"""The one training loop every recipe shares.

It owns what must be right once: gradient accumulation normalised by target tokens, clipping,
the learning-rate schedule, budgets (steps, minutes, epochs), periodic validation, the best
checkpoint, time-spaced snapshots for averaging, ``metrics.jsonl``, a loss-curve PNG, atomic
checkpoints, resume, and a clean stop on Ctrl-C.
"""

from __future__ import annotations

import json
import logging
import math
import random
import signal
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch
from tqdm import tqdm

from ..device import resolve_precision
from .checkpoint import atomic_write, load_weights, save_state, save_weights
from .settings import TrainSettings

logger = logging.getLogger(__name__)


@dataclass
class LoopState:
    """What resume needs besides weights and optimizer: counters, best score, snapshots."""

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    elapsed_s: float = 0.0
    best_score: float | None = None
    last_snapshot_s: float = 0.0
    snapshots: list = field(default_factory=list)


def _plot_curves(metrics_path: Path, out: Path) -> None:
    # The object API draws without pyplot, so no global matplotlib backend is touched.
    from matplotlib.figure import Figure

    rows = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
    train = [(r["step"], r["train_loss"]) for r in rows if "train_loss" in r]
    val = [(r["step"], r["val_loss"]) for r in rows if "val_loss" in r]
    fig = Figure(figsize=(6, 4), layout="tight")
    ax = fig.subplots()
    if train:
        ax.plot(*zip(*train), label="train loss (the training objective)")
    if val:
        ax.plot(*zip(*val), "o-", label="validation loss (NLL)")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss (nats / token)")
    if train or val:
        ax.legend()
    ax.grid(alpha=0.3)
    atomic_write(out, lambda tmp: fig.savefig(tmp, format="png", dpi=100))


def _stop_on_sigterm():
    """Treat SIGTERM (e.g. `kill`, a job scheduler) like Ctrl-C: save, then stop. Returns the
    previous handler, or ``None`` where handlers cannot be set (not the main thread)."""
    def handler(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    try:
        return signal.signal(signal.SIGTERM, handler)
    except ValueError:
        return None


def train_loop(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    lr: Callable[[int, float], float],
    batches: Callable[[int], list],
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
        batches: epoch number → list of batches (the loop remembers its position for resume).
        loss_fn: ``(model, batch) → (summed loss, number of target tokens)``.
        validate: ``model → metrics dict`` (run in eval mode, no grad) or ``None``.
        cfg: budgets, accumulation, clipping, cadence, seed, precision, ``compile``.
        progress: show a progress bar (stderr).
        score_key / higher_is_better: which validation metric picks ``best.safetensors``.
        resume: continue from ``run_dir/last.safetensors`` + ``train_state.pt``.
        precision: ``"bf16"`` (bfloat16 autocast) or ``"fp32"``, as resolved by
            :func:`qkv.device.resolve_precision`; ``None`` resolves ``cfg.precision`` here.

    Files in ``run_dir``: ``last.safetensors`` + ``train_state.pt`` (resume), ``best.safetensors``,
    ``snapshots/step_N.safetensors``, ``metrics.jsonl``, ``loss.png``.

    Raises:
        KeyboardInterrupt: after saving ``last.safetensors`` and the state (Ctrl-C or SIGTERM).
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    metrics_path = run_dir / "metrics.jsonl"
    state = LoopState()
    if resume:
        load_weights(model, run_dir / "last.safetensors")
        saved = torch.load(run_dir / "train_state.pt", weights_only=False)
        optimizer.load_state_dict(saved["optimizer"])
        state = LoopState(**saved["loop"])
        random.setstate(saved["py_rng"])
        torch.set_rng_state(saved["torch_rng"])
    else:
        torch.manual_seed(cfg.seed)
        random.seed(cfg.seed)
        metrics_path.unlink(missing_ok=True)

    def log(row: dict) -> None:
        with metrics_path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")

    def checkpoint() -> None:
        save_weights(model, run_dir / "last.safetensors")
        save_state({"optimizer": optimizer.state_dict(), "loop": asdict(state),
                    "py_rng": random.getstate(), "torch_rng": torch.get_rng_state(),
                    "settings": asdict(cfg)}, run_dir / "train_state.pt")

    def run_validation() -> None:
        if validate is None:
            return
        model.eval()
        with torch.no_grad():
            metrics = validate(model)
        model.train()
        log({"step": state.step, "elapsed_min": round(state.elapsed_s / 60, 2), **metrics})
        score = metrics[score_key]
        better = state.best_score is None or (score > state.best_score if higher_is_better
                                              else score < state.best_score)
        if better:
            state.best_score = score
            save_weights(model, run_dir / "best.safetensors")
        logger.info(f"step {state.step}: " + ", ".join(f"{k} {v:.4g}" for k, v in metrics.items())
                    + (" (best)" if better else ""))

    def snapshot() -> None:
        path = run_dir / "snapshots" / f"step_{state.step}.safetensors"
        save_weights(model, path)
        state.snapshots.append(str(path))
        while len(state.snapshots) > cfg.keep_snapshots:
            Path(state.snapshots.pop(0)).unlink(missing_ok=True)
        state.last_snapshot_s = state.elapsed_s

    def out_of_budget() -> bool:
        return ((cfg.max_steps is not None and state.step >= cfg.max_steps)
                or (cfg.max_minutes is not None and state.elapsed_s >= cfg.max_minutes * 60)
                or (cfg.max_epochs is not None and state.epoch >= cfg.max_epochs))

    def budget_used() -> float:
        """The fraction of the first budget to run out that is spent (time-budget schedules)."""
        return max(0.0 if cfg.max_steps is None else state.step / cfg.max_steps,
                   0.0 if cfg.max_minutes is None else state.elapsed_s / (cfg.max_minutes * 60))

    device = next(model.parameters()).device
    if precision is None:
        precision = resolve_precision(cfg.precision, device)[0]
    previous_sigterm = _stop_on_sigterm()
    model.train()
    # Compiled for the training steps only; validation and checkpoints use the module itself
    # (its state dict has no compile wrapper).
    step_model = torch.compile(model) if cfg.compile else model
    # A time budget fills the bar by seconds (its ETA is then exact); a step budget by steps.
    by_time = cfg.max_steps is None and cfg.max_minutes is not None
    bar = tqdm(total=round(cfg.max_minutes * 60) if by_time else cfg.max_steps,
               initial=round(state.elapsed_s) if by_time else state.step, disable=not progress,
               unit="s" if by_time else "step", dynamic_ncols=True, desc="train",
               bar_format="{desc}: {percentage:3.0f}%|{bar}| {elapsed}<{remaining}{postfix}"
               if by_time else None)
    t0 = time.perf_counter() - state.elapsed_s
    window_loss, window_tokens, window_t = 0.0, 0, time.perf_counter()
    try:
        while not out_of_budget():
            epoch_batches = batches(state.epoch)
            while state.batch_in_epoch < len(epoch_batches) and not out_of_budget():
                group = epoch_batches[state.batch_in_epoch: state.batch_in_epoch + cfg.accum_steps]
                losses, n_tokens = [], 0
                for batch in group:
                    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
                        loss, n = loss_fn(step_model, batch)
                    losses.append(loss)
                    n_tokens += n
                    loss.backward()  # summed loss; normalised by all target tokens below
                for p in model.parameters():
                    if p.grad is not None:
                        p.grad.div_(max(n_tokens, 1))
                if cfg.clip_norm:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_norm)
                state.step += 1
                for g in optimizer.param_groups:
                    g["lr"] = lr(state.step, budget_used())
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                state.batch_in_epoch += len(group)
                state.elapsed_s = time.perf_counter() - t0
                window_loss += float(sum(l.detach() for l in losses))
                window_tokens += n_tokens
                bar.update(min(round(state.elapsed_s), bar.total) - bar.n if by_time else 1)
                if state.step % 20 == 0:
                    dt = time.perf_counter() - window_t
                    row = {"step": state.step, "epoch": state.epoch,
                           "train_loss": window_loss / max(window_tokens, 1),
                           "lr": optimizer.param_groups[0]["lr"], "tokens_per_s": window_tokens / max(dt, 1e-9),
                           "elapsed_min": round(state.elapsed_s / 60, 2)}
                    log(row)
                    left = ("" if cfg.max_minutes is None else
                            f" left {max(0.0, cfg.max_minutes - state.elapsed_s / 60):.1f}m")
                    bar.set_postfix_str(f"loss {row['train_loss']:.3f} lr {row['lr']:.2e} "
                                        f"tok/s {row['tokens_per_s']:.0f} ep {state.epoch}"
                                        + (f" step {state.step}" if by_time else left))
                    window_loss, window_tokens, window_t = 0.0, 0, time.perf_counter()
                if state.step % cfg.eval_every == 0:
                    run_validation()
                    checkpoint()
                if state.elapsed_s - state.last_snapshot_s >= cfg.snapshot_minutes * 60:
                    snapshot()
                    checkpoint()
            if state.batch_in_epoch >= len(epoch_batches):
                state.epoch += 1
                state.batch_in_epoch = 0
        if state.step % cfg.eval_every != 0:
            run_validation()
        if not state.snapshots or not state.snapshots[-1].endswith(f"step_{state.step}.safetensors"):
            snapshot()
        checkpoint()
    except KeyboardInterrupt:
        logger.warning(f"interrupted at step {state.step}; saving {run_dir / 'last.safetensors'}")
        checkpoint()
        raise
    finally:
        if previous_sigterm is not None:
            signal.signal(signal.SIGTERM, previous_sigterm)
        bar.close()
        if metrics_path.exists():
            _plot_curves(metrics_path, run_dir / "loss.png")
    if not math.isfinite(sum(p.detach().float().sum().item() for p in model.parameters())):
        raise FloatingPointError("training diverged: parameters contain NaN/inf")
    return state
