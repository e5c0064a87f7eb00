"""Images as token sequences: cut into patches, project each patch to a vector.

Source: lecture notes: "We can tokenize anything. General strategy: chop the input up into
chunks, project each chunk to an embedding"; Dosovitskiy et al. 2021 (ViT),
§3.1, Eq. 1: ``z_0 = [x_class; x_p^1 E; ...; x_p^N E] + E_pos`` with ``E`` a
``(P²·C) × D`` matrix applied to each flattened ``P × P`` patch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .positional import sinusoidal_positional_encoding


def _check_images(images: torch.Tensor, patch_size: int) -> tuple[int, int, int, int]:
    if images.dim() != 4:
        raise ValueError(
            f"images must have shape (batch, channels, height, width), got {tuple(images.shape)}"
        )
    b, c, h, w = images.shape
    if h % patch_size or w % patch_size:
        raise ValueError(f"image size {h}x{w} is not a multiple of the patch size {patch_size}")
    return b, c, h, w


def patchify(images: torch.Tensor, patch_size: int) -> torch.Tensor:
    """Chop images into non-overlapping ``P × P`` patches, each flattened (channel, row, column).

    Shape: ``images (B, C, H, W)`` → ``(B, N, C·P·P)`` with ``N = (H/P)·(W/P)`` patches in
    reading order (left to right, top to bottom). Any dtype.

    Raises:
        ValueError: not a 4-D tensor, or ``H``/``W`` not a multiple of ``P``.
    """
    b, c, h, w = _check_images(images, patch_size)
    p = patch_size
    x = images.reshape(b, c, h // p, p, w // p, p)  # (B, C, H/P, P, W/P, P)
    x = x.permute(0, 2, 4, 1, 3, 5)  # (B, H/P, W/P, C, P, P)
    return x.reshape(b, (h // p) * (w // p), c * p * p)


def unpatchify(
    patches: torch.Tensor, patch_size: int, channels: int, height: int, width: int
) -> torch.Tensor:
    """Inverse of :func:`patchify`: ``(B, N, C·P·P)`` → ``(B, C, H, W)``."""
    p, b = patch_size, patches.size(0)
    x = patches.reshape(b, height // p, width // p, channels, p, p)  # (B, H/P, W/P, C, P, P)
    x = x.permute(0, 3, 1, 4, 2, 5)  # (B, C, H/P, P, W/P, P)
    return x.reshape(b, channels, height, width)


class PatchEmbedding(nn.Module):
    """ViT Eq. 1's ``x_p E``: flatten each patch and multiply by one matrix ``E``.

    ``forward(images, fast=False)`` does exactly that (:func:`patchify`, then a linear layer);
    ``fast=True`` computes the same numbers as a convolution with kernel = stride = ``P``
    (the kernel is ``E`` reshaped; no copy of the patches is made). Tests hold the two equal.

    Args:
        patch_size: ``P``. channels: ``C``. d_model: ``D``.

    Shape: ``images (B, C, H, W)`` float → ``(B, N, D)``.

    Raises:
        ValueError: wrong number of dimensions or channels, or a size not divisible by ``P``.
    """

    def __init__(self, patch_size: int, channels: int, d_model: int) -> None:
        super().__init__()
        self.patch_size, self.channels = patch_size, channels
        self.proj = nn.Linear(channels * patch_size * patch_size, d_model)

    def forward(self, images: torch.Tensor, fast: bool = True) -> torch.Tensor:
        _, c, _, _ = _check_images(images, self.patch_size)
        if c != self.channels:
            raise ValueError(f"images have {c} channels, the model expects {self.channels}")
        if not fast:
            return self.proj(patchify(images, self.patch_size))
        p = self.patch_size
        kernel = self.proj.weight.view(-1, c, p, p)  # (D, C, P, P): E's rows as filters
        out = F.conv2d(images, kernel, self.proj.bias, stride=p)  # (B, D, H/P, W/P)
        return out.flatten(2).transpose(1, 2)  # (B, N, D)


def sinusoidal_2d_positions(grid_height: int, grid_width: int, d_model: int) -> torch.Tensor:
    """Fixed 2-D positions for a grid of patches: the first half of the channels encode the
    row and the second half the column, each with §3.5's sinusoids over ``d_model / 2``
    channels (the "2-D sin-cos" of MAE, He et al. 2022, and Beyer et al. 2022's simple ViT).

    Returns:
        float32 ``(grid_height · grid_width, d_model)``, patches in reading order.

    Raises:
        ValueError: ``d_model`` not divisible by 4.
    """
    if d_model % 4:
        raise ValueError(f"d_model ({d_model}) must be divisible by 4 for 2-D sinusoidal positions")
    rows = sinusoidal_positional_encoding(grid_height, d_model // 2)  # (Gh, D/2)
    cols = sinusoidal_positional_encoding(grid_width, d_model // 2)  # (Gw, D/2)
    grid = torch.cat(
        [rows[:, None, :].expand(-1, grid_width, -1), cols[None, :, :].expand(grid_height, -1, -1)], dim=-1
    )  # (Gh, Gw, D)
    return grid.reshape(grid_height * grid_width, d_model)


__all__ = ["patchify", "unpatchify", "PatchEmbedding", "sinusoidal_2d_positions"]
