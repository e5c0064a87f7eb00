"""The ``qkv`` command line: one verb per user intent.

Human-readable progress goes to stderr; results (translations, JSON) go to stdout. Errors are
one line on stderr with a non-zero exit; ``--debug`` shows the traceback.

Each verb module registers its verbs (``add_parsers``) with the function that runs them
(``func``); :func:`main` parses, sets up logging, checks the environment variables qkv reads
(:func:`qkv.cpu_share.read_environment`) and the files the verb will write (one rule for all:
:func:`~qkv.cli.options.file_output_option`), runs that function and turns what it raises into
an exit status (:mod:`qkv.cli.console`).
"""

from __future__ import annotations

import argparse
from importlib import metadata

from .. import cpu_share
from . import (
    caption,
    classify,
    contacts,
    convert,
    embed,
    evaluate,
    explain,
    generate,
    prepare,
    runs,
    train,
    translate,
    variants,
)
from .console import log, report, setup_logging
from .options import Parser, check_file_outputs, debug_option, take_late_words

__all__ = ["build_parser", "main", "version"]

# in the order `qkv --help` lists the verbs
VERBS = (
    train,
    prepare,
    translate,
    evaluate,
    generate,
    classify,
    embed,
    variants,
    contacts,
    caption,
    convert,
    explain,
    runs,
)


def version() -> str:
    """The version of the installed ``qkv`` distribution (its metadata, what pip reports), or
    ``qkv.__version__`` when qkv runs from a source tree that was never installed."""
    try:
        return metadata.version("qkv")
    except metadata.PackageNotFoundError:
        from .. import __version__

        return __version__


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``qkv`` and every verb."""
    parser = Parser(prog="qkv", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"qkv {version()}")
    debug_option(parser)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for verb in VERBS:
        verb.add_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``qkv`` with ``argv`` (default: the process's arguments); return the exit status:
    0, 2 for a problem the user can act on, 1 for a bug in qkv, 130 when interrupted."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and not take_late_words(args, extra):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    setup_logging(getattr(args, "quiet", False), args.debug)
    try:
        # the environment first: a variable qkv cannot read refuses every verb before it writes
        cpu_share.read_environment()
        check_file_outputs(args)
        return args.func(args)
    except KeyboardInterrupt:
        log("interrupted")
        return 130
    except Exception as exc:
        if args.debug:
            raise
        return report(exc)
