"""Attention masks: padding and look-ahead (causal).

One convention everywhere in qkv: a mask is a boolean tensor, ``True`` = *may attend*,
broadcastable to ``(batch, n_heads, q_len, k_len)``. Masks are built only here.

Source: Vaswani et al. 2017, §3.2.3 ("we mask out (setting to −∞) all values in the input of
the softmax which correspond to illegal connections"); masking is among the lecture notes'
"practical techniques commonly needed when training auto-regressive transformers".
"""

from __future__ import annotations

import torch


def padding_mask(tokens: torch.Tensor, pad_id: int) -> torch.Tensor:
    """Key-padding mask: which key positions hold real tokens.

    Args:
        tokens: token ids, shape ``(B, S)``, dtype long.
        pad_id: the id of the padding token.

    Returns:
        bool tensor of shape ``(B, 1, 1, S)``; ``True`` where ``tokens != pad_id``.
    """
    if tokens.dim() != 2:
        raise ValueError(f"tokens must have shape (batch, seq_len), got {tuple(tokens.shape)}")
    return (tokens != pad_id)[:, None, None, :]


def causal_mask(
    q_len: int, k_len: int | None = None, device: torch.device | str | None = None
) -> torch.Tensor:
    """Look-ahead mask: query ``i`` may attend to key ``j`` only if ``j <= i + (k_len - q_len)``.

    With ``k_len > q_len`` (incremental decoding with cached keys) the queries are the *last*
    ``q_len`` positions of the sequence.

    Returns:
        bool tensor of shape ``(1, 1, q_len, k_len)``; ``True`` on and below the (shifted) diagonal.

    Source: §3.2.3 (decoder self-attention "prevent[s] positions from attending to subsequent
    positions").
    """
    k_len = q_len if k_len is None else k_len
    if k_len < q_len:
        raise ValueError(f"k_len ({k_len}) must be >= q_len ({q_len})")
    ones = torch.ones(q_len, k_len, dtype=torch.bool, device=device)
    return torch.tril(ones, diagonal=k_len - q_len)[None, None]


def combine_masks(*masks: torch.Tensor | None) -> torch.Tensor | None:
    """Logical AND of boolean masks (``None`` entries are ignored); broadcasting applies."""
    out = None
    for m in masks:
        if m is None:
            continue
        out = m if out is None else (out & m)
    return out
