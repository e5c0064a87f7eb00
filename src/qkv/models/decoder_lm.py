"""Decoder-only language model (GPT-style): the Transformer's decoder without cross-attention.

Source: Vaswani et al. 2017, §3.1 (decoder stack, masked self-attention, §3.2.3) and §3.4
(shared embedding / pre-softmax weights); Radford et al. 2018/2019 (GPT, GPT-2) for the
decoder-only use: next-token prediction on plain text, trained "in a self-supervised way"
(lecture notes): labels are the input shifted by one token.

Pre-LN is the default because a stack of post-LN blocks needs a careful learning-rate warm-up
to train at all (the gradient at the output layers is large at initialisation; Xiong et al.
2020), while pre-LN trains stably with the plain warm-up + cosine schedule LMs use; GPT-2 and
nanoGPT use it too. Post-LN (the paper's order) and DyT are options.

Masks: ``attention_mask`` ``(B, L)`` bool, ``True`` = real token, is the Hugging Face name and
shape for a padding mask, kept at this model's input so converted checkpoints are called as
on the Hub; :class:`~qkv.models.stack.TransformerStack` turns it into the ``attn_mask`` its
attention reads.
"""

from __future__ import annotations

import torch
from torch import nn

from ..nn.attention import KVCache
from .config import LMConfig
from .outputs import LMOutput
from .stack import TransformerStack, position_ids

__all__ = ["DecoderLM", "add_lm_head", "position_ids"]


def add_lm_head(model: TransformerStack, config: LMConfig) -> None:
    """Give a stack its ``lm_head``: the bias-free projection to the vocabulary, initialised
    with the rest of the model (GPT-2's), then tied to the token embeddings when
    ``config.tie_embeddings`` (§3.4: "the same weight matrix between the two embedding layers
    and the pre-softmax linear transformation")."""
    assert config.vocab_size is not None  # TransformerStack.__init__ required it
    model.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
    model._init_weights()
    if config.tie_embeddings:
        model.lm_head.weight = model.embed.weight


class DecoderLM(TransformerStack):
    """GPT-style decoder-only Transformer: embeddings (+ positions), N causal blocks, final
    norm (pre-LN), output projection tied to the embeddings.

    Args:
        config: an :class:`~qkv.models.config.LMConfig`.

    Shape (forward):
        tokens: ``(B, T)`` long ids (only the new tokens when ``caches`` hold earlier ones).
        attention_mask: ``(B, L)`` bool over *all* keys (cached + new), ``True`` = real token,
            for left-padded batches; ``None`` = no padding.
        positions: ``(B, T)`` or ``(T,)`` long; default continues after the cached tokens
            (or :func:`position_ids` of ``attention_mask``).
        returns :class:`LMOutput`, ``logits (B, T, V)`` (``(B, 1, V)`` with ``last_only``).

    Raises:
        ValueError: a sequence longer than ``max_len`` (a shape check). Token ids are not
            checked here (no host sync in forward): the tokenizers and the generation entry
            points check them (:func:`qkv.nn.embeddings.check_token_ids`).
    """

    config: LMConfig  # the stack's config, this family's own (set in TransformerStack.__init__)
    lm_head: nn.Linear  # set by add_lm_head

    def __init__(self, config: LMConfig) -> None:
        super().__init__(config)
        add_lm_head(self, config)

    def forward(
        self,
        tokens: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        caches: list[KVCache] | None = None,
        need_weights: bool = False,
        last_only: bool = False,
    ) -> LMOutput:
        x, weights = self.hidden_states(tokens, attention_mask, positions, caches, need_weights)
        if last_only:
            x = x[:, -1:]
        return LMOutput(self.lm_head(x), weights)  # logits (B, T, V)

    def readout(self, hidden: torch.Tensor) -> torch.Tensor:
        """The logits of a residual stream ``(B, T, D)`` → ``(B, T, V)``: the final norm, then
        the output head (the logit lens, :func:`qkv.explain.activations.logit_lens`)."""
        return self.lm_head(self.final_norm(hidden))
