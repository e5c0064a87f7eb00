"""Atomic writes of weights, JSON and training state, and checkpoint averaging.

Every write goes to a temporary file in the same directory and is then renamed over the old
file (``os.replace`` is atomic on POSIX), so a crash or Ctrl-C never leaves a half-written file.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, load_model, save_file, save_model

from ..errors import QkvError


def atomic_write(path: Path, write) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        # mkstemp creates 0600 files; give the usual permissions (0666 minus the umask).
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text(path: Path, text: str) -> None:
    """Atomically write UTF-8 text."""
    atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def write_json(path: Path, data: dict) -> None:
    """Atomically write pretty JSON (UTF-8)."""
    write_text(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def save_weights(model: torch.nn.Module, path: Path) -> None:
    """Atomically save a model's parameters as safetensors (tied weights stored once).

    Parameters stored in another memory layout (see
    :func:`qkv.generate.layout.prepare_for_inference`) are saved in the standard one.
    """
    # safetensors' tied-weight detection needs contiguous tensors: lay them out
    # contiguously while saving, then restore (model.parameters() yields tied ones once).
    relaid = [(p, p.data) for p in model.parameters() if not p.is_contiguous()]
    for p, _ in relaid:
        p.data = p.data.contiguous()
    try:
        atomic_write(path, lambda tmp: save_model(model, tmp))
    finally:
        for p, data in relaid:
            p.data = data


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
        raise QkvError(f"cannot load weights from {path} (corrupt or incompatible): "
                       f"{str(exc).splitlines()[0]}") from None
    if missing or unexpected:
        raise QkvError(f"weights in {path} do not match the model: missing {sorted(missing)}, "
                       f"unexpected {sorted(unexpected)}")


def save_state(state: dict, path: Path) -> None:
    """Atomically ``torch.save`` a training state (optimizer, step, RNG, ...)."""
    atomic_write(path, lambda tmp: torch.save(state, tmp))


def average_weights(paths: list[Path], out: Path) -> None:
    """Average several safetensors checkpoints of one model into ``out`` (paper §6.1: "averaging
    the last 5 checkpoints"). Raises :class:`QkvError` if the files' keys differ."""
    if not paths:
        raise QkvError("no checkpoints to average")
    total = None
    for p in paths:
        sd = load_file(str(p))
        if total is None:
            total = {k: v.double() for k, v in sd.items()}
        elif sd.keys() != total.keys():
            raise QkvError(f"checkpoint {p} has different keys from {paths[0]}")
        else:
            for k, v in sd.items():
                total[k] += v.double()
    first = load_file(str(paths[0]))
    avg = {k: (v / len(paths)).to(first[k].dtype).contiguous() for k, v in total.items()}
    atomic_write(out, lambda tmp: save_file(avg, tmp))
