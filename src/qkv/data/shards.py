"""Token shards: a corpus tokenized once and read back from disk, so that what training holds
in memory does not grow with the corpus (nanoGPT's ``train.bin``, split into
shards, with an index of sequence boundaries).

A prepared data directory (``qkv prepare``, :mod:`qkv.data.prepare`)::

    meta.json                 format, kind (lm | protein-mlm), dtype, sources, settings, counts,
                              and per split the list of shards as [tokens, sequences]
    tokenizer.json            the tokenizer every id was made with
    train/tokens-00000.bin    token ids, raw, in the smallest unsigned type holding the vocabulary
    train/starts-00000.bin    int64: where each sequence of the shard starts, then the shard's end
    val/...                   the held-out split, the same way
    progress.json             only while a preparation is unfinished (what resuming starts from)

Why raw NumPy arrays rather than Arrow (HF ``datasets``) or LitData: a window or a sequence is
one read at a known offset (random access in O(1), no decoding, the operating system's page
cache does the caching), a rank under torchrun opens the same files and reads only the slices
its rows need, and nothing beyond NumPy is required. Arrow would add a large dependency for
columns we do not have; LitData brings its own streaming workers and shuffling, and we need
the loop's own batch order (exact resume, the same global batch on any number of processes).

Token files are read at offsets, not memory-mapped as nanoGPT's are: the pages of a mapping
stay counted in the process's memory once touched, so a long run over a large corpus would
look as if it held the corpus. The index (8 bytes per sequence) is mapped, advised as random.
"""

from __future__ import annotations

import io
import json
import mmap
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..errors import QkvError
from ..storage import atomic_write

FORMAT = "qkv-token-shards"
VERSION = 1
SPLITS = ("train", "val")


def token_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned integer type that holds ids ``0 .. vocab_size - 1``."""
    for dtype in (np.uint8, np.uint16, np.uint32):
        if vocab_size - 1 <= np.iinfo(dtype).max:
            return np.dtype(dtype)
    raise QkvError(f"a vocabulary of {vocab_size} tokens does not fit 32-bit ids")


def _shard_paths(directory: Path, index: int) -> tuple[Path, Path]:
    return directory / f"tokens-{index:05d}.bin", directory / f"starts-{index:05d}.bin"


def _random_access_map(path: Path) -> np.ndarray:
    """A read-only int64 view of a file by memory map, advised as randomly accessed (no
    read-ahead: a lookup maps a page, not the pages around it)."""
    with open(path, "rb") as handle:
        mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    if hasattr(mapped, "madvise") and hasattr(mmap, "MADV_RANDOM"):
        mapped.madvise(mmap.MADV_RANDOM)
    return np.frombuffer(mapped, dtype=np.int64)


class SplitWriter:
    """Appends sequences of token ids to one split's shards.

    The shard in progress is held in memory and written whole once it holds ``shard_tokens``
    tokens (a stream is cut exactly there; with ``sort_by_length`` a shard ends after the
    sequence that fills it, and its sequences are written shortest first, so that length-
    bucketed batches can take neighbours). A shard appears under its final name only once
    complete, so an interrupted preparation never leaves a partial one behind.

    ``counts`` ``(vocab_size,)`` int64: how often each id occurs in the shards written, counted
    once per shard.

    Args:
        shards: ``[tokens, sequences]`` of shards already written (a resumed preparation), and
            ``counts`` their counts.
    """

    def __init__(
        self,
        directory: Path,
        vocab_size: int,
        shard_tokens: int,
        sort_by_length: bool = False,
        shards: list[list[int]] | None = None,
        counts: list[int] | None = None,
    ) -> None:
        self.directory, self.sort_by_length = Path(directory), sort_by_length
        self.dtype, self.vocab_size, self.shard_tokens = token_dtype(vocab_size), vocab_size, shard_tokens
        self.shards: list[list[int]] = [list(s) for s in shards or []]
        self.counts = np.array(counts if counts is not None else np.zeros(vocab_size), dtype=np.int64)
        self._pieces: list[np.ndarray] = []
        self._starts: list[int] = []  # index into _pieces where each sequence starts
        self.buffered = 0

    def add(self, ids: np.ndarray, new_sequence: bool = True) -> None:
        """Append ``ids`` ``(n,)`` as a new sequence, or (``new_sequence=False``) as the
        continuation of the last one (a long text read in chunks)."""
        ids = np.asarray(ids)
        while not self.sort_by_length and self.buffered + len(ids) > self.shard_tokens:
            take = self.shard_tokens - self.buffered
            self._append(ids[:take], new_sequence)
            self.flush()
            ids, new_sequence = ids[take:], False
        self._append(ids, new_sequence)
        if self.buffered >= self.shard_tokens:
            self.flush()

    def _append(self, ids: np.ndarray, new_sequence: bool) -> None:
        if new_sequence or not self._starts:
            self._starts.append(len(self._pieces))
        self._pieces.append(ids.astype(self.dtype))
        self.buffered += len(ids)

    def _sequences(self) -> list[np.ndarray]:
        bounds = [*self._starts, len(self._pieces)]
        return [
            np.concatenate(self._pieces[a:b]) if b - a > 1 else self._pieces[a]
            for a, b in zip(bounds[:-1], bounds[1:], strict=True)
        ]

    def _joined(self, seqs: list[np.ndarray]) -> np.ndarray:
        return np.concatenate(seqs) if seqs else np.zeros(0, self.dtype)

    def save_pending(self, name: str) -> list[int]:
        """Write the shard in progress, unfinished, to ``name`` in the split's directory (what a
        resumed preparation reloads with :meth:`load_pending`); returns its sequences' lengths."""
        seqs = self._sequences()
        atomic_write(self.directory / name, self._joined(seqs).tofile)
        return [len(s) for s in seqs]

    def load_pending(self, name: str, lengths: list[int]) -> None:
        """Take back the shard in progress saved by :meth:`save_pending`."""
        tokens = np.fromfile(self.directory / name, dtype=self.dtype)
        if len(tokens) != sum(lengths):
            raise QkvError(f"{self.directory / name} does not match the preparation's record: remove --out")
        for seq in np.split(tokens, np.cumsum(lengths)[:-1]) if lengths else []:
            self._append(seq, True)

    def flush(self) -> None:
        """Write the shard in progress (nothing if it is empty)."""
        if not self._pieces:
            return
        seqs = self._sequences()
        if self.sort_by_length:
            order = np.argsort([len(s) for s in seqs], kind="stable")
            seqs = [seqs[i] for i in order]
        starts = np.zeros(len(seqs) + 1, dtype=np.int64)
        np.cumsum([len(s) for s in seqs], out=starts[1:])
        tokens = self._joined(seqs)
        tokens_path, starts_path = _shard_paths(self.directory, len(self.shards))
        atomic_write(tokens_path, tokens.tofile)
        atomic_write(starts_path, starts.tofile)
        self.shards.append([int(starts[-1]), len(seqs)])
        self.counts += np.bincount(tokens, minlength=self.vocab_size)
        self._pieces, self._starts, self.buffered = [], [], 0


class Split:
    """One split of a prepared directory, read from disk: a stream of all its tokens (the
    shards one after another) and its sequences.

    Args:
        shards: ``(tokens, sequences)`` of each shard, as ``meta.json`` lists them.

    Raises:
        QkvError: a shard file missing or of the wrong size (truncated, or from another
            preparation).
    """

    def __init__(self, directory: Path, dtype: np.dtype, shards: tuple[tuple[int, int], ...]) -> None:
        self.directory, self.dtype, self.shards = Path(directory), np.dtype(dtype), shards
        self._files: list[io.FileIO] = []
        self._starts: list[np.ndarray] = []
        for i, (n_tokens, n_seqs) in enumerate(shards):
            paths = _shard_paths(self.directory, i)
            itemsizes = (self.dtype.itemsize, np.dtype(np.int64).itemsize)
            for path, count, itemsize in zip(paths, (n_tokens, n_seqs + 1), itemsizes, strict=True):
                expected = count * itemsize
                size = path.stat().st_size if path.is_file() else None
                if size != expected:
                    found = "missing" if size is None else f"{size:,} bytes, expected {expected:,}"
                    raise QkvError(f"shard {path} is {found}: prepare the data again (qkv prepare)")
            self._files.append(open(paths[0], "rb", buffering=0))  # noqa: SIM115 (closed by close())
            self._starts.append(_random_access_map(paths[1]))
        self.token_ends = np.cumsum([0, *(s[0] for s in shards)])
        self.sequence_ends = np.cumsum([0, *(s[1] for s in shards)])

    def __len__(self) -> int:
        """Tokens in the split."""
        return int(self.token_ends[-1])

    @property
    def num_sequences(self) -> int:
        return int(self.sequence_ends[-1])

    def window(self, start: int, width: int) -> np.ndarray:
        """Tokens ``start .. start + width - 1`` of the split's stream, across shard boundaries.
        Shape: ``(width,)`` of the split's dtype."""
        if start < 0 or start + width > len(self):
            raise QkvError(f"window [{start}, {start + width}) outside a split of {len(self)} tokens")
        shard = int(np.searchsorted(self.token_ends, start, side="right")) - 1
        pieces, at = [], start - int(self.token_ends[shard])
        while width > 0:
            piece = self._read(shard, at, min(width, int(self.shards[shard][0]) - at))
            pieces.append(piece)
            width -= len(piece)
            shard, at = shard + 1, 0
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)

    def _read(self, shard: int, start: int, count: int) -> np.ndarray:
        """Tokens ``start .. start + count - 1`` of one shard, read from the file (not mapped:
        what a long run has read does not stay counted in its memory)."""
        handle, size = self._files[shard], self.dtype.itemsize
        handle.seek(start * size)
        data = handle.read(count * size)
        if data is None or len(data) != count * size:
            raise QkvError(f"shard {handle.name} ends before token {start + count}: prepare the data again")
        return np.frombuffer(data, dtype=self.dtype)

    def close(self) -> None:
        """Close the shard files (also done when the split is garbage-collected)."""
        for handle in getattr(self, "_files", []):
            handle.close()

    def __del__(self) -> None:
        self.close()

    def windows(self, offsets: torch.Tensor, width: int) -> torch.Tensor:
        """The windows of ``width`` tokens starting at ``offsets``. Shape: ``(B,)`` long →
        ``(B, width)`` long."""
        rows = [self.window(int(o), width) for o in offsets.tolist()]
        return (
            torch.from_numpy(np.stack(rows).astype(np.int64))
            if rows
            else torch.zeros(0, width, dtype=torch.long)
        )

    def locate(self, token: int) -> tuple[int, int]:
        """``(shard, sequence within the shard)`` of the sequence holding token ``token``."""
        shard = int(np.searchsorted(self.token_ends, token, side="right")) - 1
        local = token - int(self.token_ends[shard])
        return shard, int(np.searchsorted(self._starts[shard], local, side="right")) - 1

    def shard_starts(self, shard: int, first: int, stop: int) -> np.ndarray:
        """Where sequences ``first .. stop - 1`` of a shard start (the last entry may be the
        shard's end), ``np.diff`` of which are their lengths. Shape: up to ``(stop - first,)``
        int64."""
        return np.asarray(self._starts[shard][first:stop])

    def shard_sequence(self, shard: int, index: int) -> np.ndarray:
        """Sequence ``index`` of shard ``shard``, read from its file. Shape: ``(length,)``."""
        starts = self._starts[shard]
        return self._read(shard, int(starts[index]), int(starts[index + 1] - starts[index]))

    def sequence(self, index: int) -> np.ndarray:
        """Sequence ``index`` of the split (over all shards, in order)."""
        shard = int(np.searchsorted(self.sequence_ends, index, side="right")) - 1
        return self.shard_sequence(shard, index - int(self.sequence_ends[shard]))


@dataclass(frozen=True)
class PreparedData:
    """A prepared data directory: ``meta`` (``meta.json``), its ``train`` and ``val``
    :class:`Split` and the path of its tokenizer."""

    path: Path
    meta: dict
    train: Split
    val: Split

    @property
    def tokenizer_path(self) -> Path:
        return self.path / "tokenizer.json"

    @classmethod
    def open(cls, path: str | Path, kind: str) -> PreparedData:
        """Open a directory written by ``qkv prepare KIND``.

        Raises:
            QkvError: not a directory, a preparation still unfinished, prepared for another
                recipe, or a missing or truncated shard.
        """
        path = Path(path)
        meta_path = path / "meta.json"
        if not meta_path.is_file():
            unfinished = (path / "progress.json").is_file()
            raise QkvError(
                f"data={path}: "
                + (
                    "its preparation did not finish; run the same qkv prepare command again to resume it"
                    if unfinished
                    else f"not a prepared data directory (no meta.json; make one with qkv prepare {kind})"
                )
            )
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise QkvError(f"cannot read {meta_path}: {exc}") from None
        if meta.get("format") != FORMAT or meta.get("version") != VERSION:
            raise QkvError(f"{meta_path} is not qkv token shards of version {VERSION}")
        if meta.get("kind") != kind:
            raise QkvError(f"data={path} was prepared for {meta.get('kind')}, not {kind}")
        dtype = np.dtype(meta["dtype"])
        splits = {
            name: Split(path / name, dtype, tuple(tuple(s) for s in meta["splits"][name])) for name in SPLITS
        }
        return cls(path, meta, splits["train"], splits["val"])
