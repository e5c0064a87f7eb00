"""The one training loop every recipe shares.

It owns what must be right once: gradient accumulation normalised by target tokens, clipping,
the learning-rate schedule, budgets (steps, minutes, epochs), periodic validation, the best
checkpoint, time-spaced snapshots for averaging, ``metrics.jsonl``, a loss-curve PNG, atomic
checkpoints, exact resume, a stop on a non-finite loss, and a clean stop on Ctrl-C.

Exact resume: ``train_state.pt`` holds, in one atomically written file, everything the next
step depends on: weights, optimizer moments, the step and the position in the epoch's batch
order (each recipe's order is a function of ``seed`` and the epoch), and every RNG (Python,
NumPy, torch CPU and CUDA). A run killed at any moment (even SIGKILL) and resumed repeats the
steps since that checkpoint exactly, so with a step budget on CPU in fp32 it ends with the same
bits as a run never interrupted. A time budget (``max_minutes``) cannot: where it ends, and the
learning rate of a time-based schedule, depend on the machine's speed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import random
import signal
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from tqdm import tqdm

from ..device import resolve_precision
from ..errors import QkvError
from . import distributed
from .checkpoint import atomic_write, load_state, load_weights, save_state, save_weights, write_text
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
    skipped_nonfinite: int = 0


class NonFiniteLoss(QkvError):
    """A NaN or infinite loss or gradient norm: the step is named; its update was not applied."""


def rng_state() -> dict:
    """Every RNG a training step may draw from (Python, NumPy's global, torch CPU and CUDA), as
    tensors and plain values that ``torch.load(weights_only=True)`` reads back."""
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    return {"python": random.getstate(), "torch": torch.get_rng_state(),
            "numpy": (name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}


def set_rng_state(saved: dict) -> None:
    """Restore what :func:`rng_state` returned."""
    version, internal, gauss = saved["python"]
    random.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(saved["torch"])
    name, keys, pos, has_gauss, gauss = saved["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    if saved["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(saved["cuda"])


def _first_nonfinite_grad(model: torch.nn.Module) -> str | None:
    for name, p in model.named_parameters():
        if p.grad is not None and not torch.isfinite(p.grad).all():
            return name
    return None


def _truncate_metrics(path: Path, step: int) -> None:
    """Drop the rows a resumed run will write again (those after its checkpoint's step)."""
    if path.exists():
        rows = [r for r in path.read_text(encoding="utf-8").splitlines()
                if r.strip() and json.loads(r).get("step", 0) <= step]
        write_text(path, "".join(r + "\n" for r in rows))


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


class _StopRequests:
    """Ctrl-C (SIGINT) and SIGTERM (``kill``, a job scheduler, torchrun) ask the loop to stop
    at the end of the current step, where the checkpoint it writes is exact; a second signal
    stops at once (the last checkpoint is then kept as it was). Outside the main thread no
    handler can be set and Python's defaults apply."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: dict = {}

    def _handle(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt(f"signal {signum} (second)")
        self.requested = True
        logger.warning(f"signal {signum}: stopping after this step (again to stop at once)")

    def __enter__(self) -> "_StopRequests":
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


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
        batches: epoch number → list of batches, the same on every call and every process
            (the loop remembers its position for resume and shares each step's batches out
            among torchrun's processes, see :mod:`qkv.train.distributed`).
        loss_fn: ``(model, batch) → (summed loss, number of target tokens)``.
        validate: ``model → metrics dict`` (run in eval mode, no grad, by rank 0) or ``None``.
        cfg: budgets, accumulation, clipping, cadence, seed, precision, ``compile``.
        progress: show a progress bar (stderr).
        score_key / higher_is_better: which validation metric picks ``best.safetensors``.
        resume: continue from ``run_dir/train_state.pt`` (see the module's "exact resume").
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
        QkvError: ``resume`` with a missing, truncated or corrupt ``train_state.pt``, or from a
            run on another number of processes.
    """
    run_dir = Path(run_dir)
    ctx = distributed.context()
    main = ctx.is_main
    # Fewer micro-batches per step than processes: each process takes its rows of every one.
    split_rows = ctx.world_size > cfg.accum_steps
    if main:
        run_dir.mkdir(parents=True, exist_ok=True)
    metrics_path = run_dir / "metrics.jsonl"
    state = LoopState()
    if resume:
        saved = load_state(run_dir / "train_state.pt")
        if saved.get("world_size", 1) != ctx.world_size:
            raise QkvError(f"{run_dir} was trained on {saved.get('world_size', 1)} process(es); resume "
                           f"it on as many (its random streams are per process), not {ctx.world_size}")
        if "model" in saved:
            try:
                model.load_state_dict(saved["model"])
            except RuntimeError as exc:  # a state of another model (shapes or names differ)
                detail = [line.strip() for line in str(exc).splitlines() if line.strip()][-1]
                raise QkvError(f"{run_dir / 'train_state.pt'} holds the weights of another model "
                               f"({detail})") from None
        else:  # states written before the weights moved into them
            load_weights(model, run_dir / "last.safetensors")
        optimizer.load_state_dict(saved["optimizer"])
        state = LoopState(**saved["loop"])
        if "rng" in saved:
            set_rng_state(saved["rng"][ctx.rank])
        else:
            random.setstate(saved["py_rng"])
            torch.set_rng_state(saved["torch_rng"])
        if main:
            _truncate_metrics(metrics_path, state.step)
        logger.info(f"resumed at step {state.step} (epoch {state.epoch}, batch {state.batch_in_epoch})")
    else:
        # Rank r draws dropout from seed + r; the weights are rank 0's (DDP broadcasts them).
        torch.manual_seed(cfg.seed + ctx.rank)
        random.seed(cfg.seed + ctx.rank)
        np.random.seed(cfg.seed + ctx.rank)
        if main:
            metrics_path.unlink(missing_ok=True)

    def log(row: dict) -> None:
        if main:
            with metrics_path.open("a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")

    def checkpoint() -> None:
        rngs = distributed.gather_objects(rng_state())  # every rank's streams, in rank order
        if main:
            # One file for all of it: two files could be caught half-updated by a SIGKILL.
            save_state({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "loop": asdict(state), "rng": rngs, "world_size": ctx.world_size,
                        "settings": asdict(cfg)}, run_dir / "train_state.pt")
            save_weights(model, run_dir / "last.safetensors")

    def run_validation() -> None:
        if validate is None or not main:
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
        if main:
            save_weights(model, path)
        state.snapshots.append(str(path))
        while len(state.snapshots) > cfg.keep_snapshots:
            old = Path(state.snapshots.pop(0))
            if main:
                old.unlink(missing_ok=True)
        state.last_snapshot_s = state.elapsed_s

    def skip_nonfinite(loss_sum: float, grad_norm: float) -> None:
        """Discard the step's gradients; stop unless ``cfg.skip_nonfinite`` allows one more."""
        bad = _first_nonfinite_grad(model)
        optimizer.zero_grad(set_to_none=True)
        what = (f"non-finite loss at step {state.step + 1} (loss {loss_sum}, gradient norm {grad_norm}"
                + (f", first non-finite gradient: {bad})" if bad else ")"))
        state.skipped_nonfinite += 1
        if state.skipped_nonfinite > cfg.skip_nonfinite:
            raise NonFiniteLoss(f"{what}; the update was not applied and the last checkpoint in "
                                f"{run_dir} is untouched (train.skip_nonfinite=N skips up to N such "
                                "steps; a lower train.lr often cures a divergence)")
        logger.warning(f"{what}: skipped ({state.skipped_nonfinite} of train.skip_nonfinite="
                       f"{cfg.skip_nonfinite})")
        log({"step": state.step, "skipped_nonfinite": state.skipped_nonfinite})

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
    model.train()
    ddp = (torch.nn.parallel.DistributedDataParallel(
        model, device_ids=[device.index] if device.type == "cuda" else None) if ctx.enabled else None)
    # Compiled for the training steps only; validation and checkpoints use the module itself
    # (its state dict has no compile or DDP wrapper).
    step_model = ddp or model
    if cfg.compile:
        step_model = torch.compile(step_model)
    params = [p for p in model.parameters() if p.requires_grad]
    # A time budget fills the bar by seconds (its ETA is then exact); a step budget by steps.
    by_time = cfg.max_steps is None and cfg.max_minutes is not None
    bar = tqdm(total=round(cfg.max_minutes * 60) if by_time else cfg.max_steps,
               initial=round(state.elapsed_s) if by_time else state.step, disable=not (progress and main),
               unit="s" if by_time else "step", dynamic_ncols=True, desc="train",
               bar_format="{desc}: {percentage:3.0f}%|{bar}| {elapsed}<{remaining}{postfix}"
               if by_time else None)
    t0 = time.perf_counter() - state.elapsed_s
    window_loss, window_tokens, window_t = 0.0, 0, time.perf_counter()
    in_step = stopping = False
    # float64 keeps token counts and seconds exact; MPS has no float64
    stat_dtype = torch.float32 if device.type == "mps" else torch.float64
    with _StopRequests() as stop, _plot_at_exit(main, metrics_path, run_dir / "loss.png"), bar:
        try:
            if not resume:
                checkpoint()  # from here on, a killed run can always be resumed
            while not out_of_budget():
                epoch_batches = batches(state.epoch)
                while state.batch_in_epoch < len(epoch_batches) and not out_of_budget():
                    group = epoch_batches[state.batch_in_epoch: state.batch_in_epoch + cfg.accum_steps]
                    if not split_rows and len(group) < ctx.world_size:  # an epoch's short last group
                        state.batch_in_epoch += len(group)
                        continue
                    in_step = True
                    mine = (_my_rows(group, ctx.rank, ctx.world_size) if split_rows
                            else [(b, True) for b in group[ctx.rank::ctx.world_size]])
                    losses, n_tokens = [], 0
                    for i, (batch, counts) in enumerate(mine):
                        # DDP averages gradients over the processes on the last backward only
                        with (ddp.no_sync() if ddp is not None and i < len(mine) - 1
                              else contextlib.nullcontext()):
                            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
                                loss, n = loss_fn(step_model, batch)
                            if not counts:  # no rows for this process: it joins the step with zeros
                                loss, n = loss * 0.0, 0
                            loss.backward()  # summed loss; normalised by all target tokens below
                        losses.append(loss.detach().to(stat_dtype))
                        n_tokens += n
                    # [loss, target tokens, seconds, stop] summed over the processes, on the device
                    stats = torch.stack([sum(losses), *torch.tensor(
                        [n_tokens, (time.perf_counter() - t0) / ctx.world_size, float(stop.requested)],
                        dtype=stat_dtype).to(device)])
                    distributed.all_reduce_(stats)
                    # DDP's mean over W processes, times W, over all tokens = the 1-process sum / tokens
                    divisor = stats[1].clamp(min=1) / ctx.world_size
                    for p in params:
                        if p.grad is not None:
                            p.grad.div_(divisor)
                    # an infinite max_norm measures without clipping
                    grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.clip_norm or math.inf)
                    loss_sum, norm, total_tokens, elapsed, stop_votes = torch.cat(
                        [stats[:1], grad_norm.detach().to(stat_dtype).view(1), stats[1:]]).tolist()  # one sync
                    if not (math.isfinite(loss_sum) and math.isfinite(norm)):
                        skip_nonfinite(loss_sum, norm)
                        state.batch_in_epoch += len(group)
                        in_step = False
                        continue
                    state.step += 1
                    for g in optimizer.param_groups:
                        g["lr"] = lr(state.step, budget_used())
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                    state.batch_in_epoch += len(group)
                    state.elapsed_s = elapsed
                    in_step = False
                    window_loss += loss_sum
                    window_tokens += int(total_tokens)
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
                    if stop_votes:
                        stopping = True
                        checkpoint()
                        logger.warning(f"stopped at step {state.step}; checkpoint saved in {run_dir}")
                        raise KeyboardInterrupt(f"stopped by a signal at step {state.step}")
                if state.batch_in_epoch >= len(epoch_batches):
                    state.epoch += 1
                    state.batch_in_epoch = 0
            if state.step % cfg.eval_every != 0:
                run_validation()
            if not state.snapshots or not state.snapshots[-1].endswith(f"step_{state.step}.safetensors"):
                snapshot()
            checkpoint()
        except KeyboardInterrupt:
            # Between steps the state is whole and can be saved; within a step (a second
            # signal) it is not, and with several processes they may be at different points:
            # then the last checkpoint stands.
            if not stopping and not in_step and not ctx.enabled:
                logger.warning(f"interrupted at step {state.step}; saving {run_dir / 'train_state.pt'}")
                checkpoint()
            elif in_step:
                logger.warning(f"stopped within step {state.step + 1}; the last checkpoint stands")
            raise
    if not math.isfinite(sum(p.detach().float().sum().item() for p in model.parameters())):
        raise NonFiniteLoss(f"training diverged: parameters contain NaN/inf after step {state.step}")
    return state


def _my_rows(group: list, rank: int, world_size: int) -> list[tuple[object, bool]]:
    """``(batch, counts)`` per micro-batch of ``group``: this process's rows of it
    (:func:`qkv.train.distributed.share`), or, where it has none, the whole micro-batch with
    ``counts`` false (its loss is then multiplied by zero: every process must run a backward
    for DDP's gradient exchange)."""
    out = []
    for batch in group:
        part = distributed.share(batch, rank, world_size)
        out.append((part, True) if len(part) else (batch, False))
    return out


@contextlib.contextmanager
def _plot_at_exit(main: bool, metrics_path: Path, out: Path):
    """Draw ``loss.png`` from ``metrics.jsonl`` when the loop ends, however it ends."""
    try:
        yield
    finally:
        if main and metrics_path.exists():
            _plot_curves(metrics_path, out)
