"""Load a translation run directory and translate text (batched, length-sorted)."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from typing import Any

import torch

from .. import runs
from ..cpu_share import CpuShare
from ..data.batching import pad_sequences
from ..data.tokenizers import SubwordTokenizer
from ..errors import ConfigError
from ..runs.layout import WEIGHTS
from .search import Seq2SeqModel, beam_search, greedy_decode
from .stats import DecodeStats

# the recipes whose runs translate: the Transformer and its recurrent baseline
SEQ2SEQ_RECIPES = ("translation", "translation-rnn")


def load_run(
    run_dir: str | Path, weights: str = WEIGHTS, device: torch.device | str = "cpu"
) -> tuple[Seq2SeqModel, SubwordTokenizer]:
    """Model (eval mode) and tokenizer of a translation run (a Transformer or a recurrent
    baseline); see :func:`qkv.runs.load_run`."""
    return runs.load_run(run_dir, weights, device, family=SEQ2SEQ_RECIPES)


class Translator:
    """Translate sentences with a trained encoder-decoder (a :class:`~qkv.models.transformer.Transformer`
    or a :class:`~qkv.models.rnn.RNNSeq2Seq`).

    Args:
        model, tokenizer: as from :func:`load_run`.
        beam_size: 1 = greedy; alpha: length penalty (§6.1: 4 and 0.6).
            Raises :class:`~qkv.errors.ConfigError` for a beam outside 1..vocabulary size or
            an alpha that is negative or not finite.
        max_src_tokens: longer inputs are truncated with a warning (default: model max_len - 2).
        batch_size: sentences per decoding batch (speed and memory only: each sentence stops at
            its own length limit, so a translation does not depend on the batch).
            Raises :class:`~qkv.errors.ConfigError` for one that is not an integer >= 1.
        cpu: the caller's :class:`~qkv.cpu_share.CpuShare` (an entry point's), ticked between
            batches; ``None``: torch's thread count is left as the calling program set it.

    Attribute ``last_stats``: the :class:`~qkv.inference.stats.DecodeStats` of the latest
    :meth:`translate` call (``items`` = non-blank sentences, ``new_tokens`` = output pieces).
    """

    def __init__(
        self,
        model: Seq2SeqModel,
        tokenizer: SubwordTokenizer,
        beam_size: int = 4,
        alpha: float = 0.6,
        batch_size: int = 64,
        max_src_tokens: int | None = None,
        cpu: CpuShare | None = None,
    ) -> None:
        vocab = model.config.tgt_vocab_size
        assert vocab is not None  # Transformer.__init__ required it
        if not (isinstance(beam_size, int) and 1 <= beam_size <= vocab):
            raise ConfigError(
                f"beam size must be between 1 (greedy) and the vocabulary size {vocab} (got {beam_size})"
            )
        if not math.isfinite(alpha) or alpha < 0:
            raise ConfigError(f"length penalty alpha must be a finite number >= 0 (got {alpha})")
        check_batch_size(batch_size)
        self.model, self.tokenizer = model, tokenizer
        self.beam_size, self.alpha, self.batch_size = beam_size, alpha, batch_size
        self.cpu = cpu
        self.max_src_tokens = max_src_tokens or model.config.max_len - 2
        self.device = next(model.parameters()).device
        self.last_stats: DecodeStats | None = None

    @classmethod
    def from_run(cls, run_dir: str | Path, device: torch.device | str = "cpu", **kwargs: Any) -> Translator:
        return cls(*load_run(run_dir, device=device), **kwargs)

    def encode_sources(self, sentences: list[str]) -> list[list[int]]:
        """The source ids of ``sentences`` (no bos/eos), each cut to ``max_src_tokens`` with a
        warning; a sentence with characters the vocabulary lacks (read as ``<unk>``) is warned
        about, the characters named (:func:`unknown_characters_note`)."""
        ids = self.tokenizer.encode_batch(sentences)
        unknown = getattr(self.tokenizer, "unknown_characters", None)
        for i, s in enumerate(ids):
            if unknown is not None and getattr(self.tokenizer, "unk_id", None) in s:
                warnings.warn(
                    f"input line {i + 1}: {unknown_characters_note(unknown(sentences[i]))}", stacklevel=2
                )
            if len(s) > self.max_src_tokens:
                warnings.warn(
                    f"input line {i + 1} has {len(s)} subword tokens; truncated to the "
                    f"limit of {self.max_src_tokens}",
                    stacklevel=2,
                )
                ids[i] = s[: self.max_src_tokens]
        return ids

    @torch.no_grad()
    def translate(self, sentences: list[str]) -> list[str]:
        """Translations in input order; an empty (or blank) line translates to ``""``. Each
        translation is the same whatever the other sentences and ``batch_size``
        (:meth:`translate_ids`)."""
        stats = DecodeStats()
        ids = self.encode_sources(sentences)
        todo = [i for i in range(len(ids)) if sentences[i].strip()]
        hyps = self.translate_ids([ids[i] for i in todo])
        out: list[str] = [""] * len(ids)
        for i, text in zip(todo, self.tokenizer.decode_batch(hyps), strict=True):
            out[i] = text
        stats.items, stats.new_tokens = len(todo), sum(len(h) for h in hyps)
        self.last_stats = stats.stop()
        return out

    @torch.no_grad()
    def translate_ids(self, sources: list[list[int]]) -> list[list[int]]:
        """The translation ids (no bos/eos) of source ids (no eos), in input order.

        Decodes ``batch_size`` sentences at a time, the shortest together (less padding), each
        source followed by ``eos`` as in training. Each sentence stops at its own length limit,
        its source + eos + 50 pieces capped at the model's ``max_len`` (§6.1; see
        :func:`~qkv.inference.search.greedy_decode`), so its translation does not depend on
        the batch it is decoded in.

        Raises:
            ValueError: an id outside the source vocabulary, or a source longer than
                ``max_len - 1`` pieces.
        """
        cfg = self.model.config
        order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
        out: list[list[int]] = [[] for _ in sources]
        for start in range(0, len(order), self.batch_size):
            chunk = order[start : start + self.batch_size]
            src = pad_sequences([sources[i] + [cfg.eos_id] for i in chunk], cfg.pad_id).to(self.device)
            if self.beam_size == 1:
                hyps = greedy_decode(self.model, src)
            else:
                hyps = beam_search(self.model, src, self.beam_size, self.alpha)
            for i, hyp in zip(chunk, hyps, strict=True):
                out[i] = hyp
            if self.cpu is not None:
                self.cpu.tick(1)
        return out


def run_decoding_of(
    settings: dict, beam_size: int | None = None, alpha: float | None = None
) -> tuple[int, float]:
    """``(beam_size, alpha)``: the ones given, else those a translation run's settings (its
    ``train_config.json``) decode its test with: 4 and 0.6 (§6.1) for a run that names none.
    ``qkv translate``, ``qkv evaluate`` and the explainer all decode a run this way."""
    return (
        settings.get("beam_size", 4) if beam_size is None else beam_size,
        settings.get("alpha", 0.6) if alpha is None else alpha,
    )


def unknown_characters_note(chars: list[str]) -> str:
    """How ``qkv translate``, the served page and the live page name characters a
    translator's vocabulary lacks: ``unknown characters (not in the model's vocabulary, read as
    <unk>): "😀", "中"`` (each as a JSON string, so a tab or a space is visible)."""
    shown = ", ".join(json.dumps(c, ensure_ascii=False) for c in chars)
    return f"unknown characters (not in the model's vocabulary, read as <unk>): {shown}"


def check_batch_size(batch_size: object, name: str = "batch size") -> int:
    """``batch_size`` if it is an integer >= 1 (sentences decoded together).

    Raises:
        ConfigError: anything else, in one line naming ``name`` (the CLI passes its option).
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"{name} must be an integer >= 1 (got {batch_size!r})")
    return batch_size
