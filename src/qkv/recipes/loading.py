"""A run directory's explainer, and its page: the explainer the run's recipe names.

Which explainer reads a run depends on the recipe that made it
(:attr:`qkv.recipes.recipe.Recipe.explainer`), and only the recipes' registry lists them, so
picking one sits here, beside the registry, above :mod:`qkv.explain` (which the recipes
import). Given an
explainer, :mod:`qkv.explain` does the rest: :func:`qkv.explain.standalone_page` draws its page,
:func:`qkv.explain.plots.write_pictures` its pictures, :func:`qkv.explain.server.serve` the
interactive page.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from .. import cpu_share
from ..errors import QkvError
from ..explain import standalone
from ..explain.explainer import DEFAULT_MAX_CHARS, DecodingOptions, Explainer
from ..explain.standalone import MAX_TOKENS, UNCAPPED_CHARS, ExplainerPage
from .registry import kind_of


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
    return kind_of(run_dir).explainer(run_dir, device=device, max_chars=max_chars)


def show(
    run_or_model: str | Path | Explainer,
    input: Any = None,
    *,
    pair: str | None = None,
    options: DecodingOptions | None = None,
    max_tokens: int = MAX_TOKENS,
    merge_words: bool = True,
    height: int = 900,
    device: torch.device | str = "cpu",
    **decoding: Any,
) -> ExplainerPage:
    """The explainer page of one input to a run directory's model (or to an explainer already
    loaded): ``show(run_dir, "Ein Mann liest.")`` as the last line of a notebook cell draws it;
    ``.save("page.html")`` writes it. A run directory's model is loaded on ``device``, without
    a character cap (``max_tokens`` cuts the input). The other arguments are
    :func:`qkv.explain.standalone_page`'s, checked before anything is loaded. The CPU threads
    follow the machine's load while the page is made (:func:`qkv.cpu_share.for_command`), and
    are given back after.

    Raises:
        QkvError: a missing or unknown run, and as :func:`qkv.explain.standalone_page`.
    """
    options = standalone.page_settings(options, max_tokens, height, decoding)
    if not isinstance(run_or_model, Explainer):
        # max_tokens caps the input; a character cap on top would only cut it twice
        run_or_model = load_explainer(run_or_model, device, max_chars=UNCAPPED_CHARS)
    # a notebook's entry point: threads from the load while the page is made, then given back
    with cpu_share.for_command():
        return standalone.standalone_page(
            run_or_model,
            input,
            pair=pair,
            options=options,
            max_tokens=max_tokens,
            merge_words=merge_words,
            height=height,
        )
