"""The model architectures a run directory can hold, by the name ``train_config.json``
records as ``"model_type"`` (as Hugging Face's ``config.json`` does): which config class reads
``config.json`` and which module it builds.

Recipes name theirs (:attr:`qkv.recipes.recipe.Recipe.model_type`); :func:`qkv.runs.load_run`
reads a run of any kind through this table without knowing the recipes, which sit above it.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from .caption import CaptionModel
from .config import (
    CaptionConfig,
    DiffusionLMConfig,
    EncoderConfig,
    LMConfig,
    RNNConfig,
    SavedConfig,
    TransformerConfig,
    ViTConfig,
)
from .decoder_lm import DecoderLM
from .diffusion_lm import DiffusionLM
from .encoder import EncoderModel
from .rnn import RNNSeq2Seq
from .transformer import Transformer
from .vit import VisionTransformer


@dataclass(frozen=True)
class ModelType:
    """One architecture: ``name`` (what ``train_config.json`` records), its ``config`` class,
    the ``model`` class built from it, and whether its input is tokens (a ``tokenizer.json``
    beside the weights; a ViT reads pixels)."""

    name: str
    config: type[SavedConfig]
    model: type[nn.Module]
    tokenizer: bool = True


TRANSFORMER = ModelType("transformer", TransformerConfig, Transformer)  # encoder-decoder, §3
DECODER_LM = ModelType("decoder-lm", LMConfig, DecoderLM)
ENCODER = ModelType("encoder", EncoderConfig, EncoderModel)
VIT = ModelType("vit", ViTConfig, VisionTransformer, tokenizer=False)
RNN_SEQ2SEQ = ModelType("rnn-seq2seq", RNNConfig, RNNSeq2Seq)  # the recurrent baseline
CAPTION = ModelType("caption", CaptionConfig, CaptionModel)  # image → text
DIFFUSION_LM = ModelType("diffusion-lm", DiffusionLMConfig, DiffusionLM)  # masked diffusion

MODEL_TYPES: dict[str, ModelType] = {
    t.name: t for t in (TRANSFORMER, DECODER_LM, ENCODER, VIT, RNN_SEQ2SEQ, CAPTION, DIFFUSION_LM)
}


def for_config(config: SavedConfig) -> ModelType:
    """The architecture a model config describes.

    Raises:
        TypeError: a config class no entry of :data:`MODEL_TYPES` reads.
    """
    for kind in MODEL_TYPES.values():
        if type(config) is kind.config:
            return kind
    raise TypeError(f"no model type reads a {type(config).__name__}")
