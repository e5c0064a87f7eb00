"""Hook points: every named activation of a forward pass, read and replaced while the model runs.

Interpretability asks "what if": zero a head, patch the residual stream of one input into
another's run, add a steering vector, and watch the output (activation patching and causal
tracing: Meng et al. 2022, §2.1; Wang et al. 2022, §3). Each name of the activation table
(:mod:`qkv.explain.activations`) is a *hook point*, in the manner of TransformerLens's
``HookPoint`` (Nanda & Bloom 2022): a function ``fn(value, name)`` attached to it is called with
the value as the model computes it, and what it returns (a tensor of the same shape) is used
instead; ``None`` leaves the value as it is. Recording (:func:`~qkv.explain.activations.
run_with_cache`) is the read-only case of the same mechanism.

The points sit on the model's own modules (PyTorch's forward hooks and pre-hooks, which may
replace a module's input or output) and, inside attention, on :class:`~qkv.nn.attention.
HeadHook` (Q, K, V, the scores, the pattern, each head's output): there is no second code path,
and a model with no hook installed runs exactly as before. A hook on ``scores`` or ``pattern``
makes that attention module compute Eq. 1 explicitly (the fused kernel never forms the
weights), which changes its output in the last bits only.

Roles: a model may declare ``hook_roles``, a class attribute of ``(method, role)`` pairs
(the translator: ``encode`` is ``src``, ``decode`` is ``tgt``). The parts that the calls of
several roles share, its one positional table and an embedding shared by the roles' stacks,
are then named by the role of the call (``src_embed`` / ``tgt_embed``, ``src_positional`` /
``tgt_positional``). A position table ``(T, D)`` is handed to hooks as ``(1, T, D)``.
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, is_dataclass, replace
from typing import Any

import torch
from torch import nn

from ..nn.attention import HeadHook, MultiHeadAttention
from ..nn.feedforward import PositionwiseFeedForward
from ..nn.layers import DecoderLayer, SelfAttentionLayer
from ..nn.norms import ResidualNorm

__all__ = ["HEAD_POINTS", "Hook", "HookSpec", "hook_points", "hooked", "run_with_hooks"]

Hook = Callable[[torch.Tensor, str], "torch.Tensor | None"]
"""``fn(value, name) -> replacement or None``: called with a hook point's value (see the
activation table for its shape) and its name; a returned tensor of the same shape replaces the
value in the forward pass, ``None`` keeps it."""

HookSpec = tuple["str | Callable[[str], bool]", Hook]
"""``(name or filter, fn)``: the point named, or every point whose name the filter accepts."""

HEAD_POINTS = ("q", "k", "v", "scores", "pattern", "z")
"""The points inside one attention call (:class:`~qkv.nn.attention.HeadHook`)."""
# a hook on one of these makes the attention module take the explicit path of Eq. 1
_WEIGHT_POINTS = ("scores", "pattern")
# the residual wrapper of each sub-layer, and the name of the sub-layer it wraps
_BLOCKS = {"self_attn_block": "self_attn", "cross_attn_block": "cross_attn", "ffn_block": "ffn"}
# parts recorded under their own path: containers and regularisers are not values to look at
_SKIP = (nn.ModuleList, nn.ModuleDict, nn.Dropout)


@dataclass(frozen=True)
class _Site:
    """A point on a module's input (``pre``) or output: its name by the call's role (``None``:
    the only name, or a call outside ``encode``/``decode``)."""

    module: nn.Module
    names: Mapping[str | None, str]
    pre: bool = False
    table: bool = False  # a (T, D) position table, handed out as (1, T, D)


def _layer_sites(path: str, module: nn.Module) -> list[_Site]:
    """The points of one module of a layer (the layer itself, a residual wrapper, the FFN)."""
    parent, _, leaf = path.rpartition(".")
    if isinstance(module, (SelfAttentionLayer, DecoderLayer)):
        return [
            _Site(module, {None: f"{path}.resid_pre"}, pre=True),
            _Site(module, {None: f"{path}.resid_post"}),
        ]
    if isinstance(module, ResidualNorm) and leaf in _BLOCKS:
        sub = f"{parent}.{_BLOCKS[leaf]}"
        return [
            _Site(module.norm, {None: f"{sub}.norm_in"}, pre=True),
            _Site(module.norm, {None: f"{sub}.norm_out"}),
            _Site(module, {None: f"{sub}.resid_post"}),
        ]
    if isinstance(module, MultiHeadAttention):
        return [_Site(module, {None: f"{path}.out"})]  # the inside: HeadHook
    if isinstance(module, PositionwiseFeedForward):
        return [
            _Site(module.w_1, {None: f"{path}.pre"}),
            _Site(module.w_2, {None: f"{path}.hidden"}, pre=True),
            _Site(module, {None: f"{path}.out"}),
        ]
    return []


def _hook_roles(model: nn.Module) -> dict[str, str]:
    """The model's ``hook_roles`` (see the module docstring): method name → role."""
    return dict(getattr(type(model), "hook_roles", ()))


def _roles(model: nn.Module, path: str) -> dict[str | None, str]:
    """The names of a part by role: with ``hook_roles``, the positional table and an embedding
    shared by the roles' stacks (``src_embed is tgt_embed``: one module called by both) are
    named by the stack they feed."""
    roles = list(_hook_roles(model).values())
    embeds = [f"{role}_embed" for role in roles]
    if roles and path == "positional":
        return {None: "positional", **{role: f"{role}_positional" for role in roles}}
    if path in embeds and all(getattr(model, name, None) is getattr(model, path) for name in embeds):
        return {None: path, **dict(zip(roles, embeds, strict=True))}
    return {None: path}


def _part_sites(model: nn.Module) -> list[_Site]:
    """The model's parts recorded under their own path: children of the model and of its
    encoder and decoder stacks that are neither layers nor containers; then ``logits``."""
    sites = []
    for name, child in model.named_children():
        if isinstance(child, _SKIP) or name in ("layers", "rotary"):
            continue
        if name in ("encoder", "decoder") and hasattr(child, "layers"):
            for sub, grandchild in child.named_children():
                if not isinstance(grandchild, _SKIP):
                    sites.append(_Site(grandchild, {None: f"{name}.{sub}"}))
        sites.append(_Site(child, _roles(model, name), table=name == "positional"))
    return [*sites, _Site(model, {None: "logits"})]


def _sites(model: nn.Module) -> tuple[list[_Site], dict[str, MultiHeadAttention]]:
    """Every module-level point of ``model``, and its attention modules by path."""
    sites: list[_Site] = []
    attention: dict[str, MultiHeadAttention] = {}
    for path, module in model.named_modules():
        sites += _layer_sites(path, module)
        if isinstance(module, MultiHeadAttention):
            attention[path] = module
    return sites + _part_sites(model), attention


def _site_names(site: _Site) -> list[str]:
    roles = [name for role, name in site.names.items() if role is not None]
    return roles or [site.names[None]]


def hook_points(model: nn.Module) -> list[str]:
    """The names of every hook point of ``model`` (no forward pass needed), roughly in the order
    a forward pass reaches them: each layer's points, then the other parts and ``logits``.

    Example: ``"layers.5.self_attn.z" in hook_points(gpt2)``.
    """
    return _names(*_sites(model))


def _names(sites: list[_Site], attention: dict[str, MultiHeadAttention]) -> list[str]:
    """The point names of ``sites`` and of the attention modules' insides, without repeats."""
    names = [name for site in sites for name in _site_names(site)]
    names += [f"{path}.{point}" for path in attention for point in HEAD_POINTS]
    return list(dict.fromkeys(names))


def _main(out: Any) -> Any:
    """The value a module's output stands for: a tensor, the first of a tuple (output and
    attention weights), or an output object's ``logits``."""
    if isinstance(out, tuple) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    if not isinstance(out, torch.Tensor) and isinstance(getattr(out, "logits", None), torch.Tensor):
        return out.logits
    return out


def _swap(out: Any, new: torch.Tensor) -> Any:
    """``out`` with its main value (see :func:`_main`) replaced by ``new``."""
    if isinstance(out, tuple):
        return (new, *out[1:])
    if isinstance(out, torch.Tensor):
        return new
    if is_dataclass(out) and not isinstance(out, type):
        return replace(out, logits=new)
    out.logits = new
    return out


class _Dispatch:
    """The hooks of one :func:`hooked` block by point name, and the call that runs them."""

    def __init__(self, model: nn.Module, names: list[str], specs: Iterable[HookSpec]) -> None:
        self.by_name: dict[str, list[Hook]] = {}
        for target, fn in specs:
            if isinstance(target, str):
                if target not in names:
                    close = difflib.get_close_matches(target, names, n=3)
                    hint = (
                        f"; did you mean {', '.join(close)}?" if close else f" (it has {len(names)} points)"
                    )
                    raise ValueError(f"unknown hook point {target!r} for {type(model).__name__}{hint}")
                chosen = [target]
            elif callable(target):
                chosen = [name for name in names if target(name)]
            else:
                raise TypeError(f"a hook's target is a point name or a filter function, got {target!r}")
            if not callable(fn):
                raise TypeError(f"the hook for {target!r} is not callable: {fn!r}")
            for name in chosen:
                self.by_name.setdefault(name, []).append(fn)

    def fire(self, name: str, value: torch.Tensor) -> torch.Tensor:
        """``value`` passed through the hooks of ``name`` in order (each may replace it)."""
        for fn in self.by_name.get(name, ()):
            new = fn(value, name)
            if new is None:
                continue
            if not isinstance(new, torch.Tensor) or new.shape != value.shape:
                got = tuple(new.shape) if isinstance(new, torch.Tensor) else type(new).__name__
                raise ValueError(
                    f"the hook on {name!r} returned {got}; it must return {tuple(value.shape)} or None"
                )
            value = new
        return value


def _register(site: _Site, dispatch: _Dispatch, role: list[str | None]) -> Any:
    """Install PyTorch's hook for one site; return its handle."""

    def passed(value: Any) -> Any:
        name = site.names.get(role[0], site.names[None])
        if not isinstance(value, torch.Tensor) or name not in dispatch.by_name:
            return None
        shown = value.unsqueeze(0) if site.table and value.dim() == 2 else value
        new = dispatch.fire(name, shown)
        if new is shown:
            return None  # unchanged: the module's own output object goes on
        return new.squeeze(0) if shown is not value else new

    if site.pre:

        def pre_hook(_m: nn.Module, args: tuple) -> tuple | None:
            new = passed(args[0]) if args else None
            return None if new is None else (new, *args[1:])

        return site.module.register_forward_pre_hook(pre_hook)

    def hook(_m: nn.Module, _args: tuple, out: Any) -> Any:
        new = passed(_main(out))
        return None if new is None else _swap(out, new)

    return site.module.register_forward_hook(hook)


@contextmanager
def _role_tracking(model: nn.Module) -> Iterator[list[str | None]]:
    """A cell holding the role of the call in progress (``"src"`` inside the translator's
    ``encode``, ``"tgt"`` inside its ``decode``: the model's ``hook_roles``), set by wrapping
    those methods on the instance for the block (restored on exit, nested blocks included)."""
    role: list[str | None] = [None]
    roles = _hook_roles(model)
    if not roles:
        yield role
        return
    saved = {name: model.__dict__.get(name) for name in roles}

    def wrap(method: Callable[..., Any], name: str) -> Callable[..., Any]:
        @functools.wraps(method)
        def call(*args: Any, **kwargs: Any) -> Any:
            outer, role[0] = role[0], name
            try:
                return method(*args, **kwargs)
            finally:
                role[0] = outer

        return call

    try:
        for name, tag in roles.items():
            setattr(model, name, wrap(getattr(model, name), tag))
        yield role
    finally:
        for name, before in saved.items():
            if before is None:
                model.__dict__.pop(name, None)
            else:
                model.__dict__[name] = before


@contextmanager
def hooked(model: nn.Module, hooks: Iterable[HookSpec]) -> Iterator[None]:
    """Attach ``hooks`` to ``model``'s hook points for every forward call inside the block
    (``model(...)``, ``encode``, ``decode``, a KV-cached decoding step, a whole beam search).

    ``hooks``: pairs ``(name or filter, fn)`` (:data:`HookSpec`, :data:`Hook`); several hooks on
    one point run in the order given, each seeing the previous one's value. The hooks are
    removed on leaving the block, even on an error; blocks nest (the inner block's hooks run
    after the outer's).

    Raises:
        ValueError: a name that is not a hook point of ``model`` (one line naming the closest),
            or, during the forward pass, a hook that returned a tensor of another shape.
        TypeError: a target that is neither a name nor a function, or a hook that is not callable.
    """
    sites, attention = _sites(model)
    dispatch = _Dispatch(model, _names(sites, attention), list(hooks))
    with ExitStack() as stack:
        role = stack.enter_context(_role_tracking(model))
        for site in sites:
            if any(name in dispatch.by_name for name in site.names.values()):
                stack.callback(_register(site, dispatch, role).remove)
        for path, module in attention.items():
            wanted = {p for p in HEAD_POINTS if f"{path}.{p}" in dispatch.by_name}
            if wanted:
                head_hook = HeadHook(
                    functools.partial(lambda p, point, value: dispatch.fire(f"{p}.{point}", value), path),
                    weights=bool(wanted & set(_WEIGHT_POINTS)),
                )
                module.head_hooks.append(head_hook)
                stack.callback(module.head_hooks.remove, head_hook)
        yield


def run_with_hooks(model: nn.Module, *args: Any, hooks: Iterable[HookSpec] = (), **kwargs: Any) -> Any:
    """``model(*args, **kwargs)`` with ``hooks`` attached (see :func:`hooked`); returns the
    model's own output.

    Example (zero head 3 of layer 5, in the manner of TransformerLens's ``run_with_hooks``)::

        def zero_head(z, name):  # z: (B, T, H, d_k)
            z = z.clone(); z[:, :, 3] = 0; return z
        logits = run_with_hooks(lm, tokens, hooks=[("layers.5.self_attn.z", zero_head)]).logits

    (:func:`qkv.explain.interventions.ablate_heads` writes that hook for you.)

    Raises:
        ValueError: a name that is not a hook point, or a hook that returned another shape.
        TypeError: a target that is neither a name nor a function, or a hook not callable.
    """
    with hooked(model, hooks):
        return model(*args, **kwargs)
