"""Sapiens (Prihoda et al. 2022, "BioPhi", mAbs 14(1), Methods): human antibody language models,
one for heavy (VH) and one for light (VL) variable domains, shipped in the ``sapiens`` package
(MIT) as fairseq RoBERTa checkpoints (Liu et al. 2019).

A fairseq RoBERTa is BERT's architecture (post-LN, exact GELU, learned positions, a LayerNorm
over the summed embeddings, the MLM head tied to the embeddings) without token types, and with
fairseq's position offset: the position of token ``t`` is ``pad_id + 1 + t``, so the table's
first ``pad_id + 1`` rows are never read by an unpadded token. Its tensors are renamed to HF
BERT names (the offset rows dropped, a zero token-type row added) and converted by
:func:`qkv.hub.convert.convert_state` with the BERT family's key map. Read with
``torch.load(weights_only=True)``, ``argparse.Namespace`` allowed (the settings' type).
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import torch

from ..data.tokenizers import HFTokenizer
from ..errors import QkvError
from ..files import read_settings_checkpoint
from .convert import Converted, convert_state
from .keymap import fairseq_layer_names, rename_fairseq

# fairseq's Dictionary: these four first, then dict.txt's symbols, then the masked-LM task's mask
FAIRSEQ_SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")
PAD_ID = FAIRSEQ_SPECIALS.index("<pad>")

# fairseq name (regular expression, matched at the start) → HF BERT name; the rest is kept
_LAYER = r"bert.encoder.layer.\1."
FAIRSEQ_TO_BERT = (
    (r"embed_tokens\.", "bert.embeddings.word_embeddings."),
    (r"embed_positions\.", "bert.embeddings.position_embeddings."),
    (r"emb_layer_norm\.", "bert.embeddings.LayerNorm."),
    *fairseq_layer_names(_LAYER, "attention.output.LayerNorm.", "output.LayerNorm."),
    (r"lm_head\.dense\.", "cls.predictions.transform.dense."),
    (r"lm_head\.layer_norm\.", "cls.predictions.transform.LayerNorm."),
    (r"lm_head\.bias$", "cls.predictions.bias"),
    (r"lm_head\.weight$", "cls.predictions.decoder.weight"),  # tied: checked, then skipped
)
# where a RobertaModel's state dict puts the encoder (older fairseq: decoder., newer: encoder.)
_PREFIX = re.compile(r"^(decoder|encoder)\.(sentence_encoder\.)?")


def tokenizer(dict_txt: str | Path) -> HFTokenizer:
    """The fairseq dictionary of ``dict.txt`` (one ``symbol count`` per line) as a residue
    tokenizer: ``<s>=0, <pad>=1, </s>=2, <unk>=3``, the file's symbols, ``<mask>`` last;
    sequences framed ``<s> residues </s>``.

    Raises:
        QkvError: an unreadable or empty file.
    """
    try:
        lines = Path(dict_txt).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise QkvError(f"cannot read fairseq dictionary {dict_txt}: {exc}") from None
    symbols = [line.split()[0] for line in lines if line.strip()]
    if not symbols:
        raise QkvError(f"fairseq dictionary {dict_txt} is empty")
    return HFTokenizer.from_tokens([*FAIRSEQ_SPECIALS, *symbols, "<mask>"])


def to_bert_names(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A fairseq RoBERTa state dict in HF BERT names: the position table without fairseq's
    ``pad_id + 1`` offset rows, and a zero token-type embedding (one type).

    Raises:
        QkvError: names a fairseq RoBERTa encoder does not have (listed), or an output
            projection that is not the token embedding (RoBERTa ties them).
    """
    out = rename_fairseq(state, FAIRSEQ_TO_BERT, _PREFIX, "fairseq RoBERTa")
    embed = out.get("bert.embeddings.word_embeddings.weight")
    tied = out.pop("cls.predictions.decoder.weight", embed)
    if embed is None or tied is None or not torch.equal(tied, embed):
        raise QkvError("fairseq lm_head.weight differs from embed_tokens.weight; RoBERTa ties them")
    positions = "bert.embeddings.position_embeddings.weight"
    if positions in out:
        out[positions] = out[positions][PAD_ID + 1 :]
    out["bert.embeddings.token_type_embeddings.weight"] = torch.zeros(1, embed.shape[1], dtype=embed.dtype)
    return out


def hf_config(args: argparse.Namespace, vocab_size: int) -> dict:
    """The HF BERT config of fairseq RoBERTa settings ``args`` (a checkpoint's ``args``)."""
    return {
        "architectures": ["BertForMaskedLM"],
        "model_type": "bert",
        "vocab_size": vocab_size,
        "hidden_size": args.encoder_embed_dim,
        "num_attention_heads": args.encoder_attention_heads,
        "intermediate_size": args.encoder_ffn_embed_dim,
        "num_hidden_layers": args.encoder_layers,
        "max_position_embeddings": args.max_positions,
        "type_vocab_size": 1,
        "hidden_act": args.activation_fn,
        "layer_norm_eps": 1e-5,  # fairseq's LayerNorm default (BERT's is 1e-12)
        "hidden_dropout_prob": args.dropout,
        "attention_probs_dropout_prob": args.attention_dropout,
        "pad_token_id": PAD_ID,
    }


def read_sapiens(checkpoint: str | Path, dict_txt: str | Path) -> Converted:
    """A Sapiens checkpoint (``checkpoint_vh.pt`` / ``checkpoint_vl.pt``) with its
    ``dict.txt`` → a qkv :class:`~qkv.models.encoder.EncoderModel` with its MLM head (eval
    mode, float32; 4 layers, d_model 128, 8 heads, d_ff 256, 144 tokens: 142 residues) and its
    tokenizer (:func:`tokenizer`).

    Raises:
        QkvError: a missing or refused file, one that is not a fairseq RoBERTa checkpoint, or
            tensors that do not fit its settings (named by
            :func:`~qkv.hub.convert.convert_state`).
    """
    path = Path(checkpoint)
    data = read_settings_checkpoint(path, "Sapiens")
    try:
        args, state = data["args"], data["model"]
        tok = tokenizer(dict_txt)
        config = hf_config(args, tok.vocab_size)
    except (KeyError, TypeError, AttributeError) as exc:
        raise QkvError(f"{path} is not a fairseq RoBERTa checkpoint (no {exc})") from None
    return convert_state(config, to_bert_names(state), tok, where=path)
