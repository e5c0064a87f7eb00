"""Decoder-only language model (GPT-style): the Transformer's decoder without cross-attention.

Source: Vaswani et al. 2017, §3.1 (decoder stack, masked self-attention, §3.2.3) and §3.4
(shared embedding / pre-softmax weights); Radford et al. 2018/2019 (GPT, GPT-2) for the
decoder-only use: next-token prediction on plain text, the self-supervised objective of the
lecture notes (``001_*.txt``): labels are the input shifted by one token.

Pre-LN is the default because a stack of post-LN blocks needs a careful learning-rate warm-up
to train at all (the gradient at the output layers is large at initialisation; Xiong et al.
2020), while pre-LN trains stably with the plain warm-up + cosine schedule LMs use; GPT-2 and
nanoGPT use it too. Post-LN (the paper's order) and DyT are options.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..nn.attention import KVCache
from ..nn.embeddings import TokenEmbedding
from ..nn.layers import EncoderLayer
from ..nn.norms import build_norm
from ..nn.positional import RotaryEmbedding, build_positional
from .config import LMConfig
from .outputs import LMOutput


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions of left-padded rows: 0 at each row's first real token.

    Shape: ``attention_mask (B, T)`` bool (``True`` = real token) → ``(B, T)`` long; pad
    positions get 0 (they are masked out anyway).
    """
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


class DecoderLM(nn.Module):
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
        ValueError: a token id outside the vocabulary, or a position >= ``max_len``.
    """

    def __init__(self, config: LMConfig) -> None:
        super().__init__()
        self.config = cfg = config
        self.embed = TokenEmbedding(cfg.vocab_size, cfg.d_model, scale=cfg.scale_embeddings)
        self.positional = build_positional(cfg.positional, cfg.max_len, cfg.d_model)
        rotary = RotaryEmbedding(cfg.d_k, cfg.max_len) if cfg.positional == "rotary" else None
        self.embed_dropout = nn.Dropout(cfg.dropout)
        self.layers = nn.ModuleList(
            EncoderLayer(cfg.d_model, cfg.n_heads, cfg.d_ff, cfg.dropout, cfg.attention_dropout,
                         cfg.activation_dropout, cfg.activation, cfg.norm_first, cfg.bias,
                         cfg.attention_backend, cfg.layer_norm_eps, cfg.norm, rotary)
            for _ in range(cfg.n_layers))
        self.final_norm = (build_norm(cfg.norm, cfg.d_model, cfg.layer_norm_eps, cfg.bias)
                           if cfg.norm_first else nn.Identity())
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self._init_weights()
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed.weight

    def _init_weights(self) -> None:
        # GPT-2 initialisation: N(0, 0.02), residual output projections scaled by
        # 1/sqrt(2·n_layers) so the residual stream's variance does not grow with depth.
        for name, p in self.named_parameters():
            if p.dim() > 1:
                std = 0.02
                if name.endswith(("w_o.weight", "w_2.weight")):
                    std /= math.sqrt(2 * self.config.n_layers)
                nn.init.normal_(p, std=std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def new_caches(self) -> list[KVCache]:
        """Empty key/value caches, one per layer, for incremental decoding."""
        return [KVCache() for _ in self.layers]

    def forward(self, tokens: torch.Tensor, attention_mask: torch.Tensor | None = None,
                positions: torch.Tensor | None = None, caches: list[KVCache] | None = None,
                need_weights: bool = False, last_only: bool = False) -> LMOutput:
        if tokens.dim() != 2:
            raise ValueError(f"tokens must have shape (batch, seq_len), got {tuple(tokens.shape)}")
        t = tokens.size(1)
        start = 0 if caches is None else caches[0].length
        if positions is None:
            positions = (torch.arange(start, start + t, device=tokens.device) if attention_mask is None
                         else position_ids(attention_mask)[:, -t:])
        if start + t > self.config.max_len:  # positions never exceed the cache length
            raise ValueError(f"sequence of {start + t} tokens exceeds the model's context "
                             f"length max_len ({self.config.max_len})")
        x = self.embed(tokens)  # (B, T, D)
        if self.positional is not None:
            x = x + self.positional(positions)
        x = self.embed_dropout(x)
        mask = None
        if attention_mask is not None:
            mask = attention_mask[:, None, None, :]  # (B, 1, 1, L) keys that are real tokens
        # One new token with a cache attends to every cached key: no look-ahead mask needed.
        is_causal = t > 1
        weights = []
        for i, layer in enumerate(self.layers):
            x, w = layer(x, mask, need_weights=need_weights, is_causal=is_causal,
                         cache=None if caches is None else caches[i], positions=positions)
            weights.append(w)
        if last_only:
            x = x[:, -1:]
        logits = self.lm_head(self.final_norm(x))  # (B, T, V)
        return LMOutput(logits, tuple(weights) if need_weights else ())

    def num_parameters(self) -> int:
        """Number of distinct trainable parameters (tied matrices counted once)."""
        return sum(p.numel() for p in self.parameters())
