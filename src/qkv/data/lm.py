"""A language model's corpus: its training and validation text, encoded as token ids, in
batches of windows (a stream) or whole sequences (one per line, a protein vocabulary's).

What ``qkv train lm`` and ``qkv evaluate`` of its runs read (nanoGPT's split: the last
``val_fraction`` of the characters is validation).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TypeAlias

import torch

from ..errors import QkvError
from .shards import Split
from .text import (
    WindowBatches,
    consecutive_windows,
    load_corpus,
    num_windows,
    sequence_batch,
    split_train_val,
    windows_at,
)
from .tokenizers import CharTokenizer, SubwordTokenizer


def build_tokenizer(
    kind: str, vocab_size: int, text: str, train_text: str
) -> CharTokenizer | SubwordTokenizer:
    """A new vocabulary for a corpus: ``kind`` ``"char"`` (every character of ``text``), else a
    byte-level BPE of ``vocab_size`` pieces trained on ``train_text``."""
    if kind == "char":
        return CharTokenizer.train(text)  # nanoGPT's vocabulary: every character of the corpus
    # Byte-level BPE keeps newlines and spacing; it sees paragraphs, so merges stay within them.
    return SubwordTokenizer.train(train_text.split("\n\n"), vocab_size, byte_level=True)


def corpus_splits(
    corpus: str, val_corpus: str | None, val_fraction: float, by_line: bool = False
) -> tuple[str, str]:
    """``(training text, validation text)``: ``val_corpus`` when given, else the last
    ``val_fraction`` of ``corpus``'s characters (nanoGPT's split), moved to the next line break
    when the corpus is read ``by_line`` (one sequence per line: no sequence is cut in two).
    Raises :class:`QkvError` for a missing, unreadable or empty file."""
    text = load_corpus(corpus)
    if val_corpus is not None:
        return text, load_corpus(val_corpus)
    train_text, val_text = split_train_val(text, val_fraction)
    if by_line and "\n" in val_text:
        cut = len(train_text) + val_text.index("\n") + 1
        train_text, val_text = text[:cut], text[cut:]
    return train_text, val_text


def reads_lines(tok) -> bool:
    """Whether :func:`encode_corpus` reads a corpus one sequence per line with ``tok``: a
    protein vocabulary's (IgLM's)."""
    return bool(getattr(tok, "is_residue_vocabulary", False))


# a corpus as token ids: one stream ``(n,)`` in memory or on disk, or one tensor ``(L_i,)`` per sequence
LMData: TypeAlias = torch.Tensor | Split | list[torch.Tensor]


def end_token(tok) -> int:
    """The token that closes a sequence read one per line: the vocabulary's ``[SEP]`` (how IgLM
    scores a whole sequence), else its end token, else the newline."""
    for name in ("sep_id", "eos_id"):
        if getattr(tok, name, None) is not None:
            return getattr(tok, name)
    return tok.encode("\n")[0]


def encode_corpus(tok, text: str, by_line: bool | None = None) -> LMData:
    """Token ids (int64) of a corpus. Read ``by_line`` (default: with a protein vocabulary,
    IgLM's), every line is one sequence, tags included (``[HEAVY] [HUMAN] EVQLV...``), followed
    by :func:`end_token`, and the result is one tensor per sequence: such a model was trained on
    one sequence per row from position 0, and is trained and scored so
    (:func:`~qkv.data.text.sequence_batch`). Otherwise the text is one stream ``(n,)``,
    newlines included, cut into windows.

    Raises:
        QkvError: characters the tokenizer does not know: a character vocabulary names them; a
            pretrained vocabulary's unknown token is refused too (the model would learn from a
            token that stands for anything).
    """
    rows = None
    if reads_lines(tok) if by_line is None else by_line:
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        end = end_token(tok)
        rows = [[*row, end] for row in tok.encode_batch(lines, add_special_tokens=False)]
        ids = [i for row in rows for i in row]
    else:
        ids = tok.encode(text, add_special_tokens=False)
    unk = getattr(tok, "unk_id", None)
    if unk is not None and unk in ids:
        raise QkvError(
            f"{ids.count(unk)} token(s) are unknown to the tokenizer ({tok.id_to_token(unk)}), the "
            f"first at token {ids.index(unk)}"
        )
    if rows is not None:
        return [torch.tensor(row, dtype=torch.long) for row in rows]
    return torch.tensor(ids, dtype=torch.long)


def num_tokens(data: LMData) -> int:
    """Tokens in an encoded corpus (:func:`encode_corpus`), end tokens included."""
    return sum(len(s) for s in data) if isinstance(data, list) else len(data)


def lm_batch(data: LMData, item: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x, y)`` ``(B, T)`` of one batch: ``item`` holds window offsets into a stream
    (:func:`~qkv.data.text.windows_at`, ``T = block_size``) or indices of sequences
    (:func:`~qkv.data.text.sequence_batch`, ``T`` up to ``block_size``, padding targets
    :data:`~qkv.data.text.IGNORE_INDEX`)."""
    if isinstance(data, list):
        return sequence_batch([data[i] for i in item.tolist()], block_size)
    return windows_at(data, item, block_size)


def _shortest_first(data: list[torch.Tensor], batch: int) -> Iterator[torch.Tensor]:
    """Indices of every sequence, shortest first (little padding), ``batch`` at a time."""
    order = torch.tensor(sorted(range(len(data)), key=lambda i: len(data[i])), dtype=torch.long)
    yield from order.split(batch)


def eval_batches(data: LMData, block_size: int, batch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """``(x, y)`` batches that predict every token of a split once: consecutive windows of a
    stream (made batch by batch: a split on disk is never held whole), or whole sequences
    (shortest first, little padding), ``batch`` at a time."""
    if isinstance(data, list):
        for item in _shortest_first(data, batch):
            yield lm_batch(data, item, block_size)
        return
    for start in range(0, num_windows(len(data), block_size), batch):
        yield lm_batch(data, consecutive_windows(len(data), block_size, start, batch), block_size)


def check_stream(name: str, n_tokens: int, max_len: int) -> None:
    """Raise :class:`QkvError` unless a split of ``n_tokens`` holds a window of ``max_len``."""
    if n_tokens <= max_len:
        raise QkvError(
            f"the {name} split has {n_tokens} tokens, too few for windows of model.max_len "
            f"{max_len} (a longer corpus, or a smaller model.max_len)"
        )


def encode_splits(
    tok, train_text: str, val_text: str, max_len: int, by_line: bool | None = None
) -> tuple[LMData, LMData]:
    """Both splits encoded (:func:`encode_corpus`, ``by_line``) and checked: a stream must hold
    a window of ``max_len``, a corpus of sequences at least one sequence.

    Raises:
        QkvError: unknown characters (:func:`encode_corpus`), or a split too short (named).
    """
    train_data, val_data = encode_corpus(tok, train_text, by_line), encode_corpus(tok, val_text, by_line)
    for name, data in (("training", train_data), ("validation", val_data)):
        if isinstance(data, list):
            if not data:
                raise QkvError(f"the {name} split has no sequences (one per line)")
        else:
            check_stream(name, len(data), max_len)
    return train_data, val_data


def train_batches(data: LMData, batch_size: int, block_size: int, seed: int) -> Sequence[torch.Tensor]:
    """One epoch's batches (the items :func:`lm_batch` takes), fixed by ``seed`` so a resumed run
    sees the same ones. Sequences: each once, shuffled, ``batch_size`` a batch; a stream: as many
    random windows of ``block_size`` as the split has tokens, made on demand."""
    if isinstance(data, list):
        g = torch.Generator().manual_seed(seed)
        return list(torch.randperm(len(data), generator=g).split(batch_size))
    steps = max(1, len(data) // (batch_size * block_size))
    return WindowBatches(len(data), block_size, batch_size, steps, seed)


def masked_rows(
    data: LMData, item: torch.Tensor, block_size: int
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(x0 (B, T), valid)`` of one batch for a masked (diffusion) LM, which reads whole rows
    rather than (input, next token) pairs: the windows of :func:`lm_batch` (``T =
    block_size``, ``valid`` ``None``), or whole sequences cut to ``block_size`` tokens and
    right-padded with id 0, ``valid (B, T)`` bool ``False`` at padding."""
    if not isinstance(data, list):
        return lm_batch(data, item, block_size)[0], None
    rows = [data[i][:block_size] for i in item.tolist()]
    x = torch.zeros(len(rows), max(len(r) for r in rows), dtype=torch.long)
    valid = torch.zeros(x.shape, dtype=torch.bool)
    for b, r in enumerate(rows):
        x[b, : len(r)], valid[b, : len(r)] = r, True
    return x, valid


def eval_rows(
    data: LMData, block_size: int, batch: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor | None]]:
    """:func:`masked_rows` batches that cover a split once: consecutive windows of a stream
    (the inputs of :func:`eval_batches`' windows), or every sequence, shortest first."""
    if isinstance(data, list):
        for item in _shortest_first(data, batch):
            yield masked_rows(data, item, block_size)
        return
    for x, _ in eval_batches(data, block_size, batch):
        yield x, None
