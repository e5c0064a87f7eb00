"""Every intermediate of a forward pass by a stable name: the residual stream, the norms, Q, K,
V, the attention pattern, the FFN's hidden activations, the logits; and the logit lens.

Source: the data flow of Vaswani et al. 2017, §3.1 (Figure 1): each sub-layer's output is added
to its input, the *residual stream*, and normalised (§3.1, §5.4; before the sub-layer in pre-LN
models, Xiong et al. 2020); attention is Eq. 1 over Q, K, V (§3.2), the FFN is Eq. 2 (§3.3).
Named hook points in the manner of TransformerLens (Nanda & Bloom 2022), and the logit lens
(nostalgebraist 2020): the model's own output head read off the residual stream after each
layer.

The names are the model's module paths (``model.named_modules()``) and a point, so they stay
the same for every model of a family and say where the value lives. For a layer at ``L``
(``layers.2``, ``decoder.layers.0``) and its sub-layers ``S`` = ``L.self_attn``,
``L.cross_attn`` (decoder layers), ``L.ffn``:

| name | shape | value |
|---|---|---|
| ``L.resid_pre`` | ``(B, T, D)`` | the residual stream entering the layer |
| ``S.norm_in`` | ``(B, T, D)`` | its norm's input (pre-LN: the stream; post-LN: stream + sub-layer output) |
| ``S.norm_out`` | ``(B, T, D)`` | that norm's output |
| ``S.q`` | ``(B, H, Tq, d_k)`` | queries after ``W_Q`` (and RoPE), split into heads |
| ``S.k``, ``S.v`` | ``(B, H, Tk, d_k)`` | keys, values (with a KV cache: every cached key) |
| ``S.pattern`` | ``(B, H, Tq, Tk)`` | softmax(QKᵀ/√d_k) (Eq. 1); rows sum to 1 |
| ``S.z`` | ``(B, Tq, H, d_k)`` | each head's output, before ``W_O`` (§3.2.2) |
| ``S.out`` | ``(B, T, D)`` | the sub-layer's output (attention after ``W_O``; FFN: Eq. 2) |
| ``L.ffn.pre`` | ``(B, T, d_ff)`` | ``x W_1 + b_1``, before the activation |
| ``L.ffn.hidden`` | ``(B, T, d_ff)`` | the FFN's hidden activations (its "neurons") |
| ``S.resid_post`` | ``(B, T, D)`` | the stream after the sub-layer's residual add (and norm, post-LN) |
| ``L.resid_post`` | ``(B, T, D)`` | the stream leaving the layer |

Besides the layers, the output of each other part of the model is recorded under its path:
``embed`` / ``src_embed`` / ``tgt_embed`` / ``patch_embed`` (token or patch embeddings),
``positional`` (the position encodings added to them), ``embed_norm``, ``final_norm``
(``encoder.final_norm``, ``decoder.final_norm``), ``encoder`` (the translator's and captioner's
``memory``), the heads (``lm_head``, ``generator``, ``mlm_head``, ``head``, ...), and
``logits``, the model's own output. ``pattern`` is recorded when attention weights are
computed: :func:`run_with_cache` asks the model for them.

The values come from forward hooks on the model's own modules, during the model's own forward
pass: there is no second code path, so they are the numbers the model computed. A KV-cached
decoding step records its one new position (``k``/``v`` hold every cached key).
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from ..models.caption import CaptionModel
from ..models.decoder_lm import DecoderLM
from ..models.diffusion_lm import DiffusionLM
from ..models.encoder import EncoderModel
from ..models.transformer import Transformer
from ..models.vit import VisionTransformer
from ..nn.attention import MultiHeadAttention
from ..nn.feedforward import PositionwiseFeedForward
from ..nn.layers import DecoderLayer, SelfAttentionLayer
from ..nn.norms import ResidualNorm

__all__ = ["ActivationCache", "logit_lens", "record_activations", "readout", "run_with_cache"]

LAYER_POINTS = ("resid_pre", "resid_post")
SUBLAYER_POINTS = ("norm_in", "norm_out", "q", "k", "v", "pattern", "z", "out", "pre", "hidden", "resid_post")
# the residual wrapper of each sub-layer, and the name of the sub-layer it wraps
_BLOCKS = {"self_attn_block": "self_attn", "cross_attn_block": "cross_attn", "ffn_block": "ffn"}
# parts recorded under their own path: containers and regularisers are not values to look at
_SKIP = (nn.ModuleList, nn.ModuleDict, nn.Dropout)


class ActivationCache(Mapping[str, torch.Tensor]):
    """The named intermediates of one forward pass (see the module's table of names).

    A read-only mapping ``name → tensor`` (detached, on the model's device and dtype) with
    helpers for the residual stream. An unknown name raises ``KeyError`` with one line that
    names the closest names the cache has.
    """

    def __init__(self, values: dict[str, torch.Tensor] | None = None) -> None:
        self._values: dict[str, torch.Tensor] = {} if values is None else values

    def __getitem__(self, name: str) -> torch.Tensor:
        try:
            return self._values[name]
        except KeyError:
            close = difflib.get_close_matches(name, list(self._values), n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else f"; it has {len(self._values)} names"
            raise KeyError(f"unknown activation name {name!r}{hint}") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"ActivationCache({len(self)} activations)"

    def layers(self, stack: str = "") -> list[str]:
        """The layer paths of ``stack`` (``""``: the model's own ``layers``; ``"encoder"``,
        ``"decoder"``) that the cache holds, in order: ``["layers.0", "layers.1", ...]``."""
        prefix = f"{stack}.layers." if stack else "layers."
        found = {n[: n.index(".", len(prefix))] for n in self._values if n.startswith(prefix)}
        return sorted(found, key=lambda path: int(path[len(prefix) :]))

    def layer(self, index: int, stack: str = "") -> str:
        """The path of layer ``index`` of ``stack`` (negative counts from the end).

        Raises:
            IndexError: no such layer (one line naming how many the stack has).
        """
        paths = self.layers(stack)
        if not -len(paths) <= index < len(paths):
            where = f"the {stack} stack" if stack else "the model"
            raise IndexError(f"layer {index} out of range: {where} has {len(paths)} layers")
        return paths[index]

    def residual_stream(self, stack: str = "") -> torch.Tensor:
        """``(n_layers + 1, B, T, D)``: the stream entering layer 0, then leaving each layer."""
        paths = self.layers(stack)
        if not paths:
            raise KeyError(f"no layers recorded under {stack or 'the model'!r}")
        return torch.stack([self[f"{paths[0]}.resid_pre"]] + [self[f"{p}.resid_post"] for p in paths])


def _store(values: dict[str, torch.Tensor], name: str, value: Any) -> None:
    if isinstance(value, tuple) and value and isinstance(value[0], torch.Tensor):
        value = value[0]  # (output, attention weights) and (memory, weights): the output
    if isinstance(value, torch.Tensor):
        values[name] = value.detach()
    elif hasattr(value, "logits") and isinstance(value.logits, torch.Tensor):
        values[name] = value.logits.detach()


def _hooks(path: str, module: nn.Module, values: dict[str, torch.Tensor]) -> list[Any]:
    """Register the hooks of one module of the model; return their handles."""
    parent, _, leaf = path.rpartition(".")

    def output_as(target: nn.Module, name: str, pick: Callable[[Any], Any] = lambda out: out) -> Any:
        return target.register_forward_hook(lambda _m, _args, out: _store(values, name, pick(out)))

    def input_as(target: nn.Module, name: str) -> Any:
        return target.register_forward_pre_hook(lambda _m, args: _store(values, name, args[0]))

    if isinstance(module, (SelfAttentionLayer, DecoderLayer)):
        return [input_as(module, f"{path}.resid_pre"), output_as(module, f"{path}.resid_post")]
    if isinstance(module, ResidualNorm) and leaf in _BLOCKS:
        sub = f"{parent}.{_BLOCKS[leaf]}"
        return [
            output_as(module, f"{sub}.resid_post"),
            input_as(module.norm, f"{sub}.norm_in"),
            output_as(module.norm, f"{sub}.norm_out"),
        ]
    if isinstance(module, MultiHeadAttention):

        def heads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
            values.update({f"{path}.q": q.detach(), f"{path}.k": k.detach(), f"{path}.v": v.detach()})

        def z(_m: nn.Module, args: tuple) -> None:
            b, t, _ = args[0].shape
            values[f"{path}.z"] = args[0].detach().view(b, t, module.n_heads, module.d_k)

        module.on_heads = heads
        return [
            output_as(module, f"{path}.out"),  # (output, weights): _store keeps the output
            output_as(module, f"{path}.pattern", lambda out: out[1]),  # None without weights: not stored
            module.w_o.register_forward_pre_hook(z),
        ]
    if isinstance(module, PositionwiseFeedForward):
        return [
            output_as(module, f"{path}.out"),
            output_as(module.w_1, f"{path}.pre"),
            input_as(module.w_2, f"{path}.hidden"),
        ]
    return []


def _parts(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """The model's parts recorded under their own path: children of the model and of its
    encoder and decoder stacks that are neither layers nor containers."""
    for name, child in model.named_children():
        if isinstance(child, _SKIP) or name in ("layers", "rotary"):
            continue
        if name in ("encoder", "decoder") and hasattr(child, "layers"):
            for sub, grandchild in child.named_children():
                if not isinstance(grandchild, _SKIP):
                    yield f"{name}.{sub}", grandchild
        yield name, child


@contextmanager
def record_activations(model: nn.Module) -> Iterator[ActivationCache]:
    """Record the named intermediates of every forward call of ``model`` inside the block.

    ``with record_activations(model) as cache: model.decode(...)``: any method of the model
    (``encode``, ``decode``, one KV-cached step) is recorded; a name called twice keeps the
    last call's value. Hooks are removed on leaving the block, even on an error.
    """
    values: dict[str, torch.Tensor] = {}
    handles: list[Any] = []
    attention = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    try:
        for path, module in model.named_modules():
            handles += _hooks(path, module, values)
        for path, part in _parts(model):
            handles.append(
                part.register_forward_hook(lambda _m, _a, out, path=path: _store(values, path, out))
            )
        handles.append(model.register_forward_hook(lambda _m, _a, out: _store(values, "logits", out)))
        yield ActivationCache(values)
    finally:
        for handle in handles:
            handle.remove()
        for module in attention:
            module.on_heads = None


def run_with_cache(model: nn.Module, *args: Any, **kwargs: Any) -> tuple[Any, ActivationCache]:
    """``model(*args, **kwargs)`` and every named intermediate of that call.

    Asks for attention weights (``need_weights=True``, so ``pattern`` is recorded) when the
    model's ``forward`` takes them and the call did not say. Runs in the current grad mode and
    the model's current mode (call ``model.eval()`` first for inference numbers).

    Returns:
        ``(output, cache)``: the model's own output and an :class:`ActivationCache`.

    Example: ``out, cache = run_with_cache(lm, tokens)``;
    ``cache["layers.0.ffn.hidden"]`` is ``(B, T, d_ff)``.
    """
    if "need_weights" not in kwargs and "need_weights" in inspect.signature(model.forward).parameters:
        kwargs["need_weights"] = True
    with record_activations(model) as cache:
        output = model(*args, **kwargs)
    return output, cache


def readout(model: nn.Module) -> tuple[str, Callable[[torch.Tensor], torch.Tensor]]:
    """Where the logit lens reads a model: ``(stack, head)``, the stack whose layers feed the
    output (``""``, ``"decoder"``) and the model's own function from a residual stream
    ``(B, T, D)`` to its logits (final norm, then the output head; the ViT pools first, the
    encoder reads its masked-token head, the diffusion LM never predicts its mask token).

    Raises:
        ValueError: a model with no output head over its layers (the RNN baseline has no
            residual stream).
    """
    if isinstance(model, DiffusionLM):
        return "", lambda h: model.logits(model.final_norm(h))
    if isinstance(model, DecoderLM):
        return "", lambda h: model.lm_head(model.final_norm(h))
    if isinstance(model, EncoderModel):
        return "", lambda h: model.mlm_logits(model.final_norm(h))
    if isinstance(model, VisionTransformer):
        return "", lambda h: model.head(model.pool(model.final_norm(h)))
    if isinstance(model, (Transformer, CaptionModel)):
        return "decoder", lambda h: model.generator(model.decoder.final_norm(h))
    raise ValueError(f"{type(model).__name__} has no residual stream to read logits from")


@torch.no_grad()
def logit_lens(model: nn.Module, cache: ActivationCache) -> torch.Tensor:
    """The model's output head applied to the residual stream after each layer (the logit
    lens: nostalgebraist 2020): ``(n_layers, B, T, V)`` logits (the ViT: ``(n_layers, B,
    num_labels)``); the last layer's row is the model's own logits.

    Raises:
        ValueError: a model :func:`readout` cannot read. KeyError: ``cache`` is not of a
            forward pass through the stack that feeds the output.
    """
    stack, head = readout(model)
    paths = cache.layers(stack)
    if not paths:
        raise KeyError(f"the cache holds no layers of {stack or 'the model'!r}: record a forward pass first")
    return torch.stack([head(cache[f"{path}.resid_post"]) for path in paths])
