"""CDR-H3 of antibody heavy chains, and held-out heavy chains for CDR-H3 infilling.

CDR-H3 follows the IMGT definition (Lefranc et al., Dev Comp Immunol 2003): CDR3 is IMGT
positions 105-117, between the conserved Cys 104 of framework 3 and the Trp 118 of the
J-region motif W-G-x-G. :func:`cdr_h3_span` finds it with a sequence motif, without numbering.

The chains are those of ``$QKV_DATA_DIR/antibody/`` (SAbDab, Dunbar et al. 2014): the
paratope split of AntiBERTa (Leem et al., Patterns 2022) and TDC's ``SAbDab_Chen``
developability set (Chen et al. 2020). The same antibody is deposited under several PDB
entries, so :func:`heavy_chain_splits` removes from training every chain that shares its
sequence or its CDR-H3 with a held-out chain.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import QkvError
from .protein_tasks import DEVELOPABILITY_SHA256, PARATOPE_SHA256
from .sources import find_data_file

CDR_H3_LENGTHS = (3, 35)  # shortest and longest CDR-H3 accepted (IMGT 105-117 with insertions)
_J_MOTIF = re.compile(r"WG.G")  # IMGT 118-121, the J region's W-G-x-G
_FR3_END = re.compile(r"[YF][YFH]")  # IMGT 102-103 before Cys 104 (Y-Y-C, Y-F-C, Y-H-C)
_FR3_REACH = 80  # how far before the Trp the FR3 motif is looked for (ultralong CDR-H3s)


def cdr_h3_span(heavy: str) -> tuple[int, int]:
    """0-based ``[start, end)`` of CDR-H3 (IMGT 105-117) in a heavy-chain variable domain.

    A motif heuristic, not ANARCI numbering: the Trp 118 is the last ``W-G-x-G`` in the
    C-terminal half of the chain; the Cys 104 is the last Cys before it that closes
    framework 3's ``[YF][YFH]C`` (Y-Y-C and the like), else the last Cys before it, with
    3 to 35 residues between them; ``start`` = the residue after the Cys, ``end`` = the Trp.
    The framework motif matters for CDR-H3s that hold a cysteine themselves (about 1 chain in 25
    here: the last Cys would cut those short). A chain whose framework motif lies more than 35
    residues before the Trp (bovine ultralong CDR-H3s) is refused rather than cut.

    On the 1,705 distinct heavy chains of ``$QKV_DATA_DIR/antibody/`` it finds 1,678 (13 lack a
    ``W-G-x-G``: ``WSQG``, ``WAQG``, ``LGQG``, truncated chains); on 1,640 of them the span equals the
    IMGT CDR3 of an ANARCI-compatible numbering (anarcism 1.0.1), and on 37 more that numbering
    puts the Cys 104 and the residue before it into CDR3, which IMGT excludes; 27 are refused
    (13 without the motif, 14 ultralong) and one ultralong CDR-H3 with a ``Y-H-C`` inside is cut.

    Raises:
        QkvError: no ``W-G-x-G`` in the C-terminal half, no Cys at a plausible distance before
            it, or a CDR-H3 longer than 35 residues.
    """
    half = len(heavy) // 2
    found = list(_J_MOTIF.finditer(heavy, half))
    if not found:
        raise QkvError(f"no J-region W-G-x-G motif in the second half of the heavy chain {heavy[:12]}...")
    trp = found[-1].start()
    lo, hi = CDR_H3_LENGTHS
    near = [i for i in range(max(0, trp - hi - 1), trp - lo) if heavy[i] == "C"]
    framework = [
        i
        for i in range(max(2, trp - _FR3_REACH), trp - lo)
        if heavy[i] == "C" and _FR3_END.fullmatch(heavy[i - 2 : i])
    ]
    if framework and framework[-1] < trp - hi - 1:
        raise QkvError(
            f"CDR-H3 of {heavy[:12]}... is {trp - framework[-1] - 1} residues, longer than {hi} (ultralong)"
        )
    if framework:
        return framework[-1] + 1, trp
    if near:
        return near[-1] + 1, trp
    raise QkvError(f"no Cys {lo}-{hi} residues before the W-G-x-G motif of the heavy chain {heavy[:12]}...")


def cdr_h3(heavy: str) -> str | None:
    """The CDR-H3 of a heavy chain (:func:`cdr_h3_span`), ``None`` where it is not found."""
    try:
        start, end = cdr_h3_span(heavy)
    except QkvError:
        return None
    return heavy[start:end]


@dataclass(frozen=True)
class HeavyChains:
    """Heavy-chain variable domains (one-letter strings) split for CDR-H3 infilling: no
    training chain shares its sequence or its CDR-H3 with a ``val`` or ``test`` chain; every
    ``val`` and ``test`` chain has a CDR-H3 :func:`cdr_h3_span` finds."""

    train: list[str]
    val: list[str]
    test: list[str]


def _column(path: Path, column: str, chain: str | None = None) -> list[str]:
    """One column of a TSV file, upper-case, stripped (only rows whose ``chain`` is ``chain``)."""
    try:
        with path.open(encoding="utf-8", newline="") as f:
            rows = list(csv.DictReader(f, delimiter="\t"))
    except OSError as exc:
        raise QkvError(f"cannot read {path}: {exc.strerror or exc}") from None
    if rows and column not in rows[0]:
        raise QkvError(f"{path} has no {column!r} column")
    return [r[column].strip().upper() for r in rows if chain is None or r["chain"] == chain]


def _path(name: str, sha256: str, data_dir: Path | None) -> Path:
    if data_dir is None:
        return find_data_file("antibody", name, "", sha256, download=False)
    path = Path(data_dir) / "antibody" / name
    if not path.is_file():
        raise QkvError(f"antibody file {name} not found in {path.parent}")
    return path


def heavy_chain_splits(data_dir: Path | None = None) -> HeavyChains:
    """Heavy chains for CDR-H3 infilling: ``test`` = the chain-H sequences of
    ``paratope_test.tsv``, ``val`` = those of ``paratope_val.tsv`` (AntiBERTa's split), each
    deduplicated and kept only where :func:`cdr_h3_span` finds CDR-H3, a ``val`` chain dropped
    when it shares its sequence or CDR-H3 with a ``test`` chain; ``train`` = the heavy chains of
    ``sabdab_chen_developability.tsv`` and ``paratope_train.tsv``, deduplicated, less every chain
    that shares its sequence or CDR-H3 with a ``val`` or ``test`` chain. Order: first occurrence.

    With the published files: 1,588 train, 42 val, 46 test chains. Of the 2,778 training-side
    heavy chains (2,409 + 369), 1,660 are distinct; 44 of those equal a held-out chain and 28 more
    share its CDR-H3 (27 kept training chains have no CDR-H3 the heuristic finds). ``val`` loses
    one chain without a CDR-H3 found and two whose CDR-H3 is a ``test`` chain's.

    Args:
        data_dir: the data root holding ``antibody/`` (default: ``$QKV_DATA_DIR``, then the cache).

    Raises:
        QkvError: a missing or unreadable file.
    """

    def heavy(split: str) -> list[str]:
        name = f"paratope_{split}.tsv"
        return _column(_path(name, PARATOPE_SHA256[name], data_dir), "sequence", chain="H")

    def held_out(chains: list[str], exclude: set[str]) -> list[str]:
        return [s for s in dict.fromkeys(chains) if (h3 := cdr_h3(s)) is not None and not {s, h3} & exclude]

    test = held_out(heavy("test"), set())
    val = held_out(heavy("val"), set(test) | {cdr_h3(s) for s in test})  # type: ignore[misc]
    chen = _column(_path("sabdab_chen_developability.tsv", DEVELOPABILITY_SHA256, data_dir), "heavy")
    seen = set(val + test) | {cdr_h3(s) for s in val + test}
    train = [s for s in dict.fromkeys(chen + heavy("train")) if s not in seen and cdr_h3(s) not in seen]
    return HeavyChains(train, val, test)
