"""Plain-text corpora for language modelling, and the windows a model trains on.

Self-supervised labels ("cook up 'labels' (prediction targets) from the unlabeled texts",
lecture notes): the target of position t is the token at t + 1. The default corpus is
tiny-shakespeare (Karpathy's char-rnn), split as nanoGPT does: first 90 % of the characters for
training, last 10 % for validation.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from ..errors import QkvError
from .batching import OnDemandBatches
from .sources import find_data_file

TINY_SHAKESPEARE_URL = (
    "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
)
TINY_SHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"


CORPORA = ("tinyshakespeare",)  # corpora by name; a name wins over a file of that name


def load_corpus_path(name: str) -> Path:
    """The file of a corpus: ``"tinyshakespeare"`` (data dir, cache or verified download) or the
    path of a text file. Raises :class:`QkvError` if it is neither."""
    if name == "tinyshakespeare":
        return find_data_file("tinyshakespeare", "input.txt", TINY_SHAKESPEARE_URL, TINY_SHAKESPEARE_SHA256)
    path = Path(name)
    if not path.is_file():
        raise QkvError(f"corpus {name!r} is neither 'tinyshakespeare' nor an existing text file")
    return path


def load_corpus(name: str) -> str:
    """Text of a corpus (:func:`load_corpus_path`), read whole.

    Raises:
        QkvError: the file is missing, unreadable, not UTF-8, or empty.
    """
    path = load_corpus_path(name)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise QkvError(f"corpus {path} is not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise QkvError(f"cannot read corpus {path}: {exc}") from None
    if not text:
        raise QkvError(f"corpus {path} is empty")
    return text


def check_val_fraction(val_fraction: float) -> None:
    """Raise :class:`QkvError` unless ``0 < val_fraction < 1``."""
    if not 0.0 < val_fraction < 1.0:
        raise QkvError(f"val_fraction ({val_fraction}) must be in (0, 1)")


def split_train_val(text: str, val_fraction: float = 0.1) -> tuple[str, str]:
    """First ``1 - val_fraction`` of the characters for training, the rest for validation
    (nanoGPT's ``prepare.py`` split, so numbers compare)."""
    check_val_fraction(val_fraction)
    n = int(len(text) * (1 - val_fraction))
    return text[:n], text[n:]


def random_windows(
    data: torch.Tensor, block_size: int, batch_size: int, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Start offsets of ``batch_size`` random windows (nanoGPT's ``get_batch``).

    Shape: ``data (N,)`` long token ids → ``(batch_size,)`` long offsets in
    ``[0, N - block_size - 1]``. Raises :class:`QkvError` if ``data`` is too short.
    """
    if len(data) <= block_size:
        raise QkvError(f"corpus of {len(data)} tokens is too short for block_size {block_size}")
    return torch.randint(len(data) - block_size, (batch_size,), generator=generator)


class WindowBatches(OnDemandBatches):
    """One epoch of random-window batches, made on demand (:class:`OnDemandBatches`): batch
    ``i`` holds the start offsets of ``batch_size`` windows drawn uniformly (as
    :func:`random_windows` draws them) by a generator seeded with ``(seed, i)``. Shape of a
    batch: ``(batch_size,)`` long.

    Args:
        n_tokens: tokens of the split the windows are drawn from.
        steps: batches in the epoch.
        seed: an epoch's seed (from the run's seed and the epoch number).
    """

    def __init__(self, n_tokens: int, block_size: int, batch_size: int, steps: int, seed: int) -> None:
        if n_tokens <= block_size:
            raise QkvError(f"corpus of {n_tokens} tokens is too short for block_size {block_size}")
        self.n_tokens, self.block_size, self.batch_size = n_tokens, block_size, batch_size
        self.steps, self.seed = steps, seed

    def make(self, i: int) -> torch.Tensor:
        key = hashlib.blake2b(f"{self.seed},{i}".encode(), digest_size=8).digest()
        g = torch.Generator().manual_seed(int.from_bytes(key, "little"))
        return torch.randint(self.n_tokens - self.block_size, (self.batch_size,), generator=g)


def windows_at(data, offsets: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and next-token targets of the windows starting at ``offsets``.

    Shape: ``data (N,)`` (a long tensor, or a :class:`~qkv.data.shards.Split` read from
    disk), ``offsets (B,)`` → ``(x (B, block_size), y (B, block_size))`` with
    ``y[:, t] = x[:, t + 1]`` (the target of each position is the following token).
    """
    if isinstance(data, torch.Tensor):
        chunk = data[offsets[:, None] + torch.arange(block_size + 1)]  # (B, block_size + 1)
    else:
        chunk = data.windows(offsets, block_size + 1)
    return chunk[:, :-1], chunk[:, 1:]


def consecutive_windows(
    n_tokens: int, block_size: int, start: int = 0, count: int | None = None
) -> torch.Tensor:
    """Offsets of non-overlapping windows covering a split of ``n_tokens`` (every token
    predicted once, each with between 0 and ``block_size - 1`` tokens of context): a full pass
    for evaluation; ``start``/``count`` pick windows ``start .. start + count - 1`` of them.
    Shape: ``(n_windows,)`` long."""
    if n_tokens <= block_size:
        raise QkvError(f"split of {n_tokens} tokens is too short for block_size {block_size}")
    end = n_tokens - block_size
    first = start * block_size
    last = end if count is None else min(end, first + count * block_size)
    return torch.arange(first, last, block_size)


def num_windows(n_tokens: int, block_size: int) -> int:
    """How many windows :func:`consecutive_windows` covers a split of ``n_tokens`` with."""
    return len(range(0, n_tokens - block_size, block_size))


IGNORE_INDEX = -100  # F.cross_entropy's default ignore_index: targets at padding count for nothing


def sequence_batch(
    sequences: list[torch.Tensor], block_size: int, pad_id: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and next-token targets of whole sequences, each from position 0 (one sequence per
    row, as a model such as IgLM was trained), right-padded to the longest.

    Shape: ``sequences``: ``B`` long tensors ``(L_i,)``, each cut to its first
    ``block_size + 1`` tokens → ``(x (B, T), y (B, T))`` with ``T = max L_i - 1``,
    ``y[b, t] = x[b, t + 1]`` within a sequence and :data:`IGNORE_INDEX` at padding. Padding
    (``pad_id``: any id will do) comes after each sequence, so under a causal mask no real
    position sees it.

    Raises:
        QkvError: no sequences, or one shorter than 2 tokens (nothing to predict).
    """
    cut = [s[: block_size + 1] for s in sequences]
    if not cut or min(len(s) for s in cut) < 2:
        raise QkvError("every sequence needs at least 2 tokens (a token and the one after it)")
    width = max(len(s) for s in cut) - 1
    x = torch.full((len(cut), width), pad_id, dtype=torch.long)
    y = torch.full((len(cut), width), IGNORE_INDEX, dtype=torch.long)
    for row, s in enumerate(cut):
        x[row, : len(s) - 1] = s[:-1]
        y[row, : len(s) - 1] = s[1:]
    return x, y
