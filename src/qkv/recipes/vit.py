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

import json
import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from ..data.images import ImageSet, ImageTask, augment, load_image_task, to_model_input
from ..errors import ConfigError, QkvError
from ..evaluate.classification import classification_metrics, plot_confusion
from ..explain.vision import ImageExplainer
from ..generate.vision import ImageClassifier
from ..models.config import ViTConfig
from ..models.model_types import VIT
from ..models.vit import VisionTransformer
from ..train import distributed
from ..train.checkpoint import write_json
from ..train.settings import TrainSettings
from .base import Recipe
from .common import TASK_SPLITS, fit, keep_best, prepare_run_dir, start_run, write_settings

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class ViTRecipe:
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


def load_task(recipe: ViTRecipe) -> ImageTask:
    """The recipe's :class:`~qkv.data.images.ImageTask` (see :func:`load_image_task`)."""
    return load_image_task(
        recipe.task, recipe.model.image_size, recipe.model.channels, recipe.val_fraction, recipe.split_seed
    )


def model_config(recipe: ViTRecipe, task: ImageTask) -> ViTConfig:
    """The recipe's ViT with the image size, channels and class count of the task's data."""
    _, h, w, c = task.train.images.shape
    if h != w:
        raise QkvError(f"{task.name}: images are {h}x{w}; a ViT here takes square images")
    return replace(recipe.model, image_size=h, channels=c, num_labels=len(task.classes))


def evaluate_images(classifier: ImageClassifier, data: ImageSet) -> dict:
    """Accuracy, MCC, macro F1, per-class precision/recall/F1, ``per_class_accuracy`` and the
    confusion matrix of ``classifier`` on ``data``."""
    probs = classifier.predict(data.images)
    metrics = classification_metrics(data.labels, probs.argmax(1), probs, data.classes)
    metrics["per_class_accuracy"] = {c: m["recall"] for c, m in metrics["per_class"].items()}
    return metrics


@dataclass(frozen=True)
class ImageBatch:
    """One training micro-batch: the ``number``-th of ``epoch``, image ``rows`` (indices into the
    training split); ``part`` > 0 is one process's share of it under torchrun (its augmentation
    draws from a stream of its own)."""

    epoch: int
    number: int
    rows: torch.Tensor
    part: int = 0

    def __len__(self) -> int:
        return len(self.rows)

    def shard(self, rank: int, world_size: int) -> ImageBatch:
        return replace(self, rows=self.rows[rank::world_size], part=rank + 1)


def train_vit(recipe: ViTRecipe, run_dir: str | Path, resume: bool = False, progress: bool = True) -> dict:
    """Train a ViT on ``recipe.task``; evaluate on its test split; write the run directory
    (``config.json``, ``model.safetensors``, ``task.json``, ``summary.json``,
    ``confusion.png``, the loop's files). Returns the summary dict.

    Raises:
        QkvError: bad data, a non-empty ``run_dir`` without ``resume``.
    """
    t_start = time.perf_counter()
    task = load_task(recipe)
    cfg = model_config(recipe, task)
    run_dir = prepare_run_dir(run_dir, resume, "vit")
    run = start_run(recipe.train)
    device = run.device
    write_settings(run_dir, "vit", recipe, cfg, run, resume)
    if not resume:  # a resumed run keeps its own
        write_json(
            run_dir / "task.json",
            {
                "task": task.name,
                "classes": list(task.classes),
                "input": "pixel / 127.5 - 1, see qkv.data.images.read_image",
                "citation": task.citation,
            },
        )
    sizes = {s: len(task.split(s).labels) for s in ("train", "val", "test")}
    logger.info(
        f"{task.name}: {sizes['train']:,} train / {sizes['val']:,} val / {sizes['test']:,} "
        f"test images of {cfg.image_size}x{cfg.image_size}x{cfg.channels}, "
        f"{len(task.classes)} classes; {cfg.n_patches} patches of {cfg.patch_size}x"
        f"{cfg.patch_size} + the class token. {task.citation}"
    )
    model = VisionTransformer(cfg).to(device)
    logger.info(f"ViT: {model.num_parameters():,} parameters")
    classifier = ImageClassifier(model, task.classes, device, hflip_tta=recipe.hflip and recipe.tta_hflip)
    x_train = to_model_input(task.train.images)  # (N, C, H, W) float32, kept on the host
    y_train = torch.from_numpy(task.train.labels)
    train_cfg, n = recipe.train, len(y_train)
    per_epoch = max(n // recipe.batch_size, 1)  # the last partial batch is dropped
    total = train_cfg.max_steps or (
        per_epoch * train_cfg.max_epochs // train_cfg.accum_steps if train_cfg.max_epochs else None
    )

    def batches(epoch: int):
        order = torch.randperm(n, generator=torch.Generator().manual_seed(train_cfg.seed * 1000 + epoch))
        return [
            ImageBatch(epoch, i, order[i * recipe.batch_size : (i + 1) * recipe.batch_size])
            for i in range(per_epoch)
        ]

    def loss_fn(model, batch):
        epoch, i, idx = batch.epoch, batch.number, batch.rows
        # augmentation drawn from (seed, epoch, batch): a resumed run sees the same images
        seed = (train_cfg.seed * 1000 + epoch) * 100_000 + i
        if batch.part:  # one process's share of the batch: a stream of its own
            seed = seed * 64 + batch.part
        gen = torch.Generator().manual_seed(seed)
        images = augment(x_train[idx], recipe.crop_padding, recipe.hflip, gen).to(device)
        logits = model(images).logits
        loss = F.cross_entropy(
            logits.float(), y_train[idx].to(device), reduction="sum", label_smoothing=recipe.label_smoothing
        )
        return loss, len(idx)

    def validate(model) -> dict:
        m = evaluate_images(classifier, task.val)
        return {"val_accuracy": m["accuracy"], "val_macro_f1": m["macro_f1"]}

    state = fit(
        model,
        train_cfg,
        batches,
        loss_fn,
        validate,
        run_dir,
        progress,
        total_steps=total,
        score_key="val_accuracy",
        higher_is_better=True,
        resume=resume,
        precision=run.precision,
    )
    if not distributed.is_main():  # torchrun: the other processes only helped train
        return {}
    keep_best(model, run_dir)
    summary: dict[str, Any] = {
        "task": task.name,
        "validation": evaluate_images(classifier, task.val),
        "test": evaluate_images(classifier, task.test),
        "tta": classifier.hflip_tta,
    }
    if classifier.hflip_tta:  # what one view of each image scores, so the gain is visible
        single = ImageClassifier(model, task.classes, device)
        summary["test_single_view"] = {
            k: evaluate_images(single, task.test)[k] for k in ("accuracy", "macro_f1")
        }
    plot_confusion(
        summary["test"]["confusion"], task.classes, run_dir / "confusion.png", f"{task.name} test (ViT)"
    )
    if recipe.baseline:
        from ..evaluate.baselines import pixel_baseline_metrics

        t = time.perf_counter()
        summary["baseline_test"] = pixel_baseline_metrics(
            task.train.images, task.train.labels, task.test.images, task.test.labels, task.classes
        )
        summary["baseline_test"]["fit_minutes"] = round((time.perf_counter() - t) / 60, 2)
    summary.update(
        {
            "train_minutes": round(state.elapsed_s / 60, 2),
            "steps": state.step,
            "epochs": round(state.step * recipe.batch_size / n, 2),
            "parameters": model.num_parameters(),
            "total_minutes": round((time.perf_counter() - t_start) / 60, 2),
        }
    )
    write_json(run_dir / "summary.json", summary)
    return summary


def evaluate_vit_run(run_dir: str | Path, split: str = "test", device: torch.device | str = "cpu") -> dict:
    """Metrics of a finished ``qkv train vit`` run on ``split`` of its own task (as recorded in
    ``train_config.json``).

    Raises:
        QkvError: a bad run directory or split name.
    """
    from ..settings import resolve

    run_dir = Path(run_dir)
    classifier = ImageClassifier.from_run(run_dir, device)
    saved = json.loads((run_dir / "train_config.json").read_text(encoding="utf-8"))
    keys = ("task", "val_fraction", "split_seed")
    recipe = resolve(ViTRecipe, overrides=[f"{k}={saved[k]}" for k in keys if k in saved])
    recipe = replace(recipe, model=classifier.config)
    data = load_task(recipe).split(split)
    return {
        "task": recipe.task,
        "split": split,
        "tta": classifier.hflip_tta,
        **evaluate_images(classifier, data),
    }


def evaluate_with_confusion(
    run_dir: str | Path, split: str = "test", device: torch.device | str = "cpu"
) -> dict:
    """:func:`evaluate_vit_run`, and its confusion matrix drawn to ``confusion_SPLIT.png`` in
    the run directory (``qkv evaluate``)."""
    result = evaluate_vit_run(run_dir, split, device)
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
        f"after {summary['train_minutes']:.1f} min of training, {summary['steps']} steps "
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
        f"{line}\nrun directory: {run} (summary.json, confusion.png)\nnext:\n"
        f"  qkv classify {run} IMAGE.png ...\n"
        f"  qkv explain {run} --input IMAGE.png --out {run}/explain   # where each head looks\n"
        f"  qkv explain {run} --serve"
    )


RECIPE = Recipe(
    name="vit",
    settings=ViTRecipe,
    train=train_vit,
    evaluate=evaluate_with_confusion,
    splits=TASK_SPLITS,
    summary=summary_text,
    model_type=VIT,
    explainer=ImageExplainer,
    inputs="image",
    classifier=True,
)
