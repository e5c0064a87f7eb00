"""Captioning metrics: corpus BLEU against several references, exact match, the pointing game,
and nearest-neighbour caption retrieval (the baseline a captioner must beat).

- BLEU: sacreBLEU's corpus BLEU-4 (Papineni et al. 2002; Post 2018), every reference of an
  image counted (a scene has one reference per phrasing of its meaning).
- Pointing game (Zhang et al. 2016, "Top-down Neural Attention by Excitation Backprop", §5.1):
  a hit when the maximum of an attention map over the image falls inside a box of the object
  the word names; the score is hits / (hits + misses).
- Nearest-neighbour retrieval: each query image takes the caption of its nearest training image
  in pixel space (Euclidean), the retrieval baseline of Devlin et al. 2015 ("Exploring Nearest
  Neighbor Approaches for Image Captioning") on raw pixels.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import sacrebleu

from ..extras import require

Box = tuple[int, int, int, int]  # (top, left, bottom, right) pixels, bottom/right exclusive


def caption_bleu(hypotheses: Sequence[str], references: Sequence[Sequence[str]]) -> float:
    """Corpus BLEU-4 (0-100, sacreBLEU's defaults) of ``hypotheses`` against each one's list of
    references (at least one each; lists of different lengths are padded with their own first
    reference, which changes no n-gram count and no closest length).

    Raises:
        ValueError: lengths that differ, or an image without a reference.
    """
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} reference lists")
    if any(not refs for refs in references):
        raise ValueError("every hypothesis needs at least one reference")
    if not hypotheses:
        return 0.0
    width = max(len(refs) for refs in references)
    streams = [[refs[i] if i < len(refs) else refs[0] for refs in references] for i in range(width)]
    return float(sacrebleu.corpus_bleu(list(hypotheses), streams).score)


def exact_match(hypotheses: Sequence[str], references: Sequence[Sequence[str]]) -> float:
    """Share of hypotheses equal to one of their references (after ``strip().lower()`` and
    collapsing whitespace); 0.0 for no hypotheses."""

    def norm(text: str) -> str:
        return " ".join(text.lower().split())

    hits = [norm(h) in {norm(r) for r in refs} for h, refs in zip(hypotheses, references, strict=True)]
    return float(np.mean(hits)) if hits else 0.0


def attention_peak(weights: np.ndarray, grid: int, image_size: int) -> tuple[float, float]:
    """Where an attention map over a ``grid × grid`` patch grid peaks, as the pixel centre
    ``(y, x)`` of its most attended patch. ``weights``: ``(grid · grid,)`` in reading order."""
    i = int(np.argmax(weights))
    patch = image_size / grid
    return ((i // grid + 0.5) * patch, (i % grid + 0.5) * patch)


def pointing_hit(weights: np.ndarray, boxes: Sequence[Box], grid: int, image_size: int) -> bool:
    """The pointing game's hit: the peak of ``weights`` (:func:`attention_peak`) lies inside one
    of ``boxes``."""
    y, x = attention_peak(weights, grid, image_size)
    return any(top <= y < bottom and left <= x < right for top, left, bottom, right in boxes)


def nearest_captions(
    train_images: np.ndarray, train_captions: Sequence[str], query_images: np.ndarray
) -> list[str]:
    """The caption of each query image's nearest training image (Euclidean distance on pixels
    scaled to [0, 1]; scikit-learn's brute-force search). Images uint8 ``(N, H, W, C)`` of one
    size.

    Raises:
        MissingExtra: scikit-learn is not installed (``pip install 'qkv[probe]'``).
    """
    require("probe", "the nearest-caption baseline")
    from sklearn.neighbors import NearestNeighbors

    x_train = train_images.reshape(len(train_images), -1).astype(np.float32) / 255.0
    x_query = query_images.reshape(len(query_images), -1).astype(np.float32) / 255.0
    index = NearestNeighbors(n_neighbors=1, algorithm="brute").fit(x_train)
    nearest = index.kneighbors(x_query, return_distance=False)[:, 0]
    return [train_captions[i] for i in nearest]


__all__ = ["Box", "caption_bleu", "exact_match", "attention_peak", "pointing_hit", "nearest_captions"]
