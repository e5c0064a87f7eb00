"""The common "what if" experiments, written as hooks on the hook points (:mod:`qkv.explain.hooks`).

- :func:`ablate_heads`: a head's output (``z``, before ``W_O``: Vaswani et al. 2017, §3.2.2) set
  to zero or to its mean (head ablation: Michel et al. 2019, §3; mean ablation: Wang et al.
  2022, §3.1).
- :func:`ablate_neurons`: FFN hidden units (Eq. 2's ``max(0, xW_1 + b_1)``, §3.3) set to zero or
  their mean.
- :func:`patch_from`: a point's value taken from another input's run (activation patching,
  causal tracing: Meng et al. 2022, §2.1; Wang et al. 2022, §3.2).
- :func:`steer`: a vector added to a point (activation addition: Turner et al. 2023, §2).
- :func:`activation_patching`: patch each layer (and each position or head) from a clean run
  into a corrupted one and tabulate a metric of the output, in the manner of TransformerLens's
  ``patching`` utilities (``get_act_patch_resid_pre``, ``get_act_patch_attn_head_out_all_pos``).

Each helper returns a list of :data:`~qkv.explain.hooks.HookSpec` for
:func:`~qkv.explain.hooks.run_with_hooks` or :func:`~qkv.explain.hooks.hooked`, so it runs in
the model's own forward pass: there is no second code path. Ablating head 3 of layer 5::

    logits = run_with_hooks(gpt2, tokens, hooks=ablate_heads("layers.5.self_attn", 3)).logits
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from .activations import record_activations
from .hooks import HookSpec, hooked

__all__ = [
    "PatchingTable",
    "ablate_heads",
    "ablate_neurons",
    "activation_patching",
    "patch_from",
    "point_axes",
    "steer",
]

Mode = Literal["zero", "mean"]
Indices = int | Sequence[int] | None

# hook point → (token axis, head axis): where positions and heads sit in its value
_HEAD_AXES = {"q": (2, 1), "k": (2, 1), "v": (2, 1), "scores": (2, 1), "pattern": (2, 1), "z": (1, 2)}


def point_axes(name: str) -> tuple[int, int | None]:
    """``(token axis, head axis or None)`` of a hook point's value: ``z (B, T, H, d_k)`` →
    ``(1, 2)``; ``q``/``k``/``v (B, H, T, d_k)`` and ``scores``/``pattern (B, H, Tq, Tk)``
    (query positions) → ``(2, 1)``; the residual stream and the others ``(B, T, ...)`` →
    ``(1, None)``."""
    return _HEAD_AXES.get(name.rpartition(".")[2], (1, None))


def _mask(value: torch.Tensor, chosen: Mapping[int, Indices]) -> torch.Tensor:
    """A boolean mask broadcastable to ``value``: true where every ``axis`` of ``chosen`` is at
    one of its indices (``None``: any index)."""
    mask = torch.ones([1] * value.dim(), dtype=torch.bool, device=value.device)
    for axis, which in chosen.items():
        if which is None:
            continue
        size = value.size(axis)
        picked = [which] if isinstance(which, int) else list(which)
        bad = [i for i in picked if not -size <= i < size]
        if bad:
            raise IndexError(f"index {bad[0]} out of range for an axis of size {size}")
        shape = [1] * value.dim()
        shape[axis] = size
        along = torch.zeros(size, dtype=torch.bool, device=value.device)
        along[picked] = True
        mask = mask & along.view(shape)
    return mask


def _set(
    mode: Mode, unit_axis: int, units: Indices, token_axis: int, positions: Indices, mean: torch.Tensor | None
) -> Callable:
    """A hook setting ``units`` (at ``positions``) of a value to zero or to their mean: ``mean``
    when given (broadcastable to the value), else the mean over the batch and the positions of
    the run."""
    if mode not in ("zero", "mean"):
        raise ValueError(f"unknown ablation mode {mode!r}; choose 'zero' or 'mean'")

    def hook(value: torch.Tensor, _name: str) -> torch.Tensor:
        mask = _mask(value, {unit_axis: units, token_axis: positions})
        if mode == "zero":
            ablated = torch.zeros_like(value)
        else:
            ablated = value.mean(dim=(0, token_axis), keepdim=True) if mean is None else mean.to(value)
        return torch.where(mask, ablated, value)

    return hook


def ablate_heads(
    attention: str,
    heads: int | Sequence[int],
    mode: Mode = "zero",
    positions: Indices = None,
    mean: torch.Tensor | None = None,
) -> list[HookSpec]:
    """Hooks that ablate ``heads`` of the attention sub-layer ``attention`` (a path such as
    ``"layers.5.self_attn"`` or ``"decoder.layers.0.cross_attn"``): their outputs ``z``
    ``(B, T, H, d_k)`` (before ``W_O``) set to zero, or to their mean (``mode="mean"``): over
    the batch and the positions of the run, or ``mean`` ``(H, d_k)`` when given (a mean taken
    on other inputs, or a fixed one for decoding steps, which see one position each), at
    ``positions`` (default: every position).

    Zeroing every head of a layer leaves only ``W_O``'s bias: the sub-layer's contribution to
    the residual stream, less its bias (tested against removing the sub-layer by hand).

    Raises:
        ValueError: an unknown ``mode``. IndexError (during the run): a head or position out of range.
    """
    return [(f"{attention}.z", _set(mode, 2, heads, 1, positions, mean))]


def ablate_neurons(
    ffn: str,
    neurons: int | Sequence[int],
    mode: Mode = "zero",
    positions: Indices = None,
    mean: torch.Tensor | None = None,
) -> list[HookSpec]:
    """Hooks that ablate hidden units ``neurons`` of the FFN ``ffn`` (a path such as
    ``"layers.2.ffn"``): its hidden activations ``(B, T, d_ff)`` (Eq. 2 after the activation,
    before ``W_2``) set to zero or to their mean: over the batch and the positions of the run,
    or ``mean`` ``(d_ff,)`` when given; at ``positions`` (default: every position).

    Raises:
        ValueError: an unknown ``mode``. IndexError (during the run): a unit or position out of range.
    """
    return [(f"{ffn}.hidden", _set(mode, 2, neurons, 1, positions, mean))]


def patch_from(
    source: Mapping[str, torch.Tensor],
    names: str | Iterable[str],
    positions: Indices = None,
    heads: Indices = None,
) -> list[HookSpec]:
    """Hooks that replace each point of ``names`` by its value in ``source`` (an
    :class:`~qkv.explain.activations.ActivationCache` of another input's run: activation
    patching), at ``positions`` and ``heads`` only when given (see :func:`point_axes`).

    The two runs must have the same shapes at the patched points (pad the inputs to one length).

    Raises:
        KeyError: a name ``source`` does not hold. ValueError (during the run): a shape mismatch.
        IndexError (during the run): a position or head out of range.
    """
    chosen = [names] if isinstance(names, str) else list(names)

    def hook_for(name: str) -> Callable:
        patch = source[name]
        token_axis, head_axis = point_axes(name)
        if heads is not None and head_axis is None:
            raise ValueError(f"{name!r} has no head axis to patch heads of")

        def hook(value: torch.Tensor, _name: str) -> torch.Tensor:
            if patch.shape != value.shape:
                raise ValueError(
                    f"cannot patch {name!r}: the source holds {tuple(patch.shape)}, "
                    f"this run {tuple(value.shape)}"
                )
            chosen = (
                {token_axis: positions} if head_axis is None else {token_axis: positions, head_axis: heads}
            )
            return torch.where(_mask(value, chosen), patch.to(value), value)

        return hook

    return [(name, hook_for(name)) for name in chosen]


def steer(name: str, vector: torch.Tensor, scale: float = 1.0, positions: Indices = None) -> list[HookSpec]:
    """A hook that adds ``scale · vector`` to the point ``name`` (usually a residual stream,
    ``"layers.3.resid_post"``) at ``positions`` (default: every position): a steering vector
    (activation addition, Turner et al. 2023, §2). ``vector``: ``(D,)``, the value's last axis.

    Raises:
        ValueError (during the run): ``vector`` does not match the value's last axis.
    """

    def hook(value: torch.Tensor, _name: str) -> torch.Tensor:
        if vector.shape != value.shape[-1:]:
            raise ValueError(
                f"a steering vector for {name!r} has shape {tuple(value.shape[-1:])}, "
                f"got {tuple(vector.shape)}"
            )
        return value + _mask(value, {1: positions}) * (scale * vector.to(value))

    return [(name, hook)]


@dataclass(frozen=True)
class PatchingTable:
    """The metric of a corrupted run with one point patched from the clean run, per layer and
    per position (or head).

    Attributes:
        values: ``(n_layers, n_columns)`` float32: the metric with that layer's point patched
            at that position (or head).
        rows: the layer paths (``"layers.0"``, ...). columns: ``"0"``, ``"1"``, ... (positions)
            or ``"head 0"``, ... (heads).
        point: the patched point under each layer (``"resid_pre"``, ``"self_attn.z"``, ...).
        clean, corrupted: the metric of the two runs without patching.
    """

    values: torch.Tensor
    rows: list[str]
    columns: list[str]
    point: str
    clean: float
    corrupted: float

    def normalised(self) -> torch.Tensor:
        """``(values - corrupted) / (clean - corrupted)``: 0 = no effect, 1 = the clean
        run's metric restored (TransformerLens's convention). Raises ``ZeroDivisionError``
        when the two runs' metrics are equal."""
        if self.clean == self.corrupted:
            raise ZeroDivisionError("the clean and corrupted runs have the same metric: nothing to restore")
        return (self.values - self.corrupted) / (self.clean - self.corrupted)


def _args(inputs: Any) -> tuple:
    return inputs if isinstance(inputs, tuple) else (inputs,)


@torch.no_grad()
def activation_patching(
    model: nn.Module,
    clean: Any,
    corrupted: Any,
    metric: Callable[[Any], float | torch.Tensor],
    point: str = "resid_pre",
    stack: str = "",
    by: Literal["position", "head"] = "position",
) -> PatchingTable:
    """Patch ``point`` of each layer of ``stack`` from the clean run into the corrupted run, one
    position (or head) at a time, and tabulate ``metric`` of the output (activation patching:
    Meng et al. 2022, §2.1; Wang et al. 2022, §3.2; TransformerLens's ``patching`` utilities).

    Args:
        model: any qkv model (call ``model.eval()`` first).
        clean, corrupted: the model's inputs, a tensor or a tuple of positional arguments
            (``(src, tgt)`` for the translator), with the same shapes.
        metric: the model's output → a number (e.g. the logit difference of two answers at the
            last position).
        point: the point under each layer: ``"resid_pre"``, ``"resid_post"``,
            ``"self_attn.out"``, ``"ffn.out"``, ``"self_attn.z"``, ``"cross_attn.pattern"``, ...
        stack: ``""`` (the model's own ``layers``), ``"encoder"`` or ``"decoder"``.
        by: ``"position"`` (one cell per position of the point's token axis) or ``"head"``
            (one cell per head, every position; points with a head axis).

    Returns:
        A :class:`PatchingTable` of ``n_layers × positions`` (or ``× heads``), run by run: one
        forward pass per cell.

    Raises:
        ValueError: no layer of ``stack`` has ``point``; ``by="head"`` on a point without heads.
    """
    clean_args, corrupted_args = _args(clean), _args(corrupted)
    suffix = f".{point}"
    with record_activations(model, lambda name: name.endswith(suffix)) as cache:
        clean_metric = float(metric(model(*clean_args)))
    corrupted_metric = float(metric(model(*corrupted_args)))
    rows = [layer for layer in cache.layers(stack) if f"{layer}{suffix}" in cache]
    if not rows:
        raise ValueError(f"no layer of {stack or 'the model'!r} has a point {point!r}")
    token_axis, head_axis = point_axes(point)
    sample = cache[f"{rows[0]}{suffix}"]
    if by == "head":
        if head_axis is None:
            raise ValueError(f"{point!r} has no heads: patch it by position")
        columns = [f"head {h}" for h in range(sample.size(head_axis))]
    else:
        columns = [str(p) for p in range(sample.size(token_axis))]
    values = torch.zeros(len(rows), len(columns))
    for i, layer in enumerate(rows):
        for j in range(len(columns)):
            where = {"heads": [j]} if by == "head" else {"positions": [j]}
            with hooked(model, patch_from(cache, f"{layer}{suffix}", **where)):
                values[i, j] = float(metric(model(*corrupted_args)))
    return PatchingTable(values, rows, columns, point, clean_metric, corrupted_metric)
