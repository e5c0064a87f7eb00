"""Readable token labels for attention pictures, and BPE pieces merged into words.

Subword tokenizers mark a word's first piece (``▁`` in qkv's sentence BPE, ``Ġ`` in GPT-2's
byte-level BPE); a picture labelled with raw pieces (``▁Fahr``, ``rad``) is hard to read, so
pieces are shown without the marker, continuation pieces with a leading ``##`` (BERT's
convention), and, by default, attention is summed over the pieces of each key word and averaged
over the pieces of each query word, which keeps every row a probability distribution.
"""

from __future__ import annotations

import unicodedata

import torch

WORD_MARKERS = ("▁", "Ġ")  # sentence BPE (Metaspace), GPT-2 byte-level BPE
_VISIBLE = {" ": "␣", "\n": "⏎", "\t": "⇥"}


def _is_punctuation(text: str) -> bool:
    return bool(text) and all(unicodedata.category(c)[0] in "PS" for c in text)


def _starts_word(piece: str, previous: str | None) -> bool:
    if previous is None or piece.startswith(WORD_MARKERS) or piece.startswith("<"):
        return True
    # Punctuation is split off by the pre-tokenizer: it is a word of its own, and so is
    # whatever follows it.
    return (
        _is_punctuation(piece)
        or _is_punctuation(previous.lstrip("".join(WORD_MARKERS)))
        or previous.startswith("<")
    )


def wordpiece_as_marked(pieces: list[str]) -> list[str]:
    """BERT's WordPiece marks a word's *continuation* pieces (``##ing``); the functions here
    expect the first piece marked (``▁``). Rewrite one convention into the other:
    ``[CLS] play ##ing`` → ``▁[CLS] ▁play ing``."""
    return [p[2:] if p.startswith("##") and len(p) > 2 else "▁" + p for p in pieces]


def piece_labels(pieces: list[str], subword: bool = True) -> list[str]:
    """Display labels of tokens: word markers removed, continuation pieces as ``##piece``,
    whitespace characters made visible (``␣``, ``⏎``). ``subword=False`` (characters, residues)
    only makes whitespace visible."""
    labels = []
    for i, piece in enumerate(pieces):
        if not subword:
            labels.append(_VISIBLE.get(piece, piece))
            continue
        text = piece.lstrip("".join(WORD_MARKERS)) or piece
        if not _starts_word(piece, pieces[i - 1] if i else None):
            text = "##" + text
        labels.append(text)
    return labels


def vocabulary_label(piece: str, subword: bool = True) -> str:
    """The display label of one piece of the vocabulary, out of any context (a logit lens
    entry): as :func:`piece_labels` shows it after a word, so a piece that continues a word
    reads ``##ing`` and one that starts a word reads ``the``."""
    return piece_labels(["▁a", piece], subword)[1]


def word_groups(pieces: list[str]) -> tuple[list[list[int]], list[str]]:
    """Group subword pieces into words.

    Returns ``(groups, labels)``: ``groups[j]`` lists the piece indices of word ``j`` (in order,
    covering every piece once); ``labels[j]`` is the word's text. Special tokens (``<eos>``) and
    punctuation are words of their own.
    """
    groups: list[list[int]] = []
    labels: list[str] = []
    for i, piece in enumerate(pieces):
        text = piece.lstrip("".join(WORD_MARKERS)) or piece
        if _starts_word(piece, pieces[i - 1] if i else None):
            groups.append([i])
            labels.append(text)
        else:
            groups[-1].append(i)
            labels[-1] += text
    return groups, labels


def merge_attention(
    weights: torch.Tensor, query_groups: list[list[int]], key_groups: list[list[int]]
) -> torch.Tensor:
    """Attention between words from attention between pieces.

    A key word receives the sum of the weights on its pieces; a query word's row is the mean
    of its pieces' rows. Each merged row therefore still sums to one (or zero for a fully
    masked row).

    Shape: ``weights (..., Tq, Tk)`` → ``(..., len(query_groups), len(key_groups))``.
    Raises ``ValueError`` if the groups do not cover the axes exactly.
    """
    tq, tk = weights.shape[-2:]
    for name, groups, n in (("query", query_groups, tq), ("key", key_groups, tk)):
        if sorted(i for g in groups for i in g) != list(range(n)):
            raise ValueError(f"{name} groups must cover positions 0..{n - 1} exactly once")
    keys = torch.stack([weights[..., g].sum(-1) for g in key_groups], -1)  # (..., Tq, Wk)
    return torch.stack([keys[..., g, :].mean(-2) for g in query_groups], -2)  # (..., Wq, Wk)
