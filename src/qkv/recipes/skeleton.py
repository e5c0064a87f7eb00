"""The flow of every ``qkv train`` run, written once; a recipe states only what is its own.

torchtune's recipes split a run into setup / train / cleanup; qkv's do the same with one base
class, :class:`TrainingRun`, whose :meth:`~TrainingRun.run` is the whole flow:

1. check the run directory (:func:`~qkv.recipes.common.prepare_run_dir`; nothing written);
2. :meth:`~TrainingRun.before_start`: inputs a recipe reads before the run's seed is set (the
   classification recipes build their seeded model here);
3. start the run (:func:`~qkv.recipes.common.start_run`: process group, threads, seed, device,
   precision);
4. :meth:`~TrainingRun.setup`: data, tokenizer, the model's config, every input checked;
5. the first writes, by one process: the tokenizer and :meth:`~TrainingRun.new_run_files`
   (a new run), ``config.json`` and ``train_config.json``
   (:func:`~qkv.recipes.common.write_settings`);
6. :meth:`~TrainingRun.build_model`, then the shared loop (:func:`~qkv.train.loop.train_loop`)
   over :meth:`~TrainingRun.batches`, :meth:`~TrainingRun.loss` and
   :meth:`~TrainingRun.validate`, with AdamW and the settings' schedule;
7. on rank 0 only (the other processes only helped train): :meth:`~TrainingRun.final_weights`
   (the best-on-validation weights by default), :meth:`~TrainingRun.summarize` (validation
   and test scores, the recipe's own figures), the summary's common keys and ``summary.json``.

:meth:`~TrainingRun.dry_run` (``qkv train ... --dry-run``) goes through the same flow in a
temporary directory, with a few steps instead of the budget, and estimates the real run from
what it measured (:mod:`qkv.train.dry_run`).
"""

from __future__ import annotations

import logging
import math
import os
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import torch

from .. import cpu_share
from ..data.batching import token_batches
from ..errors import QkvError
from ..evaluate.classification import plot_confusion
from ..files import write_json
from ..train import distributed
from ..train import dry_run as dry
from ..train.loop import LoopState, _start, _validate, train_loop
from ..train.metrics import TrainMetrics
from ..train.optim import make_optimizer
from ..train.settings import TrainSettings
from ..train.step import Stepper
from .common import RunContext, keep_best, prepare_run_dir, start_run, write_settings

logger = logging.getLogger(__name__)


class TrainingRun(ABC):
    """One training run of a recipe: ``TrainingRun.train(settings, run_dir)`` → summary dict.

    A recipe subclasses it and states its own parts: :meth:`setup` (data, tokenizer, model
    config), :meth:`build_model`, :meth:`batches`, :meth:`loss`, :meth:`validate` and
    :meth:`summarize`; optionally :meth:`before_start`, :meth:`new_run_files`,
    :meth:`total_steps`, :meth:`peak_lr`, :meth:`final_weights`, and the class attributes
    ``score_key``/``higher_is_better`` (the validation metric that picks the best weights).

    Attributes (set by :meth:`run` before the hooks that use them):
        settings: the recipe's frozen settings (a ``*Settings`` dataclass with ``train``).
        run_dir: the run directory (``Path``).
        resume: continue the run in ``run_dir`` (its training state, tokenizer and task files).
        context: what :func:`~qkv.recipes.common.start_run` resolved (device, precision).
        tokenizer: saved as ``tokenizer.json`` in a new run when a recipe sets it.
    """

    name: str  # the recipe's name: its directory is refused by another recipe's --resume
    score_key: str = "val_loss"
    higher_is_better: bool = False

    def __init__(
        self, settings: Any, run_dir: str | Path, resume: bool = False, progress: bool = True
    ) -> None:
        self.settings = settings
        self.run_dir = Path(run_dir)
        self.resume = resume
        self.progress = progress
        self.tokenizer: Any = None
        self.started = time.perf_counter()
        self.cpu_report: dict = {}  # qkv.cpu_share's report of the training stretch

    @classmethod
    def train(cls, settings: Any, run_dir: str | Path, resume: bool = False, progress: bool = True) -> dict:
        """Run the recipe (:meth:`run`): what :attr:`qkv.recipes.base.Recipe.train` calls.

        Returns:
            The summary (also ``summary.json``); ``{}`` on a torchrun process other than rank 0.

        Raises:
            QkvError: bad inputs or run directory, before anything is written.
        """
        return cls(settings, run_dir, resume, progress).run()

    @property
    def device(self) -> torch.device:
        return self.context.device

    # ---------------------------------------------------------------- the flow, written once
    def run(self) -> dict:
        """The whole run (the module docstring lists its steps)."""
        self.run_dir = prepare_run_dir(self.run_dir, self.resume, self.name)
        self.before_start()
        self.context: RunContext = start_run(self.settings.train)
        config = self.setup()
        if distributed.is_main():
            self._first_writes(config)
        model = self.build_model(config)
        state = self._fit(model)
        if not distributed.is_main():  # torchrun: the other processes only helped train
            return {}
        trained = self.final_weights(model, state)
        summary = self.summarize(model, state)
        for key, value in self._figures(model, state, trained).items():
            summary.setdefault(key, value)  # a recipe may count its own (ViT: epochs of images)
        write_json(self.run_dir / "summary.json", summary)
        return summary

    def _first_writes(self, config: Any) -> None:
        if not self.resume:  # a resumed run keeps its own
            if self.tokenizer is not None:
                self.tokenizer.save(self.run_dir / "tokenizer.json")
            for name, content in self.new_run_files().items():
                write_json(self.run_dir / name, content)
        write_settings(self.run_dir, self.name, self.settings, config, self.context, self.resume)

    def _loop_settings(
        self, model: torch.nn.Module
    ) -> tuple[TrainSettings, torch.optim.Optimizer, Callable[[int, float], float]]:
        """The loop's settings (``max_steps`` the recipe's :meth:`total_steps`), optimizer and
        learning-rate schedule."""
        train = self.settings.train
        total = self.total_steps()
        if total is not None:
            train = replace(train, max_steps=total)
        optimizer = make_optimizer(model, train)
        # Eq. 3 scales the rate by the model's d_model
        lr = train.lr_schedule(cast(Any, model).config.d_model, total_steps=total, peak_lr=self.peak_lr())
        return train, optimizer, lr

    def _fit(self, model: torch.nn.Module) -> LoopState:
        train, optimizer, lr = self._loop_settings(model)
        since = cpu_share.current().mark()
        state = train_loop(
            model,
            optimizer,
            lr,
            self.batches,
            self.loss,
            self.validate,
            self.run_dir,
            train,
            self.progress,
            score_key=self.score_key,
            higher_is_better=self.higher_is_better,
            resume=self.resume,
            precision=self.context.precision,
        )
        share = cpu_share.current()
        share.mark()  # the last stretch of training
        self.cpu_report = share.report(since=since)
        return state

    def _figures(self, model: Any, state: LoopState, trained: int) -> dict:
        return {
            "train_minutes": round(state.elapsed_s / 60, 2),
            "steps": state.step,
            "epochs": state.epoch,
            "parameters": model.num_parameters(),
            "trainable_parameters": trained,
            "total_minutes": round((time.perf_counter() - self.started) / 60, 2),
            # the machine's load while it trained: a busy machine cuts a time budget's steps
            "cpu_share": self.cpu_report,
        }

    # ---------------------------------------------------------------- the dry run
    @classmethod
    def dry_run(
        cls,
        settings: Any,
        out: str | Path | None = None,
        *,
        startup_s: float = 0.0,
        warmup_steps: int = dry.WARMUP_STEPS,
        min_steps: int = dry.MIN_STEPS,
        max_steps: int = dry.MAX_STEPS,
        seconds: float = dry.TIMED_SECONDS,
    ) -> dry.DryRun:
        """What a run of ``settings`` into ``out`` will cost, measured on its own model, data
        and batches (:mod:`qkv.train.dry_run`), writing nothing: ``out`` (optional) is checked
        as the run would check it, never created or changed; the run's files go to a temporary
        directory, removed at the end. The flow is :meth:`run`'s, with ``warmup_steps`` and then
        ``min_steps`` to ``max_steps`` optimizer steps (timed until ``seconds`` passed) instead
        of the budget, one validation, and the end of the run (final weights, summary).

        Args:
            startup_s: seconds the process spent before (interpreter, imports), which the real
                run spends too (:func:`qkv.train.dry_run.process_age_s`, from the CLI).

        Raises:
            QkvError: what the run would refuse (a non-empty ``out``, bad inputs), and under
                torchrun (a dry run is one process).
        """
        if distributed.context().enabled or int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:
            raise QkvError("--dry-run runs in one process: start it without torchrun")
        with tempfile.TemporaryDirectory(prefix="qkv-dry-run-") as tmp:
            run = cls(settings, Path(tmp) / "run", resume=False, progress=False)
            if out is not None:
                prepare_run_dir(out, False, run.name)
            logger.info(
                f"dry run in {tmp} (removed at the end): the run's data, model and batches, "
                f"{warmup_steps} + {min_steps}-{max_steps} steps, one validation, the end of the run"
            )
            return run._rehearse(startup_s, warmup_steps, min_steps, max_steps, seconds)

    def _rehearse(
        self, startup_s: float, warmup_steps: int, min_steps: int, max_steps: int, seconds: float
    ) -> dry.DryRun:
        """:meth:`run` in :attr:`run_dir` (a temporary directory), shortened and timed."""
        started = time.perf_counter()
        self.before_start()
        self.context = start_run(self.settings.train)
        cuda = self.device.type == "cuda"
        if cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        config = self.setup()
        self._first_writes(config)
        model = self.build_model(config)
        train, optimizer, lr = self._loop_settings(model)
        in_training = sum(p.numel() for p in model.parameters())
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        prepare_s = time.perf_counter() - started
        # the loop's start for a new run: its checkpointer, every RNG seeded
        checkpoints, state = _start(
            model, optimizer, self.run_dir, train, self.score_key, self.higher_is_better, resume=False
        )
        stepper = Stepper(model, optimizer, lr, self.loss, train, self.context.precision, self.run_dir)
        model.train()
        with TrainMetrics(self.run_dir, train, state, resumed=False, progress=False) as metrics:
            saves = [dry.timed(checkpoints.save, state)]
            t = time.perf_counter()
            first = self.batches(0)
            batches_s = time.perf_counter() - t
            lengths = dry.batch_lengths(first, self.batch_length)
            warmup_s, step_times, targets = dry.time_steps(
                stepper,
                self.batches,
                first,
                train,
                state,
                metrics,
                warmup_steps,
                min_steps,
                max_steps,
                seconds,
                lengths,
            )
            validation_s = dry.timed(_validate, model, self.validate, state, metrics, checkpoints)
            saves.append(dry.timed(checkpoints.save, state))
            snapshot_s = dry.timed(checkpoints.snapshot, state)
            timings = dry.Timings(
                startup_s=startup_s,
                prepare_s=prepare_s,
                batches_s=batches_s,
                warmup_steps=warmup_steps,
                warmup_s=warmup_s,
                timed_steps=len(step_times),
                step_s=sum(step_times) / len(step_times),
                targets_per_s=targets / max(sum(step_times), 1e-9),
                save_s=sum(saves) / len(saves),
                validation_s=validation_s,
                snapshot_s=snapshot_s,
                final_s=0.0,
            )
            per_epoch = math.ceil(len(first) / train.accum_steps)
            budget_key = self._step_budget_key()
            plan = dry.plan_run(train, per_epoch, timings, budget_key)
            # the snapshots the run keeps (translation's final weights average them)
            for _ in range(min(plan.snapshots, train.keep_snapshots) - 1):
                checkpoints.snapshot(state)
            final_started = time.perf_counter()  # loss.png, drawn when the loop's metrics close
        trained = self.final_weights(model, state)
        summary = self.summarize(model, state)
        for key, value in self._figures(model, state, trained).items():
            summary.setdefault(key, value)
        write_json(self.run_dir / "summary.json", summary)
        timings = replace(timings, final_s=time.perf_counter() - final_started)
        return dry.DryRun(
            recipe=self.name,
            device=str(self.device),
            precision=self.context.precision,
            parameters=summary["parameters"],
            trainable_parameters=summary["trainable_parameters"],
            frozen_parameters=in_training - trainable,
            adapter_parameters=max(in_training - summary["parameters"], 0),
            target_unit=self.target_unit,
            longest_batch=None if lengths is None else max(lengths),
            timings=timings,
            plan=dry.plan_run(train, per_epoch, timings, budget_key),
            memory=dry.Memory(
                dry.peak_rss_mib(),
                torch.cuda.max_memory_allocated(self.device) / 2**20 if cuda else None,
                torch.cuda.max_memory_reserved(self.device) / 2**20 if cuda else None,
            ),
            seconds=time.perf_counter() - started,
            cpu_share=_load_so_far(),
        )

    def _step_budget_key(self) -> str:
        """The setting behind the loop's ``max_steps``: ``train.max_steps``, the epochs a
        recipe counts in steps (:meth:`total_steps`), or its default of one epoch."""
        train = self.settings.train
        if train.max_steps is not None or self.total_steps() is None:
            return "max_steps"
        return "max_epochs" if train.max_epochs is not None else "one_epoch"

    @property
    def target_unit(self) -> str:
        """What :meth:`loss` counts as its targets (the unit of a dry run's speed)."""
        return "tokens"

    def batch_length(self, batch: Any) -> int | None:
        """The padded length of one of :meth:`batches`' batches (``None``: unknown), by which a
        dry run finds the longest of an epoch. Default: what the batch's shape shows
        (:func:`qkv.train.dry_run.padded_length`)."""
        return dry.padded_length(batch)

    def save_json(self, name: str, content: dict) -> None:
        """Write ``content`` as ``run_dir / name`` from rank 0 only (a recipe's own file)."""
        if distributed.is_main():
            write_json(self.run_dir / name, content)

    # ---------------------------------------------------------------- what a recipe states
    def before_start(self) -> None:  # noqa: B027  (optional hook)
        """Read and check inputs before :func:`~qkv.recipes.common.start_run` seeds the run
        (default: nothing)."""

    @abstractmethod
    def setup(self) -> Any:
        """Load and check the data (and set :attr:`tokenizer`); return the model's config
        (vocabulary filled in). Nothing is written yet."""

    def new_run_files(self) -> dict[str, dict]:
        """JSON files a new run writes beside its settings (``task.json``, ``data.json``)."""
        return {}

    @abstractmethod
    def build_model(self, config: Any) -> torch.nn.Module:
        """The model to train, on :attr:`device`."""

    @abstractmethod
    def batches(self, epoch: int) -> Sequence:
        """Epoch ``epoch``'s batches, the same on every call and process (exact resume)."""

    @abstractmethod
    def loss(self, model: torch.nn.Module, batch: Any) -> tuple[torch.Tensor, int]:
        """``(summed loss, number of targets)`` of one batch."""

    @abstractmethod
    def validate(self, model: torch.nn.Module) -> dict:
        """Validation metrics (``score_key`` among them), in eval mode without gradients."""

    def total_steps(self) -> int | None:
        """Where the schedule ends and the step budget (``None``: ``train.max_steps``)."""
        return None

    def peak_lr(self) -> float | None:
        """The recipe's peak learning rate when ``train.lr`` is unset (``None``: the schedule's)."""
        return None

    def final_weights(self, model: torch.nn.Module, state: LoopState) -> int:
        """Load the weights the run ends with and save ``model.safetensors``; return the number
        of parameters that trained. Default: the best on validation
        (:func:`~qkv.recipes.common.keep_best`, LoRA adapters saved and merged)."""
        return keep_best(model, self.run_dir, self.settings.train.lora)

    @abstractmethod
    def summarize(self, model: torch.nn.Module, state: LoopState) -> dict:
        """The summary's own keys: validation and test scores, the recipe's own figures."""


class ClassifierRun(TrainingRun):
    """A classification run (proteins, texts, images): the best weights on ``score_key``,
    higher is better; a summary of its task, its validation and test metrics, the test
    confusion matrix drawn to ``confusion.png`` and a classical baseline's test metrics."""

    higher_is_better = True
    task: Any  # the data set: .name and .classes (set by the subclass)
    confusion_title = ""  # "probe" in "sst2 test (probe)"

    @property
    def target_unit(self) -> str:
        return "residues" if getattr(self, "level", None) == "residue" else "examples"

    @abstractmethod
    def split_metrics(self, split: str) -> dict:
        """Classification metrics (``confusion`` among them) of the model on ``split``."""

    def head_keys(self) -> dict:
        """The summary's first keys (the task, the mode of training)."""
        return {"task": self.task.name}

    def baseline(self) -> dict | None:
        """A classical baseline's test metrics (``None``: none)."""
        return None

    def summarize(self, model: torch.nn.Module, state: LoopState) -> dict:
        summary = {
            **self.head_keys(),
            "validation": self.split_metrics("val"),
            "test": self.split_metrics("test"),
        }
        plot_confusion(
            summary["test"]["confusion"],
            self.task.classes,
            self.run_dir / "confusion.png",
            f"{self.task.name} test ({self.confusion_title})",
        )
        base = self.baseline()
        if base is not None:
            summary["baseline_test"] = base
        return summary


class SequenceClassifierRun(ClassifierRun):
    """A classification run over sequences of varying length (proteins, texts): batches of at
    most ``max_tokens`` padded tokens of examples of similar length, reshuffled every epoch (a
    function of ``train.seed`` and the epoch, so a resumed run repeats them); the schedule over
    ``train.max_steps``, else ``train.max_epochs`` epochs, peaking at the settings'
    ``peak_lr``. A subclass sets :attr:`lengths` (tokens per example) in :meth:`setup`."""

    lengths: list[tuple[int, int]]

    def batches(self, epoch: int) -> Sequence:
        seed = self.settings.train.seed * 1000 + epoch
        return token_batches(self.lengths, self.settings.max_tokens, shuffle=True, seed=seed)

    def batch_length(self, batch: Any) -> int | None:
        return max(self.lengths[i][0] for i in batch)

    def total_steps(self) -> int | None:
        train = self.settings.train
        per_epoch = len(token_batches(self.lengths, self.settings.max_tokens))
        return train.max_steps or per_epoch * (train.max_epochs or 1) // train.accum_steps

    def peak_lr(self) -> float | None:
        return self.settings.peak_lr


def run_class(recipe: Any) -> type[TrainingRun]:
    """The :class:`TrainingRun` subclass behind a :class:`~qkv.recipes.base.Recipe`'s ``train``
    (its classmethod :meth:`TrainingRun.train`), for :meth:`TrainingRun.dry_run`.

    Raises:
        QkvError: the recipe is not trained by a :class:`TrainingRun` (a converted kind of run).
    """
    owner = getattr(recipe.train, "__self__", None)
    if not (isinstance(owner, type) and issubclass(owner, TrainingRun)):
        raise QkvError(f"{recipe.name!r} runs are not trained by qkv train, so they have no dry run")
    return owner


def _load_so_far() -> dict:
    """The machine's load since the run started (:func:`qkv.cpu_share.start`), as one stretch:
    what a dry run's speed was measured under."""
    share = cpu_share.current()
    share.mark()
    return share.report()
