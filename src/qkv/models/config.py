"""Frozen, validated configuration of the encoder-decoder Transformer.

Defaults are the paper's base model (Vaswani et al. 2017, Table 3, row "base"): d_model 512,
8 heads, d_ff 2048, 6 + 6 layers, dropout 0.1, post-LN, sinusoidal positions, ReLU, shared
embedding / pre-softmax weights.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from ..nn.attention import BACKENDS
from ..nn.norms import NORMS
from ..nn.positional import POSITIONALS


class ModelConfig:
    """What the model configs share: validation of the common fields, the derived ``d_k``,
    and the ``config.json`` round trip (HF layout: beside the weights)."""

    @property
    def d_k(self) -> int:
        """Per-head width d_k = d_v = d_model / n_heads (§3.2.2)."""
        return self.d_model // self.n_heads

    def _layer_problems(self, positive: tuple[str, ...], positionals: tuple[str, ...]) -> list[str]:
        """What is wrong with the fields every model family has (widths, heads, dropouts,
        activation, positions, attention backend), plus ``positive`` fields that must be >= 1."""
        problems = []
        for name in (*positive, "d_model", "n_heads", "d_ff", "max_len"):
            if getattr(self, name) < 1:
                problems.append(f"{name} ({getattr(self, name)}) must be >= 1")
        if self.n_heads >= 1 and self.d_model % self.n_heads:
            problems.append(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        if self.positional == "sinusoidal" and self.d_model % 2:
            problems.append(f"d_model ({self.d_model}) must be even for sinusoidal positions")
        for name in ("dropout", "attention_dropout", "activation_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                problems.append(f"{name} ({getattr(self, name)}) must be in [0, 1)")
        if self.activation not in ("relu", "gelu"):
            problems.append(f"activation ({self.activation!r}) must be 'relu' or 'gelu'")
        if self.positional not in positionals:
            problems.append(f"positional ({self.positional!r}) must be one of {positionals}")
        if self.attention_backend not in BACKENDS:
            problems.append(f"attention_backend ({self.attention_backend!r}) must be one of {BACKENDS}")
        return problems

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict):
        """Build from a dict; unknown keys raise ``ValueError`` naming them."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown {cls.__name__} keys: {', '.join(unknown)}")
        return cls(**data)

    @classmethod
    def load(cls, path: str | Path):
        return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))


@dataclass(frozen=True)
class TransformerConfig(ModelConfig):
    """Hyper-parameters of :class:`qkv.models.transformer.Transformer`.

    Vocabulary: ``src_vocab_size``/``tgt_vocab_size`` and the special ids ``pad_id``,
    ``bos_id``, ``eos_id``. ``share_embeddings`` ties source embeddings, target embeddings and
    the output projection (needs one joint vocabulary, §3.4); ``tie_output`` ties only target
    embeddings and the output projection.

    Raises:
        ValueError: on construction, naming every bad value.
    """

    src_vocab_size: int
    tgt_vocab_size: int
    d_model: int = 512
    n_heads: int = 8
    d_ff: int = 2048
    n_encoder_layers: int = 6
    n_decoder_layers: int = 6
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    activation: str = "relu"
    norm_first: bool = False
    positional: str = "sinusoidal"
    max_len: int = 1024
    bias: bool = True
    tie_output: bool = True
    share_embeddings: bool = False
    attention_backend: str = "sdpa"
    layer_norm_eps: float = 1e-5
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2

    def __post_init__(self) -> None:
        problems = self._layer_problems(("src_vocab_size", "tgt_vocab_size"), ("sinusoidal", "learned"))
        for name in ("n_encoder_layers", "n_decoder_layers"):
            if getattr(self, name) < 0:
                problems.append(f"{name} ({getattr(self, name)}) must be >= 0")
        if self.share_embeddings and self.src_vocab_size != self.tgt_vocab_size:
            problems.append(f"share_embeddings needs one joint vocabulary, but src_vocab_size "
                            f"({self.src_vocab_size}) != tgt_vocab_size ({self.tgt_vocab_size})")
        for name in ("pad_id", "bos_id", "eos_id"):
            if not 0 <= getattr(self, name) < min(self.src_vocab_size, self.tgt_vocab_size):
                problems.append(f"{name} ({getattr(self, name)}) is outside the vocabulary")
        if problems:
            raise ValueError("invalid TransformerConfig: " + "; ".join(problems))



@dataclass(frozen=True)
class LMConfig(ModelConfig):
    """Hyper-parameters of :class:`qkv.models.decoder_lm.DecoderLM` (GPT-style, decoder-only).

    Defaults are nanoGPT's CPU "baby GPT" for tiny-shakespeare (4 layers, 4 heads, d_model 128,
    block 64): pre-LN, GELU, learned positions, no biases, tied embeddings, no sqrt(d) scaling
    of embeddings (GPT-2's choice; the paper's ``scale_embeddings`` is an option).

    ``max_len`` is the context length (nanoGPT's ``block_size``). ``norm``: ``"layernorm"``,
    ``"rmsnorm"`` or ``"dyt"``. ``positional``: ``"learned"``, ``"sinusoidal"`` or ``"rotary"``.
    ``bos_id`` is the token an empty prompt starts from (``None``: empty prompts are refused).

    Raises:
        ValueError: on construction, naming every bad value.
    """

    vocab_size: int
    d_model: int = 128
    n_heads: int = 4
    d_ff: int = 512
    n_layers: int = 4
    dropout: float = 0.0
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    activation: str = "gelu"
    norm: str = "layernorm"
    norm_first: bool = True
    positional: str = "learned"
    max_len: int = 64
    bias: bool = False
    tie_embeddings: bool = True
    scale_embeddings: bool = False
    attention_backend: str = "sdpa"
    layer_norm_eps: float = 1e-5
    bos_id: int | None = None
    eos_id: int | None = None

    def __post_init__(self) -> None:
        problems = self._layer_problems(("vocab_size", "n_layers"), POSITIONALS)
        if self.positional == "rotary" and self.n_heads >= 1 and (self.d_model // self.n_heads) % 2:
            problems.append(f"d_k ({self.d_model // self.n_heads}) must be even for rotary positions")
        if self.norm not in NORMS:
            problems.append(f"norm ({self.norm!r}) must be one of {NORMS}")
        for name in ("bos_id", "eos_id"):
            value = getattr(self, name)
            if value is not None and not 0 <= value < self.vocab_size:
                problems.append(f"{name} ({value}) is outside the vocabulary")
        if problems:
            raise ValueError("invalid LMConfig: " + "; ".join(problems))




@dataclass(frozen=True)
class EncoderConfig(LMConfig):
    """Hyper-parameters of :class:`qkv.models.encoder.EncoderModel` (BERT/ESM-style,
    bidirectional): the fields of :class:`LMConfig` with encoder defaults (pre-LN, GELU,
    learned positions, biases, 4 layers of width 256), plus ``pad_id`` (keys never attended)
    and, for classification heads, ``num_labels`` and ``pooling`` (``"cls"`` or ``"mean"``).
    """

    d_model: int = 256
    n_heads: int = 4
    d_ff: int = 1024
    n_layers: int = 4
    dropout: float = 0.1
    max_len: int = 512
    bias: bool = True
    pad_id: int = 1
    num_labels: int = 0
    pooling: str = "cls"

    def __post_init__(self) -> None:
        super().__post_init__()
        problems = []
        if not 0 <= self.pad_id < self.vocab_size:
            problems.append(f"pad_id ({self.pad_id}) is outside the vocabulary")
        if self.num_labels < 0:
            problems.append(f"num_labels ({self.num_labels}) must be >= 0")
        if self.pooling not in ("cls", "mean"):
            problems.append(f"pooling ({self.pooling!r}) must be 'cls' or 'mean'")
        if problems:
            raise ValueError("invalid EncoderConfig: " + "; ".join(problems))
