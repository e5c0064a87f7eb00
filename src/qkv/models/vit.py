"""Vision Transformer (ViT): the Transformer encoder over image patches.

Source: Dosovitskiy et al. 2021, "An Image is Worth 16x16 Words", §3.1 (Eq. 1–4): patches are
tokens ("we can tokenize anything ... chop the input up into chunks, project each chunk to an
embedding", lecture notes), a learnable class token is prepended, positions are added, and the
encoder stack of Vaswani et al. 2017 (§3.1) runs unchanged (pre-LN, GELU, as ViT). The class
token's final state (or the mean of the patches) feeds a linear head.

Input pixels are expected scaled to [-1, 1] (``pixel / 127.5 - 1``; see
:func:`qkv.data.images.to_model_input`), the rule HF's ``ViTImageProcessor`` uses.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..compat import read_old_weights
from ..nn.layers import SelfAttentionLayer, norm
from ..nn.patches import PatchEmbedding, sinusoidal_2d_positions
from .config import ViTConfig
from .stack import gpt2_init


@dataclass
class ViTOutput:
    """Output of :meth:`VisionTransformer.forward`.

    Attributes:
        logits: ``(B, num_labels)`` float, unnormalised class scores.
        hidden: ``(B, 1 + N, D)`` final hidden states (class token first, then the patches).
        attentions: one ``(B, H, 1 + N, 1 + N)`` tensor per layer; empty unless
            ``need_weights=True``.
    """

    logits: torch.Tensor
    hidden: torch.Tensor
    attentions: tuple = ()


class VisionTransformer(nn.Module):
    """ViT image classifier built from qkv's encoder layers.

    Args:
        config: a :class:`~qkv.models.config.ViTConfig`.

    Shape: ``images (B, C, H, W)`` float with ``C = channels``, ``H = W = image_size`` →
    :class:`ViTOutput`. Token 0 is the class token; token ``1 + i`` is patch ``i`` in reading
    order (row ``i // grid_size``, column ``i % grid_size``).

    Raises:
        ValueError: images of the wrong rank, channel count or size.
    """

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        self.config = cfg = config
        self.patch_embed = PatchEmbedding(cfg.patch_size, cfg.channels, cfg.d_model)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, cfg.d_model))
        n_tokens = cfg.n_patches + 1
        if cfg.positional == "learned":
            self.pos_embed = nn.Parameter(torch.zeros(1, n_tokens, cfg.d_model))
        else:  # fixed 2-D sin-cos for the patches, zero for the class token (as MAE)
            table = torch.cat(
                [
                    torch.zeros(1, cfg.d_model),
                    sinusoidal_2d_positions(cfg.grid_size, cfg.grid_size, cfg.d_model),
                ]
            )
            self.register_buffer("pos_embed", table[None], persistent=False)  # (1, 1 + N, D)
        self.embed_dropout = nn.Dropout(cfg.dropout)
        self.layers = nn.ModuleList(SelfAttentionLayer(cfg) for _ in range(cfg.n_layers))
        self.final_norm = norm(cfg) if cfg.norm_first else nn.Identity()
        self.head = nn.Linear(cfg.d_model, cfg.num_labels)
        gpt2_init(self, cfg.n_layers)
        nn.init.zeros_(self.head.weight)  # start from uniform class probabilities (as ViT)
        read_old_weights(self)  # what earlier qkv versions saved loads too (qkv.compat)

    def embed(self, images: torch.Tensor) -> torch.Tensor:
        """Eq. 1: ``[x_class; x_p E] + E_pos`` → ``(B, 1 + N, D)``."""
        cfg = self.config
        if images.shape[-2:] != (cfg.image_size, cfg.image_size):
            raise ValueError(
                f"images are {tuple(images.shape[-2:])} pixels, the model expects "
                f"{cfg.image_size}x{cfg.image_size}"
            )
        patches = self.patch_embed(images)  # (B, N, D)
        cls = self.cls_token.expand(patches.size(0), -1, -1)  # (B, 1, D)
        return self.embed_dropout(torch.cat([cls, patches], dim=1) + self.pos_embed)

    def forward(self, images: torch.Tensor, need_weights: bool = False) -> ViTOutput:
        """Eq. 1–4: embed, ``n_layers`` encoder layers (no mask: every token sees every
        other), final norm, head on the pooled state."""
        x = self.embed(images)
        weights = []
        for layer in self.layers:
            x, w = layer(x, need_weights=need_weights)
            weights.append(w)
        x = self.final_norm(x)  # (B, 1 + N, D)
        return ViTOutput(self.head(self.pool(x)), x, tuple(weights) if need_weights else ())

    def pool(self, x: torch.Tensor) -> torch.Tensor:
        """The vector the head reads: ``(B, 1 + N, D)`` → ``(B, D)``, the class token's state
        (``pooling="cls"``, Eq. 4) or the mean of the patches' (``"mean"``)."""
        return x[:, 0] if self.config.pooling == "cls" else x[:, 1:].mean(1)

    def readout(self, hidden: torch.Tensor) -> torch.Tensor:
        """The class logits of a residual stream ``(B, 1 + N, D)`` → ``(B, num_labels)``: the
        final norm, :meth:`pool`, the head (the logit lens,
        :func:`qkv.explain.activations.logit_lens`)."""
        return self.head(self.pool(self.final_norm(hidden)))

    def num_parameters(self) -> int:
        """Number of trainable parameters."""
        return sum(p.numel() for p in self.parameters())
