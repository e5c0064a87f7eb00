"""Helpers shared by the parity tests: copy torch.nn weights into qkv modules."""

from __future__ import annotations

import torch
from torch import nn

from qkv.nn.attention import MultiHeadAttention


def copy_attention_from_torch(ours: MultiHeadAttention, theirs: nn.MultiheadAttention) -> None:
    """Copy torch's packed in_proj (q; k; v rows) and out_proj into ours: ``w_qkv`` holds the
    same rows (self-attention); cross-attention splits them into ``w_q`` and ``w_kv``."""
    with torch.no_grad():
        if ours.cross:
            inner = ours.n_heads * ours.d_k
            ours.w_q.weight.copy_(theirs.in_proj_weight[:inner])
            ours.w_q.bias.copy_(theirs.in_proj_bias[:inner])
            ours.w_kv.weight.copy_(theirs.in_proj_weight[inner:])
            ours.w_kv.bias.copy_(theirs.in_proj_bias[inner:])
        else:
            ours.w_qkv.weight.copy_(theirs.in_proj_weight)
            ours.w_qkv.bias.copy_(theirs.in_proj_bias)
        ours.w_o.weight.copy_(theirs.out_proj.weight)
        ours.w_o.bias.copy_(theirs.out_proj.bias)
