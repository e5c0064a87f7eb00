"""``qkv caption``: describe images with a ``qkv train caption`` run, one TSV line per image
(``file<TAB>caption``) on stdout, in the order the files were given."""

from __future__ import annotations

import argparse

from .. import cpu_share
from .options import device_option, search_options
from .output import write_tsv


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Register ``caption``."""
    p = sub.add_parser("caption", help="caption images with a trained caption run (TSV: file, caption)")
    p.add_argument("run_dir")
    p.add_argument(
        "images",
        nargs="+",
        metavar="IMAGE",
        help="image files (PNG, JPEG, ...): converted to the model's channels, transparency "
        "over the run's background, resized to its image size (a note on stderr says so)",
    )
    search_options(p, beam=None, alpha=0.6, who="caption", default_beam="the run's own, as it was validated")
    device_option(p)
    p.set_defaults(func=_cmd_caption)


def _cmd_caption(args) -> int:
    from ..device import resolve_device
    from ..inference.caption import Captioner

    captioner = Captioner.from_run(
        args.run_dir, device=resolve_device(args.device), beam_size=args.beam, alpha=args.alpha
    )
    # every file is read and checked before the first caption is written
    images = captioner.read(args.images)
    cpu_share.for_command()  # threads from the load, chosen once (the captioner takes none)
    captions = captioner.caption(images)
    write_tsv([path, " ".join(text.split())] for path, text in zip(args.images, captions, strict=True))
    return 0
