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
    if label_smoothing == 0.0:
        loss = F.cross_entropy(logits, target, ignore_index=ignore_index, reduction="sum")
        return loss, loss.detach()
    # One log-softmax for both sums: the smoothed loss is (1 - ε)·NLL + ε·(the cross-entropy of
    # the uniform distribution, -mean log p), F.cross_entropy's definition, and the NLL is read
    # from the same log-probabilities instead of a second softmax over the vocabulary.
    log_probs = F.log_softmax(logits, dim=-1)  # (N, V)
    keep = target != ignore_index
    nll = -log_probs.gather(1, target.masked_fill(~keep, 0)[:, None]).squeeze(1)  # (N,)
    smooth = -log_probs.mean(dim=-1)  # (N,)
    mask = keep.to(log_probs.dtype)
    loss = (((1.0 - label_smoothing) * nll + label_smoothing * smooth) * mask).sum()
    return loss, (nll.detach() * mask).sum()
