"""What every recipe shares: settings resolution, run directory checks, provenance."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

from ..errors import QkvError


def resolve_settings(recipe_cls, config_file: str | None, overrides: list[str]):
    """Build a recipe dataclass from defaults < config file (JSON) < ``key=value`` overrides.

    Values are parsed as JSON (``lr=3e-4``, ``bias=true``), else kept as bare strings
    (``corpus=my.txt``). Calls the recipe's ``validate()`` if it has one.

    Raises:
        QkvError: unreadable config file, malformed override, unknown key (naming the known
            ones), or an invalid value.
    """
    fields = {f.name for f in dataclasses.fields(recipe_cls)}
    values: dict = {}
    if config_file:
        try:
            values.update(json.loads(Path(config_file).read_text(encoding="utf-8")))
        except (OSError, ValueError) as exc:
            raise QkvError(f"cannot read config file {config_file}: {exc}") from None
    for item in overrides:
        if "=" not in item:
            raise QkvError(f"override {item!r} is not of the form key=value")
        key, raw = item.split("=", 1)
        try:
            values[key] = json.loads(raw)
        except ValueError:
            values[key] = raw
    unknown = sorted(set(values) - fields)
    if unknown:
        raise QkvError(f"unknown config key(s): {', '.join(unknown)}; known: {', '.join(sorted(fields))}")
    try:
        recipe = recipe_cls(**values)
        if hasattr(recipe, "validate"):
            recipe.validate()
    except (TypeError, ValueError) as exc:
        raise QkvError(f"invalid configuration: {exc}") from None
    return recipe


def build_model_config(recipe, config_cls, **explicit):
    """``config_cls`` from every field the recipe shares with it by name (``d_model``,
    ``dropout``, ...), with ``explicit`` values (vocabulary size, special ids) taking
    precedence, so a recipe never lists its model fields twice."""
    shared = {f.name for f in dataclasses.fields(config_cls)} & {f.name for f in dataclasses.fields(recipe)}
    return config_cls(**{**{name: getattr(recipe, name) for name in shared}, **explicit})


def prepare_run_dir(run_dir: str | Path, resume: bool) -> Path:
    """Create ``run_dir``; refuse a non-empty one unless resuming (nothing saved is overwritten)."""
    run_dir = Path(run_dir)
    if run_dir.exists() and any(run_dir.iterdir()) and not resume:
        raise QkvError(f"run directory {run_dir} is not empty; use --resume to continue it or "
                       "choose another --out")
    if resume and not (run_dir / "train_state.pt").is_file():
        raise QkvError(f"nothing to resume in {run_dir}: no train_state.pt")
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


def git_commit() -> str | None:
    """The qkv source's git commit (provenance in ``train_config.json``), if known."""
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent, timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def loop_config(recipe, progress: bool = True):
    """The :class:`~qkv.train.loop.LoopConfig` of a recipe: every loop field the recipe has
    (budgets, accumulation, clipping, evaluation and snapshot cadence, seed, bf16)."""
    from ..train.loop import LoopConfig

    names = {f.name for f in dataclasses.fields(LoopConfig)} - {"progress"}
    return LoopConfig(**{n: getattr(recipe, n) for n in names if hasattr(recipe, n)},
                      progress=progress)
