"""Bidirectional Transformer encoder with heads (BERT / ESM style), for protein sequences.

Source: Vaswani et al. 2017, §3.1 (the encoder stack); Devlin et al. 2019 (BERT: masked
language modelling, a classification token); Rives et al. 2021 (ESM: the same on proteins);
lecture notes: "Applying Encoders to Protein Sequences", and "people use pre-trained models
and train a feed-forward (e.g. sigmoid) layer on their task".

Masks: ``attention_mask`` ``(B, L)`` bool, ``True`` = real token, is the Hugging Face name and
shape for a padding mask, kept at this model's interface (``encode`` returns it, ``pool``
takes it) so converted checkpoints are called as on the Hub;
:class:`~qkv.models.stack.TransformerStack` turns it into the ``attn_mask`` its attention
reads.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..nn.embeddings import esm_token_dropout
from ..nn.feedforward import ActivationLayer
from .config import EncoderConfig
from .stack import TransformerStack


@dataclass
class EncoderOutput:
    """Output of :class:`EncoderModel` heads.

    Attributes:
        logits: ``(B, T, V)`` (masked LM), ``(B, num_labels)`` (sequence) or
            ``(B, T, num_labels)`` (per residue); float.
        hidden: ``(B, T, D)`` final hidden states. attentions: per layer ``(B, H, T, T)`` or ().
    """

    logits: torch.Tensor
    hidden: torch.Tensor
    attentions: tuple = ()


def masked_mean(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over real positions only: ``hidden (B, T, D)``, ``mask (B, T)`` bool → ``(B, D)``.
    Padding never changes the result."""
    weights = mask.to(hidden.dtype).unsqueeze(-1)  # (B, T, 1)
    return (hidden * weights).sum(1) / weights.sum(1).clamp(min=1.0)


class EncoderModel(TransformerStack):
    """Bidirectional encoder (no look-ahead mask) with a masked-LM head and optional
    classification heads.

    Args:
        config: an :class:`~qkv.models.config.EncoderConfig`.

    Shape:
        tokens ``(B, T)`` long, right-padded with ``pad_id`` (padding keys are masked out).
        :meth:`forward` → masked-LM logits ``(B, T, V)`` (output projection tied to the
        embeddings, after a dense + activation + LayerNorm transform as in BERT/ESM; the
        activation is ``config.head_activation``);
        :meth:`classify_sequence` → ``(B, num_labels)`` from the ``<cls>`` position or the mean
        of real positions; :meth:`classify_residues` → ``(B, T, num_labels)``.

    Raises:
        ValueError: bad token ids, shapes or lengths (see :meth:`hidden_states`).
    """

    causal = False
    config: EncoderConfig  # the stack's config, this family's own (set in TransformerStack.__init__)

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__(config)
        assert config.vocab_size is not None  # TransformerStack.__init__ required it
        d = config.d_model
        # BERT's BertPredictionHeadTransform / ESM's EsmLMHead: dense, activation, LayerNorm
        # (indices 0 and 2 hold the weights: mlm_transform.0.*, mlm_transform.2.*)
        self.mlm_transform = nn.Sequential(
            nn.Linear(d, d),
            ActivationLayer(config.head_activation),
            nn.LayerNorm(d, eps=config.layer_norm_eps),
        )
        self.mlm_head = nn.Linear(d, config.vocab_size, bias=True)
        n = max(config.num_labels, 1)
        self.head_dropout = nn.Dropout(config.dropout)
        self.sequence_head = nn.Linear(d, n)
        self.residue_head = nn.Linear(d, n)
        # BERT's pooler: dense + tanh on the <cls> state (Devlin et al. 2019, §3)
        self.pooler = nn.Sequential(nn.Linear(d, d), nn.Tanh()) if config.pooler else None
        self._init_weights()
        self.mlm_head.weight = self.embed.weight

    def embed_tokens(self, tokens: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        x = self.embed(tokens)  # (B, T, D)
        if self.config.token_dropout:
            # problems() refuses token_dropout without mask_id; encode() always passes the mask
            assert self.config.mask_id is not None and attention_mask is not None
            x = esm_token_dropout(x, tokens, self.config.mask_id, attention_mask)
        return x

    def encode(
        self, tokens: torch.Tensor, need_weights: bool = False, token_types: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, tuple]:
        """``(hidden (B, T, D), attention_mask (B, T) bool, attentions)``; ``token_types``
        ``(B, T)`` long are segment ids (BERT sentence pairs; default all 0)."""
        attention_mask = tokens != self.config.pad_id  # (B, T)
        hidden, weights = self.hidden_states(
            tokens, attention_mask, need_weights=need_weights, token_types=token_types
        )
        return hidden, attention_mask, weights

    def forward(
        self,
        tokens: torch.Tensor,
        need_weights: bool = False,
        head: str = "mlm",
        token_types: torch.Tensor | None = None,
    ) -> EncoderOutput:
        """Run the encoder and one head: ``"mlm"`` (masked-LM logits ``(B, T, V)``),
        ``"sequence"`` (``(B, num_labels)``) or ``"residue"`` (``(B, T, num_labels)``). One entry
        point for every head, so a compiled model (``torch.compile``) covers all of them."""
        hidden, mask, weights = self.encode(tokens, need_weights, token_types)
        if head == "mlm":
            logits = self.mlm_logits(hidden)
        elif head == "sequence":
            logits = self.sequence_head(self.head_dropout(self.pool(hidden, mask)))
        elif head == "residue":
            logits = self.residue_head(self.head_dropout(hidden))
        else:
            raise ValueError(f"unknown head {head!r}; choose mlm, sequence or residue")
        return EncoderOutput(logits, hidden, weights)

    def mlm_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The masked-token head: ``(B, T, D)`` → ``(B, T, V)`` (BERT's transform: dense,
        ``config.head_activation``, LayerNorm; then the projection tied to the embeddings)."""
        return self.mlm_head(self.mlm_transform(hidden))

    def readout(self, hidden: torch.Tensor) -> torch.Tensor:
        """The logits of a residual stream ``(B, T, D)`` → ``(B, T, V)``: the final norm, then
        the masked-token head (the logit lens, :func:`qkv.explain.activations.logit_lens`)."""
        return self.mlm_logits(self.final_norm(hidden))

    def pool(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """One vector per sequence ``(B, D)``: the first (``<cls>``) position (through the
        pooler when the model has one) or the mean of real positions."""
        if self.config.pooling == "cls":
            return hidden[:, 0] if self.pooler is None else self.pooler(hidden[:, 0])
        return masked_mean(hidden, attention_mask)

    def classify_sequence(self, tokens: torch.Tensor, need_weights: bool = False) -> EncoderOutput:
        """``self(tokens, head="sequence")``."""
        return self(tokens, need_weights, head="sequence")

    def classify_residues(self, tokens: torch.Tensor, need_weights: bool = False) -> EncoderOutput:
        """``self(tokens, head="residue")``."""
        return self(tokens, need_weights, head="residue")


def mlm_loss(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Summed cross-entropy over masked positions (``labels`` = -100 elsewhere) and their
    count. Shapes: ``logits (B, T, V)``, ``labels (B, T)`` long."""
    loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100, reduction="sum")
    return loss, int((labels != -100).sum())
