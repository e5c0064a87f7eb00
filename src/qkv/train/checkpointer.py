"""What a run keeps on disk to be resumed, picked from or averaged, and how it resumes.

Exact resume: ``train_state.pt`` holds, in one atomically written file, everything the next
step depends on: weights, optimizer moments, the step and the position in the epoch's batch
order (each recipe's order is a function of ``seed`` and the epoch), and every RNG (Python,
NumPy, torch CPU and CUDA). A run killed at any moment (even SIGKILL) and resumed repeats the
steps since that checkpoint exactly, so with a step budget on CPU in fp32 it ends with the same
bits as a run never interrupted. A time budget (``max_minutes``) cannot: where it ends, and the
learning rate of a time-based schedule, depend on the machine's speed.

Files in the run directory (written by rank 0 only; see :class:`Checkpointer`):
``train_state.pt`` (and ``train_state.prev.pt``, the one it replaced), ``last.safetensors``,
``best.safetensors`` and ``snapshots/step_N.safetensors``; the state file's format is
:mod:`qkv.train.train_state`'s. The snapshots are averaged into the final weights by
:func:`average_weights` (§6.1).
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from safetensors.torch import save_file

from .. import distributed
from ..errors import QkvError
from ..files import atomic_write, read_safetensors, save_weights
from ..runs.layout import BEST, LAST, TRAIN_STATE, remove_run_file, run_file, snapshot_name
from .train_settings import TrainSettings
from .train_state import STATE_FORMAT_VERSION, load_state, save_state, upgrade_train_state


@dataclass
class LoopState:
    """What resume needs besides weights and optimizer: counters, best score, snapshots."""

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    elapsed_s: float = 0.0
    best_score: float | None = None
    last_snapshot_s: float = 0.0
    snapshots: list[str] = field(default_factory=list)
    skipped_nonfinite: int = 0

    def record_snapshot(self, name: str, keep: int) -> list[str]:
        """Record the snapshot ``name`` (``keep`` >= 1) of this step, taken now on the loop's
        clock; return the older ones beyond the newest ``keep``, no longer recorded."""
        self.snapshots.append(name)
        self.last_snapshot_s = self.elapsed_s
        dropped = self.snapshots[:-keep]
        del self.snapshots[:-keep]
        return dropped


def rng_state() -> dict[str, Any]:
    """Every RNG a training step may draw from (Python, NumPy's global, torch CPU and CUDA), as
    tensors and plain values that ``torch.load(weights_only=True)`` reads back (NumPy's key is
    an int64 tensor: its uint32 array would not be)."""
    # the legacy tuple (get_state's default), which NumPy's stubs type as "tuple or dict"
    name, keys, pos, has_gauss, gauss = cast("tuple[str, np.ndarray, int, int, float]", np.random.get_state())
    return {
        "python": random.getstate(),
        "torch": torch.get_rng_state(),
        "numpy": (name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(saved: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` returned. A ``"numpy"`` of ``None`` (a state written
    before NumPy's stream was saved, see :func:`qkv.train.train_state.upgrade_train_state`) leaves NumPy's
    stream as it is, as those versions did on resume."""
    version, internal, gauss = saved["python"]
    random.setstate((version, tuple(internal), gauss))  # a list after a round trip through torch.save
    torch.set_rng_state(saved["torch"])
    if saved["numpy"] is not None:
        name, keys, pos, has_gauss, gauss = saved["numpy"]
        np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    if saved["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(saved["cuda"])


class Checkpointer:
    """Writes and reads one run directory's checkpoints for the training loop.

    Every process calls every method (:meth:`save` gathers each one's RNG streams, and each
    keeps its own :class:`LoopState` in step); only rank 0 writes files.

    Args:
        model: the module itself (not its DDP or compiled wrapper: its state dict has no
            wrapper prefixes).
        score_key / higher_is_better: which validation metric picks ``best.safetensors``, and
            in which direction it improves.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        run_dir: Path,
        cfg: TrainSettings,
        score_key: str = "val_loss",
        higher_is_better: bool = False,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.run_dir = Path(run_dir)
        self.cfg = cfg
        self.score_key = score_key
        self.higher_is_better = higher_is_better
        self.state_path = self.run_dir / TRAIN_STATE

    def save(self, state: LoopState) -> None:
        """Write ``train_state.pt`` (model, optimizer, ``state``, every rank's RNG streams in
        rank order, the process count, the settings) and ``last.safetensors`` (the same weights,
        for loading without the optimizer)."""
        rngs = distributed.gather_objects(rng_state())
        if distributed.is_main():
            # One file for all of it: two files could be caught half-updated by a SIGKILL.
            save_state(
                {
                    "format_version": STATE_FORMAT_VERSION,
                    "model": self.model.state_dict(),
                    "optimizer": self.optimizer.state_dict(),
                    "loop": asdict(state),
                    "rng": rngs,
                    "world_size": distributed.context().world_size,
                    "settings": asdict(self.cfg),
                },
                self.state_path,
            )
            save_weights(self.model, self.run_dir / LAST)

    def keep_best(self, state: LoopState, scores: dict[str, float]) -> bool:
        """Whether ``scores[score_key]`` beats ``state.best_score``; if so it becomes the best
        and the model's weights are written to ``best.safetensors``.

        Raises:
            KeyError: ``scores`` lacks ``score_key`` (the recipe's validation and its score key
                disagree).
        """
        score = scores[self.score_key]
        better = state.best_score is None or (
            score > state.best_score if self.higher_is_better else score < state.best_score
        )
        if better:
            state.best_score = score
            if distributed.is_main():
                save_weights(self.model, self.run_dir / BEST)
        return better

    def snapshot(self, state: LoopState) -> None:
        """Write ``snapshots/step_N.safetensors`` for averaging and delete the oldest beyond
        ``cfg.keep_snapshots``; ``state`` records which exist, by their names relative to the
        run directory (a resumed run prunes what the run before it wrote; a copy of the run
        prunes its own files, never the original's), and when this one was taken."""
        name = snapshot_name(state.step)
        main = distributed.is_main()
        if main:
            save_weights(self.model, run_file(self.run_dir, name))
        for old in state.record_snapshot(name, self.cfg.keep_snapshots):
            if main:
                remove_run_file(self.run_dir, old)

    def resume(self) -> LoopState:
        """Load ``train_state.pt`` (any version's, through :func:`qkv.train.train_state.upgrade_train_state`)
        into the model, the optimizer and this process's RNG streams; return its loop state.

        Raises:
            QkvError: the state is missing, truncated or corrupt, was written by a run on
                another number of processes (each has its own random streams), or holds the
                weights of another model or the optimizer state of other trained weights.
        """
        saved = upgrade_train_state(load_state(self.state_path), self.run_dir, self.model)
        ctx = distributed.context()
        if saved["world_size"] != ctx.world_size:
            raise QkvError(
                f"{self.run_dir} was trained on {saved['world_size']} process(es); resume "
                f"it on as many (its random streams are per process), not {ctx.world_size}"
            )
        try:
            self.model.load_state_dict(saved["model"])
        except RuntimeError as exc:  # a state of another model (shapes or names differ)
            detail = [line.strip() for line in str(exc).splitlines() if line.strip()][-1]
            raise QkvError(f"{self.state_path} holds the weights of another model ({detail})") from None
        try:
            self.optimizer.load_state_dict(saved["optimizer"])
        except (ValueError, KeyError) as exc:  # other parameter groups: other weights trained
            raise QkvError(
                f"{self.state_path} holds the optimizer state of other trained weights ({exc})"
            ) from None
        set_rng_state(saved["rng"][ctx.rank])
        return LoopState(**saved["loop"])


def average_weights(paths: list[Path], out: Path) -> None:
    """Average several safetensors checkpoints of one model into ``out`` (paper §6.1: "averaging
    the last 5 checkpoints"). Raises :class:`QkvError` if the files' keys differ."""
    if not paths:
        raise QkvError("no checkpoints to average")
    total: dict[str, torch.Tensor] | None = None
    dtypes: dict[str, torch.dtype] = {}
    for p in paths:
        sd = read_safetensors(p)
        if total is None:
            total = {k: v.double() for k, v in sd.items()}
            dtypes = {k: v.dtype for k, v in sd.items()}  # the first file's, kept in the average
        elif sd.keys() != total.keys():
            raise QkvError(f"checkpoint {p} has different keys from {paths[0]}")
        else:
            for k, v in sd.items():
                total[k] += v.double()
    assert total is not None  # paths is not empty: the first file set it
    avg = {k: (v / len(paths)).to(dtypes[k]).contiguous() for k, v in total.items()}
    atomic_write(out, lambda tmp: save_file(avg, tmp))
