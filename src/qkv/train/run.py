"""The flow of every ``qkv train`` run, written once; a recipe states only what is its own.

torchtune's recipes split a run into setup / train / cleanup; qkv's do the same with one base
class, :class:`TrainingRun`, whose :meth:`~TrainingRun.run` is the whole flow:

1. check the run directory (:func:`~qkv.runs.record.prepare_run_dir`) and, resumed, that the
   settings its settings class fixes on resume are the run's own
   (:func:`~qkv.runs.record.refuse_changed_settings`); nothing written;
2. :meth:`~TrainingRun.before_start`: inputs a recipe reads before the run's seed is set (the
   classification recipes build their seeded model here);
3. start the run (:func:`start_run`: process group, the CPU threads' measure, seed, device,
   precision);
4. :meth:`~TrainingRun.setup`: data, tokenizer, the model's config, every input checked;
5. the first writes, by one process: the tokenizer and :meth:`~TrainingRun.new_run_files`
   (a new run), ``config.json`` and ``train_config.json``
   (:func:`~qkv.runs.record.write_settings`);
6. :meth:`~TrainingRun.build_model`, then the shared loop (:func:`~qkv.train.loop.train_loop`)
   over :meth:`~TrainingRun.batches`, :meth:`~TrainingRun.loss` and
   :meth:`~TrainingRun.validate`, with AdamW and the settings' schedule;
7. on rank 0 only (the other processes only helped train): :meth:`~TrainingRun.final_weights`
   (the best-on-validation weights by default), :meth:`~TrainingRun.summarize` (validation
   and test scores, the recipe's own figures), the summary's common keys and ``summary.json``.

Steps 2 to 5 are :meth:`~TrainingRun.start`, step 6's loop :meth:`~TrainingRun.fit` and step 7
:meth:`~TrainingRun.finish`: the dry run (``qkv train ... --dry-run``, :mod:`qkv.train.dry_run`)
calls the first and the last in a temporary directory, and between them the loop itself with a
budget of a few steps.
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

import torch

from .. import distributed
from ..cpu_share import CpuShare
from ..data.batching import token_batches
from ..device import resolve_device, resolve_precision
from ..errors import QkvError
from ..evaluate.classification import plot_confusion
from ..extras import missing, require
from ..files import load_weights, save_weights, write_json
from ..runs.layout import SUMMARY, TOKENIZER, WEIGHTS, select_weights
from ..runs.record import prepare_run_dir, refuse_changed_settings, write_settings
from ..settings import to_dict
from .adapters import LoraSettings, merge_lora, save_adapters
from .loop import LoopEvent, LoopState, train_loop
from .optim import make_optimizer
from .schedule import Schedule
from .trackers import Trackers, check_trackers
from .train_settings import TrainSettings
from .train_state import check_state

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunContext:
    """What :func:`start_run` resolved for a run: ``device``, ``precision`` (``"fp32"`` or
    ``"bf16"``, what the training loop's autocast uses), ``why`` that precision, and ``cpu``,
    the :class:`~qkv.cpu_share.CpuShare` that measures the machine's load while it trains."""

    device: torch.device
    precision: str
    why: str
    cpu: CpuShare

    def to_dict(self) -> dict:
        return {
            "device": str(self.device),
            "precision": self.precision,
            "why": self.why,
            "processes": distributed.context().world_size,
        }


def start_run(train: TrainSettings, cpu: CpuShare | None = None) -> RunContext:
    """Join torchrun's process group if there is one (:func:`qkv.distributed.init`), apply the
    seed, resolve the run's device (under torchrun on CUDA: this process's GPU) and precision,
    and log (INFO) what was chosen and why. ``cpu``: the entry point's
    :class:`~qkv.cpu_share.CpuShare` (``qkv train``'s follows the machine's load); ``None``
    (a run started from Python) measures the load for the summary and changes no thread count
    but the one ``train.threads`` pins.

    Raises:
        QkvError: a device that is not available here.
    """
    ctx = distributed.init(train.device)
    if cpu is None:
        cpu = CpuShare(train.threads, manage=False)
        cpu.start(probe_s=0)
    cpu.announce()  # the threads' line first, as the run starts (after every check of its inputs)
    torch.manual_seed(train.seed)
    device = resolve_device(train.device, log_level=logging.INFO)
    cpu.cpu_bound = device.type == "cpu"
    if ctx.enabled and device.type == "cuda":
        device = torch.device("cuda", ctx.local_rank)
    precision, why = resolve_precision(train.precision, device)
    logger.info(f"precision: {precision} ({why}), seed {train.seed}")
    return RunContext(device, precision, why, cpu)


def keep_best(model: torch.nn.Module, run_dir: Path, lora: LoraSettings | None = None) -> int:
    """Load the best-on-validation weights (the last ones if validation never ran), save them
    as ``model.safetensors`` and leave ``model`` in eval mode. A model with LoRA adapters
    (``lora``, :func:`qkv.train.adapters.add_lora`) saves them alone too
    (``adapter_model.safetensors``, ``adapter_config.json``), then merges them: the run's
    ``model.safetensors`` is the pretrained architecture with merged weights, which every
    command loads like any run's. Returns the number of parameters that trained (adapters and
    head; all of them in full training), counted before the merge."""
    load_weights(model, select_weights(run_dir))
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    if lora is not None:
        save_adapters(model, run_dir, lora)
        merge_lora(model)
    save_weights(model, run_dir / WEIGHTS)
    model.eval()
    return trained


class TrainingRun(ABC):
    """One training run of a recipe: ``TrainingRun.train(settings, run_dir)`` → summary dict.

    A recipe subclasses it and states its own parts: :meth:`setup` (data, tokenizer, model
    config), :meth:`build_model`, :meth:`batches`, :meth:`loss`, :meth:`validate` and
    :meth:`summarize`; optionally :meth:`before_start`, :meth:`new_run_files`,
    :meth:`total_steps`, :meth:`peak_lr`, :meth:`final_weights`, and the class attributes
    ``score_key``/``higher_is_better`` (the validation metric that picks the best weights).

    Attributes (set by :meth:`run` before the hooks that use them):
        settings: the recipe's frozen settings (a ``*Settings`` dataclass with ``train``, and
            the class variables ``FIXED_ON_RESUME`` and optionally ``BY_CONTENT``: what a
            resume must keep, :func:`~qkv.runs.record.refuse_changed_settings`).
        run_dir: the run directory (``Path``).
        resume: continue the run in ``run_dir`` (its training state, tokenizer and task files).
        context: what :func:`start_run` resolved (device, precision).
        tokenizer: saved as ``tokenizer.json`` in a new run when a recipe sets it.
    """

    name: str  # the recipe's name: its directory is refused by another recipe's --resume
    extras: tuple[str, ...] = ()  # the optional packages it needs (qkv.extras), refused first
    score_key: str = "val_loss"
    higher_is_better: bool = False

    def __init__(
        self,
        settings: Any,
        run_dir: str | Path,
        resume: bool = False,
        progress: bool = True,
        cpu: CpuShare | None = None,
    ) -> None:
        self.settings = settings
        self.run_dir = Path(run_dir)
        self.resume = resume
        self.progress = progress
        self.cpu = cpu  # the entry point's, or None: start_run makes one that only measures
        self.tokenizer: Any = None
        self.started = time.perf_counter()
        self.cpu_report: dict = {}  # the CpuShare's report of the training stretch
        self.trackers: Trackers | None = None  # run()'s; a dry run tracks nothing

    @classmethod
    def train(
        cls,
        settings: Any,
        run_dir: str | Path,
        resume: bool = False,
        progress: bool = True,
        cpu: CpuShare | None = None,
    ) -> dict:
        """Run the recipe (:meth:`run`): what :attr:`qkv.recipes.recipe.Recipe.train` calls.
        ``cpu``: the entry point's :class:`~qkv.cpu_share.CpuShare` (:func:`start_run`).

        Returns:
            The summary (also ``summary.json``); ``{}`` on a torchrun process other than rank 0.

        Raises:
            QkvError: bad inputs or run directory, before anything is written.
        """
        return cls(settings, run_dir, resume, progress, cpu).run()

    @property
    def device(self) -> torch.device:
        return self.context.device

    # ---------------------------------------------------------------- the flow, written once
    def run(self) -> dict:
        """The whole run (the module docstring lists its steps), followed by the experiment
        trackers ``train.log_to`` names (:mod:`qkv.train.trackers`) from the loop's first step to
        the summary; a tracker whose library is missing is refused first, nothing written."""
        trackers = self.settings.train.trackers
        if distributed.is_main():
            for extra in self.extras:
                require(extra, f"qkv train {self.name}")
            check_trackers(trackers)
        self.run_dir = prepare_run_dir(self.run_dir, self.resume, self.name, check_state)
        if self.resume and distributed.is_main():  # the others never write
            refuse_changed_settings(self.run_dir, self.settings)
        model = self.start()
        settings = {"recipe": self.name, **to_dict(self.settings)}
        with Trackers(trackers, self.run_dir, settings, self.resume) as self.trackers:
            state = self.fit(model)
            if not distributed.is_main():  # torchrun: the other processes only helped train
                return {}
            summary = self.finish(model, state)
            self.trackers.summary(summary, state.step)
        return summary

    def start(self) -> torch.nn.Module:
        """Steps 2 to 5 of the flow: :meth:`before_start`, :func:`start_run`, :meth:`setup`, the
        first writes (rank 0), and the model (:meth:`build_model`), which it returns."""
        self.before_start()
        self.context: RunContext = start_run(self.settings.train, self.cpu)
        config = self.setup()
        if distributed.is_main():
            if not self.resume:  # a resumed run keeps its own
                if self.tokenizer is not None:
                    self.tokenizer.save(self.run_dir / TOKENIZER)
                for name, content in self.new_run_files().items():
                    write_json(self.run_dir / name, content)
            write_settings(
                self.run_dir, self.name, self.settings, config, self.context.to_dict(), self.resume
            )
        return self.build_model(config)

    def finish(self, model: torch.nn.Module, state: LoopState) -> dict:
        """Step 7 of the flow (rank 0): :meth:`final_weights`, :meth:`summarize`, the summary's
        common keys and ``summary.json``, which it returns."""
        trained = self.final_weights(model, state)
        summary = self.summarize(model, state)
        for key, value in self._figures(model, state, trained).items():
            summary.setdefault(key, value)  # a recipe may count its own (ViT: epochs of images)
        write_json(self.run_dir / SUMMARY, summary)
        return summary

    def loop_settings(self) -> TrainSettings:
        """The loop's settings: ``train`` with ``max_steps`` the recipe's :meth:`total_steps`."""
        total = self.total_steps()
        return self.settings.train if total is None else replace(self.settings.train, max_steps=total)

    def fit(
        self,
        model: torch.nn.Module,
        batches: Callable[[int], Sequence] | None = None,
        schedule: Schedule | None = None,
        observe: Callable[[LoopEvent], None] | None = None,
    ) -> LoopState:
        """Step 6: the shared loop (:func:`~qkv.train.loop.train_loop`) over the recipe's parts
        with AdamW and the settings' learning-rate schedule, measuring the machine's load while
        it trains (:attr:`RunContext.cpu`). ``batches`` (default :meth:`batches`), ``schedule``
        (default :meth:`loop_settings`') and ``observe`` go to the loop: the dry run
        (:mod:`qkv.train.dry_run`) gives a sample of the epoch's batches, a budget of a few
        steps and its clock."""
        train = self.loop_settings()
        optimizer = make_optimizer(model, train)
        # Eq. 3 scales the rate by the model's d_model
        lr = train.lr_schedule(cast(Any, model).config.d_model, peak_lr=self.peak_lr())
        share = self.context.cpu
        since = share.mark()
        state = train_loop(
            model,
            optimizer,
            lr,
            batches or self.batches,
            self.loss,
            self.validate,
            self.run_dir,
            train,
            self.progress,
            score_key=self.score_key,
            higher_is_better=self.higher_is_better,
            resume=self.resume,
            precision=self.context.precision,
            schedule=schedule,
            cpu=share,
            observe=observe,
            trackers=self.trackers,
        )
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

    def step_budget_key(self) -> str:
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
        (:func:`padded_length`)."""
        return padded_length(batch)

    def save_json(self, name: str, content: dict) -> None:
        """Write ``content`` as ``run_dir / name`` from rank 0 only (a recipe's own file)."""
        if distributed.is_main():
            write_json(self.run_dir / name, content)

    # ---------------------------------------------------------------- what a recipe states
    def before_start(self) -> None:  # noqa: B027  (optional hook)
        """Read and check inputs before :func:`start_run` seeds the run
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
        (:func:`keep_best`, LoRA adapters saved and merged)."""
        return keep_best(model, self.run_dir, self.settings.train.lora)

    @abstractmethod
    def summarize(self, model: torch.nn.Module, state: LoopState) -> dict:
        """The summary's own keys: validation and test scores, the recipe's own figures."""


class ClassifierRun(TrainingRun):
    """A classification run (proteins, texts, images): the best weights on ``score_key``,
    higher is better; a summary of its task, its validation and test metrics, the test
    confusion matrix drawn to ``confusion.png`` and a classical baseline's test metrics."""

    higher_is_better = True
    extras = ("probe",)  # scikit-learn's classification metrics
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
        if missing("plot"):
            logger.info("no confusion.png: drawing it needs matplotlib: pip install 'qkv[plot]'")
        else:
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
    """The :class:`TrainingRun` subclass behind a :class:`~qkv.recipes.recipe.Recipe`'s ``train``
    (its classmethod :meth:`TrainingRun.train`), for the dry run (:func:`qkv.train.dry_run.dry_run`).

    Raises:
        QkvError: the recipe is not trained by a :class:`TrainingRun` (a converted kind of run).
    """
    owner = getattr(recipe.train, "__self__", None)
    if not (isinstance(owner, type) and issubclass(owner, TrainingRun)):
        raise QkvError(f"{recipe.name!r} runs are not trained by qkv train, so they have no dry run")
    return owner


def padded_length(batch: object) -> int | None:
    """The padded length of a training batch whose shape shows it: a ``(B, L)`` tensor of ids,
    a list of token lists (rows of ``L`` at most), or an object holding ``(B, L)`` id tensors
    (translation's :class:`~qkv.data.batching.TranslationBatch`: the longer of ``src`` and
    ``tgt_in``); ``None`` for anything else (indices, images)."""
    if isinstance(batch, torch.Tensor):
        return batch.size(1) if batch.dim() == 2 and not batch.is_floating_point() else None
    if isinstance(batch, list) and batch and all(isinstance(row, list) for row in batch):
        return max(len(row) for row in batch)
    fields = vars(batch).values() if hasattr(batch, "__dict__") else ()
    ids = [
        v.size(1)
        for v in fields
        if isinstance(v, torch.Tensor) and v.dim() == 2 and not v.is_floating_point()
    ]
    return max(ids) if ids else None
