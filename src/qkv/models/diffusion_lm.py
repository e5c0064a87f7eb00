"""Masked diffusion language model: the Transformer's encoder stack (no look-ahead mask) with a
language-model head, trained to restore masked tokens at every masking ratio.

Source: Nie et al. 2025 ("Large Language Diffusion Models", LLaDA), §2.1: "a mask predictor
p_θ(·|x_t), a Transformer without a causal mask"; Sahoo et al. 2024 (MDLM), §3.2: the
"SUBS" parameterisation, which gives the [MASK] token zero probability ("zero masking
probabilities") so the model never predicts a mask. No time input (MDLM §3.2.2 and LLaDA: the
share of masks in x_t tells the model t). The blocks are the paper's (Vaswani et al. 2017,
§3.1) with the encoder's bidirectional self-attention; the objective is
:func:`qkv.train.diffusion.masked_diffusion_loss`, the samplers are in
:mod:`qkv.inference.diffusion`.

Masks: ``attention_mask`` ``(B, L)`` bool, ``True`` = real token, is the Hugging Face name and
shape for a padding mask, kept at this model's input so converted checkpoints are called as
on the Hub; :class:`~qkv.models.stack.TransformerStack` turns it into the ``attn_mask`` its
attention reads.
"""

from __future__ import annotations

import torch
from torch import nn

from .config import DiffusionLMConfig
from .decoder_lm import add_lm_head
from .outputs import LMOutput
from .stack import TransformerStack


class DiffusionLM(TransformerStack):
    """Bidirectional Transformer whose logits at every position predict the clean token there.

    Args:
        config: a :class:`~qkv.models.config.DiffusionLMConfig` (``mask_id`` set).

    Shape (forward):
        tokens: ``(B, T)`` long ids, masked positions holding ``mask_id``.
        attention_mask: ``(B, T)`` bool, ``True`` = real token (right-padded rows: padding is
            never attended); ``None``: every key is attended.
        returns :class:`~qkv.models.outputs.LMOutput`: ``logits (B, T, V)`` float (the mask
        token's logit is ``-inf``: SUBS, MDLM §3.2.1), per-layer attention ``(B, H, T, T)``
        with ``need_weights``.

    Raises:
        ValueError: a sequence longer than ``max_len`` (a shape check, as every stack).
    """

    causal = False
    config: DiffusionLMConfig
    lm_head: nn.Linear  # set by add_lm_head

    def __init__(self, config: DiffusionLMConfig) -> None:
        super().__init__(config)  # requires vocab_size; the config itself refuses no mask_id
        add_lm_head(self, config)

    def forward(
        self,
        tokens: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        need_weights: bool = False,
    ) -> LMOutput:
        x, weights = self.hidden_states(tokens, attention_mask, need_weights=need_weights)
        return LMOutput(self.logits(x), weights)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The output head: ``(B, T, D)`` → ``(B, T, V)``, the mask token's logit ``-inf``."""
        logits = self.lm_head(hidden)
        # SUBS: the model never predicts [MASK]; -inf keeps softmax and cross-entropy exact.
        logits[..., self.config.mask_id] = float("-inf")
        return logits

    def readout(self, hidden: torch.Tensor) -> torch.Tensor:
        """The logits of a residual stream ``(B, T, D)`` → ``(B, T, V)``: the final norm, then
        :meth:`logits` (the logit lens, :func:`qkv.explain.activations.logit_lens`)."""
        return self.logits(self.final_norm(hidden))
