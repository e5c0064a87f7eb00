"""``qkv embed``: protein embeddings of a FASTA file of any size into a directory of shards
(streamed, resumable: run the same command again after a kill), or sentence embeddings of a
text file with a pretrained text encoder (``--model``) into one file."""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

from .. import cpu_share
from ..errors import QkvError
from .console import log
from .options import (
    MODEL_HELP,
    check_new_file,
    device_option,
    overwrite_option,
    quiet_option,
    revision_option,
)
from .output import save_embeddings

# the options that only protein embeddings take, with the values that mean "not given"
PROTEIN_ONLY = {
    "layers": None,
    "per_residue": False,
    "max_tokens": None,
    "shard_size": None,
    "format": "shards",
    "include": None,
}

ESM_INCLUDE = ("per_tok", "mean", "bos", "contacts")  # qkv.inference.embed.ESM_INCLUDE


# every MODEL a protein verb (embed, score-variants, contacts) takes, as qkv.hub.pretrained.load
# resolves it
def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Register ``embed``."""
    p = sub.add_parser(
        "embed",
        help="embeddings: proteins of a FASTA file with a protein encoder (into a directory of "
        "shards), or sentences with a pretrained text encoder (--model)",
        description="Proteins: MODEL FASTA --out DIR writes DIR/shard-00000.safetensors, ... "
        "(tensors mean/layer<k> (n, D) and, with --per-residue, residues/layer<k>/<id> (L, D); "
        "the ids, each record's whole header line, in each shard's metadata 'ids'; read them "
        "with qkv.inference.embed.read_embeddings) and DIR/manifest.json. Running the same command "
        "again resumes an interrupted run at its next shard, with the same bytes; a directory "
        "made with another model, input or settings is refused. Sequences longer than the model "
        "are embedded in overlapping windows (stride half the width; each residue from the "
        "window it is most central in). --format esm writes fair-esm extract.py's files instead: "
        "DIR/<label>.pt per sequence (label = the whole header line), read with "
        "torch.load(path, weights_only=True). Sentences: --model NAME TEXT_FILE --out "
        "FILE.safetensors.",
    )
    p.add_argument(
        "inputs",
        nargs="+",
        metavar="INPUT",
        help=f"MODEL FASTA, or --model NAME TEXT_FILE (one sentence per line). MODEL: {MODEL_HELP}",
    )
    p.add_argument(
        "--model",
        help="pretrained text encoder: minilm, a Hub name org/name[@REVISION], an HF folder or "
        "a converted run",
    )
    p.add_argument(
        "--out", required=True, help="proteins: output directory; sentences: output .safetensors file"
    )
    p.add_argument(
        "--layers",
        nargs="+",
        help="proteins: layers to keep, as ESM's repr_layers: 0 = embeddings, k = after layer k, "
        "the last = after the final norm, negative from the end; space-separated as in ESM's "
        "extract.py (--layers 0 6 -1), comma-separated (0,6,-1), or 'all' (default: the last)",
    )
    p.add_argument(
        "--per-residue", action="store_true", help="proteins: also store one (L, D) tensor per sequence"
    )
    _esm_options(p)
    p.add_argument(
        "--max-tokens",
        type=int,
        help="proteins: tokens per batch, padding included (default 16384); batches are sorted by length",
    )
    p.add_argument(
        "--shard-size",
        type=int,
        help="proteins: sequences per shard (default 10000, 1000 with --per-residue; a shard is "
        "held in memory whole; --format esm: sequences embedded and written together)",
    )
    overwrite_option(p)  # sentences: --out is a file (protein shards resume instead)
    revision_option(p)
    device_option(p)
    quiet_option(p, "no progress bar; warnings only")
    p.set_defaults(func=_cmd_embed)


def _esm_options(p: argparse.ArgumentParser) -> None:
    """``--format`` and ``--include``: fair-esm extract.py's files."""
    p.add_argument(
        "--format",
        choices=("shards", "esm"),
        default="shards",
        help="proteins: shards (default: safetensors shards and a manifest, as above) or esm: "
        "fair-esm extract.py's <label>.pt per sequence, a dict of label, representations "
        "{layer: (L, D)}, mean_representations {layer: (D,)}, ... as --include asks; a sequence "
        "longer than the model (ESM-2: 1022 residues) is cut to its first residues as extract.py "
        "cuts it; a '/' in a label makes folders, as there",
    )
    p.add_argument(
        "--include",
        nargs="+",
        choices=ESM_INCLUDE,
        metavar="WHAT",
        help="--format esm: what each file holds, as extract.py's --include: per_tok "
        "(representations), mean (mean_representations), bos (bos_representations, the <cls> "
        "token's), contacts ((L, L) from the contact head `qkv contacts` would use: ESM-2's own, "
        "or a run's contact_head.safetensors) (default: mean; --per-residue adds per_tok)",
    )


def _cmd_embed(args) -> int:
    if args.model is not None:
        return _embed_texts(args)
    if len(args.inputs) != 2:
        raise QkvError("give MODEL FASTA (a protein encoder), or --model NAME TEXT_FILE")
    from ..device import resolve_device
    from ..inference.embed import MANIFEST, Embedder, EmbedJob
    from ..inference.protein import ProteinEncoder

    source, fasta = args.inputs
    if Path(args.out).suffix == ".safetensors":
        raise QkvError(
            f"--out {args.out}: protein embeddings go into a directory (shards and {MANIFEST}), not one file"
        )
    if args.include is not None and args.format != "esm":
        raise QkvError("--include goes with --format esm (the shards hold means, and --per-residue tensors)")
    layers = _layers(args.layers)
    encoder = ProteinEncoder.load(source, resolve_device(args.device), args.revision)
    embedder = Embedder(encoder, layers, args.per_residue, args.max_tokens, cpu=cpu_share.for_command())
    if args.format == "esm":
        return _embed_esm(args, embedder)
    job = EmbedJob.open(embedder, fasta, args.out, args.shard_size)
    with _progress_bar(job, args.quiet) as bar:
        manifest = job.run(bar.update)
    names = ", ".join(f"mean/layer{k}" for k in embedder.layers)
    log(
        f"{job.total} embeddings of width {embedder.d_model} in {len(manifest['shards'])} shard(s) -> "
        f"{args.out} (tensors {names}" + (", residues/layer<k>/<id>" if args.per_residue else "") + ")"
    )
    return 0


def _progress_bar(job, quiet: bool):
    """A tqdm bar on stderr over ``job``'s sequences, from those already done."""
    from tqdm import tqdm

    return tqdm(
        total=job.total,
        initial=job.done,
        unit="seq",
        file=sys.stderr,
        disable=quiet or job.done == job.total,
        dynamic_ncols=True,
    )


def _embed_esm(args, embedder) -> int:
    """``--format esm``: fair-esm extract.py's ``<label>.pt`` files (:class:`EsmJob`)."""
    from ..inference.embed import EsmJob

    include = set(args.include or ["mean"]) | ({"per_tok"} if args.per_residue else set())
    contacts = None
    if "contacts" in include:  # (sequence, label) -> (L, L), with the checkpoint's own head
        from ..inference.contacts import find_contact_head, predict_contacts

        head = find_contact_head(args.inputs[0], embedder.encoder, None, args.revision)
        contacts = functools.partial(predict_contacts, embedder.encoder, head)
    job = EsmJob.open(embedder, args.inputs[1], args.out, include, contacts, args.shard_size)
    with _progress_bar(job, args.quiet) as bar:
        job.run(bar.update)
    log(
        f"{job.total} fair-esm extract.py files (<label>.pt: {', '.join(job.include)}; layers "
        f"{', '.join(map(str, job.embedder.layers))}; width {embedder.d_model}) -> {args.out}"
    )
    return 0


def _layers(given: list[str] | None) -> str | list[int]:
    """``--layers``: ``all``, or integers, space- or comma-separated (default: the last layer)."""
    if given is None:
        return [-1]
    parts = [part.strip() for word in given for part in word.split(",") if part.strip()]
    if parts == ["all"]:
        return "all"
    try:
        if not parts:
            raise ValueError
        return [int(part) for part in parts]
    except ValueError:
        raise QkvError(
            f"--layers {' '.join(given)}: give layer numbers (e.g. 0 6 -1, or 0,6,-1) or 'all'"
        ) from None


def _embed_texts(args) -> int:
    """Sentence embeddings of a text file (one sentence per line) into one ``.safetensors``."""
    from ..data.sources import read_lines
    from ..device import resolve_device
    from ..inference.text import TextEncoder

    given = [k for k, unset in PROTEIN_ONLY.items() if getattr(args, k) != unset]
    if given:
        raise QkvError(
            f"--{given[0].replace('_', '-')} applies to protein embeddings only (not with --model)"
        )
    if len(args.inputs) != 1:
        raise QkvError("with --model, give one text file (one sentence per line)")
    check_new_file(args.out, "--out", args.overwrite)
    texts = read_lines(args.inputs[0])
    cpu_share.for_command()  # threads from the load, chosen once (the text encoder takes none)
    vectors = TextEncoder.load(args.model, resolve_device(args.device), args.revision).embed(texts)
    save_embeddings(args.out, vectors, texts, str(args.model))
    log(
        f"{len(texts)} sentence embeddings of width {vectors.shape[1]} (mean pooling, L2-normalised) "
        f"-> {args.out} (tensor 'mean', texts in metadata 'ids')"
    )
    return 0
