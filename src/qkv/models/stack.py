"""One stack of self-attention layers with its embeddings: the body shared by the decoder-only
LM (causal) and the BERT/ESM-style encoder (bidirectional).

Source: Vaswani et al. 2017, §3.1 (N identical layers), §3.4 (embeddings), §3.5 (positions);
the look-ahead mask of §3.2.3 makes the stack a decoder without cross-attention (GPT), its
absence an encoder (BERT, Devlin et al. 2019).

Masks: the input is ``attention_mask``, ``(B, L)`` bool, ``True`` = real token: the Hugging
Face name and shape for a padding mask (what users of the converted BERT, ESM and GPT-2
models already pass, ``input_ids`` beside ``attention_mask``). The stack turns it into the
``attn_mask`` ``(B, 1, 1, L)`` its attention reads (§3.2.3).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..compat import read_old_weights
from ..nn.attention import KVCache
from ..nn.embeddings import TokenEmbedding
from ..nn.layers import SelfAttentionLayer, norm
from ..nn.positional import RotaryEmbedding, build_positional
from .config import StackConfig


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions of left-padded rows: 0 at each row's first real token.

    Shape: ``attention_mask (B, T)`` bool (``True`` = real token) → ``(B, T)`` long; pad
    positions get 0 (they are masked out anyway).
    """
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def gpt2_init(module: nn.Module, n_layers: int) -> None:
    """GPT-2's initialisation of every matrix of ``module``: N(0, 0.02), the residual output
    projections (``w_o``, ``w_2``) scaled by 1/sqrt(2·n_layers) so the residual stream's
    variance does not grow with depth; biases zero; norms untouched."""
    for name, p in module.named_parameters():
        if p.dim() > 1:
            std = 0.02
            if name.endswith(("w_o.weight", "w_2.weight")):
                std /= math.sqrt(2 * n_layers)
            nn.init.normal_(p, std=std)
        elif name.endswith("bias"):
            nn.init.zeros_(p)


class TransformerStack(nn.Module):
    """Token embeddings (+ positions), N :class:`~qkv.nn.layers.SelfAttentionLayer`, final
    norm (pre-LN).

    Args:
        config: a :class:`~qkv.models.config.StackConfig` (``LMConfig`` or ``EncoderConfig``).

    The class attribute ``causal`` says whether the layers carry the look-ahead mask
    (decoder-only LM) or not (encoder).

    Attributes ``embed``, ``positional``, ``layers``, ``final_norm`` keep the parameter names of
    saved checkpoints; ``token_type`` (BERT's segment embeddings) and ``embed_norm`` exist when
    the config asks for them. Initialisation is GPT-2's: N(0, 0.02), residual output projections
    scaled by 1/sqrt(2·n_layers) so the residual stream's variance does not grow with depth.
    """

    causal = True

    def __init__(self, config: StackConfig) -> None:
        super().__init__()
        config.require("vocab_size")
        self.config = cfg = config
        assert cfg.vocab_size is not None  # require() raised if it is unset
        self.embed = TokenEmbedding(cfg.vocab_size, cfg.d_model, scale=cfg.scale_embeddings)
        self.positional = build_positional(cfg.positional, cfg.max_len, cfg.d_model)
        rotary = RotaryEmbedding(cfg.d_k, cfg.max_len) if cfg.positional == "rotary" else None
        self.token_type = nn.Embedding(cfg.type_vocab_size, cfg.d_model) if cfg.type_vocab_size else None
        self.embed_norm = norm(cfg) if cfg.embed_norm else None
        self.embed_dropout = nn.Dropout(cfg.dropout)
        self.layers = nn.ModuleList(SelfAttentionLayer(cfg, rotary) for _ in range(cfg.n_layers))
        self.final_norm = norm(cfg) if cfg.norm_first else nn.Identity()
        read_old_weights(self)  # what earlier qkv versions saved loads too (qkv.compat)

    def _init_weights(self) -> None:
        gpt2_init(self, self.config.n_layers)

    def new_caches(self) -> list[KVCache]:
        """Empty key/value caches, one per layer, for incremental decoding."""
        return [KVCache() for _ in self.layers]

    def embed_tokens(self, tokens: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        """Token embeddings ``(B, T, D)`` of ``tokens (B, T)``, before positions are added
        (families with their own embedding rule override this)."""
        return self.embed(tokens)

    def hidden_states(
        self,
        tokens: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        caches: list[KVCache] | None = None,
        need_weights: bool = False,
        token_types: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, tuple]:
        """``tokens (B, T)`` → ``(hidden (B, T, D), per-layer weights (B, H, T, L) or ())``.

        ``attention_mask (B, L)`` bool covers all keys (cached + new), ``True`` = real token.
        ``token_types (B, T)`` long: segment ids for token-type embeddings (default all 0).
        Raises ``ValueError`` for a bad shape or a sequence longer than ``max_len`` (checked on
        shapes only: token ids are checked where they enter, by the tokenizer or
        :func:`~qkv.nn.embeddings.check_token_ids`, so forward never waits on the device).
        """
        if tokens.dim() != 2:
            raise ValueError(f"tokens must have shape (batch, seq_len), got {tuple(tokens.shape)}")
        t = tokens.size(1)
        start = 0 if caches is None else caches[0].length
        if positions is None:
            positions = (
                torch.arange(start, start + t, device=tokens.device)
                if attention_mask is None
                else position_ids(attention_mask)[:, -t:]
            )
        if start + t > self.config.max_len:  # positions never exceed the cache length
            raise ValueError(
                f"sequence of {start + t} tokens exceeds the model's context "
                f"length max_len ({self.config.max_len})"
            )
        x = self.embed_tokens(tokens, attention_mask)  # (B, T, D)
        if self.positional is not None:
            x = x + self.positional(positions)
        if self.token_type is not None:
            x = x + (self.token_type.weight[0] if token_types is None else self.token_type(token_types))
        if self.embed_norm is not None:
            x = self.embed_norm(x)
        x = self.embed_dropout(x)
        attn_mask = None if attention_mask is None else attention_mask[:, None, None, :]  # (B, 1, 1, L)
        # One new token with a cache attends to every cached key: no look-ahead mask needed.
        is_causal = self.causal and t > 1
        weights = []
        for i, layer in enumerate(self.layers):
            x, w = layer(
                x,
                attn_mask,
                need_weights=need_weights,
                is_causal=is_causal,
                cache=None if caches is None else caches[i],
                positions=positions,
            )
            weights.append(w)
        return self.final_norm(x), tuple(weights) if need_weights else ()

    def num_parameters(self) -> int:
        """Number of distinct trainable parameters (tied matrices counted once)."""
        return sum(p.numel() for p in self.parameters())
