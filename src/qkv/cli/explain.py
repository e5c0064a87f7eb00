"""``qkv explain``: a model's attention on an input, as pictures, a standalone HTML page or an
interactive local web page."""

from __future__ import annotations

import argparse
import math

from .. import cpu_share
from ..errors import QkvError
from ..extras import require
from .console import log
from .options import (
    device_option,
    file_output_option,
    folder_output_option,
    onnx_weights_option,
    sampling_options,
    search_options,
)
from .output import write_line


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Register ``explain``."""
    p = sub.add_parser(
        "explain",
        help="a model's attention on an input: pictures, a standalone HTML page, or a local web page",
    )
    p.add_argument("run_dir")
    # the options in --help's order: what to explain, where it goes, how it is shown, decoding
    _input_options(p)
    _output_options(p)
    _view_options(p)
    _generation_options(p)
    device_option(p, default="cpu")
    p.set_defaults(func=_cmd_explain)


def _input_options(p: argparse.ArgumentParser) -> None:
    """``--input`` and ``--pair``: what the attention is on."""
    p.add_argument(
        "--input",
        help="the text (sentence, prompt or protein sequence) to explain; for a "
        "vit run an image file (PNG, JPEG, ...) or test:INDEX (an image of its test set)",
    )
    p.add_argument(
        "--pair",
        metavar="SECOND",
        help="sentence encoders (MiniLM, BERT, text-cls runs): the second sentence of a pair "
        "(the page shows the pair's cosine similarity)",
    )


def _output_options(p: argparse.ArgumentParser) -> None:
    """Where the explanation goes: PNG files, one HTML file, or a local server."""
    folder_output_option(
        p,
        "--out",
        "directory for the PNG files (with --input); one that is not empty needs --overwrite",
    )
    file_output_option(
        p,
        "--html",
        "write the explainer page of --input as one self-contained HTML file (no server; opens "
        "offline in any browser)",
    )
    p.add_argument("--serve", action="store_true", help="start the interactive page instead")
    folder_output_option(
        p,
        "--live",
        "write a new folder whose page runs the model in the browser (ONNX, onnxruntime-web); "
        "serve it with any static server (char LM, translation, vit and scene-caption runs)",
        new=True,
    )
    onnx_weights_option(p, "with --live")
    p.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)"
    )
    p.add_argument("--port", type=int, default=8765)


def _view_options(p: argparse.ArgumentParser) -> None:
    """How much input is taken and which layer and head the pictures show."""
    from ..explain.standalone import MAX_TOKENS

    p.add_argument(
        "--max-chars",
        type=int,
        help="longest input accepted, in characters (default 400; --html: none, --max-tokens cuts)",
    )
    p.add_argument(
        "--max-tokens",
        type=int,
        default=MAX_TOKENS,
        help=f"--html: a longer input is cut to this many tokens and the page says so (default {MAX_TOKENS})",
    )
    p.add_argument(
        "--pieces", action="store_true", help="label subword pieces instead of merging them into words"
    )
    p.add_argument(
        "--layer",
        type=int,
        default=-1,
        help="layer (0-based, -1 = last) of the alignment and step-through pictures",
    )
    p.add_argument("--head", type=int, default=1, help="head (1-based) of the step-through picture")


def _generation_options(p: argparse.ArgumentParser) -> None:
    """How outputs are decoded (beam search, sampling) and a diffusion run's step."""
    search_options(
        p,
        beam=None,
        length_penalty=False,
        who="translation and captions",
        default_beam="4; a caption run: its own",
    )
    sampling_options(p, max_new_tokens=40, temperature=1.0, seed=0)
    p.add_argument(
        "--step",
        type=int,
        help="diffusion-lm runs: the denoising step (from 0) whose input the attention is on (default: last)",
    )


def _cmd_explain(args) -> int:
    from ..device import resolve_device
    from ..explain.explainer import DEFAULT_MAX_CHARS
    from ..explain.standalone import UNCAPPED_CHARS
    from ..recipes.loading import load_explainer

    if args.live is not None:
        from ..explain.live import write_live_page

        if args.input is not None or args.serve or args.html is not None or args.out is not None:
            raise QkvError("--live DIR writes the live page alone (no --input, --serve, --html or --out)")
        write_line(write_live_page(args.run_dir, args.live, weights=args.weights))
        return 0
    _check_what_to_write(args)
    # A standalone page cuts its input to --max-tokens (and says so): no character cap by default.
    max_chars = args.max_chars or (UNCAPPED_CHARS if args.html else DEFAULT_MAX_CHARS)
    explainer = load_explainer(args.run_dir, resolve_device(args.device), max_chars=max_chars)
    if args.serve:
        from ..explain.server import serve

        return serve(explainer, host=args.host, port=args.port)
    _check_explain_options(args, explainer.info())
    if args.pair is not None and explainer.family != "text":
        raise QkvError(f"--pair is for sentence encoders (text runs); this is a {explainer.family} model")
    cpu_share.for_command()  # threads from the load, chosen once (the explainers take none)
    if args.html is not None:
        from ..explain.standalone import standalone_page

        page = standalone_page(
            explainer,
            args.input,
            pair=args.pair,
            options=_decoding_options(args),
            max_tokens=args.max_tokens,
            merge_words=not args.pieces,
        )
        for note in page.notes:
            log(f"note: {note}")
        write_line(page.save(args.html))
    if args.out is not None:
        from ..explain.plots import write_pictures

        text = args.input if args.pair is None else f"{args.input} ||| {args.pair}"
        for path in write_pictures(
            explainer,
            text,
            args.out,
            _decoding_options(args),
            merge_words=not args.pieces,
            layer=args.layer,
            head=args.head - 1,
        ):
            write_line(path)
    return 0


def _check_what_to_write(args) -> None:
    """Refuse sizes that mean nothing, a request for no output (or two that exclude each
    other) and one whose extra is not installed (--serve, --out's pictures), before the model
    loads."""
    if args.max_chars is not None and args.max_chars < 1:
        raise QkvError(f"--max-chars must be >= 1 (got {args.max_chars})")
    if args.max_tokens < 1:
        raise QkvError(f"--max-tokens must be >= 1 (got {args.max_tokens})")
    if args.serve == (args.input is not None):
        raise QkvError(
            "give either --input TEXT (an image file for a vit run; with --out DIR and/or --html FILE) "
            "or --serve"
        )
    if args.serve and args.html:
        raise QkvError("--html writes the page of one --input; --serve serves the interactive page")
    if not args.serve and args.out is None and args.html is None:
        raise QkvError("--input needs --out DIR (PNG pictures) or --html FILE (a standalone page), or both")
    if args.serve:
        require("serve", "qkv explain --serve")
    if args.out is not None:
        require("plot", "qkv explain --out (PNG pictures)")


def _check_explain_options(args, info: dict) -> None:
    """Refuse ``qkv explain`` options outside the model, before any picture is written."""
    layers, heads = info["n_layers"], info["n_heads"]
    problems = []
    if not -layers <= args.layer < layers:
        problems.append(
            f"--layer {args.layer} is outside the model's layers 0..{layers - 1} (or -1 for the last)"
        )
    if not 1 <= args.head <= heads:
        problems.append(f"--head {args.head} is outside the model's heads 1..{heads}")
    if not (math.isfinite(args.temperature) and args.temperature >= 0):
        problems.append(
            f"--temperature must be a finite number >= 0, 0 meaning greedy (got {args.temperature})"
        )
    if args.beam is not None and args.beam < 1:
        problems.append(f"--beam must be >= 1 (got {args.beam})")
    if problems:
        raise QkvError("; ".join(problems))


def _decoding_options(args):
    from ..explain.explainer import DecodingOptions

    return DecodingOptions(
        beam_size=args.beam,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        step=args.step,
    )
