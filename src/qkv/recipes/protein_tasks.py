"""Recipes: protein sequence classification (``qkv train protein-cls``) and per-residue
classification (``qkv train protein-residue``), from scratch, fine-tuned from a pretrained
masked-LM encoder (``init=RUN_DIR``, or a converted pretrained one such as ``init=antiberty``),
or as a linear probe (``freeze=true``: only the head is
trained, as the lecture notes put it: "people use pre-trained models and train a
feed-forward layer on their task").

Flow: :func:`qkv.data.protein_tasks.load_task` → ``<cls> residues <eos>`` tokens →
length-bucketed batches → :class:`~qkv.models.encoder.EncoderModel` head → cross-entropy →
:func:`qkv.train.loop.train_loop`, keeping the weights with the best validation MCC (sequence)
or Q3 (residue) → test metrics beside the baseline of :mod:`qkv.evaluate.baselines`.

Over-long inputs: a sequence task keeps the first ``max_len - 2`` residues (with a warning:
signal peptides and most sequence-level signals that a short model can use sit at the N
terminus; refusing would make whole proteomes unusable). A residue task splits a long chain
into consecutive windows of ``max_len - 2`` residues, so every residue gets a prediction.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from ..data.batching import pad_sequences
from ..data.protein_tasks import ProteinTask, load_task
from ..data.tokenizers import AminoAcidTokenizer, PretrainedProteinTokenizer, protein_tokenizer
from ..errors import ConfigError, QkvError
from ..evaluate.classification import classification_metrics, per_group_binary_mcc
from ..explain.explainers import ProteinExplainer
from ..inference.protein import ProteinEncoder
from ..models.config import EncoderConfig
from ..models.encoder import EncoderModel
from ..models.model_types import ENCODER, built_as
from ..runs import RunInfo
from ..runs.layout import SUMMARY, TASK
from ..train.run import SequenceClassifierRun
from ..train.train_settings import TrainSettings
from .common import LORA_KEYS, TASK_SPLITS, closing_sentence, encoder_with_head, require_at_least_one
from .recipe import Recipe

logger = logging.getLogger(__name__)

IGNORE = -100


@dataclass(frozen=True, kw_only=True)
class ProteinTaskSettings:
    """Settings of ``qkv train protein-cls`` / ``protein-residue``: ``model`` (an
    :class:`EncoderConfig`: the same network as ``protein-mlm``'s, with dropout 0.1 and the
    head's ``pooling``), ``train`` (:class:`TrainSettings`; ``train.lr=None`` picks 1e-3 from
    scratch, 3e-4 fine-tuning, 3e-3 probing, 5e-4 with LoRA adapters; the cosine decay ends
    with the last epoch), and the task fields.

    ``task``: ``signalp``, ``amp-scanner``, ``secondary-structure`` or a file (CSV/TSV with
    ``sequence``,``label`` columns, or FASTA + ``labels=FILE``). ``init``: a ``protein-mlm``
    run directory, a converted encoder, an HF folder or a pretrained name (``antiberty``) whose
    encoder and tokenizer start the model (its architecture then replaces ``model``'s, but for
    the dropout, the pooling and the number of labels). ``freeze``: train only the head
    (linear probe; dropouts 0); ``train.lora_rank=R`` instead trains LoRA adapters of the
    frozen pretrained encoder and the head (needs ``init``). ``fold``: SignalP test partition.
    ``split_seed``: the stratified split of a file or AMP Scanner. ``max_tokens``: padded
    tokens per micro-batch. ``baseline``: also fit the classical baseline on the same split.
    """

    model: EncoderConfig = EncoderConfig(dropout=0.1)
    train: TrainSettings = TrainSettings(
        lr=None,
        min_lr_ratio=0.1,
        warmup_steps=100,
        weight_decay=0.01,
        max_epochs=10,
        eval_every=200,
        snapshot_minutes=1e9,
        keep_snapshots=1,
    )
    task: str = "signalp"
    labels: str | None = None
    init: str | None = None
    freeze: bool = False
    fold: int = 0
    split_seed: int = 0
    max_tokens: int = 8192
    baseline: bool = True

    # what defines the run's data, vocabulary and trained weights: a resume keeps them
    # (qkv.runs.record.refuse_changed_settings; the model is compared whole, config.json)
    FIXED_ON_RESUME: ClassVar[tuple[str, ...]] = (
        "task",
        "labels",
        "fold",
        "split_seed",
        "init",
        "freeze",
        *LORA_KEYS,
    )

    def __post_init__(self) -> None:
        require_at_least_one(self, "max_tokens")
        if self.freeze and not self.init:
            raise ConfigError("freeze=true (a linear probe) needs init=RUN_DIR, a pretrained encoder")
        if self.train.lora_rank and (self.freeze or not self.init):
            raise ConfigError(
                "train.lora_rank (LoRA adapters on a pretrained encoder) needs init and excludes freeze=true"
            )
        if self.fold not in (0, 1, 2):
            raise ConfigError(f"fold ({self.fold}) must be 0, 1 or 2")
        if self.model.max_len < 3:
            raise ConfigError(
                f"model.max_len ({self.model.max_len}) must leave room for <cls>, a residue and <eos>"
            )

    @property
    def mode(self) -> str:
        if self.train.lora_rank:
            return "lora"
        return "probe" if self.freeze else "fine-tune" if self.init else "scratch"

    @property
    def peak_lr(self) -> float:
        if self.train.lr is not None:
            return self.train.lr
        return {"probe": 3e-3, "fine-tune": 3e-4, "scratch": 1e-3, "lora": 5e-4}[self.mode]


def build_model(
    settings: ProteinTaskSettings, num_labels: int, level: str = "sequence"
) -> tuple[EncoderModel, AminoAcidTokenizer | PretrainedProteinTokenizer]:
    """``(model, tokenizer)``: from scratch, qkv's amino-acid tokenizer and the recipe's
    ``model`` fields; with ``init``, the pretrained encoder's architecture (this recipe's
    dropout, pooling and number of labels), weights (every one but the task heads) and tokenizer
    (``freeze``: only the ``level``'s head trains). ``init`` is a ``protein-mlm`` run, a
    converted encoder, an HF folder or a pretrained short name (``antiberty``), read through
    :func:`qkv.hub.pretrained.load`.

    Raises:
        QkvError: ``init`` cannot be loaded, or is not an encoder of protein sequences.
    """
    if not settings.init:
        tok = AminoAcidTokenizer()
        return EncoderModel(
            replace(settings.model, vocab_size=tok.vocab_size, pad_id=tok.pad_id, num_labels=num_labels)
        ), tok
    from ..hub.pretrained import load

    pretrained, pretrained_tok = load(settings.init)
    if not built_as(pretrained, ENCODER):
        raise QkvError(f"init={settings.init} is a {type(pretrained).__name__}, not an encoder")
    model = encoder_with_head(
        pretrained,
        num_labels,
        settings.model.pooling,
        settings.model.dropout,
        f"{level}_head",
        settings.mode,
        settings.train.lora,
    )
    return model, protein_tokenizer(pretrained_tok)


def evaluate_split(encoder: ProteinEncoder, task: ProteinTask, split: str) -> dict:
    """Metrics of ``encoder`` on one split of ``task`` (plus per-kingdom SP MCCs for SignalP,
    Q3 for residue tasks)."""
    records = task.split(split)
    probs = encoder.predict([r.sequence for r in records], [r.id for r in records])
    y_true: list[int] | np.ndarray
    if task.level == "sequence":
        y_true = [task.label_ids(r)[0] for r in records]
        p = np.stack(probs)
    else:
        y = [np.array(task.label_ids(r)) for r in records]
        keep = [yy != IGNORE for yy in y]
        y_true = np.concatenate([yy[k] for yy, k in zip(y, keep, strict=True)])
        p = np.concatenate([pp[k] for pp, k in zip(probs, keep, strict=True)])
    metrics = classification_metrics(y_true, p.argmax(1), p, task.classes)
    if task.level == "residue":
        metrics["q3"] = metrics["accuracy"]
    if task.name == "signalp":
        metrics["per_kingdom_mcc"] = per_group_binary_mcc(
            y_true, p.argmax(1), [r.group for r in records], list(task.classes), "NO_SP"
        )
    return metrics


class ProteinTaskRun(SequenceClassifierRun):
    """``qkv train protein-cls`` (``level = "sequence"``) or ``protein-residue``: the task's
    records as ``<cls> residues <eos>`` rows (windows of a long chain for residue tasks), the
    head's cross-entropy; the best validation MCC (sequence) or Q3 (residue) kept."""

    level = "sequence"

    def before_start(self) -> None:
        s = self.settings
        self.task = load_task(s.task, self.level, s.fold, s.labels, s.split_seed)
        # The head's (and a model from scratch's) initial weights follow the seed: torch seeds
        # itself differently in every process, and the model is built before start_run seeds it.
        torch.manual_seed(s.train.seed)
        self.model, self.tokenizer = build_model(s, len(self.task.classes), self.level)
        score = self.task.score or ("mcc" if self.level == "sequence" else "q3")
        self.score, self.score_key, self.confusion_title = score, f"val_{score}", s.mode

    def setup(self) -> EncoderConfig:
        task = self.task
        counts = {s: len(task.split(s)) for s in ("train", "val", "test")}
        logger.info(
            f"{task.name}: {counts['train']:,} train / {counts['val']:,} val / {counts['test']:,} test "
            f"records, classes {', '.join(task.classes)}; {self.settings.mode}. {task.citation}"
        )
        self.model.to(self.device)
        self.encoder = ProteinEncoder(
            self.model, task.classes, self.level, self.device, tokenizer=self.tokenizer
        )
        train = task.split("train")
        # over-long training sequences are cut silently here; prediction warns about them
        self.rows, owner = self.encoder.rows([r.sequence for r in train], [r.id for r in train], warn=False)
        self.labels = _row_labels(task, train, self.rows, owner, self.encoder.width)
        self.lengths = [(len(r), 0) for r in self.rows]
        return self.model.config

    def new_run_files(self) -> dict[str, dict]:
        task = self.task
        return {
            TASK: {
                "task": task.name,
                "level": self.level,
                "classes": list(task.classes),
                "mode": self.settings.mode,
                "citation": task.citation,
            }
        }

    def build_model(self, config: EncoderConfig) -> EncoderModel:
        return self.model

    def loss(self, model, idx) -> tuple[torch.Tensor, int]:
        tokens = pad_sequences([self.rows[i] for i in idx], self.tokenizer.pad_id).to(self.device)
        target = pad_sequences([self.labels[i] for i in idx], IGNORE).to(self.device)
        # A probe needs no special path: with the encoder's weights frozen autograd records
        # nothing through it, and build_model sets its dropouts to 0.
        logits = model(tokens, head=self.level).logits  # the compiled model with train.compile=true
        if self.level == "sequence":
            target = target[:, 0]
        loss = F.cross_entropy(
            logits.flatten(0, -2).float(), target.flatten(), ignore_index=IGNORE, reduction="sum"
        )
        return loss, int((target != IGNORE).sum())

    def validate(self, model) -> dict:
        m = evaluate_split(self.encoder, self.task, "val")
        return {self.score_key: m[self.score], "val_accuracy": m["accuracy"]}

    def split_metrics(self, split: str) -> dict:
        return evaluate_split(self.encoder, self.task, split)

    def head_keys(self) -> dict:
        s = self.settings
        return {"task": self.task.name, "mode": s.mode, "init": s.init, "score": self.score}

    def baseline(self) -> dict | None:
        if not self.settings.baseline:
            return None
        from ..evaluate.baselines import baseline_metrics

        return baseline_metrics(self.task, "test")


class ProteinCLSRun(ProteinTaskRun):
    """``qkv train protein-cls``: one label per sequence."""

    name, level = "protein-cls", "sequence"


class ProteinResidueRun(ProteinTaskRun):
    """``qkv train protein-residue``: one label per residue."""

    name, level = "protein-residue", "residue"


def _row_labels(task: ProteinTask, records, rows, owner, width: int) -> list[list[int]]:
    """Per token row, labels aligned with its tokens: the class id at ``<cls>`` (sequence
    tasks; ignored elsewhere) or one id per residue of the row's window (residue tasks)."""
    out: list[list[int]] = []
    seen: dict[int, int] = {}  # windows of each record so far
    for row, i in zip(rows, owner, strict=True):
        ids = task.label_ids(records[i])
        if task.level == "sequence":
            out.append([ids[0]])
            continue
        k = seen.get(i, 0)
        seen[i] = k + 1
        window = ids[k * width : k * width + len(row) - 2]
        out.append([IGNORE, *window, IGNORE])
    return out


def evaluate_run(run_dir: str | Path, split: str = "test", device: torch.device | str = "cpu") -> dict:
    """Metrics of a finished ``protein-cls``/``protein-residue`` run on ``split`` (its own task
    and settings, from ``train_config.json``)."""
    run_dir = Path(run_dir)
    settings = RunInfo.read(run_dir).settings
    encoder = ProteinEncoder.from_run(run_dir, device)
    task = load_task(
        settings["task"],
        encoder.level,
        settings.get("fold", 0),
        settings.get("labels"),
        settings.get("split_seed", 0),
    )
    if split not in TASK_SPLITS:
        raise QkvError(f"split must be train, val or test (got {split!r})")
    return {"task": task.name, "split": split, **evaluate_split(encoder, task, split)}


def summary_text(summary: dict, run_dir: Path) -> str:
    """What ``qkv train protein-cls|protein-residue`` shows at the end: the test score beside
    the classical baseline's."""
    test = summary["test"]
    score = summary.get("score") or ("q3" if "q3" in test else "mcc")
    line = (
        f"{summary['task']} test ({summary['mode']}): {score.upper()} {test[score]:.3f}, accuracy "
        f"{test['accuracy']:.3f}" + (f", AUROC {test['auroc']:.3f}" if "auroc" in test else "")
    )
    base = summary.get("baseline_test")
    if base:
        base_score = base[score if score != "q3" else "accuracy"]
        line += f"; baseline ({base['baseline']}): {score.upper()} {base_score:.3f}"
    return f"{line}\n{closing_sentence(summary, run_dir, 'confusion.png', SUMMARY)}"


def _protein_recipe(name: str, train) -> Recipe:
    return Recipe(
        name=name,
        settings=ProteinTaskSettings,
        train=train,
        evaluate=evaluate_run,
        splits=TASK_SPLITS,
        summary=summary_text,
        model_type=ENCODER,
        explainer=ProteinExplainer,
        inputs="protein",
        classifier=True,
        adapters=True,
    )


# One module, two recipes: a label per sequence, or per residue.
CLS_RECIPE = _protein_recipe("protein-cls", ProteinCLSRun.train)
RESIDUE_RECIPE = _protein_recipe("protein-residue", ProteinResidueRun.train)
