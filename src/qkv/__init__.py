"""qkv: the Transformer of "Attention Is All You Need", from its equations to real use."""

__version__ = "0.1.0"


def load(name_or_path, device="cpu"):
    """``(model, tokenizer)`` of a qkv run directory, an HF folder or a pretrained short name
    (``"minilm"``, ``"antiberty"``, ``"iglm"``); see :func:`qkv.hub.pretrained.load`. Imported
    on first use, so ``import qkv`` stays light."""
    from .hub.pretrained import load as _load

    return _load(name_or_path, device)
