"""The layers a Transformer stack repeats N times, built from one :class:`LayerConfig`.

Source: Vaswani et al. 2017, §3.1 (Figure 1): an encoder layer is self-attention then FFN; a
decoder layer is masked self-attention, encoder-decoder (cross) attention, then FFN; each
sub-layer is wrapped in residual + normalisation with dropout (§5.4). A decoder-only language
model's block (GPT; Radford et al. 2019) is the decoder layer without cross-attention: a
self-attention block that carries the look-ahead mask (§3.2.3).

Mask names (§3.2.3): a layer with one attention takes ``attn_mask``, the tensor its attention
reads; the decoder layer takes ``tgt_mask`` (its self-attention's, over the target's own
positions) before ``src_mask`` (its cross-attention's, over the encoder output: the source's
padding mask), the names :class:`~qkv.models.transformer.Transformer` gives them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from .attention import KVCache, MultiHeadAttention
from .feedforward import Activation, PositionwiseFeedForward
from .norms import ResidualNorm, build_norm


@dataclass(frozen=True, kw_only=True)
class LayerConfig:
    """What one layer needs; every model config extends it (``qkv.models.config``).

    Defaults are the paper's base model (Table 3): d_model 512, 8 heads, d_ff 2048, dropout 0.1
    on sub-layer outputs (§5.4), ReLU (Eq. 2), LayerNorm after the residual add (post-LN, §3.1).

    Fields:
        d_model, n_heads, d_ff: widths (§3.2.2, §3.3); ``d_k = d_model / n_heads``.
        dropout: on each sub-layer's output and on the embeddings (P_drop, §5.4).
        attention_dropout: on the attention weights. activation_dropout: on the FFN's inner layer.
        activation: ``"relu"`` (paper), ``"gelu"`` (BERT/ESM), ``"gelu_tanh"`` (GPT-2) or
            ``"silu"`` (Marian).
        norm: ``"layernorm"`` (paper), ``"rmsnorm"`` (Zhang & Sennrich 2019) or ``"dyt"``
            (Zhu et al. 2025). norm_first: pre-LN (Xiong et al. 2020) instead of post-LN.
        bias: biases in linears and norms. attention_backend: ``"sdpa"`` (fused), ``"eager"``
            (explicit Eq. 1) or ``"invariant"`` (SDPA per query: batch-invariant, for
            inference; :func:`~qkv.nn.attention.per_query_attention`). layer_norm_eps: the norm's epsilon.
        dyt_alpha: DyT's initial ``α`` (α₀; Zhu et al. 2025, §4: 0.5 for models that are not
            LLMs; wider models train better with a smaller one). Read when ``norm="dyt"``.
    """

    d_model: int = 512
    n_heads: int = 8
    d_ff: int = 2048
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    activation: Activation = "relu"
    norm: Literal["layernorm", "rmsnorm", "dyt"] = "layernorm"
    norm_first: bool = False
    bias: bool = True
    attention_backend: Literal["sdpa", "eager", "invariant"] = "sdpa"
    layer_norm_eps: float = 1e-5
    dyt_alpha: float = 0.5

    @property
    def d_k(self) -> int:
        """Per-head width d_k = d_v = d_model / n_heads (§3.2.2)."""
        return self.d_model // self.n_heads


def attention(
    config: LayerConfig, cross: bool = False, rotary: nn.Module | None = None
) -> MultiHeadAttention:
    """A :class:`MultiHeadAttention` of ``config`` (self-attention, or ``cross`` over memory)."""
    return MultiHeadAttention(
        config.d_model,
        config.n_heads,
        config.attention_dropout,
        config.bias,
        config.attention_backend,
        rotary=rotary,
        cross=cross,
    )


def norm(config: LayerConfig) -> nn.Module:
    """The normalisation of ``config`` (LayerNorm in the paper, §3.1), as every layer and every
    stack's final norm builds it."""
    return build_norm(config.norm, config.d_model, config.layer_norm_eps, config.bias, config.dyt_alpha)


def residual(config: LayerConfig) -> ResidualNorm:
    """The residual + normalisation + dropout wrapper of one sub-layer (§3.1, §5.4)."""
    return ResidualNorm(
        config.d_model,
        config.dropout,
        config.norm_first,
        config.layer_norm_eps,
        config.norm,
        config.bias,
        config.dyt_alpha,
    )


def feedforward(config: LayerConfig) -> PositionwiseFeedForward:
    """The position-wise FFN of ``config`` (Eq. 2)."""
    return PositionwiseFeedForward(
        config.d_model, config.d_ff, config.activation_dropout, config.activation, config.bias
    )


class SelfAttentionLayer(nn.Module):
    """Self-attention + position-wise FFN, each with residual + normalisation (§3.1).

    Without a mask over later positions this is the paper's encoder layer
    (:data:`EncoderLayer`); with ``is_causal=True`` (and a ``cache`` when decoding) it is the
    block of a decoder-only LM (GPT): a decoder layer without cross-attention.

    Args:
        config: the layer's settings. rotary: a shared
            :class:`~qkv.nn.positional.RotaryEmbedding` for queries and keys, or ``None``.

    Shape: ``x (B, S, D)``, ``attn_mask`` bool broadcastable to ``(B, H, S, S)`` (``True`` = may
    attend) → ``(output (B, S, D), self-attention weights (B, H, S, S) or None)``.
    """

    def __init__(self, config: LayerConfig, rotary: nn.Module | None = None) -> None:
        super().__init__()
        self.self_attn = attention(config, rotary=rotary)
        self.self_attn_block = residual(config)
        self.ffn = feedforward(config)
        self.ffn_block = residual(config)

    def forward(
        self,
        x: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        need_weights: bool = False,
        is_causal: bool = False,
        cache: KVCache | None = None,
        positions: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        x, weights = self.self_attn_block(
            x,
            lambda h: self.self_attn(
                h,
                attn_mask=attn_mask,
                is_causal=is_causal,
                cache=cache,
                need_weights=need_weights,
                positions=positions,
            ),
        )
        x, _ = self.ffn_block(x, lambda h: (self.ffn(h), None))
        return x, weights


EncoderLayer = SelfAttentionLayer  # the paper's name for the bidirectional use


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention over ``memory``, then the FFN (§3.1), each with
    residual + normalisation. ``rotary``: a shared
    :class:`~qkv.nn.positional.RotaryEmbedding` for the self-attention's queries and keys, or
    ``None``. Cross-attention has no rotary positions: the encoder output already carries its
    positions.

    Shape: ``x (B, T, D)``, ``memory (B, S, D)``, ``tgt_mask`` broadcastable to
    ``(B, H, T, T)`` (or ``None`` with ``is_causal=True``), ``src_mask`` (the mask over
    ``memory``) broadcastable to ``(B, H, T, S)`` → ``(output (B, T, D), (self weights, cross weights))``.
    ``caches``: ``(self KVCache, cross KVCache)`` for incremental decoding, or ``None``.
    """

    def __init__(self, config: LayerConfig, rotary: nn.Module | None = None) -> None:
        super().__init__()
        self.self_attn = attention(config, rotary=rotary)
        self.self_attn_block = residual(config)
        # Registration order is initialisation order: each module draws its initial weights
        # from the global RNG as it is built, so building the FFN before cross-attention (not
        # in Figure 1's order) is what gives a seed the initial weights, and a seeded run the
        # losses, that recorded runs and benchmarks hold. Reordering these lines changes them.
        self.ffn = feedforward(config)
        self.ffn_block = residual(config)
        self.cross_attn = attention(config, cross=True)
        self.cross_attn_block = residual(config)

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor,
        tgt_mask: torch.Tensor | None = None,
        src_mask: torch.Tensor | None = None,
        is_causal: bool = True,
        caches: tuple[KVCache, KVCache] | None = None,
        need_weights: bool = False,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor | None, torch.Tensor | None]]:
        self_cache, cross_cache = caches if caches is not None else (None, None)
        x, self_w = self.self_attn_block(
            x,
            lambda h: self.self_attn(
                h, attn_mask=tgt_mask, is_causal=is_causal, cache=self_cache, need_weights=need_weights
            ),
        )
        x, cross_w = self.cross_attn_block(
            x,
            lambda h: self.cross_attn(
                h, memory=memory, attn_mask=src_mask, cache=cross_cache, need_weights=need_weights
            ),
        )
        x, _ = self.ffn_block(x, lambda h: (self.ffn(h), None))
        return x, (self_w, cross_w)
