"""``qkv train``: train a model with a recipe, its settings resolved from defaults, a config
file and ``key=value`` overrides."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..cpu_share import busy_note
from ..errors import QkvError
from .console import log, remove_unstarted
from .options import quiet_option, words_after_options
from .output import write_json, write_line

if TYPE_CHECKING:
    from ..train.dry_run import DryRun

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


def _cmd_train(args) -> int:
    from ..recipes.registry import get
    from ..settings import resolve, to_dict

    recipe = get(args.recipe)
    if recipe.train is None or recipe.settings is None:
        raise QkvError(f"{args.recipe!r} runs are converted (qkv convert hf), not trained")
    overrides = list(args.overrides)
    for flag, key in SETTING_FLAGS.items():
        value = getattr(args, flag)
        if value is not None:
            overrides.append(f"{key}={value}")
    if args.freeze:
        overrides.append("freeze=true")
    base = _saved_settings(args.out, args.recipe) if args.resume else None
    # The named recipe's settings dataclass (Recipe.settings is typed `type`: any recipe's).
    settings: Any = resolve(recipe.settings, args.config, overrides, base=base)
    if args.print_config:
        write_json(to_dict(settings), indent=2)
        return 0
    if settings.train.lora_rank and not recipe.adapters:
        raise QkvError(
            f"train.lora_rank adapts a pretrained model; {args.recipe!r} runs train from random weights "
            "(LoRA: lm, text-cls, protein-cls, protein-residue with --init)"
        )
    if args.dry_run:
        return _dry_run(recipe, settings, args)
    if args.out is None:
        raise QkvError("qkv train needs --out RUN_DIR (where the run is written)")
    from ..train import distributed

    ctx = distributed.init(settings.train.device)  # under torchrun: join its processes
    created = not Path(args.out).exists()
    finished = False
    try:
        summary = recipe.train(settings, args.out, resume=args.resume, progress=not args.quiet)
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
        if note := busy_note(summary.get("cpu_share", {}), settings.train.max_minutes is not None):
            log(f"warning: {note}")  # a time budget's result depends on it
        # stdout holds the result alone, so it pipes: the scores as JSON on request (the same
        # object as summary.json), else the run directory, what every next command takes.
        if args.json:
            write_json(summary)
        else:
            write_line(Path(args.out).resolve())
    return 0


def _dry_run(recipe: Any, settings: Any, args: argparse.Namespace) -> int:
    """``--dry-run``: the estimate of :meth:`~qkv.recipes.skeleton.TrainingRun.dry_run` on stdout
    (a table, or ``--json``); nothing written."""
    from ..recipes.skeleton import run_class
    from ..train.dry_run import process_age_s

    if args.resume:
        raise QkvError("--dry-run estimates a new run; it does not take --resume")
    startup_s = process_age_s()  # this process's start-up, which the real run's repeats
    estimate = run_class(recipe).dry_run(settings, args.out, startup_s=startup_s)
    if args.json:
        write_json(estimate.to_dict())
    else:
        for line in dry_run_table(estimate):
            write_line(line)
    return 0


def dry_run_table(estimate: DryRun) -> list[str]:
    """A :class:`~qkv.train.dry_run.DryRun` as lines of a two-column table."""
    t, plan, mem = estimate.timings, estimate.plan, estimate.memory
    params = (
        f"{estimate.parameters:,} ({estimate.trainable_parameters:,} trainable, "
        f"{estimate.frozen_parameters:,} frozen"
    )
    if estimate.adapter_parameters:
        params += f"; {estimate.adapter_parameters:,} of the trainable are LoRA adapters, merged at the end"
    rows = [("parameters", params + ")")]
    if mem.cuda_allocated_mib is not None:
        rows.append(
            (
                "peak GPU memory",
                f"{mem.cuda_allocated_mib:,.0f} MiB allocated, {mem.cuda_reserved_mib:,.0f} MiB reserved "
                "(torch.cuda max_memory_allocated / max_memory_reserved; the CUDA context comes on top)",
            )
        )
    if mem.peak_rss_mib is not None:
        rows.append(("peak memory", f"{mem.peak_rss_mib:,.0f} MiB (the process's peak resident set size)"))
    if estimate.longest_batch is not None:
        rows.append(("", f"with a step on the epoch's longest batch ({estimate.longest_batch} tokens a row)"))
    rows.append(
        (
            "speed",
            f"{t.step_s:.3g} s/step, {t.targets_per_s:,.0f} {estimate.target_unit}/s "
            f"({t.timed_steps} steps timed after {t.warmup_steps} warm-up steps)",
        )
    )
    train = f"train.{plan.bound}"
    if plan.steps is None:
        rows.append(
            ("steps", "no budget (train.max_steps, max_epochs, max_minutes unset): trains until stopped")
        )
    else:
        why = {
            "max_steps": f"{train} ends it",
            "max_epochs": f"{train} ends it",
            "one_epoch": "one epoch, the recipe's budget without train.max_steps or train.max_epochs",
            "max_minutes": f"{train} binds: the steps made in that time"
            + ("" if plan.step_budget is None else f", of {plan.step_budget:,} the other budgets allow"),
        }.get(plan.bound or "", "")
        rows.append(("steps", f"{plan.steps:,} ({plan.epochs:.2f} epochs): {why}"))
        rows.append(("validation", f"{_count(plan.validations, 'pass')} of {_duration(t.validation_s)}"))
        rows.append(
            (
                "checkpoints",
                f"{_count(plan.checkpoints, 'save')} of {_duration(t.save_s)}, "
                f"{_count(plan.snapshots, 'snapshot')} of {_duration(t.snapshot_s)}",
            )
        )
    rows.append(("end of the run", f"{_duration(t.final_s)} (final weights, summary, test scores)"))
    if plan.wall_s is not None and plan.train_s is not None and plan.after_s is not None:
        rows.append(
            (
                "estimated time",
                f"{_duration(plan.wall_s)}: {_duration(t.startup_s + t.prepare_s)} preparing, "
                f"{_duration(plan.train_s)} training, {_duration(plan.after_s + t.final_s)} after",
            )
        )
    if estimate.cpu_share.get("busy"):
        load = estimate.cpu_share
        rows.append(
            (
                "machine load",
                f"other processes keep {load['others_cpus']:.1f} of {load['cpus']} CPUs busy: these "
                "figures hold while that lasts (a quiet machine is faster)",
            )
        )
    rows.append(
        (
            "dry run",
            f"{_duration(estimate.seconds)} on {estimate.device} ({estimate.precision}); nothing written",
        )
    )
    width = max(len(name) for name, _ in rows)
    return [f"{name:<{width}}  {value}" for name, value in rows]


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}" + ("" if n == 1 else "es" if noun.endswith("s") else "s")


def _duration(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds:.2f} s"
    if seconds < 90:
        return f"{seconds:.1f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _saved_settings(run_dir: str | None, recipe: str) -> dict | None:
    """The settings a run of ``recipe`` saved in ``train_config.json``: what ``--resume``
    starts from (``--config`` and ``key=value`` still override them). ``None`` where there is
    none to read; the recipe's checks then say what is wrong with the directory."""
    from ..recipes.common import PROVENANCE, read_run_json

    try:
        saved = read_run_json(Path(run_dir or ""), "train_config.json")
    except QkvError:
        return None
    if saved.get("recipe") != recipe:
        return None
    return {k: v for k, v in saved.items() if k not in PROVENANCE}
