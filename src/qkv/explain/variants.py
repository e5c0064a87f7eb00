"""The saturation-mutagenesis heatmap of zero-shot variant scores (Meier et al. 2021, Fig. 1
style): every position of a wild type (across) × the 20 amino acids (down), each cell the
log-ratio ``log p(mutant) - log p(wild type)`` of that single substitution.

A diverging colour map centred on 0 (red: less likely than the wild type, blue: more), the
wild type's residue marked with a dot in each column, positions not scored in grey. Long
sequences are cut into stacked panels of at most :data:`PER_PANEL` positions, so every
column stays wide enough to read.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..data.tokenizers import AMINO_ACIDS
from .plots import figure, save

if TYPE_CHECKING:
    from matplotlib.figure import Figure

PER_PANEL = 100  # positions per panel
CMAP = "RdBu"


def plot_saturation(matrix: np.ndarray, wild_type: str, offset: int = 0, title: str = "") -> Figure:
    """The heatmap of a saturation matrix.

    Args:
        matrix: ``(L, 20)`` float scores, columns in :data:`~qkv.data.tokenizers.AMINO_ACIDS`
            order (:meth:`qkv.inference.variants.VariantScorer.saturation`); NaN = not scored.
        wild_type: the ``L`` residues (marked, and written under the positions).
        offset: added to 1-based positions in the labels (the mutations' numbering).
        title: the figure's title (model and method).

    Returns the figure: one heatmap axis per panel of :data:`PER_PANEL` positions, then the
    colour bar's axis. Raises ``ValueError`` if the shapes disagree.
    """
    length = len(wild_type)
    if matrix.shape != (length, len(AMINO_ACIDS)):
        raise ValueError(f"matrix {matrix.shape} does not match a wild type of {length} residues × 20")
    panels = [(s, min(s + PER_PANEL, length)) for s in range(0, length, PER_PANEL)]
    width = min(length, PER_PANEL)
    fig = figure(figsize=(2.0 + 0.14 * width, 0.5 + 2.9 * len(panels)), layout="constrained")
    from matplotlib import colormaps  # figure() checked that matplotlib (qkv[plot]) is there
    from matplotlib.colors import TwoSlopeNorm

    limit = float(np.nanmax(np.abs(matrix))) if np.isfinite(matrix).any() else 1.0
    norm = TwoSlopeNorm(vcenter=0.0, vmin=-max(limit, 1e-6), vmax=max(limit, 1e-6))
    cmap = colormaps[CMAP].with_extremes(bad="#d9d9d9")  # not scored: grey
    axes = fig.subplots(len(panels), 1, squeeze=False)[:, 0]
    image = None
    for ax, (start, end) in zip(axes, panels, strict=True):
        # a short last panel keeps the others' column width: its image ends early
        extent = (-0.5, end - start - 0.5, len(AMINO_ACIDS) - 0.5, -0.5)
        image = ax.imshow(
            matrix[start:end].T, cmap=cmap, norm=norm, aspect="auto", interpolation="nearest", extent=extent
        )  # (20, positions)
        cols = range(end - start)
        wt_rows = [AMINO_ACIDS.find(wild_type[start + c]) for c in cols]
        marked = [(c, r) for c, r in zip(cols, wt_rows, strict=True) if r >= 0]
        if marked:
            ax.scatter(*zip(*marked, strict=True), s=6, c="black", marker="o", linewidths=0)
        ax.set_yticks(range(len(AMINO_ACIDS)), list(AMINO_ACIDS), fontsize=6)
        ax.set_xticks(cols, list(wild_type[start:end]), fontsize=5)
        ax.set_xlim(-0.5, width - 0.5)
        top = ax.secondary_xaxis("top")
        ticks = [c for c in cols if (start + c + 1 + offset) % 10 == 0]
        top.set_xticks(ticks, [str(start + c + 1 + offset) for c in ticks], fontsize=6)
        ax.set_ylabel("mutant amino acid")
    axes[-1].set_xlabel("wild-type residue (position numbers above)")
    if image is not None:
        fig.colorbar(image, ax=list(axes), shrink=0.9, label="log p(mutant) − log p(wild type)")
    if title:
        fig.suptitle(title)
    return fig


def write_heatmap(
    matrix: np.ndarray, wild_type: str, path: str | Path, offset: int = 0, title: str = ""
) -> Path:
    """:func:`plot_saturation` written as PNG to ``path``, atomically."""
    return save(plot_saturation(matrix, wild_type, offset, title), path)
