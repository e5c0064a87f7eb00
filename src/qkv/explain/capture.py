"""The intermediates of Eq. 1 inside a model: capture one attention module's call.

Models return attention *weights* (``need_weights=True``); the full step-through (Q, K, V,
QKᵀ, scaling, mask, softmax, output) of one layer is recomputed from that module's inputs,
recorded by a forward pre-hook while the model runs as usual, so no model code changes for
inspection.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..nn.attention import AttentionSteps, MultiHeadAttention


@torch.no_grad()
def capture_steps(module: MultiHeadAttention, run: Callable[[], Any]) -> AttentionSteps:
    """Run ``run()`` (a forward pass of the model that contains ``module``) and return
    :class:`~qkv.nn.attention.AttentionSteps` of ``module``'s first call in it, all heads.

    Shapes: ``q (B, H, Tq, Dh)``, ``k``/``v (B, H, Tk, Dh)``, ``scores``/``scaled``/``masked``/
    ``weights (B, H, Tq, Tk)``, ``output (B, H, Tq, Dh)`` (before ``W_O``).

    Raises:
        ValueError: ``module`` was not called by ``run`` (it is not part of that model).
        ValueError: the call used a key/value cache (explain full sequences, not decoding steps).
    """
    return capture_all_steps([module], run)[0]


@torch.no_grad()
def capture_all_steps(modules: Sequence[MultiHeadAttention], run: Callable[[], Any]) -> list[AttentionSteps]:
    """:func:`capture_steps` of several modules of one model (every layer of a stack, say) from
    one forward pass ``run()``: one :class:`~qkv.nn.attention.AttentionSteps` per module, in
    the order given. Raises as :func:`capture_steps`."""
    calls: list[list[tuple[tuple, dict]]] = [[] for _ in modules]
    handles = [
        module.register_forward_pre_hook(
            lambda _m, args, kwargs, seen=seen: seen.append((args, dict(kwargs))), with_kwargs=True
        )
        for module, seen in zip(modules, calls, strict=True)
    ]
    try:
        run()
    finally:
        for handle in handles:
            handle.remove()
    return [_replay(module, seen) for module, seen in zip(modules, calls, strict=True)]


def _replay(module: MultiHeadAttention, calls: list[tuple[tuple, dict]]) -> AttentionSteps:
    """Eq. 1 step by step for the first recorded call of ``module``."""
    if not calls:
        raise ValueError("the attention module was not called by this forward pass")
    args, kwargs = calls[0]
    if kwargs.get("cache") is not None:
        raise ValueError("cannot step through a call that used a key/value cache")
    x = args[0] if args else kwargs["x"]
    return module.steps(
        x,
        memory=kwargs.get("memory"),
        attn_mask=kwargs.get("attn_mask"),
        is_causal=kwargs.get("is_causal", False),
        positions=kwargs.get("positions"),
    )
