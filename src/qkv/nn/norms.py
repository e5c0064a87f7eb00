"""Residual connection + layer normalisation around a sub-layer.

Source: Vaswani et al. 2017, §3.1 and §5.4: the output of each sub-layer is
LayerNorm(x + Dropout(Sublayer(x))) ("post-LN", the paper's order). Pre-LN,
x + Dropout(Sublayer(LayerNorm(x))) (Xiong et al. 2020), is an option: it trains stably without
warm-up tricks and is what most later models use.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

NORM_ORDERS = ("post", "pre")


class ResidualNorm(nn.Module):
    """Wraps one sub-layer with dropout, the residual add and LayerNorm.

    Args:
        d_model: width D. dropout: rate on the sub-layer output (P_drop = 0.1 in the paper).
        norm_first: ``False`` = post-LN (paper), ``True`` = pre-LN. eps: LayerNorm epsilon.

    Shape: ``x (B, T, D)``; ``sublayer`` maps ``(B, T, D)`` to ``((B, T, D), extra)`` and
    ``forward`` returns ``((B, T, D), extra)`` so attention weights pass through.
    """

    def __init__(self, d_model: int, dropout: float, norm_first: bool = False, eps: float = 1e-5) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d_model, eps=eps)
        self.dropout = nn.Dropout(dropout)
        self.norm_first = norm_first

    def forward(self, x: torch.Tensor, sublayer: Callable[[torch.Tensor], tuple]):
        if self.norm_first:
            out, extra = sublayer(self.norm(x))
            return x + self.dropout(out), extra
        out, extra = sublayer(x)
        return self.norm(x + self.dropout(out)), extra
