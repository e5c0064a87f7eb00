"""A trained protein encoder as an inference API: amino-acid sequences in, class
probabilities (per sequence or per residue) or embeddings out. Beside
:class:`~qkv.inference.translator.Translator` and :class:`~qkv.inference.lm.TextGenerator`.

Over-long inputs: a sequence-level model keeps the first ``max_len - 2`` residues (with a
warning: signal peptides and most sequence-level signals a short model can use sit at the N
terminus; refusing would make whole proteomes unusable). A residue-level model splits a long
chain into consecutive windows of ``max_len - 2`` residues, so every residue is covered;
:meth:`ProteinEncoder.embed` uses the overlapping windows of :mod:`qkv.inference.embed`.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch

from .. import runs
from ..data.batching import pad_sequences, token_batches
from ..data.tokenizers import AminoAcidTokenizer, protein_tokenizer
from ..errors import QkvError
from ..models.encoder import EncoderModel
from ..models.model_types import ENCODER, built_as
from ..runs.layout import TASK

logger = logging.getLogger(__name__)


# The kinds of run whose encoder reads amino acids (a converted encoder: AntiBERTy, ESM-2).
PROTEIN_KINDS = ("protein-mlm", "protein-cls", "protein-residue", "encoder")


class ProteinEncoder:
    """A trained encoder with its task: tokens in, class probabilities or embeddings out.

    ``level``: ``"sequence"`` or ``"residue"``; ``classes``: class names in id order;
    ``tokenizer``: qkv's :class:`AminoAcidTokenizer` (default) or a pretrained model's (see
    :func:`~qkv.data.tokenizers.protein_tokenizer`).
    """

    def __init__(
        self,
        model: EncoderModel,
        classes: tuple[str, ...],
        level: str,
        device: torch.device | str = "cpu",
        max_tokens: int = 16384,
        tokenizer=None,
    ) -> None:
        self.model, self.classes, self.level = model, tuple(classes), level
        self.tok = AminoAcidTokenizer() if tokenizer is None else protein_tokenizer(tokenizer)
        self.device, self.max_tokens = torch.device(device), max_tokens
        self.width = model.config.max_len - 2

    @classmethod
    def from_run(cls, run_dir: str | Path, device: torch.device | str = "cpu") -> ProteinEncoder:
        """Load a ``protein-cls`` / ``protein-residue`` / ``protein-mlm`` run directory, or a
        converted pretrained protein encoder (``qkv convert hf antiberty RUN``), through
        :func:`qkv.runs.load_run`. Raises :class:`QkvError` for a missing,
        incomplete or other kind of run directory."""
        model, tok = runs.load_run(Path(run_dir), device=device, family=PROTEIN_KINDS)
        return cls._with_task(model, tok, run_dir, device)

    @classmethod
    def load(
        cls, source: str | Path, device: torch.device | str = "cpu", revision: str | None = None
    ) -> ProteinEncoder:
        """A protein encoder from a run directory, an HF folder, a short name (``antiberty``) or a
        Hub name (``facebook/esm2_t6_8M_UR50D``), through :func:`qkv.hub.pretrained.load`.

        Raises:
            QkvError: what :func:`~qkv.hub.pretrained.load` raises, or a model that is not an
                encoder (a decoder LM, a ViT, ...).
        """
        from ..hub.pretrained import load

        model, tok = load(source, device=device, revision=revision)
        if not built_as(model, ENCODER):
            raise QkvError(f"{source} is a {type(model).__name__}, not a protein encoder")
        return cls._with_task(model, tok, source, device)

    @classmethod
    def _with_task(cls, model: EncoderModel, tok, source: str | Path, device) -> ProteinEncoder:
        """The encoder with the task its run directory's ``task.json`` names (classes, level);
        a masked LM when there is none (a name, an HF folder, a protein-mlm run)."""
        meta = runs.run_json(source, TASK, missing={})
        return cls(model, meta.get("classes", ()), meta.get("level", "mlm"), device, tokenizer=tok)

    def rows(
        self,
        sequences: list[str],
        ids: list[str] | None = None,
        whole_chain: bool | None = None,
        warn: bool = True,
    ) -> tuple[list[list[int]], list[int]]:
        """Token rows and, per row, the index of its sequence. ``whole_chain`` (default: a
        residue-level model) splits a long chain into consecutive windows covering it all;
        otherwise each sequence is one row cut to its first ``max_len - 2`` residues (logged as
        a warning when ``warn``)."""
        whole_chain = self.level == "residue" if whole_chain is None else whole_chain
        ids = ids or [f"sequence {i + 1}" for i in range(len(sequences))]
        rows, owner, cut = [], [], 0
        for i, (seq, sid) in enumerate(zip(sequences, ids, strict=True)):
            res = self.tok.encode(seq, sid, add_special_tokens=False)
            if not res:
                raise QkvError(f"{sid}: empty sequence")
            if whole_chain:
                chunks = [res[s : s + self.width] for s in range(0, len(res), self.width)]
            else:
                cut += len(res) > self.width
                chunks = [res[: self.width]]
            for c in chunks:
                rows.append([self.tok.cls_id, *c, self.tok.eos_id])
                owner.append(i)
        if cut and warn:
            logger.warning(
                f"{cut} sequence(s) longer than the model's {self.width} residues were "
                f"cut to their first {self.width} residues (N terminus kept)"
            )
        return rows, owner

    def batches(self, rows: list[list[int]]) -> list[list[int]]:
        return token_batches([(len(r), 0) for r in rows], self.max_tokens, shuffle=False)

    def logits(self, tokens: torch.Tensor) -> torch.Tensor:
        """``(B, C)`` (sequence) or ``(B, T, C)`` (residue) float logits."""
        return self.model(tokens.to(self.device), head=self.level).logits

    @torch.no_grad()
    def predict(self, sequences: list[str], ids: list[str] | None = None) -> list[np.ndarray]:
        """Class probabilities per input: ``(C,)`` for a sequence task, ``(L, C)`` (one row
        per residue, windows joined back) for a residue task. Order = input order."""
        rows, owner = self.rows(sequences, ids)
        per_row: list = [None] * len(rows)
        for idx in self.batches(rows):
            tokens = pad_sequences([rows[i] for i in idx], self.tok.pad_id)
            probs = self.logits(tokens).float().softmax(-1).cpu().numpy()
            for j, i in enumerate(idx):
                per_row[i] = probs[j] if self.level == "sequence" else probs[j, 1 : len(rows[i]) - 1]
        out: list = [[] for _ in sequences]
        for i, p in zip(owner, per_row, strict=True):
            out[i].append(p)
        return [parts[0] if self.level == "sequence" else np.concatenate(parts) for parts in out]

    def embed(
        self, sequences: list[str], ids: list[str] | None = None, per_residue: bool = False
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """``(N, D)`` mean of the final hidden states over each sequence's residues (specials
        and padding excluded) and, if ``per_residue``, one ``(L, D)`` array per sequence, in
        input order. Long sequences are embedded in overlapping windows
        (:class:`~qkv.inference.embed.Embedder`, which also reads other layers and streams
        whole FASTA files into shards).

        Raises:
            QkvError: an empty sequence or a character the tokenizer refuses.
        """
        from .embed import Embedder

        ids = ids or [f"sequence {i + 1}" for i in range(len(sequences))]
        last = len(self.model.layers)
        pool = Embedder(self, [last], per_residue).pool(sequences, ids)
        residues = [r.numpy() for r in pool.residues[last]] if per_residue else []
        return pool.means()[last].numpy(), residues
