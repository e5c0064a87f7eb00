"""The intermediates of Eq. 1 inside a model: one attention module's call, read off its hook
points.

Source: Vaswani et al. 2017, §3.2.1 (Eq. 1: ``softmax(QKᵀ / √d_k) V``), §3.2.3 (the mask).
The step-through (Q, K, V, QKᵀ, scaling, mask, softmax, output) is read from the points inside
the module's call (:class:`~qkv.nn.attention.HeadHook`, the same points as
:mod:`qkv.explain.hooks`) while the model runs as usual: no replay of the call, no model code
changed for inspection.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from typing import Any

import torch

from ..nn.attention import AttentionSteps, HeadHook, MultiHeadAttention


@torch.no_grad()
def capture_steps(module: MultiHeadAttention, run: Callable[[], Any]) -> AttentionSteps:
    """Run ``run()`` (a forward pass of the model that contains ``module``) and return
    :class:`~qkv.nn.attention.AttentionSteps` of ``module``'s first call in it, all heads.

    Shapes: ``q (B, H, Tq, Dh)``, ``k``/``v (B, H, Tk, Dh)``, ``scores``/``scaled``/``masked``/
    ``weights (B, H, Tq, Tk)``, ``output (B, H, Tq, Dh)`` (before ``W_O``). A KV-cached call's
    keys are every cached key.

    Raises:
        ValueError: ``module`` was not called by ``run`` (it is not part of that model).
    """
    return capture_all_steps([module], run)[0]


@torch.no_grad()
def capture_all_steps(modules: Sequence[MultiHeadAttention], run: Callable[[], Any]) -> list[AttentionSteps]:
    """:func:`capture_steps` of several modules of one model (every layer of a stack, say) from
    one forward pass ``run()``: one :class:`~qkv.nn.attention.AttentionSteps` per module, in
    the order given. Raises as :func:`capture_steps`."""
    seen: list[dict[str, torch.Tensor]] = [{} for _ in modules]

    def reader(values: dict[str, torch.Tensor]) -> HeadHook:
        def read(name: str, value: torch.Tensor) -> torch.Tensor:
            if name not in values:  # the first call's: a later call of the module keeps them
                values[name] = value.detach().clone()
            return value

        return HeadHook(read)

    with ExitStack() as stack:
        for module, values in zip(modules, seen, strict=True):
            hook = reader(values)
            module.head_hooks.append(hook)
            stack.callback(module.head_hooks.remove, hook)
        run()
    return [_steps(values) for values in seen]


def _steps(values: dict[str, torch.Tensor]) -> AttentionSteps:
    """Eq. 1's intermediates from the points of one call."""
    if "z" not in values:
        raise ValueError("the attention module was not called by this forward pass")
    q, k = values["q"], values["k"]
    scores = q @ k.transpose(-2, -1)  # Q Kᵀ, before the scaling the points start from
    return AttentionSteps(
        q=q,
        k=k,
        v=values["v"],
        scores=scores,
        scaled=scores / math.sqrt(q.size(-1)),
        masked=values["scores"],
        weights=values["pattern"],
        output=values["z"].transpose(1, 2),
    )
