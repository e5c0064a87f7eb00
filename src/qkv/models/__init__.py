"""Model families composed from :mod:`qkv.nn` blocks."""

from .config import EncoderConfig, LMConfig, ModelConfig, StackConfig, TransformerConfig
from .decoder_lm import DecoderLM
from .outputs import LMOutput, Seq2SeqOutput
from .transformer import Decoder, Encoder, Transformer

__all__ = [
    "EncoderConfig",
    "LMConfig",
    "ModelConfig",
    "StackConfig",
    "TransformerConfig",
    "DecoderLM",
    "LMOutput",
    "Seq2SeqOutput",
    "Decoder",
    "Encoder",
    "Transformer",
]
