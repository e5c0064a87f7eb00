"""Typed outputs of model forward passes (weights are returned, never stashed on modules)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Seq2SeqOutput:
    """Output of :meth:`qkv.models.transformer.Transformer.forward`.

    Attributes:
        logits: ``(B, T, V_tgt)`` float, unnormalised next-token scores.
        encoder_attentions / decoder_self_attentions / cross_attentions: one tensor per layer,
            ``(B, H, S, S)`` / ``(B, H, T, T)`` / ``(B, H, T, S)``; empty tuples unless
            ``need_weights=True``.
    """

    logits: torch.Tensor
    encoder_attentions: tuple = ()
    decoder_self_attentions: tuple = ()
    cross_attentions: tuple = ()


@dataclass
class LMOutput:
    """Output of :meth:`qkv.models.decoder_lm.DecoderLM.forward`.

    Attributes:
        logits: ``(B, T, V)`` float, unnormalised next-token scores (position t predicts t+1).
        attentions: one ``(B, H, T, L)`` tensor per layer; empty unless ``need_weights=True``.
    """

    logits: torch.Tensor
    attentions: tuple = ()
