"""fair-esm checkpoints (Lin et al. 2023, ESM-2; the ``esm`` package's ``ESM2`` module and its
torch-hub ``.pt`` files) → qkv.

A fair-esm state dict is renamed to the HF ``EsmForMaskedLM`` names (as transformers'
``convert_esm`` script does) and converted by :func:`qkv.hub.convert.convert_state`, so the ESM
family's own key map (:data:`qkv.hub.families.ESM`) does the rest: one layer mapping, not two.
The contact head's logistic regression (Rao et al. 2021) lands in ``Converted.kept`` as
``esm.contact_head.regression.weight`` / ``.bias``.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from ..data.tokenizers import HFTokenizer
from ..errors import QkvError
from ..files import read_settings_checkpoint
from .convert import Converted, convert_state
from .hub_names import ESM2_NAMES
from .keymap import fairseq_layer_names, rename_fairseq

# fair-esm's ``Alphabet.from_architecture("ESM-1b")``, which every ESM-2 model uses: id = index.
ESM_ALPHABET = (
    "<cls>", "<pad>", "<eos>", "<unk>",
    "L", "A", "G", "V", "S", "E", "R", "T", "I", "D", "P", "K", "Q", "N", "F", "Y", "M", "H", "W", "C",
    "X", "B", "U", "Z", "O", ".", "-", "<null_1>", "<mask>",
)  # fmt: skip
PAD_ID, MASK_ID = ESM_ALPHABET.index("<pad>"), ESM_ALPHABET.index("<mask>")

# The width of fair-esm's models by the size in their names (Rives et al. 2021, Table 1; Meier et
# al. 2021; Rao et al. 2021; Lin et al. 2023, Table S1); the number of layers is the name's
# ``t<layers>``: esm2_t6_8M (320), esm2_t12_35M (480), esm2_t30_150M (640), esm2_t33_650M and
# esm1b/esm1v_t33_650M (1280), esm2_t36_3B (2560), esm2_t48_15B (5120), esm1_t34_670M (1280),
# esm1_t12_85M and esm1_t6_43M (768), esm_msa1(b)_t12_100M (768)
ESM_WIDTHS = {
    "8M": 320, "35M": 480, "150M": 640, "650M": 1280, "3B": 2560, "15B": 5120,
    "670M": 1280, "85M": 768, "43M": 768, "100M": 768,
}  # fmt: skip
_ESM_SIZES = re.compile(r"esm\w*?_t(\d+)_(\d+[MB])_")

# fair-esm name (regular expression, matched at the start) → HF name; the rest of the name
# (``weight``/``bias``) is kept
_LAYER = r"esm.encoder.layer.\1."
FAIR_TO_HF = (
    (r"embed_tokens\.", "esm.embeddings.word_embeddings."),
    *fairseq_layer_names(_LAYER, "attention.LayerNorm.", "LayerNorm."),
    (r"layers\.(\d+)\.self_attn\.rot_emb\.", _LAYER + "attention.self.rotary_embeddings."),
    (r"emb_layer_norm_after\.", "esm.encoder.emb_layer_norm_after."),
    (r"lm_head\.dense\.", "lm_head.dense."),
    (r"lm_head\.layer_norm\.", "lm_head.layer_norm."),
    (r"lm_head\.weight$", "lm_head.decoder.weight"),
    (r"lm_head\.bias$", "lm_head.bias"),
    (r"contact_head\.regression\.", "esm.contact_head.regression."),
)
# what fairseq checkpoints put before the module names (fair-esm's upgrade_state_dict strips it)
_FAIRSEQ_PREFIX = re.compile(r"^(encoder\.sentence_encoder\.|encoder\.)")


def esm_tokenizer() -> HFTokenizer:
    """ESM-2's residue tokenizer: ``<cls> residues <eos>``, one token per letter."""
    return HFTokenizer.from_tokens(list(ESM_ALPHABET))


def hf_config(num_layers: int, embed_dim: int, attention_heads: int, token_dropout: bool = True) -> dict:
    """The HF ``EsmConfig`` of a fair-esm ESM-2 (as ``convert_esm`` writes it): pre-LN, rotary,
    FFN width ``4 * embed_dim``, 1,026 positions (1,024 tokens: the 1,022 residues ESM-2 was
    trained on, ``<cls>`` and ``<eos>``), no dropout."""
    return {
        "architectures": ["EsmForMaskedLM"],
        "model_type": "esm",
        "vocab_size": len(ESM_ALPHABET),
        "hidden_size": embed_dim,
        "num_attention_heads": attention_heads,
        "intermediate_size": 4 * embed_dim,
        "num_hidden_layers": num_layers,
        "max_position_embeddings": 1026,
        "hidden_act": "gelu",
        "layer_norm_eps": 1e-5,
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
        "pad_token_id": PAD_ID,
        "mask_token_id": MASK_ID,
        "token_dropout": token_dropout,
        "emb_layer_norm_before": False,
        "position_embedding_type": "rotary",
    }


def to_hf_names(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A fair-esm ESM-2 state dict (with or without fairseq's ``encoder.`` prefix) in HF names.

    Raises:
        QkvError: names fair-esm's ESM-2 does not have (listed), or an output projection
            ``lm_head.weight`` that is not the token embedding (ESM-2 ties them).
    """
    out = rename_fairseq(state_dict, FAIR_TO_HF, _FAIRSEQ_PREFIX, "fair-esm ESM-2")
    tied, embed = out.get("lm_head.decoder.weight"), out.get("esm.embeddings.word_embeddings.weight")
    if tied is not None and embed is not None and not torch.equal(tied, embed):
        raise QkvError("fair-esm lm_head.weight differs from embed_tokens.weight; ESM-2 ties them")
    return out


def from_fair_esm(
    state_dict: dict[str, torch.Tensor],
    num_layers: int,
    embed_dim: int,
    attention_heads: int,
    token_dropout: bool = True,
) -> Converted:
    """A fair-esm ``ESM2(num_layers, embed_dim, attention_heads, token_dropout=...)`` state dict
    → a qkv :class:`~qkv.models.encoder.EncoderModel` with its MLM head (eval mode, float32),
    the ESM tokenizer, and the contact regression in ``kept`` (when the state dict has it).

    Raises:
        QkvError: unknown tensor names, or tensors missing or mis-shaped for the given sizes
            (named by :func:`~qkv.hub.convert.convert_state`).
    """
    config = hf_config(num_layers, embed_dim, attention_heads, token_dropout)
    return convert_state(config, to_hf_names(state_dict), esm_tokenizer(), where="fair-esm ESM2")


def _field(cfg: object, name: str):
    return cfg[name] if isinstance(cfg, dict) else getattr(cfg, name)


def load_fair_esm(path: str | Path) -> Converted:
    """A fair-esm ESM-2 ``.pt`` checkpoint (torch hub's ``esm2_t6_8M_UR50D.pt``: ``{"model":
    state dict, "cfg": {"model": settings}}``) converted by :func:`from_fair_esm`; a
    ``<name>-contact-regression.pt`` beside it adds the contact head, as fair-esm does. Read with
    ``torch.load(weights_only=True)`` (``argparse.Namespace`` allowed, the settings' type).

    Raises:
        QkvError: a missing or refused file, or one that is not a fair-esm ESM-2 checkpoint
            (whatever reading it or its settings raised: "PATH is not a fair-esm checkpoint qkv
            can read (...)"), or a file named as an ESM model whose sizes are another's
            (:func:`check_named_sizes`).
    """
    path = Path(path)
    data = read_settings_checkpoint(path, "fair-esm")
    try:
        cfg = _field(data["cfg"], "model") if "cfg" in data else data["args"]
        sizes = {
            k: int(_field(cfg, k)) for k in ("encoder_layers", "encoder_embed_dim", "encoder_attention_heads")
        }
        token_dropout = bool(_field(cfg, "token_dropout")) if _has(cfg, "token_dropout") else True
        state = dict(data["model"])
    except Exception as exc:  # noqa: BLE001 - any object a crafted pickle left there: not a checkpoint
        raise _unreadable(path, exc) from None
    check_named_sizes(path, state)
    state.update(_regression_state(path))
    return from_fair_esm(
        state,
        sizes["encoder_layers"],
        sizes["encoder_embed_dim"],
        sizes["encoder_attention_heads"],
        token_dropout,
    )


def named_sizes(name: str) -> tuple[int, int] | None:
    """``(layers, width)`` that a fair-esm model name states (``esm2_t33_650M_UR50D``: 33
    layers, width 1280; :data:`ESM_WIDTHS`), or ``None`` for a name that is not one (whatever
    follows the size, ``_UR50D``, ``_1``, a suffix of one's own, is not read)."""
    found = _ESM_SIZES.match(name)
    if found is None or found[2] not in ESM_WIDTHS:
        return None
    return int(found[1]), ESM_WIDTHS[found[2]]


def check_named_sizes(path: Path, state: dict[str, torch.Tensor]) -> None:
    """Refuse a fair-esm checkpoint whose file is named as an ESM model (:func:`named_sizes` of
    its stem) but whose tensors are of another size: the layers counted in ``state``'s
    ``layers.<i>.`` names, the width of its ``embed_tokens.weight``. A file named otherwise is
    not checked.

    Raises:
        QkvError: the name's layers and width, and the checkpoint's, in one line.
    """
    named = named_sizes(path.stem)
    if named is None:
        return
    layers = {int(m[1]) for k in state if (m := re.search(r"(?:^|\.)layers\.(\d+)\.", k))}
    embed = [
        t
        for k, t in state.items()
        if k.endswith("embed_tokens.weight") and isinstance(t, torch.Tensor) and t.dim() == 2
    ]
    held = (len(layers), int(embed[0].shape[1]) if embed else None)
    if held[0] != named[0] or (held[1] is not None and held[1] != named[1]):
        raise QkvError(
            f"{path}: the name {path.stem} says {named[0]} layers of width {named[1]}, but the "
            f"checkpoint holds {held[0]} layers of width {held[1]}; a file named as an ESM model must "
            "be that model (rename it)"
        )


def _unreadable(path: Path, exc: Exception) -> QkvError:
    what = {KeyError: "no {}", AttributeError: "{}"}.get(type(exc), f"{type(exc).__name__}: {{}}")
    text = " ".join(str(exc).split())[:200]
    return QkvError(f"{path} is not a fair-esm checkpoint qkv can read ({what.format(text)})")


def _has(cfg: object, name: str) -> bool:
    return name in cfg if isinstance(cfg, dict) else hasattr(cfg, name)


def _regression_state(path: Path) -> dict[str, torch.Tensor]:
    """The contact regression's tensors in fair-esm names (``contact_head.regression.*``) from
    ``<name>-contact-regression.pt`` beside ``path``, or ``{}`` when there is none."""
    regression = path.with_name(f"{path.stem}-contact-regression.pt")
    if not regression.is_file():
        return {}
    data = read_settings_checkpoint(regression, "fair-esm")
    try:
        return dict(data.get("model", {}))
    except Exception as exc:  # noqa: BLE001 - as load_fair_esm's settings
        raise _unreadable(regression, exc) from None


def contact_regression(path: str | Path) -> dict[str, torch.Tensor]:
    """The contact head (Rao et al. 2021) of fair-esm checkpoint ``path`` in HF names
    (``esm.contact_head.regression.weight`` ``(1, layers · heads)``, ``.bias`` ``(1,)``), read
    from ``<name>-contact-regression.pt`` beside it without loading the model; ``{}`` when there
    is none.

    Raises:
        QkvError: a refused or unreadable regression file, or tensors that are not the head's.
    """
    return to_hf_names(_regression_state(Path(path)))


def is_checkpoint_file(name_or_path: str | Path) -> bool:
    """Whether ``name_or_path`` names a fair-esm checkpoint file: a ``.pt`` path (torch hub's
    form; whether it exists is :func:`load_fair_esm`'s to say)."""
    return Path(name_or_path).suffix == ".pt" and not Path(name_or_path).is_dir()


def is_esm_name(text: str | Path) -> bool:
    """Whether ``text`` is written as fair-esm names its models (``esm2_t33_650M_UR50D``,
    ``esm1b_t33_650M_UR50S``, ...): ``esm`` then letters, digits and ``_``, and no path that
    exists here (a path wins)."""
    return re.fullmatch(r"esm[0-9a-z]*_\w+", str(text)) is not None and not Path(text).exists()


def hub_cache_file(name: str) -> Path:
    """Where torch hub keeps fair-esm model ``name`` (``esm.pretrained`` downloads there):
    ``$TORCH_HOME/hub/checkpoints/<name>.pt``, by default under ``~/.cache/torch``."""
    return Path(torch.hub.get_dir()) / "checkpoints" / f"{name}.pt"


def resolve_esm_name(name: str) -> str:
    """An ESM-2 model as fair-esm names it → what qkv reads: torch hub's cached ``.pt``
    (:func:`hub_cache_file`, the contact regression beside it) when it is there, else the HF Hub
    name ``facebook/<name>`` (downloaded or found in the HF cache by
    :mod:`qkv.hub.hub_names`).

    Raises:
        QkvError: a name that is not one of :data:`ESM2_NAMES` (ESM-1, ESM-1b, ESM-1v, the MSA
            Transformer and ESM-IF are other architectures).
    """
    if name not in ESM2_NAMES:
        raise QkvError(
            f"unknown ESM model {name!r}: qkv reads ESM-2 ({', '.join(ESM2_NAMES)}), a fair-esm "
            ".pt file or an HF folder"
        )
    cached = hub_cache_file(name)
    return str(cached) if cached.is_file() else f"facebook/{name}"
