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
| ``S.scores`` | ``(B, H, Tq, Tk)`` | QKᵀ/√d_k, illegal connections at the dtype's minimum (§3.2.3) |
| ``S.pattern`` | ``(B, H, Tq, Tk)`` | softmax of the scores (Eq. 1); rows sum to 1 |
| ``S.z`` | ``(B, Tq, H, d_k)`` | each head's output, before ``W_O`` (§3.2.2) |
| ``S.out`` | ``(B, T, D)`` | the sub-layer's output (attention after ``W_O``; FFN: Eq. 2) |
| ``L.ffn.pre`` | ``(B, T, d_ff)`` | ``x W_1 + b_1``, before the activation |
| ``L.ffn.hidden`` | ``(B, T, d_ff)`` | the FFN's hidden activations (its "neurons") |
| ``S.resid_post`` | ``(B, T, D)`` | the stream after the sub-layer's residual add (and norm, post-LN) |
| ``L.resid_post`` | ``(B, T, D)`` | the stream leaving the layer |

Besides the layers, the output of each other part of the model is recorded under its path:
``embed`` / ``patch_embed`` (token or patch embeddings), ``positional`` (the position encodings
added to them, ``(1, T, D)``), ``embed_norm``, ``final_norm`` (``encoder.final_norm``,
``decoder.final_norm``), ``encoder`` (the translator's and captioner's ``memory``), the heads
(``lm_head``, ``generator``, ``mlm_head``, ``head``, ...), and ``logits``, the model's own
output. The translator's embeddings and positions are named by the stack they feed:
``src_embed``, ``tgt_embed``, ``src_positional``, ``tgt_positional`` (a shared embedding too).
:func:`~qkv.explain.hooks.hook_points` lists a model's names.

Every name is a hook point (:mod:`qkv.explain.hooks`): recording is the read-only case of the
same mechanism that replaces values (:func:`~qkv.explain.hooks.run_with_hooks`). The values are
the model's own, from its own forward pass: there is no second code path. Each is a copy
(detached), so a later step cannot change it. A KV-cached decoding step records its one new
position (``k``/``v`` hold every cached key).
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, cast

import torch
from torch import nn

from .hooks import Hook, hooked

__all__ = ["ActivationCache", "logit_lens", "record_activations", "readout", "run_with_cache"]


class ActivationCache(Mapping[str, torch.Tensor]):
    """The named intermediates of one forward pass (see the module's table of names).

    A read-only mapping ``name → tensor`` (detached copies, on the model's device and dtype)
    with helpers for the residual stream. An unknown name (or one that is not a string) raises
    ``KeyError`` with one line that names the closest names the cache has, so ``name in cache``
    and ``cache.get(name)`` answer ``False`` and ``None``.
    """

    def __init__(self, values: dict[str, torch.Tensor] | None = None) -> None:
        self._values: dict[str, torch.Tensor] = {} if values is None else values

    def __getitem__(self, name: str) -> torch.Tensor:
        if not isinstance(name, str):
            raise KeyError(f"activation names are strings such as 'layers.0.resid_post', got {name!r}")
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
            TypeError: ``index`` is not an int. IndexError: no such layer (one line naming how
                many the stack has).
        """
        if not isinstance(index, int) or isinstance(index, bool):
            raise TypeError(f"a layer index is an int, got {index!r}")
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


def _recorder(values: dict[str, torch.Tensor]) -> Hook:
    """A read-only hook that keeps a detached copy of each value (a copy: a value may be a view
    of a buffer the model changes later, as a KV cache's keys are after a beam reorder)."""

    def record(value: torch.Tensor, name: str) -> None:
        values[name] = value.detach().clone()

    return record


@contextmanager
def record_activations(
    model: nn.Module, names_filter: str | Callable[[str], bool] | None = None
) -> Iterator[ActivationCache]:
    """Record the named intermediates of every forward call of ``model`` inside the block.

    ``with record_activations(model) as cache: model.decode(...)``: any method of the model
    (``encode``, ``decode``, one KV-cached step) is recorded; a name called twice keeps the
    last call's value. ``names_filter``: one point's name, or a function choosing the names to
    record (default: every point of :func:`~qkv.explain.hooks.hook_points`). The recording is
    the read-only case of the hook points (:func:`~qkv.explain.hooks.hooked`): recording the
    pattern makes attention compute Eq. 1 explicitly, so ``pattern`` is there for every call,
    cached steps included. Hooks are removed on leaving the block, even on an error.

    Raises:
        ValueError: ``names_filter`` names no hook point of ``model``.
    """
    values: dict[str, torch.Tensor] = {}
    with hooked(model, [(names_filter or (lambda _name: True), _recorder(values))]):
        yield ActivationCache(values)


def run_with_cache(
    model: nn.Module, *args: Any, names_filter: str | Callable[[str], bool] | None = None, **kwargs: Any
) -> tuple[Any, ActivationCache]:
    """``model(*args, **kwargs)`` and every named intermediate of that call (or those that
    ``names_filter`` chooses, as :func:`record_activations`).

    Asks for attention weights (``need_weights=True``) when the model's ``forward`` takes them
    and the call did not say. Runs in the current grad mode and the model's current mode (call
    ``model.eval()`` first for inference numbers).

    Returns:
        ``(output, cache)``: the model's own output and an :class:`ActivationCache`.

    Example: ``out, cache = run_with_cache(lm, tokens)``;
    ``cache["layers.0.ffn.hidden"]`` is ``(B, T, d_ff)``.
    """
    if "need_weights" not in kwargs and "need_weights" in inspect.signature(model.forward).parameters:
        kwargs["need_weights"] = True
    with record_activations(model, names_filter) as cache:
        output = model(*args, **kwargs)
    return output, cache


def readout(model: nn.Module) -> tuple[str, Callable[[torch.Tensor], torch.Tensor]]:
    """Where the logit lens reads a model: ``(stack, head)``, the stack whose layers feed the
    output (the class attribute ``readout_stack``: ``""`` by default, ``"decoder"`` for the
    encoder-decoders) and the model's own ``readout`` method, from a residual stream
    ``(B, T, D)`` to its logits (final norm, then the output head; the ViT pools first, the
    encoder reads its masked-token head, the diffusion LM never predicts its mask token).
    A family declares both on its model class (:mod:`qkv.models.model_types`).

    Raises:
        ValueError: a model with no output head over its layers (no ``readout`` method: the
            RNN baseline has no residual stream).
    """
    # a method of the class: a submodule that happens to be called "readout" is not one
    if not callable(getattr(type(model), "readout", None)):
        raise ValueError(f"{type(model).__name__} has no residual stream to read logits from")
    head = cast(Callable[[torch.Tensor], torch.Tensor], model.readout)
    return getattr(type(model), "readout_stack", ""), head


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
