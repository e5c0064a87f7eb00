"""What an explainer is: one run's model behind the questions the CLI's pictures and the web
page ask about an input.

An :class:`Explainer` loads a run directory and answers:
:meth:`~Explainer.explain` (the output, and the attention weights of every layer and head of
every attention kind), :meth:`~Explainer.steps` (Eq. 1 step by step for one head),
:meth:`~Explainer.activation` (one named activation at one token) and
:meth:`~Explainer.intervene` (the output before and after ablating a head, zeroing an FFN
neuron or patching the residual stream from another input: the hooks of
:mod:`qkv.explain.interventions` on the model's own decoding). The answers' shapes are
:class:`Explanation` and :class:`AttentionMap`; :class:`DecodingOptions` is how the output is
decoded. Each family's explainer is a subclass: the text families' in
:mod:`qkv.explain.explainers`, the ViT's in :mod:`qkv.explain.vision`, the captioner's in
:mod:`qkv.explain.caption`, the diffusion LM's in :mod:`qkv.explain.diffusion`.

Attention kinds: ``"encoder"`` (encoder self-attention), ``"decoder"`` (masked decoder
self-attention; the only kind of a decoder-only LM) and ``"cross"`` (encoder-decoder attention,
§3.2.3 of Vaswani et al. 2017).
"""

from __future__ import annotations

import base64
import math
import re
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar, cast

import torch
from torch import nn

from ..errors import InputTooLong, QkvError
from ..nn.attention import MultiHeadAttention
from .activations import ActivationCache, readout, record_activations
from .block import follow_tokens, rounded
from .capture import capture_steps
from .hooks import HookSpec, hook_points, hooked
from .interventions import ablate_heads, ablate_neurons, point_axes
from .labels import merge_attention, piece_labels, vocabulary_label, word_groups

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
