"""Protein sequences: FASTA files (Biopython: the ``proteins`` extra, imported when a file is
read), the pretraining corpora, a held-out split.

Sources: UniProt (20,000 proteins of the mmseqs2 example data) and 17 complete RefSeq
proteomes (bacteria, archaea; SignalP 6.0's reference genomes). Files are looked up in
``$QKV_DATA_DIR`` (``uniprot_mmseqs2/DB.fasta.gz``, ``refseq_proteomes/*.faa``), then the cache;
RefSeq proteomes are downloaded from the SignalP 6.0 repository and checked against their
SHA-256 when absent.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import itertools
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..errors import QkvError
from ..extras import require
from .sources import READ_ERRORS, find_data_file, unreadable_because
from .tokenizers import AminoAcidTokenizer

logger = logging.getLogger(__name__)

REFSEQ_URL = "https://raw.githubusercontent.com/fteufel/signalp-6.0/main/data/reference_genomes/{name}"
REFSEQ_SHA256 = {
    "baphidicola_proteins.faa": "00ade844a3073861f8c4765e03cf159eb9e999a55f453e66e9bb4f3af63f3b98",
    "bsubtilis_proteins.faa": "c0b6f56f434d113c4c71ba619f9916dd24eef1834b77bd972e77edd7ea05eec8",
    "cglutamicum_proteins.faa": "085c8bc3ae7527217eb10b706805cec3759bad21e187f47a44621f2a06665b43",
    "dradiodurans_proteins.faa": "41ffeabe645dd2a5036cb356862b728722c722a5eef3ea06f9018f4747a99c3c",
    "ecoli_proteins.faa": "80017001597f8281aceed5223d34e014928b2ddfff6d908fcc5bebeddf8cbcf4",
    "hvolcanii_proteins.faa": "0dd1253f67343382756f7c976c51e218919a62fdd377eec975d9e539fb92664d",
    "mgenitalium_proteins.faa": "eae379e2aba98d2e456818ea40cf3b801b4a8ef845f72b3f62ed2b1403a74819",
    "mjannaschii_proteins.faa": "2881cac29334c73650bea6edf2c460a1225474dc1cd99ae16439d78df64f4c99",
    "mtuberculosis_proteins.faa": "c61c2758570b336d3cb64e0b6768f527b5ef519fb63de51dafc332370f5fe0bf",
    "paeruginosa_proteins.faa": "64f0fb3596d6d96080e8a0d0f473df440c4f0b1fa1dd8f0c1d7f6923e0967063",
    "psyntrophicum_proteins.faa": "58d5e84a37ec5a01c22d449f678d9d901fcccd3199beda5005fd20b307adf892",
    "sacidocaldarius_proteins.faa": "331f787ce4b5181c2e3e49c655e81d39e88d0f3cd79234f7870c3162849b8f9c",
    "sruminantium_proteins.faa": "e710b0847960954dc68adca37a8ece604b4aec64a82b1594f7c9e260116be47a",
    "sspeciespcc6803.faa": "51dfe792c335c881dfd97a53c7c7c5d73449a89ced8fbcdc0ce325b138ea1ef9",
    "tmaritima_proteins.faa": "91ed24b19007e9acc1a251111835448acdf4a8a5310742870ff2e93418d42928",
    "tthermophilus_proteins.faa": "42aaca866456f6a75f757601f56724b8fc1caa9572fdb5e6cb48c32dbff6d8db",
    "tvolcanium_proteins.faa": "a745251eeb24088fee357ac35122ea3560a9e70c0baf8f1813603ba9a7d5225f",
}
UNIPROT_SHA256 = "92a65aa435f5d3e0f33eb47d87910fe7fc6033a28bf4ed1367094377d791d567"


@dataclass(frozen=True)
class ProteinRecord:
    """One FASTA record: ``id`` (first word of the header), full ``description``, and the
    cleaned ``sequence`` (upper case, no trailing ``*``)."""

    id: str
    description: str
    sequence: str


def fasta_entries(path: str | Path) -> Iterator[tuple[str, str, int]]:
    """``(header, sequence text, bytes of the file read so far)`` of each record of a FASTA file
    (plain or gzipped), in file order: the one FASTA reader of qkv, Biopython's
    ``SimpleFastaParser`` under one rule. The first line that is not blank must be a ``>``
    header (text before it is refused, as ``Bio.SeqIO.parse(..., "fasta")`` refuses it), and the
    sequence text is the record's lines joined (spaces and ``\r`` removed); nothing is checked
    about the residues. The byte count is of the file on disk (compressed bytes of a ``.gz``),
    for a progress bar.

    Raises:
        QkvError: a missing file, text before the first header, or a file that cannot be read
            (truncated or corrupt gzip, not UTF-8), in one line naming the file; MissingExtra
            (one) where Biopython is not installed (``pip install 'qkv[proteins]'``).
    """
    require("proteins", "reading FASTA files")
    from Bio.SeqIO.FastaIO import SimpleFastaParser

    path = Path(path)
    if not path.is_file():
        raise QkvError(f"FASTA file not found: {path}")
    with open(path, "rb") as raw:
        stream = gzip.open(raw) if path.suffix == ".gz" else raw  # noqa: SIM115 (closed with raw)
        text = io.TextIOWrapper(stream, encoding="utf-8", newline=None)
        try:
            for title, seq in SimpleFastaParser(_headed(text, path)):
                yield title, seq, raw.tell()
        except (*READ_ERRORS, ValueError) as exc:
            raise QkvError(f"cannot read FASTA file {path}: {unreadable_because(exc)}") from None


def _headed(lines: Iterator[str], path: Path) -> Iterator[str]:
    """``lines``, once the first line that is not blank is checked to be a ``>`` header
    (SimpleFastaParser would skip text before it); the rest pass through untouched."""
    head = []
    for line in lines:
        head.append(line)
        if line.strip():
            if not line.startswith(">"):
                raise QkvError(
                    f"cannot read FASTA file {path}: text before the first '>' header (is it a FASTA file?)"
                )
            break
    return itertools.chain(head, lines)


def record_id(header: str) -> str:
    """A FASTA record's id: the first word of its header (``""`` for an empty header)."""
    return header.split(None, 1)[0] if header else ""


def read_fasta(
    path: str | Path, tokenizer: AminoAcidTokenizer | None = None, skip_invalid: bool = False
) -> list[ProteinRecord]:
    """Records of a FASTA file (plain or ``.gz``), in file order, read by :func:`fasta_entries`
    (Biopython's parser; text before the first header is refused).

    Windows line endings and lowercase residues are accepted; one trailing ``*`` is stripped.

    Args:
        skip_invalid: drop records that are empty or hold non-protein characters (one
            WARNING on the ``qkv.data.protein`` logger says how many) instead of failing — for
            large pretraining corpora.

    Raises:
        QkvError: missing/unreadable file (truncated or corrupt gzip too), no records, text
            before the first header, an empty sequence, a duplicate id, or a non-protein
            character (naming record id, position and character).
    """
    path = Path(path)
    tokenizer = tokenizer or AminoAcidTokenizer()
    records, seen, skipped = [], set(), 0
    for title, text, _ in fasta_entries(path):
        rec_id = record_id(title)
        try:
            if not rec_id:
                raise QkvError(f"{path}: a record has an empty header")
            if len(text) == 0:
                raise QkvError(f"{path}: record {rec_id} has an empty sequence")
            seq = tokenizer.clean(text, f"{path.name}: {rec_id}")
            if not seq:
                raise QkvError(f"{path}: record {rec_id} has an empty sequence")
        except QkvError:
            if not skip_invalid:
                raise
            skipped += 1
            continue
        if rec_id in seen and not skip_invalid:
            raise QkvError(
                f"{path}: duplicate record id {rec_id!r} (ids must be unique so results can be matched back)"
            )
        seen.add(rec_id)
        records.append(ProteinRecord(rec_id, title, seq))
    if skipped:
        logger.warning("%s: skipped %d empty or non-protein record(s)", path.name, skipped)
    if not records:
        raise QkvError(f"{path}: no FASTA records found (is it a FASTA file?)")
    return records


def pretraining_files() -> list[Path]:
    """The UniProt file and the 17 RefSeq proteomes (data dir, cache, else download)."""
    files = [find_data_file("uniprot_mmseqs2", "DB.fasta.gz", "", UNIPROT_SHA256, download=False)]
    files += [
        find_data_file("refseq_proteomes", name, REFSEQ_URL.format(name=name), sha)
        for name, sha in sorted(REFSEQ_SHA256.items())
    ]
    return files


def held_out(record_id: str, fraction: float) -> bool:
    """Whether a record belongs to the held-out split: a stable hash of its id, so the split
    does not depend on file order or on which files are present."""
    digest = hashlib.sha256(record_id.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction


def load_pretraining_corpus(val_fraction: float = 0.02) -> tuple[list[str], list[str]]:
    """``(train sequences, held-out sequences)`` of UniProt + RefSeq, split by
    :func:`held_out` on record ids. Identical sequences are kept once (RefSeq proteomes
    share some), so the held-out split never contains a training sequence verbatim."""
    train: list[str] = []
    val: list[str] = []
    seen: set[str] = set()
    for path in pretraining_files():
        for rec in read_fasta(path, skip_invalid=True):
            if rec.sequence in seen:
                continue
            seen.add(rec.sequence)
            (val if held_out(rec.id, val_fraction) else train).append(rec.sequence)
    return train, val
