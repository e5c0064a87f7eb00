"""The paper's building blocks, one concept per module."""

from .attention import KVCache, MultiHeadAttention, attention_steps, scaled_dot_product_attention
from .embeddings import TokenEmbedding
from .feedforward import PositionwiseFeedForward
from .layers import DecoderLayer, EncoderLayer, LayerConfig, SelfAttentionLayer
from .masks import causal_mask, combine_masks, padding_mask
from .norms import ResidualNorm
from .positional import (
    LearnedPositionalEmbedding,
    SinusoidalPositionalEncoding,
    build_positional,
    sinusoidal_positional_encoding,
)

__all__ = [
    "KVCache",
    "MultiHeadAttention",
    "attention_steps",
    "scaled_dot_product_attention",
    "TokenEmbedding",
    "PositionwiseFeedForward",
    "DecoderLayer",
    "EncoderLayer",
    "LayerConfig",
    "SelfAttentionLayer",
    "causal_mask",
    "combine_masks",
    "padding_mask",
    "ResidualNorm",
    "LearnedPositionalEmbedding",
    "SinusoidalPositionalEncoding",
    "build_positional",
    "sinusoidal_positional_encoding",
]
