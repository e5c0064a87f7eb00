"""Run directories: what a training run leaves behind, and loading a model back from one.

Layout (the HF layout plus training files): ``config.json`` (the model config),
``model.safetensors`` (the chosen weights), ``tokenizer.json``, ``train_config.json`` (the
resolved recipe, with ``"recipe"`` naming it), and the training loop's checkpoints and logs.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from .data.tokenizers import load_tokenizer
from .errors import QkvError
from .models.config import EncoderConfig, LMConfig, TransformerConfig, ViTConfig
from .models.decoder_lm import DecoderLM
from .models.encoder import EncoderModel
from .models.transformer import Transformer
from .models.vit import VisionTransformer
from .train.checkpoint import load_weights

PROTEIN_RECIPES = ("protein-mlm", "protein-cls", "protein-residue")
# recipe name → (config class, model class)
FAMILIES = {"translation": (TransformerConfig, Transformer), "lm": (LMConfig, DecoderLM),
            **{name: (EncoderConfig, EncoderModel) for name in PROTEIN_RECIPES},
            "vit": (ViTConfig, VisionTransformer),
            "encoder": (EncoderConfig, EncoderModel),  # a converted pretrained encoder (qkv.hub)
            "text-cls": (EncoderConfig, EncoderModel)}
# families whose input is not text: no tokenizer.json (a ViT's "tokenizer" is its patch size)
NO_TOKENIZER = ("vit",)


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


def load_run(run_dir: str | Path, weights: str = "model.safetensors",
             device: torch.device | str = "cpu", family: str | tuple[str, ...] | None = None):
    """Model (eval mode, on ``device``) and tokenizer of a run directory of any family
    (translation, lm, protein-mlm/-cls/-residue, vit; a ViT has no tokenizer: ``None``).

    Args:
        family: the recipe(s) expected (``"translation"``, ``"lm"``, or a tuple such as
            :data:`PROTEIN_RECIPES`); ``None`` accepts any.

    Raises:
        QkvError: directory or one of ``config.json``, the weights, ``tokenizer.json`` missing,
            unreadable or inconsistent (a half-written run directory), or a run of another kind.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise QkvError(f"run directory not found: {run_dir}")
    recipe = run_recipe(run_dir) if (run_dir / "train_config.json").is_file() else None
    needed = ("config.json", weights) + (() if recipe in NO_TOKENIZER else ("tokenizer.json",))
    missing = [f for f in needed if not (run_dir / f).is_file()]
    if missing:
        raise QkvError(f"run directory {run_dir} is incomplete: missing {', '.join(missing)} "
                       "(training not finished? `qkv train ... --resume` continues it)")
    recipe = recipe or run_recipe(run_dir)
    wanted = (family,) if isinstance(family, str) else family or tuple(FAMILIES)
    if recipe not in FAMILIES or recipe not in wanted:
        wanted = " or ".join(wanted)
        raise QkvError(f"{run_dir} is a {recipe!r} run; this needs a {wanted} run")
    config_cls, model_cls = FAMILIES[recipe]
    config = config_cls.load(run_dir / "config.json")  # a bad file: ConfigError naming it
    model = model_cls(config)
    load_weights(model, run_dir / weights)
    model.to(device).eval()
    return model, None if recipe in NO_TOKENIZER else load_tokenizer(run_dir / "tokenizer.json")
