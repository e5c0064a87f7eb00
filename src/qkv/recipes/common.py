"""What several recipes share that is not the run's flow (:mod:`qkv.train.run`) or its directory
(:mod:`qkv.runs`): a check of counts in the settings, the pretrained encoder with a new
classification head that the protein and text classification recipes fine-tune, and the end of
the summary ``qkv train`` shows (:func:`closing_sentence`)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ConfigError
from ..train.adapters import LoraSettings, add_lora

if TYPE_CHECKING:
    from ..models.encoder import EncoderModel


def require_at_least_one(settings: object, *names: str) -> None:
    """Raise :class:`~qkv.errors.ConfigError` naming every field of ``settings`` among ``names``
    that is set (not ``None``) and below 1: counts and sizes that mean nothing at 0 (a
    ``max_tokens=0`` would make batches of nothing)."""
    bad = [
        f"{n} ({getattr(settings, n)}) must be >= 1"
        for n in names
        if getattr(settings, n) is not None and getattr(settings, n) < 1
    ]
    if bad:
        raise ConfigError("; ".join(bad))


TASK_HEADS = ("sequence_head", "residue_head")
# the settings that shape LoRA adapters' weights (in a recipe's FIXED_ON_RESUME)
LORA_KEYS = ("train.lora_rank", "train.lora_alpha", "train.lora_modules")
# The splits of a classification task (proteins, text, images), as Recipe.splits lists them:
# test first, the split qkv evaluate scores by default.
TASK_SPLITS = ("test", "val", "train")


def encoder_with_head(
    pretrained,
    num_labels: int,
    pooling: str,
    dropout: float,
    head: str,
    mode: str,
    lora: LoraSettings | None = None,
) -> EncoderModel:
    """A new :class:`~qkv.models.encoder.EncoderModel` of ``pretrained``'s architecture for a
    classification recipe: a ``num_labels``-way head, ``pooling``, ``dropout``, and
    ``pretrained``'s weights but for its task heads. ``head``: the task's head
    (``"sequence_head"``/``"residue_head"``). ``mode``: ``"fine-tune"`` (every weight trains),
    ``"probe"`` (a linear probe: only ``head`` trains, every dropout 0), ``"lora"`` (``lora``'s
    adapters on the frozen encoder and ``head`` train, :func:`qkv.train.adapters.add_lora`) or
    ``"scratch"`` (random weights)."""
    from ..models.encoder import EncoderModel

    dropouts = (
        dict(dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)
        if mode == "probe"
        else dict(dropout=dropout)
    )
    model = EncoderModel(replace(pretrained.config, num_labels=num_labels, pooling=pooling, **dropouts))
    if mode != "scratch":
        model.load_state_dict(
            {k: v for k, v in pretrained.state_dict().items() if not k.startswith(TASK_HEADS)}, strict=False
        )
    if mode == "probe":
        for name, p in model.named_parameters():
            p.requires_grad_(name.startswith(head + "."))
    if mode == "lora":
        assert lora is not None
        add_lora(model, lora, trainable=(head + ".",))
    return model


def trained_for(summary: dict, of_training: bool = False) -> str:
    """How long a run trained, from its summary (``train_minutes``, ``steps``):
    ``"12.3 min and 400 steps"``, or ``"12.3 min of training, 400 steps"`` with
    ``of_training`` (where the total time follows)."""
    minutes, steps = f"{summary['train_minutes']:.1f} min", summary["steps"]
    return f"{minutes} of training, {steps} steps" if of_training else f"{minutes} and {steps} steps"


def run_directory(run_dir: str | Path, *files: str) -> str:
    """``"run directory: /absolute/path"`` of a summary, followed by the ``files`` worth
    opening there in parentheses (``"(summary.json, confusion.png)"``)."""
    shown = f" ({', '.join(files)})" if files else ""
    return f"run directory: {Path(run_dir).resolve()}{shown}"


def closing_sentence(summary: dict, run_dir: str | Path, *files: str) -> str:
    """The sentence a recipe's summary ends with: ``"after 12.3 min and 400 steps; run
    directory: /absolute/path"`` (:func:`trained_for`, :func:`run_directory`)."""
    return f"after {trained_for(summary)}; {run_directory(run_dir, *files)}"
