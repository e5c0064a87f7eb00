"""Look inside a trained model: attention weights, Eq. 1 step by step, pictures, a local page,
and the same page standalone (:func:`show`: inline in Jupyter, or one HTML file).

Model code never imports this package; it imports the models, so inspection can change
without touching the paper's modules. The explainer of a run directory is its recipe's:
:func:`qkv.load_explainer` loads it (``qkv.explain.load_explainer`` still
answers, deprecated, see :mod:`qkv.explain.loader`).
"""

from .._deprecated import moved
from .capture import capture_steps
from .explainers import AttentionMap, DecodingOptions, Explanation
from .labels import merge_attention, piece_labels, word_groups
from .rollout import attention_rollout
from .standalone import ExplainerPage, show

__all__ = [
    "attention_rollout",
    "capture_steps",
    "AttentionMap",
    "DecodingOptions",
    "ExplainerPage",
    "Explanation",
    "merge_attention",
    "piece_labels",
    "show",
    "word_groups",
]


__getattr__ = moved(__name__, {"load_explainer": "qkv.recipes.loading"})  # deprecated
