"""The masked diffusion objective: the forward (masking) process, the loss, and a Monte Carlo
estimate of the bound it is.

Sources: Sahoo et al. 2024 (MDLM), §3 (absorbing-state forward process with the linear
schedule α_t = 1 − t: each token is replaced by [MASK] with probability t; Eq. 10–11, the
continuous-time negative ELBO, which for this schedule weighs the cross-entropy of the masked
tokens by 1/t; §4.1's low-discrepancy sampler of t); Nie et al. 2025 (LLaDA), §2.1, Eq. 3–4:

    L(θ) = −E_{t ~ U(0,1), x_0, x_t} [ (1/t) Σ_i 1[x_t^i = M] log p_θ(x_0^i | x_t) ],

"an upper bound on the negative log-likelihood of the model distribution". t is drawn from
U(ε, 1) (MDLM: ε = 1e-3) so the 1/t weight stays finite.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

DEFAULT_EPS = 1e-3


def sample_times(
    batch: int,
    eps: float = DEFAULT_EPS,
    *,
    stratified: bool = False,
    generator: torch.Generator | None = None,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """Masking ratios ``t ~ U(eps, 1)``, one per sequence. Shape: ``(batch,)`` float32.

    ``stratified``: MDLM's low-discrepancy sampler (§4.1): ``u_b = (u + b / batch) mod 1`` from
    one uniform ``u``, so a batch covers [0, 1) evenly (each ``t_b`` is still uniform, so the
    loss stays an unbiased estimate, with less variance). Independent draws otherwise.
    """
    if stratified:
        u = torch.rand(1, generator=generator, device=device)
        u = (u + torch.arange(batch, device=device) / batch) % 1.0
    else:
        u = torch.rand(batch, generator=generator, device=device)
    return eps + (1.0 - eps) * u


def mask_tokens(
    x0: torch.Tensor,
    t: torch.Tensor,
    mask_id: int,
    valid: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward process q(x_t | x_0) (MDLM §3.1, absorbing state): every token of row ``b``
    is replaced by ``mask_id`` independently with probability ``t[b]``.

    Shapes: ``x0 (B, T)`` long, ``t (B,)`` float, ``valid (B, T)`` bool (``False`` = padding,
    never masked) → ``(x_t (B, T) long, masked (B, T) bool)``.
    """
    u = torch.rand(x0.shape, generator=generator, device=x0.device)
    masked = u < t[:, None]
    if valid is not None:
        masked &= valid
    return torch.where(masked, torch.full_like(x0, mask_id), x0), masked


def masked_diffusion_loss(
    logits: torch.Tensor, x0: torch.Tensor, masked: torch.Tensor, t: torch.Tensor
) -> torch.Tensor:
    """The per-sequence negative ELBO of one draw of ``(t, x_t)`` (LLaDA Eq. 3, MDLM Eq. 11 with
    α_t = 1 − t): ``(1 / t_b) · Σ_{i masked} −log p_θ(x0_i | x_t)``, in nats.

    Shapes: ``logits (B, T, V)`` (any float dtype; computed in float32), ``x0 (B, T)`` long,
    ``masked (B, T)`` bool, ``t (B,)`` → ``(B,)`` float32. Sum it and divide by the number of
    tokens for the bound per token (unmasked tokens cost nothing: SUBS, MDLM §3.2.1).
    """
    nll = F.cross_entropy(logits.float().transpose(1, 2), x0, reduction="none")  # (B, T)
    nll = torch.where(masked, nll, torch.zeros_like(nll))  # an unmasked row: -inf logit * 0 safe
    return nll.sum(dim=1) / t.float()


@dataclass(frozen=True)
class BoundEstimate:
    """A Monte Carlo estimate of the negative ELBO of a split (:func:`estimate_bound`).

    Attributes:
        nats_per_token: the bound per token (nats), an upper bound on the model's NLL.
        stderr: its Monte Carlo standard error (nats per token; the data fixed, the draws of
            ``t`` and masks random), ``nan`` with one sample per sequence.
        tokens: tokens scored.
        samples: draws of ``(t, x_t)`` per sequence.
    """

    nats_per_token: float
    stderr: float
    tokens: int
    samples: int

    @property
    def bits_per_token(self) -> float:
        return self.nats_per_token / math.log(2)


def estimate_bound(
    model: torch.nn.Module,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor | None]],
    mask_id: int,
    samples: int = 1,
    eps: float = DEFAULT_EPS,
    seed: int = 0,
) -> BoundEstimate:
    """The negative ELBO per token of a split, by Monte Carlo over ``t`` and the masks, with a
    fixed ``seed`` (the same figure on every call).

    Args:
        model: a :class:`~qkv.models.diffusion_lm.DiffusionLM` (or anything whose forward takes
            ``(tokens, attention_mask)`` and returns ``.logits``), in eval mode.
        batches: ``(x0 (B, T) long, valid (B, T) bool or None)``; ``None`` = full rows.
        samples: independent draws per sequence (≥ 2 for a standard error).

    The standard error is that of the Monte Carlo average with the data fixed:
    ``sqrt(Σ_rows s²_row / samples) / tokens``, ``s²_row`` the sample variance of a row's draws.
    Independent (not stratified) draws, so the rows' draws are independent.
    """
    device = next(model.parameters()).device
    g = torch.Generator(device=device).manual_seed(seed)
    total, variance, tokens = 0.0, 0.0, 0
    with torch.no_grad():
        for x0, valid in batches:
            tokens += x0.numel() if valid is None else int(valid.sum())  # before the move: no sync
            x0 = x0.to(device)
            valid = None if valid is None else valid.to(device)
            draws = []
            for _ in range(samples):
                t = sample_times(len(x0), eps, generator=g, device=device)
                xt, masked = mask_tokens(x0, t, mask_id, valid, generator=g)
                draws.append(masked_diffusion_loss(model(xt, valid).logits, x0, masked, t))
            values = torch.stack(draws).double()  # (samples, B)
            total += float(values.mean(0).sum())
            if samples > 1:
                variance += float(values.var(0).sum()) / samples
    stderr = math.sqrt(variance) / tokens if samples > 1 else float("nan")
    return BoundEstimate(total / tokens, stderr, tokens, samples)
