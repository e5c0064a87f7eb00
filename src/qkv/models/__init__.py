"""Model families composed from :mod:`qkv.nn` blocks, each with its config class, all
importable from here (``from qkv.models import EncoderModel, VisionTransformer``):

- :class:`Transformer`: the paper's encoder-decoder (translation), with :class:`Encoder` and
  :class:`Decoder`.
- :class:`DecoderLM`: a decoder-only language model.
- :class:`DiffusionLM`: a masked diffusion language model (bidirectional, denoised in steps).
- :class:`EncoderModel`: an encoder-only model (BERT, ESM-2 and protein-mlm runs, MiniLM).
- :class:`VisionTransformer`: the ViT image classifier.
- :class:`CaptionModel`: the ViT's patch encoder and the paper's decoder (image → text).
- :class:`RNNSeq2Seq`: the recurrent encoder-decoder with additive attention the Transformer
  replaced (the baseline).
"""

from .caption import CaptionModel, CaptionOutput
from .config import (
    CaptionConfig,
    DiffusionLMConfig,
    EncoderConfig,
    LMConfig,
    ModelConfig,
    RNNConfig,
    SavedConfig,
    StackConfig,
    TransformerConfig,
    ViTConfig,
)
from .decoder_lm import DecoderLM
from .diffusion_lm import DiffusionLM
from .encoder import EncoderModel, EncoderOutput
from .outputs import LMOutput, Seq2SeqOutput
from .rnn import RNNSeq2Seq
from .transformer import Decoder, Encoder, Transformer
from .vit import VisionTransformer, ViTOutput

__all__ = [
    "CaptionConfig",
    "DiffusionLMConfig",
    "EncoderConfig",
    "LMConfig",
    "ModelConfig",
    "RNNConfig",
    "SavedConfig",
    "StackConfig",
    "TransformerConfig",
    "ViTConfig",
    "CaptionModel",
    "DecoderLM",
    "DiffusionLM",
    "EncoderModel",
    "RNNSeq2Seq",
    "Transformer",
    "VisionTransformer",
    "CaptionOutput",
    "EncoderOutput",
    "LMOutput",
    "Seq2SeqOutput",
    "ViTOutput",
    "Decoder",
    "Encoder",
]
