"""Every kind of qkv run, by name: the one place that lists recipes.

Built from real imports, so go-to-definition follows every entry. Adding a model family is
its model module, its recipe module (which exports a :class:`~qkv.recipes.recipe.Recipe`) and
one line here.
"""

from __future__ import annotations

from pathlib import Path

from .. import runs
from ..errors import QkvError
from . import caption, diffusion_lm, encoder, lm, protein_mlm, protein_tasks, text_cls, translation, vit
from .recipe import Recipe

RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in (
        translation.RECIPE,
        translation.RNN_RECIPE,
        lm.RECIPE,
        diffusion_lm.RECIPE,
        protein_mlm.RECIPE,
        protein_tasks.CLS_RECIPE,
        protein_tasks.RESIDUE_RECIPE,
        vit.RECIPE,
        text_cls.RECIPE,
        caption.RECIPE,
        encoder.RECIPE,  # converted from Hugging Face, not trained here
    )
}


def trainable() -> list[str]:
    """Names of the recipes ``qkv train`` runs, in the order of :data:`RECIPES`."""
    return [name for name, r in RECIPES.items() if r.train is not None]


def get(name: str) -> Recipe:
    """The recipe called ``name``.

    Raises:
        QkvError: no recipe has that name (the known ones named).
    """
    if name not in RECIPES:
        raise QkvError(f"unknown recipe {name!r}; available: {', '.join(trainable())}")
    return RECIPES[name]


def kind_of(run_dir: str | Path) -> Recipe:
    """The recipe that produced a run directory (``train_config.json`` names it).

    Raises:
        QkvError: the directory says nothing readable about its kind, or names a recipe this
            version does not know.
    """
    name = runs.run_recipe(run_dir)
    if name not in RECIPES:
        raise QkvError(f"{run_dir} is a {name!r} run, which this version of qkv does not know")
    return RECIPES[name]
