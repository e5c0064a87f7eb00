"""Weight memory layout for fast CPU decoding.

Decoding one token multiplies a vector by every weight matrix, so on a CPU it is limited by
how fast the weights stream from memory. PyTorch stores an ``nn.Linear`` weight as
``(out_features, in_features)``. On the CPU measured here (AMD EPYC, 2 threads, torch 2.13) the
float32 vector-matrix product streams 1.1–1.8× faster with ``W`` stored
``(in_features, out_features)`` (the vocabulary projection gains most), while bfloat16 is
fastest in the default layout (GPT-2 small: 25 → 47 tokens/s going to bfloat16 with the
default layout, only 34 with the transposed one). Re-laying out the storage keeps every
value and the parameter's shape, so the model computes the same function (up to float
summation order) and its state dict is unchanged.
"""

from __future__ import annotations

import torch
from torch import nn


@torch.no_grad()
def prepare_for_inference(model: nn.Module) -> nn.Module:
    """Store every float32 2-D weight of ``nn.Linear`` layers as ``(in, out)`` in memory (a
    transposed view keeps the ``(out, in)`` shape) when the model is on the CPU; returns
    ``model``. Other dtypes keep (or get back) the default layout.

    Tied weights (embeddings shared with the output projection) are one parameter and are
    converted once; embedding lookups on the transposed storage stay correct. Nothing is done on
    other devices, where the fused kernels prefer the default layout. Safe to call twice.
    """
    seen: set[int] = set()
    for module in model.modules():
        if not isinstance(module, nn.Linear):
            continue
        weight = module.weight
        if weight.device.type != "cpu" or id(weight) in seen:
            continue
        seen.add(id(weight))
        if weight.dtype == torch.float32:
            if weight.is_contiguous():
                weight.data = weight.data.t().contiguous().t()  # same values, (in, out) storage
        elif not weight.is_contiguous():
            weight.data = weight.data.contiguous()
    return model
