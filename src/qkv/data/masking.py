"""Masked-language-model corruption (BERT, Devlin et al. 2019, §3.1; ESM, Rives et al. 2021).

15 % of the residue positions are chosen; of those 80 % become ``<mask>``, 10 % a random
residue and 10 % stay as they are. The model must predict the original residue at every
chosen position; other positions carry no loss (label -100).
"""

from __future__ import annotations

import torch

IGNORE = -100  # label of positions without loss (torch's cross_entropy ignore_index)


def mask_tokens(
    tokens: torch.Tensor,
    special: torch.Tensor | list[int],
    mask_id: int,
    replacement_ids: list[int],
    mask_prob: float = 0.15,
    generator: torch.Generator | None = None,
    split: tuple[float, float] = (0.8, 0.1),
) -> tuple[torch.Tensor, torch.Tensor]:
    """Corrupt ``tokens`` for masked language modelling.

    Args:
        tokens: ``(B, T)`` long ids. special: ids never chosen (cls, eos, pad, ...).
        mask_id: the ``<mask>`` id. replacement_ids: ids a "random" position may become.
        mask_prob: share of eligible positions chosen (0.15).
        split: shares of chosen positions set to ``<mask>`` and to a random id (the rest stay
            unchanged); ``(1.0, 0.0)`` masks every chosen position, as for evaluation, where
            an unchanged residue would be free to copy.

    Returns:
        ``(inputs (B, T), labels (B, T))``: labels hold the original id at chosen positions
        and -100 elsewhere.
    """
    special = torch.as_tensor(special, device=tokens.device)
    eligible = ~torch.isin(tokens, special)
    draw = torch.rand(tokens.shape, generator=generator, device=tokens.device)
    chosen = eligible & (draw < mask_prob)
    labels = torch.where(chosen, tokens, torch.full_like(tokens, IGNORE))
    # Split the chosen positions 80 / 10 / 10 with a second draw.
    how = torch.rand(tokens.shape, generator=generator, device=tokens.device)
    inputs = tokens.clone()
    to_mask, to_random = split
    inputs[chosen & (how < to_mask)] = mask_id
    randomised = chosen & (how >= to_mask) & (how < to_mask + to_random)
    choices = torch.as_tensor(replacement_ids, device=tokens.device)
    picks = torch.randint(len(replacement_ids), tokens.shape, generator=generator, device=tokens.device)
    inputs[randomised] = choices[picks][randomised]
    return inputs, labels
