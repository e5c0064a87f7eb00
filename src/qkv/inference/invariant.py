"""The ``"invariant"`` attention backend: Eq. 1 computed once per query, for batch-invariant
decoding (inference only).

A fused kernel's summation order depends on how many queries and keys share a call, so one
query attending over a key/value cache and the same query inside a full causal forward can
differ in the last bit; in bfloat16 (8-bit mantissa) that changes greedy tokens at near-ties.
Calling SDPA once per query, over exactly the keys it may see, makes each query's output the
same bit for bit however the queries are batched. A decoding step is one query anyway; a
forward over ``Tq`` queries makes ``Tq`` calls, which is why this is meant for inference and is
switched on by :func:`qkv.inference.layout.prepare_for_inference`, not by training.

:func:`register` adds it to the attention backends (:func:`qkv.nn.attention.register_backend`);
:func:`~qkv.inference.layout.prepare_for_inference` calls it before it switches a model to it.
Importing this module registers nothing.
"""

from __future__ import annotations

import torch

from ..nn.attention import register_backend, scaled_dot_product_attention


def per_query_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    is_causal: bool,
    dropout_p: float,
) -> torch.Tensor:
    """SDPA once per query over its keys (the first ``Tk - Tq + i + 1`` under ``is_causal``),
    its mask row sliced to match (signature: :data:`qkv.nn.attention.Backend`).

    Shape: ``q (B, H, Tq, Dh)``, ``k``/``v (B, H, Tk, Dh)``, ``mask`` bool broadcastable to
    ``(B, H, Tq, Tk)`` or ``None`` → ``(B, H, Tq, Dh)``.

    Raises:
        ValueError: ``is_causal`` with ``Tk < Tq`` (as :func:`~qkv.nn.masks.causal_mask`).
    """
    tq, tk = q.size(-2), k.size(-2)
    if is_causal and tk < tq:
        raise ValueError(f"k_len ({tk}) must be >= q_len ({tq})")  # as causal_mask says
    if mask is not None:
        mask = mask.expand(*mask.shape[:-2], tq, tk)
    outs = []
    for i in range(tq):
        end = tk - tq + i + 1 if is_causal else tk
        row = None if mask is None else mask[..., i : i + 1, :end]
        outs.append(
            scaled_dot_product_attention(
                q[..., i : i + 1, :], k[..., :end, :], v[..., :end, :], row, dropout_p=dropout_p
            )[0]
        )
    return outs[0] if tq == 1 else torch.cat(outs, dim=-2)


def register() -> None:
    """Make :func:`per_query_attention` available as ``backend="invariant"`` (registering it
    again replaces it with itself)."""
    register_backend("invariant", per_query_attention)
