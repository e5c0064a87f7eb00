"""Labelled protein data sets and their splits: SignalP 6.0, AMP Scanner v2, FLIP secondary
structure, and a user's own FASTA/CSV/TSV file.

Every loader returns a :class:`ProteinTask`: records with an id, the cleaned sequence, a label
(one class name per sequence, or one per residue), the split (``train``/``val``/``test``) and,
for SignalP, the organism group (kingdom).

Splits:
    SignalP 6.0 (Teufel et al. 2022): three homology-partitioned folds; ``fold=0`` tests on
        partition 0, validates on 1 and trains on 2 (``fold=k``: test k, val k+1, train k+2).
    AMP Scanner v2 (Veltri et al. 2018) and user files without a split column: stratified
        80/10/10 with a fixed seed.
    FLIP secondary structure (Dallago et al. 2021; labels from NetSurfP-2.0, Klausen et al.
        2019): its ``SET=`` and ``VALIDATION=`` header fields; unresolved residues
        (``mask.fasta`` = 0) carry no label.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import QkvError
from ..extras import require
from .protein import fasta_entries, read_fasta, record_id
from .sources import find_data_file
from .tokenizers import AminoAcidTokenizer

SPLITS = ("train", "val", "test")
SIGNALP_TYPES = ("NO_SP", "SP", "LIPO", "TAT", "TATLIPO", "PILIN")
SIGNALP_URL = "https://raw.githubusercontent.com/fteufel/signalp-6.0/main/data/train_set.fasta"
SIGNALP_SHA256 = "d0e286e96165fad5d86f0b7dfadd9eaf084b0f3668a796062851b2988b1b3943"
AMP_URL = "https://raw.githubusercontent.com/spaenigs/peptidereactor/c1cff38/data/amp_ascan/{name}"
AMP_SHA256 = {
    "seqs.fasta": "01d2a59b6651f3e7f9886e5a1ff240926c07aeeac5f085f1938f2be8beb04dd3",
    "classes.txt": "00cc1a7040ce47602848802d13b25628361076e70595cbabcd9d8cadd936fa82",
}
FLIP_SHA256 = {
    "sequences.fasta": "cc69cb36650161fa08874c7a3a2ceceb9c3bbab1b6394cb875647c1b8b4a4b03",
    "sampled.fasta": "d74173c6ecd35339e9455565b45160f7285d401a1fc05e814af67bcb7bb83ad1",
    "mask.fasta": "6ffafb87ab0d40781103594d3a8fa202d1db741fd49cc00fe6220797bf55897f",
}
SS_CLASSES = ("H", "E", "C")


@dataclass(frozen=True)
class LabelledProtein:
    """One labelled sequence. ``label``: a class name (sequence tasks) or a string of one class
    letter per residue (residue tasks). ``resolved``: per-residue bools (residue tasks; False =
    no label, excluded from loss and metrics) or ``None``. ``group``: e.g. the SignalP kingdom."""

    id: str
    sequence: str
    label: str
    split: str
    group: str = ""
    resolved: tuple[bool, ...] | None = None


@dataclass
class ProteinTask:
    """A labelled data set: ``level`` is ``"sequence"`` or ``"residue"``; ``classes`` the class
    names in label-id order; ``citation`` is shown beside results; ``score``: the validation
    metric that chooses the kept weights (``None``: MCC for sequence tasks, Q3 for residue
    tasks)."""

    name: str
    level: str
    classes: tuple[str, ...]
    records: list[LabelledProtein]
    citation: str = ""
    notes: dict = field(default_factory=dict)
    score: str | None = None

    def __post_init__(self) -> None:
        self._index = {c: i for i, c in enumerate(self.classes)}  # built once, used per record

    def split(self, name: str) -> list[LabelledProtein]:
        return [r for r in self.records if r.split == name]

    def label_ids(self, record: LabelledProtein) -> list[int]:
        """Class ids: one for a sequence task, one per residue (-100 = unresolved)."""
        index = self._index
        if self.level == "sequence":
            return [index[record.label]]
        # Residue tasks' loaders give every record its per-residue flags.
        assert record.resolved is not None, f"residue record {record.id} has no resolved flags"
        return [index[c] if ok else -100 for c, ok in zip(record.label, record.resolved, strict=True)]


def stratified_split(labels: list[str], seed: int = 0) -> list[str]:
    """``train``/``val``/``test`` per item: a stratified 80/10/10 split with a fixed seed
    (scikit-learn), the same on every machine.

    Raises:
        MissingExtra: scikit-learn is not installed (``pip install 'qkv[probe]'``).
    """
    require("probe", "a stratified split")
    from sklearn.model_selection import train_test_split

    idx = list(range(len(labels)))
    strat = labels if min(labels.count(c) for c in set(labels)) >= 3 else None
    train, rest = train_test_split(idx, test_size=0.2, random_state=seed, stratify=strat)
    rest_strat = None
    if strat:
        rest_labels = [labels[i] for i in rest]
        if min(rest_labels.count(c) for c in set(rest_labels)) >= 2:
            rest_strat = rest_labels
    val, test = train_test_split(rest, test_size=0.5, random_state=seed, stratify=rest_strat)
    out = ["train"] * len(labels)
    for i in val:
        out[i] = "val"
    for i in test:
        out[i] = "test"
    return out


def load_signalp(fold: int = 0) -> ProteinTask:
    """SignalP 6.0 benchmark, 6-class signal-peptide type from the N-terminal ≤70 residues.

    The file has three lines per record: ``>ACC|KINGDOM|TYPE|PARTITION``, the sequence, the
    region labels. Raises :class:`QkvError` on a malformed record (naming its line).
    """
    if fold not in (0, 1, 2):
        raise QkvError(f"SignalP fold must be 0, 1 or 2 (got {fold})")
    path = find_data_file("signalp6", "train_set.fasta", SIGNALP_URL, SIGNALP_SHA256)
    lines = path.read_text(encoding="utf-8").splitlines()
    role = {str(fold): "test", str((fold + 1) % 3): "val", str((fold + 2) % 3): "train"}
    tok = AminoAcidTokenizer()
    records = []
    for n in range(0, len(lines) - 2, 3):
        header, seq = lines[n], lines[n + 1]
        parts = header[1:].split("|")
        if (
            not header.startswith(">")
            or len(parts) != 4
            or parts[2] not in SIGNALP_TYPES
            or parts[3] not in role
        ):
            raise QkvError(f"{path}:{n + 1}: not a SignalP header >ACC|KINGDOM|TYPE|PARTITION: {header!r}")
        acc, kingdom, sp_type, part = parts
        records.append(LabelledProtein(acc, tok.clean(seq, acc), sp_type, role[part], kingdom))
    return ProteinTask(
        "signalp",
        "sequence",
        SIGNALP_TYPES,
        records,
        "SignalP 6.0 data: Teufel et al., Nat Biotechnol 2022 (CC BY-NC-ND 2.0)",
        {"fold": fold},
    )


def read_labels(path: str | Path, n_records: int, fasta: str | Path) -> list[str]:
    """One label per non-empty line; raises :class:`QkvError` unless there is exactly one per
    FASTA record."""
    path = Path(path)
    if not path.is_file():
        raise QkvError(f"labels file not found: {path}")
    labels = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if len(labels) != n_records:
        raise QkvError(
            f"{path} has {len(labels)} labels but {fasta} has {n_records} records "
            "(one label per record, in FASTA order)"
        )
    return labels


def load_amp_scanner(seed: int = 0) -> ProteinTask:
    """AMP Scanner v2: antimicrobial (1) vs length-matched non-antimicrobial (0) peptides,
    split 80/10/10 stratified with ``seed``."""
    fasta = find_data_file(
        "peptides/amp_ascan", "seqs.fasta", AMP_URL.format(name="seqs.fasta"), AMP_SHA256["seqs.fasta"]
    )
    classes = find_data_file(
        "peptides/amp_ascan", "classes.txt", AMP_URL.format(name="classes.txt"), AMP_SHA256["classes.txt"]
    )
    task = _from_fasta_and_labels(fasta, classes, seed, "amp-scanner", {"0": "non-AMP", "1": "AMP"})
    task.citation = "AMP Scanner v2: Veltri et al., Bioinformatics 2018 (via peptidereactor, MIT)"
    return task


def _from_fasta_and_labels(
    fasta: Path, labels_path: Path, seed: int, name: str, names: dict[str, str] | None = None
) -> ProteinTask:
    """Records of ``fasta`` labelled line by line from ``labels_path``; ``names`` renames
    label values (classes keep the sorted order of the original values)."""
    recs = read_fasta(fasta)
    labels = read_labels(labels_path, len(recs), fasta)
    splits = stratified_split(labels, seed)
    names = names or {}
    records = [
        LabelledProtein(r.id, r.sequence, names.get(lab, lab), s)
        for r, lab, s in zip(recs, labels, splits, strict=True)
    ]
    return ProteinTask(name, "sequence", tuple(names.get(c, c) for c in sorted(set(labels))), records)


def _fasta_dict(path: Path) -> dict[str, tuple[str, str]]:
    """``id → (description, sequence text)`` of a FASTA file whose "sequences" are label
    strings (no amino-acid check)."""
    return {record_id(title): (title, seq) for title, seq, _ in fasta_entries(path) if title}


def load_flip_secondary_structure() -> ProteinTask:
    """FLIP secondary structure (3-state H/E/C per residue). Files are looked up in the data
    directory / cache (FLIP ships them inside a zip archive; put the three files in
    ``$QKV_DATA_DIR/flip_secondary_structure/``)."""
    paths = {
        n: find_data_file("flip_secondary_structure", n, "", sha, download=False)
        for n, sha in FLIP_SHA256.items()
    }
    labels, masks = _fasta_dict(paths["sampled.fasta"]), _fasta_dict(paths["mask.fasta"])
    records = []
    for rec in read_fasta(paths["sequences.fasta"]):
        desc, ss = labels[rec.id]
        mask = masks[rec.id][1]
        if not len(ss) == len(mask) == len(rec.sequence) or set(ss) - set(SS_CLASSES):
            raise QkvError(
                f"FLIP record {rec.id}: sequence, labels and mask lengths differ or labels are not H/E/C"
            )
        fields = dict(f.split("=", 1) for f in desc.split()[1:] if "=" in f)
        split = (
            "test"
            if fields.get("SET") == "test"
            else "val"
            if fields.get("VALIDATION") == "True"
            else "train"
        )
        records.append(
            LabelledProtein(rec.id, rec.sequence, ss, split, resolved=tuple(c == "1" for c in mask))
        )
    return ProteinTask(
        "secondary-structure",
        "residue",
        SS_CLASSES,
        records,
        "FLIP (Dallago et al. 2021), labels from NetSurfP-2.0 (Klausen et al. 2019), AFL-3.0",
    )


PARATOPE_SHA256 = {
    "paratope_train.tsv": "0abf0e8a6c5c69e129ec75f682e75d90526d065aeed1c42482d289c0d7d56fdc",
    "paratope_val.tsv": "c24dac25a71b53c98b6d8dfa7035d5d13b74b0cb875ad2c1545e9f321cb1ff86",
    "paratope_test.tsv": "5c950c957cb8b89b669a7fea8a2223131c910669b5cbae6198fbaf1f7d4ba8fb",
}


def load_paratope() -> ProteinTask:
    """Antibody paratope prediction: per residue, does it contact the antigen (``P``) or not
    (``N``), on SAbDab chains with AntiBERTa's published train/val/test split (Leem et al.,
    Patterns 2022). The files are converted from that repository's parquet files, so they are
    looked up in the data directory only (``$QKV_DATA_DIR/antibody/``). About 1 residue in 10 is
    a paratope residue: weights are chosen on validation AUPRC."""
    records = []
    for split in SPLITS:
        name = f"paratope_{split}.tsv"
        path = find_data_file("antibody", name, "", PARATOPE_SHA256[name], download=False)
        with path.open(encoding="utf-8", newline="") as f:
            for line, row in enumerate(csv.DictReader(f, delimiter="\t"), start=2):
                seq, lab = row["sequence"].strip(), row["paratope"].strip()
                if len(seq) != len(lab) or set(lab) - {"P", "N"}:
                    raise QkvError(f"{path}, line {line}: paratope labels must be P/N, one per residue")
                records.append(
                    LabelledProtein(
                        f"{row['pdb']}_{row['chain']}",
                        seq,
                        lab,
                        split,
                        group=row["chain"],
                        resolved=(True,) * len(seq),
                    )
                )
    return ProteinTask(
        "paratope",
        "residue",
        ("N", "P"),
        records,
        "SAbDab (Dunbar et al. 2014), split of AntiBERTa (Leem et al., Patterns 2022)",
        score="auprc",
    )


DEVELOPABILITY_SHA256 = "3503b92b5fb2cf6792291f8dbee876d876a858873ab1e8ceef446ca6fdf12c88"


def load_developability(seed: int = 0) -> ProteinTask:
    """Antibody developability (TDC ``SAbDab_Chen``; Chen et al. 2020): paired heavy and light
    variable domains, label 1 = a developability issue (482 of 2,409). A pair is one input, the
    heavy chain's residues followed by the light chain's (qkv's encoders read one sequence);
    split 80/10/10 stratified by label with a fixed ``seed``. Scored by AUROC."""
    path = find_data_file(
        "antibody", "sabdab_chen_developability.tsv", "", DEVELOPABILITY_SHA256, download=False
    )
    tok = AminoAcidTokenizer()
    rows = []
    with path.open(encoding="utf-8", newline="") as f:
        for row in csv.DictReader(f, delimiter="\t"):
            pair = tok.clean(row["heavy"], row["id"]) + tok.clean(row["light"], row["id"])
            rows.append((row["id"], pair, row["label"].strip()))
    splits = stratified_split([lab for _, _, lab in rows], seed)
    records = [LabelledProtein(i, seq, lab, sp) for (i, seq, lab), sp in zip(rows, splits, strict=True)]
    return ProteinTask(
        "developability",
        "sequence",
        ("0", "1"),
        records,
        "TDC SAbDab_Chen (Chen et al. 2020; Huang et al. 2021), SAbDab (Dunbar et al. 2014)",
        score="auroc",
    )


def load_user_file(path: str | Path, labels: str | Path | None = None, seed: int = 0) -> ProteinTask:
    """A user's labelled sequences: a CSV/TSV with ``sequence`` and ``label`` columns (optional
    ``id`` and ``split`` columns), or a FASTA file plus ``labels`` (one label per record).

    Raises:
        QkvError: missing file or columns, a bad sequence (id, position, character), a split
            value other than train/val/test, or a label count that does not match.
    """
    path = Path(path)
    if not path.is_file():
        raise QkvError(f"task file not found: {path} (use --task signalp, amp-scanner or a file)")
    if path.suffix.lower() not in (".csv", ".tsv", ".txt"):
        if labels is None:
            raise QkvError(
                f"{path} looks like FASTA: give its labels with labels=FILE "
                "(one label per record), or use a CSV/TSV with sequence and label columns"
            )
        return _from_fasta_and_labels(path, Path(labels), seed, path.stem)
    delimiter = "\t" if path.suffix.lower() == ".tsv" else ","
    with path.open(encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f, delimiter=delimiter))
    columns = set(rows[0]) if rows else set()
    if not {"sequence", "label"} <= columns:
        raise QkvError(f"{path} needs 'sequence' and 'label' columns (found: {sorted(columns) or 'no rows'})")
    tok = AminoAcidTokenizer()
    ids = [row.get("id") or f"row{i + 2}" for i, row in enumerate(rows)]
    seqs = [
        tok.clean(row["sequence"] or "", f"{path.name}: {rid}") for row, rid in zip(rows, ids, strict=True)
    ]
    for rid, s in zip(ids, seqs, strict=True):
        if not s:
            raise QkvError(f"{path}: {rid} has an empty sequence")
    labs = [row["label"].strip() for row in rows]
    if "split" in columns:
        splits = [row["split"].strip() for row in rows]
        bad = sorted(set(splits) - set(SPLITS))
        if bad:
            raise QkvError(f"{path}: split values must be train/val/test, found {bad}")
    else:
        splits = stratified_split(labs, seed)
    records = [LabelledProtein(i, s, lab, sp) for i, s, lab, sp in zip(ids, seqs, labs, splits, strict=True)]
    return ProteinTask(path.stem, "sequence", tuple(sorted(set(labs))), records)


# the tasks by name (load_task's); a name wins over a file of that name
TASKS = ("signalp", "amp-scanner", "secondary-structure", "paratope", "developability")


def load_task(task: str, level: str, fold: int = 0, labels: str | None = None, seed: int = 0) -> ProteinTask:
    """The task named on the command line (``signalp``, ``amp-scanner``,
    ``secondary-structure``) or a file path; raises :class:`QkvError` if it does not fit ``level``."""
    builtin = {
        "signalp": lambda: load_signalp(fold),
        "amp-scanner": lambda: load_amp_scanner(seed),
        "secondary-structure": load_flip_secondary_structure,
        "paratope": load_paratope,
        "developability": lambda: load_developability(seed),
    }
    assert set(builtin) == set(TASKS)
    loaded = builtin[task]() if task in builtin else load_user_file(task, labels, seed)
    if loaded.level != level:
        raise QkvError(
            f"task {task!r} is a per-{loaded.level} task; use "
            f"`qkv train protein-{'cls' if loaded.level == 'sequence' else 'residue'}`"
        )
    for name in SPLITS:
        if not loaded.split(name):
            raise QkvError(f"task {task!r} has no {name} records")
    if len(loaded.classes) < 2:
        raise QkvError(
            f"task {task!r} has one class ({', '.join(loaded.classes)}): a classifier needs two or more"
        )
    return loaded
