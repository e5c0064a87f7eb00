"""The training state, ``train_state.pt``: written atomically, read without unpickling code,
and brought up to today's format from any earlier version's (its own ``format_version``).

What the loop puts in it and when it saves, restores and snapshots is
:mod:`qkv.train.checkpointer`'s.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from pathlib import Path, PurePath

import torch

from ..errors import QkvError
from ..files import atomic_write, load_weights, torch_load_refusal
from ..runs.layout import LAST, SNAPSHOTS, run_file

logger = logging.getLogger(__name__)

# Written into train_state.pt as "format_version" (its own number: the state changes apart
# from the JSON files); a state without it is version 1. 2: snapshots named inside the run.
STATE_FORMAT_VERSION = 2


def check_state_version(state: dict) -> None:
    """Refuse a training state written by a newer qkv (its ``format_version`` above
    :data:`STATE_FORMAT_VERSION`), whose contents this qkv would misread.

    Raises:
        QkvError: in one line, saying which versions this qkv reads.
    """
    version = state.get("format_version", 1)
    if not isinstance(version, int) or version > STATE_FORMAT_VERSION:
        raise QkvError(
            f"was written by a newer qkv (format_version {version!r}; this qkv reads up to "
            f"{STATE_FORMAT_VERSION}): upgrade qkv to resume it"
        )


def upgrade_train_state(saved: dict, run_dir: Path, model: torch.nn.Module) -> dict:
    """A ``train_state.pt`` as today's loop reads it, from any version's.

    Older states lack what later versions added: the weights (kept only in
    ``last.safetensors`` then), per-process RNG streams (one Python and one torch CPU state,
    no NumPy stream) and the process count (one).

    Args:
        saved: the dict ``torch.load`` read from ``run_dir / "train_state.pt"``.
        run_dir: its run directory (an old state's weights are in ``last.safetensors``).
        model: the model being resumed (an old state's weights are read into it, ties and all).

    Older states also list snapshots as ``--out`` was given (absolute, or relative to where the
    command ran): each entry is mapped into ``run_dir`` by :func:`recorded_snapshot`.

    Returns:
        ``saved`` with ``"model"``, ``"rng"`` (a list, one entry per process: Python, torch,
        NumPy (``None`` where the old state had none) and CUDA states), ``"world_size"`` and the
        loop state's ``"snapshots"`` named relative to ``run_dir``.

    Raises:
        QkvError: an old state whose ``last.safetensors`` is missing or does not fit ``model``.
    """
    saved = dict(saved)
    saved.pop("format_version", None)  # checked as the file was read (check_state_version)
    if "model" not in saved:  # states written before the weights moved into them
        load_weights(model, run_dir / LAST)
        saved["model"] = model.state_dict()
    if "rng" not in saved:  # states written before per-process streams
        saved["rng"] = [
            {"python": saved.pop("py_rng"), "torch": saved.pop("torch_rng"), "numpy": None, "cuda": []}
        ]
    saved.setdefault("world_size", 1)
    recorded = saved.get("loop", {}).get("snapshots", [])
    names = [name for entry in recorded if (name := recorded_snapshot(run_dir, entry)) is not None]
    if names != recorded:  # snapshots recorded as --out was given
        saved["loop"] = {**saved["loop"], "snapshots": names}
    return saved


_SNAPSHOT_FILE = re.compile(r"step_\d+\.safetensors")


def recorded_snapshot(run_dir: Path, recorded: str) -> str | None:
    """A snapshot entry of any version's training state as today's name
    (:func:`~qkv.runs.layout.snapshot_name`).

    Today's entries (``snapshots/step_N.safetensors``) are returned as they are. An earlier
    version's entry (absolute, or relative to another working directory) becomes
    ``snapshots/<its file name>`` when that file is in this run's ``snapshots/``; otherwise
    ``None``: the entry is dropped, and the file it named is never read or removed.
    """
    path = PurePath(recorded)
    if not _SNAPSHOT_FILE.fullmatch(path.name) or path.parent.name != SNAPSHOTS:
        logger.warning(f"{run_dir}: ignoring the snapshot entry {recorded!r} (not a snapshot of a run)")
        return None
    name = f"{SNAPSHOTS}/{path.name}"
    if recorded == name:
        return name
    if run_file(run_dir, name).is_file():
        return name
    logger.warning(
        f"{run_dir}: the snapshot {recorded} recorded by an earlier qkv is not in this run directory; "
        "it is left out of averaging and never touched"
    )
    return None


def previous_state_path(path: Path) -> Path:
    """Where :func:`save_state` keeps the state it replaced: ``train_state.prev.pt``."""
    path = Path(path)
    return path.with_name(f"{path.stem}.prev{path.suffix}")


def save_state(state: dict, path: Path) -> None:
    """Atomically ``torch.save`` a training state (model, optimizer, step, RNG, ...), keeping
    the state it replaces as :func:`previous_state_path` (a fallback should the newest ever be
    damaged). ``state`` must hold only tensors, numbers, strings, ``None`` and dicts, lists and
    tuples of them, so that :func:`load_state` can read it without unpickling code."""
    path = Path(path)
    if path.is_file():
        # Link (or copy) the current file, then rename: at every moment one complete state
        # file is at ``path`` and the previous one is complete or absent.
        prev = previous_state_path(path)
        tmp = prev.with_name(f".{prev.name}.tmp")
        tmp.unlink(missing_ok=True)
        try:
            os.link(path, tmp)
        except OSError:  # a file system without hard links
            shutil.copyfile(path, tmp)
        os.replace(tmp, prev)
    atomic_write(path, lambda tmp: torch.save(state, tmp))


_STATE_KEYS = ("optimizer", "loop")


def _read_state(path: Path, mmap: bool) -> dict:
    """The state at ``path`` (``torch.load(weights_only=True)``), or :class:`QkvError` naming
    why it cannot be used."""
    if not path.is_file():
        raise QkvError(f"nothing to resume: {path} not found")
    if path.stat().st_size == 0:
        raise QkvError("is empty")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as exc:  # torch raises RuntimeError, UnpicklingError, EOFError, ...
        raise QkvError(torch_load_refusal(exc)) from None
    if not isinstance(state, dict) or any(k not in state for k in _STATE_KEYS):
        raise QkvError(f"is not a qkv training state (it lacks {', '.join(_STATE_KEYS)})")
    check_state_version(state)
    return state


def load_state(path: Path, mmap: bool = False) -> dict:
    """Read a :func:`save_state` file with ``torch.load(weights_only=True)``: tensors and plain
    containers only, no pickled code runs. ``mmap``: map the tensors instead of reading them
    (what :func:`check_state` uses to check a file cheaply).

    Raises:
        QkvError: the file is missing, truncated, corrupt or holds other objects; the message
            names it and, when it is readable, the previous good state and its step.
    """
    path = Path(path)
    try:
        return _read_state(path, mmap)
    except QkvError as exc:
        if not path.is_file():
            raise
        reason = str(exc)
    prev, offer = previous_state_path(path), ""
    try:
        step = _read_state(prev, mmap=True)["loop"]["step"]
        offer = (
            f"; the previous state {prev.name} (step {step}) is readable: "
            f"mv {prev} {path} and resume again to continue from step {step}"
        )
    except (QkvError, KeyError, TypeError):
        pass
    raise QkvError(f"training state {path} {reason}{offer}")


def check_state(path: Path) -> None:
    """Raise :class:`QkvError` as :func:`load_state` would, reading only the file's index (the
    tensors are memory-mapped, not read): a resume checks its state before writing anything."""
    load_state(path, mmap=True)
