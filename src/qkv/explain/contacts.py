"""The picture of contact prediction for one chain (Rao et al. 2021, Figure 1's kind): the
predicted contact probabilities with the true contacts overlaid, beside the attention map of the
single layer and head that finds this chain's long-range contacts best.

Both panels are ``L × L`` over the chain's residues. Left: the logistic regression's
probabilities in the upper triangle, the true contacts (Cβ < 8 Å, ``|i - j| >= 6``) as dots in
the lower triangle and as rings over the upper one, so hits and misses line up. Right: the
symmetrised, APC-corrected attention map of the best head (highest top-L/5 long-range precision
on this chain, :func:`best_head`), the true contacts as dots in its lower triangle.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..inference.contacts import LONG_RANGE, attention_features, contact_precision
from .plots import CMAP, figure, save

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from ..data.structures import Chain
    from ..inference.contacts import ContactHead
    from ..inference.protein import ProteinEncoder

SHOWN_SEPARATION = 6  # true contacts closer in sequence than this are not drawn (the diagonal band)


def best_head(
    features: torch.Tensor, true_map: np.ndarray, min_separation: int = LONG_RANGE
) -> tuple[int, float]:
    """The single attention map that ranks this chain's contacts best: the index ``f`` of
    ``features`` ``(L, L, F)`` (``layer * n_heads + head``) whose values give the highest top-L/5
    precision over pairs ``|i - j| >= min_separation`` (ties: the lowest index), and that
    precision."""
    scores = [
        contact_precision(features[..., f], true_map, min_separation, ("L/5",))["L/5"]
        for f in range(features.shape[-1])
    ]
    f = int(np.argmax(scores))
    return f, scores[f]


def plot_contacts(
    probs: torch.Tensor,
    true_map: np.ndarray,
    features: torch.Tensor,
    n_heads: int,
    title: str = "",
    min_separation: int = LONG_RANGE,
) -> Figure:
    """Predicted contacts beside the best head's attention map (see the module docstring).

    Args:
        probs: ``(L, L)`` contact probabilities.
        true_map: ``(L, L)`` bool true contacts.
        features: ``(L, L, n_layers * n_heads)`` APC-corrected attention maps
            (:func:`~qkv.inference.contacts.attention_features`).
        n_heads: heads per layer (to name the best map's layer and head).
        title: the chain's name, put before the precisions in the figure's title.

    Returns the figure: two heatmap axes, then their two colour-bar axes.
    """
    p = probs.detach().float().cpu().numpy()
    truth = np.asarray(true_map, dtype=bool)
    length = p.shape[0]
    precision = contact_precision(p, truth, min_separation)
    f, best = best_head(features, truth, min_separation)
    attention = features[..., f].detach().float().cpu().numpy()
    upper = np.triu(np.ones_like(truth), 1)
    ci, cj = np.nonzero(
        truth & (np.abs(np.subtract.outer(np.arange(length), np.arange(length))) >= SHOWN_SEPARATION)
    )
    lower = ci > cj  # each contact once, as (row > column)
    dot = max(0.5, 40.0 / max(length, 1))  # marker size that stays visible on long chains

    fig = figure(figsize=(12.5, 6.0), layout="constrained")
    left, right = fig.subplots(1, 2)
    image = left.imshow(np.where(upper, p, np.nan), cmap=CMAP, vmin=0.0, vmax=1.0, interpolation="nearest")
    left.scatter(cj[lower], ci[lower], s=dot, c="0.35", marker="s", linewidths=0, label="true contact")
    left.scatter(ci[lower], cj[lower], s=dot * 3, facecolors="none", edgecolors="tab:red", linewidths=0.5)
    left.set_title(
        f"predicted (upper) and true contacts (lower; rings over the upper)\n"
        f"long-range precision top-L {precision['L']:.2f}, L/5 {precision['L/5']:.2f}",
        fontsize=10,
    )
    fig.colorbar(image, ax=left, shrink=0.75, label="contact probability")
    scale = float(np.abs(attention).max()) or 1.0
    image = right.imshow(attention, cmap="RdBu_r", vmin=-scale, vmax=scale, interpolation="nearest")
    right.scatter(cj[lower], ci[lower], s=dot, c="0.2", marker="s", linewidths=0)
    right.set_title(
        f"best single map: layer {f // n_heads + 1}, head {f % n_heads + 1} (APC-corrected)\n"
        f"its own top-L/5 long-range precision {best:.2f}; true contacts lower",
        fontsize=10,
    )
    fig.colorbar(image, ax=right, shrink=0.75, label="symmetrised attention − APC")
    for ax in (left, right):
        ax.set_xlim(-0.5, length - 0.5)
        ax.set_ylim(length - 0.5, -0.5)
        ax.set_xlabel("residue j")
        ax.set_ylabel("residue i")
    fig.suptitle(f"{title}{' — ' if title else ''}{length} residues, Cβ < 8 Å (Rao et al. 2021)")
    return fig


def save_contact_figure(encoder: ProteinEncoder, head: ContactHead, chain: Chain, path: str | Path) -> Path:
    """Draw :func:`plot_contacts` for ``chain`` with ``encoder`` and ``head`` and write it as a
    PNG atomically; returns the path."""
    features, covered = attention_features(encoder, chain.sequence, chain.name)
    probs = head.probabilities(features, covered)
    fig = plot_contacts(probs, chain.contacts(), features, head.n_heads, chain.name)
    return save(fig, path)
