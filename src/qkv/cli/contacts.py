"""``qkv contacts``: residue-residue contact probabilities from a protein encoder's attention
(Rao et al. 2021), and the fitting of the logistic regression that reads them."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .. import cpu_share, extras
from ..errors import QkvError
from .console import log
from .options import MODEL_HELP, check_new_file, device_option, file_output_option, revision_option
from .output import write_tsv


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Register ``contacts``."""
    p = sub.add_parser(
        "contacts",
        help="contact maps from attention (Rao et al. 2021): `contacts MODEL FASTA --out FILE`, "
        "or fit the head: `contacts MODEL --fit`",
    )
    p.add_argument("model", metavar="MODEL", help=MODEL_HELP)
    p.add_argument("fasta", nargs="?", help="the sequences (FASTA) whose contacts to predict")
    file_output_option(p, "--out", "output .safetensors: one (L, L) float32 tensor per sequence id")
    p.add_argument(
        "--head",
        help="contact head to predict with (default: the run directory's contact_head.safetensors, "
        "else the checkpoint's own, as ESM-2 has)",
    )
    p.add_argument(
        "--fit",
        action="store_true",
        help="fit the head on the shared structures' fit half and print the long-range precision "
        "(top L, L/2, L/5; |i-j| >= 24) of each evaluation chain",
    )
    file_output_option(
        p,
        "--head-out",
        "--fit: where to write the head (default: MODEL/contact_head.safetensors for a run; replacing one "
        "there needs --overwrite)",
    )
    file_output_option(p, "--plot", "--fit: draw predicted and true contacts of one evaluation chain", "PNG")
    p.add_argument(
        "--plot-chain", help="--plot: which chain (PDBID_CHAIN; default the first evaluation chain)"
    )
    p.add_argument(
        "--fit-chains", help="--fit: fit on these chains (PDBID_CHAIN,...) instead of the fit half"
    )
    p.add_argument(
        "--eval-chains",
        help="--fit: evaluate on these chains (PDBID_CHAIN,...) instead of the evaluation half",
    )
    revision_option(p)
    device_option(p)
    p.set_defaults(func=_cmd_contacts)


def _cmd_contacts(args) -> int:
    return _fit(args) if args.fit else _predict(args)


def _encoder(args):
    from ..device import resolve_device
    from ..inference.protein import ProteinEncoder

    encoder = ProteinEncoder.load(args.model, resolve_device(args.device), args.revision)
    cpu_share.for_command()  # threads from the load, chosen once (the contact maps take none)
    return encoder


def _predict(args) -> int:
    import torch

    from ..data.protein import read_fasta
    from ..files import atomic_write
    from ..inference.contacts import find_contact_head, predict_contacts

    unused = [o for o in ("head_out", "plot", "plot_chain", "fit_chains", "eval_chains") if getattr(args, o)]
    if unused:
        raise QkvError(f"--{unused[0].replace('_', '-')} goes with --fit")
    if args.fasta is None or args.out is None:
        raise QkvError("give MODEL FASTA --out FILE (or MODEL --fit to fit a contact head)")
    records = read_fasta(args.fasta)
    encoder = _encoder(args)
    head = find_contact_head(args.model, encoder, args.head, args.revision)
    # every sequence is read and predicted before anything is written
    maps = {r.id: predict_contacts(encoder, head, r.sequence, r.id).contiguous() for r in records}
    metadata = {
        "ids": json.dumps(list(maps), ensure_ascii=False),
        "model": str(args.model),
        "head": head.model or str(args.head or ""),
        "method": "logistic regression on APC-corrected attention (Rao et al. 2021)",
    }
    from safetensors.torch import save_file

    tensors = {k: v.to(torch.float32) for k, v in maps.items()}
    atomic_write(Path(args.out), lambda tmp: save_file(tensors, tmp, metadata=metadata))
    log(f"{len(maps)} contact map(s) -> {args.out} (one (L, L) tensor per id; ids in metadata 'ids')")
    return 0


def _chain_names(text: str | None) -> list[str] | None:
    return None if text is None else [n.strip() for n in text.split(",") if n.strip()]


def _fit(args) -> int:
    from ..data.structures import CITATION, shared_chains
    from ..hub.pretrained import is_run_dir
    from ..inference.contacts import HEAD_FILE, TOPS, evaluate_contacts, fit_contact_head, mean_precision

    if args.fasta is not None or args.out is not None or args.head is not None:
        raise QkvError("--fit reads the shared structures: give no FASTA, --out or --head")
    model = Path(args.model)
    run_dir = model.is_dir() and is_run_dir(model)
    if args.head_out is None and not run_dir:
        raise QkvError(
            f"{args.model} is not a qkv run directory: say where to write the head with --head-out"
        )
    head_out = Path(args.head_out) if args.head_out else model / HEAD_FILE
    if args.head_out is None:  # a given --head-out went through check_file_outputs: its default too
        check_new_file(head_out, "--head-out", args.overwrite)
    if args.plot_chain and not args.plot:
        raise QkvError("--plot-chain goes with --plot PNG")
    if args.plot:
        extras.require("plot", "qkv contacts --plot")
    fit_names, eval_names = _chain_names(args.fit_chains), _chain_names(args.eval_chains)
    # the structures are read (and checked against chains.tsv) before the model runs
    fit_chains = shared_chains(None if fit_names else "fit", fit_names)
    eval_chains = shared_chains(None if eval_names else "evaluate", eval_names)
    plotted = eval_chains[0] if eval_chains else None
    if args.plot_chain:
        plotted = next((c for c in eval_chains if c.name == args.plot_chain), None)
        if plotted is None:
            raise QkvError(f"--plot-chain {args.plot_chain} is not among the evaluation chains")
    encoder = _encoder(args)
    source = str(model.resolve()) if model.exists() else str(args.model)
    head = fit_contact_head(encoder, fit_chains, source)
    rows = evaluate_contacts(encoder, head, eval_chains)
    mean = mean_precision(rows)
    write_tsv(
        [
            *([r["chain"], str(r["length"]), *(f"{r[k]:.3f}" for k in TOPS)] for r in rows),
            ["mean", "", *(f"{mean[k]:.3f}" for k in TOPS)],
        ],
        header=["chain", "length", *(f"top_{k}" for k in TOPS)],
    )
    head.save(head_out)
    log(
        f"contact head ({head.info['nonzero_weights']} of {head.weight.numel()} maps used) -> {head_out}; "
        f"long-range (|i-j| >= 24) precision on {len(rows)} chains: top-L {mean['L']:.3f}, "
        f"top-L/5 {mean['L/5']:.3f} ({CITATION})"
    )
    if args.plot and plotted is not None:
        from ..explain.contacts import save_contact_figure

        log(f"{plotted.name} -> {save_contact_figure(encoder, head, plotted, args.plot)}")
    return 0
