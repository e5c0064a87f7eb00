"""The verbs that read an encoder's output: ``classify`` (TSV of classes), ``embed``
(embeddings to a file), ``similarity`` and ``search`` (sentence embeddings compared)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import QkvError
from .console import log
from .options import device_option
from .output import save_embeddings, write_line, write_predictions, write_tsv


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Register ``classify``, ``embed``, ``similarity`` and ``search``."""
    p = sub.add_parser("classify", help="predict classes of proteins, texts or images (TSV on stdout)")
    p.add_argument("run_dir")
    p.add_argument(
        "inputs",
        nargs="+",
        metavar="FILE",
        help="protein run: one FASTA file; text-cls run: one text file (a text per line); "
        "vit run: image files (PNG, JPEG, ...), each "
        "converted to the model's channels and resized to its image size",
    )
    device_option(p)
    p.set_defaults(func=_cmd_classify)

    p = sub.add_parser(
        "embed",
        help="embeddings: sentences with a pretrained text encoder (--model), or "
        "proteins with a protein encoder run",
    )
    p.add_argument(
        "inputs",
        nargs="+",
        metavar="INPUT",
        help="--model NAME TEXT_FILE (one sentence per line), or RUN_DIR FASTA",
    )
    p.add_argument("--model", help="pretrained text encoder: minilm, an HF folder or a converted run")
    p.add_argument("--out", required=True, help="output .safetensors file")
    p.add_argument(
        "--per-residue", action="store_true", help="proteins: also store one (L, D) tensor per sequence"
    )
    device_option(p)
    p.set_defaults(func=_cmd_embed)

    p = sub.add_parser("similarity", help="cosine similarity of two sentences' embeddings")
    p.add_argument("first")
    p.add_argument("second")
    _text_encoder_option(p)
    device_option(p)
    p.set_defaults(func=_cmd_similarity)

    p = sub.add_parser(
        "search", help="semantic search: the corpus lines closest to a query (TSV: score, line)"
    )
    p.add_argument("query")
    p.add_argument("--corpus", required=True, help="text file, one entry per line (- for stdin)")
    _text_encoder_option(p)
    p.add_argument("--top-k", type=int, default=5)
    device_option(p)
    p.set_defaults(func=_cmd_search)


def _text_encoder_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="minilm", help="text encoder (default minilm)")


def _cmd_classify(args) -> int:
    from ..inference.classify import classify_files
    from ..recipes.registry import RECIPES, kind_of

    kind = kind_of(args.run_dir)
    if not kind.classifier:
        heads = ", ".join(name for name, r in RECIPES.items() if r.classifier)
        raise QkvError(
            f"{args.run_dir} is a {kind.name} run, without a task head; classify needs a run of {heads}"
        )
    # what the run reads (images, a text file, FASTA) is the registry's to say and the
    # library's to act on; every input is read and predicted before anything is written
    write_predictions(classify_files(args.run_dir, args.inputs, kind.inputs, args.device))
    return 0


def _cmd_embed(args) -> int:
    from ..data.files import read_lines

    if args.model is not None:  # a pretrained text encoder: one text per line
        if len(args.inputs) != 1:
            raise QkvError("with --model, give one text file (one sentence per line)")
        texts = read_lines(args.inputs[0])
        vectors = _text_encoder(args.model, args.device).embed(texts)
        save_embeddings(args.out, vectors, texts, str(args.model))
        log(
            f"{len(texts)} sentence embeddings of width {vectors.shape[1]} (mean pooling, L2-normalised) "
            f"-> {args.out} (tensor 'mean', texts in metadata 'ids')"
        )
        return 0
    if len(args.inputs) != 2:
        raise QkvError("give RUN_DIR FASTA (a protein encoder), or --model NAME TEXT_FILE")
    import torch

    from ..data.protein import read_fasta
    from ..device import resolve_device
    from ..inference.protein import ProteinEncoder

    run_dir, fasta = args.inputs
    encoder = ProteinEncoder.from_run(run_dir, resolve_device(args.device))
    records = read_fasta(fasta)
    ids = [r.id for r in records]
    pooled, residues = encoder.embed([r.sequence for r in records], ids, per_residue=args.per_residue)
    # residues is empty without --per-residue: then there is nothing extra to save
    extra = {f"residues/{i}": torch.from_numpy(r).contiguous() for i, r in zip(ids, residues, strict=False)}
    save_embeddings(args.out, pooled, ids, str(Path(run_dir).resolve()), extra)
    log(
        f"{len(ids)} embeddings of width {pooled.shape[1]} -> {args.out} (tensor 'mean', ids in metadata"
        + (", per-residue tensors 'residues/<id>')" if args.per_residue else ")")
    )
    return 0


def _cmd_similarity(args) -> int:
    write_line(f"{_text_encoder(args.model, args.device).similarity(args.first, args.second):.4f}")
    return 0


def _cmd_search(args) -> int:
    from ..data.files import read_lines

    corpus = read_lines(args.corpus)
    hits = _text_encoder(args.model, args.device).search(args.query, corpus, args.top_k)
    write_tsv([f"{score:.4f}", corpus[i]] for score, i in hits)
    return 0


def _text_encoder(source: str, device: str):
    from ..device import resolve_device
    from ..inference.text import TextEncoder

    return TextEncoder.load(source, resolve_device(device))
