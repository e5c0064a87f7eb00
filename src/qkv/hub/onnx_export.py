"""A run out as ONNX graphs (``qkv convert --to onnx RUN_DIR DIR``), for onnxruntime in Python,
in a service or in a browser (onnxruntime-web).

What :func:`export_onnx` writes in ``DIR``, by family (the run's recipe; each model type's entry
of :data:`GRAPHS` builds its graphs):

- **lm**: ``decoder.onnx``, one decoding step with its key/value cache as graph inputs and
  outputs, so generation is incremental: ``tokens (B, T)`` int64, ``past_keys`` and
  ``past_values`` ``(n_layers, B, n_heads, P, d_k)`` float32 (``P = 0`` at the first step) →
  ``logits (B, T, V)``, ``present_keys``/``present_values`` ``(n_layers, B, n_heads, P + T,
  d_k)``;
- **translation**, **caption**: ``encoder.onnx`` (``src (B, S)`` int64, or ``images (B, C, H,
  W)`` float32 in [-1, 1] → ``memory (B, S, d_model)``) and ``decoder.onnx`` (``tgt (B, T)``,
  ``memory``, the translator's ``src`` for its padding mask, ``past_keys``, ``past_values`` →
  ``logits``, ``present_keys``, ``present_values``): the decoder's self-attention cache as in
  the LM; the cross-attention's keys and values are recomputed from ``memory`` at each step;
- **diffusion-lm**: ``model.onnx``, ``tokens (B, T)`` → ``logits (B, T, V)`` (the denoiser);
- **protein-mlm**, **protein-cls**, **protein-residue**, **text-cls**, **encoder** (a
  converted BERT or ESM-2): ``model.onnx``, ``tokens (B, T)`` → the logits of the run's own
  head (masked-token ``(B, T, V)``, sequence ``(B, num_labels)`` or residue ``(B, T,
  num_labels)``);
- **vit**: ``model.onnx``, ``images (B, C, H, W)`` → ``logits (B, num_labels)``.

With ``attentions=True`` every graph also outputs its attention weights, one tensor per
attention kind: ``attentions`` ``(n_layers, B, n_heads, T, L)`` (the decoders': ``self_attentions``
and ``cross_attentions``). Batch and sequence axes are dynamic (``P`` too); a graph checks
nothing a model's forward does not (a sequence past ``max_len`` is the caller's to refuse:
``onnx.json`` gives ``max_len``).

Beside the graphs: ``tokenizer.json`` in the format Hugging Face ``tokenizers`` (and its
JavaScript port) reads (a character vocabulary becomes a ``WordLevel`` model over single
characters), and ``onnx.json``: the recipe, the exporter used, the opset (read back from each
graph, what a runtime must implement: an exporter that cannot convert to the opset asked for
keeps its own), each graph's inputs and outputs, the model's config (special ids, ``max_len``,
``n_layers``, ``n_heads``, ``d_model``), and each file's size and SHA-256.

``weights="float16"`` (``--weights float16``) stores the weights and tables (positions) in half the
bytes, each cast back to float32 in the graph (:func:`store_half`): a page loads half as much, the
arithmetic is float32's, the numbers those of the model with its tensors rounded to float16.

The graphs are traced from the model's own forward (``torch.onnx.export``, the dynamo exporter
first, TorchScript's where dynamo fails; ``onnx.json`` says which); the only export-time piece
is :class:`GrowingCache`, a :class:`~qkv.nn.attention.KVCache` whose ``append`` concatenates
(a graph cannot grow a buffer in place). Parity with PyTorch through onnxruntime:
``tests/test_onnx_export.py``.
"""

from __future__ import annotations

import importlib.util
import logging
import shutil
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from .. import runs
from ..data.sources import sha256sum
from ..errors import QkvError
from ..files import read_json, refuse_nonempty, write_json
from ..models.caption import CaptionModel
from ..models.decoder_lm import DecoderLM
from ..models.model_types import for_model
from ..models.transformer import Transformer
from ..nn.attention import KVCache
from ..runs.layout import TASK, TOKENIZER

logger = logging.getLogger(__name__)

MIN_OPSET = 17  # LayerNormalization is an ONNX operator from opset 17
DEFAULT_OPSET = 18
# the opset domain of ONNX's own operators, as an opset_import names it ("" or its long name)
ONNX_DOMAINS = ("", "ai.onnx")
MANIFEST = "onnx.json"
WEIGHT_DTYPES = ("float32", "float16")
HALF_LEAST = 1024  # store_half keeps tensors smaller than this (norm gains, biases) in float32


class GrowingCache(KVCache):
    """A :class:`KVCache` for export: ``append`` concatenates the new keys and values after the
    cached ones (``torch.cat``), so the cache is a graph input and the concatenation a graph
    output. (The inference cache writes into a buffer that grows by doubling, which a graph
    cannot express.)"""

    def __init__(self, k: torch.Tensor, v: torch.Tensor) -> None:
        super().__init__()
        self.set(k, v)

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        assert self._k is not None and self._v is not None  # set in __init__
        self._k, self._v = torch.cat([self._k, k], 2), torch.cat([self._v, v], 2)
        self.length = self._k.size(2)
        return self._k, self._v


def cache_shape(config: Any, batch: int, length: int) -> tuple[int, int, int, int, int]:
    """The exported cache's shape, ``(n_layers, batch, n_heads, length, d_k)``: the decoder's
    layers for a translator or captioner."""
    n_layers = getattr(config, "n_decoder_layers", None) or config.n_layers
    return (n_layers, batch, config.n_heads, length, config.d_model // config.n_heads)


def empty_cache(config: Any, batch: int) -> dict[str, np.ndarray]:
    """``past_keys`` and ``past_values`` of a first decoding step (``P = 0``), float32 for
    onnxruntime; ``config``: the model's config."""
    shape = cache_shape(config, batch, 0)
    return {"past_keys": np.zeros(shape, np.float32), "past_values": np.zeros(shape, np.float32)}


def _caches(past_keys: torch.Tensor, past_values: torch.Tensor) -> list[GrowingCache]:
    return [GrowingCache(past_keys[i], past_values[i]) for i in range(past_keys.size(0))]


def _stacked(caches: list[GrowingCache]) -> tuple[torch.Tensor, torch.Tensor]:
    """Every layer's cached keys and values, ``(n_layers, B, H, L, d_k)`` each."""
    keys, values = zip(*((c._k, c._v) for c in caches), strict=True)
    return torch.stack(keys), torch.stack(values)


class LMStep(nn.Module):
    """One decoding step of a :class:`DecoderLM` with its cache as tensors (see the module
    docstring): ``(tokens, past_keys, past_values)`` → ``(logits, present_keys,
    present_values[, attentions])``."""

    def __init__(self, model: DecoderLM, attentions: bool) -> None:
        super().__init__()
        self.model, self.attentions = model, attentions

    def forward(self, tokens: torch.Tensor, past_keys: torch.Tensor, past_values: torch.Tensor) -> tuple:
        caches = _caches(past_keys, past_values)
        out = self.model(tokens, caches=caches, need_weights=self.attentions)
        keys, values = _stacked(caches)
        return (out.logits, keys, values) + ((torch.stack(out.attentions),) if self.attentions else ())


class Seq2SeqStep(nn.Module):
    """One decoding step of a translator's or a captioner's decoder with its self-attention
    cache as tensors: ``(tgt, memory[, src], past_keys, past_values)`` → ``(logits,
    present_keys, present_values[, self_attentions, cross_attentions])``."""

    def __init__(self, model: Transformer | CaptionModel, attentions: bool) -> None:
        super().__init__()
        self.model, self.attentions = model, attentions

    def step(self, tgt, memory, src_mask, past_keys, past_values) -> tuple:
        own = _caches(past_keys, past_values)
        # a fresh cross-attention cache each step: its keys and values are computed from memory
        caches: list[tuple[KVCache, KVCache]] = [(c, KVCache()) for c in own]
        start = past_keys.size(3)
        logits, self_w, cross_w = self.model.decode(
            tgt, memory, src_mask, caches=caches, start_pos=start, need_weights=self.attentions
        )
        keys, values = _stacked(own)
        weights = (torch.stack(self_w), torch.stack(cross_w)) if self.attentions else ()
        return (logits, keys, values) + weights


class TranslatorStep(Seq2SeqStep):
    """The translator's step: ``src (B, S)`` gives the padding mask over ``memory``."""

    def forward(self, tgt, memory, src, past_keys, past_values) -> tuple:
        from ..nn.masks import padding_mask

        return self.step(tgt, memory, padding_mask(src, self.model.config.pad_id), past_keys, past_values)


class CaptionStep(Seq2SeqStep):
    """The captioner's step: every patch of ``memory`` is real (no mask)."""

    def forward(self, tgt, memory, past_keys, past_values) -> tuple:
        return self.step(tgt, memory, None, past_keys, past_values)


class Encode(nn.Module):
    """A translator's or captioner's encoder: ``src`` or ``images`` → ``memory[, attentions]``."""

    def __init__(self, model: Transformer | CaptionModel, attentions: bool) -> None:
        super().__init__()
        self.model, self.attentions = model, attentions

    def forward(self, inputs: torch.Tensor) -> tuple:
        memory, _, weights = self.model.encode(inputs, need_weights=self.attentions)
        return (memory,) + ((torch.stack(weights),) if self.attentions else ())


class Whole(nn.Module):
    """A model read in one pass (diffusion LM, encoder with its head, ViT): inputs → ``logits[,
    attentions]``."""

    def __init__(self, model: nn.Module, attentions: bool, **kwargs: Any) -> None:
        super().__init__()
        self.model, self.attentions, self.kwargs = model, attentions, kwargs

    def forward(self, inputs: torch.Tensor) -> tuple:
        out = self.model(inputs, need_weights=self.attentions, **self.kwargs)
        return (out.logits,) + ((torch.stack(out.attentions),) if self.attentions else ())


@dataclass
class Graph:
    """One ONNX graph to write: its module, example inputs, output names, and the dynamic axes
    of every input and output (axis index → name; the same name is the same size)."""

    file: str
    module: nn.Module
    inputs: dict[str, torch.Tensor]
    outputs: list[str]
    axes: dict[str, dict[int, str]] = field(default_factory=dict)


SEQ = {0: "batch", 1: "length"}
CACHE_IN = {1: "batch", 3: "past"}
CACHE_OUT = {1: "batch", 3: "total"}
STEP_AXES = {"logits": SEQ, "past_keys": CACHE_IN, "past_values": CACHE_IN}
STEP_AXES |= {"present_keys": CACHE_OUT, "present_values": CACHE_OUT}
WEIGHT_AXES = {1: "batch", 3: "length", 4: "keys"}  # (n_layers, B, H, T, L)


def _past(config: Any, batch: int, length: int) -> dict[str, torch.Tensor]:
    shape = cache_shape(config, batch, length)
    return {"past_keys": torch.randn(shape), "past_values": torch.randn(shape)}


def _weights(names: list[str], attentions: bool) -> tuple[list[str], dict[str, dict[int, str]]]:
    names = names if attentions else []
    return names, {name: WEIGHT_AXES for name in names}


B, T, P = 2, 5, 3  # example sizes: distinct, and above 1 so the exporter keeps them symbolic


def _images(config: Any) -> torch.Tensor:
    return torch.rand(B, config.channels, config.image_size, config.image_size) * 2 - 1


def lm_graphs(model: DecoderLM, level: str, attentions: bool) -> list[Graph]:
    """A decoder-only LM's ``decoder.onnx``: one decoding step with its cache (the module
    docstring). ``level`` is not read."""
    config: Any = model.config
    names, axes = _weights(["attentions"], attentions)
    inputs = {"tokens": torch.randint(0, config.vocab_size, (B, T)), **_past(config, B, P)}
    outputs = ["logits", "present_keys", "present_values", *names]
    return [
        Graph("decoder.onnx", LMStep(model, attentions), inputs, outputs, STEP_AXES | {"tokens": SEQ} | axes)
    ]


def seq2seq_graphs(
    model: Transformer | CaptionModel, level: str, attentions: bool, translator: bool
) -> list[Graph]:
    """A translator's (``translator``: token input) or a captioner's (image input)
    ``encoder.onnx`` and ``decoder.onnx`` (the module docstring). ``level`` is not read."""
    config: Any = model.config
    if translator:
        enc_in = {"src": torch.randint(4, config.src_vocab_size, (B, T + 2))}
        enc_axes = {"src": {0: "batch", 1: "src_length"}}
    else:
        enc_in, enc_axes = {"images": _images(config)}, {"images": {0: "batch"}}
    names, axes = _weights(["attentions"], attentions)
    memory_axes = {"memory": {0: "batch", 1: "src_length"}}
    encode = Encode(model, attentions)
    encoder = Graph("encoder.onnx", encode, enc_in, ["memory", *names], enc_axes | memory_axes | axes)
    with torch.no_grad():
        memory = model.encode(next(iter(enc_in.values())))[0]
    vocab = config.tgt_vocab_size if translator else config.vocab_size
    inputs = {"tgt": torch.randint(4, vocab, (B, T)), "memory": memory, **(enc_in if translator else {})}
    inputs |= _past(config, B, P)
    names, axes = _weights(["self_attentions", "cross_attentions"], attentions)
    axes |= STEP_AXES | {"tgt": SEQ} | memory_axes | (enc_axes if translator else {})
    step = (TranslatorStep if translator else CaptionStep)(model, attentions)
    outputs = ["logits", "present_keys", "present_values", *names]
    return [encoder, Graph("decoder.onnx", step, inputs, outputs, axes)]


def image_graphs(model: nn.Module, level: str, attentions: bool) -> list[Graph]:
    """``model.onnx`` of a model read in one pass over images (the ViT): ``images`` →
    ``logits (B, num_labels)``. ``level`` is not read."""
    names, axes = _weights(["attentions"], attentions)
    axes |= {"images": {0: "batch"}, "logits": {0: "batch"}}
    inputs = {"images": _images(model.config)}
    return [Graph("model.onnx", Whole(model, attentions), inputs, ["logits", *names], axes)]


def token_graphs(model: nn.Module, level: str, attentions: bool, **kwargs: Any) -> list[Graph]:
    """``model.onnx`` of a model read in one pass over tokens (the diffusion LM; the encoder,
    whose ``kwargs`` name its ``head``): ``tokens`` → ``logits``, ``(B, T, V)`` or, for
    ``level="sequence"``, ``(B, num_labels)``. The model's forward takes ``(tokens,
    need_weights=...)`` and returns an output with ``logits`` (and ``attentions``)."""
    config: Any = model.config
    names, axes = _weights(["attentions"], attentions)
    tokens = torch.randint(0, config.vocab_size, (B, T))
    axes |= {"tokens": SEQ, "logits": {0: "batch"} if level == "sequence" else SEQ}
    whole = Whole(model, attentions, **kwargs)
    return [Graph("model.onnx", whole, {"tokens": tokens}, ["logits", *names], axes)]


def encoder_graphs(model: nn.Module, level: str, attentions: bool) -> list[Graph]:
    """An encoder's ``model.onnx``: :func:`token_graphs` with the run's head (``level``)."""
    return token_graphs(model, level, attentions, head=level)


GraphsOf = Callable[[Any, str, bool], "list[Graph]"]
"""``(model, level, attentions) → graphs``: what a family exports (``level``: an encoder's
head, ``"mlm"``, ``"sequence"`` or ``"residue"``; ``attentions``: the weights as outputs)."""

GRAPHS: dict[str, GraphsOf] = {
    "decoder-lm": lm_graphs,
    "transformer": partial(seq2seq_graphs, translator=True),
    "caption": partial(seq2seq_graphs, translator=False),
    "diffusion-lm": token_graphs,
    "encoder": encoder_graphs,
    "vit": image_graphs,
}
"""Each exportable family's graphs, by its model type's name
(:data:`qkv.models.model_types.MODEL_TYPES`). A family without an entry (the RNN baseline) is
refused; a new family adds its line here (:func:`token_graphs` serves a model read in one
pass over tokens)."""


def graphs(model: nn.Module, recipe: str, level: str, attentions: bool) -> list[Graph]:
    """The graphs of ``model`` (see the module docstring; its family's entry of :data:`GRAPHS`),
    each with example inputs of batch 2. ``level``: an encoder's head (``"mlm"``,
    ``"sequence"``, ``"residue"``).

    Raises:
        QkvError: a model of a family not exportable yet (the RNN baseline).
        TypeError: a module of no registered family (:func:`~qkv.models.model_types.for_model`).
    """
    export = GRAPHS.get(for_model(model).name)
    if export is None:
        raise QkvError(f"a {recipe!r} run ({type(model).__name__}) cannot be exported to ONNX yet")
    return export(model, level, attentions)


def max_opset() -> int:
    """The newest opset the installed exporters write: the newest torch's exporters declare
    (``torch.onnx._constants.ONNX_MAX_OPSET``), at most the newest the installed ``onnx``
    knows (``onnx.defs.onnx_opset_version()``). Newer ones fail in the version conversion
    after the export, which then keeps the graph at the exporter's own opset."""
    import onnx.defs
    from torch.onnx import _constants

    newest = onnx.defs.onnx_opset_version()
    return min(getattr(_constants, "ONNX_MAX_OPSET", newest), newest)


def check_opset(opset: int) -> None:
    """Refuse an opset outside ``MIN_OPSET .. max_opset()`` in one line.

    Raises:
        QkvError: below :data:`MIN_OPSET` (qkv's graphs need its operators) or above
            :func:`max_opset` (the installed torch and onnx cannot write it).
    """
    if opset < MIN_OPSET:
        raise QkvError(f"opset {opset} is too old: qkv's graphs need opset {MIN_OPSET} or newer")
    newest = max_opset()
    if opset > newest:
        shown = str(opset) if len(str(opset)) <= 20 else f"{str(opset)[:10]}... ({len(str(opset))} digits)"
        raise QkvError(
            f"opset {shown} is too new: the installed exporter (torch {torch.__version__}) writes "
            f"opsets {MIN_OPSET} to {newest}"
        )


def written_opset(path: Path) -> int:
    """The ONNX operator opset the graph file at ``path`` imports (its ``opset_import``), what a
    runtime must implement to load it; weights stored outside the file are not read.

    Raises:
        QkvError: the file imports no opset of ONNX's own operators.
    """
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    versions = [entry.version for entry in model.opset_import if entry.domain in ONNX_DOMAINS]
    if not versions:
        raise QkvError(f"{path} imports no ONNX operator opset")
    return max(versions)


def _dynamic_shapes(graph: Graph) -> dict[str, dict[int, Any]]:
    """The dynamo exporter's ``dynamic_shapes``: one ``Dim`` per axis name."""
    dims: dict[str, Any] = {}
    out: dict[str, dict[int, Any]] = {}
    for name in graph.inputs:
        out[name] = {}
        for axis, dim in graph.axes.get(name, {}).items():
            dims.setdefault(dim, torch.export.Dim.DYNAMIC)
            out[name][axis] = dims[dim]
    return out


def _export(graph: Graph, path: Path, opset: int) -> str:
    """Write ``graph`` to ``path``: the dynamo exporter, else TorchScript's; returns which."""
    # torch.onnx: e.g. "torchvision is not installed", once per graph; onnxscript: a version
    # conversion that failed, with its traceback (the opset read back from the file says so)
    quiet = [logging.getLogger(name) for name in ("torch.onnx", "onnxscript")]
    levels = [q.level for q in quiet]
    for q in quiet:
        q.setLevel(logging.ERROR)
    try:
        return _export_quietly(graph, path, opset)
    finally:
        for q, level in zip(quiet, levels, strict=True):
            q.setLevel(level)


def _export_quietly(graph: Graph, path: Path, opset: int) -> str:
    args, inputs, outputs = tuple(graph.inputs.values()), list(graph.inputs), graph.outputs
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporters' own warnings on traced Python branches
        try:
            program = torch.onnx.export(
                graph.module,
                args,
                dynamo=True,
                opset_version=opset,
                verbose=False,
                input_names=inputs,
                output_names=outputs,
                dynamic_shapes=tuple(_dynamic_shapes(graph).values()),
            )
            assert program is not None
            program.save(str(path))
            return "dynamo"
        except Exception as exc:  # noqa: BLE001 - any dynamo failure falls back, logged
            logger.info("%s: the dynamo exporter failed (%s); using TorchScript's", path.name, str(exc)[:200])
            from torch.onnx import _constants

            newest = getattr(_constants, "ONNX_TORCHSCRIPT_EXPORTER_MAX_OPSET", opset)
            if opset > newest:
                raise QkvError(
                    f"{path.name}: the dynamo exporter failed and TorchScript's, the fallback, writes "
                    f"opsets up to {newest}: choose opset {newest} or lower"
                ) from None
        torch.onnx.export(
            graph.module,
            args,
            str(path),
            dynamo=False,
            opset_version=opset,
            input_names=inputs,
            output_names=outputs,
            dynamic_axes={k: dict(v) for k, v in graph.axes.items()},
        )
        return "torchscript"


def store_half(path: Path, least: int = HALF_LEAST) -> None:
    """Rewrite the ONNX graph at ``path`` so that its float32 weights of at least ``least``
    elements are stored as float16, each followed by a ``Cast`` back to float32: the file about
    halves, the arithmetic stays float32 (onnxruntime folds the casts when the session loads), and
    the graph computes exactly what the model computes with those tensors rounded to float16
    (about 3 significant digits; greedy outputs barely move, see the deployment guide). Small
    tensors (norm gains, biases) stay float32.

    Raises:
        OSError: ``path`` cannot be read or written.
        google.protobuf.message.DecodeError: ``path`` is not an ONNX file (``export_onnx``
            calls this on the graphs it has just written).
    """
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    model = onnx.load(str(path))
    graph = model.graph
    kept, casts = [], []
    for weight in graph.initializer:
        if weight.data_type == TensorProto.FLOAT and int(np.prod(weight.dims)) >= least:
            half = numpy_helper.from_array(
                numpy_helper.to_array(weight).astype(np.float16), weight.name + ".fp16"
            )
            kept.append(half)
            casts.append(helper.make_node("Cast", [half.name], [weight.name], to=TensorProto.FLOAT))
        else:
            kept.append(weight)
    nodes = casts + list(graph.node)  # the casts first: a graph's nodes are in topological order
    del graph.initializer[:], graph.node[:]
    graph.initializer.extend(kept)
    graph.node.extend(nodes)
    onnx.save(model, str(path))


def write_hf_tokenizer(tokenizer: Any, path: Path) -> None:
    """Write the run's tokenizer to ``path`` as Hugging Face ``tokenizers`` JSON (what
    ``tokenizers`` and its JavaScript port read). A subword or pretrained tokenizer saves itself
    (it is one already); qkv's character and amino-acid vocabularies become a ``WordLevel`` model
    over single characters (the amino-acid one adds ``<cls>`` … ``<eos>`` around a sequence, as
    qkv does; it expects upper-case residues)."""
    from tokenizers import Regex, Tokenizer, pre_tokenizers, processors
    from tokenizers.models import WordLevel

    from ..data.tokenizers import AminoAcidTokenizer, CharTokenizer

    if isinstance(tokenizer, CharTokenizer):
        hf = Tokenizer(WordLevel({c: i for i, c in enumerate(tokenizer.chars)}))
    elif isinstance(tokenizer, AminoAcidTokenizer):
        hf = Tokenizer(WordLevel({t: i for i, t in enumerate(tokenizer.tokens)}, unk_token="<unk>"))
        hf.add_special_tokens(list(tokenizer.tokens[:5]))
        hf.post_processor = processors.TemplateProcessing(
            single="<cls> $A <eos>", special_tokens=[("<cls>", tokenizer.cls_id), ("<eos>", tokenizer.eos_id)]
        )
    else:
        tokenizer.save(path)
        return
    hf.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    hf.save(str(path))


@dataclass(frozen=True)
class OnnxExport:
    """What :func:`export_onnx` wrote: ``out`` (the folder), ``files`` (graph file → its
    exporter, ``"dynamo"`` or ``"torchscript"``), ``megabytes`` (all files)."""

    out: Path
    files: dict[str, str]
    megabytes: float


def export_onnx(
    run_dir: str | Path,
    out_dir: str | Path,
    opset: int = DEFAULT_OPSET,
    attentions: bool = False,
    weights: str = "float32",
) -> OnnxExport:
    """Export the run in ``run_dir`` to ONNX graphs in ``out_dir`` (see the module docstring).
    Everything is traced in a temporary folder and moved in at the end: a failed export leaves
    no half-written ``out_dir``.

    Args:
        opset: the ONNX opset (at least :data:`MIN_OPSET`). attentions: add the attention
            weights as outputs (the explainer's views; more memory per step). weights:
            ``"float32"``, or ``"float16"`` to store them in half the bytes (:func:`store_half`;
            float32 arithmetic).

    Raises:
        QkvError: ``out_dir`` exists and is not empty, or lies under a file; an opset outside
            :data:`MIN_OPSET` .. :func:`max_opset` (:func:`check_opset`); a ``weights`` other
            than float32/float16; a missing or incomplete run; a family not exportable yet (the
            RNN baseline).
    """
    out_dir = Path(out_dir)
    _check_request(out_dir, opset, weights)
    model, tokenizer = runs.load_run(run_dir)  # checks the run's files first
    recipe = runs.info.RunInfo.read(Path(run_dir)).recipe
    task = runs.run_json(run_dir, TASK, missing={})
    level = task.get("level", "mlm")
    parts = graphs(model, recipe, level, attentions)  # refuses a family it cannot export
    config = model.config.to_dict()
    with tempfile.TemporaryDirectory(dir=out_dir.parent if out_dir.parent.exists() else None) as tmp:
        staged = Path(tmp) / "onnx"
        staged.mkdir()
        files, opsets = {}, {}
        for graph in parts:
            with torch.no_grad():
                files[graph.file] = _export(graph, staged / graph.file, opset)
            if weights == "float16":
                store_half(staged / graph.file)
            opsets[graph.file] = _opset_written(staged / graph.file, opset)
            logger.debug("%s: %s exporter, opset %d", graph.file, files[graph.file], opsets[graph.file])
        if tokenizer is not None:
            write_hf_tokenizer(tokenizer, staged / TOKENIZER)
        manifest = {
            "format": 1,
            "recipe": recipe,
            "level": level,
            "classes": task.get("classes"),  # a classifier's labels in id order (task.json), else None
            "opset": max(opsets.values()),  # what the files hold, whatever was asked
            "attentions": attentions,
            "weights": weights,
            "graphs": {
                g.file: {
                    "exporter": files[g.file],
                    "opset": opsets[g.file],
                    "inputs": list(g.inputs),
                    "outputs": g.outputs,
                }
                for g in parts
            },
            "config": config,
            "files": {
                p.name: {"bytes": p.stat().st_size, "sha256": sha256sum(p)} for p in sorted(staged.iterdir())
            },
        }
        write_json(staged / MANIFEST, manifest)
        out_dir.mkdir(parents=True, exist_ok=True)
        for path in staged.iterdir():
            shutil.move(str(path), out_dir / path.name)
    size = sum(p.stat().st_size for p in out_dir.iterdir()) / 1e6
    return OnnxExport(out_dir, files, size)


def _check_request(out_dir: Path, opset: int, weights: str) -> None:
    """What :func:`export_onnx` refuses before any work (see its Raises), in one line each."""
    refuse_nonempty(out_dir, "folder")
    if weights not in WEIGHT_DTYPES:
        raise QkvError(f"weights are stored as {' or '.join(WEIGHT_DTYPES)}, not {weights!r}")
    missing = [name for name in ("onnx", "onnxscript") if importlib.util.find_spec(name) is None]
    if missing:
        raise QkvError(f"ONNX export needs {' and '.join(missing)}: pip install 'qkv[onnx]'")
    check_opset(opset)


def _opset_written(path: Path, asked: int) -> int:
    """The opset of the graph just written to ``path`` (:func:`written_opset`), with a warning
    when it is not the one ``asked`` for (the exporter converts its own opset's graph to the one
    asked for, and keeps its own when the conversion fails)."""
    opset = written_opset(path)
    if opset != asked:
        logger.warning(
            f"{path.name}: the exporter could not convert the graph to opset {asked}; it has opset "
            f"{opset} (onnx.json says so)"
        )
    return opset


def read_manifest(out_dir: str | Path) -> dict:
    """``onnx.json`` of an export folder. Raises :class:`QkvError` when missing or unreadable."""
    return read_json(Path(out_dir) / MANIFEST)
