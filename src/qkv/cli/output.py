"""The results the verbs write, each format in one place: tab-separated rows and JSON on
stdout (so they pipe), embeddings in a ``.safetensors`` file."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import torch

    from ..inference.classify import Predictions


def write_tsv(rows: Iterable[Sequence[str]], header: Sequence[str] | None = None) -> None:
    """Rows of tab-separated fields on stdout, one line each, after ``header`` when given."""
    out = sys.stdout
    if header is not None:
        out.write("\t".join(header) + "\n")
    for row in rows:
        out.write("\t".join(row) + "\n")
    out.flush()


def write_line(text: object) -> None:
    """One result line on stdout (a translation, a path, a score): what pipes onward."""
    sys.stdout.write(f"{text}\n")


def write_json(value: Any, indent: int | None = None, ensure_ascii: bool = False) -> None:
    """``value`` as JSON on stdout: one line, or ``indent``-ed for reading."""
    write_line(json.dumps(value, indent=indent, ensure_ascii=ensure_ascii))


def write_predictions(predictions: Predictions) -> None:
    """What ``qkv classify`` prints: per input its name, label and class probabilities
    (``p_<class>``, 4 decimals); for a residue task, its name and one class letter per residue."""
    labels = predictions.labels()
    if predictions.per_residue:
        write_tsv(zip(predictions.names, labels, strict=True), header=[predictions.key, "labels"])
        return
    header = [predictions.key, "label", *(f"p_{c}" for c in predictions.classes)]
    rows = zip(predictions.names, labels, predictions.probs, strict=True)
    write_tsv(([name, label, *(f"{x:.4f}" for x in p)] for name, label, p in rows), header=header)


def save_embeddings(
    out: str,
    vectors: np.ndarray,
    ids: list[str],
    source: str,
    extra: dict[str, torch.Tensor] | None = None,
) -> None:
    """Embeddings as a ``.safetensors`` file, written whole or not at all: ``vectors`` as the
    tensor ``mean``, ``extra`` tensors beside it, and in the metadata the inputs' ``ids`` (a
    JSON list, in row order) and the ``model`` that embedded them."""
    import torch
    from safetensors.torch import save_file

    from ..files import atomic_write

    tensors = {"mean": torch.from_numpy(vectors).contiguous(), **(extra or {})}
    metadata = {"ids": json.dumps(ids, ensure_ascii=False), "model": source}
    atomic_write(Path(out), lambda tmp: save_file(tensors, tmp, metadata=metadata))
