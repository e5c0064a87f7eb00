"""Helpers shared by the parity tests: copy torch.nn weights into qkv modules."""

from __future__ import annotations

import torch
from torch import nn

from qkv.nn.attention import MultiHeadAttention


def copy_attention_from_torch(ours: MultiHeadAttention, theirs: nn.MultiheadAttention) -> None:
    """Copy torch's packed in_proj (q; k; v rows) and out_proj into w_q/w_k/w_v/w_o."""
    with torch.no_grad():
        wq, wk, wv = theirs.in_proj_weight.chunk(3, dim=0)
        bq, bk, bv = theirs.in_proj_bias.chunk(3, dim=0)
        for lin, w, b in ((ours.w_q, wq, bq), (ours.w_k, wk, bk), (ours.w_v, wv, bv)):
            lin.weight.copy_(w)
            lin.bias.copy_(b)
        ours.w_o.weight.copy_(theirs.out_proj.weight)
        ours.w_o.bias.copy_(theirs.out_proj.bias)
