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
from safetensors.torch import load_file, load_model, save_file

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
