"""qkv: the Transformer of "Attention Is All You Need", from its equations to real use."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: `import qkv` imports neither torch nor pathlib
    from pathlib import Path

    import torch

__version__ = "0.1.0"


def load(name_or_path: str | Path, device: torch.device | str = "cpu") -> tuple[Any, Any]:
    """``(model, tokenizer)`` of a qkv run directory, an HF folder or a pretrained short name
    (``"minilm"``, ``"antiberty"``, ``"iglm"``); see :func:`qkv.hub.pretrained.load`. Imported
    on first use, so ``import qkv`` stays light."""
    from .hub.pretrained import load as _load

    return _load(name_or_path, device)
