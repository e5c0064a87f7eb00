"""``qkv generate``: continue a prompt with a trained or pretrained language model, streamed to
stdout (or the most likely next tokens, ``--top-probs``)."""

from __future__ import annotations

import argparse
import logging
import sys

from ..errors import QkvError
from .console import log
from .options import device_option, sampling_options
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
    p.set_defaults(func=_cmd_generate)


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


def _cmd_generate(args) -> int:
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
    return TextGenerator.from_run(args.run_dir or args.model, device=device, dtype=dtype, quantize=quantize)
