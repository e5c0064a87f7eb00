"""Recipe: text classification on a pretrained encoder (``qkv train text-cls``), e.g. SST-2
sentiment on all-MiniLM-L6-v2.

Four modes on the same architecture and tokenizer (``init``: a pretrained short name, HF
folder or converted run), as the lecture notes put it ("people use pre-trained models
and train a feed-forward layer on their task"):

- fine-tune (default): every weight trains, starting from the pretrained ones;
- ``freeze=true``: a linear probe, only the classification head trains;
- ``train.lora_rank=R``: LoRA adapters of rank R on the frozen encoder (Hu et al. 2021), the
  head trained fully: between the probe and fine-tuning in what trains and what it costs;
- ``scratch=true``: the same architecture from random weights (what pretraining is worth).

Flow: :func:`qkv.data.text_tasks.load_text_task` → the pretrained tokenizer → length-bucketed
batches → :class:`~qkv.models.encoder.EncoderModel`'s sequence head (over the pooled sentence:
the mean of real tokens for MiniLM, as sentence-transformers pools) → cross-entropy →
:func:`qkv.train.loop.train_loop`, keeping the weights with the best validation accuracy → test
metrics beside a TF-IDF + logistic regression baseline fitted on the same training split.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal

import torch
import torch.nn.functional as F

from ..data.batching import pad_sequences
from ..data.text_tasks import TextTask, load_text_task
from ..data.tokenizers import HFTokenizer
from ..errors import ConfigError, QkvError
from ..evaluate.classification import classification_metrics
from ..explain.explainers import TextExplainer
from ..hub.pretrained import load
from ..inference.text import TextEncoder
from ..models.config import EncoderConfig
from ..models.encoder import EncoderModel
from ..models.model_types import ENCODER, built_as
from ..runs import RunInfo
from ..runs.layout import SUMMARY, TASK
from ..train.run import SequenceClassifierRun
from ..train.train_settings import TrainSettings
from .common import (
    LORA_KEYS,
    TASK_SPLITS,
    encoder_with_head,
    require_at_least_one,
    run_directory,
    trained_for,
)
from .recipe import Recipe

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class TextClsSettings:
    """Settings of ``qkv train text-cls``.

    ``task``: ``sst2`` or a TSV/CSV file (``sentence``/``text`` and ``label`` columns; split
    80/10/10 by ``split_seed``). ``init``: the pretrained encoder (``minilm``, an HF folder or a
    run directory); its architecture and tokenizer are used in every mode. ``freeze``: linear
    probe (dropouts 0). ``scratch``: random weights. ``dropout``: on sub-layer outputs and
    before the head. ``pooling``: ``"mean"``/``"cls"``, or ``None`` for the pretrained
    model's own (mean for MiniLM). ``max_len``: longer texts are cut (tokens, specials
    included). ``max_tokens``: padded tokens per micro-batch. ``train.lr=None`` picks 1e-4
    fine-tuning (MiniLM on SST-2: validation accuracy 0.891, the only rate tried), 3e-3
    probing, 5e-4 from scratch and with LoRA (``train.lora_rank``; excludes ``freeze`` and
    ``scratch``).
    """

    train: TrainSettings = TrainSettings(
        lr=None,
        schedule="linear",
        min_lr_ratio=0.0,
        warmup_steps=200,
        weight_decay=0.01,
        max_epochs=3,
        eval_every=500,
        snapshot_minutes=1e9,
        keep_snapshots=1,
    )
    task: str = "sst2"
    init: str = "minilm"
    freeze: bool = False
    scratch: bool = False
    dropout: float = 0.1
    pooling: Literal["mean", "cls"] | None = None
    max_len: int = 128
    max_tokens: int = 2048
    split_seed: int = 0
    baseline: bool = True

    # what defines the run's data, vocabulary and trained weights: a resume keeps them
    # (qkv.runs.record.refuse_changed_settings; the model is compared whole, config.json)
    FIXED_ON_RESUME: ClassVar[tuple[str, ...]] = (
        "task",
        "split_seed",
        "max_len",
        "init",
        "freeze",
        "scratch",
        *LORA_KEYS,
    )

    def __post_init__(self) -> None:
        require_at_least_one(self, "max_tokens")
        if self.freeze and self.scratch:
            raise ConfigError(
                "freeze=true (a probe of pretrained features) and scratch=true exclude each other"
            )
        if self.train.lora_rank and (self.freeze or self.scratch):
            raise ConfigError(
                "train.lora_rank (LoRA adapters on the pretrained encoder) excludes "
                f"{'freeze=true' if self.freeze else 'scratch=true'}"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"dropout ({self.dropout}) must be in [0, 1)")
        if self.max_len < 3:
            raise ConfigError(f"max_len ({self.max_len}) must leave room for two specials and a token")

    @property
    def mode(self) -> str:
        if self.train.lora_rank:
            return "lora"
        return "probe" if self.freeze else "scratch" if self.scratch else "fine-tune"

    @property
    def peak_lr(self) -> float:
        if self.train.lr is not None:
            return self.train.lr
        # LoRA: Hu et al. 2021's rate for RoBERTa-base on SST-2 (Appendix D, Table 9)
        return {"probe": 3e-3, "scratch": 5e-4, "fine-tune": 1e-4, "lora": 5e-4}[self.mode]


def build_model(settings: TextClsSettings, num_labels: int) -> tuple[EncoderModel, HFTokenizer]:
    """``(model, tokenizer)``: the init's architecture with a ``num_labels`` head, the recipe's
    dropout and pooling, and (unless ``scratch``) the pretrained weights but for the heads."""
    pretrained, tokenizer = load(settings.init)
    if not built_as(pretrained, ENCODER) or getattr(tokenizer, "kind", None) != "hf":
        raise QkvError(f"init={settings.init} is not a pretrained text encoder")
    model = encoder_with_head(
        pretrained,
        num_labels,
        settings.pooling or pretrained.config.pooling,
        settings.dropout,
        "sequence_head",
        settings.mode,
        settings.train.lora,
    )
    return model, tokenizer


def evaluate_split(encoder: TextEncoder, task: TextTask, split: str) -> dict:
    """Classification metrics of ``encoder`` on one split of ``task``."""
    probs = encoder.predict(task.texts[split])
    return classification_metrics(task.labels[split], probs.argmax(1), probs, task.classes)


class TextClsRun(SequenceClassifierRun):
    """``qkv train text-cls``: the task's texts through the init's tokenizer (cut at
    ``max_len``), the head's cross-entropy; the best validation accuracy kept; test metrics
    beside a TF-IDF baseline's."""

    name, score_key = "text-cls", "val_accuracy"

    def before_start(self) -> None:
        s = self.settings
        self.task = load_text_task(s.task, s.split_seed)
        # The head's (and a model from scratch's) initial weights follow the seed: torch seeds
        # itself differently in every process, and the model is built before start_run seeds it.
        torch.manual_seed(s.train.seed)
        self.model, self.tokenizer = build_model(s, len(self.task.classes))
        self.confusion_title = s.mode

    def setup(self) -> EncoderConfig:
        s, task = self.settings, self.task
        counts = {k: len(task.texts[k]) for k in ("train", "val", "test")}
        logger.info(
            f"{task.name}: {counts['train']:,} train / {counts['val']:,} val / {counts['test']:,} test "
            f"texts, classes {', '.join(task.classes)}; {s.mode} of {s.init}. {task.citation}"
        )
        self.model.to(self.device)
        self.encoder = TextEncoder(self.model, self.tokenizer, self.device, task.classes)
        self.rows = self.encoder.rows(task.texts["train"], s.max_len, warn=False)  # cut silently
        self.lengths = [(len(r), 0) for r in self.rows]
        return self.model.config

    def new_run_files(self) -> dict[str, dict]:
        s, task = self.settings, self.task
        return {
            TASK: {
                "task": task.name,
                "classes": list(task.classes),
                "mode": s.mode,
                "init": s.init,
                "citation": task.citation,
            }
        }

    def build_model(self, config: EncoderConfig) -> EncoderModel:
        return self.model

    def loss(self, model, idx) -> tuple[torch.Tensor, int]:
        pad_id, labels = self.tokenizer.pad_id, self.task.labels["train"]  # TextEncoder needs a pad
        tokens = pad_sequences([self.rows[i] for i in idx], pad_id).to(self.device)
        target = pad_sequences([[labels[i]] for i in idx], -100)[:, 0].to(self.device)
        logits = model(tokens, head="sequence").logits  # (B, num_labels)
        return F.cross_entropy(logits.float(), target, reduction="sum"), len(idx)

    def validate(self, model) -> dict:
        m = evaluate_split(self.encoder, self.task, "val")
        return {"val_accuracy": m["accuracy"], "val_mcc": m["mcc"]}

    def split_metrics(self, split: str) -> dict:
        return evaluate_split(self.encoder, self.task, split)

    def head_keys(self) -> dict:
        return {"task": self.task.name, "mode": self.settings.mode, "init": self.settings.init}

    def baseline(self) -> dict | None:
        if not self.settings.baseline:
            return None
        from ..evaluate.baselines import tfidf_baseline_metrics

        texts, labels = self.task.texts, self.task.labels
        return tfidf_baseline_metrics(
            texts["train"], labels["train"], texts["test"], labels["test"], self.task.classes
        )


def evaluate_run(run_dir: str | Path, split: str = "test", device: torch.device | str = "cpu") -> dict:
    """Metrics of a finished ``text-cls`` run on ``split`` of its own task."""
    run_dir = Path(run_dir)
    settings = RunInfo.read(run_dir).settings
    if split not in TASK_SPLITS:
        raise QkvError(f"split must be train, val or test (got {split!r})")
    encoder = TextEncoder.load(run_dir, device)
    task = load_text_task(settings["task"], settings.get("split_seed", 0))
    return {"task": task.name, "split": split, **evaluate_split(encoder, task, split)}


def summary_text(summary: dict, run_dir: Path) -> str:
    """What ``qkv train text-cls`` shows at the end: test accuracy beside the TF-IDF baseline's."""
    test = summary["test"]
    line = (
        f"{summary['task']} test accuracy {test['accuracy']:.4f} (MCC {test['mcc']:.3f}), "
        f"{summary['mode']} of {summary['init']}, after {trained_for(summary)}"
    )
    base = summary.get("baseline_test")
    if base:
        line += f"\nbaseline ({base['baseline']}): test accuracy {base['accuracy']:.4f}"
    return f"{line}\n{run_directory(run_dir, SUMMARY, 'confusion.png')}"


RECIPE = Recipe(
    name="text-cls",
    settings=TextClsSettings,
    train=TextClsRun.train,
    evaluate=evaluate_run,
    splits=TASK_SPLITS,
    summary=summary_text,
    model_type=ENCODER,
    explainer=TextExplainer,
    inputs="text",
    classifier=True,
    adapters=True,
)
