"""``qkv convert``: Hugging Face checkpoints in (``convert hf``) and out (``convert --to hf``)."""

from __future__ import annotations

import argparse

from ..errors import QkvError
from .console import log


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Register ``convert``."""
    p = sub.add_parser(
        "convert",
        help="HF checkpoints in and out: `convert hf HF_DIR RUN_DIR`, `convert --to hf RUN_DIR HF_DIR`",
    )
    p.add_argument("paths", nargs="+", help="hf HF_DIR|NAME RUN_DIR, or (with --to hf) RUN_DIR HF_DIR")
    p.add_argument("--to", choices=("hf",), help="export a qkv run directory as an HF folder")
    p.add_argument("--tokenizer", help="tokenizer.json or vocab.txt, when the HF folder has none")
    p.set_defaults(func=_cmd_convert)


def _cmd_convert(args) -> int:
    from ..hub.convert import export_hf, import_hf

    if args.to == "hf":
        if len(args.paths) != 2:
            raise QkvError("usage: qkv convert --to hf RUN_DIR HF_DIR")
        out = export_hf(*args.paths)
        log(
            f"wrote {out} (config.json, model.safetensors, tokenizer.json): load it with "
            f"transformers' from_pretrained"
        )
        return 0
    if len(args.paths) != 3 or args.paths[0] != "hf":
        raise QkvError("usage: qkv convert hf HF_DIR|NAME RUN_DIR  (or: qkv convert --to hf RUN_DIR HF_DIR)")
    from ..hub.pretrained import is_short_name, locate

    source, run_dir = args.paths[1:]
    folder, tokenizer, settings = locate(source) if is_short_name(source) else (source, None, {})
    conv = import_hf(folder, run_dir, args.tokenizer or tokenizer, settings)
    n = sum(p.numel() for p in conv.model.parameters())
    log(
        f"{conv.family.name} ({', '.join(sorted(conv.parts))}; {n / 1e6:.1f} M parameters) -> {run_dir}\n"
        f"next: qkv convert --to hf {run_dir} HF_DIR"
    )
    return 0
