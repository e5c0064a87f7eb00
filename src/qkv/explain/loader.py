"""Deprecated: ``load_explainer`` moved to :mod:`qkv.recipes.loading`.

The explainer of a run directory is the one its recipe names, and this package sits below the
recipes (they import its explainers), so picking one is the recipes' layer's job. Until it is
removed, ``qkv.explain.loader.load_explainer`` and ``qkv.explain.load_explainer`` still answer,
with a ``DeprecationWarning``; use ``qkv.load_explainer``.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

MOVED = {"load_explainer"}
"""The names that moved to :mod:`qkv.recipes.loading`."""


def moved(name: str, old: str, stacklevel: int = 3) -> Any:
    """The object ``name`` from :mod:`qkv.recipes.loading`, with a ``DeprecationWarning``
    naming ``old`` (the spelling the caller used) and the new one.

    The module is imported by name when asked for (``importlib``, not an import statement):
    this package sits below the recipes, and this deprecated forward is the one way up, listed
    in ``tests/test_imports.py`` until it is removed."""
    warnings.warn(
        f"{old} is deprecated: use qkv.{name} (qkv.recipes.loading.{name})",
        DeprecationWarning,
        stacklevel=stacklevel,
    )
    return getattr(importlib.import_module("qkv.recipes.loading"), name)


def __getattr__(name: str) -> Any:
    if name in MOVED:
        return moved(name, f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
