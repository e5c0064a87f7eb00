"""``qkv train ... --dry-run``: the estimate of :mod:`qkv.train.dry_run` as a table on stdout."""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING, Any

from .. import cpu_share
from ..errors import QkvError
from .output import write_json, write_line

if TYPE_CHECKING:
    from ..train.estimate import DryRun


def dry_run(recipe: Any, settings: Any, args: argparse.Namespace) -> int:
    """``--dry-run``: the estimate of :func:`qkv.train.dry_run.dry_run` on stdout (a table, or
    ``--json``); nothing written."""
    import psutil

    from ..train import dry_run as dry
    from ..train.run import run_class

    if args.resume:
        raise QkvError("--dry-run estimates a new run; it does not take --resume")
    # this process's start-up (interpreter, imports), which the real run's repeats
    startup_s = max(time.time() - psutil.Process().create_time(), 0.0)
    # threads from the load (unless train.threads pins them), as the real run's
    cpu = cpu_share.for_command(settings.train.threads)
    estimate = dry.dry_run(run_class(recipe), settings, args.out, startup_s=startup_s, cpu=cpu)
    if args.json:
        write_json(estimate.to_dict())
    else:
        for line in dry_run_table(estimate):
            write_line(line)
    return 0


def dry_run_table(estimate: DryRun) -> list[str]:
    """A :class:`~qkv.train.estimate.DryRun` as lines of a two-column table."""
    rows = _model_rows(estimate) + _budget_rows(estimate) + _time_rows(estimate)
    width = max(len(name) for name, _ in rows)
    return [f"{name:<{width}}  {value}" for name, value in rows]


def _model_rows(estimate: DryRun) -> list[tuple[str, str]]:
    """Parameters, peak memory and speed."""
    t, mem = estimate.timings, estimate.memory
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
    return rows


def _budget_rows(estimate: DryRun) -> list[tuple[str, str]]:
    """The steps the budgets allow, and the validations and checkpoints they bring."""
    t, plan = estimate.timings, estimate.plan
    rows: list[tuple[str, str]] = []
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
    return rows


def _time_rows(estimate: DryRun) -> list[tuple[str, str]]:
    """The end of the run, the estimated time, the machine's load, the dry run itself."""
    t, plan = estimate.timings, estimate.plan
    rows: list[tuple[str, str]] = []
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
    return rows


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
