"""Recipes: protein sequence classification (``qkv train protein-cls``) and per-residue
classification (``qkv train protein-residue``), from scratch, fine-tuned from a pretrained
masked-LM encoder (``init=RUN_DIR``), or as a linear probe (``freeze=true``: only the head is
trained, as lecture notes ``004_*.txt`` put it: "people use pre-trained models and train a
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

import dataclasses
import json
import math
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ..data.batching import pad_sequences, token_batches
from ..data.protein_tasks import ProteinTask, load_task
from ..data.tokenizers import AminoAcidTokenizer
from ..device import resolve_device
from ..errors import QkvError
from ..evaluate.classification import classification_metrics, per_group_binary_mcc, plot_confusion
from ..models.config import EncoderConfig
from ..models.encoder import EncoderModel
from ..train.checkpoint import load_weights, save_weights, write_json
from ..train.loop import train_loop
from ..train.optim import make_adam, warmup_cosine_lr
from .protein_mlm import ProteinEncoderSettings
from .common import build_model_config, git_commit, loop_config, prepare_run_dir, resolve_settings

IGNORE = -100
HEADS = ("sequence_head", "residue_head")


@dataclass(frozen=True)
class ProteinTaskRecipe(ProteinEncoderSettings):
    """Every setting of ``qkv train protein-cls`` / ``protein-residue`` (``key=value``).

    ``task``: ``signalp``, ``amp-scanner``, ``secondary-structure`` or a file (CSV/TSV with
    ``sequence``,``label`` columns, or FASTA + ``labels=FILE``). ``init``: a ``protein-mlm``
    run directory whose encoder starts the model (its architecture then replaces ``d_model``
    ... ``max_len``). ``freeze``: train only the head (linear probe). ``lr``: ``None`` picks
    1e-3 from scratch, 3e-4 fine-tuning, 3e-3 probing. ``fold``: SignalP test partition.
    """

    task: str = "signalp"
    labels: str | None = None
    init: str | None = None
    freeze: bool = False
    fold: int = 0
    split_seed: int = 0
    pooling: str = "cls"
    dropout: float = 0.1
    max_tokens: int = 8192
    accum_steps: int = 1
    lr: float | None = None
    min_lr_ratio: float = 0.1
    warmup_steps: int = 100
    weight_decay: float = 0.01
    clip_norm: float | None = 1.0
    max_epochs: int = 10
    max_steps: int | None = None
    max_minutes: float | None = None
    eval_every: int = 200
    snapshot_minutes: float = 1e9
    keep_snapshots: int = 1
    amp_bf16: bool = False
    seed: int = 1
    threads: int | None = None
    device: str = "auto"
    baseline: bool = True

    def validate(self) -> None:
        if self.freeze and not self.init:
            raise ValueError("freeze=true (a linear probe) needs init=RUN_DIR, a pretrained encoder")
        if self.fold not in (0, 1, 2):
            raise ValueError(f"fold ({self.fold}) must be 0, 1 or 2")
        if self.max_len < 3:
            raise ValueError(f"max_len ({self.max_len}) must leave room for <cls>, a residue and <eos>")

    @property
    def peak_lr(self) -> float:
        if self.lr is not None:
            return self.lr
        return 3e-3 if self.freeze else 3e-4 if self.init else 1e-3


def resolve_config(config_file: str | None, overrides: list[str]) -> ProteinTaskRecipe:
    """Defaults < config file (JSON) < ``key=value`` overrides; unknown keys raise QkvError."""
    return resolve_settings(ProteinTaskRecipe, config_file, overrides)


def load_encoder_init(model: EncoderModel, run_dir: str | Path) -> None:
    """Copy a pretrained encoder (every weight but the task heads) into ``model``.

    Raises:
        QkvError: no ``model.safetensors`` there, or weights that do not fit the model.
    """
    path = Path(run_dir) / "model.safetensors"
    if not path.is_file():
        raise QkvError(f"cannot start from {run_dir}: no model.safetensors (a finished "
                       "`qkv train protein-mlm` run directory is needed)")
    # Load into the pretrained shape first (tied weights resolved there), then copy the encoder.
    pretrained = EncoderModel(dataclasses.replace(model.config, num_labels=0))
    load_weights(pretrained, path)
    state = {k: v for k, v in pretrained.state_dict().items() if not k.startswith(HEADS)}
    model.load_state_dict(state, strict=False)


def model_config(recipe: ProteinTaskRecipe, num_labels: int) -> EncoderConfig:
    """The encoder's config: the pretrained run's architecture when ``init`` is set (with this
    recipe's dropout, pooling and number of labels), else the recipe's own fields."""
    tok = AminoAcidTokenizer()
    own = build_model_config(recipe, EncoderConfig, vocab_size=tok.vocab_size, pad_id=tok.pad_id,
                             num_labels=num_labels)
    if not recipe.init:
        return own
    path = Path(recipe.init) / "config.json"
    if not path.is_file():
        raise QkvError(f"init={recipe.init}: no config.json (not a qkv run directory?)")
    base = EncoderConfig.load(path)
    dropouts = ({"dropout": 0.0, "attention_dropout": 0.0, "activation_dropout": 0.0}
                if recipe.freeze else {"dropout": recipe.dropout})
    return dataclasses.replace(base, num_labels=num_labels, pooling=recipe.pooling, **dropouts)


class ProteinEncoder:
    """A trained encoder with its task: tokens in, class probabilities or embeddings out.

    ``level``: ``"sequence"`` or ``"residue"``; ``classes``: class names in id order.
    """

    def __init__(self, model: EncoderModel, classes: tuple[str, ...], level: str,
                 device: torch.device | str = "cpu", max_tokens: int = 16384) -> None:
        self.model, self.classes, self.level = model, tuple(classes), level
        self.tok, self.device, self.max_tokens = AminoAcidTokenizer(), torch.device(device), max_tokens
        self.width = model.config.max_len - 2

    @classmethod
    def from_run(cls, run_dir: str | Path, device: torch.device | str = "cpu") -> "ProteinEncoder":
        """Load a ``protein-cls`` / ``protein-residue`` / ``protein-mlm`` run directory.
        Raises :class:`QkvError` for a missing or incomplete run directory."""
        run_dir = Path(run_dir)
        if not run_dir.is_dir():
            raise QkvError(f"run directory not found: {run_dir}")
        missing = [f for f in ("config.json", "model.safetensors") if not (run_dir / f).is_file()]
        if missing:
            raise QkvError(f"run directory {run_dir} is incomplete: missing {', '.join(missing)}")
        try:
            config = EncoderConfig.load(run_dir / "config.json")
        except (ValueError, TypeError) as exc:
            raise QkvError(f"{run_dir / 'config.json'} is not a protein encoder's config: {exc}") from None
        meta_path = run_dir / "task.json"
        meta = json.loads(meta_path.read_text(encoding="utf-8")) if meta_path.is_file() else {}
        model = EncoderModel(config)
        load_weights(model, run_dir / "model.safetensors")
        return cls(model.to(device).eval(), meta.get("classes", ()), meta.get("level", "mlm"), device)

    def rows(self, sequences: list[str], ids: list[str] | None = None,
             whole_chain: bool | None = None) -> tuple[list[list[int]], list[int]]:
        """Token rows and, per row, the index of its sequence. ``whole_chain`` (default: a
        residue-level model) splits a long chain into consecutive windows covering it all;
        otherwise each sequence is one row cut to its first ``max_len - 2`` residues (warned)."""
        whole_chain = self.level == "residue" if whole_chain is None else whole_chain
        ids = ids or [f"sequence {i + 1}" for i in range(len(sequences))]
        rows, owner, cut = [], [], 0
        for i, (seq, sid) in enumerate(zip(sequences, ids)):
            res = self.tok.encode(seq, sid, add_special_tokens=False)
            if not res:
                raise QkvError(f"{sid}: empty sequence")
            if whole_chain:
                chunks = [res[s:s + self.width] for s in range(0, len(res), self.width)]
            else:
                cut += len(res) > self.width
                chunks = [res[: self.width]]
            for c in chunks:
                rows.append([self.tok.cls_id, *c, self.tok.eos_id])
                owner.append(i)
        if cut:
            warnings.warn(f"{cut} sequence(s) longer than the model's {self.width} residues were "
                          f"cut to their first {self.width} residues (N terminus kept)")
        return rows, owner

    def batches(self, rows: list[list[int]]) -> list[list[int]]:
        return token_batches([(len(r), 0) for r in rows], self.max_tokens, shuffle=False)

    def logits(self, tokens: torch.Tensor) -> torch.Tensor:
        """``(B, C)`` (sequence) or ``(B, T, C)`` (residue) float logits."""
        if self.level == "residue":
            return self.model.classify_residues(tokens.to(self.device)).logits
        return self.model.classify_sequence(tokens.to(self.device)).logits

    @torch.no_grad()
    def predict(self, sequences: list[str], ids: list[str] | None = None) -> list[np.ndarray]:
        """Class probabilities per input: ``(C,)`` for a sequence task, ``(L, C)`` (one row
        per residue, windows joined back) for a residue task. Order = input order."""
        rows, owner = self.rows(sequences, ids)
        per_row: list = [None] * len(rows)
        for idx in self.batches(rows):
            tokens = pad_sequences([rows[i] for i in idx], self.tok.pad_id)
            probs = self.logits(tokens).float().softmax(-1).cpu().numpy()
            for j, i in enumerate(idx):
                per_row[i] = probs[j] if self.level == "sequence" else probs[j, 1:len(rows[i]) - 1]
        out: list = [[] for _ in sequences]
        for i, p in zip(owner, per_row):
            out[i].append(p)
        return [parts[0] if self.level == "sequence" else np.concatenate(parts) for parts in out]

    @torch.no_grad()
    def embed(self, sequences: list[str], ids: list[str] | None = None,
              per_residue: bool = False) -> tuple[np.ndarray, list[np.ndarray]]:
        """``(N, D)`` mean of the final hidden states over each sequence's residues (specials
        and padding excluded) and, if ``per_residue``, one ``(L, D)`` array per sequence.
        Long sequences are embedded window by window."""
        rows, owner = self.rows(sequences, ids, whole_chain=True)
        per_row: list = [None] * len(rows)
        for idx in self.batches(rows):
            tokens = pad_sequences([rows[i] for i in idx], self.tok.pad_id)
            hidden, _, _ = self.model.encode(tokens.to(self.device))
            hidden = hidden.float().cpu().numpy()
            for j, i in enumerate(idx):
                per_row[i] = hidden[j, 1:len(rows[i]) - 1]
        residues: list = [[] for _ in sequences]
        for i, h in zip(owner, per_row):
            residues[i].append(h)
        residues = [np.concatenate(parts) for parts in residues]
        return np.stack([r.mean(0) for r in residues]), residues if per_residue else []


def evaluate_split(encoder: ProteinEncoder, task: ProteinTask, split: str) -> dict:
    """Metrics of ``encoder`` on one split of ``task`` (plus per-kingdom SP MCCs for SignalP,
    Q3 for residue tasks)."""
    records = task.split(split)
    probs = encoder.predict([r.sequence for r in records], [r.id for r in records])
    if task.level == "sequence":
        y_true = [task.label_ids(r)[0] for r in records]
        p = np.stack(probs)
    else:
        y = [np.array(task.label_ids(r)) for r in records]
        keep = [yy != IGNORE for yy in y]
        y_true = np.concatenate([yy[k] for yy, k in zip(y, keep)])
        p = np.concatenate([pp[k] for pp, k in zip(probs, keep)])
    metrics = classification_metrics(y_true, p.argmax(1), p, task.classes)
    if task.level == "residue":
        metrics["q3"] = metrics["accuracy"]
    if task.name == "signalp":
        metrics["per_kingdom_mcc"] = per_group_binary_mcc(
            y_true, p.argmax(1), [r.group for r in records], list(task.classes), "NO_SP")
    return metrics


def train_protein_task(recipe: ProteinTaskRecipe, run_dir: str | Path, level: str,
                       resume: bool = False, progress: bool = True, log=print) -> dict:
    """Train a sequence (``level="sequence"``) or residue classifier; evaluate on the test
    split; write the run directory. Returns the summary dict."""
    t_start = time.perf_counter()
    task = load_task(recipe.task, level, recipe.fold, recipe.labels, recipe.split_seed)
    cfg = model_config(recipe, len(task.classes))
    run_dir = prepare_run_dir(run_dir, resume)
    if recipe.threads:
        torch.set_num_threads(recipe.threads)
    tok = AminoAcidTokenizer()
    tok.save(run_dir / "tokenizer.json")
    write_json(run_dir / "config.json", cfg.to_dict())
    mode = "probe" if recipe.freeze else "fine-tune" if recipe.init else "scratch"
    write_json(run_dir / "task.json", {"task": task.name, "level": level, "classes": list(task.classes),
                                       "mode": mode, "citation": task.citation})
    write_json(run_dir / "train_config.json", {"recipe": f"protein-{'cls' if level == 'sequence' else 'residue'}",
                                               **dataclasses.asdict(recipe), "git_commit": git_commit(),
                                               "torch": torch.__version__})
    counts = {s: len(task.split(s)) for s in ("train", "val", "test")}
    log(f"{task.name}: {counts['train']:,} train / {counts['val']:,} val / {counts['test']:,} test "
        f"records, classes {', '.join(task.classes)}; {mode}. {task.citation}")
    device = resolve_device(recipe.device)
    torch.manual_seed(recipe.seed)
    model = EncoderModel(cfg)
    if recipe.init:
        load_encoder_init(model, recipe.init)
    model.to(device)
    head = model.sequence_head if level == "sequence" else model.residue_head
    if recipe.freeze:
        for p in model.parameters():
            p.requires_grad_(False)
        for p in head.parameters():
            p.requires_grad_(True)
    encoder = ProteinEncoder(model, task.classes, level, device)
    train = task.split("train")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # over-long training sequences: warned at prediction
        rows, owner = encoder.rows([r.sequence for r in train], [r.id for r in train])
    labels = _row_labels(task, train, rows, owner, encoder.width)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = make_adam([{"params": [p for p in trainable if p.dim() >= 2], "weight_decay": recipe.weight_decay},
                           {"params": [p for p in trainable if p.dim() < 2], "weight_decay": 0.0}],
                          betas=(0.9, 0.98), eps=1e-8)
    lengths = [(len(r), 0) for r in rows]
    per_epoch = len(token_batches(lengths, recipe.max_tokens))
    total = recipe.max_steps or per_epoch * recipe.max_epochs // recipe.accum_steps
    peak = recipe.peak_lr

    def batches(epoch: int):
        return token_batches(lengths, recipe.max_tokens, shuffle=True,
                             seed=recipe.seed * 1000 + epoch)

    def loss_fn(model, idx):
        tokens = pad_sequences([rows[i] for i in idx], tok.pad_id).to(device)
        target = pad_sequences([labels[i] for i in idx], IGNORE).to(device)
        # A probe needs no special path: with the encoder's weights frozen autograd records
        # nothing through it, and model_config sets its dropouts to 0.
        logits = encoder.logits(tokens)
        if level == "sequence":
            target = target[:, 0]
        loss = F.cross_entropy(logits.flatten(0, -2).float(), target.flatten(), ignore_index=IGNORE,
                               reduction="sum")
        return loss, int((target != IGNORE).sum())

    score_key = "val_mcc" if level == "sequence" else "val_q3"

    def validate(model) -> dict:
        m = evaluate_split(encoder, task, "val")
        return {score_key: m["mcc"] if level == "sequence" else m["q3"], "val_accuracy": m["accuracy"]}

    loop = dataclasses.replace(loop_config(recipe, progress), max_steps=total)
    state = train_loop(model, optimizer,
                       lambda step: warmup_cosine_lr(step, peak, peak * recipe.min_lr_ratio,
                                                     recipe.warmup_steps, total),
                       batches, loss_fn, validate, run_dir, loop, score_key=score_key,
                       higher_is_better=True, resume=resume)
    best = run_dir / "best.safetensors"
    load_weights(model, best if best.is_file() else run_dir / "last.safetensors")
    save_weights(model, run_dir / "model.safetensors")
    model.eval()
    summary = {"task": task.name, "mode": mode, "init": recipe.init,
               "validation": evaluate_split(encoder, task, "val"),
               "test": evaluate_split(encoder, task, "test")}
    plot_confusion(summary["test"]["confusion"], task.classes, run_dir / "confusion.png",
                   f"{task.name} test ({mode})")
    if recipe.baseline:
        from ..evaluate.baselines import baseline_metrics

        summary["baseline_test"] = baseline_metrics(task, "test")
    summary.update({"train_minutes": round(state.elapsed_s / 60, 2), "steps": state.step,
                    "epochs": state.epoch, "parameters": model.num_parameters(),
                    "trainable_parameters": sum(p.numel() for p in trainable),
                    "total_minutes": round((time.perf_counter() - t_start) / 60, 2)})
    write_json(run_dir / "summary.json", summary)
    return summary


def _row_labels(task: ProteinTask, records, rows, owner, width: int) -> list[list[int]]:
    """Per token row, labels aligned with its tokens: the class id at ``<cls>`` (sequence
    tasks; ignored elsewhere) or one id per residue of the row's window (residue tasks)."""
    out, seen = [], {}
    for row, i in zip(rows, owner):
        ids = task.label_ids(records[i])
        if task.level == "sequence":
            out.append([ids[0]])
            continue
        k = seen.get(i, 0)
        seen[i] = k + 1
        window = ids[k * width: k * width + len(row) - 2]
        out.append([IGNORE, *window, IGNORE])
    return out


def train_protein_cls(recipe, run_dir, resume=False, progress=True, log=print) -> dict:
    """``qkv train protein-cls``: one label per sequence."""
    return train_protein_task(recipe, run_dir, "sequence", resume, progress, log)


def train_protein_residue(recipe, run_dir, resume=False, progress=True, log=print) -> dict:
    """``qkv train protein-residue``: one label per residue."""
    return train_protein_task(recipe, run_dir, "residue", resume, progress, log)


def evaluate_protein_run(run_dir: str | Path, split: str = "test", device="cpu") -> dict:
    """Metrics of a finished ``protein-cls``/``protein-residue`` run on ``split`` (its own task
    and settings, from ``train_config.json``)."""
    run_dir = Path(run_dir)
    settings = json.loads((run_dir / "train_config.json").read_text(encoding="utf-8"))
    encoder = ProteinEncoder.from_run(run_dir, device)
    task = load_task(settings["task"], encoder.level, settings.get("fold", 0), settings.get("labels"),
                     settings.get("split_seed", 0))
    if split not in ("train", "val", "test"):
        raise QkvError(f"split must be train, val or test (got {split!r})")
    return {"task": task.name, "split": split, **evaluate_split(encoder, task, split)}
