"""``qkv generate``: continue a prompt with a trained or pretrained language model, streamed to
stdout (or the most likely next tokens, ``--top-probs``); with a masked diffusion LM run
(``qkv train diffusion-lm``), generate by unmasking or fill a template's masked spans
(``--infill``)."""

from __future__ import annotations

import argparse
import logging
import sys

from .. import cpu_share, extras
from ..errors import QkvError
from ..inference.diffusion import REMASKING
from .console import log
from .options import device_option, file_output_option, sampling_options
from .output import write_tsv


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Register ``generate``."""
    p = sub.add_parser("generate", help="continue a prompt with a trained language model (streams to stdout)")
    p.add_argument("run_dir", nargs="?", help="a language-model run directory (or give --model)")
    p.add_argument(
        "--model",
        help='a pretrained LM instead: iglm (antibodies: --prompt "[HEAVY] [HUMAN] EVQ"), '
        "an HF GPT-2 folder or a converted run",
    )
    p.add_argument("--prompt", default="", help="text to continue (empty: start from the start token)")
    sampling_options(p, max_new_tokens=200, temperature=None, seed=None)
    p.add_argument("--greedy", action="store_true", help="always take the most likely token")
    p.add_argument("--stop", action="append", default=[], help="stop at this string (repeatable)")
    p.add_argument("--num-samples", type=int, default=1)
    p.add_argument(
        "--top-probs",
        type=int,
        metavar="K",
        help="instead of generating, print the K most likely next tokens and their probabilities",
    )
    device_option(p)
    p.add_argument(
        "--dtype",
        choices=("auto", "float32", "bfloat16", "int8"),
        default="auto",
        help="weights' precision for decoding (auto: bfloat16 on CUDA and on CPUs with "
        "AMX bfloat16 units, else float32; int8: int8 weights, bfloat16 activations, "
        "faster on CPUs with native bfloat16, at a small quality cost)",
    )
    p.add_argument("--verbose", action="store_true", help="print tokens/s on stderr after each sample")
    d = p.add_argument_group("masked diffusion LM runs (qkv train diffusion-lm)")
    d.add_argument(
        "--infill",
        metavar="TEMPLATE",
        help='fill the masked spans of TEMPLATE, each "_" one token ("ROMEO: ____ my lord")',
    )
    d.add_argument("--steps", type=int, help="denoising steps in all (default: one per masked token)")
    d.add_argument(
        "--remasking",
        choices=REMASKING,
        help="which predictions each step keeps: the most confident (LLaDA, the default) or random (MDLM)",
    )
    d.add_argument(
        "--block-length",
        type=int,
        help="unmask in left-to-right blocks of this many tokens (semi-autoregressive)",
    )
    d.add_argument("--mask-char", help='the character that marks a masked token in --infill (default "_")')
    file_output_option(d, "--trajectory", "draw the denoising trajectory of the first sample", "PNG")
    p.set_defaults(func=_cmd_generate)


DIFFUSION_OPTIONS = ("infill", "steps", "remasking", "block_length", "mask_char", "trajectory")


class _PromptEcho:
    """Streams one sample to stdout, the prompt echoed with its first new text: a prompt or
    setting the generator refuses leaves nothing on stdout."""

    def __init__(self, prompt: str) -> None:
        self.prompt, self.echoed = prompt, False

    def __call__(self, row: int, text: str) -> None:
        if not self.echoed:
            sys.stdout.write(self.prompt)
            self.echoed = True
        sys.stdout.write(text)
        sys.stdout.flush()

    def end(self) -> None:
        self(0, "\n")


def _is_diffusion_run(args) -> bool:
    """Whether ``run_dir`` is a ``diffusion-lm`` run; diffusion options on any other model are
    refused (one line, before loading)."""
    from ..recipes import registry

    diffusion = args.run_dir is not None and registry.kind_of(args.run_dir).name == "diffusion-lm"
    given = [f"--{k.replace('_', '-')}" for k in DIFFUSION_OPTIONS if getattr(args, k) is not None]
    if given and not diffusion:
        raise QkvError(f"{', '.join(given)} apply to masked diffusion LM runs (qkv train diffusion-lm) only")
    if diffusion:
        ar_only = [
            f
            for f, v in (("--top-probs", args.top_probs), ("--top-k", args.top_k), ("--top-p", args.top_p))
            if v is not None
        ]
        if args.stop:
            ar_only.append("--stop")
        if ar_only:
            raise QkvError(
                f"{', '.join(ar_only)} apply to autoregressive LMs; {args.run_dir} is a diffusion LM"
            )
    return diffusion


def _cmd_generate(args) -> int:
    if _is_diffusion_run(args):
        return _cmd_diffusion(args)
    gen = _load(args)
    temperature = 1.0 if args.temperature is None else args.temperature
    if args.top_probs is not None:
        if args.top_probs < 1:
            raise QkvError(f"--top-probs must be >= 1 (got {args.top_probs})")
        probs = gen.next_token_probs(args.prompt, args.top_probs, temperature, args.top_p)
        write_tsv([f"{prob:.4f}", repr(token)] for token, prob in probs)
        return 0
    for i in range(args.num_samples):
        if args.num_samples > 1:
            log(f"--- sample {i + 1} ---")
        echo = _PromptEcho(args.prompt)
        gen.generate(
            [args.prompt],
            args.max_new_tokens,
            not args.greedy,
            temperature,
            args.top_k,
            args.top_p,
            stop=args.stop,
            seed=None if args.seed is None else args.seed + i,
            stream=echo,
        )
        echo.end()
        if args.verbose:
            sys.stdout.flush()
            assert gen.last_stats is not None  # generate() sets it
            log(gen.last_stats.summary())
    sys.stdout.flush()
    return 0


def _load(args):
    """The generator of ``run_dir`` or ``--model``, in the precision ``--dtype`` asks for, once
    the options are checked."""
    import torch

    from ..device import resolve_device, resolve_precision
    from ..inference.lm import TextGenerator

    device = resolve_device(args.device)
    quantize = "int8" if args.dtype == "int8" else None
    names = {"auto": "auto", "float32": "fp32", "bfloat16": "bf16", "int8": "bf16"}
    precision, why = resolve_precision(names[args.dtype], device, decoding=True)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    logging.getLogger("qkv.cli").debug(
        f"dtype: {args.dtype if quantize else str(dtype).removeprefix('torch.')} ({why})"
    )
    if (args.run_dir is None) == (args.model is None):
        raise QkvError("give a run directory or --model NAME|PATH (a pretrained language model)")
    if args.num_samples < 1 or args.max_new_tokens < 0:
        raise QkvError(
            f"--num-samples must be >= 1 and --max-new-tokens >= 0 (got {args.num_samples} and "
            f"{args.max_new_tokens})"
        )
    return TextGenerator.from_run(
        args.run_dir or args.model, device=device, dtype=dtype, quantize=quantize, cpu=cpu_share.for_command()
    )


def _cmd_diffusion(args) -> int:
    """``qkv generate`` of a masked diffusion LM: a continuation of ``--prompt`` or the filled
    ``--infill`` template, each sample on its own line(s); the trajectory drawn on request."""
    from ..device import resolve_device
    from ..inference.diffusion import DEFAULT_REMASKING, MASK_CHAR, DiffusionGenerator

    if args.num_samples < 1:
        raise QkvError(f"--num-samples must be >= 1 (got {args.num_samples})")
    if args.trajectory is not None:  # before any sample is drawn and printed
        extras.require("plot", "qkv generate --trajectory")
    gen = DiffusionGenerator.from_run(args.run_dir, resolve_device(args.device))
    cpu_share.for_command()  # threads from the load, chosen once (the diffusion sampler takes none)
    options = {
        "remasking": args.remasking or DEFAULT_REMASKING,
        "block_length": args.block_length,
        "temperature": 0.0 if args.greedy else (1.0 if args.temperature is None else args.temperature),
        "num_samples": args.num_samples,
        "seed": args.seed,
        "trace": args.trajectory is not None,
    }
    if args.infill is not None:
        texts = gen.infill(
            args.infill,
            args.steps,
            mask_char=MASK_CHAR if args.mask_char is None else args.mask_char,
            **options,
        )
    else:
        texts = [
            args.prompt + t for t in gen.generate(args.prompt, args.max_new_tokens, args.steps, **options)
        ]
    for i, text in enumerate(texts):
        if len(texts) > 1:
            log(f"--- sample {i + 1} ---")
        sys.stdout.write(text + "\n")
    sys.stdout.flush()
    if args.trajectory is not None:
        from ..explain.diffusion import plot_trajectory, trajectory
        from ..explain.plots import save

        assert gen.last_trace is not None  # asked for with trace=True
        fig = plot_trajectory(trajectory(gen.last_trace, gen.tokenizer))
        log(f"trajectory: {save(fig, args.trajectory)}")
    return 0
