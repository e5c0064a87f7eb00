"""Encoder and decoder layers (one of the N identical layers of each stack).

Source: Vaswani et al. 2017, §3.1 (Figure 1): an encoder layer is self-attention then FFN; a
decoder layer is masked self-attention, encoder-decoder (cross) attention, then FFN; each
sub-layer wrapped in residual + LayerNorm with dropout (§5.4).
"""

from __future__ import annotations

import torch
from torch import nn

from .attention import KVCache, MultiHeadAttention
from .feedforward import PositionwiseFeedForward
from .norms import ResidualNorm


class EncoderLayer(nn.Module):
    """Self-attention + position-wise FFN, each with residual + LayerNorm.

    Shape: ``x (B, S, D)``, ``mask`` bool broadcastable to ``(B, H, S, S)`` →
    ``(output (B, S, D), self-attention weights (B, H, S, S) or None)``.
    """

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float = 0.1,
                 attention_dropout: float = 0.0, activation_dropout: float = 0.0,
                 activation: str = "relu", norm_first: bool = False, bias: bool = True,
                 backend: str = "sdpa", eps: float = 1e-5) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, n_heads, attention_dropout, bias, backend)
        self.ffn = PositionwiseFeedForward(d_model, d_ff, activation_dropout, activation, bias)
        self.self_attn_block = ResidualNorm(d_model, dropout, norm_first, eps)
        self.ffn_block = ResidualNorm(d_model, dropout, norm_first, eps)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, need_weights: bool = False):
        x, weights = self.self_attn_block(
            x, lambda h: self.self_attn(h, mask=mask, need_weights=need_weights))
        x, _ = self.ffn_block(x, lambda h: (self.ffn(h), None))
        return x, weights


class DecoderLayer(nn.Module):
    """Masked self-attention + cross-attention over ``memory`` + FFN.

    Shape: ``x (B, T, D)``, ``memory (B, S, D)``, ``self_mask`` broadcastable to
    ``(B, H, T, T)`` (or ``None`` with ``is_causal=True``), ``memory_mask`` broadcastable to
    ``(B, H, T, S)`` → ``(output (B, T, D), (self weights, cross weights))``.
    ``caches``: ``(self KVCache, cross KVCache)`` for incremental decoding, or ``None``.
    """

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float = 0.1,
                 attention_dropout: float = 0.0, activation_dropout: float = 0.0,
                 activation: str = "relu", norm_first: bool = False, bias: bool = True,
                 backend: str = "sdpa", eps: float = 1e-5) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, n_heads, attention_dropout, bias, backend)
        self.cross_attn = MultiHeadAttention(d_model, n_heads, attention_dropout, bias, backend)
        self.ffn = PositionwiseFeedForward(d_model, d_ff, activation_dropout, activation, bias)
        self.self_attn_block = ResidualNorm(d_model, dropout, norm_first, eps)
        self.cross_attn_block = ResidualNorm(d_model, dropout, norm_first, eps)
        self.ffn_block = ResidualNorm(d_model, dropout, norm_first, eps)

    def forward(self, x: torch.Tensor, memory: torch.Tensor, self_mask: torch.Tensor | None = None,
                memory_mask: torch.Tensor | None = None, is_causal: bool = True,
                caches: tuple[KVCache, KVCache] | None = None, need_weights: bool = False):
        self_cache, cross_cache = caches if caches is not None else (None, None)
        x, self_w = self.self_attn_block(x, lambda h: self.self_attn(
            h, mask=self_mask, is_causal=is_causal, cache=self_cache, need_weights=need_weights))
        x, cross_w = self.cross_attn_block(x, lambda h: self.cross_attn(
            h, memory=memory, mask=memory_mask, cache=cross_cache, need_weights=need_weights))
        x, _ = self.ffn_block(x, lambda h: (self.ffn(h), None))
        return x, (self_w, cross_w)
