"""Recipe: image classification with a Vision Transformer (``qkv train vit``).

Flow: :mod:`qkv.data.images` (Fashion-MNIST, scikit-learn's digits, or the user's folder) →
a stratified validation split of the training images → mini-batches with random crop and flip
→ :class:`~qkv.models.vit.VisionTransformer` → cross-entropy → :func:`qkv.train.loop.train_loop`,
keeping the weights with the best validation accuracy → test metrics (accuracy, per-class
accuracy, macro F1, confusion matrix) beside logistic regression on the same pixels.

Splits (:func:`qkv.data.images.load_image_task`): Fashion-MNIST's 60,000 training images
lose ``val_fraction`` (stratified, by ``split_seed``) to validation; its 10,000 test images
are touched only for the final figure.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import ClassVar

import torch
import torch.nn.functional as F

from ..data.images import ImageBatch, ImageSet, ImageTask, augment, load_image_task, to_model_input
from ..errors import ConfigError, QkvError
from ..evaluate.classification import classification_metrics, plot_confusion
from ..explain.vision import ImageExplainer
from ..inference.vision import ImageClassifier
from ..models.config import ViTConfig
from ..models.model_types import VIT
from ..models.vit import VisionTransformer
from ..runs import RunInfo
from ..runs.layout import SUMMARY, TASK
from ..train.loop import LoopState
from ..train.run import ClassifierRun
from ..train.train_settings import TrainSettings
from .common import TASK_SPLITS, run_directory, trained_for
from .recipe import Recipe

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class ViTSettings:
    """Settings of ``qkv train vit``: ``model`` (a :class:`ViTConfig`; ``image_size``,
    ``channels`` and ``num_labels`` are set from the data for the built-in tasks, and
    ``num_labels`` from the class folders for a folder), ``train`` (:class:`TrainSettings`:
    by default 30 minutes with the cosine decay spread over them) and the task fields.

    ``task``: ``fashion-mnist``, ``digits`` or a folder (``DIR/<class>/<image>``, or
    ``DIR/train/<class>/...`` + ``DIR/test/<class>/...``). ``batch_size``: images per step.
    ``crop_padding``: random crop after padding by this many pixels (0: off). ``hflip``: random
    horizontal flips. ``tta_hflip``: with ``hflip``, validation, test and ``qkv classify``
    average the class probabilities of each image and its mirror (test-time augmentation;
    ignored without ``hflip``: that model never saw a mirrored image). ``label_smoothing``: of
    the cross-entropy. ``val_fraction``, ``split_seed``: the held-out splits. ``baseline``: also
    fit logistic regression on pixels.
    """

    model: ViTConfig = ViTConfig()
    train: TrainSettings = TrainSettings(
        lr=2e-3,
        weight_decay=0.05,
        beta2=0.999,
        warmup_steps=200,
        min_lr_ratio=0.0,
        max_minutes=30.0,
        eval_every=1000,
        snapshot_minutes=1e9,
        keep_snapshots=1,
    )
    task: str = "fashion-mnist"
    batch_size: int = 128
    crop_padding: int = 0
    hflip: bool = True
    tta_hflip: bool = True
    label_smoothing: float = 0.1
    val_fraction: float = 0.1
    split_seed: int = 0
    baseline: bool = True

    # what defines the run's data, vocabulary and trained weights: a resume keeps them
    # (qkv.runs.record.refuse_changed_settings; the model is compared whole, config.json)
    FIXED_ON_RESUME: ClassVar[tuple[str, ...]] = ("task", "val_fraction", "split_seed")

    def __post_init__(self) -> None:
        problems = []
        if self.batch_size < 1:
            problems.append(f"batch_size ({self.batch_size}) must be >= 1")
        if self.crop_padding < 0:
            problems.append(f"crop_padding ({self.crop_padding}) must be >= 0")
        if not 0.0 <= self.label_smoothing < 1.0:
            problems.append(f"label_smoothing ({self.label_smoothing}) must be in [0, 1)")
        if not 0.0 < self.val_fraction < 0.5:
            problems.append(f"val_fraction ({self.val_fraction}) must be in (0, 0.5)")
        if problems:
            raise ConfigError("; ".join(problems))


def load_task(settings: ViTSettings) -> ImageTask:
    """The recipe's :class:`~qkv.data.images.ImageTask` (see :func:`load_image_task`)."""
    return load_image_task(
        settings.task,
        settings.model.image_size,
        settings.model.channels,
        settings.val_fraction,
        settings.split_seed,
    )


def model_config(settings: ViTSettings, task: ImageTask) -> ViTConfig:
    """The recipe's ViT with the image size, channels and class count of the task's data."""
    _, h, w, c = task.train.images.shape
    if h != w:
        raise QkvError(f"{task.name}: images are {h}x{w}; a ViT here takes square images")
    return replace(settings.model, image_size=h, channels=c, num_labels=len(task.classes))


def evaluate_images(classifier: ImageClassifier, data: ImageSet) -> dict:
    """Accuracy, MCC, macro F1, per-class precision/recall/F1, ``per_class_accuracy`` and the
    confusion matrix of ``classifier`` on ``data``."""
    probs = classifier.predict(data.images)
    metrics = classification_metrics(data.labels, probs.argmax(1), probs, data.classes)
    metrics["per_class_accuracy"] = {c: m["recall"] for c, m in metrics["per_class"].items()}
    return metrics


class ViTRun(ClassifierRun):
    """``qkv train vit``: the task's images in shuffled mini-batches (the last partial batch
    dropped), randomly cropped and mirrored; cross-entropy; the best validation accuracy kept;
    test metrics (with and without the mirrored view) beside logistic regression on the pixels.
    Writes ``task.json`` and ``confusion.png`` beside the usual files."""

    name, score_key, confusion_title = "vit", "val_accuracy", "ViT"

    def before_start(self) -> None:
        self.task = load_task(self.settings)
        self.config = model_config(self.settings, self.task)

    def setup(self) -> ViTConfig:
        task, cfg = self.task, self.config
        sizes = {s: len(task.split(s).labels) for s in ("train", "val", "test")}
        logger.info(
            f"{task.name}: {sizes['train']:,} train / {sizes['val']:,} val / {sizes['test']:,} "
            f"test images of {cfg.image_size}x{cfg.image_size}x{cfg.channels}, "
            f"{len(task.classes)} classes; {cfg.n_patches} patches of {cfg.patch_size}x"
            f"{cfg.patch_size} + the class token. {task.citation}"
        )
        self.x_train = to_model_input(task.train.images)  # (N, C, H, W) float32, kept on the host
        self.y_train = torch.from_numpy(task.train.labels)
        return cfg

    def new_run_files(self) -> dict[str, dict]:
        task = self.task
        return {
            TASK: {
                "task": task.name,
                "classes": list(task.classes),
                "input": "pixel / 127.5 - 1, see qkv.data.images.read_image",
                "citation": task.citation,
            }
        }

    def build_model(self, config: ViTConfig) -> VisionTransformer:
        s = self.settings
        model = VisionTransformer(config).to(self.device)
        logger.info(f"ViT: {model.num_parameters():,} parameters")
        self.classifier = ImageClassifier(
            model, self.task.classes, self.device, hflip_tta=s.hflip and s.tta_hflip
        )
        return model

    def _per_epoch(self) -> int:
        return max(len(self.y_train) // self.settings.batch_size, 1)  # the last partial batch is dropped

    def total_steps(self) -> int | None:
        train = self.settings.train
        if train.max_steps or not train.max_epochs:
            return train.max_steps
        return self._per_epoch() * train.max_epochs // train.accum_steps

    def batches(self, epoch: int) -> list[ImageBatch]:
        size, seed = self.settings.batch_size, self.settings.train.seed * 1000 + epoch
        order = torch.randperm(len(self.y_train), generator=torch.Generator().manual_seed(seed))
        return [ImageBatch(epoch, i, order[i * size : (i + 1) * size]) for i in range(self._per_epoch())]

    def loss(self, model, batch: ImageBatch) -> tuple[torch.Tensor, int]:
        s, idx = self.settings, batch.rows
        # augmentation drawn from (seed, epoch, batch): a resumed run sees the same images
        seed = (s.train.seed * 1000 + batch.epoch) * 100_000 + batch.number
        if batch.part:  # one process's share of the batch: a stream of its own
            seed = seed * 64 + batch.part
        gen = torch.Generator().manual_seed(seed)
        images = augment(self.x_train[idx], s.crop_padding, s.hflip, gen).to(self.device)
        logits = model(images).logits
        target = self.y_train[idx].to(self.device)
        loss = F.cross_entropy(logits.float(), target, reduction="sum", label_smoothing=s.label_smoothing)
        return loss, len(idx)

    def validate(self, model) -> dict:
        m = evaluate_images(self.classifier, self.task.val)
        return {"val_accuracy": m["accuracy"], "val_macro_f1": m["macro_f1"]}

    def split_metrics(self, split: str) -> dict:
        return evaluate_images(self.classifier, self.task.split(split))

    def head_keys(self) -> dict:
        return {"task": self.task.name}

    def summarize(self, model, state: LoopState) -> dict:
        summary = super().summarize(model, state)
        summary["tta"] = self.classifier.hflip_tta
        if self.classifier.hflip_tta:  # what one view of each image scores, so the gain is visible
            single = evaluate_images(ImageClassifier(model, self.task.classes, self.device), self.task.test)
            summary["test_single_view"] = {k: single[k] for k in ("accuracy", "macro_f1")}
        summary["epochs"] = round(state.step * self.settings.batch_size / len(self.y_train), 2)
        return summary

    def baseline(self) -> dict | None:
        if not self.settings.baseline:
            return None
        from ..evaluate.baselines import pixel_baseline_metrics

        t, train, test = time.perf_counter(), self.task.train, self.task.test
        scores = pixel_baseline_metrics(
            train.images, train.labels, test.images, test.labels, self.task.classes
        )
        scores["fit_minutes"] = round((time.perf_counter() - t) / 60, 2)
        return scores


def split_scores(run_dir: str | Path, split: str = "test", device: torch.device | str = "cpu") -> dict:
    """Metrics of a finished ``qkv train vit`` run on ``split`` of its own task (as recorded in
    ``train_config.json``).

    Raises:
        QkvError: a bad run directory or split name.
    """
    from ..settings import resolve

    run_dir = Path(run_dir)
    classifier = ImageClassifier.from_run(run_dir, device)
    saved = RunInfo.read(run_dir).settings
    keys = ("task", "val_fraction", "split_seed")
    settings = resolve(ViTSettings, overrides=[f"{k}={saved[k]}" for k in keys if k in saved])
    settings = replace(settings, model=classifier.config)
    data = load_task(settings).split(split)
    return {
        "task": settings.task,
        "split": split,
        "tta": classifier.hflip_tta,
        **evaluate_images(classifier, data),
    }


def evaluate_run(run_dir: str | Path, split: str = "test", device: torch.device | str = "cpu") -> dict:
    """:func:`split_scores`, and its confusion matrix drawn to ``confusion_SPLIT.png`` in
    the run directory (``qkv evaluate``)."""
    result = split_scores(run_dir, split, device)
    path = Path(run_dir) / f"confusion_{split}.png"
    plot_confusion(result["confusion"], list(result["per_class"]), path, f"{result['task']} {split}")
    logger.info(f"confusion matrix: {path}")
    return result


def summary_text(summary: dict, run_dir: Path) -> str:
    """What ``qkv train vit`` shows at the end: test accuracy (with and without the mirrored
    view), the baseline's, and what to run next."""
    test, run = summary["test"], Path(run_dir).resolve()
    line = (
        f"{summary['task']} test accuracy {test['accuracy']:.4f} (macro F1 {test['macro_f1']:.4f}) "
        f"after {trained_for(summary, of_training=True)} "
        f"({summary['epochs']:.1f} epochs); {summary['total_minutes']:.1f} min in all"
    )
    if summary.get("test_single_view"):
        line += (
            f"\n(each image and its mirror averaged, tta_hflip; one view: test accuracy "
            f"{summary['test_single_view']['accuracy']:.4f})"
        )
    base = summary.get("baseline_test")
    if base:
        line += f"\nbaseline ({base['baseline']}): test accuracy {base['accuracy']:.4f}"
    return (
        f"{line}\n{run_directory(run, SUMMARY, 'confusion.png')}\nnext:\n"
        f"  qkv classify {run} IMAGE.png ...\n"
        f"  qkv explain {run} --input IMAGE.png --out {run}/explain   # where each head looks\n"
        f"  qkv explain {run} --serve"
    )


RECIPE = Recipe(
    name="vit",
    settings=ViTSettings,
    train=ViTRun.train,
    evaluate=evaluate_run,
    splits=TASK_SPLITS,
    summary=summary_text,
    model_type=VIT,
    explainer=ImageExplainer,
    inputs="image",
    classifier=True,
)
