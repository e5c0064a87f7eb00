"""Reading what earlier qkv versions wrote: older config and settings keys, parameter names,
the format version of the JSON files, a recipe's model type.

The paper's modules (:mod:`qkv.nn`, :mod:`qkv.models`) describe only today's format; whatever
an older run directory holds is brought up to it here, as it is read. The training state
(``train_state.pt``) has its own version and upgrades beside its one reader,
:mod:`qkv.train.train_state`: it names the run directory's files (:mod:`qkv.runs.layout`),
which sit above this module.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from .errors import ConfigError
from .nn.attention import MultiHeadAttention

logger = logging.getLogger(__name__)

# Written into config.json and train_config.json as "format_version"; a file without it is
# version 1 (everything before this key existed).
FORMAT_VERSION = 2
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
