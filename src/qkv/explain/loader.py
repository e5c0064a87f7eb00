"""Which explainer a run directory gets: the one its recipe names
(:attr:`qkv.recipes.base.Recipe.explainer`)."""

from __future__ import annotations

from pathlib import Path

import torch

from ..errors import QkvError
from .explainers import DEFAULT_MAX_CHARS, Explainer


def load_explainer(
    run_dir: str | Path, device: torch.device | str = "cpu", max_chars: int = DEFAULT_MAX_CHARS
) -> Explainer:
    """The explainer for a run directory of any qkv model family (a ``vit`` run gets an
    :class:`~qkv.explain.vision.ImageExplainer`, which takes images instead of text).

    Raises:
        QkvError: a missing or incomplete run directory, or one of a kind this version does
            not know.
    """
    if not Path(run_dir).is_dir():
        raise QkvError(f"run directory not found: {run_dir}")
    # Imported here: the recipes import this package's explainers, and this package's
    # __init__ imports this module.
    from ..recipes.registry import kind_of

    return kind_of(run_dir).explainer(run_dir, device=device, max_chars=max_chars)
