"""Look inside a trained model: attention weights, Eq. 1 step by step, pictures, a local page,
and the same page standalone (:func:`standalone_page`: inline in Jupyter, or one HTML file); every
intermediate of a forward pass by name (:func:`run_with_cache`) and the logit lens; every one of
them writable (:func:`run_with_hooks`, :func:`hooked`) and the common "what if" experiments
(:func:`ablate_heads`, :func:`ablate_neurons`, :func:`patch_from`, :func:`steer`,
:func:`activation_patching`).

Model code never imports this package; it imports the models, so inspection can change
without touching the paper's modules. The explainer of a run directory is its recipe's:
:func:`qkv.load_explainer` loads it, and :func:`qkv.show` draws a run directory's page.
"""

from .activations import ActivationCache, logit_lens, record_activations, run_with_cache
from .capture import capture_steps
from .explainer import AttentionMap, DecodingOptions, Explanation
from .hooks import hook_points, hooked, run_with_hooks
from .interventions import PatchingTable, ablate_heads, ablate_neurons, activation_patching, patch_from, steer
from .labels import merge_attention, piece_labels, word_groups
from .rollout import attention_rollout
from .standalone import ExplainerPage, standalone_page

__all__ = [
    "ActivationCache",
    "PatchingTable",
    "ablate_heads",
    "ablate_neurons",
    "activation_patching",
    "hook_points",
    "hooked",
    "patch_from",
    "run_with_hooks",
    "steer",
    "attention_rollout",
    "capture_steps",
    "AttentionMap",
    "DecodingOptions",
    "ExplainerPage",
    "Explanation",
    "merge_attention",
    "logit_lens",
    "piece_labels",
    "record_activations",
    "run_with_cache",
    "standalone_page",
    "word_groups",
]
