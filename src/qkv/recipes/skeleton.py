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
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import torch

from ..data.batching import token_batches
from ..evaluate.classification import plot_confusion
from ..files import write_json
from ..train import distributed
from ..train.loop import LoopState, train_loop
from ..train.optim import make_optimizer
from .common import RunContext, keep_best, prepare_run_dir, start_run, write_settings


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

    def _fit(self, model: torch.nn.Module) -> LoopState:
        train = self.settings.train
        total = self.total_steps()
        if total is not None:
            train = replace(train, max_steps=total)
        return train_loop(
            model,
            make_optimizer(model, train),
            # Eq. 3 scales the rate by the model's d_model
            train.lr_schedule(cast(Any, model).config.d_model, total_steps=total, peak_lr=self.peak_lr()),
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

    def _figures(self, model: Any, state: LoopState, trained: int) -> dict:
        return {
            "train_minutes": round(state.elapsed_s / 60, 2),
            "steps": state.step,
            "epochs": state.epoch,
            "parameters": model.num_parameters(),
            "trainable_parameters": trained,
            "total_minutes": round((time.perf_counter() - self.started) / 60, 2),
        }

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

    def total_steps(self) -> int | None:
        train = self.settings.train
        per_epoch = len(token_batches(self.lengths, self.settings.max_tokens))
        return train.max_steps or per_epoch * (train.max_epochs or 1) // train.accum_steps

    def peak_lr(self) -> float | None:
        return self.settings.peak_lr
