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


@dataclass(frozen=True)
class TransformerConfig:
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
        problems = []
        for name in ("src_vocab_size", "tgt_vocab_size", "d_model", "n_heads", "d_ff", "max_len"):
            if getattr(self, name) < 1:
                problems.append(f"{name} ({getattr(self, name)}) must be >= 1")
        for name in ("n_encoder_layers", "n_decoder_layers"):
            if getattr(self, name) < 0:
                problems.append(f"{name} ({getattr(self, name)}) must be >= 0")
        if self.n_heads >= 1 and self.d_model % self.n_heads:
            problems.append(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        if self.positional == "sinusoidal" and self.d_model % 2:
            problems.append(f"d_model ({self.d_model}) must be even for sinusoidal positions")
        for name in ("dropout", "attention_dropout", "activation_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                problems.append(f"{name} ({getattr(self, name)}) must be in [0, 1)")
        if self.activation not in ("relu", "gelu"):
            problems.append(f"activation ({self.activation!r}) must be 'relu' or 'gelu'")
        if self.positional not in ("sinusoidal", "learned"):
            problems.append(f"positional ({self.positional!r}) must be 'sinusoidal' or 'learned'")
        if self.attention_backend not in BACKENDS:
            problems.append(f"attention_backend ({self.attention_backend!r}) must be one of {BACKENDS}")
        if self.share_embeddings and self.src_vocab_size != self.tgt_vocab_size:
            problems.append(f"share_embeddings needs one joint vocabulary, but src_vocab_size "
                            f"({self.src_vocab_size}) != tgt_vocab_size ({self.tgt_vocab_size})")
        for name in ("pad_id", "bos_id", "eos_id"):
            if not 0 <= getattr(self, name) < min(self.src_vocab_size, self.tgt_vocab_size):
                problems.append(f"{name} ({getattr(self, name)}) is outside the vocabulary")
        if problems:
            raise ValueError("invalid TransformerConfig: " + "; ".join(problems))

    @property
    def d_k(self) -> int:
        """Per-head width d_k = d_v = d_model / n_heads (§3.2.2)."""
        return self.d_model // self.n_heads

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "TransformerConfig":
        """Build from a dict; unknown keys raise ``ValueError`` naming them."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown TransformerConfig keys: {', '.join(unknown)}")
        return cls(**data)

    @classmethod
    def load(cls, path: str | Path) -> "TransformerConfig":
        return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))
