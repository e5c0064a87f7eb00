"""``qkv prepare``: tokenize a corpus once into token shards on disk (train with data=DIR)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import QkvError
from .console import log, remove_unstarted
from .options import quiet_option, words_after_options
from .output import write_line


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Register ``prepare``."""
    p = sub.add_parser(
        "prepare",
        help="tokenize a corpus once into token shards on disk (train with data=DIR)",
        description="Tokenize text (lm) or FASTA (protein-mlm) files into memory-mapped token "
        "shards, streaming them in bounded memory; run the same command again to resume an "
        "interrupted preparation.",
    )
    p.add_argument("kind", choices=("lm", "protein-mlm"))
    p.add_argument(
        "inputs",
        nargs="*",
        help="lm: UTF-8 text files (or tinyshakespeare), read as one text; protein-mlm: FASTA files "
        "(plain or .gz; default: the UniProt + RefSeq corpus)",
    )
    words_after_options(p, "inputs")  # files after options: `prepare lm --tokenizer bpe a.txt`
    p.add_argument("--out", required=True, help="directory to write (new, or an unfinished one to resume)")
    p.add_argument("--tokenizer", choices=("char", "bpe"), help="lm: characters (default) or byte-level BPE")
    p.add_argument("--vocab-size", type=int, help="lm with --tokenizer bpe: pieces (default 8000)")
    p.add_argument(
        "--bpe-sample-chars",
        type=int,
        help="lm with bpe: learn the merges from a random sample of about this many characters of "
        "the training text's paragraphs (default 32,000,000; all of them if the text is smaller)",
    )
    p.add_argument("--seed", type=int, help="of the BPE sample (default 0)")
    p.add_argument(
        "--val-fraction", type=float, help="held out: lm 0.1 (the last characters), protein-mlm 0.02 (by id)"
    )
    p.add_argument("--val-corpus", help="lm: a separate validation text instead of the last characters")
    p.add_argument("--keep-duplicates", action="store_true", help="protein-mlm: keep repeated sequences")
    p.add_argument("--shard-tokens", type=int, help="tokens per shard (default 67,108,864)")
    quiet_option(p, "no progress bar")
    p.set_defaults(func=_cmd_prepare)


def _cmd_prepare(args) -> int:
    # options left out take the library's defaults (declared once, in qkv.data.prepare)
    given = {
        k: getattr(args, k)
        for k in ("val_fraction", "shard_tokens", "vocab_size", "bpe_sample_chars", "seed", "val_corpus")
        if getattr(args, k) is not None
    }
    created = not Path(args.out).exists()
    try:
        meta = _prepare(args, given)
    except QkvError:  # refused: a directory this command created is left out, not half-made
        if created:
            remove_unstarted(Path(args.out), started_by=None)
        raise
    tokens, seqs = meta["tokens"], meta["sequences"]
    log(
        f"{tokens['train']:,} training and {tokens['val']:,} validation tokens "
        f"({seqs['train']:,} and {seqs['val']:,} sequences) in {len(meta['splits']['train'])} + "
        f"{len(meta['splits']['val'])} shard(s) of {meta['dtype']}; train with data={args.out}"
    )
    write_line(Path(args.out).resolve())
    return 0


def _prepare(args, given: dict) -> dict:
    from ..data import prepare

    if args.kind == "lm":
        if args.keep_duplicates:
            raise QkvError("--keep-duplicates: for qkv prepare protein-mlm (a text is one stream)")
        tokenizer = args.tokenizer or "char"
        return prepare.prepare_lm(
            args.inputs, args.out, tokenizer=tokenizer, progress=not args.quiet, **given
        )
    lm_only = sorted({"vocab_size", "bpe_sample_chars", "seed", "val_corpus"} & given.keys())
    if lm_only or args.tokenizer:
        flags = [f"--{k.replace('_', '-')}" for k in lm_only] + (["--tokenizer"] if args.tokenizer else [])
        raise QkvError(f"{', '.join(flags)}: for qkv prepare lm (proteins are read residue by residue)")
    return prepare.prepare_protein_mlm(
        args.inputs, args.out, dedup=not args.keep_duplicates, progress=not args.quiet, **given
    )
