"""``qkv score-variants``: zero-shot scores of mutations from a protein masked LM (Meier et al.
2021), as a TSV (the mutations CSV's rows plus a ``score`` column), and a saturation
heatmap."""

from __future__ import annotations

import argparse
import csv
import io
from pathlib import Path

from .. import cpu_share, extras
from ..errors import QkvError
from .console import log
from .options import MODEL_HELP, device_option, file_output_option, revision_option
from .output import write_line

METHODS = ("masked-marginals", "wt-marginals", "pseudo-ll")  # qkv.inference.variants.METHODS


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Register ``score-variants``."""
    p = sub.add_parser(
        "score-variants",
        help="zero-shot variant effects from a protein masked LM (TSV: the CSV's rows + score)",
        description="Score mutations (A42G, multi-mutants A42G:L50P) of a wild type by a protein "
        "masked LM (Meier et al. 2021): log p(mutant) - log p(wild type); higher = fitter.",
    )
    p.add_argument("model", metavar="MODEL", help=MODEL_HELP)
    p.add_argument("--wt", required=True, help="the wild type: a sequence, or a FASTA file with one record")
    p.add_argument("--mutations", help="CSV (or .tsv) with a column of mutations")
    p.add_argument("--column", default="mutant", help="the mutations' column (default mutant)")
    p.add_argument(
        "--offset",
        type=int,
        default=0,
        help="position in the wild type = mutation number - offset (1-based; default 0)",
    )
    p.add_argument(
        "--method",
        choices=METHODS,
        default="masked-marginals",
        help="masked-marginals (default), wt-marginals or pseudo-ll; multi-mutants: the sum of their "
        "mutations' log-ratios (marginals) or the whole mutated sequence (pseudo-ll)",
    )
    file_output_option(p, "--out", "write the TSV here (atomically) instead of stdout")
    file_output_option(
        p, "--heatmap", "also draw the saturation matrix (positions x 20 amino acids) as PNG", "PNG"
    )
    p.add_argument(
        "--saturation",
        action="store_true",
        help="score every single substitution of the wild type instead of a CSV (TSV: mutant, score)",
    )
    revision_option(p)
    device_option(p)
    p.set_defaults(func=_cmd_score_variants)


def _wild_type(text: str) -> str:
    """The wild type from a FASTA file (exactly one record) or the sequence itself."""
    from ..data.protein import read_fasta
    from ..data.tokenizers import AminoAcidTokenizer

    try:
        is_file = Path(text).is_file()
    except OSError:  # longer than a file name can be: a sequence
        is_file = False
    if is_file:
        records = read_fasta(text)
        if len(records) != 1:
            raise QkvError(f"{text} holds {len(records)} records; give the wild type alone")
        return records[0].sequence
    if any(c in text for c in "/\\."):  # a path (no sequence has these)
        raise QkvError(f"wild-type FASTA not found: {text}")
    seq = AminoAcidTokenizer().clean(text, "--wt")
    if not seq:
        raise QkvError("--wt is empty")
    return seq


def _read_table(path: str, column: str) -> tuple[list[str], list[list[str]], int]:
    """Header, rows and the index of ``column`` of a CSV (tab-separated if ``.tsv``). A blank
    line before the last row is a row of empty cells (a one-column file's empty cell), which
    the mutation parser refuses by its row number."""
    try:
        text = Path(path).read_text(encoding="utf-8-sig")
    except OSError as exc:
        raise QkvError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise QkvError(f"{path} is not UTF-8 text (byte {exc.start})") from None
    table = list(csv.reader(io.StringIO(text), delimiter="\t" if path.endswith(".tsv") else ","))
    if not table:
        raise QkvError(f"{path} is empty")
    header, rows = table[0], table[1:]
    while rows and not rows[-1]:  # the file's last line breaks
        rows.pop()
    rows = [r or [""] * len(header) for r in rows]  # a blank line inside: a row of empty cells
    if column not in header:
        raise QkvError(
            f"{path} has no column {column!r} (columns: {', '.join(header)}); choose one with --column"
        )
    if "score" in header:
        raise QkvError(f"{path} already has a score column; rename it")
    if not rows:
        raise QkvError(f"{path} has no rows")
    return header, rows, header.index(column)


def _cmd_score_variants(args) -> int:
    from ..data.tokenizers import AMINO_ACIDS
    from ..device import resolve_device
    from ..explain.variants import write_heatmap
    from ..files import write_text
    from ..inference.protein import ProteinEncoder
    from ..inference.variants import Mutation, Variant, VariantScorer, additive_scores, parse_variants

    # every input is read and checked before the model is loaded, and anything is written
    if args.saturation == (args.mutations is not None):
        raise QkvError("give either --mutations CSV or --saturation")
    if args.method == "pseudo-ll" and (args.saturation or args.heatmap):
        raise QkvError("--saturation and --heatmap need a marginal method (masked-marginals or wt-marginals)")
    for out in (args.out, args.heatmap):
        if out is not None and not Path(out).resolve().parent.is_dir():
            raise QkvError(f"the folder of {out} does not exist")
    if args.heatmap is not None:
        extras.require("plot", "qkv score-variants --heatmap")
    wild_type = _wild_type(args.wt)
    if args.saturation:
        header = ["mutant"]
        variants: list[Variant] = [
            (Mutation(w, i, a, f"{w}{i + args.offset}{a}"),)
            for i, w in enumerate(wild_type, 1)
            if w in AMINO_ACIDS
            for a in AMINO_ACIDS
            if a != w
        ]
        rows = [[v[0].text] for v in variants]
    else:
        header, rows, col = _read_table(args.mutations, args.column)
        variants = parse_variants(
            [r[col] if col < len(r) else "" for r in rows], wild_type, args.offset, f"{args.mutations}: "
        )

    scorer = VariantScorer(ProteinEncoder.load(args.model, resolve_device(args.device), args.revision))
    cpu_share.for_command()  # threads from the load, chosen once (the scorer takes none)
    matrix = None
    if args.heatmap or args.saturation:
        matrix = scorer.saturation(wild_type, args.method)
        scores = additive_scores(matrix, variants)
    else:
        scores = scorer.score(wild_type, variants, args.method)

    buffer = io.StringIO()
    writer = csv.writer(buffer, delimiter="\t", lineterminator="\n")
    writer.writerow([*header, "score"])
    writer.writerows([*row, f"{s:.6f}"] for row, s in zip(rows, scores, strict=True))
    if matrix is not None and args.heatmap:
        write_heatmap(matrix, wild_type, args.heatmap, args.offset, f"{args.model} ({args.method})")
        log(f"saturation heatmap ({len(wild_type)} positions x 20) -> {args.heatmap}")
    if args.out:
        write_text(Path(args.out), buffer.getvalue())
        log(f"{len(variants)} variant scores ({args.method}) -> {args.out}")
    else:
        write_line(buffer.getvalue().rstrip("\n"))
    return 0
