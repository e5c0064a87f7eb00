"""HF folders ⇄ qkv run directories.

An HF folder is what ``save_pretrained`` writes: ``config.json``, ``model.safetensors`` (or a
``pytorch_model.bin``, read with ``torch.load(weights_only=True)``: never unpickled as code) and
a tokenizer (``tokenizer.json``, or a BERT-style ``vocab.txt``). :func:`import_hf` turns one
into a qkv run directory (``config.json``, ``model.safetensors``, ``tokenizer.json``,
``train_config.json`` naming the recipe, and ``hf.json``: where it came from and what to write
back); :func:`export_hf` writes a run directory back as an HF folder that ``transformers``
loads, with a model card (``README.md``, :mod:`qkv.hub.model_card`). :func:`read_hf` builds
the qkv model in memory without writing anything.
"""

from __future__ import annotations

import logging
import pickle
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from .. import runs
from ..data.tokenizers import AminoAcidTokenizer, CharTokenizer, HFTokenizer, load_tokenizer
from ..errors import QkvError
from ..files import atomic_write, read_json, refuse_nonempty, save_weights, torch_load_refusal, write_json
from ..models.config import ModelConfig
from ..models.model_types import DECODER_LM, ENCODER, built_as, for_config
from ..runs.layout import CONFIG, TOKENIZER, TRAIN_CONFIG, WEIGHTS
from . import keymap
from .families import HF_WRITES, Family, family_for, family_of

logger = logging.getLogger(__name__)


def layer_counts(config: ModelConfig) -> dict[str, int]:
    """How many layers each stack of a model has (what ``Rule.stack`` names)."""
    return {
        "layers": getattr(config, "n_layers", 0),
        "encoder": getattr(config, "n_encoder_layers", 0),
        "decoder": getattr(config, "n_decoder_layers", 0),
    }


# what an HF folder's tokenizer.json reads as: a tokenizers file, or qkv's own vocabularies
FolderTokenizer = HFTokenizer | CharTokenizer | AminoAcidTokenizer
HF_EXTRA = "hf_extra.safetensors"  # HF heads qkv does not model, written back on export
TASK_HEADS = ("sequence_head.", "residue_head.")  # qkv's classification heads: no HF counterpart


@dataclass
class Converted:
    """A converted checkpoint in memory: the qkv ``model`` (eval mode, float32), its
    ``tokenizer`` (an :class:`~qkv.data.tokenizers.HFTokenizer`, or qkv's own character or
    amino-acid tokenizer for a folder qkv exported; ``None`` for a ViT), the :class:`Family`, the
    ``parts`` of the HF architecture it had, the original ``hf_config`` and ``kept`` HF tensors
    qkv does not model."""

    model: torch.nn.Module
    tokenizer: FolderTokenizer | None
    family: Family
    parts: set[str]
    hf_config: dict
    kept: dict[str, torch.Tensor]

    @property
    def config(self) -> ModelConfig:
        """The model's config: every qkv model keeps it as ``.config`` (torch types module
        attributes as ``Tensor | Module``, hence the cast)."""
        return cast(ModelConfig, self.model.config)


def read_state_dict(folder: Path) -> dict[str, torch.Tensor]:
    """The tensors of an HF folder: ``model.safetensors``, else ``pytorch_model.bin`` loaded
    with ``weights_only=True`` (a pickle that holds anything but tensors is refused).

    Raises:
        QkvError: neither file, an unreadable file, or a pickle that is not a plain state dict.
    """
    st, pt = folder / WEIGHTS, folder / "pytorch_model.bin"
    if st.is_file():
        try:
            return load_file(st)
        except (SafetensorError, OSError) as exc:
            raise QkvError(f"cannot read {st}: {exc}") from None
    if not pt.is_file():
        raise QkvError(f"{folder} has no model.safetensors or pytorch_model.bin")
    try:
        state = torch.load(pt, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError) as exc:
        raise QkvError(f"refused {pt}: it {torch_load_refusal(exc)}") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise QkvError(f"refused {pt}: not a plain state dict of tensors")
    return state


def read_tokenizer(folder: Path, tokenizer: str | Path | None = None) -> FolderTokenizer:
    """The folder's tokenizer: ``tokenizer`` if given (a ``tokenizer.json`` or ``vocab.txt``),
    else ``tokenizer.json``, else ``vocab.txt`` (WordPiece, lower-cased when
    ``tokenizer_config.json`` says ``do_lower_case``). A ``tokenizer.json`` in qkv's own format
    (a character or amino-acid vocabulary: what :func:`export_hf` writes for such a run) reads
    as that tokenizer, any other as a ``tokenizers`` file. Raises :class:`QkvError` when there
    is none."""
    path = Path(tokenizer) if tokenizer is not None else None
    if path is None:
        path = next((folder / n for n in (TOKENIZER, "vocab.txt") if (folder / n).is_file()), None)
    if path is None:
        raise QkvError(f"{folder} has no tokenizer (tokenizer.json or vocab.txt); give one with --tokenizer")
    if not path.is_file():
        raise QkvError(f"tokenizer file not found: {path}")
    if path.suffix == ".json":
        own = load_tokenizer(path)
        return own if isinstance(own, (CharTokenizer, AminoAcidTokenizer)) else HFTokenizer.load(path)
    settings = folder / "tokenizer_config.json"
    lowercase = bool(read_json(settings).get("do_lower_case", False)) if settings.is_file() else False
    return HFTokenizer.from_vocab(path, lowercase=lowercase)


def _pooling(folder: Path) -> str | None:
    """``"mean"`` or ``"cls"`` from a sentence-transformers ``1_Pooling/config.json``."""
    path = folder / "1_Pooling" / CONFIG
    if not path.is_file():
        return None
    cfg = read_json(path)
    return (
        "mean"
        if cfg.get("pooling_mode_mean_tokens")
        else "cls"
        if cfg.get("pooling_mode_cls_token")
        else None
    )


def read_hf(
    folder: str | Path, tokenizer: str | Path | None = None, settings: dict | None = None
) -> Converted:
    """Convert an HF folder into a qkv model in memory (nothing is written). ``settings``:
    qkv model-config fields to set that the HF config does not say (a pretrained entry's).

    Raises:
        QkvError: folder or ``config.json`` missing, an unsupported architecture (named, with
            the supported ones), a missing/unexpected/mis-shaped tensor (named, with both
            shapes), a refused pickle, or no tokenizer.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise QkvError(f"HF folder not found: {folder}")
    if not (folder / CONFIG).is_file():
        raise QkvError(f"{folder} has no config.json (not an HF model folder)")
    hf_config = read_json(folder / CONFIG)
    family = family_of(hf_config)
    tok = read_tokenizer(folder, tokenizer) if family.tokenizer else None
    pooling = _pooling(folder)
    extra = {**({"pooling": pooling} if pooling else {}), **(settings or {})}
    return convert_state(hf_config, read_state_dict(folder), tok, extra, where=folder / CONFIG)


def convert_state(
    hf_config: dict,
    state: dict[str, torch.Tensor],
    tokenizer: FolderTokenizer | None,
    settings: dict | None = None,
    where: str | Path = CONFIG,
) -> Converted:
    """The in-memory core of :func:`read_hf`: an HF ``config.json`` (as a dict) and state dict
    (HF tensor names) → a qkv model, for checkpoints that reach qkv by another road than an HF
    folder (fair-esm, fairseq). ``settings``: qkv model-config fields to set (``pooling`` only
    for encoders); ``where`` names the config in error messages.

    Raises:
        QkvError: an unsupported architecture, a config that does not read as its family, or a
            missing/unexpected/mis-shaped tensor.
    """
    family = family_of(hf_config)
    if family.prefix and not any(k.startswith(family.prefix) for k in state):
        state = {family.prefix + k: v for k, v in state.items()}  # a bare base model
    parts = keymap.parts_present(family.rules, set(state)) | {"base"}
    try:
        config = family.from_hf(hf_config, parts)
    except (KeyError, TypeError, ValueError) as exc:
        raise QkvError(f"{where}: cannot read it as {family.name}: {exc}") from None
    extra = dict(settings or {})
    if "pooling" in extra and for_config(config) is not ENCODER:
        del extra["pooling"]
    if extra:
        config = type(config).from_dict({**config.to_dict(), **extra})
    rules = keymap.expand(family.rules, layer_counts(config), parts)
    qkv_state, kept = keymap.to_qkv(state, rules, family.skip, family.keep)
    model = for_config(config).model(config)
    # qkv's own task heads, and the heads of parts this checkpoint lacks, keep their initialisation
    absent = {
        r.qkv
        for r in keymap.expand(family.rules, layer_counts(config), {r.part for r in family.rules} - parts)
    }
    keymap.load_into(model, qkv_state, TASK_HEADS + tuple(absent), {r.qkv for r in rules if r.reshape})
    return Converted(model.eval(), tokenizer, family, parts, hf_config, kept)


def import_hf(
    folder: str | Path, run_dir: str | Path, tokenizer: str | Path | None = None, settings: dict | None = None
) -> Converted:
    """Convert an HF folder into a qkv run directory (see the module docstring). Everything is
    read and checked before anything is written; an existing non-empty ``run_dir`` is refused.

    Raises:
        QkvError: see :func:`read_hf`; or ``run_dir`` exists and is not empty.
    """
    refuse_nonempty(run_dir)
    conv = read_hf(folder, tokenizer, settings)
    write_run(conv, run_dir, str(Path(folder).resolve()))
    return conv


def write_run(conv: Converted, run_dir: str | Path, source: str) -> None:
    """Write a converted checkpoint as a qkv run directory; ``source`` (a folder, or a name)
    is recorded as where it came from.

    Raises:
        QkvError: ``run_dir`` exists and is not empty.
    """
    refuse_nonempty(run_dir)
    run_dir = Path(run_dir)
    conv.config.save(run_dir / CONFIG)
    if conv.tokenizer is not None:
        conv.tokenizer.save(run_dir / TOKENIZER)
    if conv.kept:
        atomic_write(
            run_dir / HF_EXTRA, lambda tmp: save_file({k: v.contiguous() for k, v in conv.kept.items()}, tmp)
        )
    write_json(
        run_dir / "hf.json",
        {
            "family": conv.family.name,
            "parts": sorted(conv.parts),
            "source": source,
            "hf_config": conv.hf_config,
        },
    )
    write_json(
        run_dir / TRAIN_CONFIG,
        {**runs.run_header(conv.family.recipe, conv.config), "converted_from": source},
    )
    save_weights(conv.model, run_dir / WEIGHTS)  # last: its presence marks a complete run
    logger.debug(
        f"converted {conv.family.name} ({', '.join(sorted(conv.parts))}) from {source} into {run_dir}"
    )


def export_hf(run_dir: str | Path, out_dir: str | Path, repo_id: str | None = None) -> Path:
    """Write a qkv run directory (converted or trained by qkv) as an HF folder:
    ``config.json`` (the original HF config updated with the model's settings),
    ``model.safetensors`` in HF names, the tokenizer, and a model card ``README.md``
    (:func:`qkv.hub.model_card.hf_card`; ``repo_id``: the Hub repository its snippets name). A
    run trained by qkv exports as GPT-2 (decoder-only LM), Marian (encoder-decoder), ViT, ESM
    (rotary encoder) or BERT (other encoders) when its settings fit. The card is made and
    checked before anything is written.

    Raises:
        QkvError: an incomplete run, a model the family cannot express (the fields named),
            or an ``out_dir`` that exists and is not empty.
    """
    from .model_card import hf_card, write_card

    run_dir, out_dir = Path(run_dir), Path(out_dir)
    refuse_nonempty(out_dir, "folder")
    model, _ = runs.load_run(run_dir)
    hf_config, tensors = hf_state(model, run_dir)
    parameters = model.num_parameters()
    architecture = hf_config["architectures"][0]
    config = cast(ModelConfig, model.config)
    card = hf_card(run_dir, out_dir, architecture, family_of(hf_config).name, config, parameters, repo_id)
    write_card(card, out_dir)
    write_hf(run_dir, out_dir, hf_config, tensors)
    logger.debug(f"exported {run_dir} as {hf_config['architectures'][0]} into {out_dir}")
    return out_dir


def hf_state(
    model: torch.nn.Module, run_dir: Path, leave_out: frozenset[str] = frozenset()
) -> tuple[dict, dict[str, torch.Tensor]]:
    """What :func:`export_hf` writes for ``model`` (a model of the run ``run_dir``, whose
    ``hf.json`` and kept HF tensors it reads), in memory: ``(HF config dict, HF tensors)``.
    ``leave_out``: head parts not to write (``{"mlm"}``: the bare encoder).

    Raises:
        QkvError: a model the family cannot express (the fields named).
    """
    if not any(built_as(model, kind) for kind in HF_WRITES):
        raise QkvError(
            f"{run_dir} holds a {type(model).__name__}; qkv exports encoders, decoder-only "
            "LMs, encoder-decoders and ViTs to HF"
        )
    config = cast(ModelConfig, model.config)  # each family of HF_WRITES has a ModelConfig
    meta = read_json(run_dir / "hf.json") if (run_dir / "hf.json").is_file() else {}
    family = family_for(config)
    if meta.get("family", family.name) != family.name:
        raise QkvError(f"{run_dir}/hf.json names family {meta['family']!r}, but the model is {family.name}")
    # the parts the model has (a pooler, a logits bias only with their config options); of those,
    # the ones the original checkpoint had (a run qkv trained: all); a tied output projection
    # is the embedding matrix and is not written
    state = model.state_dict()
    counts = layer_counts(config)
    has = {
        part
        for part in {r.part for r in family.rules}
        if all(r.qkv in state for r in keymap.expand(family.rules, counts, {part}))
    }
    parts = (has & set(meta["parts"]) if "parts" in meta else has) - leave_out
    if built_as(model, DECODER_LM) and model.config.tie_embeddings:
        parts.discard("lm_head")
    hf_config = {**meta.get("hf_config", {}), **family.to_hf(config)}
    hf_config["architectures"] = [family.architecture(parts)]
    rules = keymap.expand(family.rules, counts, parts)
    tensors = keymap.to_hf(state, rules, family.hf_shapes(config))
    if (run_dir / HF_EXTRA).is_file():
        tensors.update(load_file(run_dir / HF_EXTRA))
    if hf_config["architectures"][0] == family.base_model:  # a bare base model: no prefix
        tensors = {k.removeprefix(family.prefix): v for k, v in tensors.items()}
    return hf_config, tensors


def write_hf(run_dir: Path, out_dir: Path, hf_config: dict, tensors: dict[str, torch.Tensor]) -> None:
    """Write an HF folder from :func:`hf_state`'s output: ``config.json``, the run's
    ``tokenizer.json`` (a family that reads text) and ``model.safetensors`` (last)."""
    write_json(out_dir / CONFIG, hf_config)
    if family_of(hf_config).tokenizer:
        shutil.copyfile(run_dir / TOKENIZER, out_dir / TOKENIZER)
    atomic_write(out_dir / WEIGHTS, lambda tmp: save_file(tensors, tmp, metadata={"format": "pt"}))
