"""Reading what earlier qkv versions wrote: every compatibility rule in one place.

The paper's modules (:mod:`qkv.nn`, :mod:`qkv.models`) and the training loop describe only
today's format; whatever an older run directory holds is brought up to it here, as it is read.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from pathlib import Path, PurePath
from typing import Any

import torch

from .errors import ConfigError, QkvError
from .files import load_weights
from .nn.attention import MultiHeadAttention
from .run_files import SNAPSHOTS, run_file

logger = logging.getLogger(__name__)

# Written into config.json and train_config.json as "format_version"; a file without it is
# version 1 (everything before this key existed).
FORMAT_VERSION = 2
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
        load_weights(model, run_dir / "last.safetensors")
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
    """A snapshot entry of any version's training state as today's name (:func:`snapshot_name`).

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


# --------------------------------------------------------------------------- format version


def check_format_version(data: dict, what: str = "this file") -> dict:
    """``data`` (a ``config.json`` or ``train_config.json`` object) without its
    ``"format_version"`` key, after checking that this code can read that version.

    A file without the key is version 1 (written before it existed); today's files carry
    :data:`FORMAT_VERSION`.

    Raises:
        ConfigError: a version that is not a whole number >= 1, or one higher than
            :data:`FORMAT_VERSION` (written by a newer qkv), in one line naming ``what``.
    """
    if "format_version" not in data:
        return data
    data = dict(data)
    version = data.pop("format_version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ConfigError(f"{what}: format_version must be a whole number >= 1, got {version!r}")
    if version > FORMAT_VERSION:
        raise ConfigError(
            f"{what} was written by a newer qkv (format_version {version}; this qkv "
            f"reads up to {FORMAT_VERSION}): upgrade qkv to read it"
        )
    return data


def with_format_version(data: dict) -> dict:
    """``data`` with ``"format_version": FORMAT_VERSION`` first: what a saved JSON file holds."""
    return {"format_version": FORMAT_VERSION, **data}


# --------------------------------------------------------------------------- settings keys

# Keys that older config.json and settings files hold but a settings class no longer has, by
# class name, each with the value the model always used (read only at that value, see
# qkv.settings). A class inherits the entry of its nearest base that has one.
DROPPED_KEYS: dict[str, dict[str, object]] = {
    # older protein encoders were saved with the LM's fields: the head was always tied, and
    # there were no start or end ids
    "EncoderConfig": {"tie_embeddings": True, "bos_id": None, "eos_id": None},
}

# Keys of earlier versions that were renamed, by class name: old name → (new name, old type,
# old value → new value). Read from settings files and overrides as today's key, with a
# deprecation warning (see qkv.settings).
RENAMED_KEYS: dict[str, dict[str, tuple[str, type, Callable[[Any], Any]]]] = {
    # amp_bf16=false meant fp32
    "TrainSettings": {"amp_bf16": ("precision", bool, lambda on: "bf16" if on else "fp32")},
}


def _nearest(table: dict[str, dict], cls: type) -> dict:
    for klass in cls.__mro__:
        if klass.__name__ in table:
            return table[klass.__name__]
    return {}


def dropped_keys(cls: type) -> dict[str, object]:
    """``{key: the value it always held}`` for the settings class ``cls`` (:data:`DROPPED_KEYS`;
    empty for a class without dropped keys)."""
    return _nearest(DROPPED_KEYS, cls)


def renamed_keys(cls: type) -> dict[str, tuple[str, type, Callable[[Any], Any]]]:
    """``{old key: (new key, old type, old value → new value)}`` for the settings class ``cls``
    (:data:`RENAMED_KEYS`; empty for a class without renamed keys)."""
    return _nearest(RENAMED_KEYS, cls)


# --------------------------------------------------------------------------- weights


def pack_old_projections(
    state_dict: dict[str, torch.Tensor], model: torch.nn.Module, prefix: str = ""
) -> None:
    """Rewrite, in place, the attention projections of weights saved before they were packed.

    Those checkpoints hold separate ``w_q``/``w_k``/``w_v`` (each ``(H·d_k, D)``, biases
    ``(H·d_k,)``) per :class:`~qkv.nn.attention.MultiHeadAttention`; today's layout stacks
    their rows into ``w_qkv`` (self-attention, Q rows then K then V) or ``w_kv``
    (cross-attention, K then V, ``w_q`` kept). Keys of a module that hold neither layout
    completely are left alone, so loading still reports them as missing or unexpected.

    Args:
        state_dict: name → tensor, as ``model.load_state_dict`` receives it.
        model: the module being loaded (its attention modules say where projections are).
        prefix: the name of ``model`` inside ``state_dict`` (``""`` for the root).
    """
    for name, module in model.named_modules(prefix=prefix.rstrip(".")):
        if not isinstance(module, MultiHeadAttention):
            continue
        at = f"{name}." if name else ""
        names, packed = (("w_k", "w_v"), "w_kv") if module.cross else (("w_q", "w_k", "w_v"), "w_qkv")
        for kind in ("weight", "bias"):
            keys = [f"{at}{n}.{kind}" for n in names]
            if all(k in state_dict for k in keys) and f"{at}{packed}.{kind}" not in state_dict:
                state_dict[f"{at}{packed}.{kind}"] = torch.cat([state_dict.pop(k) for k in keys])


def upgrade_state_dict(state_dict: dict[str, torch.Tensor], model: torch.nn.Module, prefix: str = "") -> None:
    """Bring weights any qkv version saved to today's names and shapes, in place (today the
    one rule is :func:`pack_old_projections`); today's weights pass unchanged."""
    pack_old_projections(state_dict, model, prefix)


def _upgrade_on_load(module: torch.nn.Module, state_dict: dict, prefix: str, *args) -> None:
    upgrade_state_dict(state_dict, module, prefix)


def read_old_weights(model: torch.nn.Module) -> None:
    """Make ``model.load_state_dict`` (and so :func:`~qkv.files.load_weights` and a
    resumed ``train_state.pt``) accept what earlier versions saved: a load-state-dict pre-hook
    applies :func:`upgrade_state_dict` before anything is matched. The model families call it
    on themselves once, when built."""
    model._register_load_state_dict_pre_hook(_upgrade_on_load, with_module=True)


# Runs written before train_config.json recorded "model_type": the architecture each recipe of
# that time trained (a recipe added since always records it).
_MODEL_TYPE_OF_OLD_RECIPE = {
    "translation": "transformer",
    "lm": "decoder-lm",
    "protein-mlm": "encoder",
    "protein-cls": "encoder",
    "protein-residue": "encoder",
    "text-cls": "encoder",
    "encoder": "encoder",
    "vit": "vit",
}


def model_type_name(recipe: str) -> str:
    """The ``model_type`` of a run written before runs recorded it, from its recipe name
    (an unknown name is returned as it is, for the caller to refuse)."""
    return _MODEL_TYPE_OF_OLD_RECIPE.get(recipe, recipe)
