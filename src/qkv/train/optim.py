"""Optimiser and learning-rate schedules.

Source: Vaswani et al. 2017, §5.3: Adam with β1 = 0.9, β2 = 0.98, ε = 1e-9 and
lrate = d_model^-0.5 · min(step^-0.5, step · warmup_steps^-1.5)   (Eq. 3).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:
    from torch.optim.optimizer import ParamsT


class AdamSettings(Protocol):
    """What :func:`make_optimizer` reads of its settings: a
    :class:`~qkv.train.train_settings.TrainSettings` (which imports this module's schedules, so it is
    named here by what it has)."""

    @property
    def weight_decay(self) -> float: ...
    @property
    def beta1(self) -> float: ...
    @property
    def beta2(self) -> float: ...
    @property
    def eps(self) -> float: ...


def noam_lr(step: int, d_model: int, warmup_steps: int, factor: float = 1.0) -> float:
    """Eq. 3 times ``factor``; ``step`` counts from 1 (step 0 is treated as 1)."""
    step = max(step, 1)
    return factor * d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)


def make_adam(
    params: ParamsT, betas: tuple[float, float] = (0.9, 0.98), eps: float = 1e-9, weight_decay: float = 0.0
) -> torch.optim.Optimizer:
    """Adam(W) with the paper's β and ε; lr is set per step by the schedule."""
    # fused=True: one kernel for all parameters instead of a loop of small ops (CPU and CUDA).
    return torch.optim.AdamW(params, lr=0.0, betas=betas, eps=eps, weight_decay=weight_decay, fused=True)


def make_optimizer(model: torch.nn.Module, settings: AdamSettings) -> torch.optim.Optimizer:
    """AdamW over ``model``'s trainable parameters with ``settings``' (a
    :class:`~qkv.train.train_settings.TrainSettings`) betas and eps; weight decay on matrices
    (embeddings, linears) only, not on norms and biases."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    return make_adam(
        [
            {"params": [p for p in trainable if p.dim() >= 2], "weight_decay": settings.weight_decay},
            {"params": [p for p in trainable if p.dim() < 2], "weight_decay": 0.0},
        ],
        betas=(settings.beta1, settings.beta2),
        eps=settings.eps,
    )


def warmup_cosine_lr(
    step: int, peak_lr: float, min_lr: float, warmup_steps: int, decay_steps: int, shape: str = "cosine"
) -> float:
    """Linear warm-up to ``peak_lr``, then cosine (or, ``shape="linear"``, linear) decay to
    ``min_lr`` at ``decay_steps`` and constant after (Loshchilov & Hutter 2017; GPT-2 /
    nanoGPT). ``step`` counts from 1, so step ``s`` here is nanoGPT's iteration ``s - 1``."""
    it = step - 1
    if it < warmup_steps:
        return peak_lr * (it + 1) / (warmup_steps + 1)
    if it > decay_steps:
        return min_lr
    return _decay(min_lr, peak_lr, (it - warmup_steps) / max(decay_steps - warmup_steps, 1), shape)


def budget_lr(
    step: int, used: float, peak_lr: float, min_lr: float, warmup_steps: int, shape: str = "linear"
) -> float:
    """A schedule for a budget whose length in steps is unknown (a time budget): linear
    warm-up over ``warmup_steps`` steps, times a decay from ``peak_lr`` to ``min_lr`` as the
    fraction ``used`` (0..1) of the budget is spent. Linear decay to the end of the budget is
    the best schedule for a fixed training budget in Li et al. 2020 ("Budgeted Training")."""
    warm = min(step / (warmup_steps + 1), 1.0) if warmup_steps else 1.0
    return warm * _decay(min_lr, peak_lr, min(max(used, 0.0), 1.0), shape)


def _decay(min_lr: float, peak_lr: float, ratio: float, shape: str) -> float:
    """``peak_lr`` at ``ratio`` 0 to ``min_lr`` at 1, cosine or linear."""
    factor = 0.5 * (1.0 + math.cos(math.pi * ratio)) if shape == "cosine" else 1.0 - ratio
    return min_lr + factor * (peak_lr - min_lr)
