"""Loading a model back from a run directory of any family (:func:`load_run`), through the
architecture the run names (:attr:`qkv.runs.info.RunInfo.model_type`), without its recipe."""

from __future__ import annotations

from pathlib import Path

import torch

from ..data.tokenizers import load_tokenizer
from ..errors import QkvError
from ..files import load_weights
from .info import RunInfo
from .layout import CONFIG, TOKENIZER, TRAIN_CONFIG, WEIGHTS


def load_run(
    run_dir: str | Path,
    weights: str = WEIGHTS,
    device: torch.device | str = "cpu",
    family: str | tuple[str, ...] | None = None,
):
    """Model (eval mode, on ``device``) and tokenizer of a run directory of any family
    (translation, lm, protein-mlm/-cls/-residue, vit; a ViT has no tokenizer: ``None``).

    Args:
        family: the recipe(s) expected (``"translation"``, ``"lm"``, or a tuple such as
            ``("protein-mlm", "protein-cls")``); ``None`` accepts any.

    Raises:
        QkvError: directory or one of ``config.json``, the weights, ``tokenizer.json`` missing,
            unreadable or inconsistent (a half-written run directory), or a run of another kind.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise QkvError(f"run directory not found: {run_dir}")
    # A run of the first versions has no train_config.json: a translation or LM run, with a
    # tokenizer. Its kind is read from config.json, once the files are known to be there.
    info = RunInfo.read(run_dir) if (run_dir / TRAIN_CONFIG).is_file() else None
    with_tokenizer = info is None or info.model_type.tokenizer
    needed = (CONFIG, weights) + ((TOKENIZER,) if with_tokenizer else ())
    missing = [f for f in needed if not (run_dir / f).is_file()]
    if missing:
        raise QkvError(
            f"run directory {run_dir} is incomplete: missing {', '.join(missing)} "
            "(training not finished? `qkv train ... --resume` continues it)"
        )
    info = info or RunInfo.read(run_dir)
    if family is not None and info.recipe not in ((family,) if isinstance(family, str) else family):
        wanted = " or ".join((family,) if isinstance(family, str) else family)
        raise QkvError(f"{run_dir} is a {info.recipe!r} run; this needs a {wanted} run")
    model_type = info.model_type
    config = model_type.config.load(run_dir / CONFIG)  # a bad file: ConfigError naming it
    model = model_type.model(config)
    load_weights(model, run_dir / weights)
    model.to(device).eval()
    return model, load_tokenizer(run_dir / TOKENIZER) if model_type.tokenizer else None
