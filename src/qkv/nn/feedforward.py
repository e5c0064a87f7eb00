"""Position-wise feed-forward network.

Source: Vaswani et al. 2017, §3.3, Eq. 2: FFN(x) = max(0, x W1 + b1) W2 + b2, applied to each
position separately and identically (inner width d_ff = 2048 in the base model). Later models
replace ReLU: GELU (Hendrycks & Gimpel 2016; BERT uses the exact erf form, GPT-2 the tanh
approximation) and SiLU/swish (Ramachandran et al. 2017; Marian).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

Activation = Literal["relu", "gelu", "gelu_tanh", "silu"]
# name → function; "gelu" is exact (erf), "gelu_tanh" GPT-2's tanh approximation ("gelu_new").
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": partial(F.gelu, approximate="tanh"),
    "silu": F.silu,
}


def activation_function(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The activation ``name`` of :data:`ACTIVATIONS` (elementwise, any shape).

    Raises:
        ValueError: an unknown name, with the known ones listed.
    """
    if name not in ACTIVATIONS:
        raise ValueError(f"unknown activation {name!r}; choose one of {sorted(ACTIVATIONS)}")
    return ACTIVATIONS[name]


class ActivationLayer(nn.Module):
    """An activation of :data:`ACTIVATIONS` as a module without parameters, for
    ``nn.Sequential`` (BERT's masked-LM head transform: dense, activation, LayerNorm; Devlin et
    al. 2019, whose head reuses the FFN's activation).

    Args:
        name: ``"relu"``, ``"gelu"`` (exact), ``"gelu_tanh"`` or ``"silu"``.

    Shape: any ``(*)`` → the same ``(*)``.

    Raises:
        ValueError: an unknown name (see :func:`activation_function`).
    """

    def __init__(self, name: str) -> None:
        super().__init__()
        self.fn, self.name = activation_function(name), name

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)

    def extra_repr(self) -> str:
        return repr(self.name)


class PositionwiseFeedForward(nn.Module):
    """FFN(x) = act(x W1 + b1) W2 + b2 with ``act = relu`` by default (Eq. 2).

    Args:
        d_model: input/output width D. d_ff: inner width.
        dropout: dropout on the inner activation (the Tensor2Tensor "relu dropout"; 0 in the
            paper's text, an option here).
        activation: ``"relu"`` (paper), ``"gelu"`` (exact), ``"gelu_tanh"`` or ``"silu"``.
        bias: biases on both linears.

    Shape: ``(B, T, D) -> (B, T, D)``.
    """

    def __init__(
        self, d_model: int, d_ff: int, dropout: float = 0.0, activation: str = "relu", bias: bool = True
    ) -> None:
        super().__init__()
        fn = activation_function(activation)
        self.w_1 = nn.Linear(d_model, d_ff, bias=bias)
        self.w_2 = nn.Linear(d_ff, d_model, bias=bias)
        self.activation, self.activation_name = fn, activation
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.activation(self.w_1(x))  # (B, T, d_ff)
        return self.w_2(self.dropout(h) if self.training else h)  # eval: skip the no-op call
