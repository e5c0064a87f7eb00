"""Greedy decoding and beam search for the encoder-decoder, batched, with the KV cache.

Source: Vaswani et al. 2017, §6.1: "beam search with a beam size of 4 and length penalty
α = 0.6 ... maximum output length ... input length + 50, but terminate early when possible".
The length penalty is GNMT's lp(Y) = ((5 + |Y|) / 6)^α (Wu et al. 2016). The input length
is each sentence's own, so a batch decodes every sentence as it would decode alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

import torch
from torch import nn

from ..errors import ConfigError
from ..nn.embeddings import check_token_ids


class Seq2SeqModel(Protocol):
    """What decoding needs of an encoder-decoder: a ``config`` with ``max_len``, the vocabulary
    sizes and the ``pad_id``/``bos_id``/``eos_id``, ``encode``, ``decode`` with caches, and
    ``new_caches`` whose first items beam search reorders.
    :class:`~qkv.models.transformer.Transformer`, :class:`~qkv.models.rnn.RNNSeq2Seq` and the
    captioner :class:`~qkv.models.caption.CaptionModel` have them (the captioner's source is
    float pixels ``(B, C, H, W)``; its memory mask is ``None``)."""

    config: Any

    def encode(
        self, src: torch.Tensor, need_weights: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None, tuple]: ...

    def decode(
        self,
        tgt: torch.Tensor,
        memory: torch.Tensor,
        src_mask: torch.Tensor | None,
        caches: Any = None,
        start_pos: int = 0,
        need_weights: bool = False,
    ) -> tuple[torch.Tensor, tuple, tuple]: ...

    def new_caches(self) -> list: ...

    def parameters(self) -> Iterator[nn.Parameter]: ...


def _start(
    model: Seq2SeqModel, src: torch.Tensor, max_new_tokens: int | None, extra: int
) -> tuple[torch.Tensor, torch.Tensor | None, list[int]]:
    """The encoder's memory and source mask, and each row's own length limit (see
    :func:`greedy_decode`): ``memory (B, S, D)``, ``src_mask`` (``None`` for a captioner),
    ``limits`` B ints."""
    if max_new_tokens is not None and max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0 (got {max_new_tokens})")
    cap = model.config.max_len if max_new_tokens is None else min(max_new_tokens, model.config.max_len)
    if src.is_floating_point():  # pixels (a captioner): no ids to check, no source length
        memory, src_mask, _ = model.encode(src)
        # bos + the caption fit max_len, so its attention can be recomputed in one pass
        return memory, src_mask, [min(cap, model.config.max_len - 1)] * src.size(0)
    # Check the user's ids and length once here: the model's forward does not (no host syncs).
    if src.dim() != 2 or src.size(1) > model.config.max_len:
        raise ValueError(
            f"src must have shape (batch, seq_len) with seq_len <= max_len "
            f"({model.config.max_len}), got {tuple(src.shape)}"
        )
    assert model.config.src_vocab_size is not None  # the model's __init__ required it
    check_token_ids(src, model.config.src_vocab_size)
    memory, src_mask, _ = model.encode(src)
    # A row's own length, padding not counted: a batch's longest source must not lengthen the
    # others' limit, or a sentence's translation would depend on its neighbours.
    src_lens = (src != model.config.pad_id).sum(1).tolist()
    return memory, src_mask, [min(n + extra, cap) for n in src_lens]


@torch.no_grad()
def greedy_decode(
    model: Seq2SeqModel, src: torch.Tensor, max_new_tokens: int | None = None, extra_len: int = 50
) -> list[list[int]]:
    """Pick the most probable next token until ``eos`` or the sentence's length limit.

    Shape: ``src (B, S)`` long, right-padded with ``pad_id`` (a captioner's: pixels
    ``(B, C, H, W)`` float). Returns B lists of at most that row's limit ids (no bos/eos).

    Each row has its own limit (§6.1: "maximum output length ... input length + 50, but
    terminate early when possible", the input being that sentence): its source length (its
    tokens other than ``pad_id``, the ``eos`` included) + ``extra_len``, or ``max_new_tokens``
    if smaller, and never more than the model's ``max_len``; a captioner's is ``max_new_tokens``
    or ``max_len - 1``. A row stops at its ``eos`` or its limit while the others go on, so a
    sentence decodes the same alone or in any batch.

    Raises:
        ValueError: an id outside the source vocabulary, ``S > max_len`` or a negative
            ``max_new_tokens``.
    """
    cfg = model.config
    memory, src_mask, limits = _start(model, src, max_new_tokens, extra_len)
    b, longest = src.size(0), max(limits, default=0)
    row_limit = torch.tensor(limits, device=src.device)  # (B,)
    caches = model.new_caches()
    token = torch.full((b, 1), cfg.bos_id, dtype=torch.long, device=src.device)
    out = torch.full((b, longest), cfg.pad_id, dtype=torch.long, device=src.device)
    done = torch.zeros(b, dtype=torch.bool, device=src.device)
    for t in range(longest):
        logits, _, _ = model.decode(token, memory, src_mask, caches=caches, start_pos=t)
        token = logits[:, -1].argmax(-1, keepdim=True)  # (B, 1)
        out[:, t] = token[:, 0].masked_fill(done, cfg.pad_id)
        done |= (token[:, 0] == cfg.eos_id) | (row_limit <= t + 1)
        if bool(done.all()):
            break
    return [strip_special(row, cfg.eos_id, cfg.pad_id) for row in out.tolist()]


def strip_special(ids: list[int], eos_id: int, pad_id: int) -> list[int]:
    """A decoded row without its end: the ids before the first ``eos``, padding dropped."""
    if eos_id in ids:
        ids = ids[: ids.index(eos_id)]
    return [i for i in ids if i != pad_id]


def length_penalty(length: int, alpha: float) -> float:
    """GNMT length penalty ((5 + length) / 6)^α; α = 0 disables it."""
    return ((5.0 + length) / 6.0) ** alpha


@torch.no_grad()
def beam_search(
    model: Seq2SeqModel,
    src: torch.Tensor,
    beam_size: int = 4,
    alpha: float = 0.6,
    max_new_tokens: int | None = None,
    extra_len: int = 50,
) -> list[list[int]]:
    """Batched beam search; returns the best hypothesis per sentence (ids, no bos/eos).

    Each step expands every live beam, keeps the ``2·beam_size`` best candidates, moves those
    ending in ``eos`` (among the top ``beam_size``) to the finished list, and continues the
    ``beam_size`` best others. A sentence keeps its ``beam_size`` best finished hypotheses and is
    done once it holds that many and its best live beam scores no better than the worst of them
    (scored at the current length, as in Hugging Face's ``BeamSearchScorer``); the winner
    maximises log p(Y|X) / lp(Y). ``beam_size=1`` equals greedy decoding.

    Each sentence has its own length limit, as in :func:`greedy_decode` (its source length +
    ``extra_len``, or ``max_new_tokens`` if smaller, never past ``max_len``; §6.1): at it, the
    sentence ends with the hypotheses it has (its best live beam if none finished) while the
    others go on, so a sentence decodes the same alone or in any batch.

    Shape: ``src (B, S)`` long, right-padded with ``pad_id`` (a captioner's: pixels
    ``(B, C, H, W)``). Returns B lists of ids.

    Raises:
        ConfigError: ``beam_size < 1``.
        ValueError: an id outside the source vocabulary, ``S > max_len`` or a negative
            ``max_new_tokens``.
    """
    if beam_size < 1:
        raise ConfigError(f"beam_size ({beam_size}) must be >= 1")
    cfg = model.config
    memory, src_mask, limits = _start(model, src, max_new_tokens, extra_len)
    b, k, device = src.size(0), beam_size, src.device
    memory = memory.repeat_interleave(k, dim=0)  # (B*K, S, D)
    if src_mask is not None:  # a captioner's patches are all real: no mask
        src_mask = src_mask.repeat_interleave(k, dim=0)
    caches = model.new_caches()
    scores = torch.zeros(b, k, device=device)
    scores[:, 1:] = float("-inf")  # all beams start identical: keep one
    seqs = torch.full((b * k, 0), cfg.pad_id, dtype=torch.long, device=device)
    token = torch.full((b * k, 1), cfg.bos_id, dtype=torch.long, device=device)
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(b)]
    base = (torch.arange(b, device=device) * k)[:, None]  # (B, 1)
    done = [False] * b
    for t in range(max(limits, default=0)):
        logits, _, _ = model.decode(token, memory, src_mask, caches=caches, start_pos=t)
        logp = torch.log_softmax(logits[:, -1].float(), dim=-1)  # (B*K, V)
        vocab = logp.size(-1)
        cand = (scores.view(-1, 1) + logp).view(b, k * vocab)
        top_scores, top_idx = cand.topk(min(2 * k, k * vocab), dim=-1)  # (B, 2K)
        beam_idx, tok = top_idx // vocab, top_idx % vocab
        is_eos = tok == cfg.eos_id
        # The host reads the step's results at most twice (finished hypotheses, then the best
        # live scores that decide when a sentence is done), not once per sentence and beam.
        _keep_finished(finished, done, is_eos[:, :k], top_scores, base, beam_idx, seqs, alpha)
        live_scores = top_scores.masked_fill(is_eos, float("-inf"))
        scores, pick = live_scores.topk(k, dim=-1)  # (B, K)
        _mark_done(finished, done, scores[:, 0].tolist(), k, t, alpha)
        if all(done):
            break
        rows = (base + beam_idx.gather(1, pick)).view(-1)  # (B*K,) rows of the previous step
        token = tok.gather(1, pick).view(-1, 1)
        seqs = torch.cat([seqs.index_select(0, rows), token], dim=1)
        for self_cache, _cross_cache in caches:  # a sentence's beams share one source: no reorder
            self_cache.reorder(rows)
        _stop_at_limit(finished, done, limits, scores, seqs, alpha)
        if all(done):
            break
    return [strip_special(best, cfg.eos_id, cfg.pad_id) for best in _winners(finished, scores, seqs, alpha)]


def _keep_finished(
    finished: list[list[tuple[float, list[int]]]],
    done: list[bool],
    is_eos: torch.Tensor,
    top_scores: torch.Tensor,
    base: torch.Tensor,
    beam_idx: torch.Tensor,
    seqs: torch.Tensor,
    alpha: float,
) -> None:
    """Add to ``finished`` each candidate among a sentence's top ``K`` that ends in ``eos``
    (``is_eos (B, K)``), scored ``log p / lp``, unless its sentence is done or it is impossible.

    Shape: ``top_scores (B, 2K)``, ``beam_idx (B, 2K)`` (each candidate's beam), ``base (B, 1)``
    (each sentence's first row), ``seqs (B*K, T)``."""
    hits = is_eos.nonzero().tolist()
    if hits:
        hit_scores, hit_rows = top_scores.tolist(), (base + beam_idx).tolist()
        for bi, ci in hits:
            if not done[bi] and hit_scores[bi][ci] > float("-inf"):
                hyp = seqs[hit_rows[bi][ci]].tolist()
                finished[bi].append((hit_scores[bi][ci] / length_penalty(len(hyp) + 1, alpha), hyp))


def _mark_done(
    finished: list[list[tuple[float, list[int]]]],
    done: list[bool],
    best_live: list[float],
    k: int,
    t: int,
    alpha: float,
) -> None:
    """Keep each sentence's ``k`` best finished hypotheses, and mark it done once it holds
    ``k`` and its best live score ``best_live`` (at step ``t``'s length) beats none of them."""
    for bi in range(len(finished)):
        # Done only when no live beam beats the worst kept finished hypothesis: stopping at
        # beam_size finished ones would let junk beams end the search before the best one.
        finished[bi] = sorted(finished[bi], key=lambda x: x[0], reverse=True)[:k]
        if (
            not done[bi]
            and len(finished[bi]) >= k
            and best_live[bi] / length_penalty(t + 1, alpha) <= finished[bi][-1][0]
        ):
            done[bi] = True


def _live_pool(
    bi: int, scores: torch.Tensor, seqs: torch.Tensor, alpha: float
) -> list[tuple[float, list[int]]]:
    """Sentence ``bi``'s live beams as scored hypotheses (``scores (B, K)``, ``seqs (B*K, T)``),
    each ``log p / lp(T)``."""
    k = scores.size(1)
    penalty = length_penalty(seqs.size(1), alpha)
    return [(s / penalty, seqs[bi * k + j].tolist()) for j, s in enumerate(scores[bi].tolist())]


def _stop_at_limit(
    finished: list[list[tuple[float, list[int]]]],
    done: list[bool],
    limits: list[int],
    scores: torch.Tensor,
    seqs: torch.Tensor,
    alpha: float,
) -> None:
    """Mark done each sentence whose live beams ``seqs (B*K, T)`` have reached its own limit
    (``limits[bi] == T``); one without a finished hypothesis keeps its live beams
    (``scores (B, K)``) as its finished ones, so that it ends as it would alone."""
    for bi, limit in enumerate(limits):
        if not done[bi] and limit == seqs.size(1):
            done[bi] = True
            if not finished[bi]:
                finished[bi] = _live_pool(bi, scores, seqs, alpha)


def _winners(
    finished: list[list[tuple[float, list[int]]]], scores: torch.Tensor, seqs: torch.Tensor, alpha: float
) -> list[list[int]]:
    """Each sentence's best finished hypothesis, or, for one without any (a length limit of
    0), its best live beam (``scores (B, K)``, ``seqs (B*K, T)``)."""
    return [
        max(finished[bi] or _live_pool(bi, scores, seqs, alpha), key=lambda x: x[0])[1]
        for bi in range(len(finished))
    ]
