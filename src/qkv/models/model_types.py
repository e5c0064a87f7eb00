"""The model architectures a run directory can hold, by the name ``train_config.json``
records as ``"model_type"`` (as Hugging Face's ``config.json`` does): which config class reads
``config.json`` and which module it builds.

Recipes name theirs (:attr:`qkv.recipes.recipe.Recipe.model_type`); :func:`qkv.runs.load_run`
reads a run of any kind through this table without knowing the recipes, which sit above it.

This table is the family registry: code above ``models/`` asks it which family a model or a
config is (:func:`for_model`, :func:`for_config`, :func:`built_as`) rather than testing classes
itself, and what a higher layer keeps per family is keyed by the entry's ``name``
(:data:`qkv.hub.onnx_export.GRAPHS`; a recipe's explainer). What a family says of itself lives
on its model class: ``readout(hidden)``, its output head over the residual stream (the logit
lens, :func:`qkv.explain.activations.readout`), and the optional class attributes
``readout_stack`` (the stack whose layers feed that head, ``"decoder"`` for an
encoder-decoder) and ``hook_roles`` (methods whose calls name the parts both stacks share,
:mod:`qkv.explain.hooks`). CONTRIBUTING.md ("A model family") lists every place a new family
touches.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeGuard, TypeVar

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

Model = TypeVar("Model", bound=nn.Module)


@dataclass(frozen=True)
class ModelType(Generic[Model]):
    """One architecture: ``name`` (what ``train_config.json`` records), its ``config`` class,
    the ``model`` class built from it, and whether its input is tokens (a ``tokenizer.json``
    beside the weights; a ViT reads pixels)."""

    name: str
    config: type[SavedConfig]
    model: type[Model]
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


def for_model(model: nn.Module) -> ModelType:
    """The architecture ``model`` is: the entry whose model class is ``model``'s class, or the
    nearest of its bases that an entry names.

    Raises:
        TypeError: a module no entry of :data:`MODEL_TYPES` builds.
    """
    for cls in type(model).__mro__:
        for kind in MODEL_TYPES.values():
            if kind.model is cls:
                return kind
    raise TypeError(f"no model type builds a {type(model).__name__}")


def built_as(model: nn.Module, kind: ModelType[Model]) -> TypeGuard[Model]:
    """Whether ``model`` is a model of ``kind`` (its model class or a subclass): the check of a
    model a user hands to a verb that takes one family (``init=`` must name an encoder)."""
    return isinstance(model, kind.model)
