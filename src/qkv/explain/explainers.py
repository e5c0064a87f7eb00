"""One explainer per model family: input text in, the model's output and its attention out.

An :class:`Explainer` loads a run directory and answers questions about an input:
:meth:`~Explainer.explain` (the output, and the attention weights of every layer and head of
every attention kind), :meth:`~Explainer.steps` (Eq. 1 step by step for one head),
:meth:`~Explainer.activation` (one named activation at one token) and
:meth:`~Explainer.intervene` (the output before and after ablating a head, zeroing an FFN
neuron or patching the residual stream from another input: the hooks of
:mod:`qkv.explain.interventions` on the model's own decoding). The CLI's pictures and the web
page are both drawn from these answers.

Attention kinds: ``"encoder"`` (encoder self-attention), ``"decoder"`` (masked decoder
self-attention; the only kind of a decoder-only LM) and ``"cross"`` (encoder-decoder attention,
§3.2.3 of Vaswani et al. 2017).
"""

from __future__ import annotations

import base64
import math
import re
import string
from collections.abc import Callable, Mapping
from contextlib import ExitStack
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
from ..inference.translator import SEQ2SEQ_RECIPES, run_decoding_of
from ..nn.attention import MultiHeadAttention
from .activations import ActivationCache, readout, record_activations
from .block import follow_tokens, rounded
from .capture import capture_steps
from .hooks import HookSpec, hook_points, hooked
from .interventions import ablate_heads, ablate_neurons, point_axes
from .labels import merge_attention, piece_labels, vocabulary_label, word_groups, wordpiece_as_marked

DEFAULT_MAX_CHARS = 400
KIND_TITLES = {
    "encoder": "encoder self-attention",
    "decoder": "decoder self-attention (masked)",
    "cross": "cross-attention (rows: target token produced, columns: source)",
}
KIND_NAMES = {
    "encoder": "encoder self-attention",
    "decoder": "decoder self-attention",
    "cross": "cross-attention",
}
INTERVENTION_FIELDS = {
    "ablate_head": ("kind", "stack", "layer", "head", "mode"),
    "zero_neuron": ("kind", "layer", "neuron"),
    "patch": ("kind", "source_text", "layer", "point"),
}
"""The interventions :meth:`Explainer.intervene` takes, and the fields of each."""
PATCH_POINTS = ("resid_pre", "resid_post")
"""The points of a layer that a ``patch`` intervention may take from another input's run."""


InputT = TypeVar("InputT")
"""What an explainer's :meth:`~Explainer.explain` and :meth:`~Explainer.steps` take: ``str``
for the text families, an image for :class:`~qkv.explain.vision.ImageExplainer`."""


@dataclass
class DecodingOptions:
    """How the output is produced: ``beam_size`` (translation and captions; 1 = greedy; ``None``:
    the run's own, as ``qkv translate`` and ``qkv caption`` decode it: 4 for a translation run
    that names none, §6.1), ``alpha`` (length penalty; ``None``: the run's own, 0.6 where it
    names none), and for language models ``max_new_tokens``, ``temperature`` (0 = greedy),
    ``top_k``, ``top_p`` and ``seed`` (sampling is reproducible for a given seed); ``step``: the
    denoising step whose input a diffusion LM's attention is taken from (``None``: the last)."""

    beam_size: int | None = None
    alpha: float | None = None
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
    of that pass, once recorded (:meth:`Explainer._recorded`); ``score``: the labels of the
    output's tokens (or classes) and a function that reruns the model, teacher-forced on this
    output, and returns the probability of each ``(N,)`` (:meth:`Explainer.intervene` calls it
    with and without the intervention's hooks); ``None`` where the output has no such tokens."""

    forward: Callable[[bool], dict]
    pieces: dict[str, tuple[list[str], list[str]]]
    output: dict
    weights: dict | None = None
    cache: ActivationCache | None = None
    score: tuple[list[str], Callable[[], torch.Tensor]] | None = None


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
            self._last = (text, options, self._fresh(text, options))
        return self._last[2]

    def _fresh(self, text: InputT, options: DecodingOptions) -> _Pass:
        """:meth:`_prepare` of ``text``, run now (never reused): what :meth:`intervene` runs under
        its hooks. The text families' path (their ``InputT`` is ``str``); the image explainers
        override it."""
        return self._prepare(self._check(cast(str, text)), options)

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
            "intervene": self.intervene_info(),
        }

    def intervene_info(self) -> dict | None:
        """What :meth:`intervene` can do on this model, for the page's controls (``None``: no
        interventions, a model with no residual stream): ``ablate_head`` (the attention kinds),
        ``zero_neuron`` (``stack``: the kind whose layers' FFNs it zeroes, the stack that feeds
        the output; ``layers``; ``d_ff`` per layer) and ``patch`` (``stack``: the kind whose layers'
        residual stream it patches, the stack that reads the input; ``layers``; ``points``;
        ``None`` for image input)."""
        try:
            readout(self.model)
        except ValueError:
            return None
        neuron_layers = self.layers(self.followed_kind)
        return {
            "ablate_head": list(self.kinds),
            "zero_neuron": {
                "stack": self.followed_kind,
                "layers": len(neuron_layers),
                "d_ff": [self._ffn(self.followed_kind, i)[1] for i in range(len(neuron_layers))],
            },
            "patch": None
            if self.input_kind != "text"
            else {
                "stack": self.kinds[0],
                "layers": len(self.layers(self.kinds[0])),
                "points": list(PATCH_POINTS),
            },
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
        one token: ``{"name", "token", "shape" (the whole tensor's), "values"}``. ``token``
        indexes the value's token axis (:func:`~qkv.explain.interventions.point_axes`): the
        query position of ``scores``/``pattern``, the key position of ``k``/``v``, axis 1
        otherwise (the positions ``(1, T, D)`` too); ``q``/``k``/``v``/``scores``/``pattern``/``z``
        give every head's values. A value with no token axis (``(B, features)``: a pooled
        head's logits) answers ``token: None`` and the whole vector. Values are rounded to 5
        decimals; one that is not finite is ``None`` (the diffusion LM's logit of its mask
        token is ``-inf``: JSON has no infinities).

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
            if isinstance(name, str) and name in hook_points(self.model):  # a part this output skips
                raise QkvError(
                    f"{name!r} is a point of this model that its {self.family} output does not "
                    f"compute; this pass has {len(cache)} names"
                ) from None
            raise QkvError(unknown.args[0]) from None
        axis, _ = point_axes(name)  # q/k/v, scores/pattern: (B, H, T, ...); z and the rest: (B, T, ...)
        if value.dim() <= 2:  # (B, features): one vector per input (a pooled head), no token axis
            return {"name": name, "token": None, "shape": list(value.shape), "values": _finite(value[0])}
        if not 0 <= token < value.size(axis):
            raise QkvError(f"token {token} out of range: {name} has tokens 0..{value.size(axis) - 1}")
        return {
            "name": name,
            "token": token,
            "shape": list(value.shape),
            "values": _finite(value.select(axis, token)[0]),
        }

    # ---------- interventions: the output before and after one "what if"

    def _path(self, module: nn.Module) -> str:
        """The module path of ``module`` in the model (what its hook points are named from)."""
        for name, candidate in self.model.named_modules():
            if candidate is module:
                return name
        raise QkvError(f"this {self.family} model has no hook points on that part")  # (not a model module)

    def _ffn(self, kind: str, layer: int) -> tuple[str, int]:
        """``(path, d_ff)`` of the FFN of ``layer`` of ``kind``'s stack. Raises QkvError for a
        layer out of range."""
        layers = self.layers(kind)
        if not 0 <= layer < len(layers):
            where = f"the {kind} stack has" if len(self.kinds) > 1 else "the model has"
            raise QkvError(f"layer {layer} out of range: {where} layers 0..{len(layers) - 1}")
        ffn = cast(nn.Module, layers[layer].ffn)  # PositionwiseFeedForward: w_1, act, w_2 (Eq. 2)
        return self._path(ffn), cast(nn.Linear, ffn.w_2).in_features

    def _intervention_hooks(
        self, spec: Mapping[str, Any], options: DecodingOptions, cache: ActivationCache
    ) -> tuple[dict, str, list[HookSpec], Callable[[], list]]:
        """Check ``spec`` and build its hooks: ``(spec with its defaults, description, hooks,
        extra)``; ``extra()`` gives the PyTorch hooks to install beside them (their handles),
        ``cache``: the named activations of the input's own pass (the means of ``mode="mean"``,
        the input's length for a patch).
        Raises QkvError (one line) for anything wrong in ``spec``."""
        if not isinstance(spec, Mapping):
            raise QkvError(f"an intervention is an object with a kind, got {type(spec).__name__}")
        what = spec.get("kind")
        if what not in INTERVENTION_FIELDS:
            raise QkvError(f"unknown intervention kind {what!r}; choose {', '.join(INTERVENTION_FIELDS)}")
        extra = sorted(set(spec) - set(INTERVENTION_FIELDS[what]), key=str)
        if extra:
            raise QkvError(
                f"unknown field {extra[0]!r} of a {what} intervention; "
                f"its fields are {', '.join(INTERVENTION_FIELDS[what])}"
            )
        layer = _index(spec, "layer", what)
        if what == "ablate_head":
            return self._ablate_head(spec, layer, cache)
        if what == "zero_neuron":
            neuron = _index(spec, "neuron", what)
            path, d_ff = self._ffn(self.followed_kind, layer)
            if neuron >= d_ff:
                raise QkvError(
                    f"neuron {neuron} out of range: the FFN of layer {layer} has neurons 0..{d_ff - 1}"
                )
            where = f"{self.followed_kind} " if len(self.kinds) > 1 else ""
            return (
                {"kind": what, "layer": layer, "neuron": neuron},
                f"neuron {neuron} of the FFN of {where}layer {layer + 1} set to zero at every position",
                ablate_neurons(path, neuron, "zero"),
                list,
            )
        return self._patch(spec, layer, options, cache)

    def _ablate_head(
        self, spec: Mapping[str, Any], layer: int, cache: ActivationCache
    ) -> tuple[dict, str, list[HookSpec], Callable[[], list]]:
        """The hooks of an ``ablate_head`` intervention (see :meth:`_intervention_hooks`)."""
        kind = spec.get("stack")
        if kind is None:
            if len(self.kinds) > 1:
                raise QkvError(f"say which attention to ablate: stack = {', '.join(self.kinds)}")
            kind = self.kinds[0]
        if not isinstance(kind, str):
            raise QkvError(f"stack is an attention kind ({', '.join(self.kinds)}), got {kind!r}")
        module = self.attention_module(kind, layer)
        head = _index(spec, "head", "ablate_head")
        if head >= module.n_heads:
            raise QkvError(f"head {head} out of range: the model has heads 0..{module.n_heads - 1}")
        mode = spec.get("mode", "zero")
        if mode not in ("zero", "mean"):
            raise QkvError(f"unknown ablation mode {mode!r}; choose zero or mean")
        path = self._path(module)
        name = f"{KIND_NAMES.get(kind, kind)}, layer {layer + 1}, head {head + 1}"
        normalised = {"kind": "ablate_head", "stack": kind, "layer": layer, "head": head, "mode": mode}
        if mode == "zero":
            return normalised, f"{name}: its output set to zero", ablate_heads(path, head, "zero"), list
        # The mean over this input's own pass (the one shown), as a fixed vector: a decoding
        # step sees one position at a time, where a mean over the call is the value itself.
        mean = cache[f"{path}.z"].mean(dim=(0, 1))  # (H, d_k)
        description = f"{name}: its output set to its mean over the input"
        return normalised, description, ablate_heads(path, head, "mean", mean=mean), list

    def _patch(
        self, spec: Mapping[str, Any], layer: int, options: DecodingOptions, cache: ActivationCache
    ) -> tuple[dict, str, list[HookSpec], Callable[[], list]]:
        """The hooks of a ``patch`` intervention (see :meth:`_intervention_hooks`): the source
        input is run (as :meth:`explain` runs it) and its value of the point recorded; every
        later call of the model reading positions ``0..n-1`` (``n``: the shorter input's length
        on that stack) gets the source's values there. A call's first position is its key/value
        cache's length (0 without one), so a decoding step past the input is left alone. (An LM
        whose context outgrows ``max_len`` re-reads a sliding window from position 0: the
        window's first positions are patched as the input's were.)"""
        if self.input_kind != "text":
            raise QkvError(f"a {self.family} model takes an image: there is no text input to patch from")
        source = spec.get("source_text")
        if not isinstance(source, str):
            raise QkvError("a patch needs source_text, the input whose run is patched in")
        point = spec.get("point", "resid_pre")
        if point not in PATCH_POINTS:
            raise QkvError(f"unknown point {point!r} to patch; choose {', '.join(PATCH_POINTS)}")
        kind = self.kinds[0]  # the stack that reads the input
        layers = self.layers(kind)
        if not 0 <= layer < len(layers):
            raise QkvError(f"layer {layer} out of range: the {kind} stack has layers 0..{len(layers) - 1}")
        name = f"{self._path(layers[layer])}.{point}"
        try:
            source_pass = self._fresh(cast(Any, source), options)
        except QkvError as exc:  # say which input it is about (an InputTooLong stays one: a 413)
            raise type(exc)(f"source_text: {exc}") from None
        with record_activations(self.model, name) as recorded:
            source_pass.forward(False)
        patch = recorded[name]  # (1, Ts, D)
        common = min(patch.size(1), cache[name].size(1))
        start = [0]  # the position of the running call's first token

        def note_start(_module: nn.Module, _args: tuple, kwargs: dict) -> None:
            caches = kwargs.get("caches")
            start[0] = caches[0].length if caches else 0

        def patched(value: torch.Tensor, _name: str) -> torch.Tensor | None:  # (B, T, D)
            first, end = start[0], min(start[0] + value.size(1), common)
            if first >= end:
                return None
            value = value.clone()
            value[:, : end - first] = patch[:, first:end].to(value)
            return value

        where = f"{kind} " if len(self.kinds) > 1 else ""
        return (
            {"kind": "patch", "source_text": source, "layer": layer, "point": point},
            f"the residual stream {'entering' if point == 'resid_pre' else 'leaving'} {where}layer "
            f"{layer + 1} patched from the other input's run at positions 1..{common}",
            [(name, patched)],
            lambda: [self.model.register_forward_pre_hook(note_start, with_kwargs=True)],
        )

    @torch.no_grad()
    def intervene(
        self, text: InputT, intervention: Mapping[str, Any], options: DecodingOptions | None = None
    ) -> dict:
        """The model's output for ``text`` before and after one intervention, both made by the
        same decoding (:meth:`explain`'s: beam search, sampling with the options' seed, the
        denoising, a classifier's pass), the second with the intervention's hooks attached
        (:func:`~qkv.explain.hooks.hooked`: the model's own forward pass, no second code path).

        Interventions (``intervention["kind"]``; layers and heads 0-based):

        - ``{"kind": "ablate_head", "stack", "layer", "head", "mode"}``: one head's output
          ``z`` (before ``W_O``, §3.2.2) set to zero (``mode="zero"``, the default) or to its
          mean over the positions of this input's own pass (``"mean"``, a fixed vector, also at
          decoding steps past the input). ``stack``: the attention kind (``encoder``,
          ``decoder``, ``cross``); optional for a model with one kind.
        - ``{"kind": "zero_neuron", "layer", "neuron"}``: one hidden unit of the FFN (Eq. 2,
          §3.3) of ``layer`` of the stack that produces the output (an encoder-decoder's
          decoder) set to zero at every position.
        - ``{"kind": "patch", "source_text", "layer", "point"}``: the residual stream entering
          (``point="resid_pre"``, the default) or leaving (``"resid_post"``) ``layer`` of the
          stack that reads the input (an encoder-decoder's encoder) replaced by its value in
          the run of ``source_text`` (activation patching, Meng et al. 2022, §2.1), at the
          positions both inputs have: for inputs of different lengths, the common prefix
          ``0..min(T_source, T_input) - 1``. Later positions (a longer input's rest, an LM's
          generated tokens) are left alone. Text input only.

        Returns (JSON-ready): ``intervention`` (the spec with its defaults), ``description``
        (one line, layers and heads 1-based as the page shows them), ``before`` and ``after``
        (the output as :meth:`explain` gives it, without ``block``), ``changed`` (whether the
        output's headline differs: the text, the residue labels, the most likely class),
        ``tokens``: ``{"labels", "before", "after"}``, the probability of each token of the
        before-output (a translation's pieces and ``<eos>``, an LM's continuation, the filled
        tokens of a diffusion template, a caption's pieces; or each class) under a
        teacher-forced pass without and with the intervention (``None`` where the output has
        none, such as a sentence embedding).

        Raises:
            QkvError: an unknown intervention kind or field, a stack, layer, head, neuron or
                point out of range, a patch on image input (one line each); as :meth:`explain`
                for the input and the source text.
            InputTooLong: the input or the source text over the caps.
        """
        options = options or DecodingOptions()
        before = self._prepared(text, options)
        _, cache = self._recorded(before)
        normalised, description, hooks, extra = self._intervention_hooks(intervention, options, cache)
        labels, before_probs, after_probs = None, None, None
        if before.score is not None:
            labels, score = before.score
            before_probs = score()
        with ExitStack() as stack:
            for handle in extra():
                stack.callback(handle.remove)
            stack.enter_context(hooked(self.model, hooks))
            after = self._fresh(text, options)
            if before.score is not None:
                after_probs = before.score[1]()
        return {
            "intervention": normalised,
            "description": description,
            "before": before.output,
            "after": after.output,
            "changed": _headline(before.output) != _headline(after.output),
            "tokens": None
            if labels is None or before_probs is None or after_probs is None
            else {"labels": labels, "before": _finite(before_probs), "after": _finite(after_probs)},
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


def _finite(values: torch.Tensor, digits: int = 5) -> list:
    """``values`` as nested lists rounded to ``digits`` decimals, ``None`` where a value is not
    finite (JSON has no infinities or NaN)."""

    def clean(x: Any) -> Any:
        if isinstance(x, list):
            return [clean(v) for v in x]
        return x if math.isfinite(x) else None

    return clean(rounded(values, digits))


def _index(spec: Mapping[str, Any], key: str, what: str) -> int:
    """``spec[key]``, an index (an int >= 0). Raises QkvError naming the field."""
    value = spec.get(key)
    if value is None:
        raise QkvError(f"a {what} intervention needs {key}")
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise QkvError(f"{key} is an index (0, 1, ...), got {value!r}")
    return value


def _headline(output: Mapping[str, Any]) -> Any:
    """What :meth:`Explainer.intervene` compares to say whether the output changed: the text
    (a translation, an LM's continuation, a filled template, a caption), else the residue
    labels, else the most likely class, else a pair's cosine similarity."""
    if output.get("text") is not None:
        return output["text"]
    if output.get("residues") is not None:
        return output["residues"]
    if output.get("classes"):
        return max(output["classes"], key=lambda c: c["prob"])["label"]
    return (output.get("similarity") or {}).get("cosine")


def _gathered(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The probability of each target: ``logits (N, V)``, ``targets (N,)`` long → ``(N,)``
    float32 (softmax at temperature 1)."""
    return torch.softmax(logits.float(), dim=-1).gather(-1, targets[:, None])[:, 0]


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
        self.beam_size, self.alpha = run_decoding_of(meta)  # as qkv translate decodes the run
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
        beam = options.beam_size or self.beam_size
        alpha = self.alpha if options.alpha is None else options.alpha
        hyp = (greedy_decode(self.model, src) if beam <= 1 else beam_search(self.model, src, beam, alpha))[0]
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
        tgt_out = torch.cat([tgt_in[0, 1:], tgt_in.new_tensor([cfg.eos_id])])  # (T,): what each row produced

        def score() -> torch.Tensor:
            return _gathered(self.model(src, tgt_in).logits[0], tgt_out)

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
                # named on the page as `qkv translate` warns of them (the RNN's tokenizer has none)
                "unknown_characters": getattr(tok, "unknown_characters", lambda _: [])(text),
            },
            score=(piece_labels(produced, self.subword), score),
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

    def intervene(self, text, intervention, options=None) -> dict:
        raise QkvError(
            "a recurrent model has no attention heads, FFN neurons or residual stream between "
            "layers: there is nothing to ablate or patch"
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
        # the continuation's tokens (as far as the context holds them), re-read from its text
        new_ids = (gen.encode_prompt(continuation) if continuation else [])[: self.config.max_len - len(ids)]
        whole = torch.tensor([ids + new_ids], device=tokens.device)  # (1, T + N)

        def score() -> torch.Tensor:
            logits = self.model(whole).logits[0, len(ids) - 1 : -1]  # (N, V): the rows that predict them
            return _gathered(logits, whole[0, len(ids) :])

        labels = [piece_labels([str(tok.id_to_token(i))], False)[0].replace("Ġ", "␣") for i in new_ids]
        return _Pass(
            forward,
            {"decoder": (pieces, pieces)},
            {"text": continuation, "next_tokens": next_tokens, "classes": [], "residues": None},
            score=(labels, score),
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
        # the model itself (not .forward): its own hook records "logits"
        head = {"sequence": model.classify_sequence, "residue": model.classify_residues}.get(
            self.level, model
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
        before = out.logits.argmax(-1)[0]  # the predicted class (of each residue)

        def score() -> torch.Tensor:
            logits = head(tokens).logits[0]
            if self.level == "sequence":  # every class
                return torch.softmax(logits.float(), -1)
            if self.level == "residue":  # each residue's predicted label
                return _gathered(logits[1:-1], before[1:-1])
            return _gathered(logits[1:-1], tokens[0, 1:-1])  # each residue, read unmasked

        labels = (
            list(self.classes)
            if self.level == "sequence"
            else [f"{r}{i + 1}" for i, r in enumerate(pieces[1:-1])]
        )
        return _Pass(
            forward, {"encoder": (pieces, pieces)}, output, {"encoder": out.attentions}, score=(labels, score)
        )


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

        def score() -> torch.Tensor:
            return torch.softmax(self.model(tokens, head=head, token_types=token_types).logits.float(), -1)[0]

        return _Pass(
            forward,
            {"encoder": (pieces, pieces)},
            output,
            {"encoder": out.attentions},
            score=(list(self.classes), score) if self.classes else None,
        )
