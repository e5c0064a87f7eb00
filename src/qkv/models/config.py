"""Frozen, validated configurations of the model families.

One base, :class:`ModelConfig` (a :class:`~qkv.nn.layers.LayerConfig` plus positions and the
context length: what every stack shares), and one config per family that adds only its own
fields: :class:`TransformerConfig` (encoder-decoder, Vaswani et al. 2017), and, over the
single-stack :class:`StackConfig`, :class:`LMConfig` (decoder-only, GPT) and
:class:`EncoderConfig` (bidirectional, BERT/ESM). Saved as ``config.json`` beside the weights.

Vocabulary sizes and special ids are ``None`` in a recipe's settings: the recipe fills them in
from its tokenizer before it builds the model.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar

from ..compat import check_format_version, dropped_keys, with_format_version
from ..errors import ConfigError
from ..files import write_json
from ..nn.feedforward import Activation
from ..nn.layers import LayerConfig
from ..settings import check, dropped_value_matches, show_key

_Config = TypeVar("_Config", bound="SavedConfig")


def _json_kind(value: Any) -> str:
    """What a JSON value is, in JSON's words (``an array``, ``a string``)."""
    kinds = {
        bool: "true or false",
        type(None): "null",
        list: "an array",
        str: "a string",
        int: "a number",
        float: "a number",
        dict: "an object",
    }
    return kinds.get(type(value), type(value).__name__)


class SavedConfig:
    """What every model config shares, whatever its fields: validation on construction and the
    ``config.json`` round trip. Subclasses are frozen dataclasses.

    Construction validates every field and raises :class:`~qkv.errors.ConfigError` (a
    ``ValueError``) naming every bad value (:meth:`problems` lists them; a float that float32,
    the parameters' type, cannot hold is one: :func:`qkv.settings.float32_problems`);
    ``to_dict``/``from_dict``/``save``/``load`` are the ``config.json`` round trip; what older
    qkv versions wrote is read through :mod:`qkv.compat` (its format version, and keys a
    family has since dropped).
    """

    def __post_init__(self) -> None:
        check(self, float32=True)  # the numbers become float32 parameters and arithmetic

    def problems(self) -> list[str]:
        """Every out-of-range or inconsistent value, as messages that name the field (empty:
        valid). Types are checked before, against the annotations."""
        return []

    def _vocab_problems(self, sizes: tuple[str, ...], ids: tuple[str, ...]) -> list[str]:
        """Vocabulary sizes >= 1 and special ids inside every vocabulary (unset ones skipped)."""
        out = [
            f"{n} ({getattr(self, n)}) must be >= 1"
            for n in sizes
            if getattr(self, n) is not None and getattr(self, n) < 1
        ]
        known = [getattr(self, n) for n in sizes if getattr(self, n) is not None]
        for name in ids:
            value = getattr(self, name)
            if value is not None and (value < 0 or (known and value >= min(known))):
                out.append(f"{name} ({value}) is outside the vocabulary")
        return out

    def require(self, *names: str) -> None:
        """Raise :class:`~qkv.errors.ConfigError` if a field the model needs is still unset
        (``None``)."""
        unset = [n for n in names if getattr(self, n) is None]
        if unset:
            raise ConfigError(
                f"{type(self).__name__}: {', '.join(unset)} not set (the recipe sets "
                "vocabulary sizes from its tokenizer)"
            )

    def to_dict(self) -> dict:
        """The fields as a JSON-ready dict (no format version: see :meth:`save`)."""
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    def save(self, path: str | Path) -> None:
        """Write ``config.json`` atomically: :meth:`to_dict` with ``"format_version"`` first
        (:data:`qkv.compat.FORMAT_VERSION`)."""
        write_json(Path(path), with_format_version(self.to_dict()))

    @classmethod
    def from_dict(cls: type[_Config], data: dict) -> _Config:
        """Build from a dict (``config.json``). A ``"format_version"`` (absent: version 1) is
        checked and removed; keys an older qkv wrote that this family dropped
        (:func:`qkv.compat.dropped_keys`) are ignored when they hold the value the model
        always used.

        Raises:
            ConfigError: ``data`` is not a dict, was written by a newer qkv (a higher
                format version), holds unknown keys (named, and a dropped key of another value
                said to be one), or a bad value (named).
        """
        if not isinstance(data, dict):
            raise ConfigError(f"{cls.__name__} needs a JSON object of settings, got {_json_kind(data)}")
        data = check_format_version(data, f"this {cls.__name__}")
        dropped = dropped_keys(cls)
        known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]  # subclasses are dataclasses
        data = {
            k: v
            for k, v in data.items()
            if not (k in dropped and k not in known and dropped_value_matches(v, dropped[k]))
        }
        unknown = sorted(set(data) - known, key=str)
        if unknown:
            named = [
                f"{k} (dropped: only {json.dumps(dropped[k])}, the value the model always used, is read)"
                if k in dropped
                else show_key(k)
                for k in unknown
            ]
            raise ConfigError(f"unknown {cls.__name__} keys: {', '.join(named)}")
        return cls(**data)

    @classmethod
    def load(cls: type[_Config], path: str | Path) -> _Config:
        """Read a ``config.json``.

        Raises:
            ConfigError: one line naming the file: not UTF-8 JSON, not a JSON object, written
                by a newer qkv, or what :meth:`from_dict` refuses.
            OSError: the file cannot be read.
        """
        path = Path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
            raise ConfigError(f"{path} is not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path} must hold a JSON object, got {_json_kind(data)}")
        data = check_format_version(data, str(path))  # the message names the file once
        try:
            return cls.from_dict(data)
        except ConfigError as exc:
            raise ConfigError(f"{path}: {exc}") from None


@dataclass(frozen=True, kw_only=True)
class ModelConfig(LayerConfig, SavedConfig):
    """What every Transformer family shares: the layer settings, the kind of positions (§3.5)
    and ``max_len``, the longest sequence (positions ``0 .. max_len - 1``). Validated on
    construction and saved as :class:`SavedConfig` says.
    """

    # Every kind of position a family may take; each family narrows it to its own (the
    # encoder-decoder adds "sinusoidal_halves", the single stacks "rotary"). ModelConfig itself
    # is a base only: no model is built from it.
    positional: Literal["sinusoidal", "sinusoidal_halves", "learned", "rotary", "none"] = "sinusoidal"
    max_len: int = 1024

    def problems(self) -> list[str]:
        """Every out-of-range or inconsistent value, as messages that name the field (empty:
        valid). Types are checked before, against the annotations."""
        out = []
        for name in ("d_model", "n_heads", "d_ff", "max_len"):
            if getattr(self, name) < 1:
                out.append(f"{name} ({getattr(self, name)}) must be >= 1")
        if self.n_heads >= 1 and self.d_model % self.n_heads:
            out.append(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        if self.positional.startswith("sinusoidal") and self.d_model % 2:
            out.append(f"d_model ({self.d_model}) must be even for sinusoidal positions")
        if self.positional == "rotary" and self.n_heads >= 1 and self.d_k % 2:
            out.append(f"d_k ({self.d_k}) must be even for rotary positions")
        for name in ("dropout", "attention_dropout", "activation_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                out.append(f"{name} ({getattr(self, name)}) must be in [0, 1)")
        if not self.layer_norm_eps > 0:  # NaN too
            out.append(f"layer_norm_eps ({self.layer_norm_eps}) must be > 0")
        if not self.dyt_alpha > 0:
            out.append(f"dyt_alpha ({self.dyt_alpha}) must be > 0")
        return out


def _seq2seq_vocab_problems(config: TransformerConfig | RNNConfig) -> list[str]:
    """An encoder-decoder's vocabularies (``src_vocab_size``, ``tgt_vocab_size`` and the special
    ids, as :meth:`SavedConfig._vocab_problems` checks them), and ``share_embeddings`` refused
    across two vocabularies of different sizes."""
    out = config._vocab_problems(("src_vocab_size", "tgt_vocab_size"), ("pad_id", "bos_id", "eos_id"))
    src, tgt = config.src_vocab_size, config.tgt_vocab_size
    if config.share_embeddings and None not in (src, tgt) and src != tgt:
        out.append(
            f"share_embeddings needs one joint vocabulary, but src_vocab_size ({src}) "
            f"!= tgt_vocab_size ({tgt})"
        )
    return out


@dataclass(frozen=True, kw_only=True)
class TransformerConfig(ModelConfig):
    """Hyper-parameters of :class:`qkv.models.transformer.Transformer` (encoder-decoder, §3).

    Defaults are the paper's base model (Table 3): 6 + 6 layers, post-LN, sinusoidal positions,
    ReLU. ``share_embeddings`` ties source embeddings, target embeddings and the output
    projection (one joint vocabulary, §3.4); ``tie_output`` ties only the target embeddings and
    the output projection. ``pad_id``/``bos_id``/``eos_id`` are the special ids (``bos_id``
    starts every target; Marian starts from ``pad_id``). ``scale_embeddings``: multiply
    embeddings by sqrt(d_model) (§3.4). ``output_bias``: a bias on the output projection
    (Marian's ``final_logits_bias``). ``positional``: also ``"sinusoidal_halves"``, §3.5's
    values with sines before cosines (Tensor2Tensor, Marian), ``"rotary"``: queries and keys of
    every self-attention rotated by their positions (RoFormer, Su et al. 2021; none added to
    the embeddings, none in cross-attention), and ``"none"``: no positions at
    all, so the encoder is permutation-equivariant (the lecture's "a single block of weights?",
    which loses order).

    Raises:
        ConfigError: (a ``ValueError``) on construction, naming every bad value.
    """

    src_vocab_size: int | None = None
    tgt_vocab_size: int | None = None
    n_encoder_layers: int = 6
    n_decoder_layers: int = 6
    positional: Literal["sinusoidal", "sinusoidal_halves", "learned", "rotary", "none"] = "sinusoidal"
    scale_embeddings: bool = True
    output_bias: bool = False
    tie_output: bool = True
    share_embeddings: bool = False
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2

    def problems(self) -> list[str]:
        out = super().problems() + _seq2seq_vocab_problems(self)
        for name in ("n_encoder_layers", "n_decoder_layers"):
            if getattr(self, name) < 0:
                out.append(f"{name} ({getattr(self, name)}) must be >= 0")
        return out


@dataclass(frozen=True, kw_only=True)
class StackConfig(ModelConfig):
    """One stack of self-attention layers over one vocabulary (decoder-only or encoder):
    ``vocab_size``, ``n_layers`` and ``scale_embeddings`` (multiply embeddings by
    sqrt(d_model), §3.4; GPT-2 and BERT do not). Defaults follow those models: pre-LN, GELU,
    4 heads, no dropout. ``type_vocab_size`` > 0 adds BERT's token-type (segment) embeddings;
    ``embed_norm`` normalises the summed embeddings before the first layer (BERT)."""

    n_heads: int = 4
    dropout: float = 0.0
    activation: Activation = "gelu"
    norm_first: bool = True
    positional: Literal["sinusoidal", "learned", "rotary"] = "sinusoidal"
    vocab_size: int | None = None
    n_layers: int = 4
    scale_embeddings: bool = False
    type_vocab_size: int = 0
    embed_norm: bool = False

    def problems(self) -> list[str]:
        out = super().problems() + self._vocab_problems(("vocab_size",), self._special_ids)
        if self.n_layers < 1:
            out.append(f"n_layers ({self.n_layers}) must be >= 1")
        if self.type_vocab_size < 0:
            out.append(f"type_vocab_size ({self.type_vocab_size}) must be >= 0")
        return out

    _special_ids: ClassVar[tuple[str, ...]] = ()


@dataclass(frozen=True, kw_only=True)
class LMConfig(StackConfig):
    """Hyper-parameters of :class:`qkv.models.decoder_lm.DecoderLM` (GPT-style, decoder-only).

    Defaults are nanoGPT's CPU "baby GPT" for tiny-shakespeare (4 layers, 4 heads, d_model 128,
    context 64): pre-LN, GELU, learned positions, no biases, tied embeddings.
    ``max_len`` is the context length (nanoGPT's ``block_size``). ``bos_id`` is the token an
    empty prompt starts from (``None``: empty prompts are refused).

    Raises:
        ConfigError: (a ``ValueError``) on construction, naming every bad value.
    """

    d_model: int = 128
    d_ff: int = 512
    positional: Literal["sinusoidal", "learned", "rotary"] = "learned"
    max_len: int = 64
    bias: bool = False
    tie_embeddings: bool = True
    bos_id: int | None = None
    eos_id: int | None = None

    _special_ids: ClassVar[tuple[str, ...]] = ("bos_id", "eos_id")


@dataclass(frozen=True, kw_only=True)
class DiffusionLMConfig(LMConfig):
    """Hyper-parameters of :class:`qkv.models.diffusion_lm.DiffusionLM` (a masked diffusion
    language model: LLaDA, Nie et al. 2025; MDLM, Sahoo et al. 2024): :class:`LMConfig`'s
    fields, rotary positions by default (the issue's "rotary or sinusoidal": no learned table,
    so a window shorter than ``max_len`` is read as at training), and ``mask_id``, the token
    that stands for a masked position (the last id of the vocabulary: the recipe adds it to the
    tokenizer's).
    """

    positional: Literal["sinusoidal", "learned", "rotary"] = "rotary"
    mask_id: int | None = None

    _special_ids: ClassVar[tuple[str, ...]] = ("bos_id", "eos_id", "mask_id")

    def problems(self) -> list[str]:
        out = super().problems()
        if self.mask_id is None and self.vocab_size is not None:
            out.append("mask_id must be set (the [MASK] token's id)")
        return out


@dataclass(frozen=True, kw_only=True)
class EncoderConfig(StackConfig):
    """Hyper-parameters of :class:`qkv.models.encoder.EncoderModel` (BERT/ESM-style,
    bidirectional). Defaults are qkv's protein encoder (3.2 M parameters): 4 pre-LN layers of
    width 256, GELU, rotary positions, 256 tokens. ``pad_id``: keys never attended;
    ``num_labels`` and ``pooling`` (``"cls"`` or ``"mean"``) for the classification heads;
    ``pooler``: BERT's dense + tanh on the ``<cls>`` state before the sequence head.
    ``token_dropout``: ESM-2's rescaling of the embeddings by the share of ``mask_id`` tokens
    (:func:`~qkv.nn.embeddings.esm_token_dropout`). The masked-LM head is always tied to the
    embeddings; ``head_activation`` is the activation of its transform (dense, activation,
    LayerNorm): BERT's head applies the FFN's ``hidden_act`` (Devlin et al. 2019; HF
    ``BertPredictionHeadTransform``), ESM's always the exact GELU (HF ``EsmLMHead``). Its
    default, ``"gelu"``, is what every qkv encoder used before the field existed, so older
    ``config.json`` files read as they were written.
    """

    d_model: int = 256
    d_ff: int = 1024
    positional: Literal["sinusoidal", "learned", "rotary"] = "rotary"
    max_len: int = 256
    pad_id: int = 1
    num_labels: int = 0
    pooling: Literal["cls", "mean"] = "cls"
    pooler: bool = False
    token_dropout: bool = False
    mask_id: int | None = None
    head_activation: Activation = "gelu"

    _special_ids: ClassVar[tuple[str, ...]] = ("pad_id", "mask_id")

    def problems(self) -> list[str]:
        out = super().problems()
        if self.num_labels < 0:
            out.append(f"num_labels ({self.num_labels}) must be >= 0")
        if self.token_dropout and self.mask_id is None:
            out.append("token_dropout needs mask_id")
        return out


class PatchGrid:
    """What a config of square images cut into square patches derives (the ViT and the
    captioner): ``grid_size`` and ``n_patches``, and the checks of ``image_size``,
    ``patch_size`` and 2-D sinusoidal positions. Its subclasses declare the fields."""

    image_size: int
    patch_size: int
    d_model: int

    @property
    def grid_size(self) -> int:
        """Patches per side, ``image_size / patch_size``."""
        return self.image_size // self.patch_size

    @property
    def n_patches(self) -> int:
        """Patch tokens per image, ``grid_size²`` (no class token counted)."""
        return self.grid_size**2

    @property
    def least_image_side(self) -> int:
        """The fewest pixels a side of an input image may have (``least`` of
        :func:`qkv.data.images.read_image`): 1, any image is resized to ``image_size``."""
        return 1

    def _grid_problems(self, sinusoidal: bool) -> list[str]:
        out = [
            f"{n} ({getattr(self, n)}) must be >= 1"
            for n in ("image_size", "patch_size")
            if getattr(self, n) < 1
        ]
        if not out and self.image_size % self.patch_size:
            out.append(f"image_size ({self.image_size}) must be a multiple of patch_size ({self.patch_size})")
        if sinusoidal and self.d_model % 4:
            out.append(f"d_model ({self.d_model}) must be divisible by 4 for 2-D sinusoidal positions")
        return out


@dataclass(frozen=True, kw_only=True)
class ViTConfig(PatchGrid, ModelConfig):
    """Hyper-parameters of :class:`qkv.models.vit.VisionTransformer` (Dosovitskiy et al. 2021).

    The image (``channels × image_size × image_size``) is cut into ``patch_size`` squares:
    ``n_patches = (image_size / patch_size)²`` tokens, plus the class token. Defaults are a
    small pre-LN ViT for 28 × 28 grey images (Fashion-MNIST): 7 × 7 patches (16 tokens + 1),
    d_model 128, 4 heads, d_ff 256, 6 layers, GELU, 0.8 M parameters. ``positional``: ``"learned"`` (ViT's) or
    ``"sinusoidal"`` (fixed 2-D sin-cos, :func:`~qkv.nn.patches.sinusoidal_2d_positions`).
    ``pooling``: the class token's final state (``"cls"``) or the mean of the patch states
    (``"mean"``) feeds the classification head (``num_labels`` classes). ``max_len`` caps the
    token count (patches + 1) as in the other families.

    Raises:
        ConfigError: (a ``ValueError``) on construction, naming every bad value.
    """

    d_model: int = 128
    n_heads: int = 4
    d_ff: int = 256
    dropout: float = 0.0
    activation: Activation = "gelu"
    norm_first: bool = True
    positional: Literal["sinusoidal", "learned"] = "learned"
    n_layers: int = 6
    image_size: int = 28
    patch_size: int = 7
    channels: int = 1
    num_labels: int = 10
    pooling: Literal["cls", "mean"] = "cls"

    def problems(self) -> list[str]:
        out = super().problems()
        for name in ("n_layers", "channels", "num_labels"):
            if getattr(self, name) < 1:
                out.append(f"{name} ({getattr(self, name)}) must be >= 1")
        grid = self._grid_problems(self.positional == "sinusoidal")
        if not grid and self.n_patches + 1 > self.max_len:
            out.append(f"{self.n_patches} patches + the class token exceed max_len ({self.max_len})")
        return out + grid


@dataclass(frozen=True, kw_only=True)
class CaptionConfig(PatchGrid, ModelConfig):
    """Hyper-parameters of :class:`qkv.models.caption.CaptionModel` (image → caption).

    The image side is the ViT's (Dosovitskiy et al. 2021, §3.1) without its class token and
    head: ``channels × image_size × image_size`` pixels cut into ``patch_size`` squares,
    ``image_positional`` positions (``"learned"``, or ``"sinusoidal"``: fixed 2-D sin-cos), then
    ``n_encoder_layers``. The text side is the paper's decoder (Vaswani et al. 2017, §3.1):
    ``n_decoder_layers`` with masked self-attention and cross-attention over the patch states,
    ``positional`` positions over at most ``max_len`` caption tokens, the output projection
    tied to the token embeddings (§3.4). ``memory``: ``"patches"`` (the decoder attends over
    every patch, as Show, Attend and Tell, Xu et al. 2015) or ``"pooled"`` (the no-attention
    baseline of Show and Tell, Vinyals et al. 2015: the decoder sees one vector, the mean of
    the patch states). Defaults: pre-LN, GELU, d_model 128, 4 heads, d_ff 256 (the ViT's),
    4 + 2 layers, 56 × 56 grey images in 14 × 14 patches (16 patches, four per garment of a
    scene: at equal time they beat 7 × 7 patches on validation, 0.34 vs 0.17 exact match).

    Raises:
        ConfigError: (a ``ValueError``) on construction, naming every bad value.
    """

    d_model: int = 128
    n_heads: int = 4
    d_ff: int = 256
    dropout: float = 0.0
    activation: Activation = "gelu"
    norm_first: bool = True
    positional: Literal["sinusoidal", "learned"] = "sinusoidal"
    max_len: int = 48
    vocab_size: int | None = None
    n_encoder_layers: int = 4
    n_decoder_layers: int = 2
    image_size: int = 56
    patch_size: int = 14
    channels: int = 1
    image_positional: Literal["sinusoidal", "learned"] = "learned"
    memory: Literal["patches", "pooled"] = "patches"
    scale_embeddings: bool = True
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2

    @property
    def least_image_side(self) -> int:
        """A captioner's patches per row: scaled up from fewer pixels, its patches would hold
        interpolation rather than the image."""
        return self.grid_size

    def problems(self) -> list[str]:
        out = super().problems() + self._vocab_problems(("vocab_size",), ("pad_id", "bos_id", "eos_id"))
        for name in ("n_decoder_layers", "channels"):
            if getattr(self, name) < 1:
                out.append(f"{name} ({getattr(self, name)}) must be >= 1")
        if self.n_encoder_layers < 0:
            out.append(f"n_encoder_layers ({self.n_encoder_layers}) must be >= 0")
        return out + self._grid_problems(self.image_positional == "sinusoidal")


@dataclass(frozen=True, kw_only=True)
class RNNConfig(SavedConfig):
    """Hyper-parameters of :class:`qkv.models.rnn.RNNSeq2Seq`, the recurrent encoder-decoder
    the Transformer replaced, kept as the baseline the lecture argues against.

    A bidirectional encoder (``cell``: ``"gru"``, Cho et al. 2014, or ``"lstm"``, Hochreiter &
    Schmidhuber 1997) of ``n_encoder_layers`` and a unidirectional decoder of
    ``n_decoder_layers``, all ``d_model`` wide (the embeddings too; the encoder's states are
    ``2 · d_model``: both directions). ``attention``: ``"additive"`` (Bahdanau et al. 2015: the
    decoder attends over every source state at every step) or ``"none"`` (the bottleneck of
    Cho et al. 2014 / Sutskever et al. 2014: it sees only the encoder's final states).
    ``dropout`` on the embeddings, between stacked layers and before the output layer.
    ``max_len``: the longest source and translation (as the Transformer's, for decoding).
    Vocabulary, sharing and special ids as :class:`TransformerConfig`.

    Raises:
        ConfigError: (a ``ValueError``) on construction, naming every bad value.
    """

    src_vocab_size: int | None = None
    tgt_vocab_size: int | None = None
    d_model: int = 256
    cell: Literal["gru", "lstm"] = "gru"
    n_encoder_layers: int = 1
    n_decoder_layers: int = 1
    attention: Literal["additive", "none"] = "additive"
    dropout: float = 0.2
    max_len: int = 256
    tie_output: bool = True
    share_embeddings: bool = False
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2

    def problems(self) -> list[str]:
        out = _seq2seq_vocab_problems(self)
        for name in ("d_model", "n_encoder_layers", "n_decoder_layers", "max_len"):
            if getattr(self, name) < 1:
                out.append(f"{name} ({getattr(self, name)}) must be >= 1")
        if not 0.0 <= self.dropout < 1.0:
            out.append(f"dropout ({self.dropout}) must be in [0, 1)")
        return out
