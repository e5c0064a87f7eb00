"""The verbs that read an encoder's output: ``classify`` (TSV of classes), ``similarity`` and
``search`` (sentence embeddings compared); ``embed`` is :mod:`qkv.cli.embed`."""

from __future__ import annotations

import argparse

from .. import cpu_share
from ..errors import QkvError
from .options import device_option, revision_option
from .output import write_line, write_predictions, write_tsv


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Register ``classify``, ``similarity`` and ``search``."""
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
    p.add_argument(
        "--model",
        default="minilm",
        help="text encoder: minilm (default), a Hub name org/name, an HF folder or a converted run",
    )
    revision_option(p)


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
    cpu_share.for_command()  # threads from the load, chosen once (the classifiers take none)
    write_predictions(classify_files(args.run_dir, args.inputs, kind.inputs, args.device))
    return 0


def _cmd_similarity(args) -> int:
    encoder = _text_encoder(args.model, args.device, args.revision)
    write_line(f"{encoder.similarity(args.first, args.second):.4f}")
    return 0


def _cmd_search(args) -> int:
    from ..data.sources import read_lines

    corpus = read_lines(args.corpus)
    hits = _text_encoder(args.model, args.device, args.revision).search(args.query, corpus, args.top_k)
    write_tsv([f"{score:.4f}", corpus[i]] for score, i in hits)
    return 0


def _text_encoder(source: str, device: str, revision: str | None = None):
    from ..device import resolve_device
    from ..inference.text import TextEncoder

    encoder = TextEncoder.load(source, resolve_device(device), revision)
    cpu_share.for_command()  # threads from the load, chosen once (the text encoder takes none)
    return encoder
