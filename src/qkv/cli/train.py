"""``qkv train``: train a model with a recipe, its settings resolved from defaults, a config
file and ``key=value`` overrides."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .. import cpu_share
from ..errors import QkvError
from .console import log, remove_unstarted
from .dry_run import dry_run
from .options import quiet_option, words_after_options
from .output import write_json, write_line

# train options that are settings (``--max-steps N`` is ``train.max_steps=N``, ``--task X`` is ``task=X``)
SETTING_FLAGS = {
    "max_steps": "train.max_steps",
    "max_minutes": "train.max_minutes",
    "task": "task",
    "init": "init",
    "labels": "labels",
}


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Register ``train``."""
    from ..recipes.registry import trainable

    p = sub.add_parser("train", help="train a model with a recipe")
    p.add_argument("recipe", help="recipe name: " + ", ".join(trainable()))
    p.add_argument(
        "overrides",
        nargs="*",
        help="settings as dotted key=value (model.d_model=256 train.lr=3e-4 src_lang=fr); "
        "a key of one section may be given flat (d_model=256)",
    )
    # key=value overrides may come anywhere after the recipe, also after options
    words_after_options(p, "overrides", accept=lambda word: "=" in word)
    p.add_argument("--config", help="JSON file of settings (overridden by key=value)")
    p.add_argument(
        "--print-config",
        action="store_true",
        help="print the resolved settings as JSON (what --config reads) and exit",
    )
    p.add_argument(
        "--out", help="run directory to create (or continue with --resume); optional with --dry-run"
    )
    p.add_argument("--resume", action="store_true", help="continue training in --out")
    p.add_argument("--max-steps", type=int, help="stop after this many optimizer steps")
    p.add_argument("--max-minutes", type=float, help="stop after this many minutes of training")
    quiet_option(p, "no progress bar, only warnings from the library")
    p.add_argument(
        "--json",
        action="store_true",
        help="print the run's summary (scores, steps, times; the content of summary.json) as one "
        "JSON object on stdout instead of the run directory",
    )
    _input_options(p)
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="estimate the run, writing nothing: build its model and batches, time a few steps, one "
        "validation and the run's end, then print parameters, peak memory, speed, the steps the "
        "budgets allow and the wall time (--out is checked, not created; --json: as JSON)",
    )
    p.add_argument(
        "--freeze",
        action="store_true",
        help="with --init: train only the head (linear probe; caption: keep the image encoder fixed)",
    )
    p.set_defaults(func=_cmd_train)


def _input_options(p: argparse.ArgumentParser) -> None:
    """The options that name a run's inputs: its task, labels and pretrained start."""
    p.add_argument(
        "--task",
        help="protein-cls: signalp, amp-scanner, developability; protein-residue: "
        "secondary-structure, paratope; or a CSV/TSV (sequence,label) or FASTA "
        "file (with --labels); text-cls: sst2 or a TSV/CSV (sentence,label); "
        "vit: fashion-mnist, digits or an image folder DIR/<class>/<image>; caption: scenes or emoji",
    )
    p.add_argument("--labels", help="labels file for a FASTA --task (one label per record)")
    p.add_argument(
        "--init",
        metavar="MODEL",
        help="start from a pretrained model: protein-*: a protein-mlm run directory, antiberty or "
        "sapiens-vh/sapiens-vl; text-cls: minilm, an HF folder or a converted run; lm: an lm run, a "
        "GPT-2 HF folder or iglm (with train.lora_rank=R: LoRA adapters instead of every weight); "
        "protein-*, text-cls, lm: also a Hugging Face Hub name org/name, pinned to a branch, tag or "
        "commit as org/name@REVISION; caption: a vit run (the image encoder)",
    )


def _cmd_train(args) -> int:
    from ..recipes.registry import get
    from ..settings import to_dict

    recipe = get(args.recipe)
    if recipe.train is None or recipe.settings is None:
        raise QkvError(f"{args.recipe!r} runs are converted (qkv convert hf), not trained")
    settings = _resolved_settings(recipe, args)
    if args.print_config:
        write_json(to_dict(settings), indent=2)
        return 0
    if settings.train.lora_rank and not recipe.adapters:
        raise QkvError(
            f"train.lora_rank adapts a pretrained model; {args.recipe!r} runs train from random weights "
            "(LoRA: lm, text-cls, protein-cls, protein-residue with --init)"
        )
    if args.dry_run:
        return dry_run(recipe, settings, args)
    if args.out is None:
        raise QkvError("qkv train needs --out RUN_DIR (where the run is written)")
    return _train(recipe, settings, args)


def _resolved_settings(recipe: Any, args: argparse.Namespace) -> Any:
    """The recipe's settings: its defaults < ``--config`` < ``key=value`` and the option flags;
    with ``--resume``, the run's saved settings in place of the defaults."""
    from ..settings import resolve

    overrides = list(args.overrides)
    for flag, key in SETTING_FLAGS.items():
        value = getattr(args, flag)
        if value is not None:
            overrides.append(f"{key}={value}")
    if args.freeze:
        overrides.append("freeze=true")
    base = _saved_settings(args.out, args.recipe) if args.resume else None
    # The named recipe's settings dataclass (Recipe.settings is typed `type`: any recipe's).
    return resolve(recipe.settings, args.config, overrides, base=base)


def _train(recipe: Any, settings: Any, args: argparse.Namespace) -> int:
    """The run itself, and what it says at the end (the summary; stdout: the run directory, or
    the summary as JSON)."""
    from .. import distributed

    ctx = distributed.init(settings.train.device)  # under torchrun: join its processes
    created = not Path(args.out).exists()
    finished = False
    try:
        # threads from the load (unless train.threads pins them), re-checked as the run goes
        cpu = cpu_share.for_command(settings.train.threads)
        summary = recipe.train(settings, args.out, resume=args.resume, progress=not args.quiet, cpu=cpu)
        finished = True
    except Exception:  # refused (or failed) before its first checkpoint: leave nothing behind
        if created and ctx.is_main:
            remove_unstarted(Path(args.out))
        raise
    except KeyboardInterrupt:
        if ctx.is_main:
            log(
                f"interrupted: the last checkpoint is in {args.out}; continue with the same command "
                "plus --resume"
            )
        return 130
    finally:
        distributed.shutdown(finished=finished)
    if ctx.is_main:
        if recipe.summary is not None:
            log("\n" + recipe.summary(summary, Path(args.out)))
        if note := cpu_share.busy_note(summary.get("cpu_share", {}), settings.train.max_minutes is not None):
            log(f"warning: {note}")  # a time budget's result depends on it
        # stdout holds the result alone, so it pipes: the scores as JSON on request (the same
        # object as summary.json), else the run directory, what every next command takes.
        if args.json:
            write_json(summary)
        else:
            write_line(Path(args.out).resolve())
    return 0


def _saved_settings(run_dir: str | None, recipe: str) -> dict | None:
    """The settings a run of ``recipe`` saved in ``train_config.json``: what ``--resume``
    starts from (``--config`` and ``key=value`` still override them). ``None`` where there is
    none to read; the recipe's checks then say what is wrong with the directory."""
    from ..runs.info import resumed_json
    from ..runs.layout import TRAIN_CONFIG
    from ..runs.record import PROVENANCE

    try:
        saved = resumed_json(Path(run_dir or ""), TRAIN_CONFIG)
    except QkvError:
        return None
    if saved.get("recipe") != recipe:
        return None
    return {k: v for k, v in saved.items() if k not in PROVENANCE}
