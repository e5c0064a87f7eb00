"""The HF model families qkv converts: each one a key map plus the translation of its
``config.json`` into a qkv config, both ways.

Every family is a configuration of qkv's own modules, not a copy of HF's code:

- **BERT** (Devlin et al. 2019): post-LN (the paper's order), exact GELU, learned positions plus
  token-type embeddings, a LayerNorm over the summed embeddings, a pooler, the MLM head (its
  transform applies ``hidden_act``, the FFN's activation).
- **ESM-2** (Lin et al. 2023, ``EsmForMaskedLM``): pre-LN, rotary positions, token dropout
  scaling, a final LayerNorm, the MLM head; the FFN and the head always apply the exact GELU
  (HF's ESM reads no ``hidden_act``).
- **GPT-2** (Radford et al. 2019): pre-LN, tanh-GELU, learned positions, ``Conv1D`` weights
  stored ``(in, out)``, output projection tied to the embeddings.
- **Marian** (Junczys-Dowmunt et al. 2018; the OPUS-MT models): the closest HF model to the
  paper's: a post-LN encoder-decoder with static sinusoidal positions (sines before cosines),
  embeddings scaled by sqrt(d_model) and shared by encoder, decoder and output projection,
  plus a bias on the logits (``final_logits_bias``).
- **ViT** (Dosovitskiy et al. 2021, ``ViTForImageClassification``): pre-LN, learned positions,
  the class token, a patch projection stored as a convolution kernel, the classifier on the
  class token's final state.

Each ``from_hf`` carries every HF setting that changes the outputs, or refuses it with a
one-line :class:`QkvError` naming it; settings that only train (dropout, initialisation) or
generate are not checked.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import QkvError
from ..models.config import EncoderConfig, LMConfig, ModelConfig, TransformerConfig, ViTConfig
from ..models.model_types import DECODER_LM, ENCODER, TRANSFORMER, ModelType, for_config
from ..models.model_types import VIT as VIT_TYPE
from ..nn.feedforward import Activation
from .keymap import Rule

# HF hidden_act / activation_function → qkv activation, and back
ACT_FROM_HF: dict[str, Activation] = {
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
}
ACT_TO_HF = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu", "silu": "silu"}


@dataclass(frozen=True)
class Family:
    """One HF model family.

    Attributes:
        name: qkv's name (``"bert"``). model_types: HF ``model_type`` values it reads.
        recipe: the kind of qkv run it becomes (``"encoder"`` or ``"lm"``).
        prefix: the base model's prefix inside HF head models (``"bert."``); a bare base
            model's names get it on import.
        rules: the key map. skip: HF names that are not weights (regular expressions).
        keep: HF heads qkv does not model, kept aside for the export (regular expressions).
        architectures: ``(architecture, parts it needs)`` for export, first match wins.
        base_model: the bare base model's architecture (names without ``prefix``), written
            when no head architecture matches; ``None``: always a head model.
        from_hf: ``(hf config dict, parts present) -> qkv config``; raises :class:`QkvError`
            for settings qkv cannot represent. to_hf: ``qkv config -> hf config dict``.
    """

    name: str
    model_types: tuple[str, ...]
    recipe: str
    prefix: str
    rules: tuple[Rule, ...]
    skip: tuple[str, ...]
    keep: tuple[str, ...]
    architectures: tuple[tuple[str, frozenset], ...]
    base_model: str | None
    from_hf: Callable[[dict, set], ModelConfig]
    # Each family's functions take its own config class (EncoderConfig, LMConfig, ...), which a
    # Callable over the base ModelConfig would refuse (parameters are contravariant).
    to_hf: Callable[[Any], dict]
    hf_shapes: Callable[[Any], dict] = lambda config: {}
    tokenizer: bool = True  # text or residues in; a ViT reads pixels

    def architecture(self, parts: set[str]) -> str | None:
        return next((name for name, needs in self.architectures if needs <= parts), self.base_model)


def _act(name: str) -> Activation:
    if name not in ACT_FROM_HF:
        raise QkvError(f"activation {name!r} is not supported; qkv has {', '.join(ACT_FROM_HF)}")
    return ACT_FROM_HF[name]


def _refuse(c: dict, family: str, **computed: object) -> None:
    """Raise :class:`QkvError` naming every HF setting of ``c`` (an HF ``config.json``) that
    holds another value than the one qkv computes with (``computed``: setting=value; an absent
    setting reads as HF's default, which is that value)."""
    bad = [f"{k}={c[k]!r} (qkv: {v!r})" for k, v in computed.items() if k in c and c[k] != v]
    if bad:
        raise QkvError(f"{family} settings qkv does not implement: {', '.join(bad)}")


def _require(config: ModelConfig, family: str, **wanted: object) -> None:
    """Raise naming every field of a qkv config that the HF family cannot express."""
    bad = [f"{k}={getattr(config, k)!r} (needs {v!r})" for k, v in wanted.items() if getattr(config, k) != v]
    if bad:
        raise QkvError(f"this model cannot be written as {family}: {', '.join(bad)}")


def _encoder_fields(c: dict, family: str, parts: set[str]) -> dict:
    """The EncoderConfig fields BERT's and ESM's configs name alike, after refusing what
    neither encoder represents: a decoder (``is_decoder``: causal self-attention;
    ``add_cross_attention``) and, with the MLM head, an output projection untied from the
    embeddings (``tie_word_embeddings`` false: qkv's head is always tied)."""
    _refuse(c, family, is_decoder=False, add_cross_attention=False)
    if "mlm" in parts:
        _refuse(c, family, tie_word_embeddings=True)
    return dict(
        vocab_size=c["vocab_size"],
        d_model=c["hidden_size"],
        n_heads=c["num_attention_heads"],
        d_ff=c["intermediate_size"],
        n_layers=c["num_hidden_layers"],
        max_len=c["max_position_embeddings"],
    )


def _encoder_layer_rules(base: str, pre_ln: bool) -> tuple[Rule, ...]:
    """BERT's and ESM's per-layer names (``base`` = ``"bert.encoder.layer.{}."``). They differ
    only in where the two LayerNorms live: after the residual add (BERT, post-LN) or before
    the sub-layer (ESM, pre-LN)."""
    attn_norm = "attention.LayerNorm" if pre_ln else "attention.output.LayerNorm"
    ffn_norm = "LayerNorm" if pre_ln else "output.LayerNorm"
    rules = []
    for kind in ("weight", "bias"):
        rules += [
            Rule(
                tuple(f"{base}attention.self.{p}.{kind}" for p in ("query", "key", "value")),
                f"layers.{{}}.self_attn.w_qkv.{kind}",
            ),
            Rule(f"{base}attention.output.dense.{kind}", f"layers.{{}}.self_attn.w_o.{kind}"),
            Rule(f"{base}{attn_norm}.{kind}", f"layers.{{}}.self_attn_block.norm.{kind}"),
            Rule(f"{base}intermediate.dense.{kind}", f"layers.{{}}.ffn.w_1.{kind}"),
            Rule(f"{base}output.dense.{kind}", f"layers.{{}}.ffn.w_2.{kind}"),
            Rule(f"{base}{ffn_norm}.{kind}", f"layers.{{}}.ffn_block.norm.{kind}"),
        ]
    return tuple(rules)


def _mlm_rules(head: str) -> tuple[Rule, ...]:
    """The MLM head (dense + activation + LayerNorm, then the tied decoder with its own bias)."""
    dense, norm = (
        ("predictions.transform.dense", "predictions.transform.LayerNorm")
        if head == "cls."
        else ("dense", "layer_norm")
    )
    bias = f"{head}predictions.bias" if head == "cls." else f"{head}bias"
    return tuple(
        Rule(f"{head}{src}.{kind}", f"mlm_transform.{dst}.{kind}", part="mlm")
        for src, dst in ((dense, 0), (norm, 2))
        for kind in ("weight", "bias")
    ) + (Rule(bias, "mlm_head.bias", part="mlm"),)


def _pooler_rules(prefix: str) -> tuple[Rule, ...]:
    return tuple(
        Rule(f"{prefix}pooler.dense.{k}", f"pooler.0.{k}", part="pooler") for k in ("weight", "bias")
    )


# --- BERT -----------------------------------------------------------------------------------


def _bert_from_hf(c: dict, parts: set[str]) -> EncoderConfig:
    """An HF ``BertConfig`` → :class:`EncoderConfig`. ``hidden_act`` is the FFN's activation and
    the MLM head transform's (HF ``BertIntermediate`` and ``BertPredictionHeadTransform``).

    Raises:
        QkvError: relative positions (``position_embedding_type``), a decoder, an untied MLM
            head or an activation qkv does not have, named.
    """
    if c.get("position_embedding_type", "absolute") != "absolute":
        raise QkvError(
            f"BERT with position_embedding_type={c['position_embedding_type']!r} is not "
            "supported (absolute only)"
        )
    act = _act(c.get("hidden_act", "gelu"))
    return EncoderConfig(
        **_encoder_fields(c, "BERT", parts),
        activation=act,
        head_activation=act,
        positional="learned",
        type_vocab_size=c.get("type_vocab_size", 2),
        embed_norm=True,
        norm_first=False,
        layer_norm_eps=c.get("layer_norm_eps", 1e-12),
        dropout=c.get("hidden_dropout_prob", 0.1),
        attention_dropout=c.get("attention_probs_dropout_prob", 0.1),
        pad_id=c.get("pad_token_id", 0),
        pooler="pooler" in parts,
    )


def _bert_to_hf(cfg: EncoderConfig) -> dict:
    # one hidden_act for the FFN and the MLM head
    _require(
        cfg,
        "BERT",
        head_activation=cfg.activation,
        positional="learned",
        norm_first=False,
        embed_norm=True,
        norm="layernorm",
        bias=True,
        scale_embeddings=False,
        token_dropout=False,
    )
    return {
        "model_type": "bert",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "num_attention_heads": cfg.n_heads,
        "intermediate_size": cfg.d_ff,
        "num_hidden_layers": cfg.n_layers,
        "max_position_embeddings": cfg.max_len,
        "type_vocab_size": cfg.type_vocab_size,
        "hidden_act": ACT_TO_HF[cfg.activation],
        "layer_norm_eps": cfg.layer_norm_eps,
        "hidden_dropout_prob": cfg.dropout,
        "attention_probs_dropout_prob": cfg.attention_dropout,
        "pad_token_id": cfg.pad_id,
        "position_embedding_type": "absolute",
    }


BERT = Family(
    name="bert",
    model_types=("bert",),
    recipe="encoder",
    prefix="bert.",
    rules=(
        Rule("bert.embeddings.word_embeddings.weight", "embed.weight"),
        Rule("bert.embeddings.position_embeddings.weight", "positional.embedding.weight"),
        Rule("bert.embeddings.token_type_embeddings.weight", "token_type.weight"),
        Rule("bert.embeddings.LayerNorm.weight", "embed_norm.weight"),
        Rule("bert.embeddings.LayerNorm.bias", "embed_norm.bias"),
        *_encoder_layer_rules("bert.encoder.layer.{}.", pre_ln=False),
        *_pooler_rules("bert."),
        *_mlm_rules("cls."),
    ),
    # position_ids: a buffer; the decoder is tied to the word embeddings (its bias is
    # cls.predictions.bias under another name)
    skip=(r"bert\.embeddings\.position_ids", r"cls\.predictions\.decoder\.(weight|bias)"),
    keep=(r"cls\.(?!predictions\.).*",),  # NSP, AntiBERTy's species/chain heads
    architectures=(("BertForMaskedLM", frozenset({"mlm"})),),
    base_model="BertModel",
    from_hf=_bert_from_hf,
    to_hf=_bert_to_hf,
)


# --- ESM-2 ----------------------------------------------------------------------------------


# ESM's max_position_embeddings counts fairseq's learned-position table, which starts after the
# padding index: 1,026 = 1,024 trained tokens + 2 (ESM-1b's table; ESM-2's HF configs keep the
# number). ESM-2 was trained on crops of 1,024 tokens, <cls> + 1,022 residues + <eos>, and
# fair-esm's extract.py cuts chains at 1,022 residues (Lin et al. 2023, Methods "Pre-training").
ESM_POSITION_OFFSET = 2


def _esm_from_hf(c: dict, parts: set[str]) -> EncoderConfig:
    """An HF ``EsmConfig`` → :class:`EncoderConfig`. The FFN and the MLM head apply the exact
    (erf) GELU whatever ``hidden_act`` says: HF's ``EsmIntermediate`` and ``EsmLMHead`` call
    ESM's own ``gelu`` and read no ``hidden_act`` (nor did fair-esm, Lin et al. 2023).

    Raises:
        QkvError: learned positions (``position_embedding_type``), a rotary base other than
            10,000 (``rope_theta``: qkv's rotary positions use §3.5's), a decoder or an untied
            MLM head, named.
    """
    if c.get("position_embedding_type", "absolute") != "rotary":
        raise QkvError(
            f"ESM with position_embedding_type={c.get('position_embedding_type')!r} is not "
            "supported (rotary, as in ESM-2)"
        )
    _refuse(c, "ESM", rope_theta=10000.0)
    return EncoderConfig(
        **{
            **_encoder_fields(c, "ESM", parts),
            "max_len": c["max_position_embeddings"] - ESM_POSITION_OFFSET,
        },
        activation="gelu",
        head_activation="gelu",
        positional="rotary",
        norm_first=True,
        embed_norm=bool(c.get("emb_layer_norm_before", False)),
        layer_norm_eps=c.get("layer_norm_eps", 1e-12),  # EsmConfig's default
        dropout=c.get("hidden_dropout_prob", 0.0),
        attention_dropout=c.get("attention_probs_dropout_prob", 0.0),
        pad_id=c.get("pad_token_id", 1),
        mask_id=c.get("mask_token_id"),
        token_dropout=bool(c.get("token_dropout", False)),
        pooler="pooler" in parts,
    )


def _esm_to_hf(cfg: EncoderConfig) -> dict:
    # HF's ESM has no setting for the activation: always the exact GELU
    _require(
        cfg,
        "ESM",
        activation="gelu",
        head_activation="gelu",
        positional="rotary",
        norm_first=True,
        norm="layernorm",
        bias=True,
        scale_embeddings=False,
        type_vocab_size=0,
    )
    return {
        "model_type": "esm",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "num_attention_heads": cfg.n_heads,
        "intermediate_size": cfg.d_ff,
        "num_hidden_layers": cfg.n_layers,
        "max_position_embeddings": cfg.max_len + ESM_POSITION_OFFSET,
        "hidden_act": "gelu",
        "layer_norm_eps": cfg.layer_norm_eps,
        "hidden_dropout_prob": cfg.dropout,
        "attention_probs_dropout_prob": cfg.attention_dropout,
        "pad_token_id": cfg.pad_id,
        "mask_token_id": cfg.mask_id,
        "token_dropout": cfg.token_dropout,
        "emb_layer_norm_before": cfg.embed_norm,
        "position_embedding_type": "rotary",
    }


ESM = Family(
    name="esm",
    model_types=("esm",),
    recipe="encoder",
    prefix="esm.",
    rules=(
        Rule("esm.embeddings.word_embeddings.weight", "embed.weight"),
        Rule("esm.embeddings.layer_norm.weight", "embed_norm.weight", part="embed_norm"),
        Rule("esm.embeddings.layer_norm.bias", "embed_norm.bias", part="embed_norm"),
        *_encoder_layer_rules("esm.encoder.layer.{}.", pre_ln=True),
        Rule("esm.encoder.emb_layer_norm_after.weight", "final_norm.weight"),
        Rule("esm.encoder.emb_layer_norm_after.bias", "final_norm.bias"),
        *_pooler_rules("esm."),
        *_mlm_rules("lm_head."),
    ),
    skip=(
        r"esm\.embeddings\.position_ids",
        r"esm\.(encoder\.layer\.(\d+|\*)\.attention\.self\.)?rotary_embeddings\.inv_freq",
        r"lm_head\.decoder\.weight",
    ),
    keep=(r"esm\.contact_head\..*",),
    architectures=(("EsmForMaskedLM", frozenset({"mlm"})),),
    base_model="EsmModel",
    from_hf=_esm_from_hf,
    to_hf=_esm_to_hf,
)


# --- GPT-2 ----------------------------------------------------------------------------------


def _gpt2_from_hf(c: dict, parts: set[str]) -> LMConfig:
    _refuse(
        c,
        "GPT-2",
        scale_attn_by_inverse_layer_idx=False,
        reorder_and_upcast_attn=False,
        scale_attn_weights=True,
        add_cross_attention=False,
    )
    vocab = c["vocab_size"]
    special = {k: c.get(f"{k}_token_id") for k in ("bos", "eos")}
    return LMConfig(
        vocab_size=vocab,
        d_model=c["n_embd"],
        n_heads=c["n_head"],
        d_ff=c.get("n_inner") or 4 * c["n_embd"],
        n_layers=c["n_layer"],
        max_len=c["n_positions"],
        positional="learned",
        bias=True,
        norm_first=True,
        tie_embeddings=c.get("tie_word_embeddings", True),
        activation=_act(c.get("activation_function", "gelu_new")),
        layer_norm_eps=c.get("layer_norm_epsilon", 1e-5),
        dropout=c.get("resid_pdrop", 0.1),
        attention_dropout=c.get("attn_pdrop", 0.1),
        **{f"{k}_id": v for k, v in special.items() if v is not None and 0 <= v < vocab},
    )


def _gpt2_to_hf(cfg: LMConfig) -> dict:
    _require(
        cfg,
        "GPT-2",
        positional="learned",
        norm_first=True,
        norm="layernorm",
        bias=True,
        scale_embeddings=False,
        type_vocab_size=0,
        embed_norm=False,
    )
    return {
        "model_type": "gpt2",
        "vocab_size": cfg.vocab_size,
        "n_embd": cfg.d_model,
        "n_head": cfg.n_heads,
        "n_inner": cfg.d_ff,
        "n_layer": cfg.n_layers,
        "n_positions": cfg.max_len,
        "activation_function": ACT_TO_HF[cfg.activation],
        "layer_norm_epsilon": cfg.layer_norm_eps,
        "resid_pdrop": cfg.dropout,
        "embd_pdrop": cfg.dropout,
        "attn_pdrop": cfg.attention_dropout,
        "tie_word_embeddings": cfg.tie_embeddings,
        "bos_token_id": cfg.bos_id,
        "eos_token_id": cfg.eos_id,
    }


def _gpt2_layer_rules() -> tuple[Rule, ...]:
    h = "transformer.h.{}."
    pairs = (
        ("ln_1", "self_attn_block.norm", False),
        ("attn.c_attn", "self_attn.w_qkv", True),
        ("attn.c_proj", "self_attn.w_o", True),
        ("ln_2", "ffn_block.norm", False),
        ("mlp.c_fc", "ffn.w_1", True),
        ("mlp.c_proj", "ffn.w_2", True),
    )
    return tuple(
        Rule(f"{h}{src}.{k}", f"layers.{{}}.{dst}.{k}", transpose=conv and k == "weight")
        for src, dst, conv in pairs
        for k in ("weight", "bias")
    )


GPT2 = Family(
    name="gpt2",
    model_types=("gpt2",),
    recipe="lm",
    prefix="transformer.",
    rules=(
        Rule("transformer.wte.weight", "embed.weight"),
        Rule("transformer.wpe.weight", "positional.embedding.weight"),
        *_gpt2_layer_rules(),
        Rule("transformer.ln_f.weight", "final_norm.weight"),
        Rule("transformer.ln_f.bias", "final_norm.bias"),
        Rule("lm_head.weight", "lm_head.weight", part="lm_head"),
    ),
    skip=(r"transformer\.h\.\d+\.attn\.(bias|masked_bias)",),
    keep=(),
    architectures=(("GPT2LMHeadModel", frozenset()),),
    base_model=None,
    from_hf=_gpt2_from_hf,
    to_hf=_gpt2_to_hf,
)


# --- Marian ---------------------------------------------------------------------------------


def _marian_from_hf(c: dict, parts: set[str]) -> TransformerConfig:
    pairs = (("encoder_attention_heads", "decoder_attention_heads"), ("encoder_ffn_dim", "decoder_ffn_dim"))
    unequal = [f"{a} ({c[a]}) != {b} ({c[b]})" for a, b in pairs if c.get(a) != c.get(b)]
    if c.get("decoder_vocab_size") not in (None, c["vocab_size"]):
        unequal.append(f"decoder_vocab_size ({c['decoder_vocab_size']}) != vocab_size ({c['vocab_size']})")
    if not c.get("share_encoder_decoder_embeddings", True):
        unequal.append("share_encoder_decoder_embeddings is false")
    if c.get("normalize_before", False):
        unequal.append("normalize_before is true")
    if not c.get("tie_word_embeddings", True):  # lm_head.weight is then a matrix of its own
        unequal.append("tie_word_embeddings is false")
    if unequal:
        raise QkvError(f"Marian settings qkv's Transformer does not represent: {'; '.join(unequal)}")
    return TransformerConfig(
        src_vocab_size=c["vocab_size"],
        tgt_vocab_size=c["vocab_size"],
        d_model=c["d_model"],
        n_heads=c["encoder_attention_heads"],
        d_ff=c["encoder_ffn_dim"],
        n_encoder_layers=c["encoder_layers"],
        n_decoder_layers=c["decoder_layers"],
        max_len=c["max_position_embeddings"],
        positional="sinusoidal_halves",
        norm_first=False,
        layer_norm_eps=1e-5,  # MarianLayerNorm's: nn.LayerNorm's default, not in the config
        activation=_act(c.get("activation_function", "gelu")),
        dropout=c.get("dropout", 0.1),
        attention_dropout=c.get("attention_dropout", 0.0),
        activation_dropout=c.get("activation_dropout", 0.0),
        scale_embeddings=bool(c.get("scale_embedding", False)),
        output_bias="logits_bias" in parts,
        share_embeddings=True,
        pad_id=c["pad_token_id"],
        eos_id=c["eos_token_id"],
        bos_id=c.get("decoder_start_token_id", c["pad_token_id"]),
    )


def _marian_to_hf(cfg: TransformerConfig) -> dict:
    _require(
        cfg,
        "Marian",
        positional="sinusoidal_halves",
        norm_first=False,
        norm="layernorm",
        bias=True,
        share_embeddings=True,
        layer_norm_eps=1e-5,
    )
    return {
        "model_type": "marian",
        "vocab_size": cfg.src_vocab_size,
        "decoder_vocab_size": cfg.tgt_vocab_size,
        "d_model": cfg.d_model,
        "encoder_layers": cfg.n_encoder_layers,
        "decoder_layers": cfg.n_decoder_layers,
        "encoder_attention_heads": cfg.n_heads,
        "decoder_attention_heads": cfg.n_heads,
        "encoder_ffn_dim": cfg.d_ff,
        "decoder_ffn_dim": cfg.d_ff,
        "max_position_embeddings": cfg.max_len,
        "activation_function": ACT_TO_HF[cfg.activation],
        "dropout": cfg.dropout,
        "attention_dropout": cfg.attention_dropout,
        "activation_dropout": cfg.activation_dropout,
        "scale_embedding": cfg.scale_embeddings,
        "share_encoder_decoder_embeddings": True,
        "tie_word_embeddings": True,
        "pad_token_id": cfg.pad_id,
        "eos_token_id": cfg.eos_id,
        "decoder_start_token_id": cfg.bos_id,
    }


def _bart_attention(hf: str, qkv: str, cross: bool, stack: str) -> tuple[Rule, ...]:
    """One BART/Marian attention block (``q_proj``/``k_proj``/``v_proj``/``out_proj`` + its
    LayerNorm) → qkv's packed projections and the block's norm."""
    rules = []
    for k in ("weight", "bias"):
        if cross:
            rules += [
                Rule(f"{hf}.q_proj.{k}", f"{qkv}.w_q.{k}", stack=stack),
                Rule((f"{hf}.k_proj.{k}", f"{hf}.v_proj.{k}"), f"{qkv}.w_kv.{k}", stack=stack),
            ]
        else:
            rules.append(Rule(tuple(f"{hf}.{p}_proj.{k}" for p in "qkv"), f"{qkv}.w_qkv.{k}", stack=stack))
        rules += [
            Rule(f"{hf}.out_proj.{k}", f"{qkv}.w_o.{k}", stack=stack),
            Rule(f"{hf}_layer_norm.{k}", f"{qkv}_block.norm.{k}", stack=stack),
        ]
    return tuple(rules)


def _marian_layer_rules(stack: str) -> tuple[Rule, ...]:
    hf, qkv = f"model.{stack}.layers.{{}}.", f"{stack}.layers.{{}}."
    rules = _bart_attention(hf + "self_attn", qkv + "self_attn", False, stack)
    if stack == "decoder":
        rules += _bart_attention(hf + "encoder_attn", qkv + "cross_attn", True, stack)
    return rules + tuple(
        Rule(f"{hf}{src}.{k}", f"{qkv}{dst}.{k}", stack=stack)
        for src, dst in (("fc1", "ffn.w_1"), ("fc2", "ffn.w_2"), ("final_layer_norm", "ffn_block.norm"))
        for k in ("weight", "bias")
    )


MARIAN = Family(
    name="marian",
    model_types=("marian",),
    recipe="translation",
    prefix="model.",
    rules=(
        Rule("model.shared.weight", "src_embed.weight"),
        *_marian_layer_rules("encoder"),
        *_marian_layer_rules("decoder"),
        Rule("final_logits_bias", "generator.bias", part="logits_bias", reshape=True),
    ),
    # the per-stack embeddings and the output projection are the shared matrix; the positions
    # are computed, not learned
    skip=(r"model\.(encoder|decoder)\.embed_(tokens|positions)\.weight", r"lm_head\.weight"),
    keep=(),
    architectures=(("MarianMTModel", frozenset()),),
    base_model=None,
    from_hf=_marian_from_hf,
    to_hf=_marian_to_hf,
    hf_shapes=lambda cfg: {"final_logits_bias": (1, cfg.tgt_vocab_size)},
)


# --- ViT ------------------------------------------------------------------------------------


def _vit_from_hf(c: dict, parts: set[str]) -> ViTConfig:
    if not c.get("qkv_bias", True):
        raise QkvError("ViT with qkv_bias=false is not supported")
    sizes = {k: c[k] for k in ("image_size", "patch_size") if not isinstance(c[k], int)}
    if sizes:  # HF takes [height, width] pairs too
        raise QkvError(f"ViT with {sizes} is not supported (square images and patches: one number each)")
    labels = len(c.get("id2label") or {}) or c.get("num_labels", 2)
    return ViTConfig(
        d_model=c["hidden_size"],
        n_heads=c["num_attention_heads"],
        d_ff=c["intermediate_size"],
        n_layers=c["num_hidden_layers"],
        image_size=c["image_size"],
        patch_size=c["patch_size"],
        channels=c.get("num_channels", 3),
        num_labels=labels if "classifier" in parts else 1,
        positional="learned",
        norm_first=True,
        pooling="cls",
        activation=_act(c.get("hidden_act", "gelu")),
        layer_norm_eps=c.get("layer_norm_eps", 1e-12),
        dropout=c.get("hidden_dropout_prob", 0.0),
        attention_dropout=c.get("attention_probs_dropout_prob", 0.0),
        max_len=max(1024, (c["image_size"] // c["patch_size"]) ** 2 + 1),
    )


def _vit_to_hf(cfg: ViTConfig) -> dict:
    _require(cfg, "ViT", positional="learned", norm_first=True, norm="layernorm", bias=True, pooling="cls")
    return {
        "model_type": "vit",
        "hidden_size": cfg.d_model,
        "num_attention_heads": cfg.n_heads,
        "intermediate_size": cfg.d_ff,
        "num_hidden_layers": cfg.n_layers,
        "image_size": cfg.image_size,
        "patch_size": cfg.patch_size,
        "num_channels": cfg.channels,
        "hidden_act": ACT_TO_HF[cfg.activation],
        "layer_norm_eps": cfg.layer_norm_eps,
        "hidden_dropout_prob": cfg.dropout,
        "attention_probs_dropout_prob": cfg.attention_dropout,
        "qkv_bias": True,
        "id2label": {str(i): f"LABEL_{i}" for i in range(cfg.num_labels)},
        "label2id": {f"LABEL_{i}": i for i in range(cfg.num_labels)},
    }


def _vit_layer_rules() -> tuple[Rule, ...]:
    h = "vit.encoder.layer.{}."
    pairs = (
        ("layernorm_before", "self_attn_block.norm"),
        ("attention.output.dense", "self_attn.w_o"),
        ("layernorm_after", "ffn_block.norm"),
        ("intermediate.dense", "ffn.w_1"),
        ("output.dense", "ffn.w_2"),
    )
    return tuple(
        Rule(
            tuple(f"{h}attention.attention.{p}.{k}" for p in ("query", "key", "value")),
            f"layers.{{}}.self_attn.w_qkv.{k}",
        )
        for k in ("weight", "bias")
    ) + tuple(
        Rule(f"{h}{src}.{k}", f"layers.{{}}.{dst}.{k}") for src, dst in pairs for k in ("weight", "bias")
    )


VIT = Family(
    name="vit",
    model_types=("vit",),
    recipe="vit",
    prefix="vit.",
    rules=(
        Rule("vit.embeddings.cls_token", "cls_token"),
        Rule("vit.embeddings.position_embeddings", "pos_embed"),
        Rule("vit.embeddings.patch_embeddings.projection.weight", "patch_embed.proj.weight", reshape=True),
        Rule("vit.embeddings.patch_embeddings.projection.bias", "patch_embed.proj.bias"),
        *_vit_layer_rules(),
        Rule("vit.layernorm.weight", "final_norm.weight"),
        Rule("vit.layernorm.bias", "final_norm.bias"),
        Rule("classifier.weight", "head.weight", part="classifier"),
        Rule("classifier.bias", "head.bias", part="classifier"),
    ),
    skip=(),
    keep=(r"vit\.pooler\..*",),  # ViTModel's pooler: not used by the classifier
    architectures=(("ViTForImageClassification", frozenset({"classifier"})),),
    base_model="ViTModel",
    from_hf=_vit_from_hf,
    to_hf=_vit_to_hf,
    hf_shapes=lambda cfg: {
        "vit.embeddings.patch_embeddings.projection.weight": (
            cfg.d_model,
            cfg.channels,
            cfg.patch_size,
            cfg.patch_size,
        )
    },
    tokenizer=False,
)


FAMILIES = {f.name: f for f in (BERT, ESM, GPT2, MARIAN, VIT)}
# the HF family each qkv model type converts to (encoders: by their positions, see family_for)
EXPORTED_AS: dict[ModelType, Family] = {TRANSFORMER: MARIAN, VIT_TYPE: VIT, DECODER_LM: GPT2}
HF_WRITES: tuple[ModelType, ...] = (ENCODER, *EXPORTED_AS)  # the model types written as HF checkpoints


def family_of(hf_config: dict) -> Family:
    """The family of an HF ``config.json``; raises :class:`QkvError` naming an unsupported
    ``model_type`` and listing the supported ones."""
    model_type = hf_config.get("model_type")
    for family in FAMILIES.values():
        if model_type in family.model_types:
            return family
    arch = ", ".join(hf_config.get("architectures") or []) or "no architectures listed"
    supported = ", ".join(t for f in FAMILIES.values() for t in f.model_types)
    raise QkvError(f"unsupported HF model_type {model_type!r} ({arch}); qkv converts: {supported}")


def family_for(config: ModelConfig) -> Family:
    """The family a qkv model exports to, by its model type (:mod:`qkv.models.model_types`):
    ViT for a ViT, Marian for an encoder-decoder, GPT-2 for a decoder-only LM, ESM for a rotary
    encoder, BERT for other encoders."""
    family = EXPORTED_AS.get(for_config(config))
    if family is not None:
        return family
    return ESM if config.positional == "rotary" else BERT
