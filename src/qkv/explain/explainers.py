"""One explainer per model family: input text in, the model's output and its attention out.

An :class:`Explainer` loads a run directory and answers two questions about an input:
:meth:`~Explainer.explain` (the output, and the attention weights of every layer and head of
every attention kind) and :meth:`~Explainer.steps` (Eq. 1 step by step for one head). The CLI's
pictures and the web page are both drawn from these answers.

Attention kinds: ``"encoder"`` (encoder self-attention), ``"decoder"`` (masked decoder
self-attention; the only kind of a decoder-only LM) and ``"cross"`` (encoder-decoder attention,
§3.2.3 of Vaswani et al. 2017).
"""

from __future__ import annotations

import base64
import re
import string
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar, cast

import numpy as np
import torch
from torch import nn

from .. import runs
from ..data.parallel import PAIRS_FILE
from ..errors import InputTooLong, QkvError
from ..files import read_json
from ..inference.lm import TextGenerator
from ..inference.search import beam_search, greedy_decode
from ..inference.translator import SEQ2SEQ_RECIPES
from ..nn.attention import MultiHeadAttention
from .activations import ActivationCache, readout, record_activations
from .block import follow_tokens, rounded
from .capture import capture_steps
from .labels import merge_attention, piece_labels, vocabulary_label, word_groups, wordpiece_as_marked

DEFAULT_MAX_CHARS = 400
KIND_TITLES = {
    "encoder": "encoder self-attention",
    "decoder": "decoder self-attention (masked)",
    "cross": "cross-attention (rows: target token produced, columns: source)",
}


InputT = TypeVar("InputT")
"""What an explainer's :meth:`~Explainer.explain` and :meth:`~Explainer.steps` take: ``str``
for the text families, an image for :class:`~qkv.explain.vision.ImageExplainer`."""


@dataclass
class DecodingOptions:
    """How the output is produced: ``beam_size`` (translation and captions; 1 = greedy; ``None``:
    the model's own, 4 for translation (§6.1), a captioner's run setting), ``alpha`` (length
    penalty), and for language models ``max_new_tokens``, ``temperature`` (0 = greedy),
    ``top_k``, ``top_p`` and ``seed`` (sampling is reproducible for a given seed); ``step``: the
    denoising step whose input a diffusion LM's attention is taken from (``None``: the last)."""

    beam_size: int | None = None
    alpha: float = 0.6
    max_new_tokens: int = 40
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = 0
    step: int | None = None


@dataclass
class AttentionMap:
    """Attention weights of one kind, every layer and head, for one input.

    Attributes:
        kind: ``"encoder"``, ``"decoder"`` or ``"cross"``. title: a caption.
        query_tokens / key_tokens: display labels of the rows / columns.
        weights: ``(n_layers, n_heads, Tq, Tk)`` float32; each row sums to 1 (0 where masked).
    """

    kind: str
    title: str
    query_tokens: list[str]
    key_tokens: list[str]
    weights: torch.Tensor

    def to_dict(self, digits: int = 4, packed: bool = False) -> dict:
        """JSON-ready; ``weights`` as nested lists rounded to ``digits`` decimals, or with
        ``packed`` as ``{"uint16": base64, "shape": [L, H, Tq, Tk]}``: each weight × 65535,
        rounded, little-endian (2.7 bytes a weight instead of about 7; the standalone page)."""
        if packed:
            levels = torch.round(self.weights.float().clamp(0, 1) * 65535).to(torch.int32).numpy()
            weights: Any = {
                "uint16": base64.b64encode(levels.astype("<u2").tobytes()).decode("ascii"),
                "shape": list(self.weights.shape),
            }
        else:
            weights = rounded(self.weights, digits)
        return {
            "kind": self.kind,
            "title": self.title,
            "query_tokens": self.query_tokens,
            "key_tokens": self.key_tokens,
            "weights": weights,
        }


@dataclass
class Explanation:
    """What the model made of one input: ``output`` (JSON-ready: ``text``, ``next_tokens``,
    ``classes``, ``residues``) and one :class:`AttentionMap` per attention kind."""

    family: str
    text: str
    output: dict
    attention: list[AttentionMap] = field(default_factory=list)

    def to_dict(self, packed: bool = False) -> dict:
        """JSON-ready (``packed``: the weights as :meth:`AttentionMap.to_dict` packs them)."""
        return {
            "family": self.family,
            "input": self.text,
            "output": self.output,
            "attention": [a.to_dict(packed=packed) for a in self.attention],
        }


@dataclass
class _Pass:
    """One prepared input: ``forward(need_weights)`` reruns the model on it and returns
    ``{kind: per-layer weights (1, H, Tq, Tk)}``; ``pieces[kind] = (query pieces, key pieces)``;
    ``weights``: the result of ``forward(True)`` once computed (a family whose output needs
    that pass anyway fills it in :meth:`Explainer._prepare`); ``cache``: the named activations
    of that pass, once recorded (:meth:`Explainer._recorded`)."""

    forward: Callable[[bool], dict]
    pieces: dict[str, tuple[list[str], list[str]]]
    output: dict
    weights: dict | None = None
    cache: ActivationCache | None = None


PAIR_SEPARATOR = "|||"


def split_pair(text: str) -> tuple[str, str] | None:
    """``(first, second)`` of a sentence pair typed as ``first ||| second`` (white space around
    each stripped), or ``None`` for one sentence."""
    if PAIR_SEPARATOR not in text:
        return None
    first, second = (part.strip() for part in text.split(PAIR_SEPARATOR, 1))
    return first, second


class Explainer(Generic[InputT]):
    """Base class: subclasses load the run, pass its model here, and implement :meth:`layers`
    (the layers holding each attention kind) and :meth:`_prepare` (decode one input). The type
    parameter is the input :meth:`explain` and :meth:`steps` take (see :data:`InputT`).

    Args:
        run_dir: the run directory (for display). max_chars: inputs longer than this are
            refused with :class:`InputTooLong` (the page's JSON grows with the square of the
            length).
    """

    family = ""
    kinds: tuple[str, ...] = ()
    input_kind = "text"  # what the page asks for: "text", or "image" (qkv.explain.vision)
    input_label = "input"
    example = ""
    subword = False
    # whether the attention is Eq. 1 (scaled dot products), which :meth:`steps` walks through
    step_through = True
    tokenizer: Any = None  # the output vocabulary's, where the family has one

    def __init__(self, model, run_dir: str | Path, max_chars: int = DEFAULT_MAX_CHARS) -> None:
        self.model, self.run_dir, self.max_chars = model, str(run_dir), max_chars
        self.config = model.config
        self._last: tuple | None = None  # (text, options, _Pass) of the latest input

    def _prepared(self, text: InputT, options: DecodingOptions | None) -> _Pass:
        """:meth:`_prepare`, reused for the same input and options: the page asks for the
        steps of the input it just explained, and decoding (beam search, sampling with a
        seed) is deterministic, so it need not run twice."""
        options = options or DecodingOptions()
        if self._last is None or self._last[:2] != (text, options):
            # The text families' path (their InputT is str); ImageExplainer overrides _prepared.
            self._last = (text, options, self._prepare(self._check(cast(str, text)), options))
        return self._last[2]

    @property
    def n_layers(self) -> int:
        """Layers of the first attention kind (an encoder-decoder's stacks may differ: see
        ``info()["layers_per_kind"]``)."""
        return len(self.layers(self.kinds[0]))

    def layers(self, kind: str) -> nn.ModuleList:
        raise NotImplementedError

    def attention_module(self, kind: str, layer: int) -> MultiHeadAttention:
        """The :class:`MultiHeadAttention` of ``kind`` in ``layer`` (0-based).
        Raises :class:`QkvError` for an unknown kind or layer."""
        if kind not in self.kinds:
            raise QkvError(f"a {self.family} model has no {kind!r} attention; it has {', '.join(self.kinds)}")
        layers = self.layers(kind)
        if not 0 <= layer < len(layers):
            raise QkvError(f"layer {layer} out of range: the model has layers 0..{len(layers) - 1}")
        # A ModuleList's items are typed Module; qkv's layers hold MultiHeadAttention in these.
        attn = layers[layer].cross_attn if kind == "cross" else layers[layer].self_attn
        return cast(MultiHeadAttention, attn)

    def info(self) -> dict:
        """What the page needs to know about the model (JSON-ready)."""
        attn = self.attention_module(self.kinds[0], 0)
        return {
            "family": self.family,
            "run_dir": self.run_dir,
            "n_layers": self.n_layers,
            "n_heads": attn.n_heads,
            "d_k": attn.d_k,
            "max_chars": self.max_chars,
            "kinds": list(self.kinds),
            "layers_per_kind": {k: len(self.layers(k)) for k in self.kinds},
            "input": self.input_kind,
            "input_label": self.input_label,
            "example": self.example,
            "classes": list(getattr(self, "classes", ())),
            "level": getattr(self, "level", None),
            "step_through": self.step_through,
        }

    def _check(self, text: str) -> str:
        if not text.strip():
            raise QkvError("empty input: type some text")
        if len(text) > self.max_chars:
            raise InputTooLong(f"input too long: {len(text)} characters, the cap is {self.max_chars}")
        return text

    def _check_tokens(self, n: int, limit: int) -> None:
        if n > limit:
            raise InputTooLong(f"input too long: {n} tokens, the model's limit is {limit}")

    def count_tokens(self, text: str) -> int:
        """How many tokens the model reads for ``text`` (special tokens included): the length
        of the encoder's, the prompt's or the source's rows of the attention matrices. Only
        tokenizes; raises as the tokenizer does (:class:`QkvError` for characters outside a
        character vocabulary)."""
        raise NotImplementedError

    @property
    def token_limit(self) -> int:
        """The most tokens :meth:`count_tokens` may give for an input the model accepts."""
        return self.config.max_len

    def _prepare(self, text: str, options: DecodingOptions) -> _Pass:
        raise NotImplementedError

    @torch.no_grad()
    def explain(
        self, text: InputT, options: DecodingOptions | None = None, merge_words: bool = True
    ) -> Explanation:
        """Run the model on ``text`` and collect the attention of every layer and head.

        ``merge_words`` (subword models): attention between words (see
        :func:`~qkv.explain.labels.merge_attention`) instead of between pieces.

        Raises:
            QkvError: empty input, or an input the tokenizer refuses.
            InputTooLong: over ``max_chars`` characters or the model's context.
        """
        prepared = self._prepared(text, options)
        weights, cache = self._recorded(prepared)
        maps = []
        for kind in self.kinds:
            w = torch.stack([layer_w[0] for layer_w in weights[kind]]).float()  # (L, H, Tq, Tk)
            q_pieces, k_pieces = prepared.pieces[kind]
            if merge_words and self.subword:
                q_groups, q_labels = word_groups(q_pieces)
                k_groups, k_labels = word_groups(k_pieces)
                w = merge_attention(w, q_groups, k_groups)
            else:
                q_labels = piece_labels(q_pieces, self.subword)
                k_labels = piece_labels(k_pieces, self.subword)
            maps.append(AttentionMap(kind, KIND_TITLES[kind], q_labels, k_labels, w))
        output = {**prepared.output, "block": self._block(cache, prepared)}
        # text: a str for the text families; ImageExplainer.explain puts its caption there.
        return Explanation(self.family, cast(str, text), output, maps)

    def _recorded(self, prepared: _Pass) -> tuple[dict, ActivationCache]:
        """The attention weights and named activations of ``prepared``'s ``forward(True)``,
        recorded once per prepared input (:meth:`explain` and :meth:`activation` share it)."""
        if prepared.cache is None:
            with record_activations(self.model) as cache:
                weights = prepared.forward(True)
            prepared.cache = cache
            if prepared.weights is None:
                prepared.weights = weights
        assert prepared.weights is not None  # set with the cache, or by _prepare
        return prepared.weights, prepared.cache

    def output_label(self, index: int) -> str:
        """The label of output ``index`` (a token of the output vocabulary, or a class name),
        as the logit lens shows it."""
        piece = self.tokenizer.id_to_token(index)
        return vocabulary_label(piece if piece is not None else f"#{index}", self.subword)

    @property
    def followed_kind(self) -> str:
        """The attention kind whose tokens the block views follow: the stack that feeds the
        output (an encoder-decoder's decoder)."""
        return "decoder" if "cross" in self.kinds else self.kinds[0]

    def _block(self, cache: ActivationCache, prepared: _Pass) -> dict | None:
        """:func:`~qkv.explain.block.follow_tokens` of this pass (``None`` for a model with
        no residual stream: the RNN baseline)."""
        try:
            readout(self.model)
        except ValueError:
            return None
        tokens = piece_labels(prepared.pieces[self.followed_kind][0], self.subword)
        return follow_tokens(self.model, cache, tokens, self.output_label)

    @torch.no_grad()
    def activation(self, text: InputT, name: str, token: int, options: DecodingOptions | None = None) -> dict:
        """One named activation (:mod:`qkv.explain.activations`) of ``text``'s forward pass at
        one token: ``{"name", "token", "shape" (the whole tensor's), "values"}``; for
        ``q``/``k``/``v``/``pattern`` the values of every head.

        Raises:
            QkvError: an unknown name, a layer out of range, a token out of range (one line
                each); as :meth:`explain` for the input.
        """
        _, cache = self._recorded(self._prepared(text, options))
        try:
            value = cache[name]
        except KeyError as unknown:
            layer = re.search(r"(?:^|\.)layers\.(\d+)(?:\.|$)", name)
            stack = name[: layer.start()] if layer else ""
            paths = cache.layers(stack)
            if layer and paths and int(layer[1]) >= len(paths):
                where = f"the {stack} stack has" if stack else "the model has"
                raise QkvError(f"layer {layer[1]} out of range: {where} layers 0..{len(paths) - 1}") from None
            raise QkvError(unknown.args[0]) from None
        axis = 2 if name.endswith((".q", ".k", ".v", ".pattern")) else 1
        if value.dim() <= axis:  # one vector per input (a pooled head): no token axis
            return {"name": name, "token": None, "shape": list(value.shape), "values": rounded(value[0], 5)}
        if not 0 <= token < value.size(axis):
            raise QkvError(f"token {token} out of range: {name} has tokens 0..{value.size(axis) - 1}")
        return {
            "name": name,
            "token": token,
            "shape": list(value.shape),
            "values": rounded(value.select(axis, token)[0], 5),
        }

    @torch.no_grad()
    def steps(
        self, text: InputT, kind: str, layer: int, head: int, options: DecodingOptions | None = None
    ) -> dict:
        """Eq. 1 of one head, with the actual numbers (JSON-ready lists, rows = query tokens):
        ``q``, ``k``, ``v`` ``(T, d_k)``; ``scores`` (QKᵀ), ``scaled`` (÷ sqrt(d_k)), ``mask``
        (True = may attend), ``masked`` (None where masked), ``weights`` (softmax) ``(Tq, Tk)``;
        ``output`` (weights × V) ``(Tq, d_k)``. Tokens are pieces (never merged).

        Raises:
            QkvError: unknown kind, layer or head; as :meth:`explain` for the input.
        """
        module = self.attention_module(kind, layer)
        if not 0 <= head < module.n_heads:
            raise QkvError(f"head {head} out of range: the model has heads 0..{module.n_heads - 1}")
        prepared = self._prepared(text, options)
        s = capture_steps(module, lambda: prepared.forward(False))
        allowed = s.masked[0, head] > torch.finfo(s.masked.dtype).min  # (Tq, Tk)
        masked = [
            [v if ok else None for v, ok in zip(row, oks, strict=True)]
            for row, oks in zip(rounded(s.masked[0, head], 5), allowed.tolist(), strict=True)
        ]
        q_pieces, k_pieces = prepared.pieces[kind]
        return {
            "kind": kind,
            "layer": layer,
            "head": head,
            "d_k": module.d_k,
            "query_tokens": piece_labels(q_pieces, self.subword),
            "key_tokens": piece_labels(k_pieces, self.subword),
            **{
                name: rounded(getattr(s, name)[0, head], 5)
                for name in ("q", "k", "v", "scores", "scaled", "weights", "output")
            },
            "mask": allowed.tolist(),
            "masked": masked,
        }


class TranslationExplainer(Explainer[str]):
    """Encoder-decoder runs (``qkv train translation``): the source is translated with beam
    search, then the model is rerun teacher-forced on its own translation to read the encoder,
    decoder and cross-attention of the output it produced."""

    family, subword = "translation", True
    kinds: tuple[str, ...] = ("encoder", "decoder", "cross")

    def __init__(
        self, run_dir: str | Path, device: torch.device | str = "cpu", max_chars: int = DEFAULT_MAX_CHARS
    ) -> None:
        model, self.tokenizer = runs.load_run(run_dir, device=device, family=SEQ2SEQ_RECIPES)
        super().__init__(model, run_dir, max_chars)
        meta = runs.run_settings(run_dir)
        src, tgt = meta.get("src_lang", "de"), meta.get("tgt_lang", "en")
        self.input_label = f"sentence to translate ({src} → {tgt})"
        self.example = {
            "de": "Ein Mann fährt mit dem Fahrrad durch den Park.",
            "fr": "Un homme fait du vélo dans le parc.",
            "cs": "Muž jede na kole parkem.",
        }.get(src, "")
        if meta.get("data") and (Path(run_dir) / PAIRS_FILE).is_file():  # the user's own pairs
            held = read_json(Path(run_dir) / PAIRS_FILE)
            self.input_label = f"source to translate ({Path(meta['data']).name})"
            self.example = (held["val"] or held["test"] or [[""]])[0][0]
            self.subword = held.get("tokenizer") != "amino-acid"  # residues are not word pieces

    def layers(self, kind: str) -> nn.ModuleList:
        return self.model.encoder.layers if kind == "encoder" else self.model.decoder.layers

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer.encode(text)) + 1  # + <eos>

    def _prepare(self, text, options):
        cfg, tok = self.config, self.tokenizer
        ids = tok.encode(text)
        self._check_tokens(len(ids) + 1, cfg.max_len)
        device = next(self.model.parameters()).device
        src = torch.tensor([ids + [cfg.eos_id]], device=device)
        beam = options.beam_size or 4  # the paper's beam (§6.1) unless asked otherwise
        hyp = (
            greedy_decode(self.model, src) if beam <= 1 else beam_search(self.model, src, beam, options.alpha)
        )[0]
        tgt_in = torch.tensor([[cfg.bos_id] + hyp[: cfg.max_len - 1]], device=device)

        def forward(need_weights):
            out = self.model(src, tgt_in, need_weights=need_weights)
            return {
                "encoder": out.encoder_attentions,
                "decoder": out.decoder_self_attentions,
                "cross": out.cross_attentions,
            }

        src_pieces = [tok.id_to_token(i) for i in ids] + ["<eos>"]
        tgt_in_pieces = ["<bos>"] + [tok.id_to_token(i) for i in tgt_in[0, 1:].tolist()]
        produced = tgt_in_pieces[1:] + ["<eos>"]
        return _Pass(
            forward,
            {
                "encoder": (src_pieces, src_pieces),
                "decoder": (tgt_in_pieces, tgt_in_pieces),
                "cross": (produced, src_pieces),
            },
            {
                "text": tok.decode(hyp),
                "next_tokens": [],
                "classes": [],
                "residues": None,
                "decoding": "greedy decoding" if beam <= 1 else f"beam search, beam size {beam}",
            },
        )


class RNNTranslationExplainer(TranslationExplainer):
    """Recurrent baselines (``qkv train translation-rnn``) with additive attention: the alignment
    ``α`` of Bahdanau et al. 2015 (§3.1) is shown as the cross-attention of one layer and one
    head. It is not Eq. 1 (a small network scores each pair, no scaled dot product), so there
    is no step-through. A bottleneck model (``attention="none"``) has no attention to show."""

    kinds = ("cross",)
    step_through = False

    def __init__(
        self, run_dir: str | Path, device: torch.device | str = "cpu", max_chars: int = DEFAULT_MAX_CHARS
    ) -> None:
        super().__init__(run_dir, device, max_chars)
        if self.model.attention is None:
            raise QkvError(
                f"{run_dir} is a bottleneck RNN (model.attention none): its decoder reads only the "
                "encoder's final states, so there is no attention to explain"
            )
        self._layers = nn.ModuleList([_AlignmentLayer(self.model.attention)])

    def layers(self, kind: str) -> nn.ModuleList:
        return self._layers

    def steps(self, text, kind, layer, head, options=None) -> dict:
        raise QkvError(
            "additive attention (Bahdanau et al. 2015) scores with a small network, not Eq. 1's "
            "scaled dot products: there are no steps to show"
        )


class _AlignmentLayer(nn.Module):
    """Holds an RNN's attention where the explainer looks for a layer's ``cross_attn``."""

    def __init__(self, attention: nn.Module) -> None:
        super().__init__()
        self.cross_attn = attention


class LMExplainer(Explainer[str]):
    """Decoder-only language models (``qkv train lm``): attention over the prompt, a sampled
    continuation and the next-token probabilities after the prompt."""

    family, kinds, input_label = "lm", ("decoder",), "prompt"

    def __init__(
        self, run_dir: str | Path, device: torch.device | str = "cpu", max_chars: int = DEFAULT_MAX_CHARS
    ) -> None:
        model, tokenizer = runs.load_run(run_dir, device=device, family="lm")
        self.generator = TextGenerator(model, tokenizer)
        super().__init__(self.generator.model, run_dir, max_chars)
        self.tokenizer, self.subword = tokenizer, tokenizer.kind == "bpe"
        self.example = "ROMEO:\nBut soft, what light" if tokenizer.kind == "char" else "The meaning of"

    def layers(self, kind: str) -> nn.ModuleList:
        return self.model.layers

    def count_tokens(self, text: str) -> int:
        return len(self.generator.encode_prompt(text))

    def _prepare(self, text, options):
        gen, tok = self.generator, self.tokenizer
        ids = gen.encode_prompt(text)
        self._check_tokens(len(ids), self.config.max_len)
        tokens = torch.tensor([ids], device=next(self.model.parameters()).device)

        def forward(need_weights):
            return {"decoder": self.model(tokens, need_weights=need_weights).attentions}

        sample = options.temperature > 0
        continuation = gen.generate(
            [text],
            options.max_new_tokens,
            do_sample=sample,
            temperature=options.temperature if sample else 1.0,
            top_k=options.top_k,
            top_p=options.top_p,
            seed=options.seed,
        )[0]
        top = gen.next_token_probs(text, 10, options.temperature if sample else 1.0, options.top_p)
        pieces = [tok.id_to_token(i) for i in ids]
        next_tokens = [
            {"token": piece_labels([t], False)[0].replace("Ġ", "␣"), "prob": round(p, 5)} for t, p in top
        ]
        return _Pass(
            forward,
            {"decoder": (pieces, pieces)},
            {"text": continuation, "next_tokens": next_tokens, "classes": [], "residues": None},
        )


class ProteinExplainer(Explainer[str]):
    """Protein encoders (``protein-cls``, ``protein-residue``, ``protein-mlm`` runs): attention
    between residues and the predicted class probabilities (or per-residue labels)."""

    family, kinds, input_label = "protein", ("encoder",), "protein sequence (one-letter codes)"
    example = "GIGKFLHSAKKFGKAFVGEIMNS"  # magainin 2, an antimicrobial peptide

    def __init__(
        self, run_dir: str | Path, device: torch.device | str = "cpu", max_chars: int = DEFAULT_MAX_CHARS
    ) -> None:
        from ..inference.protein import ProteinEncoder

        self.encoder = ProteinEncoder.from_run(run_dir, device)
        super().__init__(self.encoder.model, run_dir, max_chars)
        self.classes, self.level = self.encoder.classes, self.encoder.level
        self.tokenizer = self.encoder.tok  # the logit lens's labels (its masked-token head)

    def layers(self, kind: str) -> nn.ModuleList:
        return self.model.layers

    def _ids(self, text: str) -> list[int]:
        return self.encoder.tok.encode(
            "".join(text.split()), "input"
        )  # white space between residues is dropped

    def count_tokens(self, text: str) -> int:
        return len(self._ids(text))

    def _prepare(self, text, options):
        model = self.model
        tok, ids = self.encoder.tok, self._ids(text)
        self._check_tokens(len(ids), self.config.max_len)
        tokens = torch.tensor([ids], device=self.encoder.device)
        head = {"sequence": model.classify_sequence, "residue": model.classify_residues}.get(
            self.level, model.forward
        )

        def forward(need_weights):
            return {"encoder": head(tokens, need_weights=need_weights).attentions}

        out = head(tokens, need_weights=True)  # the prediction and the weights in one pass
        output: dict[str, Any] = {"text": None, "next_tokens": [], "classes": [], "residues": None}
        if self.level in ("sequence", "residue"):
            probs = out.logits.float().softmax(-1)[0]
            if self.level == "sequence":
                output["classes"] = [
                    {"label": c, "prob": round(float(p), 5)} for c, p in zip(self.classes, probs, strict=True)
                ]
            else:
                output["residues"] = "".join(self.classes[k] for k in probs[1:-1].argmax(-1).tolist())
        # ids come from tok.encode, so each is in the vocabulary: id_to_token gives a str, never None
        pieces = cast(list[str], [tok.id_to_token(i) for i in ids])
        return _Pass(forward, {"encoder": (pieces, pieces)}, output, {"encoder": out.attentions})


class TextExplainer(Explainer[str]):
    """Pretrained text encoders (a converted BERT such as MiniLM, or a ``text-cls`` run): the
    attention between the word pieces of a sentence, or of a sentence pair (``A ||| B``, with
    BERT's token types), and what the model makes of it.

    Output keys (besides ``classes``, the class probabilities of a trained head): for a pair,
    ``similarity`` = ``{"first", "second", "cosine"}``, the cosine similarity of the two
    sentences' embeddings (each encoded alone, mean-pooled and L2-normalised, as
    ``qkv similarity`` and sentence-transformers compute it); for one sentence, ``embedding``
    = ``{"dim", "norm", "closest_words": [{"word", "cosine"}]}``: the embedding's size, its
    norm before normalisation and the sentence's own words, each encoded alone, nearest to it
    (its nearest neighbours among its parts: the content words, usually).
    """

    family, kinds, subword = "text", ("encoder",), True
    input_label = "sentence (a pair: first ||| second)"
    example = "A man rides a bicycle through the park. ||| Someone is cycling outdoors."

    def __init__(
        self, run_dir: str | Path, device: torch.device | str = "cpu", max_chars: int = DEFAULT_MAX_CHARS
    ) -> None:
        from ..inference.text import TextEncoder

        self.encoder = TextEncoder.load(run_dir, device)
        super().__init__(self.encoder.model, run_dir, max_chars)
        self.classes = self.encoder.classes
        self.level = "sequence" if self.classes else "mlm"

    def layers(self, kind: str) -> nn.ModuleList:
        return self.model.layers

    def output_label(self, index: int) -> str:
        return vocabulary_label(
            wordpiece_as_marked([self.encoder.tokenizer.id_to_token(index) or f"#{index}"])[0]
        )

    def _embedding(self, text: str, top: int = 5) -> dict:
        """What one sentence's embedding is near: its size, its norm before the L2
        normalisation, and the ``top`` words of the sentence (each encoded alone, punctuation
        stripped) whose embeddings are closest to it (cosine), best first."""
        words = [w for w in dict.fromkeys(w.strip(string.punctuation) for w in text.split()) if w]
        vectors = self.encoder.embed([text, *words], normalize=False)  # (1 + W, D) float32
        norms = np.linalg.norm(vectors, axis=1)
        cosines = (vectors[1:] @ vectors[0]) / np.maximum(norms[1:] * norms[0], 1e-12)  # (W,)
        best = np.argsort(-cosines, kind="stable")[:top]
        return {
            "dim": int(vectors.shape[1]),
            "norm": round(float(norms[0]), 4),
            "closest_words": [{"word": words[i], "cosine": round(float(cosines[i]), 4)} for i in best],
        }

    def _encode(self, text: str) -> tuple[list[int], list[int] | None]:
        """Token ids and (a pair) BERT's token types: 0 for the first sentence, 1 for the second."""
        pair = split_pair(text)
        if pair is None:
            return self.encoder.tokenizer.encode(text), None
        return self.encoder.tokenizer.encode_pair(*pair)

    def count_tokens(self, text: str) -> int:
        return len(self._encode(text)[0])

    def _prepare(self, text, options):
        tok = self.encoder.tokenizer
        ids, types = self._encode(text)
        self._check_tokens(len(ids), self.config.max_len)
        device = self.encoder.device
        tokens = torch.tensor([ids], device=device)
        token_types = None if types is None else torch.tensor([types], device=device)
        head = "sequence" if self.classes else "mlm"

        def forward(need_weights):
            return {
                "encoder": self.model(tokens, need_weights, head=head, token_types=token_types).attentions
            }

        out = self.model(tokens, True, head=head, token_types=token_types)
        output: dict[str, Any] = {"text": None, "next_tokens": [], "classes": [], "residues": None}
        if self.classes:
            probs = out.logits.float().softmax(-1)[0]
            output["classes"] = [
                {"label": c, "prob": round(float(p), 5)} for c, p in zip(self.classes, probs, strict=True)
            ]
        pieces = wordpiece_as_marked([tok.id_to_token(i) for i in ids])
        pair = split_pair(text)
        if pair is None:
            output["embedding"] = self._embedding(text)
        else:
            first, second = self.encoder.embed(list(pair))  # each sentence alone, as qkv similarity does
            output["similarity"] = {
                "first": pair[0],
                "second": pair[1],
                "cosine": round(float(first @ second), 5),
            }
        return _Pass(forward, {"encoder": (pieces, pieces)}, output, {"encoder": out.attentions})
