"""``qkv convert``: Hugging Face checkpoints in (``convert hf``) and out (``convert --to hf``), and a
LoRA run's adapters out as a PEFT adapter beside its base model (``convert --to peft``)."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from ..errors import QkvError
from ..files import refuse_nonempty
from ..runs.layout import TOKENIZER
from .console import log
from .options import onnx_weights_option, revision_option


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Register ``convert``."""
    p = sub.add_parser(
        "convert",
        help="HF checkpoints in and out: `convert hf HF_DIR RUN_DIR`, `convert --to hf RUN_DIR HF_DIR`, "
        "`convert --to peft LORA_RUN_DIR DIR`, `convert --to onnx RUN_DIR DIR`",
    )
    p.add_argument(
        "paths",
        nargs="+",
        help="hf CHECKPOINT RUN_DIR (CHECKPOINT: an HF folder, a fair-esm .pt file, a short name "
        "such as antiberty or sapiens-vh, an ESM-2 name such as esm2_t33_650M_UR50D, or a Hub "
        "name org/name), or (with --to hf) RUN_DIR|CHECKPOINT HF_DIR, or (with --to peft) "
        "LORA_RUN_DIR DIR, or (with --to onnx) RUN_DIR DIR",
    )
    p.add_argument(
        "--to",
        choices=("hf", "peft", "onnx"),
        help="export a qkv run directory (or a checkpoint qkv reads) as an HF folder (hf), a LoRA "
        "run as the HF base model in DIR/base plus its adapters as a PEFT adapter in DIR (peft), or "
        "a run as ONNX graphs with its tokenizer.json, for onnxruntime (onnx)",
    )
    p.add_argument(
        "--opset",
        type=int,
        default=18,
        help="with --to onnx: the ONNX opset, from 17 to the newest the installed torch exporter writes",
    )
    p.add_argument(
        "--attentions",
        action="store_true",
        help="with --to onnx: every graph also outputs its attention weights",
    )
    onnx_weights_option(p, "with --to onnx")
    p.add_argument(
        "--push",
        metavar="REPO",
        help="with --to hf or --to peft: then upload the folder (its model card README.md included) to "
        "the Hub model repository REPO (NAME or ORG/NAME), created if needed; needs `hf auth login`",
    )
    p.add_argument("--tokenizer", help="tokenizer.json or vocab.txt, when the HF folder has none")
    revision_option(p)
    p.set_defaults(func=_cmd_convert)


def _recorded(source: str, args) -> str:
    """What a converted run records as its source: the resolved path of a file or folder, or a
    name with the revision it was read at."""
    from ..hub.hub_names import split_revision

    if Path(source).exists():
        return str(Path(source).resolve())
    repo, revision = split_revision(source, args.revision)
    return repo + (f"@{revision}" if revision else "")


def _cmd_convert(args) -> int:
    from ..hub.convert import write_run
    from ..hub.pretrained import read

    if args.to and len(args.paths) != 2:
        shown = {"peft": "LORA_RUN_DIR DIR", "onnx": "RUN_DIR DIR"}.get(args.to, "RUN_DIR HF_DIR")
        raise QkvError(f"usage: qkv convert --to {args.to} {shown}")
    if args.push:
        from ..hub.model_card import refuse_push

        if args.to not in ("hf", "peft"):
            raise QkvError(f"--push uploads what --to hf or --to peft writes, not {_what(args)}")
        refuse_push(args.push)  # before anything is read or written
    if args.to == "onnx":
        return _to_onnx(args)
    if args.to in ("hf", "peft"):
        out = _to_hf(args) if args.to == "hf" else _to_peft(args)
        if args.push:
            from ..hub.model_card import push_folder

            log(f"pushed {out} to {push_folder(out, args.push)}")
        return 0
    if len(args.paths) != 3 or args.paths[0] != "hf":
        raise QkvError(
            "usage: qkv convert hf CHECKPOINT RUN_DIR  (CHECKPOINT: an HF folder, a fair-esm .pt, or a "
            "name; or: qkv convert --to hf RUN_DIR|CHECKPOINT HF_DIR)"
        )
    source, run_dir = args.paths[1:]
    refuse_nonempty(run_dir)  # before a Hub download
    conv = read(source, args.revision, args.tokenizer)
    write_run(conv, run_dir, _recorded(source, args))
    n = sum(p.numel() for p in conv.model.parameters())
    log(
        f"{conv.family.name} ({', '.join(sorted(conv.parts))}; {n / 1e6:.1f} M parameters) -> {run_dir}\n"
        f"next: qkv convert --to hf {run_dir} HF_DIR"
    )
    return 0


def _what(args) -> str:
    """What a ``convert`` command without ``--to hf``/``--to peft`` does, for a refusal."""
    return f"--to {args.to}" if args.to else "`convert hf` (it writes a qkv run directory)"


def _to_onnx(args) -> int:
    """``convert --to onnx RUN_DIR DIR``."""
    from ..hub.onnx_export import MANIFEST, export_onnx

    run_dir, out_dir = args.paths
    onnx = export_onnx(run_dir, out_dir, opset=args.opset, attentions=args.attentions, weights=args.weights)
    graphs = ", ".join(f"{name} ({exporter} exporter)" for name, exporter in onnx.files.items())
    beside = f"{TOKENIZER}, {MANIFEST}" if (onnx.out / TOKENIZER).is_file() else MANIFEST
    log(f"wrote {onnx.out}: {graphs}, {beside} ({onnx.megabytes:.1f} MB in all)")
    return 0


def _to_peft(args) -> Path:
    """``convert --to peft LORA_RUN_DIR DIR``, its model card written last; returns DIR."""
    from ..hub.model_card import CARD, peft_card, write_card
    from ..hub.peft_export import export_peft

    run_dir, _ = args.paths
    done = export_peft(*args.paths)
    write_card(peft_card(Path(run_dir), done, args.push), done.out)
    log(
        f"wrote {done.out}/base (the HF base model, W0 {done.base_weights}) and PEFT's "
        f"adapter_config.json + adapter_model.safetensors ({', '.join(done.target_modules)}"
        + (f"; head: {', '.join(done.modules_to_save)}" if done.modules_to_save else "")
        + f") + {CARD}: load with peft.PeftModel.from_pretrained(transformers.{done.auto_class}"
        f'.from_pretrained("{done.out}/base"), "{done.out}")'
    )
    return done.out


def _to_hf(args) -> Path:
    """``convert --to hf RUN_DIR|CHECKPOINT HF_DIR`` (a checkpoint through a run directory of
    its own); returns HF_DIR."""
    from ..hub.convert import export_hf, write_run
    from ..hub.model_card import CARD
    from ..hub.pretrained import is_run_dir, read

    source, out_dir = args.paths
    if not is_run_dir(Path(source)):  # a checkpoint: through a run directory of its own
        refuse_nonempty(out_dir, "folder")  # before a Hub download
        with tempfile.TemporaryDirectory() as tmp:
            run_dir = Path(tmp) / "run"
            write_run(read(source, args.revision, args.tokenizer), run_dir, _recorded(source, args))
            out = export_hf(run_dir, out_dir, args.push)
    else:
        out = export_hf(source, out_dir, args.push)
    files = ", ".join(sorted(p.name for p in out.iterdir()))
    log(f"wrote {out} ({files}): load it with transformers' from_pretrained ({CARD} is its model card)")
    return out
