"""Atomic file writes (weights, JSON, text), safe reads of weights, and the rule for a new
output folder (:func:`folder_obstacle`): the low-level I/O that data, models, hub, training and
the command line all use.

Every write goes to a temporary file in the same directory, is flushed to disk (``fsync``) and
is then renamed over the old file (``os.replace`` is atomic on POSIX), so a crash, SIGKILL or
power cut never leaves a half-written file under the real name. These functions write whenever
they are called: under torchrun the caller decides which process writes (the training run's
files come from rank 0, see :mod:`qkv.train.run`).
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, load_model, save_file

from .errors import QkvError


def atomic_write(path: Path, write: Callable[[str], object]) -> None:
    """Call ``write(tmp)`` on a temporary file beside ``path``, flush it to disk and rename it
    to ``path`` (in every process that calls it: the caller decides which one writes)."""
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


def read_json(path: Path, what: str = "JSON object") -> dict:
    """The JSON object in ``path`` (written by :func:`write_json`).

    Raises:
        QkvError: an unreadable file or invalid JSON, or JSON that is not an object (then the
            message says the file is not a ``what``).
    """
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise QkvError(f"cannot read {path}: {exc}") from None
    if not isinstance(data, dict):
        raise QkvError(f"{path} is not a {what}")
    return data


def folder_obstacle(path: str | Path) -> tuple[str, Path]:
    """What stands where an output folder is to be written, as ``(kind, where)``: the one rule
    of every command that writes a folder (exports, conversions, ``qkv train``'s run directory,
    prepared data, embeddings, pictures), each of which words its own refusal. Touches nothing.

    Returns:
        ``("", path)``: nothing (``path`` does not exist and can be made, or is an empty
        folder); ``("file", path)``: a file (anything but a folder) is there; ``("under a
        file", parent)``: the nearest existing parent is a file, so no folder can be made
        there; ``("not empty", path)``: a folder that holds anything.
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        return "file", path
    parent = next((p for p in path.parents if p.exists()), None)
    if parent is not None and not parent.is_dir():
        return "under a file", parent
    if path.is_dir() and any(path.iterdir()):
        return "not empty", path
    return "", path


def refuse_nonempty(path: str | Path, what: str = "run directory") -> None:
    """Raise :class:`QkvError` when ``path`` cannot be a new folder (:func:`folder_obstacle`):
    what :func:`qkv.hub.convert.write_run` and the exports refuse, checked before a checkpoint
    is read or downloaded. ``what``: how the message names a new one.

    Raises:
        QkvError: ``path`` exists and is not an empty folder, or lies under a file.
    """
    path = Path(path)
    kind, where = folder_obstacle(path)
    if kind == "under a file":
        raise QkvError(f"{path}: cannot make a folder there, {where} is a file")
    if kind:
        raise QkvError(f"{path} already exists and is not empty; choose a new {what}")


def save_weights(model: torch.nn.Module, path: Path) -> None:
    """Atomically save a model's parameters and persistent buffers as safetensors.

    Tied weights (one parameter under several names) are stored once, under the first name in
    sorted order, as safetensors' ``save_model`` does, so ``load_weights`` re-ties them. Every
    tensor is saved as a contiguous copy, whatever its memory layout in the model (see
    :func:`qkv.inference.weight_layout.prepare_for_inference`); the model is not touched.
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


def read_settings_checkpoint(path: Path, what: str) -> dict:
    """A fairseq-style checkpoint (fair-esm, Sapiens): a dict of tensors and plain values whose
    settings are an ``argparse.Namespace``, read with ``torch.load(weights_only=True)`` with that
    one class allowed; ``what`` names the kind of file in errors.

    Raises:
        QkvError: no such file, a refused or unreadable pickle (whatever the safe unpickler
            raises: "PATH is not a WHAT checkpoint qkv can read (...)"), or a file that is not
            a dict.
    """
    import argparse
    import pickle

    if not path.is_file():
        raise QkvError(f"{what} checkpoint not found: {path}")
    try:
        with torch.serialization.safe_globals([argparse.Namespace]):  # the settings' type
            data = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError) as exc:
        raise QkvError(f"refused {path}: it {torch_load_refusal(exc)}") from None
    except Exception as exc:  # noqa: BLE001 - a crafted pickle (the settings' class called with
        # arguments, a state it refuses, a class swapped): no code ran, and it is no checkpoint
        text = " ".join(str(exc).split())[:200]
        raise QkvError(
            f"{path} is not a {what} checkpoint qkv can read ({type(exc).__name__}: {text})"
        ) from None
    if not isinstance(data, dict):
        raise QkvError(f"{path} is not a {what} checkpoint (a {type(data).__name__}, not a dict)")
    return data
