"""``qkv evaluate``: score a run on a split of its own task's data (JSON on stdout)."""

from __future__ import annotations

import argparse

from .. import cpu_share
from ..errors import QkvError
from .options import device_option, search_options
from .output import write_json


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Register ``evaluate``."""
    from ..recipes.registry import RECIPES

    p = sub.add_parser("evaluate", help="score a run on a data split (JSON on stdout)")
    p.add_argument("run_dir")
    defaults = "; ".join(f"{name}: {', '.join(r.splits)}" for name, r in RECIPES.items() if r.evaluate)
    p.add_argument("--split", help=f"the data split to score, the first named being the default ({defaults})")
    # None: given or not (only translation takes them; absent, the run's own)
    own = "the run's own: its test's decoding"
    search_options(p, beam=None, default_beam=own, default_alpha=own)
    p.add_argument("--limit", type=int, help="translation: score only the first N sentences")
    device_option(p)
    p.set_defaults(func=_cmd_evaluate)


def _cmd_evaluate(args) -> int:
    from ..device import resolve_device
    from ..recipes.registry import kind_of

    kind = kind_of(args.run_dir)
    if kind.evaluate is None:
        raise QkvError(f"{args.run_dir} is a {kind.name!r} run, which qkv evaluate does not score")
    given = {"beam_size": args.beam, "alpha": args.alpha, "limit": args.limit}
    given = {k: v for k, v in given.items() if v is not None}
    if unused := [k for k in given if k not in kind.evaluate_options]:
        flags = ", ".join("--" + {"beam_size": "beam"}.get(k, k) for k in unused)
        raise QkvError(f"{flags}: not an option of a {kind.name} run's evaluation")
    if args.limit is not None and args.limit < 1:
        raise QkvError(f"--limit must be >= 1 (got {args.limit})")
    split = args.split or kind.splits[0]
    if split not in kind.splits:
        raise QkvError(f"a {kind.name} run has the splits {', '.join(kind.splits)} (got --split {split})")
    cpu_share.for_command()  # threads from the load, chosen once (a recipe's evaluation takes none)
    result = kind.evaluate(args.run_dir, split, device=resolve_device(args.device), **given)
    result.pop("examples", None)  # the scores only; summary.json keeps examples
    write_json(result, ensure_ascii=True)  # non-ASCII escaped, as evaluate has always written it
    return 0
