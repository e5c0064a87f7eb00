"""Follow each token through the whole block: what the page's "follow a token" views draw.

Source: Vaswani et al. 2017, §3.1 (Figure 1): every sub-layer (self-attention, cross-attention,
the FFN of §3.3) reads the residual stream, and its output is added back to it, normalised
before (pre-LN) or after (post-LN, the paper's order). Per layer and token this module reports
the stream's size, each sub-layer's contribution to it, its norm's input and output, the FFN's
strongest neurons, and the logit lens (nostalgebraist 2020: the model's own output head applied
to the stream after the layer); then the model's final logits, for the sampler's view
(temperature, top-k, top-p: :mod:`qkv.inference.sampling`).

All numbers are read from an :class:`~qkv.explain.activations.ActivationCache` of the model's
own forward pass.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import cast

import torch
from torch import nn

from ..nn.layers import LayerConfig
from .activations import ActivationCache, logit_lens, readout

TOP_NEURONS = 8  # FFN neurons shown per layer and token
TOP_LENS = 5  # tokens the logit lens shows per layer
FINAL_LOGITS = 64  # final logits sent for the sampler's view (all of them up to this vocabulary size)
DIGITS = 4
SUBLAYERS = ("self_attn", "cross_attn", "ffn")


def rounded(t: torch.Tensor, digits: int = DIGITS) -> list:
    """``t`` as nested lists of numbers rounded to ``digits`` decimals, for the page's JSON."""
    return torch.round(t.double(), decimals=digits).tolist()  # float64: 0.0442, not 0.04422000050544739


def _norms(x: torch.Tensor) -> list:
    """``||x||`` per token: ``(1, T, D)`` → ``T`` numbers."""
    return rounded(x[0].float().norm(dim=-1))


def _stats(x: torch.Tensor) -> dict:
    """Mean and standard deviation over the features of each token: what a LayerNorm sets to
    0 and 1 (before its γ, β), ``T`` numbers each."""
    x = x[0].float()
    return {"mean": rounded(x.mean(-1)), "std": rounded(x.std(-1, unbiased=False))}


def _top(values: torch.Tensor, k: int, labels: Callable[[int], str] | None = None) -> list:
    """Per row, the ``k`` largest ``[index or label, value]``: ``(T, N)`` → ``T`` lists."""
    top = torch.topk(values.float(), min(k, values.size(-1)), dim=-1)
    out = []
    for idx, val in zip(top.indices.tolist(), rounded(top.values), strict=True):
        # a logit of -inf (the diffusion LM's mask token) is no choice at all, and no JSON
        pairs = zip(idx, val, strict=True)
        out.append([[labels(i) if labels else i, v] for i, v in pairs if math.isfinite(v)])
    return out


def _sublayer(cache: ActivationCache, sub: str) -> dict:
    return {
        "name": sub.rpartition(".")[2],
        "out_norm": _norms(cache[f"{sub}.out"]),
        "resid_post_norm": _norms(cache[f"{sub}.resid_post"]),
        "norm_in": _stats(cache[f"{sub}.norm_in"]),
        "norm_out": _stats(cache[f"{sub}.norm_out"]),
    }


@torch.no_grad()
def follow_tokens(
    model: nn.Module, cache: ActivationCache, tokens: list[str], label: Callable[[int], str]
) -> dict:
    """The block views of every token of the stack that feeds the model's output (the decoder
    of an encoder-decoder), from ``cache`` (one forward pass, batch of one).

    Args:
        model: the model ``cache`` recorded. tokens: the stack's token labels (``T`` of them).
        label: the output vocabulary's label of an id (a token, or a class name).

    Returns (JSON-ready; per-token lists have ``T`` entries): ``stack``, ``tokens``, ``norm``
    (``"layernorm"``, ``"rmsnorm"``, ``"dyt"``), ``norm_first``; ``layers``: per layer
    ``resid_pre`` (``||x||``), ``sublayers`` (per sub-layer ``out_norm``, ``resid_post_norm``,
    ``norm_in``/``norm_out`` mean and std), ``ffn_top`` (``[neuron, activation]`` × 8),
    ``lens`` (``[label, probability]`` × 5); ``final``: ``[label, logit]`` of the largest
    final logits (all of them for a vocabulary up to 64), per token, and ``vocab_size``.
    A model whose head reads one pooled vector (the ViT) has one lens row per layer, the
    same for every token.

    Raises:
        ValueError: a model with no residual stream (:func:`readout`).
    """
    stack, _ = readout(model)
    lens = logit_lens(model, cache).float()  # (L, 1, T, V) or (L, 1, V)
    pooled = lens.dim() == 3
    layers = []
    for i, path in enumerate(cache.layers(stack)):
        probs = torch.softmax(lens[i, 0], dim=-1)  # (T, V) or (V,)
        lens_top = _top(probs[None] if pooled else probs, TOP_LENS, label)
        layers.append(
            {
                "resid_pre": _norms(cache[f"{path}.resid_pre"]),
                "sublayers": [
                    _sublayer(cache, f"{path}.{sub}") for sub in SUBLAYERS if f"{path}.{sub}.out" in cache
                ],
                "ffn_top": _top(cache[f"{path}.ffn.hidden"][0], TOP_NEURONS),
                "lens": lens_top * len(tokens) if pooled else lens_top,
            }
        )
    final = lens[-1, 0]
    final = final[None].expand(len(tokens), -1) if pooled else final
    config = cast(LayerConfig, model.config)
    return {
        "stack": stack or "layers",
        "tokens": tokens,
        "norm": config.norm,
        "norm_first": config.norm_first,
        "layers": layers,
        "final": _top(final, FINAL_LOGITS, label),
        "vocab_size": final.size(-1),
        "pooled": pooled,
    }
