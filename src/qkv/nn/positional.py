"""Positional information: sinusoidal encoding (the paper's), learned embeddings (option) and
rotary positions (RoPE, option).

Source: Vaswani et al. 2017, §3.5:
    PE(pos, 2i)   = sin(pos / 10000^(2i / d_model))
    PE(pos, 2i+1) = cos(pos / 10000^(2i / d_model))
and the lecture notes on positional encoding; rotary positions from Su et al. 2021
(RoFormer): queries and keys rotated by their positions inside self-attention, nothing added
to the embeddings.
"""

from __future__ import annotations

import torch
from torch import nn


def sinusoidal_positional_encoding(
    max_len: int, d_model: int, base: float = 10000.0, interleaved: bool = True
) -> torch.Tensor:
    """The matrix PE of §3.5.

    ``interleaved=False`` puts the same values in another column order: all sines, then all
    cosines (``[sin(pos·ω_0) … sin(pos·ω_{D/2-1}), cos(pos·ω_0) …]``), the layout of the
    paper's reference code (Tensor2Tensor's ``get_timing_signal_1d``) and of Marian.

    Returns:
        float32 tensor ``(max_len, d_model)``; row ``pos`` is the encoding of position ``pos``
        (0-based); even columns hold sines, odd columns cosines (interleaved).

    Raises:
        ValueError: ``d_model`` odd or ``max_len`` < 1.
    """
    if d_model % 2:
        raise ValueError(f"d_model ({d_model}) must be even for sinusoidal positions")
    if max_len < 1:
        raise ValueError(f"max_len ({max_len}) must be >= 1")
    pos = torch.arange(max_len, dtype=torch.float64)[:, None]  # (L, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (D/2,)
    angle = pos / base ** (two_i / d_model)  # (L, D/2)
    if not interleaved:
        return torch.cat([torch.sin(angle), torch.cos(angle)], dim=-1).float()
    pe = torch.empty(max_len, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angle)
    pe[:, 1::2] = torch.cos(angle)
    return pe.float()


class SinusoidalPositionalEncoding(nn.Module):
    """Adds nothing learnable: returns PE rows for the given positions (a fixed buffer).

    Shape: ``positions (B, T)`` or ``(T,)`` long → ``(B, T, D)`` / ``(T, D)`` float.
    Positions must be below ``max_len`` (unchecked here, see :func:`check_positions`).
    """

    pe: torch.Tensor  # a buffer (register_buffer): typed for the checker, nothing at runtime

    def __init__(self, max_len: int, d_model: int, interleaved: bool = True) -> None:
        super().__init__()
        self.max_len = max_len
        self.register_buffer(
            "pe", sinusoidal_positional_encoding(max_len, d_model, interleaved=interleaved), persistent=False
        )

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        return self.pe[positions]


class LearnedPositionalEmbedding(nn.Module):
    """Learned absolute positions (the paper's §3.5 alternative, "nearly identical results").

    Shape: ``positions (B, T)`` or ``(T,)`` long → ``(..., T, D)``. Positions must be below
    ``max_len`` (unchecked here, see :func:`check_positions`).
    """

    def __init__(self, max_len: int, d_model: int) -> None:
        super().__init__()
        self.max_len = max_len
        self.embedding = nn.Embedding(max_len, d_model)
        nn.init.normal_(self.embedding.weight, std=d_model**-0.5)

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        return self.embedding(positions)


class RotaryEmbedding(nn.Module):
    """Rotary position embedding, RoPE (Su et al. 2021, "RoFormer", Eq. 34).

    Instead of adding a vector to the input, each query and key is rotated in ``d_k / 2``
    planes by angles ``pos · θ_i``, ``θ_i = base^(-2i / d_k)`` (the frequencies of §3.5's
    sinusoids), so ``q_m · k_n`` depends only on ``m - n``. Pairs are (i, i + d_k/2) ("rotate
    half", the GPT-NeoX / Llama layout).

    Args:
        d_k: per-head width (even). max_len: largest position + 1. base: 10000 as in §3.5.

    Shape: ``x (B, H, T, d_k)``, ``positions (T,)`` or ``(B, T)`` long, or an int start →
    ``(B, H, T, d_k)``.
    Raises ``ValueError`` for an odd ``d_k``; positions must be below ``max_len`` (unchecked
    in ``forward``, see :func:`check_positions`).
    """

    cos: torch.Tensor  # buffers (register_buffer): typed for the checker, nothing at runtime
    signed_sin: torch.Tensor

    def __init__(self, d_k: int, max_len: int, base: float = 10000.0) -> None:
        super().__init__()
        if d_k % 2:
            raise ValueError(f"d_k ({d_k}) must be even for rotary positions")
        self.max_len = max_len
        inv_freq = base ** (-torch.arange(0, d_k, 2, dtype=torch.float64) / d_k)  # (d_k/2,)
        angle = torch.arange(max_len, dtype=torch.float64)[:, None] * inv_freq  # (L, d_k/2)
        angle = torch.cat([angle, angle], dim=-1)  # (L, d_k)
        self.register_buffer("cos", angle.cos().float(), persistent=False)
        # rotate-half's minus sign folded into the table: x·cos + swap(x)·(-sin, sin) needs no
        # negated copy of x
        sin = angle.sin().float()
        half = d_k // 2
        self.register_buffer(
            "signed_sin", torch.cat([-sin[:, :half], sin[:, half:]], dim=-1), persistent=False
        )

    def forward(self, x: torch.Tensor, positions: torch.Tensor | int) -> torch.Tensor:
        """``x (..., T, d_k)`` rotated by ``positions``: ``(T,)`` or ``(B, T)`` long (``x`` is
        then ``(B, H, T, d_k)``), or an int, the first of ``T`` consecutive positions (a slice
        of the tables, no gather: the usual case, and queries and keys stacked in one call)."""
        if isinstance(positions, int):
            t = x.size(-2)
            cos, sin = self.cos[positions : positions + t], self.signed_sin[positions : positions + t]
        else:
            cos, sin = self.cos[positions], self.signed_sin[positions]  # (T, d_k) or (B, T, d_k)
            if positions.dim() == 2:
                cos, sin = cos[:, None], sin[:, None]  # (B, 1, T, d_k)
        half = x.size(-1) // 2
        swapped = torch.cat([x[..., half:], x[..., :half]], dim=-1)
        return (x * cos + swapped * sin).to(x.dtype)


def check_positions(positions: torch.Tensor, max_len: int) -> None:
    """Raise ``ValueError`` for a position >= ``max_len``. One host sync, so it belongs where
    positions enter from a user, not in ``forward`` (models compare ``start + T`` with
    ``max_len`` as Python ints instead)."""
    last = int(positions.max()) if positions.numel() else -1
    if last >= max_len:
        raise ValueError(
            f"sequence position {last} exceeds the model's max_len ({max_len}); "
            "shorten the input or build the model with a larger max_len"
        )


POSITIONALS = ("sinusoidal", "sinusoidal_halves", "learned", "rotary", "none")


def build_positional(kind: str, max_len: int, d_model: int) -> nn.Module | None:
    """The module added to token embeddings: ``"sinusoidal"`` (§3.5, interleaved),
    ``"sinusoidal_halves"`` (sines then cosines: Tensor2Tensor, Marian) or ``"learned"``;
    ``None`` for ``"rotary"`` (applied inside attention instead) and for ``"none"``: no order
    at all, the lecture's "single block of weights" that attention alone is (self-attention is
    permutation-equivariant without positions, which is why §3.5 adds them). Raises
    ``ValueError`` otherwise."""
    if kind in ("sinusoidal", "sinusoidal_halves"):
        return SinusoidalPositionalEncoding(max_len, d_model, interleaved=kind == "sinusoidal")
    if kind == "learned":
        return LearnedPositionalEmbedding(max_len, d_model)
    if kind in ("rotary", "none"):
        return None
    raise ValueError(f"unknown positional encoding {kind!r}; choose one of {POSITIONALS}")


__all__ = [
    "sinusoidal_positional_encoding",
    "check_positions",
    "SinusoidalPositionalEncoding",
    "LearnedPositionalEmbedding",
    "RotaryEmbedding",
    "build_positional",
    "POSITIONALS",
]
