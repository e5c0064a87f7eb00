"""A user's own parallel data: pairs of sequences in a TSV file, for ``qkv train translation
data=PAIRS.tsv``.

The convention is one file, one pair per line, ``source<TAB>target`` (or two named columns of a
TSV with a header: ``columns=heavy,light``). One file rather than two aligned files
(``src_file``/``tgt_file``, Moses' convention) because a pair on one line cannot drift out of
alignment: a sentence missing from one of two files shifts every later pair silently, while
here it is a line with one field, named. Two aligned files become one with
``paste train.de train.en > pairs.tsv`` (a shorter file then shows up as an empty field, named
by its line). It is also what ``text-cls`` reads and what spreadsheets and pandas write.

Every check names the file and the line and comes before anything is written: a file that is
not UTF-8, an empty line, a line with another number of fields than the first, an empty
source or target, a missing named column.
"""

from __future__ import annotations

import codecs
import os
import random
from dataclasses import dataclass
from pathlib import Path

from ..errors import QkvError
from .sources import sha256sum
from .tokenizers import AMINO_ACIDS, RARE_CODES

RESIDUES = frozenset(AMINO_ACIDS + RARE_CODES)
# what a run on its own pairs keeps of them: the files it read and its held-out pairs
PAIRS_FILE = "pairs.json"


@dataclass(frozen=True)
class ParallelData:
    """Aligned pairs read from a file: ``src[i]`` translates to ``tgt[i]``, read from line
    ``lines[i]`` (1-based) of ``path``."""

    path: Path
    src: list[str]
    tgt: list[str]
    lines: list[int]

    def __len__(self) -> int:
        return len(self.src)

    def subset(self, index: list[int]) -> ParallelData:
        """The pairs at ``index``, in that order."""
        return ParallelData(
            self.path,
            [self.src[i] for i in index],
            [self.tgt[i] for i in index],
            [self.lines[i] for i in index],
        )

    def are_residues(self) -> bool:
        """Whether every source and target is an upper-case amino-acid string (20 standard
        residues and ``XBZUO``): proteins on both sides."""
        return all(set(s) <= RESIDUES for s in self.src) and all(set(t) <= RESIDUES for t in self.tgt)

    def check_residues(self) -> None:
        """Raise :class:`QkvError` naming the first line, side and character that is not an
        upper-case amino-acid code."""
        for side, texts in (("source", self.src), ("target", self.tgt)):
            for line, text in zip(self.lines, texts, strict=True):
                bad = next((c for c in text if c not in RESIDUES), None)
                if bad is not None:
                    raise QkvError(
                        f"{self.path} line {line}: the {side} has {bad!r} at position {text.index(bad) + 1}, "
                        f"not an amino-acid code ({AMINO_ACIDS} or {RARE_CODES}, upper case); "
                        "tokenizer=bpe reads any text"
                    )


def read_pairs(path: str | Path, columns: str | None = None) -> ParallelData:
    """Read a pairs file: each line ``source<TAB>target``, or with ``columns="SRC,TGT"`` a TSV
    whose first line names its columns, the two named ones read. A relative ``path`` that is
    not found is looked up under ``$QKV_DATA_DIR`` too (configs name the shared data sets
    so: ``antibody/sabdab_chen_developability.tsv``). A UTF-8 byte-order mark at the start
    (Excel's "CSV UTF-8") and a trailing ``\\r`` are dropped, and so are spaces around each
    field; the file may end with or without a newline.

    Raises:
        QkvError: a missing file, bytes that are not UTF-8, an empty line, a line whose number
            of fields differs from the first's (or is not 2 without ``columns``), an empty
            source or target, ``columns`` not two names of the header, fewer than one pair.
            The message names the file and the line.
    """
    path = Path(path)
    shared = Path(os.environ.get("QKV_DATA_DIR", "")) / path
    if not path.is_file() and not path.is_absolute() and os.environ.get("QKV_DATA_DIR") and shared.is_file():
        path = shared  # a data set's own name (antibody/...), as the configs give it
    if not path.is_file():
        raise QkvError(f"pairs file not found: {path}")
    raw = path.read_bytes().removeprefix(codecs.BOM_UTF8).split(b"\n")  # a byte-order mark is no text
    if raw and raw[-1] == b"":
        raw.pop()  # the final newline ends the last line, it does not start one
    lines: list[str] = []
    for n, chunk in enumerate(raw, 1):
        try:
            lines.append(chunk.decode("utf-8").rstrip("\r"))
        except UnicodeDecodeError as exc:
            raise QkvError(
                f"{path} line {n}: not UTF-8 (byte 0x{chunk[exc.start]:02x} at column {exc.start + 1}); "
                "save the file as UTF-8"
            ) from None
    first = 1
    pick = (0, 1)
    width = 2
    if columns is not None:
        names = [c.strip() for c in columns.split(",")]
        if len(names) != 2 or not all(names):
            raise QkvError(f"columns={columns!r}: name two columns, source then target (columns=heavy,light)")
        if not lines:
            raise QkvError(f"{path} is empty")
        header = [h.strip() for h in lines[0].split("\t")]
        missing = [c for c in names if c not in header]
        if missing:
            named = ", ".join(map(repr, missing))
            raise QkvError(f"{path} line 1: no column {named} in the header ({', '.join(header)})")
        pick, width, first = (header.index(names[0]), header.index(names[1])), len(header), 2
    src, tgt, numbers = [], [], []
    for n, line in enumerate(lines[first - 1 :], first):
        if not line.strip():
            raise QkvError(f"{path} line {n} is empty; a pairs file has one pair per line")
        fields = [f.strip() for f in line.split("\t")]
        if len(fields) != width:
            expected = (
                f"the header's {width}"
                if columns
                else "2: source<TAB>target (columns=SRC,TGT reads two named columns of a TSV with a header)"
            )
            raise QkvError(f"{path} line {n} has {len(fields)} tab-separated field(s); expected {expected}")
        for side, i in zip(("source", "target"), pick, strict=True):
            if not fields[i]:
                raise QkvError(f"{path} line {n}: the {side} is empty")
        src.append(fields[pick[0]])
        tgt.append(fields[pick[1]])
        numbers.append(n)
    if not src:
        raise QkvError(f"{path} holds no pairs")
    return ParallelData(path, src, tgt, numbers)


def split_pairs(
    data: ParallelData, val_fraction: float, test_fraction: float, seed: int
) -> tuple[ParallelData, ParallelData, ParallelData]:
    """``(train, val, test)`` drawn by ``seed``: each a fraction of the pairs (at least one
    pair when the fraction is above 0), the rest training. Pairs that share a source stay in
    one split, so that no held-out source was seen in training (one heavy chain solved with
    several light chains, a sentence translated twice).

    Raises:
        QkvError: too few distinct sources to leave any for training.
    """
    groups: dict[str, list[int]] = {}
    for i, s in enumerate(data.src):
        groups.setdefault(s, []).append(i)
    keys = list(groups)
    random.Random(seed).shuffle(keys)
    n = len(data)
    want = [max(1, round(f * n)) if f > 0 else 0 for f in (val_fraction, test_fraction)]
    held: list[list[int]] = [[], []]
    k = 0
    for split in (0, 1):
        while len(held[split]) < want[split] and k < len(keys):
            held[split] += groups[keys[k]]
            k += 1
    train = sorted(i for key in keys[k:] for i in groups[key])
    if not train:
        raise QkvError(
            f"{data.path}: {len(keys)} distinct source(s) leave none for training after val_fraction="
            f"{val_fraction} and test_fraction={test_fraction}"
        )
    return data.subset(train), data.subset(sorted(held[0])), data.subset(sorted(held[1]))


def file_record(path: Path) -> dict:
    """Where a pairs file was and what it held (sha256): what a run keeps of its data."""
    return {"path": str(path.resolve()), "sha256": sha256sum(path)}
