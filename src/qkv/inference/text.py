"""A text encoder as an inference API: sentences in, embeddings, similarities, search results or
class probabilities out. Beside :class:`~qkv.inference.protein.ProteinEncoder`.

Sentence embeddings follow sentence-transformers (Reimers & Gurevych 2019): the mean of the
final hidden states over real tokens, L2-normalised, so a dot product is the cosine similarity.
Inputs longer than the model's context are cut to their first ``max_len`` tokens (as
sentence-transformers does), with a warning.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch

from ..data.batching import pad_sequences, token_batches
from ..errors import QkvError
from ..models.encoder import EncoderModel, masked_mean
from ..models.model_types import ENCODER, built_as
from ..runs import run_json
from ..runs.layout import TASK
from .weight_layout import prepare_for_inference

logger = logging.getLogger(__name__)


class TextEncoder:
    """An :class:`EncoderModel` with its tokenizer (an
    :class:`~qkv.data.tokenizers.HFTokenizer`), on ``device``; ``classes`` names the sequence
    head's outputs (empty for a model without a trained head).

    Raises (every method): :class:`QkvError` for an empty input list or a non-string item.
    """

    def __init__(
        self,
        model: EncoderModel,
        tokenizer,
        device: torch.device | str = "cpu",
        classes: tuple[str, ...] = (),
        max_tokens: int = 8192,
    ) -> None:
        if tokenizer.pad_id is None:
            raise QkvError("the tokenizer has no padding token; a text encoder needs one")
        self.model, self.tokenizer, self.classes = model.to(device).eval(), tokenizer, tuple(classes)
        self.device, self.max_tokens = torch.device(device), max_tokens

    @classmethod
    def load(
        cls, name_or_path: str | Path, device: torch.device | str = "cpu", revision: str | None = None
    ) -> TextEncoder:
        """A run directory (a converted encoder or a ``text-cls`` run), an HF folder, a
        pretrained short name (``minilm``) or a Hub name (``sentence-transformers/all-MiniLM-L6-v2``;
        ``revision``: its branch, tag or commit), through :func:`qkv.hub.pretrained.load`.

        Raises:
            QkvError: what :func:`~qkv.hub.pretrained.load` raises, or a model that is not a
                text encoder."""
        from ..hub.pretrained import load

        model, tokenizer = load(name_or_path, device, revision)
        if not built_as(model, ENCODER) or getattr(tokenizer, "kind", None) != "hf":
            raise QkvError(
                f"{name_or_path} is not a pretrained text encoder (a BERT-style model with its own tokenizer)"
            )
        prepare_for_inference(model.eval(), batch_rows=4096)  # inference only: pack for batched products
        task = run_json(name_or_path, TASK, missing={})
        classes = task["classes"] if task else ()
        return cls(model, tokenizer, device, classes)

    def rows(self, texts: list[str], max_len: int | None = None, warn: bool = True) -> list[list[int]]:
        """Token ids of each text (with the model's specials), cut to ``max_len`` tokens (default
        the model's context) keeping the final special token; a cut is logged as a warning
        when ``warn``.

        Raises:
            QkvError: no texts, a text that is not a string, or one that is empty or only
                white space (named by its 1-based position).
        """
        if not texts:
            raise QkvError("no input texts")
        bad = next((i for i, t in enumerate(texts) if not isinstance(t, str)), None)
        if bad is not None:
            raise QkvError(f"input {bad + 1} is a {type(texts[bad]).__name__}, not a string")
        empty = next((i for i, t in enumerate(texts) if not t.strip()), None)
        if empty is not None:  # it would be encoded as the special tokens alone: a meaningless vector
            raise QkvError(
                f"input {empty + 1} is empty"
                + (" (only white space)" if texts[empty] else "")
                + ": give some text"
            )
        rows = self.tokenizer.encode_batch(list(texts))
        limit = min(max_len or self.model.config.max_len, self.model.config.max_len)
        long = [i for i, r in enumerate(rows) if len(r) > limit]
        if long and warn:
            logger.warning(
                f"{len(long)} input(s) longer than the model's {limit} tokens were cut "
                f"(the first is input {long[0] + 1})"
            )
        return [r[: limit - 1] + r[-1:] if len(r) > limit else r for r in rows]

    def _batches(self, texts: list[str]):
        """Yield ``(indices, tokens (B, T))`` over length-sorted, right-padded batches."""
        rows = self.rows(texts)
        for idx in token_batches([(len(r), 0) for r in rows], self.max_tokens, shuffle=False):
            yield idx, pad_sequences([rows[i] for i in idx], self.tokenizer.pad_id).to(self.device)

    @torch.inference_mode()
    def embed(self, texts: list[str], normalize: bool = True) -> np.ndarray:
        """``(N, D)`` float32 sentence embeddings: the mean over real tokens, L2-normalised
        unless ``normalize=False``."""
        out = np.zeros((len(texts), self.model.config.d_model), dtype=np.float32)
        for idx, tokens in self._batches(texts):
            hidden, mask, _ = self.model.encode(tokens)
            pooled = masked_mean(hidden.float(), mask)  # (B, D)
            if normalize:
                pooled = torch.nn.functional.normalize(pooled, dim=-1)
            out[idx] = pooled.cpu().numpy()
        return out

    def similarity(self, first: str, second: str) -> float:
        """Cosine similarity of two texts' embeddings, in [-1, 1]. Raises :class:`QkvError` for
        an empty text."""
        a, b = self.embed([first, second])
        return float(a @ b)

    def search(self, query: str, corpus: list[str], top_k: int = 5) -> list[tuple[float, int]]:
        """The ``top_k`` corpus entries closest to ``query``: ``(cosine similarity, index)``,
        best first. Raises :class:`QkvError` for ``top_k`` < 1."""
        if top_k < 1:
            raise QkvError(f"top_k must be >= 1 (got {top_k})")
        if not query.strip():
            raise QkvError("the query is empty: give some text to search for")
        vectors = self.embed(corpus)
        scores = vectors @ self.embed([query])[0]  # (N,)
        best = np.argsort(-scores, kind="stable")[:top_k]
        return [(float(scores[i]), int(i)) for i in best]

    @torch.inference_mode()
    def predict(self, texts: list[str]) -> np.ndarray:
        """``(N, num_labels)`` float32 class probabilities from the sequence head. Raises
        :class:`QkvError` for a model without a trained head."""
        if not self.classes:
            raise QkvError(
                "this encoder has no trained classification head (train one with `qkv train text-cls`)"
            )
        out = np.zeros((len(texts), len(self.classes)), dtype=np.float32)
        for idx, tokens in self._batches(texts):
            logits = self.model(tokens, head="sequence").logits  # (B, num_labels)
            out[idx] = torch.softmax(logits.float(), -1).cpu().numpy()
        return out
