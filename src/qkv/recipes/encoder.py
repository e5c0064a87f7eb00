"""A pretrained encoder converted from Hugging Face (``qkv convert hf``: BERT, MiniLM,
AntiBERTy, ESM-2): a kind of run with no training recipe of its own. Text-cls and the protein
recipes fine-tune it (``--init``); embeddings, similarity and search read it directly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..data.tokenizers import load_tokenizer
from ..explain.explainer import Explainer
from ..explain.explainers import ProteinExplainer, TextExplainer
from ..models.model_types import ENCODER
from ..runs.layout import TOKENIZER
from .recipe import Recipe


def explainer(run_dir: str | Path, device: torch.device | str = "cpu", **kwargs: Any) -> Explainer:
    """An explainer of proteins (a residue vocabulary: AntiBERTy, ESM) or of text (BERT)."""
    tok = load_tokenizer(Path(run_dir) / TOKENIZER)
    cls = ProteinExplainer if getattr(tok, "is_residue_vocabulary", False) else TextExplainer
    return cls(run_dir, device=device, **kwargs)


RECIPE = Recipe(
    name="encoder",
    settings=None,
    train=None,
    evaluate=None,
    splits=(),
    summary=None,
    model_type=ENCODER,
    explainer=explainer,
    inputs="text",
)
