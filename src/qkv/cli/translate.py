"""``qkv translate``: translate sentences with a trained run, one per line in and out."""

from __future__ import annotations

import argparse
import sys

from .. import cpu_share
from ..errors import QkvError
from .console import log
from .options import device_option, search_options, words_after_options
from .output import write_line


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Register ``translate``."""
    p = sub.add_parser("translate", help="translate text with a trained run")
    p.add_argument("run_dir")
    p.add_argument("text", nargs="*", help="sentences (default: one per line on stdin)")
    words_after_options(p, "text")  # sentences after options: `translate RUN --beam 1 "Hallo"`
    own = "the run's own: its test's decoding"
    search_options(p, beam=None, default_beam=own, default_alpha=own)
    device_option(p)
    p.add_argument(
        "--batch-size",
        type=int,
        default=64,
        help="sentences decoded together (default 64): speed and memory only, the output is the same",
    )
    p.add_argument("--verbose", action="store_true", help="print sentences/s on stderr at the end")
    p.set_defaults(func=_cmd_translate)


def _cmd_translate(args) -> int:
    from ..device import resolve_device
    from ..inference.translator import Translator, check_batch_size
    from ..recipes.translation import run_decoding

    batch_size = check_batch_size(args.batch_size, "--batch-size")  # before the run is loaded
    beam, alpha = run_decoding(args.run_dir, args.beam, args.alpha)
    translator = Translator.from_run(
        args.run_dir,
        device=resolve_device(args.device),
        beam_size=beam,
        alpha=alpha,
        batch_size=batch_size,
        cpu=cpu_share.for_command(),
    )
    for line in translator.translate(_read_inputs(args.text)):
        write_line(line)
    if args.verbose:
        sys.stdout.flush()
        assert translator.last_stats is not None  # translate() sets it
        log(translator.last_stats.summary("sentences"))
    return 0


def _read_inputs(texts: list[str]) -> list[str]:
    """The sentences given as arguments, else the lines of standard input; either must be
    UTF-8."""
    if texts:
        for i, text in enumerate(texts):
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as exc:  # bytes the shell passed that are not UTF-8
                raise QkvError(f"argument {i + 1} is not valid UTF-8 (character {exc.start})") from None
        return list(texts)
    data = sys.stdin.buffer.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise QkvError(
            f"standard input is not valid UTF-8 (byte {exc.start}: {data[exc.start : exc.start + 1]!r})"
        ) from None
    return text.splitlines()
