"""Residual connection + normalisation around a sub-layer, and the normalisations themselves.

Source: Vaswani et al. 2017, §3.1 and §5.4: the output of each sub-layer is
LayerNorm(x + Dropout(Sublayer(x))) ("post-LN", the paper's order). Pre-LN,
x + Dropout(Sublayer(LayerNorm(x))) (Xiong et al. 2020), is an option: it trains stably without
warm-up tricks and is what most later models use. Besides LayerNorm (Ba et al. 2016):
RMSNorm (Zhang & Sennrich 2019) and DyT, ``γ · tanh(α·x) + β`` (Zhu et al. 2025, "Transformers
without Normalization").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

NORMS = ("layernorm", "rmsnorm", "dyt")


class DyT(nn.Module):
    """Dynamic Tanh: ``DyT(x) = γ ⊙ tanh(α·x) + β`` (Zhu et al. 2025, Eq. 1), a drop-in
    replacement for LayerNorm that computes no statistics.

    Args:
        d_model: width D of ``γ`` and ``β`` (per-channel affine, as in LayerNorm).
        alpha_init: initial value of the learnable scalar ``α`` (0.5, the paper's default).
        bias: learn ``β`` (otherwise it is absent, like LayerNorm(bias=False)).

    Shape: ``(..., D) -> (..., D)``.
    """

    def __init__(self, d_model: int, alpha_init: float = 0.5, bias: bool = True) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.full((1,), float(alpha_init)))
        self.weight = nn.Parameter(torch.ones(d_model))
        self.bias = nn.Parameter(torch.zeros(d_model)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.tanh(self.alpha * x) * self.weight
        return y if self.bias is None else y + self.bias


def build_norm(
    kind: str, d_model: int, eps: float = 1e-5, bias: bool = True, dyt_alpha: float = 0.5
) -> nn.Module:
    """``"layernorm"`` (paper), ``"rmsnorm"`` or ``"dyt"`` (its ``α`` starting at
    ``dyt_alpha``, the α₀ of Zhu et al. 2025, §4); raises ``ValueError`` otherwise."""
    if kind == "layernorm":
        return nn.LayerNorm(d_model, eps=eps, bias=bias)
    if kind == "rmsnorm":
        return nn.RMSNorm(d_model, eps=eps)
    if kind == "dyt":
        return DyT(d_model, alpha_init=dyt_alpha, bias=bias)
    raise ValueError(f"unknown norm {kind!r}; choose one of {NORMS}")


class ResidualNorm(nn.Module):
    """Wraps one sub-layer with dropout, the residual add and a normalisation.

    Args:
        d_model: width D. dropout: rate on the sub-layer output (P_drop = 0.1 in the paper).
        norm_first: ``False`` = post-LN (paper), ``True`` = pre-LN. eps: LayerNorm epsilon.
        norm: ``"layernorm"`` (paper), ``"rmsnorm"`` or ``"dyt"``. bias: norm bias.
        dyt_alpha: DyT's initial ``α`` (α₀).

    Shape: ``x (B, T, D)``; ``sublayer`` maps ``(B, T, D)`` to ``((B, T, D), extra)`` and
    ``forward`` returns ``((B, T, D), extra)`` so attention weights pass through.
    """

    def __init__(
        self,
        d_model: int,
        dropout: float,
        norm_first: bool = False,
        eps: float = 1e-5,
        norm: str = "layernorm",
        bias: bool = True,
        dyt_alpha: float = 0.5,
    ) -> None:
        super().__init__()
        self.norm = build_norm(norm, d_model, eps, bias, dyt_alpha)
        self.dropout = nn.Dropout(dropout)
        self.norm_first = norm_first

    def forward(self, x: torch.Tensor, sublayer: Callable[[torch.Tensor], tuple]) -> tuple[torch.Tensor, Any]:
        if self.norm_first:
            out, extra = sublayer(self.norm(x))
            return x + self._drop(out), extra
        out, extra = sublayer(x)
        return self.norm(x + self._drop(out)), extra

    def _drop(self, out: torch.Tensor) -> torch.Tensor:
        # Outside training dropout is the identity; skipping the module call saves its
        # overhead, which is a visible part of a decoding step at batch size 1.
        return self.dropout(out) if self.training else out
