"""Run directories: what a training run leaves behind, and loading a model back from one.

Layout (the HF layout plus training files): ``config.json`` (the model config),
``model.safetensors`` (the chosen weights), ``tokenizer.json``, ``train_config.json`` (the
resolved recipe, with ``"recipe"`` naming it), and the training loop's checkpoints and logs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from . import compat
from .data.tokenizers import load_tokenizer
from .errors import QkvError
from .models.config import ModelConfig
from .models.model_types import MODEL_TYPES, ModelType, for_config
from .storage import load_weights


def run_header(recipe: str, config: ModelConfig) -> dict[str, Any]:
    """What ``train_config.json`` starts with, naming the kind of run: ``recipe``, the
    ``model_type`` of ``config`` (:mod:`qkv.models.model_types`) and the ``format_version``
    (:data:`qkv.compat.FORMAT_VERSION`). :func:`run_recipe` and :func:`model_type_of` read it."""
    return {"recipe": recipe, "model_type": for_config(config).name, "format_version": compat.FORMAT_VERSION}


def _meta(run_dir: Path) -> dict[str, Any]:
    """A run's ``train_config.json``; for a run of the first versions, which wrote none,
    ``{"recipe": ...}`` guessed from ``config.json``'s keys (a language model or a translation).

    Raises:
        QkvError: neither file can be read, or ``train_config.json`` names no recipe.
    """
    meta = run_dir / "train_config.json"
    try:
        if not meta.is_file():
            config = json.loads((run_dir / "config.json").read_text())
            return {"recipe": "lm" if "vocab_size" in config else "translation"}
        saved = json.loads(meta.read_text(encoding="utf-8"))
    except (OSError, ValueError, TypeError) as exc:
        raise QkvError(f"cannot tell what kind of run {run_dir} is: {exc}") from None
    if not isinstance(saved, dict) or not isinstance(saved.get("recipe"), str):
        raise QkvError(f"cannot tell what kind of run {run_dir} is: {meta} names no recipe")
    return saved


def run_recipe(run_dir: str | Path) -> str:
    """The recipe that produced a run (``"translation"``, ``"lm"``, ...), from
    ``train_config.json``; runs without one are guessed from ``config.json``'s keys.

    Raises:
        QkvError: the directory says nothing readable about its kind.
    """
    return _meta(Path(run_dir))["recipe"]


def load_run(
    run_dir: str | Path,
    weights: str = "model.safetensors",
    device: torch.device | str = "cpu",
    family: str | tuple[str, ...] | None = None,
):
    """Model (eval mode, on ``device``) and tokenizer of a run directory of any family
    (translation, lm, protein-mlm/-cls/-residue, vit; a ViT has no tokenizer: ``None``).

    Args:
        family: the recipe(s) expected (``"translation"``, ``"lm"``, or a tuple such as
            ``("protein-mlm", "protein-cls")``); ``None`` accepts any.

    Raises:
        QkvError: directory or one of ``config.json``, the weights, ``tokenizer.json`` missing,
            unreadable or inconsistent (a half-written run directory), or a run of another kind.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise QkvError(f"run directory not found: {run_dir}")
    # A run of the first versions has no train_config.json: a translation or LM run, with a
    # tokenizer. Its kind is read from config.json, once the files are known to be there.
    meta = _meta(run_dir) if (run_dir / "train_config.json").is_file() else None
    with_tokenizer = meta is None or _model_type(run_dir, meta).tokenizer
    needed = ("config.json", weights) + (("tokenizer.json",) if with_tokenizer else ())
    missing = [f for f in needed if not (run_dir / f).is_file()]
    if missing:
        raise QkvError(
            f"run directory {run_dir} is incomplete: missing {', '.join(missing)} "
            "(training not finished? `qkv train ... --resume` continues it)"
        )
    meta = meta or _meta(run_dir)
    if family is not None and meta["recipe"] not in ((family,) if isinstance(family, str) else family):
        wanted = " or ".join((family,) if isinstance(family, str) else family)
        raise QkvError(f"{run_dir} is a {meta['recipe']!r} run; this needs a {wanted} run")
    model_type = _model_type(run_dir, meta)
    config = model_type.config.load(run_dir / "config.json")  # a bad file: ConfigError naming it
    model = model_type.model(config)
    load_weights(model, run_dir / weights)
    model.to(device).eval()
    return model, load_tokenizer(run_dir / "tokenizer.json") if model_type.tokenizer else None


def model_type_of(run_dir: str | Path) -> ModelType:
    """The architecture a run holds: ``"model_type"`` in its ``train_config.json`` (runs of
    earlier versions: inferred from the recipe name, :func:`qkv.compat.model_type_name`).

    Raises:
        QkvError: a run that names no architecture this version knows.
    """
    return _model_type(Path(run_dir), _meta(Path(run_dir)))


def _model_type(run_dir: Path, meta: dict[str, Any]) -> ModelType:
    name = meta.get("model_type") or compat.model_type_name(meta["recipe"])
    if name not in MODEL_TYPES:
        raise QkvError(f"{run_dir} holds a {name!r} model, which this version of qkv does not know")
    return MODEL_TYPES[name]
