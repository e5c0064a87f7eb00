"""Model families composed from :mod:`qkv.nn` blocks."""

from .config import TransformerConfig
from .outputs import Seq2SeqOutput
from .transformer import Decoder, Encoder, Transformer

__all__ = ["TransformerConfig", "Seq2SeqOutput", "Decoder", "Encoder", "Transformer"]
