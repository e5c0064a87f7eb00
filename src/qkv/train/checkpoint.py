"""Atomic writes of weights, JSON and training state, and checkpoint averaging.

Every write goes to a temporary file in the same directory, is flushed to disk (``fsync``) and
is then renamed over the old file (``os.replace`` is atomic on POSIX), so a crash, SIGKILL or
power cut never leaves a half-written file under the real name.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, load_model, save_file

from ..errors import QkvError
from . import distributed


def atomic_write(path: Path, write: Callable[[str], object]) -> None:
    """Call ``write(tmp)`` on a temporary file beside ``path``, flush it to disk and rename it
    to ``path``. Under torchrun only rank 0 writes: elsewhere this does nothing, so every file
    a run writes comes from one process."""
    if not distributed.is_main():
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        _fsync(tmp)
        # mkstemp creates 0600 files; give the usual permissions (0666 minus the umask).
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync(path.parent)  # the rename itself is on disk


def _fsync(path: str | Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # a directory that cannot be opened (some platforms): nothing to flush
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_text(path: Path, text: str) -> None:
    """Atomically write UTF-8 text."""
    atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def write_json(path: Path, data: dict) -> None:
    """Atomically write pretty JSON (UTF-8)."""
    write_text(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def save_weights(model: torch.nn.Module, path: Path) -> None:
    """Atomically save a model's parameters and persistent buffers as safetensors.

    Tied weights (one parameter under several names) are stored once, under the first name in
    sorted order, as safetensors' ``save_model`` does, so ``load_weights`` re-ties them. Every
    tensor is saved as a contiguous copy, whatever its memory layout in the model (see
    :func:`qkv.generate.layout.prepare_for_inference`); the model is not touched.
    """
    names: dict[int, list[str]] = {}
    tensors: dict[int, torch.Tensor] = {}
    for name, t in model.state_dict(keep_vars=True).items():  # keep_vars: tied = same object
        names.setdefault(id(t), []).append(name)
        tensors[id(t)] = t
    state, metadata = {}, {}
    for key, group in names.items():
        keep, *dropped = sorted(group)
        state[keep] = tensors[key].detach().contiguous()
        metadata.update({name: keep for name in dropped})  # what save_model records
    atomic_write(path, lambda tmp: save_file(state, tmp, metadata=metadata or None))


def load_weights(model: torch.nn.Module, path: Path) -> None:
    """Load safetensors weights into ``model``.

    Raises:
        QkvError: file missing, corrupt, or with missing/unexpected keys (named).
    """
    path = Path(path)
    if not path.is_file():
        raise QkvError(f"weights file not found: {path}")
    try:
        missing, unexpected = load_model(model, str(path), strict=False)
    except (SafetensorError, OSError, RuntimeError, ValueError) as exc:
        raise QkvError(
            f"cannot load weights from {path} (corrupt or incompatible): {str(exc).splitlines()[0]}"
        ) from None
    if missing or unexpected:
        raise QkvError(
            f"weights in {path} do not match the model: missing {sorted(missing)}, "
            f"unexpected {sorted(unexpected)}"
        )


def previous_state_path(path: Path) -> Path:
    """Where :func:`save_state` keeps the state it replaced: ``train_state.prev.pt``."""
    path = Path(path)
    return path.with_name(f"{path.stem}.prev{path.suffix}")


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file.

    Raises:
        QkvError: the file is missing, truncated or corrupt (named).
    """
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise QkvError(
            f"cannot read {path}: truncated or corrupt ({str(exc).splitlines()[0][:200]})"
        ) from None


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


def torch_load_refusal(exc: Exception) -> str:
    """Why ``torch.load(weights_only=True)`` refused a file, as the end of a sentence whose
    subject is the file ("is truncated", "holds a pickled ``module.Class``, ..."), in words that
    never suggest loading it unsafely (PyTorch's own message advises ``weights_only=False``)."""
    text = str(exc)
    if "central directory" in text or isinstance(exc, EOFError):
        return "is truncated"
    if "mmap can only be used" in text or "zip archive" in text:
        return "is not a PyTorch checkpoint"
    if "Weights only load failed" in text or type(exc).__name__ == "UnpicklingError":
        found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", text)
        what = f"a pickled {found.group(1)}" if found else "objects other than tensors and plain values"
        return f"holds {what}, and qkv never unpickles code (save the tensors alone, e.g. as safetensors)"
    line = (text.strip().splitlines() or [type(exc).__name__])[0]
    return "cannot be read: " + line.split(" Re-running")[0][:200]


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
