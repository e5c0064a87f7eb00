"""Batches for masked-language-model pretraining on proteins (ESM, Rives et al. 2021): each
protein cropped to a window of ``max_len - 2`` residues, ``<cls> residues <eos>`` rows
corrupted by :func:`~qkv.data.masking.mask_tokens` (BERT's 80/10/10), from a corpus in memory
or from token shards (:class:`ShardBatches`), and the fixed held-out batches that validation
scores.
"""

from __future__ import annotations

import random

import numpy as np
import torch

from .batching import OnDemandBatches, pad_sequences, token_batches
from .masking import mask_tokens
from .shards import Split
from .tokenizers import PROTEIN_SPECIALS, AminoAcidTokenizer


def windows(seqs: list[list[int]], width: int, rng: random.Random | None) -> list[list[int]]:
    """Crop each residue list to ``width`` (a random window, or the start when ``rng`` is None)."""
    out = []
    for s in seqs:
        start = 0 if len(s) <= width or rng is None else rng.randrange(len(s) - width + 1)
        out.append(s[start : start + width])
    return out


class MaskedBatches:
    """Length-bucketed batches of ``<cls> residues <eos>`` rows, corrupted for MLM."""

    def __init__(self, tok: AminoAcidTokenizer, mask_prob: float) -> None:
        self.tok, self.mask_prob = tok, mask_prob
        self.special = list(range(len(PROTEIN_SPECIALS)))

    def tensor(self, rows: list[list[int]]) -> torch.Tensor:
        tok = self.tok
        return pad_sequences([[tok.cls_id, *r, tok.eos_id] for r in rows], tok.pad_id)

    def corrupt(
        self,
        tokens: torch.Tensor,
        generator: torch.Generator | None = None,
        split: tuple[float, float] = (0.8, 0.1),
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return mask_tokens(
            tokens, self.special, self.tok.mask_id, self.tok.residue_ids, self.mask_prob, generator, split
        )


class ShardBatches(OnDemandBatches):
    """One epoch of length-bucketed protein batches from token shards, made on demand
    (:class:`~qkv.data.batching.OnDemandBatches`).

    Batch ``i`` (a NumPy generator seeded with ``(seed, i)``) starts at a residue drawn
    uniformly from the split, takes the protein holding it and its neighbours in the shard
    (shards are sorted by length when prepared, so neighbours have similar lengths: little
    padding) while the padded batch, ``<cls>`` and ``<eos>`` included, stays within
    ``max_tokens``, and crops each protein longer than ``width`` to a random window (ESM's
    cropping). A batch thus costs the same whatever the corpus size, nothing is held per
    protein, and batch ``i`` is the same whenever it is asked for (exact resume; every torchrun
    process reads only its rows). Residues are drawn uniformly, so every residue of the corpus
    is equally likely to be trained on (a protein in proportion to its length, where the
    in-memory recipe takes each protein once per epoch, cropped). An epoch is as many batches
    as the split's residues fill at ``max_tokens``.
    """

    def __init__(self, split: Split, width: int, max_tokens: int, seed: int) -> None:
        self.split, self.width, self.max_tokens, self.seed = split, width, max_tokens, seed
        self.steps = max(1, -(-len(split) // max_tokens))

    def make(self, i: int) -> list[list[int]]:
        rng = np.random.default_rng([self.seed, i])
        shard, first = self.split.locate(int(rng.integers(len(self.split))))
        n_seqs = int(self.split.shards[shard][1])
        most = max(1, self.max_tokens // 3)  # rows of a batch: at least <cls>, a residue, <eos> each
        starts = self.split.shard_starts(shard, first, first + most + 1)
        widths = np.minimum(np.diff(starts), self.width) + 2  # ascending: each new row is the widest
        fits = (np.arange(1, len(widths) + 1) * widths) <= self.max_tokens
        count = max(1, int(fits.argmin()) if not fits.all() else len(widths))
        last = first + count
        if last == n_seqs:  # the shard ran out: take shorter neighbours before it
            room = max(1, self.max_tokens // int(widths[count - 1]))
            first = max(0, last - room)
        rows = []
        for j in range(first, last):
            seq = self.split.shard_sequence(shard, j)
            start = int(rng.integers(len(seq) - self.width + 1)) if len(seq) > self.width else 0
            rows.append(seq[start : start + self.width].tolist())
        return rows


def validation_batches(
    val_ids: list[list[int]], width: int, collate: MaskedBatches
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Fixed ``(inputs, labels)`` batches of the held-out proteins: the first window of each,
    15 % of residues all replaced by ``<mask>`` (none left visible), drawn once with a fixed
    seed, so the perplexity is comparable with the uniform 20 and the same at every evaluation."""
    rows = windows(val_ids, width, None)
    g = torch.Generator().manual_seed(12345)
    return [
        collate.corrupt(collate.tensor([rows[i] for i in idx]), g, split=(1.0, 0.0))
        for idx in token_batches([(len(r), 0) for r in rows], 16384, shuffle=False)
    ]


def token_counts(ids: list[list[int]], vocab_size: int) -> torch.Tensor:
    """How often each token occurs in ``ids``. Shape: ``(vocab_size,)`` float64."""
    counts = torch.zeros(vocab_size, dtype=torch.float64)
    for row in ids:
        counts += torch.bincount(torch.tensor(row, dtype=torch.long), minlength=vocab_size)
    return counts
