"""Deep mutational scans for zero-shot variant-effect scoring (Meier et al. 2021; ProteinGym,
Notin et al. 2023): four assays, each as its full-length wild type, its variants written as
mutation lists in full-length numbering (``H24C``, ``A42G:L50P``), and the measured scores
(higher = fitter, ProteinGym's direction for all four).

Files, in ``$QKV_DATA_DIR/dms/`` (or the cache): ``BLAT_ECOLX_Ranganathan2015.csv`` (TEM-1
β-lactamase, Stiffler et al. 2015; from facebookresearch/esm ``examples/variant-prediction``),
``gb1_data.csv.gz`` (protein G B1 domain, IgG binding, Olson et al. 2014),
``amyloid_data.csv.gz`` (Aβ42 nucleation, Seuma et al. 2022), ``tdp43_data.csv.gz`` (TDP-43
290–373 toxicity, Bolognesi et al. 2019; these three from the MAVE-NN package, Tareen et al.
2022), ``targets.tsv`` (per file: the full-length UniProt sequence, the mutated region, its
offset and wild type) and ``anchors.tsv`` (ProteinGym's published zero-shot Spearman of ESM-2).

Rows, chosen as ProteinGym chose them where the files allow: BLAT, the 4,996 single mutants
scored at 2,500 µg/ml ampicillin (column ``2500``); TDP-43, the 1,196 single mutants without a
stop (``dist == 1``, no ``*``); Aβ42, every row without a stop (468 singles, 14,015 doubles);
GB1, every row (530,737 doubles; ProteinGym's singles are not in this file). A MAVE-NN row's
mutations are the letters where its variant region ``x`` differs from the region's wild type.
"""

from __future__ import annotations

import csv
import gzip
import io
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import QkvError
from .sources import READ_ERRORS, find_data_file, unreadable_because

DATASET = "dms"
SHA256 = {
    "BLAT_ECOLX_Ranganathan2015.csv": "2bf86306d8841b771bc8d8e717adac8d75adf1586759c0ccc1878ff408e13a29",
    "gb1_data.csv.gz": "c1334244ab0112f55c2a850840e8126d2d285d91a4623c3306e02b7f7a540eb7",
    "amyloid_data.csv.gz": "4b5292241908db39e198aecd59a0e4d0e0ff00dea67e0af3085686023fb91dfa",
    "tdp43_data.csv.gz": "50fcb1603afd0300cd54d8ce795551a50638613b7b967cd489ed85a91c6534da",
    "targets.tsv": "2e18b987b9c938b82f6f47278f887b205d2fdd75fce2ff77a58121eef4c71bca",
    "anchors.tsv": "c22d5d8ab84868e084c52f893cd60906619ec811704582ee72f6c580cfe7122b",
}
# short name → ProteinGym DMS id, in the order tables list them
ASSAYS = {
    "BLAT": "BLAT_ECOLX_Stiffler_2015",
    "GB1": "SPG1_STRSG_Olson_2014",
    "Abeta42": "A4_HUMAN_Seuma_2022",
    "TDP-43": "TADBP_HUMAN_Bolognesi_2019",
}


@dataclass
class Assay:
    """One deep mutational scan.

    Attributes:
        name: short name (``BLAT``); dms_id: ProteinGym's id; description: what was measured.
        wild_type: the full-length sequence (UniProt), which the mutations number.
        variants: ``N`` mutation lists (``A42G`` or ``A42G:L50P``), 1-based full-length
            positions. scores: ``(N,)`` float64 measured fitness (higher = fitter).
        anchors: ProteinGym's published Spearman per ESM-2 model (``esm2_8M`` ... ``esm2_650M``)
            and what its row set was (``rows_vs_proteingym``).
    """

    name: str
    dms_id: str
    description: str
    wild_type: str
    variants: list[str]
    scores: np.ndarray
    anchors: dict[str, str] = field(default_factory=dict)


def _path(name: str) -> Path:
    return find_data_file(DATASET, name, "", SHA256[name], download=False)


def _rows(name: str, delimiter: str = ",") -> list[dict[str, str]]:
    """The rows of a (possibly gzipped) CSV/TSV file of the data set; a UTF-8 BOM is dropped."""
    path = _path(name)
    try:
        data = gzip.decompress(path.read_bytes()) if name.endswith(".gz") else path.read_bytes()
        return list(csv.DictReader(io.StringIO(data.decode("utf-8-sig")), delimiter=delimiter))
    except READ_ERRORS as exc:
        raise QkvError(f"cannot read {path}: {unreadable_because(exc)}") from None


def _table(name: str) -> dict[str, dict[str, str]]:
    """``targets.tsv`` / ``anchors.tsv`` by ProteinGym id."""
    return {row["proteingym_dms_id"]: row for row in _rows(name, "\t")}


def _region_mutations(x: str, region_wt: str, offset: int) -> str:
    """``A42G:L50P`` of a MAVE-NN variant region ``x`` against its wild type (full-length
    numbering = 1-based position in ``x`` + ``offset``)."""
    if len(x) != len(region_wt):
        raise QkvError(f"variant region {x!r} is not as long as the wild-type region ({len(region_wt)})")
    return ":".join(
        f"{w}{i + 1 + offset}{m}" for i, (w, m) in enumerate(zip(region_wt, x, strict=True)) if w != m
    )


def load_assay(name: str) -> Assay:
    """One assay by short name (:data:`ASSAYS`), its rows selected as the module docstring says.

    Raises:
        QkvError: an unknown name, a file not in the data directory or cache, or an unreadable one.
    """
    if name not in ASSAYS:
        raise QkvError(f"unknown assay {name!r}; known: {', '.join(ASSAYS)}")
    dms_id = ASSAYS[name]
    target = _table("targets.tsv")[dms_id]
    anchors = _table("anchors.tsv")[dms_id]
    offset, region_wt, file = int(target["offset"]), target["region_wt"], target["file"]
    variants, scores = [], []
    for row in _rows(file):
        if name == "BLAT":
            mutant, score = row["mutant"], row[target["score_column"]]
        else:
            if "*" in row["x"] or (name == "TDP-43" and row["dist"] != "1"):
                continue
            mutant, score = _region_mutations(row["x"], region_wt, offset), row["y"]
        variants.append(mutant)
        scores.append(float(score))
    return Assay(
        name,
        dms_id,
        target["assay"],
        target["target_seq"],
        variants,
        np.asarray(scores, dtype=np.float64),
        {k: v for k, v in anchors.items() if k not in ("proteingym_dms_id", "file")},
    )
