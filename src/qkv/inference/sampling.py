"""Choosing the next token from logits: greedy, temperature, top-k, top-p (nucleus).

Sources: temperature sampling (Ackley et al. 1985; used for text by GPT-2), top-k (Fan et al.
2018), nucleus / top-p (Holtzman et al. 2020, §3.1: the smallest set of tokens whose cumulative
probability reaches p).

Extreme settings never give NaN or infinite probabilities: a temperature so small that
``logits / temperature`` overflows float32 (``1e-300``, ``5e-324``) is greedy-equivalent (the
most likely tokens share the mass), a huge one flattens the distribution over the tokens whose
logit is finite, and a ``top_p`` so small that no token reaches it (``5e-324``) keeps the most
likely token. Every row must have at least one finite logit.
"""

from __future__ import annotations

import math

import torch

from ..errors import QkvError

# Temperatures whose float32 value and reciprocal are both normal numbers: dividing float32
# logits by them is safe. Outside this range the division runs in float64 (float32 rounds
# 1e-300 to 0, and 0 / 0 is NaN).
_FLOAT32_SAFE = (1e-37, 1e37)


def check_sampling(temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None) -> None:
    """Raise :class:`QkvError` for settings that have no meaning: a temperature that is not a
    finite number > 0 (for 0 use greedy decoding instead), top_k < 1, top_p not a number in
    (0, 1]. Tiny positive values are accepted (see the module docstring)."""
    if not (temperature > 0.0 and math.isfinite(temperature)):
        raise QkvError(
            f"temperature must be a finite number > 0 (got {temperature}); for the most "
            "likely token at every step use greedy decoding (qkv generate --greedy)"
        )
    if top_k is not None and top_k < 1:
        raise QkvError(f"top_k must be >= 1 (got {top_k})")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise QkvError(f"top_p must be in (0, 1] (got {top_p})")


def _divide(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """``logits / temperature`` in float32, computed in float64 when float32 cannot hold the
    temperature (the result then overflows to ``±inf`` or underflows to 0 as float64 says)."""
    if _FLOAT32_SAFE[0] <= temperature <= _FLOAT32_SAFE[1]:
        return logits / temperature
    return (logits.double() / temperature).float()


def _scale(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """``logits / temperature``; a row where that overflows (a finite logit became infinite,
    or NaN) is shifted by its maximum first, which leaves its softmax unchanged: its most likely
    tokens get 0 and the others a finite value or ``-inf``, never NaN."""
    scaled = _divide(logits, temperature)
    overflowed = (torch.isfinite(scaled) != torch.isfinite(logits)).any(-1, keepdim=True)  # (B, 1)
    shifted = _divide(logits - logits.amax(-1, keepdim=True), temperature)
    return torch.where(overflowed, shifted, scaled)


def filter_logits(
    logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None
) -> torch.Tensor:
    """Logits divided by ``temperature``, with tokens outside the top-k / the nucleus set to
    ``-inf``.

    A row whose division overflows float32 (a temperature like ``1e-300``) is shifted by its
    maximum before dividing: its most likely token(s) get 0, so the row stays a valid
    (greedy-equivalent) distribution. The nucleus is the smallest set of most likely tokens
    whose mass reaches ``top_p``, and always holds at least the most likely token (so a
    ``top_p`` of ``5e-324`` is greedy-equivalent too).

    Shape: ``(B, V)`` float → ``(B, V)`` float32. Raises :class:`QkvError` on bad settings.
    """
    check_sampling(temperature, top_k, top_p)
    logits = logits.float()
    if temperature != 1.0:
        logits = _scale(logits, temperature)
    if top_k is not None and top_k < logits.size(-1):
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        mass_before = probs.cumsum(-1) - probs  # probability of the tokens ranked above
        # float32 rounds a top_p below 1e-45 to 0, which every mass reaches: the most likely
        # token is kept explicitly.
        drop_sorted = mass_before >= top_p
        drop_sorted[:, 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def next_token_probs(
    logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None
) -> torch.Tensor:
    """The distribution the sampler draws from. Shape: ``(B, V)`` → ``(B, V)`` float32, rows
    sum to 1 and are finite for any setting :func:`check_sampling` accepts (see
    :func:`filter_logits` for tiny temperatures and ``top_p``)."""
    return torch.softmax(filter_logits(logits, temperature, top_k, top_p), dim=-1)


def choose_next(
    logits: torch.Tensor,
    do_sample: bool = True,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Next token ids: the argmax (``do_sample=False``) or a draw from :func:`next_token_probs`.

    Shape: ``logits (B, V)`` → ``(B,)`` long.
    """
    if not do_sample:
        # max's indices are argmax's (the first maximum), 1.6x (float32) to 4x (bfloat16)
        # faster on a CPU over a 50k vocabulary (torch 2.13): 1 % of a GPT-2-small step.
        return logits.max(dim=-1).indices
    probs = next_token_probs(logits, temperature, top_k, top_p)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
