"""What several recipes share that is not the run's flow (:mod:`qkv.train.run`) or its directory
(:mod:`qkv.runs`): a check of counts in the settings, and the pretrained encoder with a new
classification head that the protein and text classification recipes fine-tune."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from .. import _moved
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


# the names that moved to qkv.runs.record and qkv.train.run (issue 58): see qkv._moved
__getattr__ = _moved.names_of(__name__)
