"""Zero-shot variant effects from a protein masked LM (Meier et al. 2021, "Language models
enable zero-shot prediction of the effects of mutations on protein function", Methods).

A mutation is written ``A42G``: wild-type residue, position, mutant residue; a multi-mutant
joins them with ``:`` (``A42G:L50P``, ProteinGym's notation). Positions count from 1 at the
first residue of the given wild type, after subtracting an ``offset`` (``number - offset``), so
an assay numbered from residue 24 of a fragment uses ``offset=23``. (ESM's ``predict.py``
takes a 0-based ``--offset-idx``: its 24 is qkv's 23.)

The three scores, each a log-ratio (higher = the mutant more likely under the model: predicted
fitter):

- ``masked-marginals``: for each mutated position ``i``, one pass with ``i`` masked;
  ``log p(x_i = mt | x_{-i}) - log p(x_i = wt | x_{-i})``. Meier et al.'s best-performing score.
- ``wt-marginals``: the same log-ratio read from one pass over the unmasked wild type.
- ``pseudo-ll``: the pseudo-log-likelihood ``sum_i log p(x_i | x_{-i})`` (each position
  masked in turn; Salazar et al. 2020) of the mutant sequence minus that of the wild type.

Multi-mutants: the marginal scores add the log-ratios of their mutations (the additive
model of Meier et al. and ProteinGym); ``pseudo-ll`` scores the whole mutated sequence.

Long sequences: a model reads at most ``width`` residues (``max_len - 2``). A longer wild
type is scored in a window of ``width`` residues around the position, as ProteinGym does for
ESM: centred on it (``start = i - width // 2``) and shifted to lie inside the sequence
(``0 <= start <= L - width``), framed by ``<cls>``/``<eos>`` like any input (ProteinGym cuts
the framed token sequence instead, so its inner windows lack them). Each position of a
marginal score has its own window; ``pseudo-ll`` centres one window on the middle of the
mutated positions, scores wild type and mutant over that window, and refuses a multi-mutant
whose positions span more than ``width`` residues.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np
import torch

from ..data.batching import pad_sequences
from ..data.tokenizers import AMINO_ACIDS
from ..errors import QkvError
from .protein import ProteinEncoder

logger = logging.getLogger(__name__)

METHODS = ("masked-marginals", "wt-marginals", "pseudo-ll")
MARGINALS = METHODS[:2]  # the methods that give one log-ratio per mutation (saturation matrices)
_MUTATION = re.compile(r"([A-Za-z*])(-?\d+)([A-Za-z*])")


@dataclass(frozen=True)
class Mutation:
    """One substitution: ``wt`` and ``mt`` (one of the 20 amino acids) at ``position`` (1-based,
    into the wild type); ``text`` is how it was written (its own numbering)."""

    wt: str
    position: int
    mt: str
    text: str


Variant = tuple[Mutation, ...]


def parse_variant(text: str, wild_type: str, offset: int = 0) -> Variant:
    """``A42G`` or ``A42G:L50P`` → its mutations, checked against ``wild_type`` (upper case).
    Position = number − ``offset`` (1-based).

    Raises:
        QkvError: naming the mutation: not of the form ``A42G``; a letter that is not one of
            the 20 amino acids; a position outside the wild type; a wild-type letter that
            disagrees with the sequence (the letter found named); two mutations at one position.
    """
    text = text.strip()
    if not text:
        raise QkvError("empty mutation (expected e.g. A42G or A42G:L50P)")
    variant: list[Mutation] = []
    for part in text.split(":"):
        m = _MUTATION.fullmatch(part.strip())
        if m is None:
            raise QkvError(f"{part!r} is not a mutation like A42G (in {text!r})")
        wt, mt, number = m[1].upper(), m[3].upper(), int(m[2])
        bad = [c for c in (wt, mt) if c not in AMINO_ACIDS]
        if bad:
            raise QkvError(f"{part}: {bad[0]!r} is not one of the 20 amino acids {AMINO_ACIDS}")
        position = number - offset
        if not 1 <= position <= len(wild_type):
            raise QkvError(
                f"{part}: position {number} is outside the wild type (numbers {1 + offset}-"
                f"{len(wild_type) + offset} with offset {offset})"
            )
        found = wild_type[position - 1]
        if found != wt:
            raise QkvError(f"{part}: the wild type has {found} at position {number}, not {wt}")
        if any(v.position == position for v in variant):
            raise QkvError(f"{text}: two mutations at position {number}")
        variant.append(Mutation(wt, position, mt, part.strip()))
    return tuple(variant)


def parse_variants(texts: Sequence[str], wild_type: str, offset: int = 0, where: str = "") -> list[Variant]:
    """:func:`parse_variant` of each; an error names the item (``where`` + ``row N``,
    1-based). Raises :class:`QkvError`."""
    out = []
    for n, text in enumerate(texts, 1):
        try:
            out.append(parse_variant(text, wild_type, offset))
        except QkvError as exc:
            raise QkvError(f"{where}row {n}: {exc}") from None
    return out


def window_start(positions: Iterable[int], length: int, width: int) -> int:
    """First residue (0-based) of the window of ``width`` residues around 0-based
    ``positions`` in a sequence of ``length``: centred on their middle, shifted to stay inside
    (0 when the sequence fits). Raises :class:`QkvError` if they span more than ``width``."""
    positions = list(positions)
    lo, hi = min(positions), max(positions)
    if hi - lo >= width:
        raise QkvError(
            f"mutations at positions {lo + 1} and {hi + 1} are more than the model's {width} residues "
            "apart: no window holds both"
        )
    if length <= width:
        return 0
    return min(max((lo + hi) // 2 - width // 2, 0), length - width)


def untrained_mlm_head(encoder: ProteinEncoder) -> bool:
    """Whether the encoder's masked-LM head is still at its initialisation (output bias and
    LayerNorm at their zeros and ones): a classification run, or a converted base model
    (``EsmModel``, ``BertModel``) whose checkpoint had no MLM head."""
    norm = cast(torch.nn.LayerNorm, encoder.model.mlm_transform[2])
    at_init = ((encoder.model.mlm_head.bias, 0.0), (norm.weight, 1.0), (norm.bias, 0.0))
    return all(bool(torch.all(p == value)) for p, value in at_init)


class VariantScorer:
    """Score mutations of a wild type with a protein masked LM (see the module docstring).

    Args:
        encoder: a :class:`~qkv.inference.protein.ProteinEncoder` (its model, tokenizer,
            device, ``width`` and ``max_tokens`` per batch).

    Raises:
        QkvError: a task model (a classifier, not a masked LM), a masked-LM head that was never
            trained, a vocabulary without a mask token or without one of the 20 amino acids.
    """

    def __init__(self, encoder: ProteinEncoder) -> None:
        tok = encoder.tok
        if encoder.level in ("sequence", "residue"):
            raise QkvError(
                f"this is a {encoder.level}-level classifier, not a masked LM; scoring variants needs one"
            )
        if untrained_mlm_head(encoder):
            raise QkvError(
                "this model has no trained masked-LM head (a base model or a task run); give a masked LM"
            )
        if tok.mask_id is None:
            raise QkvError("this model's vocabulary has no mask token; scoring variants needs a masked LM")
        self.aa_ids = tok.encode(AMINO_ACIDS, "the 20 amino acids", add_special_tokens=False)
        if tok.unk_id in self.aa_ids:
            missing = [a for a, i in zip(AMINO_ACIDS, self.aa_ids, strict=True) if i == tok.unk_id]
            raise QkvError(f"this model's vocabulary has no token for {', '.join(missing)}")
        self.encoder, self.tok, self.width, self.mask_id = encoder, tok, encoder.width, tok.mask_id

    def residues(self, wild_type: str) -> list[int]:
        """Token ids of the wild type's residues (no specials); raises :class:`QkvError` for an
        empty sequence or characters that are not amino-acid codes."""
        ids = self.tok.encode(wild_type, "wild type", add_special_tokens=False)
        if not ids:
            raise QkvError("the wild type is empty")
        return ids

    def _forward(self, rows: list[list[int]]) -> Iterator[tuple[list[int], torch.Tensor]]:
        """Per batch of rows: their indices and ``(B, T, V)`` float32 log-probabilities
        (log-softmax over the whole vocabulary, as ESM's scripts do)."""
        for idx in self.encoder.batches(rows):
            tokens = pad_sequences([rows[k] for k in idx], self.tok.pad_id).to(self.encoder.device)  # (B, T)
            with torch.no_grad():
                lp = self.encoder.model(tokens, head="mlm").logits.float().log_softmax(-1)
            yield idx, lp

    def _log_probs(self, rows: list[list[int]], at: list[int]) -> np.ndarray:
        """``(len(rows), V)`` log-probabilities at token index ``at[k]`` of row ``k``."""
        out = np.empty((len(rows), self.tok.vocab_size), dtype=np.float32)
        for idx, lp in self._forward(rows):
            where = torch.tensor([at[k] for k in idx], device=lp.device)
            out[idx] = lp[torch.arange(len(idx), device=lp.device), where].cpu().numpy()  # (B, V)
        return out

    def _log_probs_all(self, rows: list[list[int]]) -> list[np.ndarray]:
        """Per row, ``(len(row), V)`` log-probabilities at every token."""
        out: list = [None] * len(rows)
        for idx, lp in self._forward(rows):
            for j, k in enumerate(idx):
                out[k] = lp[j, : len(rows[k])].cpu().numpy()
        return out

    def _row(self, ids: list[int], start: int, masked: int | None = None) -> list[int]:
        """``<cls> ids[start:start + width] <eos>``, with residue ``masked`` (0-based, in the
        whole sequence) replaced by the mask token."""
        window = ids[start : start + self.width]
        if masked is not None:
            window = [*window]
            window[masked - start] = self.mask_id
        return [self.tok.cls_id, *window, self.tok.eos_id]

    def marginals(
        self, wild_type: str, positions: Sequence[int], method: str = "masked-marginals"
    ) -> np.ndarray:
        """``(len(positions), V)`` log-probabilities of each token at each 1-based position of
        the wild type: with that position masked (``masked-marginals``, one row per position,
        batched) or from the unmasked wild type (``wt-marginals``, one pass per window).

        Raises:
            QkvError: an unknown method, a bad wild type, a position outside it.
        """
        _check_method(method, MARGINALS)
        ids = self.residues(wild_type)
        zero = [p - 1 for p in positions]
        if any(not 0 <= p < len(ids) for p in zero):
            raise QkvError(f"positions must lie in 1-{len(ids)}")
        starts = [window_start([p], len(ids), self.width) for p in zero]
        logger.debug(
            f"{method}: {len(zero)} position(s) of a {len(ids)}-residue wild type, width {self.width}"
        )
        if method == "masked-marginals":
            rows = [self._row(ids, s, p) for p, s in zip(zero, starts, strict=True)]
            return self._log_probs(rows, [1 + p - s for p, s in zip(zero, starts, strict=True)])
        distinct = sorted(set(starts))
        per_window = dict(
            zip(distinct, self._log_probs_all([self._row(ids, s) for s in distinct]), strict=True)
        )
        return np.stack([per_window[s][1 + p - s] for p, s in zip(zero, starts, strict=True)])

    def saturation(
        self, wild_type: str, method: str = "masked-marginals", positions: Iterable[int] | None = None
    ) -> np.ndarray:
        """Saturation mutagenesis: ``(L, 20)`` float32 log-ratios ``log p(aa) - log p(wt)`` at
        every position (rows) for every amino acid in :data:`~qkv.data.tokenizers.AMINO_ACIDS`
        order (columns); the wild type's own column is 0. Rows outside ``positions``
        (1-based; default all) and rows of a non-standard wild-type residue (``X``) are NaN.

        Raises:
            QkvError: see :meth:`marginals`.
        """
        _check_method(method, MARGINALS)
        ids = self.residues(wild_type)
        positions = sorted(set(range(1, len(ids) + 1) if positions is None else positions))
        out = np.full((len(ids), len(AMINO_ACIDS)), np.nan, dtype=np.float32)
        if not positions:
            return out
        lp = self.marginals(wild_type, positions, method)
        aa = np.asarray(self.aa_ids)
        for row, p in zip(lp, positions, strict=True):
            if ids[p - 1] in self.aa_ids:
                out[p - 1] = row[aa] - row[ids[p - 1]]
        return out

    def score(
        self, wild_type: str, variants: Sequence[Variant], method: str = "masked-marginals"
    ) -> np.ndarray:
        """``(N,)`` float64 scores of parsed variants (:func:`parse_variants`): the sum of
        their mutations' log-ratios (marginal methods; one pass per distinct position for
        ``masked-marginals``, a lookup per variant) or the pseudo-log-likelihood difference.

        Raises:
            QkvError: an unknown method, a bad wild type, a multi-mutant too wide for one window
                (``pseudo-ll``).
        """
        _check_method(method, METHODS)
        if method == "pseudo-ll":
            return self._pseudo_ll(wild_type, variants)
        return additive_scores(
            self.saturation(wild_type, method, {m.position for v in variants for m in v}), variants
        )

    def pseudo_log_probs(self, ids: list[int], start: int = 0) -> np.ndarray:
        """``(W,)`` float32 ``log p(x_i | x_{-i})`` of each residue of the window at ``start``
        (0-based) of residue ids ``ids``: one row per residue, that residue masked. Their sum is
        the pseudo-log-likelihood (Salazar et al. 2020)."""
        window = range(start, min(start + self.width, len(ids)))
        lp = self._log_probs([self._row(ids, start, p) for p in window], [1 + p - start for p in window])
        return lp[np.arange(len(window)), [ids[p] for p in window]]

    def _pseudo_ll(self, wild_type: str, variants: Sequence[Variant]) -> np.ndarray:
        ids = self.residues(wild_type)
        aa = dict(zip(AMINO_ACIDS, self.aa_ids, strict=True))
        wt_pll: dict[int, float] = {}
        out = np.empty(len(variants), dtype=np.float64)
        for n, v in enumerate(variants):
            start = window_start([m.position - 1 for m in v], len(ids), self.width)
            if start not in wt_pll:
                wt_pll[start] = float(self.pseudo_log_probs(ids, start).sum(dtype=np.float64))
            mutant = [*ids]
            for m in v:
                mutant[m.position - 1] = aa[m.mt]
            out[n] = float(self.pseudo_log_probs(mutant, start).sum(dtype=np.float64)) - wt_pll[start]
        return out


def additive_scores(matrix: np.ndarray, variants: Sequence[Variant]) -> np.ndarray:
    """``(N,)`` float64: per variant, the sum of its mutations' entries of a saturation
    ``matrix`` ``(L, 20)`` (:meth:`VariantScorer.saturation`): the additive model of
    multi-mutants (Meier et al. 2021; ProteinGym)."""
    column = {a: j for j, a in enumerate(AMINO_ACIDS)}
    rows = np.array([m.position - 1 for v in variants for m in v], dtype=np.int64)
    cols = np.array([column[m.mt] for v in variants for m in v], dtype=np.int64)
    owner = np.repeat(np.arange(len(variants)), [len(v) for v in variants])
    return np.bincount(owner, weights=matrix[rows, cols].astype(np.float64), minlength=len(variants))


def _check_method(method: str, allowed: Sequence[str]) -> None:
    if method not in allowed:
        raise QkvError(f"unknown scoring method {method!r}; choose {', '.join(allowed)}")
