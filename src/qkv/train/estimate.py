"""A dry run's report (:class:`DryRun`, ``qkv train ... --dry-run``): the model, what the dry run
measured (:class:`~qkv.train.schedule.Timings`, :class:`Memory`) and what the run's schedule
implies with it (:class:`~qkv.train.schedule.Plan`). :mod:`qkv.train.dry_run` makes it;
:mod:`qkv.cli.dry_run` prints it as a table or as JSON (:meth:`DryRun.to_dict`)."""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass

import torch

from .schedule import Plan, Timings


@dataclass(frozen=True)
class Memory:
    """A dry run's peak memory in MiB: the process's peak resident set size from its start
    (``getrusage``'s ``ru_maxrss``, ``/usr/bin/time -v``'s "Maximum resident set size";
    ``None`` without the ``resource`` module) and, on CUDA, the most that tensors held and that
    the caching allocator reserved (``torch.cuda.max_memory_allocated`` / ``_reserved``, what
    ``nvidia-smi`` sees less the CUDA context)."""

    peak_rss_mib: float | None
    cuda_allocated_mib: float | None = None
    cuda_reserved_mib: float | None = None

    @classmethod
    def peak(cls, device: torch.device) -> Memory:
        """The peaks so far (on CUDA, since ``torch.cuda.reset_peak_memory_stats``) of a process
        computing on ``device``."""
        cuda = device.type == "cuda"
        return cls(
            peak_rss_mib(),
            torch.cuda.max_memory_allocated(device) / 2**20 if cuda else None,
            torch.cuda.max_memory_reserved(device) / 2**20 if cuda else None,
        )


def peak_rss_mib() -> float | None:
    """The process's peak resident set size so far in MiB (``None``: not measurable here)."""
    try:
        import resource
    except ImportError:  # Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10  # bytes on macOS, KiB on Linux


@dataclass(frozen=True)
class DryRun:
    """A dry run's report: the model, the measured speed and memory, and the run's estimate.

    Attributes:
        recipe / device / precision: the run's, as resolved on this machine.
        parameters / trainable_parameters: ``summary.json``'s keys of those names (the saved
            model's parameters; those that trained).
        frozen_parameters: the model's in training that do not train (a probe's encoder).
        adapter_parameters: LoRA adapters, trained then merged into the saved weights.
        target_unit: what the loss counts (``"tokens"``, ``"examples"``).
        longest_batch: the padded length of the epoch's longest batch, stepped on too
            (``None``: batches all alike, or their lengths unknown).
        timings / plan / memory: what was measured and what the settings imply.
        seconds: the dry run's own duration.
        cpu_share: the machine's load while it ran (:meth:`qkv.cpu_share.CpuShare.report`).
    """

    recipe: str
    device: str
    precision: str
    parameters: int
    trainable_parameters: int
    frozen_parameters: int
    adapter_parameters: int
    target_unit: str
    longest_batch: int | None
    timings: Timings
    plan: Plan
    memory: Memory
    seconds: float
    cpu_share: dict

    def to_dict(self) -> dict:
        """The report as JSON-ready values: ``steps``, ``train_minutes`` and ``total_minutes``
        estimate ``summary.json``'s keys (``wall_minutes`` adds the process's start-up)."""
        plan, t = self.plan, self.timings
        model = ("recipe", "device", "precision", "parameters", "trainable_parameters", "frozen_parameters")
        minutes = {f"{k}_minutes": getattr(plan, f"{k}_s") for k in ("train", "total", "wall")}
        return {
            **{key: getattr(self, key) for key in (*model, "adapter_parameters")},
            **asdict(self.memory),
            **{"seconds_per_step": t.step_s, "targets_per_s": t.targets_per_s},
            **{"target_unit": self.target_unit, "longest_batch": self.longest_batch},
            **{key: getattr(plan, key) for key in ("steps", "bound", "step_budget", "steps_per_epoch")},
            "epochs": None if plan.epochs is None else round(plan.epochs, 3),
            **{key: getattr(plan, key) for key in ("validations", "snapshots", "checkpoints")},
            **{key: None if s is None else round(s / 60, 2) for key, s in minutes.items()},
            **{"timings": asdict(t), "dry_run_seconds": round(self.seconds, 2), "cpu_share": self.cpu_share},
        }
