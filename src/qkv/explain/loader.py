"""Which explainer a run directory gets: one table from recipe name to explainer class.

Kept apart from :mod:`qkv.explain.explainers` (the base class and the text families) and
:mod:`qkv.explain.vision` (images), which both build on the base class: this module imports
the two, so neither needs the other.
"""

from __future__ import annotations

from pathlib import Path

import torch

from .. import runs
from ..data.tokenizers import load_tokenizer
from ..errors import QkvError
from .explainers import (DEFAULT_MAX_CHARS, Explainer, LMExplainer, ProteinExplainer, TextExplainer,
                         TranslationExplainer)
from .vision import ImageExplainer

EXPLAINERS = {"translation": TranslationExplainer, "lm": LMExplainer,
              "protein-cls": ProteinExplainer, "protein-residue": ProteinExplainer,
              "protein-mlm": ProteinExplainer, "vit": ImageExplainer, "text-cls": TextExplainer,
              "encoder": TextExplainer}  # a converted encoder: TextExplainer, or proteins (below)


def load_explainer(run_dir: str | Path, device: torch.device | str = "cpu",
                   max_chars: int = DEFAULT_MAX_CHARS) -> Explainer:
    """The explainer for a run directory of any qkv model family (a ``vit`` run gets an
    :class:`~qkv.explain.vision.ImageExplainer`, which takes images instead of text).

    Raises:
        QkvError: a missing or incomplete run directory, or a recipe with no explainer.
    """
    if not Path(run_dir).is_dir():
        raise QkvError(f"run directory not found: {run_dir}")
    recipe = runs.run_recipe(run_dir)
    if recipe not in EXPLAINERS:
        raise QkvError(f"{run_dir} is a {recipe!r} run; explain supports {', '.join(EXPLAINERS)}")
    explainer = EXPLAINERS[recipe]
    if recipe == "encoder":  # a converted encoder: of text, or of proteins (AntiBERTy, ESM)
        tok = load_tokenizer(Path(run_dir) / "tokenizer.json")
        explainer = ProteinExplainer if getattr(tok, "is_residue_vocabulary", False) else explainer
    return explainer(run_dir, device=device, max_chars=max_chars)
