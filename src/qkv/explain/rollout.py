"""Attention rollout: how much each input token flows into each output token across all layers.

Source: Abnar & Zuidema 2020, "Quantifying Attention Flow in Transformers" (ACL 2020, §3,
"attention rollout"). One layer's raw attention ignores the residual connection around it
(``x + Attention(x)``, Vaswani et al. 2017 §3.1), and it says nothing about what earlier
layers already mixed into each token. Rollout accounts for both: the residual is modelled as
an identity added to the head-averaged weights, and the layers' matrices are multiplied.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


def attention_rollout(weights: torch.Tensor | np.ndarray | Sequence) -> torch.Tensor:
    """Attention rollout (Abnar & Zuidema 2020, §3) of one input through every layer.

    For each layer ``l`` (first to last): average the heads, ``A_l = mean_h W_l``; add the
    residual as an identity and renormalise the rows, ``Â_l = (A_l + I) / rowsum(A_l + I)``
    (``= 0.5·A_l + 0.5·I`` when the rows of ``A_l`` sum to 1); then multiply,
    ``R = Â_L · … · Â_2 · Â_1``. ``R[i, j]`` is the share of input token ``j`` in the output
    of token ``i`` after the last layer; for a ViT, row 0 (the class token) over columns
    ``1..N`` (the patches) is the usual rollout map. Every row of ``R`` sums to 1 (a product
    of row-stochastic matrices), also when a row of some ``A_l`` is all zeros (fully masked).

    Args:
        weights: the per-layer attention weights of one input, first layer first: a float
            tensor or array ``(L, H, T, T)``, or a sequence of ``L`` tensors/arrays
            ``(H, T, T)`` (what :meth:`qkv.inference.vision.ImageClassifier.attentions`
            returns). Each row is a softmax output (sums to 1, or 0 where masked).

    Returns:
        float32 tensor ``(T, T)``: rows are output tokens, columns input tokens.

    Raises:
        ValueError: no layers, or weights that are not ``(L, H, T, T)`` with ``T × T`` square.
    """
    if isinstance(weights, (torch.Tensor, np.ndarray)):
        stack = torch.as_tensor(weights)
    else:
        if len(weights) == 0:
            raise ValueError("attention_rollout needs the weights of at least one layer")
        stack = torch.stack([torch.as_tensor(w) for w in weights])
    if stack.dim() != 4 or stack.size(-1) != stack.size(-2) or stack.size(0) == 0:
        raise ValueError(f"attention weights must be (layers, heads, T, T), got {tuple(stack.shape)}")
    stack = stack.detach().float().cpu()
    n_tokens = stack.size(-1)
    eye = torch.eye(n_tokens)
    rollout = eye.clone()  # (T, T)
    for layer in stack:  # (H, T, T)
        mixed = layer.mean(0) + eye  # (T, T): heads averaged, residual as identity
        mixed = mixed / mixed.sum(-1, keepdim=True)  # rows sum to 1 again
        rollout = mixed @ rollout  # later layers act on what earlier ones produced
    return rollout
