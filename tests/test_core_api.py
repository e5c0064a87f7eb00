"""The top-level API that the docs send users to: ``qkv.models`` exports every model family
(with its config and output classes), and ``qkv.load`` passes ``revision`` through to the Hub."""

from __future__ import annotations

import inspect

import pytest
import torch

import qkv
import qkv.models
from qkv.errors import QkvError

# the families docs/api/models.md and the guides start from, and their configs
FAMILIES = {
    "Transformer": "TransformerConfig",
    "DecoderLM": "LMConfig",
    "DiffusionLM": "DiffusionLMConfig",
    "EncoderModel": "EncoderConfig",
    "VisionTransformer": "ViTConfig",
    "CaptionModel": "CaptionConfig",
    "RNNSeq2Seq": "RNNConfig",
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_qkv_models_exports_every_family_with_its_config(family):
    assert family in qkv.models.__all__ and FAMILIES[family] in qkv.models.__all__
    model_class, config_class = getattr(qkv.models, family), getattr(qkv.models, FAMILIES[family])
    assert issubclass(model_class, torch.nn.Module)
    # the same class as in its module, so isinstance checks agree whichever path imported it
    assert model_class.__module__.startswith("qkv.models.")
    assert inspect.signature(model_class).parameters  # built from a config
    assert config_class.__module__ == "qkv.models.config"


def test_qkv_models_all_names_exist():
    missing = [name for name in qkv.models.__all__ if not hasattr(qkv.models, name)]
    assert not missing
    assert len(set(qkv.models.__all__)) == len(qkv.models.__all__)


def test_qkv_load_passes_the_revision_to_the_hub(monkeypatch):
    import qkv.hub.hub_names as hub_names

    asked = []

    def download(repo_id, revision=None):
        asked.append((repo_id, revision))
        raise QkvError("offline in this test")

    monkeypatch.setattr(hub_names, "download", download)
    with pytest.raises(QkvError, match="offline in this test"):
        qkv.load("someone/tiny-model", revision="v1.0")
    with pytest.raises(QkvError, match="offline in this test"):
        qkv.load("someone/tiny-model@abc123")
    assert asked == [("someone/tiny-model", "v1.0"), ("someone/tiny-model", "abc123")]
    # a pin in the name and a different revision= contradict each other
    with pytest.raises(QkvError, match="names revision 'abc123', but revision 'v1.0' was given too"):
        qkv.load("someone/tiny-model@abc123", revision="v1.0")
    assert "revision" in inspect.signature(qkv.load).parameters
