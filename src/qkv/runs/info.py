"""Reading a run directory: what kind of run it is (:class:`RunInfo`: recipe, architecture,
settings) and any JSON file it holds (:func:`run_json`), for runs of every version.

Every reader of ``train_config.json``, ``task.json``, ``pairs.json`` or ``summary.json`` goes
through this module, so a change of layout has one place to go; runs of earlier versions are
read as they were written (:mod:`qkv.compat` maps their names).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import compat
from ..errors import QkvError
from ..files import read_json
from ..models.config import ModelConfig
from ..models.model_types import MODEL_TYPES, ModelType, for_config
from .layout import CONFIG, TRAIN_CONFIG

_REQUIRED = object()


def run_json(run_dir: str | Path, name: str, missing: Any = _REQUIRED) -> Any:
    """The JSON object ``run_dir / name`` of a run (``task.json``, ``summary.json``, ...).

    Args:
        missing: what to return when the file is not there (e.g. ``{}`` for a run without a
            task); without it a missing file is an error.

    Raises:
        QkvError: the file is missing (and ``missing`` not given), unreadable, not JSON or not
            a JSON object; one line naming it.
    """
    path = Path(run_dir) / name
    if not path.is_file() and missing is not _REQUIRED:
        return missing
    return read_json(path)


def resumed_json(run_dir: Path, name: str) -> dict:
    """The JSON object ``run_dir / name`` (``train_config.json``, ``config.json``) of a run to
    resume: :func:`run_json` with the refusal worded for ``--resume``.

    Raises:
        QkvError: it is missing, unreadable or not an object (``cannot resume RUN: ...``).
    """
    path = Path(run_dir) / name
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise QkvError(
            f"cannot resume {run_dir}: {name} is missing or unreadable "
            f"({getattr(exc, 'strerror', None) or exc})"
        ) from None
    if not isinstance(saved, dict):
        raise QkvError(f"cannot resume {run_dir}: {name} is not a JSON object")
    return saved


@dataclass(frozen=True)
class RunInfo:
    """What a run directory says about itself, read once (:meth:`read`).

    Attributes:
        run_dir: the directory.
        recipe: the recipe that trained it (``"translation"``, ``"lm"``, ``"vit"``, ...).
        settings: its ``train_config.json`` (the recipe, the settings as resolved, provenance);
            ``{}`` for a run of the first versions, which wrote none.
    """

    run_dir: Path
    recipe: str
    settings: dict[str, Any]

    @classmethod
    def read(cls, run_dir: str | Path) -> RunInfo:
        """Read ``train_config.json``; a run of the first versions, which wrote none, is a
        language model or a translation, told by its ``config.json``'s keys.

        Raises:
            QkvError: neither file can be read, or ``train_config.json`` names no recipe.
        """
        run_dir = Path(run_dir)
        meta = run_dir / TRAIN_CONFIG
        try:
            if not meta.is_file():
                config = json.loads((run_dir / CONFIG).read_text(encoding="utf-8"))
                return cls(run_dir, "lm" if "vocab_size" in config else "translation", {})
            saved = json.loads(meta.read_text(encoding="utf-8"))
        except (OSError, ValueError, TypeError) as exc:
            raise QkvError(f"cannot tell what kind of run {run_dir} is: {exc}") from None
        if not isinstance(saved, dict) or not isinstance(saved.get("recipe"), str):
            raise QkvError(f"cannot tell what kind of run {run_dir} is: {meta} names no recipe")
        return cls(run_dir, saved["recipe"], saved)

    @property
    def model_type(self) -> ModelType:
        """The architecture the run holds: ``"model_type"`` in its settings (runs of earlier
        versions: inferred from the recipe, :func:`qkv.compat.model_type_name`).

        Raises:
            QkvError: an architecture this version of qkv does not know.
        """
        name = self.settings.get("model_type") or compat.model_type_name(self.recipe)
        if name not in MODEL_TYPES:
            raise QkvError(f"{self.run_dir} holds a {name!r} model, which this version of qkv does not know")
        return MODEL_TYPES[name]

    def get(self, key: str, default: Any = None) -> Any:
        """The saved setting ``key`` (a top-level key of ``train_config.json``), or ``default``."""
        return self.settings.get(key, default)


def run_settings(run_dir: str | Path) -> dict[str, Any]:
    """A run's ``train_config.json`` as a dict; ``{}`` for a run without one.

    Raises:
        QkvError: the file is there but unreadable or not an object.
    """
    return run_json(run_dir, TRAIN_CONFIG, missing={})


def run_recipe(run_dir: str | Path) -> str:
    """The recipe that produced a run (:attr:`RunInfo.recipe`).

    Raises:
        QkvError: the directory says nothing readable about its kind.
    """
    return RunInfo.read(run_dir).recipe


def model_type_of(run_dir: str | Path) -> ModelType:
    """The architecture a run holds (:attr:`RunInfo.model_type`).

    Raises:
        QkvError: an unreadable run, or one of an architecture this version does not know.
    """
    return RunInfo.read(run_dir).model_type


def run_header(recipe: str, config: ModelConfig) -> dict[str, Any]:
    """What ``train_config.json`` starts with, naming the kind of run: ``recipe``, the
    ``model_type`` of ``config`` (:mod:`qkv.models.model_types`) and the ``format_version``
    (:data:`qkv.compat.FORMAT_VERSION`); :class:`RunInfo` reads it back."""
    return {"recipe": recipe, "model_type": for_config(config).name, "format_version": compat.FORMAT_VERSION}
