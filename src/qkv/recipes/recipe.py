"""The recipe interface: one object per kind of run, carrying everything the rest of the
program needs to know about it.

A recipe module (``qkv.recipes.translation``, ``qkv.recipes.lm``, ...) defines its
``*Settings`` class, its run (a :class:`~qkv.train.run.TrainingRun` subclass: the
parts of a run that are its own), its ``evaluate_run`` and its summary text, and exports one
:class:`Recipe` that names them; :mod:`qkv.recipes.registry` collects those objects from real
imports. The command line and :mod:`qkv.recipes.loading` (a run's explainer) ask the registry,
so adding a model family means writing its model module and its recipe module and adding one
line to the registry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from ..explain.explainer import Explainer
    from ..models.model_types import ModelType

# What a run reads: sentences or documents, amino-acid sequences (FASTA), or images.
Inputs = Literal["text", "protein", "image"]


@dataclass(frozen=True)
class Recipe:
    """One kind of qkv run: how to train it, score it, load it and look inside it.

    Attributes:
        name: the name on the command line and in ``train_config.json`` (``"translation"``).
        settings: the frozen settings dataclass ``qkv train NAME`` resolves (``--config``,
            ``key=value``); ``None`` for a kind of run that is converted, not trained.
        train: ``(settings, run_dir, resume=False, progress=True, cpu=None) → summary dict`` (the run
            class's :meth:`~qkv.train.run.TrainingRun.train`); writes the run directory
            and ``summary.json``.
        evaluate: the module's ``evaluate_run(run_dir, split, device, *, options) → metrics
            dict`` on a data split of the run's own task; ``options`` (keyword-only) are those
            named in ``evaluate_options``.
        splits: the split names ``evaluate`` accepts, the default first.
        evaluate_options: keyword options of ``evaluate`` beyond the split and device
            (translation: ``beam_size``, ``alpha``, ``limit``); the CLI refuses others.
        summary: ``(summary dict, run directory) → text``: what ``qkv train`` shows at the end.
        model_type: the architecture its runs hold (config class, module class, tokenizer or
            not): what :func:`qkv.runs.load_run` builds.
        explainer: ``(run_dir, device=..., max_chars=...) → Explainer`` (an explainer class,
            or a function that picks one).
        inputs: what the model reads: ``"text"``, ``"protein"`` or ``"image"``.
        classifier: whether ``qkv classify`` takes this run (a task head over classes).
        adapters: whether it starts from a pretrained ``init`` and so takes LoRA adapters
            (``train.lora_rank``); the CLI refuses them for the others.
    """

    name: str
    settings: type | None
    train: Callable[..., dict] | None
    evaluate: Callable[..., dict] | None
    splits: tuple[str, ...]
    summary: Callable[[dict, Path], str] | None
    model_type: ModelType
    explainer: Callable[..., Explainer]
    inputs: Inputs
    evaluate_options: tuple[str, ...] = ()
    classifier: bool = False
    adapters: bool = False
