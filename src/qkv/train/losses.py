"""Label-smoothed cross-entropy (Vaswani et al. 2017, §5.4: "label smoothing of value
ε_ls = 0.1 ... hurts perplexity ... but improves accuracy and BLEU"; Szegedy et al. 2016)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def label_smoothed_nll(
    logits: torch.Tensor, target: torch.Tensor, label_smoothing: float = 0.1, ignore_index: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed label-smoothed cross-entropy and summed plain NLL, padding ignored.

    Shape: ``logits (B, T, V)`` (any float dtype; computed in float32), ``target (B, T)`` long.

    Returns:
        ``(loss_sum, nll_sum)``: scalars in nats, summed over non-``ignore_index`` targets.
        Divide by the number of target tokens for per-token values (ppl = exp(nll / n)).
    """
    logits = logits.float().reshape(-1, logits.size(-1))
    target = target.reshape(-1)
    loss = F.cross_entropy(
        logits, target, ignore_index=ignore_index, reduction="sum", label_smoothing=label_smoothing
    )
    if label_smoothing == 0.0:
        return loss, loss.detach()
    with torch.no_grad():
        nll = F.cross_entropy(logits, target, ignore_index=ignore_index, reduction="sum")
    return loss, nll
