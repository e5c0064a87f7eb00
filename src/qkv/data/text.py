"""Plain-text corpora for language modelling, and the windows a model trains on.

Self-supervised labels ("cook up 'labels' (prediction targets) from the unlabeled texts",
lecture notes): the target of position t is the token at t + 1. The default corpus is
tiny-shakespeare (Karpathy's char-rnn), split as nanoGPT does: first 90 % of the characters for
training, last 10 % for validation.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..errors import QkvError
from .files import find_data_file

TINY_SHAKESPEARE_URL = (
    "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
)
TINY_SHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"


def load_corpus(name: str) -> str:
    """Text of a corpus: ``"tinyshakespeare"`` (data dir, cache or verified download) or the
    path of a UTF-8 text file.

    Raises:
        QkvError: the file is missing, unreadable, not UTF-8, or empty.
    """
    if name == "tinyshakespeare":
        path = find_data_file("tinyshakespeare", "input.txt", TINY_SHAKESPEARE_URL, TINY_SHAKESPEARE_SHA256)
    else:
        path = Path(name)
        if not path.is_file():
            raise QkvError(f"corpus {name!r} is neither 'tinyshakespeare' nor an existing text file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise QkvError(f"corpus {path} is not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise QkvError(f"cannot read corpus {path}: {exc}") from None
    if not text:
        raise QkvError(f"corpus {path} is empty")
    return text


def split_train_val(text: str, val_fraction: float = 0.1) -> tuple[str, str]:
    """First ``1 - val_fraction`` of the characters for training, the rest for validation
    (nanoGPT's ``prepare.py`` split, so numbers compare)."""
    if not 0.0 < val_fraction < 1.0:
        raise QkvError(f"val_fraction ({val_fraction}) must be in (0, 1)")
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


def windows_at(
    data: torch.Tensor, offsets: torch.Tensor, block_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and next-token targets of the windows starting at ``offsets``.

    Shape: ``data (N,)``, ``offsets (B,)`` → ``(x (B, block_size), y (B, block_size))`` with
    ``y[:, t] = x[:, t + 1]`` (the target of each position is the following token).
    """
    idx = offsets[:, None] + torch.arange(block_size + 1)  # (B, block_size + 1)
    chunk = data[idx]
    return chunk[:, :-1], chunk[:, 1:]


def consecutive_windows(data: torch.Tensor, block_size: int) -> torch.Tensor:
    """Offsets of non-overlapping windows covering ``data`` (every token predicted once, each
    with between 0 and ``block_size - 1`` tokens of context): a full pass over a split for
    evaluation. Shape: ``(n_windows,)`` long."""
    if len(data) <= block_size:
        raise QkvError(f"split of {len(data)} tokens is too short for block_size {block_size}")
    return torch.arange(0, len(data) - block_size, block_size)


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
