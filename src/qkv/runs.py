"""Run directories: what a training run leaves behind, and loading a model back from one.

Layout (the HF layout plus training files): ``config.json`` (the model config),
``model.safetensors`` (the chosen weights), ``tokenizer.json``, ``train_config.json`` (the
resolved recipe, with ``"recipe"`` naming it), and the training loop's checkpoints and logs.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from . import compat
from .data.tokenizers import load_tokenizer
from .errors import QkvError
from .models.model_types import MODEL_TYPES, ModelType
from .train.checkpoint import load_weights


def run_recipe(run_dir: str | Path) -> str:
    """The recipe that produced a run (``"translation"``, ``"lm"``, ...), from
    ``train_config.json``; runs without one are guessed from ``config.json``'s keys."""
    run_dir = Path(run_dir)
    meta = run_dir / "train_config.json"
    try:
        if meta.is_file():
            return json.loads(meta.read_text(encoding="utf-8"))["recipe"]
        return "lm" if "vocab_size" in json.loads((run_dir / "config.json").read_text()) else "translation"
    except (OSError, ValueError, KeyError) as exc:
        raise QkvError(f"cannot tell what kind of run {run_dir} is: {exc}") from None


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
    kind = run_recipe(run_dir) if (run_dir / "train_config.json").is_file() else None
    model_type = model_type_of(run_dir) if kind else None
    needed = ("config.json", weights) + (
        () if model_type and not model_type.tokenizer else ("tokenizer.json",)
    )
    missing = [f for f in needed if not (run_dir / f).is_file()]
    if missing:
        raise QkvError(
            f"run directory {run_dir} is incomplete: missing {', '.join(missing)} "
            "(training not finished? `qkv train ... --resume` continues it)"
        )
    kind = kind or run_recipe(run_dir)
    if family is not None and kind not in ((family,) if isinstance(family, str) else family):
        wanted = " or ".join((family,) if isinstance(family, str) else family)
        raise QkvError(f"{run_dir} is a {kind!r} run; this needs a {wanted} run")
    model_type = model_type or model_type_of(run_dir)
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
    run_dir = Path(run_dir)
    meta = run_dir / "train_config.json"
    try:
        saved = json.loads(meta.read_text(encoding="utf-8")) if meta.is_file() else {}
    except (OSError, ValueError) as exc:
        raise QkvError(f"cannot tell what kind of run {run_dir} is: {exc}") from None
    name = saved.get("model_type") or compat.model_type_name(run_recipe(run_dir))
    if name not in MODEL_TYPES:
        raise QkvError(f"{run_dir} holds a {name!r} model, which this version of qkv does not know")
    return MODEL_TYPES[name]
