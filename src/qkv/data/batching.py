"""Token-count batches with length bucketing (Vaswani et al. 2017, §5.1: "sentence pairs were
batched together by approximate sequence length. Each training batch contained a set of
sentence pairs containing approximately 25000 source tokens and 25000 target tokens").
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, overload

import torch


@dataclass
class TranslationBatch:
    """One padded batch.

    Attributes:
        src: ``(B, S)`` long, source ids + ``eos``, right-padded.
        tgt_in: ``(B, T)`` long, ``bos`` + target ids (decoder input), right-padded.
        tgt_out: ``(B, T)`` long, target ids + ``eos`` (labels), right-padded with ``pad``.
        n_tgt_tokens: number of non-pad labels (the loss normaliser).
        index: positions of these pairs in the data set (to restore order after decoding).
        pad_id: the padding id (what :meth:`shard` does not count).
    """

    src: torch.Tensor
    tgt_in: torch.Tensor
    tgt_out: torch.Tensor
    n_tgt_tokens: int
    index: list[int]
    pad_id: int = 0

    def __len__(self) -> int:
        return len(self.index)

    def shard(self, rank: int, world_size: int) -> TranslationBatch:
        """Pairs ``rank, rank + world_size, ...`` (one process's part under torchrun, see
        :func:`qkv.distributed.share`); padding columns are kept."""
        rows = slice(rank, None, world_size)
        tgt_out = self.tgt_out[rows]
        return TranslationBatch(
            self.src[rows],
            self.tgt_in[rows],
            tgt_out,
            int((tgt_out != self.pad_id).sum()),
            self.index[rows],
            self.pad_id,
        )


def pad_sequences(seqs: list[list[int]], pad_id: int) -> torch.Tensor:
    """Right-pad lists of ids into a ``(B, max_len)`` long tensor."""
    width = max((len(s) for s in seqs), default=0)
    out = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = torch.tensor(s, dtype=torch.long)
    return out


def make_batch(
    pairs: list[tuple[list[int], list[int]]], index: list[int], pad_id: int, bos_id: int, eos_id: int
) -> TranslationBatch:
    """Add ``bos``/``eos``, pad, and shift the target by one (teacher forcing)."""
    src = pad_sequences([s + [eos_id] for s, _ in pairs], pad_id)
    tgt_in = pad_sequences([[bos_id] + t for _, t in pairs], pad_id)
    tgt_out = pad_sequences([t + [eos_id] for _, t in pairs], pad_id)
    return TranslationBatch(src, tgt_in, tgt_out, int((tgt_out != pad_id).sum()), list(index), pad_id)


def token_batches(
    lengths: list[tuple[int, int]], max_tokens: int, shuffle: bool = True, seed: int = 0
) -> list[list[int]]:
    """Group example indices so that each batch's padded size stays under ``max_tokens``.

    Examples are sorted by length (with random tie-breaking when shuffling) so that a batch
    holds similar lengths and little padding; batch order is shuffled. The padded size of a
    batch is ``n_examples * max(src_len, tgt_len) + 1`` over its members.

    Args:
        lengths: ``(src_len, tgt_len)`` per example, without specials.
        max_tokens: budget per batch (an over-long single example still gets its own batch).

    Returns:
        lists of indices into ``lengths``.
    """
    rng = random.Random(seed)
    order = sorted(
        range(len(lengths)), key=lambda i: (max(lengths[i]), lengths[i], rng.random() if shuffle else 0)
    )
    batches: list[list[int]] = []
    current: list[int] = []
    width = 0
    for i in order:
        w = max(width, max(lengths[i]) + 1)
        if current and w * (len(current) + 1) > max_tokens:
            batches.append(current)
            current, w = [], max(lengths[i]) + 1
        current.append(i)
        width = w
    if current:
        batches.append(current)
    if shuffle:
        rng.shuffle(batches)
    return batches


class OnDemandBatches(Sequence[Any]):
    """An epoch of ``steps`` batches, each made when asked for by :meth:`make` (a pure function
    of the batch's index): nothing is stored, so an epoch over a corpus of any size costs nothing
    to set up, and batch ``i`` is the same whenever it is asked for (exact resume, every
    torchrun process). What :func:`qkv.train.loop.train_loop` takes as an epoch: ``len``,
    indexing and slicing."""

    steps: int

    def make(self, i: int) -> Any:
        raise NotImplementedError

    def __len__(self) -> int:
        return self.steps

    @overload
    def __getitem__(self, i: int) -> Any: ...
    @overload
    def __getitem__(self, i: slice) -> list[Any]: ...
    def __getitem__(self, i: int | slice) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self.steps))]
        if not -self.steps <= i < self.steps:
            raise IndexError(i)
        return self.make(i % self.steps)
