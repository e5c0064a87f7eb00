"""The encoder-decoder Transformer of "Attention Is All You Need" (Vaswani et al. 2017, §3).

Figure 1, top to bottom: token embeddings × sqrt(d_model) + positional encoding (dropout),
N encoder layers, N decoder layers with masked self-attention and cross-attention over the
encoder output (``memory``), and a linear projection to vocabulary logits whose weights are
shared with the embeddings (§3.4). Softmax is applied by the loss or the decoder.

Masks (§3.2.3) keep one name from here down to the layers: ``src_mask`` is the source's
padding mask (:meth:`Transformer.encode` returns it; the decoder's cross-attention reads it
over ``memory``), ``tgt_mask`` the decoder self-attention's; inside attention the tensor is
``attn_mask``.
"""

from __future__ import annotations

import torch
from torch import nn

from ..compat import read_old_weights
from ..nn.attention import KVCache
from ..nn.embeddings import TokenEmbedding
from ..nn.layers import DecoderLayer, EncoderLayer, norm
from ..nn.masks import padding_mask
from ..nn.positional import RotaryEmbedding, build_positional
from .config import CaptionConfig, TransformerConfig
from .outputs import Seq2SeqOutput


def final_norm(cfg: TransformerConfig | CaptionConfig) -> nn.Module:
    """The norm after the last layer of a pre-LN stack (post-LN layers end normalised)."""
    return norm(cfg) if cfg.norm_first else nn.Identity()


def projection_matrices(name: str, p: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The separate matrices inside a packed parameter (views): ``W_Q; W_K; W_V`` of a
    self-attention ``w_qkv`` and ``W_K; W_V`` of a cross-attention ``w_kv``, so each is
    initialised as a matrix of its own shape."""
    if name.endswith("w_qkv.weight"):
        return p.chunk(3)
    if name.endswith("w_kv.weight"):
        return p.chunk(2)
    return (p,)


class Encoder(nn.Module):
    """A stack of N :class:`EncoderLayer` (§3.1), plus a final norm when pre-LN.

    Shape: ``x (B, S, D)``, ``src_mask`` bool ``(B, 1, 1, S)`` → ``(B, S, D)`` and per-layer
    weights.
    """

    def __init__(self, cfg: TransformerConfig | CaptionConfig, rotary: nn.Module | None = None) -> None:
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(cfg, rotary) for _ in range(cfg.n_encoder_layers))
        self.final_norm = final_norm(cfg)

    def forward(
        self, x: torch.Tensor, src_mask: torch.Tensor | None = None, need_weights: bool = False
    ) -> tuple[torch.Tensor, tuple]:
        weights = []
        for layer in self.layers:
            x, w = layer(x, src_mask, need_weights=need_weights)
            weights.append(w)
        return self.final_norm(x), tuple(weights) if need_weights else ()


class Decoder(nn.Module):
    """A stack of N :class:`DecoderLayer` (§3.1), plus a final norm when pre-LN.

    Shape: ``x (B, T, D)``, ``memory (B, S, D)``, ``tgt_mask`` broadcastable to
    ``(B, 1, T, T)`` or ``None`` (causal masking), ``src_mask`` ``(B, 1, 1, S)`` (over
    ``memory``) →
    ``(B, T, D)``, per-layer self and cross weights.
    """

    def __init__(self, cfg: TransformerConfig | CaptionConfig, rotary: nn.Module | None = None) -> None:
        super().__init__()
        self.layers = nn.ModuleList(DecoderLayer(cfg, rotary) for _ in range(cfg.n_decoder_layers))
        self.final_norm = final_norm(cfg)

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor,
        tgt_mask: torch.Tensor | None = None,
        src_mask: torch.Tensor | None = None,
        caches: list[tuple[KVCache, KVCache]] | None = None,
        need_weights: bool = False,
    ) -> tuple[torch.Tensor, tuple, tuple]:
        self_ws, cross_ws = [], []
        # Causal masking is enough for right-padded targets: a real query never sees a later
        # pad key, and pad queries are ignored by the loss. Incremental decoding (one query,
        # cached keys) needs no mask at all.
        is_causal = caches is None or x.size(1) > 1
        for i, layer in enumerate(self.layers):
            x, (sw, cw) = layer(
                x,
                memory,
                tgt_mask,
                src_mask,
                is_causal=is_causal,
                caches=None if caches is None else caches[i],
                need_weights=need_weights,
            )
            self_ws.append(sw)
            cross_ws.append(cw)
        if not need_weights:
            return self.final_norm(x), (), ()
        return self.final_norm(x), tuple(self_ws), tuple(cross_ws)


class Transformer(nn.Module):
    """Encoder-decoder Transformer (§3, Figure 1).

    Args:
        config: a :class:`TransformerConfig`.

    Shape (forward):
        src: ``(B, S)`` long source ids (right-padded with ``pad_id``).
        tgt: ``(B, T)`` long decoder input ids (``bos`` + target, right-padded).
        returns :class:`Seq2SeqOutput` with ``logits (B, T, V_tgt)``.
    """

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        config.require("src_vocab_size", "tgt_vocab_size")
        self.config = cfg = config
        # require() raised if either is unset
        assert cfg.src_vocab_size is not None and cfg.tgt_vocab_size is not None
        scale = cfg.scale_embeddings
        self.src_embed = TokenEmbedding(cfg.src_vocab_size, cfg.d_model, cfg.pad_id, scale)
        self.tgt_embed = (
            self.src_embed
            if cfg.share_embeddings
            else TokenEmbedding(cfg.tgt_vocab_size, cfg.d_model, cfg.pad_id, scale)
        )
        # None for positional="none": no order information (the lecture's "single block of weights")
        self.positional = build_positional(cfg.positional, cfg.max_len, cfg.d_model)
        # rotary: one table, shared by every self-attention of both stacks (RoFormer, Su et al.
        # 2021); cross-attention has none, its keys are the encoder's outputs
        rotary = RotaryEmbedding(cfg.d_k, cfg.max_len) if cfg.positional == "rotary" else None
        self.embed_dropout = nn.Dropout(cfg.dropout)
        self.encoder = Encoder(cfg, rotary)
        self.decoder = Decoder(cfg, rotary)
        self.generator = nn.Linear(cfg.d_model, cfg.tgt_vocab_size, bias=cfg.output_bias)
        self._init_weights()
        if cfg.output_bias:
            nn.init.zeros_(self.generator.bias)
        if cfg.tie_output or cfg.share_embeddings:
            self.generator.weight = self.tgt_embed.weight
        read_old_weights(self)  # what earlier qkv versions saved loads too (qkv.compat)

    def _init_weights(self) -> None:
        # Xavier-uniform projections, as in the reference Tensor2Tensor / nn.Transformer code.
        for name, p in self.named_parameters():
            if p.dim() > 1 and "embed" not in name:
                for matrix in projection_matrices(name, p):
                    nn.init.xavier_uniform_(matrix)

    def embed(self, tokens: torch.Tensor, embedding: TokenEmbedding, start_pos: int = 0) -> torch.Tensor:
        """Dropout(E[tokens]·sqrt(d_model) + PE[pos]) (§3.4, §3.5, §5.4); without the PE term
        for ``positional="none"``. ``(B, T) → (B, T, D)``.

        Raises ``ValueError`` for positions past ``max_len`` (a shape check: no host sync)."""
        if start_pos + tokens.size(1) > self.config.max_len:
            raise ValueError(
                f"sequence of {start_pos + tokens.size(1)} tokens exceeds the model's "
                f"max_len ({self.config.max_len})"
            )
        x = embedding(tokens)
        if self.positional is not None:
            positions = torch.arange(start_pos, start_pos + tokens.size(1), device=tokens.device)
            x = x + self.positional(positions)
        return self.embed_dropout(x)

    def encode(
        self, src: torch.Tensor, need_weights: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor, tuple]:
        """Run the encoder. ``src (B, S)`` → ``(memory (B, S, D), src_mask (B, 1, 1, S), weights)``."""
        src_mask = padding_mask(src, self.config.pad_id)
        memory, weights = self.encoder(self.embed(src, self.src_embed), src_mask, need_weights)
        return memory, src_mask, weights

    def decode(
        self,
        tgt: torch.Tensor,
        memory: torch.Tensor,
        src_mask: torch.Tensor,
        caches: list[tuple[KVCache, KVCache]] | None = None,
        start_pos: int = 0,
        need_weights: bool = False,
    ) -> tuple[torch.Tensor, tuple, tuple]:
        """Run the decoder and the output projection.

        Shape: ``tgt (B, T)``, ``memory (B, S, D)``, ``src_mask (B, 1, 1, S)`` (from
        :meth:`encode`) → ``(logits (B, T, V), self weights,
        cross weights)``. With ``caches`` (from :meth:`new_caches`), ``tgt`` holds only the
        new tokens, at positions ``start_pos ...``.
        """
        x = self.embed(tgt, self.tgt_embed, start_pos)
        h, self_w, cross_w = self.decoder(
            x, memory, src_mask=src_mask, caches=caches, need_weights=need_weights
        )
        return self.generator(h), self_w, cross_w

    def new_caches(self) -> list[tuple[KVCache, KVCache]]:
        """Empty (self, cross) key/value caches, one pair per decoder layer."""
        return [(KVCache(), KVCache()) for _ in self.decoder.layers]

    def forward(self, src: torch.Tensor, tgt: torch.Tensor, need_weights: bool = False) -> Seq2SeqOutput:
        memory, src_mask, enc_w = self.encode(src, need_weights)
        logits, self_w, cross_w = self.decode(tgt, memory, src_mask, need_weights=need_weights)
        return Seq2SeqOutput(logits, enc_w, self_w, cross_w)

    readout_stack = "decoder"  # the stack whose residual stream readout reads
    # calls of these methods name the parts both stacks call (the positional table, a shared
    # embedding) by role in the hook points (qkv.explain.hooks): src_embed, tgt_positional, ...
    hook_roles = (("encode", "src"), ("decode", "tgt"))

    def readout(self, hidden: torch.Tensor) -> torch.Tensor:
        """The logits of the decoder's residual stream ``(B, T, D)`` → ``(B, T, V_tgt)``: its
        final norm, then the generator (the logit lens,
        :func:`qkv.explain.activations.logit_lens`)."""
        return self.generator(self.decoder.final_norm(hidden))

    def num_parameters(self) -> int:
        """Number of distinct trainable parameters (tied matrices counted once)."""
        return sum(p.numel() for p in self.parameters())
