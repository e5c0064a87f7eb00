"""Token embeddings scaled by sqrt(d_model).

Source: Vaswani et al. 2017, §3.4: "In the embedding layers, we multiply those weights by
sqrt(d_model)", and the same matrix is shared with the pre-softmax linear transformation.
"""

from __future__ import annotations

import math

import torch
from torch import nn


def check_token_ids(tokens: torch.Tensor, vocab_size: int) -> None:
    """Raise ``ValueError`` for an id outside ``[0, vocab_size)``: a clear message instead of an
    index error deep inside torch (or a device-side assert on a GPU).

    One pass and one host sync, so it belongs where ids enter from a user (generation and
    translation entry points), not in ``forward``. Shape: ``tokens`` any shape, integer.
    """
    if tokens.numel():
        lo, hi = (int(v) for v in torch.aminmax(tokens))
        if lo < 0 or hi >= vocab_size:
            raise ValueError(f"token id out of range [0, {vocab_size}): min {lo}, max {hi}")


class TokenEmbedding(nn.Module):
    """Lookup ``E[token] * sqrt(d_model)`` (``scale=False``: plain ``E[token]``, GPT-2's choice).

    Shape: ``tokens (B, T)`` long → ``(B, T, D)`` float. The ``pad_id`` row starts at zero and
    gets no gradient (``padding_idx``), so padding carries no learned signal.
    Ids are not checked here (that would be a host sync on every call): entry points that take
    ids from users call :func:`check_token_ids` once.
    """

    def __init__(self, vocab_size: int, d_model: int, pad_id: int | None = None, scale: bool = True) -> None:
        super().__init__()
        self.vocab_size, self.d_model = vocab_size, d_model
        self.weight = nn.Parameter(torch.empty(vocab_size, d_model))
        nn.init.normal_(self.weight, std=d_model**-0.5)
        if pad_id is not None:
            with torch.no_grad():
                self.weight[pad_id].zero_()
        self.pad_id = pad_id
        self.scale = math.sqrt(d_model) if scale else 1.0

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out = nn.functional.embedding(tokens, self.weight, self.pad_id)
        return out * self.scale if self.scale != 1.0 else out


def esm_token_dropout(
    x: torch.Tensor,
    tokens: torch.Tensor,
    mask_id: int,
    attention_mask: torch.Tensor,
    train_mask_ratio: float = 0.15 * 0.8,
) -> torch.Tensor:
    """ESM-2's token dropout (Lin et al. 2023; ``EsmEmbeddings`` in HF transformers): the
    embeddings of ``<mask>`` tokens are zeroed and every embedding is scaled by
    ``(1 - train_mask_ratio) / (1 - observed mask ratio)``, so the embedding sum keeps the
    scale it had in pre-training (where 15 % × 80 % of tokens were masks). With no mask token
    the scale is 0.88: ESM applies it at inference too.

    Shape: ``x (B, T, D)``, ``tokens (B, T)`` long, ``attention_mask (B, T)`` bool (real
    tokens) → ``(B, T, D)``.
    """
    is_mask = (tokens == mask_id).unsqueeze(-1)  # (B, T, 1)
    x = x.masked_fill(is_mask, 0.0)
    lengths = attention_mask.sum(-1).clamp(min=1)  # (B,)
    observed = is_mask.squeeze(-1).sum(-1) / lengths  # (B,)
    return (x * ((1 - train_mask_ratio) / (1 - observed))[:, None, None]).to(x.dtype)
