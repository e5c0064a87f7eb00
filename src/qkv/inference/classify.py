"""Any classifier run on the inputs in files: image files, a text file (one text per line) or
a FASTA file, each read and predicted by the class for its kind of run
(:class:`~qkv.inference.vision.ImageClassifier`, :class:`~qkv.inference.text.TextEncoder`,
:class:`~qkv.inference.protein.ProteinEncoder`).

What a run reads is its recipe's :attr:`~qkv.recipes.recipe.Recipe.inputs`, which the caller
passes in: this layer does not import the recipes (they import it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..data.protein import read_fasta
from ..data.sources import read_lines
from ..device import resolve_device
from ..errors import QkvError
from .protein import ProteinEncoder
from .text import TextEncoder
from .vision import ImageClassifier


@dataclass(frozen=True)
class Predictions:
    """Class probabilities of inputs, in input order.

    Attributes:
        key: what ``names`` hold: ``"id"`` (FASTA record ids, image files) or ``"text"`` (the
            texts themselves).
        names: one per input.
        classes: class names in id order.
        probs: per input, ``(C,)`` probabilities, or ``(L, C)`` (one row per residue) with
            ``per_residue``.
        per_residue: a residue-level task: one class per residue.
    """

    key: str
    names: list[str]
    classes: tuple[str, ...]
    probs: list[np.ndarray]
    per_residue: bool = False

    def labels(self) -> list[str]:
        """Each input's most likely class; per residue, the residues' classes joined (a
        residue task's class names are single letters)."""
        if self.per_residue:
            return ["".join(self.classes[k] for k in p.argmax(1)) for p in self.probs]
        return [self.classes[int(p.argmax())] for p in self.probs]


def classify_files(
    run_dir: str | Path, paths: Sequence[str], reads: str, device: torch.device | str = "auto"
) -> Predictions:
    """Classify the inputs in ``paths`` with a classifier run.

    Args:
        reads: what the run reads (its recipe's ``inputs``): ``"image"``: image files (PNG,
            JPEG, ...), every one read before any is predicted; ``"text"``: one UTF-8 text
            file, a text per line (``-``: standard input); ``"protein"``: one FASTA file.
        device: a device name as :func:`qkv.device.resolve_device` takes it (``"auto"``:
            CUDA, MPS, else the CPU).

    Raises:
        QkvError: the wrong number of files, a file that cannot be read, or a run that cannot
            classify (a protein encoder without a task head, a missing or incomplete run).
    """
    if reads not in _READERS:
        raise ValueError(f"no classifier reads {reads!r} inputs; known: {', '.join(_READERS)}")
    return _READERS[reads](run_dir, paths, str(device))


def _images(run_dir: str | Path, paths: Sequence[str], device: str) -> Predictions:
    classifier = ImageClassifier.from_run(run_dir, resolve_device(device))
    probs = classifier.predict(classifier.read(list(paths)))
    return Predictions("id", list(paths), classifier.classes, list(probs))


def _texts(run_dir: str | Path, paths: Sequence[str], device: str) -> Predictions:
    if len(paths) != 1:
        raise QkvError("a text classifier takes one text file (one text per line)")
    texts = read_lines(paths[0])  # read before the model loads: a bad file fails fast
    encoder = TextEncoder.load(run_dir, resolve_device(device))
    return Predictions("text", texts, encoder.classes, list(encoder.predict(texts)))


def _proteins(run_dir: str | Path, paths: Sequence[str], device: str) -> Predictions:
    if len(paths) != 1:
        raise QkvError("a protein classifier takes one FASTA file")
    encoder = ProteinEncoder.from_run(run_dir, resolve_device(device))
    if encoder.level == "mlm":
        raise QkvError(
            f"{run_dir} is a pretrained encoder without a task head; classify needs a "
            "protein-cls or protein-residue run"
        )
    records = read_fasta(paths[0])
    ids = [r.id for r in records]
    probs = encoder.predict([r.sequence for r in records], ids)
    return Predictions("id", ids, encoder.classes, probs, per_residue=encoder.level == "residue")


# what a classifier run reads (its recipe's ``inputs``) → how its files are read and predicted
_READERS: dict[str, Callable[[str | Path, Sequence[str], str], Predictions]] = {
    "image": _images,
    "text": _texts,
    "protein": _proteins,
}
