"""Int8 weight-only quantisation for memory-bound decoding.

Decoding one token streams every weight matrix from memory once, so halving the bytes per
weight (bfloat16 → int8) nearly halves the time per token where the kernel keeps up. Each
weight row (one output feature) is stored as int8 with one scale, ``s_j = max_i |W_ji| / 127``
and ``Q_ji = round(W_ji / s_j)``, so ``W ≈ s ⊙ Q`` with an error of at most ``s_j / 2`` per
entry; activations stay bfloat16 and the product dequantises on the fly
(``torch._weight_int8pack_mm``, the kernel gpt-fast uses). The quality cost is measured, not
assumed: ``benchmarks/int8_quality.py`` (perplexity and BLEU before and after); the speed
against bfloat16 weights is in ``benchmarks/RESULTS.md`` ("Int8 weights").

The kernel is fast only with bfloat16 activations (with float32 ones it is several times
slower), so a model is cast to bfloat16 first.
"""

from __future__ import annotations

from typing import TypeVar

import torch
from torch import nn

from ..errors import QkvError
from .weight_layout import FrozenLinear

_M = TypeVar("_M", bound=nn.Module)


class Int8Linear(FrozenLinear):
    """Inference-only stand-in for an ``nn.Linear``: ``y = x (s ⊙ Q)ᵀ + b`` with ``Q`` the
    weight rounded to int8 per output row and ``s`` the rows' scales (module docstring).

    ``weight`` and ``bias`` stay the wrapped module's own Parameters (:class:`FrozenLinear`: the
    state dict and tied embeddings are unchanged; the int8 copy is a snapshot, not saved). Put
    the model in eval mode, and cast it to bfloat16, first.

    Shape: ``x (..., in_features)`` bfloat16 → ``(..., out_features)`` bfloat16.

    Raises:
        QkvError: a weight that is not bfloat16 (cast the model first).
        RuntimeError: ``forward`` in training mode.
    """

    def __init__(self, linear: nn.Linear) -> None:
        if linear.weight.dtype != torch.bfloat16:
            raise QkvError(
                f"int8 weights run with bfloat16 activations: cast the model to bfloat16 "
                f"first (this weight is {linear.weight.dtype})"
            )
        super().__init__(linear)
        w = linear.weight.detach().float()
        scale = w.abs().amax(dim=1).clamp(min=torch.finfo(torch.float32).tiny) / 127
        self.qweight = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8).contiguous()
        self.scale = scale.to(torch.bfloat16)

    def compute(self, x: torch.Tensor) -> torch.Tensor:
        y = torch._weight_int8pack_mm(x.reshape(-1, self.in_features), self.qweight, self.scale)
        if self.bias is not None:
            y = y.add_(self.bias)
        return y.reshape(*x.shape[:-1], self.out_features)


@torch.no_grad()
def quantize_int8(model: _M) -> _M:
    """Replace every ``nn.Linear`` of a bfloat16 model in eval mode (the output projection
    included) by an :class:`Int8Linear`. Returns ``model`` (changed in place); embeddings and
    norms keep their dtype. Safe to call twice.

    Raises:
        QkvError: the model is in training mode or has a linear whose weight is not bfloat16.
    """
    if model.training:
        raise QkvError("quantize a model for inference only: call model.eval() first")
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                setattr(parent, name, Int8Linear(child))
    return model


def cast_weights(model: _M, weights: torch.dtype | str) -> _M:
    """``model`` (eval mode, changed in place) with its weights in ``weights``: a torch dtype,
    or ``"int8"`` (int8 matrices, everything else bfloat16: :func:`quantize_int8`).

    Raises:
        QkvError: a string other than ``"int8"``, or :func:`quantize_int8`'s errors.
    """
    if isinstance(weights, torch.dtype):
        return model.to(weights)
    if weights != "int8":
        raise QkvError(f"unknown weight format {weights!r}: a torch dtype or int8")
    return quantize_int8(model.to(torch.bfloat16))
