"""Deprecated: ``load_explainer`` moved to :mod:`qkv.recipes.loading` (``qkv.load_explainer``).

The explainer of a run directory is the one its recipe names, and this package sits below the
recipes (they import its explainers), so picking one is the recipes' layer's job. Until it is
removed, ``qkv.explain.loader.load_explainer`` and ``qkv.explain.load_explainer`` still answer,
with a ``DeprecationWarning``.
"""

from __future__ import annotations

from .._deprecated import moved

__getattr__ = moved(__name__, {"load_explainer": "qkv.recipes.loading"})
