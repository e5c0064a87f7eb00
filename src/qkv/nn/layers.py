"""Encoder and decoder layers (one of the N identical layers of each stack).

Source: Vaswani et al. 2017, §3.1 (Figure 1): an encoder layer is self-attention then FFN; a
decoder layer is masked self-attention, encoder-decoder (cross) attention, then FFN; each
sub-layer wrapped in residual + LayerNorm with dropout (§5.4). A decoder-only language model's
block (GPT) is the decoder layer without cross-attention, i.e. an encoder layer whose
self-attention carries the look-ahead mask.
"""

from __future__ import annotations

import torch
from torch import nn

from .attention import KVCache, MultiHeadAttention
from .feedforward import PositionwiseFeedForward
from .norms import ResidualNorm


class EncoderLayer(nn.Module):
    """Self-attention + position-wise FFN, each with residual + normalisation.

    Args:
        d_model, n_heads, d_ff: widths (§3.2.2, §3.3). dropout: on sub-layer outputs (§5.4).
        attention_dropout / activation_dropout: on attention weights / the FFN's inner layer.
        activation: ``"relu"`` (paper) or ``"gelu"``. norm_first: pre-LN instead of post-LN.
        bias: biases in linears and norms. backend: attention backend. eps: norm epsilon.
        norm: ``"layernorm"``, ``"rmsnorm"`` or ``"dyt"``. rotary: a shared
        :class:`~qkv.nn.positional.RotaryEmbedding` or ``None``.

    Shape: ``x (B, S, D)``, ``mask`` bool broadcastable to ``(B, H, S, S)`` →
    ``(output (B, S, D), self-attention weights (B, H, S, S) or None)``. With
    ``is_causal=True`` and a ``cache`` it is the block of a decoder-only LM.
    """

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float = 0.1,
                 attention_dropout: float = 0.0, activation_dropout: float = 0.0,
                 activation: str = "relu", norm_first: bool = False, bias: bool = True,
                 backend: str = "sdpa", eps: float = 1e-5, norm: str = "layernorm",
                 rotary: nn.Module | None = None) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, n_heads, attention_dropout, bias, backend,
                                            rotary=rotary)
        self.ffn = PositionwiseFeedForward(d_model, d_ff, activation_dropout, activation, bias)
        self._residual_args = (d_model, dropout, norm_first, eps, norm, bias)
        self.self_attn_block = ResidualNorm(*self._residual_args)
        self.ffn_block = ResidualNorm(*self._residual_args)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, need_weights: bool = False,
                is_causal: bool = False, cache: KVCache | None = None,
                positions: torch.Tensor | None = None):
        x, weights = self.self_attn_block(x, lambda h: self.self_attn(
            h, mask=mask, is_causal=is_causal, cache=cache, need_weights=need_weights,
            positions=positions))
        x, _ = self.ffn_block(x, lambda h: (self.ffn(h), None))
        return x, weights


class DecoderLayer(EncoderLayer):
    """Masked self-attention + cross-attention over ``memory`` + FFN (same arguments as
    :class:`EncoderLayer`).

    Shape: ``x (B, T, D)``, ``memory (B, S, D)``, ``self_mask`` broadcastable to
    ``(B, H, T, T)`` (or ``None`` with ``is_causal=True``), ``memory_mask`` broadcastable to
    ``(B, H, T, S)`` → ``(output (B, T, D), (self weights, cross weights))``.
    ``caches``: ``(self KVCache, cross KVCache)`` for incremental decoding, or ``None``.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        sa = self.self_attn
        # Cross-attention has no rotary positions: memory positions are already encoded.
        self.cross_attn = MultiHeadAttention(sa.d_model, sa.n_heads, sa.dropout,
                                             sa.w_q.bias is not None, sa.backend)
        self.cross_attn_block = ResidualNorm(*self._residual_args)

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
