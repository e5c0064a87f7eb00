"""Training states (saved atomically, read without unpickling code) and checkpoint averaging.

The atomic writers of weights, JSON and text live in :mod:`qkv.files`; their old names here
(``qkv.train.checkpoint.write_json``, ...) still work for one release, with a
``DeprecationWarning``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from .. import _moved
from ..compat import check_state_version
from ..errors import QkvError
from ..files import atomic_write, read_safetensors, torch_load_refusal


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


# names that moved to qkv.files (issue 42), importable from here for one more release: see qkv._moved
__getattr__ = _moved.names_of(__name__)
