"""Image captioning: the ViT's patch encoder and the paper's decoder attending to the patches.

The lecture's last system: "We can tokenize anything ... chop the input up into chunks, project
each chunk to an embedding; this projection can be fixed from a pre-trained model, or trained
jointly with downstream task", then "Multi-modality (text + image)", shown with the captions of
Show, Attend and Tell (Xu et al. 2015). Here the chunks are image patches embedded as in ViT
(Dosovitskiy et al. 2021, Eq. 1, without the class token), encoded by the Transformer encoder
(Vaswani et al. 2017, §3.1), and the memory the decoder's cross-attention reads (§3.2.3,
"encoder-decoder attention") is the grid of patch states: at every word, each head of each
decoder layer weighs every patch, which is what :mod:`qkv.explain.caption` draws.

``memory="pooled"`` is the no-attention baseline of Show and Tell (Vinyals et al. 2015): the
decoder sees one vector, the mean of the patch states (cross-attention over a single key reads
that vector whole at every step), so what attention over the patches adds is measured.

The decoder, the tied output projection (§3.4), the key/value caches (the cross-attention keys
and values of the patches computed once per image) and so greedy decoding and beam search
(:mod:`qkv.inference.search`) are the encoder-decoder's own.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..compat import read_old_weights
from ..nn.attention import KVCache
from ..nn.embeddings import TokenEmbedding
from ..nn.patches import PatchEmbedding, sinusoidal_2d_positions
from ..nn.positional import build_positional
from .config import CaptionConfig
from .stack import gpt2_init
from .transformer import Decoder, Encoder


@dataclass
class CaptionOutput:
    """Output of :meth:`CaptionModel.forward`.

    Attributes:
        logits: ``(B, T, V)`` float, unnormalised next-token scores.
        encoder_attentions: one ``(B, H, N, N)`` tensor per encoder layer (patches over
            patches); empty unless ``need_weights=True``.
        self_attentions: one ``(B, H, T, T)`` per decoder layer (causal).
        cross_attentions: one ``(B, H, T, N)`` per decoder layer: each caption position's
            weights over the ``N`` patches (``N = 1`` for ``memory="pooled"``).
    """

    logits: torch.Tensor
    encoder_attentions: tuple = ()
    self_attentions: tuple = ()
    cross_attentions: tuple = ()


class CaptionModel(nn.Module):
    """Image → caption: patch embedding + Transformer encoder, and the paper's decoder.

    Args:
        config: a :class:`~qkv.models.config.CaptionConfig` (``vocab_size`` set).

    Shape (forward): ``images (B, C, H, W)`` float in [-1, 1] (``C = channels``,
    ``H = W = image_size``), ``tgt (B, T)`` long decoder input (``bos`` + caption,
    right-padded) → :class:`CaptionOutput` with ``logits (B, T, V)``. Patch ``i`` is row
    ``i // grid_size``, column ``i % grid_size`` (reading order).

    Raises:
        ConfigError: ``vocab_size`` unset. ValueError: images of the wrong size or channels, a
            caption past ``max_len``.
    """

    def __init__(self, config: CaptionConfig) -> None:
        super().__init__()
        config.require("vocab_size")
        self.config = cfg = config
        assert cfg.vocab_size is not None  # require() raised otherwise
        self.patch_embed = PatchEmbedding(cfg.patch_size, cfg.channels, cfg.d_model)
        if cfg.image_positional == "learned":
            self.pos_embed = nn.Parameter(torch.zeros(1, cfg.n_patches, cfg.d_model))
        else:
            table = sinusoidal_2d_positions(cfg.grid_size, cfg.grid_size, cfg.d_model)[None]
            self.register_buffer("pos_embed", table, persistent=False)  # (1, N, D)
        self.encoder = Encoder(cfg)
        self.tgt_embed = TokenEmbedding(cfg.vocab_size, cfg.d_model, cfg.pad_id, cfg.scale_embeddings)
        self.positional = build_positional(cfg.positional, cfg.max_len, cfg.d_model)
        self.embed_dropout = nn.Dropout(cfg.dropout)
        self.decoder = Decoder(cfg)
        self.generator = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        # GPT-2's initialisation for the pre-LN stacks (as the ViT); the token embedding keeps
        # its own N(0, 1/d_model) draw, the scale the sqrt(d_model) factor of §3.4 expects.
        gpt2_init(self, cfg.n_encoder_layers + cfg.n_decoder_layers)
        nn.init.normal_(self.tgt_embed.weight, std=cfg.d_model**-0.5)
        with torch.no_grad():
            self.tgt_embed.weight[cfg.pad_id].zero_()
        self.generator.weight = self.tgt_embed.weight  # §3.4: one matrix for both
        read_old_weights(self)

    def encode(self, images: torch.Tensor, need_weights: bool = False) -> tuple[torch.Tensor, None, tuple]:
        """The decoder's memory: ``images (B, C, H, W)`` → ``(memory, None, encoder weights)``
        with ``memory (B, N, D)``, the patch states (``(B, 1, D)``, their mean, for
        ``memory="pooled"``). Every patch is real, so there is no mask over the memory
        (``src_mask`` is ``None``).

        Raises:
            ValueError: images of the wrong size or channel count.
        """
        cfg = self.config
        if images.dim() != 4 or images.shape[-2:] != (cfg.image_size, cfg.image_size):
            raise ValueError(
                f"images must be (batch, {cfg.channels}, {cfg.image_size}, {cfg.image_size}), "
                f"got {tuple(images.shape)}"
            )
        x = self.embed_dropout(self.patch_embed(images) + self.pos_embed)  # (B, N, D)
        memory, weights = self.encoder(x, None, need_weights)
        if cfg.memory == "pooled":
            memory = memory.mean(1, keepdim=True)  # (B, 1, D)
        return memory, None, weights

    def embed(self, tokens: torch.Tensor, start_pos: int = 0) -> torch.Tensor:
        """Dropout(E[tokens]·sqrt(d_model) + PE[pos]) (§3.4, §3.5): ``(B, T) → (B, T, D)``.

        Raises:
            ValueError: positions past ``max_len``.
        """
        if start_pos + tokens.size(1) > self.config.max_len:
            raise ValueError(
                f"caption of {start_pos + tokens.size(1)} tokens exceeds the model's "
                f"max_len ({self.config.max_len})"
            )
        x = self.tgt_embed(tokens)
        if self.positional is not None:
            x = x + self.positional(torch.arange(start_pos, start_pos + tokens.size(1), device=tokens.device))
        return self.embed_dropout(x)

    def decode(
        self,
        tgt: torch.Tensor,
        memory: torch.Tensor,
        src_mask: torch.Tensor | None = None,
        caches: list[tuple[KVCache, KVCache]] | None = None,
        start_pos: int = 0,
        need_weights: bool = False,
    ) -> tuple[torch.Tensor, tuple, tuple]:
        """The decoder and the output projection: ``tgt (B, T)``, ``memory (B, N, D)`` →
        ``(logits (B, T, V), self weights, cross weights)``. With ``caches`` (from
        :meth:`new_caches`), ``tgt`` holds only the new tokens, at ``start_pos ...``.
        ``src_mask``: the mask over ``memory`` (:meth:`encode`'s ``None``: every patch is
        real), named as :meth:`Transformer.decode <qkv.models.transformer.Transformer.decode>`
        names it so one decoding loop drives both."""
        x = self.embed(tgt, start_pos)
        h, self_w, cross_w = self.decoder(
            x, memory, src_mask=src_mask, caches=caches, need_weights=need_weights
        )
        return self.generator(h), self_w, cross_w

    def new_caches(self) -> list[tuple[KVCache, KVCache]]:
        """Empty (self, cross) key/value caches, one pair per decoder layer."""
        return [(KVCache(), KVCache()) for _ in self.decoder.layers]

    def forward(self, images: torch.Tensor, tgt: torch.Tensor, need_weights: bool = False) -> CaptionOutput:
        memory, src_mask, enc_w = self.encode(images, need_weights)
        logits, self_w, cross_w = self.decode(tgt, memory, src_mask, need_weights=need_weights)
        return CaptionOutput(logits, enc_w, self_w, cross_w)

    readout_stack = "decoder"  # the stack whose residual stream readout reads

    def readout(self, hidden: torch.Tensor) -> torch.Tensor:
        """The logits of the decoder's residual stream ``(B, T, D)`` → ``(B, T, V)``: its final
        norm, then the generator (the logit lens, :func:`qkv.explain.activations.logit_lens`)."""
        return self.generator(self.decoder.final_norm(hidden))

    def num_parameters(self) -> int:
        """Number of distinct trainable parameters (the tied matrix counted once)."""
        return sum(p.numel() for p in self.parameters())


def encoder_weights_from_vit(
    vit_state: dict[str, torch.Tensor], config: CaptionConfig
) -> dict[str, torch.Tensor]:
    """A ViT classifier's weights (:class:`~qkv.models.vit.VisionTransformer`'s state dict) as
    this model's image encoder: the patch embedding, the encoder layers and final norm; the
    class token and head dropped. Learned patch positions of a ViT trained on smaller images
    (a ``g × g`` grid) are tiled over the captioner's grid when ``g`` divides it, so every
    ``g × g`` block of patches starts with the positions the ViT learned for one image (a
    Fashion-MNIST ViT on 28 × 28 images gives each 28 × 28 cell of a 56 × 56 scene its own
    copy); otherwise they stay the captioner's own.

    Returns:
        ``{name: tensor}`` of this model's parameter names (a subset of its state dict).

    Raises:
        ValueError: an encoder depth or a patch embedding (width, patch size, channels) that
            does not match; other widths are checked when the weights are loaded.
    """
    out: dict[str, torch.Tensor] = {}
    for name, value in vit_state.items():
        if name.startswith("layers."):
            out["encoder." + name] = value
        elif name.startswith(("final_norm.", "patch_embed.")):
            out[("encoder." if name.startswith("final_norm.") else "") + name] = value
    layers = {int(k.split(".")[2]) for k in out if k.startswith("encoder.layers.")}
    if len(layers) != config.n_encoder_layers:
        raise ValueError(
            f"the ViT has {len(layers)} encoder layers, the captioner n_encoder_layers="
            f"{config.n_encoder_layers}"
        )
    proj = out.get("patch_embed.proj.weight")
    expected = (config.d_model, config.channels * config.patch_size**2)
    if proj is None or tuple(proj.shape) != expected:
        got = None if proj is None else tuple(proj.shape)
        raise ValueError(f"the ViT's patch embedding is {got}, the captioner needs {expected}")
    pos = vit_state.get("pos_embed")
    if config.image_positional == "learned" and pos is not None and pos.dim() == 3:
        patches = pos[0, 1:]  # (g², D): the class token's position dropped
        g = round(patches.size(0) ** 0.5)
        if g * g == patches.size(0) and config.grid_size % g == 0:
            reps = config.grid_size // g
            grid = patches.view(g, g, -1).repeat(reps, reps, 1)  # (G, G, D)
            out["pos_embed"] = grid.reshape(1, config.n_patches, -1).clone()
    return out


__all__ = ["CaptionOutput", "CaptionModel", "encoder_weights_from_vit"]
