"""Greedy decoding and beam search for the encoder-decoder, batched, with the KV cache.

Source: Vaswani et al. 2017, §6.1: "beam search with a beam size of 4 and length penalty
α = 0.6 ... maximum output length ... input length + 50, but terminate early when possible".
The length penalty is GNMT's lp(Y) = ((5 + |Y|) / 6)^α (Wu et al. 2016).
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


def _start(model: Seq2SeqModel, src: torch.Tensor, max_new_tokens: int | None, extra: int):
    if src.is_floating_point():  # pixels (a captioner): no ids to check, no source length
        memory, src_mask, _ = model.encode(src)
        # bos + the caption fit max_len, so its attention can be recomputed in one pass
        longest = model.config.max_len - 1
        return memory, src_mask, longest if max_new_tokens is None else min(max_new_tokens, longest)
    # Check the user's ids and length once here: the model's forward does not (no host syncs).
    if src.dim() != 2 or src.size(1) > model.config.max_len:
        raise ValueError(
            f"src must have shape (batch, seq_len) with seq_len <= max_len "
            f"({model.config.max_len}), got {tuple(src.shape)}"
        )
    assert model.config.src_vocab_size is not None  # the model's __init__ required it
    check_token_ids(src, model.config.src_vocab_size)
    memory, src_mask, _ = model.encode(src)
    src_len = (src != model.config.pad_id).sum(1)
    limit = int(src_len.max()) + extra if max_new_tokens is None else max_new_tokens
    limit = min(limit, model.config.max_len)
    return memory, src_mask, limit


@torch.no_grad()
def greedy_decode(
    model: Seq2SeqModel, src: torch.Tensor, max_new_tokens: int | None = None, extra_len: int = 50
) -> list[list[int]]:
    """Pick the most probable next token until ``eos`` (or the length limit).

    Shape: ``src (B, S)`` long, right-padded (a captioner's: pixels ``(B, C, H, W)`` float,
    limit ``max_new_tokens`` or its ``max_len``). Returns B lists of ids (no bos/eos).
    The limit is ``max_new_tokens``, else the longest source + ``extra_len`` (§6.1), capped at
    the model's ``max_len``. Raises ``ValueError`` for an id outside the source vocabulary or
    ``S > max_len``.
    """
    cfg = model.config
    memory, src_mask, limit = _start(model, src, max_new_tokens, extra_len)
    b = src.size(0)
    caches = model.new_caches()
    token = torch.full((b, 1), cfg.bos_id, dtype=torch.long, device=src.device)
    out = torch.full((b, limit), cfg.pad_id, dtype=torch.long, device=src.device)
    done = torch.zeros(b, dtype=torch.bool, device=src.device)
    for t in range(limit):
        logits, _, _ = model.decode(token, memory, src_mask, caches=caches, start_pos=t)
        token = logits[:, -1].argmax(-1, keepdim=True)  # (B, 1)
        out[:, t] = token[:, 0].masked_fill(done, cfg.pad_id)
        done |= token[:, 0] == cfg.eos_id
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

    Shape: ``src (B, S)`` long (a captioner's: pixels ``(B, C, H, W)``). Raises ``ValueError``
    (:class:`~qkv.errors.ConfigError` for ``beam_size < 1``) for a bad beam size, an id
    outside the source vocabulary or ``S > max_len``.
    """
    if beam_size < 1:
        raise ConfigError(f"beam_size ({beam_size}) must be >= 1")
    cfg = model.config
    memory, src_mask, limit = _start(model, src, max_new_tokens, extra_len)
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
    for t in range(limit):
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


def _winners(
    finished: list[list[tuple[float, list[int]]]], scores: torch.Tensor, seqs: torch.Tensor, alpha: float
) -> list[list[int]]:
    """Each sentence's best finished hypothesis, or, for one that hit the length limit
    unfinished, its best live beam (``scores (B, K)``, ``seqs (B*K, T)``)."""
    k = scores.size(1)
    results = []
    for bi in range(len(finished)):
        pool = finished[bi]
        if not pool:  # hit the length limit: fall back to live beams
            pool = [
                (float(scores[bi, j]) / length_penalty(seqs.size(1), alpha), seqs[bi * k + j].tolist())
                for j in range(k)
            ]
        results.append(max(pool, key=lambda x: x[0])[1])
    return results
