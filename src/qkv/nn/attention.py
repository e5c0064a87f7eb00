"""Scaled dot-product attention and multi-head attention (with a key/value cache).

Source: Vaswani et al. 2017, §3.2.1 (Eq. 1: ``softmax(QKᵀ / sqrt(d_k)) V``; the dot products
scaled by ``1/sqrt(d_k)``) and §3.2.2 (multi-head attention); lecture notes: "(query, key,
value) and self-attention", "matrix form", "Multi-head Attention".

Mask convention (see :mod:`qkv.nn.masks`): boolean, ``True`` = may attend, broadcastable to
``(B, H, q_len, k_len)``; the argument that carries it is ``attn_mask`` everywhere in this
module (PyTorch's name).

Eq. 1 itself is the body of :func:`scaled_dot_product_attention`. Its intermediates can be read
and replaced while a model runs (:class:`HeadHook`: the hook points of :mod:`qkv.explain.hooks`).
Backends: one computation of Eq. 1 is a function registered under a name
(:func:`register_backend`, :data:`BACKENDS`), which that function dispatches to. This module
registers three: ``"sdpa"``
(:func:`fused_attention`, PyTorch's fused kernel), ``"eager"`` (:func:`eager_attention`, the
explicit path) and ``"invariant"`` (:func:`per_query_attention`: batch-invariant decoding,
inference only, which :func:`~qkv.inference.weight_layout.prepare_for_inference` switches a model to).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .masks import causal_mask, combine_masks

Backend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, bool, float], torch.Tensor]
"""``fn(q, k, v, attn_mask, is_causal, dropout_p) -> output``: Eq. 1 over queries
``q (B, H, Tq, Dh)``, keys ``k`` and values ``v (B, H, Tk, Dh)``, a boolean ``attn_mask``
broadcastable to ``(B, H, Tq, Tk)`` (``True`` = may attend) or ``None``, the look-ahead mask added when
``is_causal`` (queries are the last ``Tq`` positions), dropout ``dropout_p`` on the weights.
Returns ``(B, H, Tq, Dh)`` in ``q``'s dtype; a query row with no legal key gives zeros; raises
``ValueError`` for ``is_causal`` with ``Tk < Tq``. The mask is already checked to be boolean."""

# name → backend; the names MultiHeadAttention and scaled_dot_product_attention accept
BACKENDS: dict[str, Backend] = {}


def register_backend(name: str, fn: Backend) -> None:
    """Make ``fn`` (see :data:`Backend`) available as ``backend=name`` to
    :func:`scaled_dot_product_attention` and :class:`MultiHeadAttention`; a name registered
    again is replaced."""
    BACKENDS[name] = fn


def check_backend(name: str) -> None:
    """Raise ``ValueError`` naming ``name`` and the registered backends unless it is one."""
    if name not in BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; choose one of {tuple(BACKENDS)}")


@dataclass
class AttentionSteps:
    """Every intermediate of Eq. 1 for inspection (all float32 tensors of one call).

    Shapes: ``q (B, H, Tq, Dh)``, ``k``/``v (B, H, Tk, Dh)``, ``scores``/``scaled``/``masked``/
    ``weights (B, H, Tq, Tk)``, ``output (B, H, Tq, Dh)``.
    """

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    scores: torch.Tensor  # Q Kᵀ
    scaled: torch.Tensor  # Q Kᵀ / sqrt(d_k)
    masked: torch.Tensor  # illegal connections set to the dtype's minimum
    weights: torch.Tensor  # softmax over keys (masked entries exactly 0)
    output: torch.Tensor  # weights @ V


Point = Callable[[str, torch.Tensor], torch.Tensor]
"""``point(name, value) -> value``: a named value inside attention (``"q"``, ``"k"``, ``"v"``,
``"scores"``, ``"pattern"``, ``"z"``) handed out while it is computed; what it returns is used
in its place (the same shape)."""


@dataclass(frozen=True)
class HeadHook:
    """A hook on the values inside one :class:`MultiHeadAttention` call, in the manner of
    TransformerLens's ``HookPoint`` (Nanda & Bloom 2022): ``fire(name, value)`` is called with

    - ``"q"`` ``(B, H, Tq, d_k)``, ``"k"``, ``"v"`` ``(B, H, Tk, d_k)``: after ``W_Q``, ``W_K``,
      ``W_V`` (and RoPE), split into heads (§3.2.2); with a KV cache, every cached key (a
      replacement is used by this call only: the cache keeps the computed keys);
    - ``"scores"`` ``(B, H, Tq, Tk)``: ``QKᵀ/√d_k`` with illegal connections set to the dtype's
      minimum (Eq. 1 before the softmax) and ``"pattern"``, its softmax (rows sum to 1): only
      when ``weights`` is true, which makes the call take the explicit path of Eq. 1;
    - ``"z"`` ``(B, Tq, H, d_k)``: each head's output, before ``W_O``;

    and returns the value to use instead (the same tensor to leave it). Installed by appending
    to :attr:`MultiHeadAttention.head_hooks` (:func:`qkv.explain.hooks.hooked` does).
    """

    fire: Point
    weights: bool = True


def attention_steps(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None
) -> AttentionSteps:
    """Eq. 1 step by step: ``softmax(mask(QKᵀ / sqrt(d_k))) V``, returning every intermediate
    (computed by :func:`scaled_dot_product_attention`'s explicit path, which records them).

    Args:
        q: ``(..., Tq, d_k)``; k: ``(..., Tk, d_k)``; v: ``(..., Tk, d_v)``.
        attn_mask: bool, broadcastable to ``(..., Tq, Tk)``, ``True`` = may attend (§3.2.3).

    A query row whose keys are all masked gets all-zero weights (hence a zero output), not NaN.
    """
    record: list[AttentionSteps] = []
    scaled_dot_product_attention(q, k, v, attn_mask, need_weights=True, record=record)
    return record[0]


def scaled_dot_product_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    backend: str = "sdpa",
    need_weights: bool = False,
    *,
    record: list[AttentionSteps] | None = None,
    point: Point | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Attention(Q, K, V) = softmax(Q Kᵀ / sqrt(d_k)) V  (Vaswani et al. 2017, §3.2.1, Eq. 1).

    The body below is Eq. 1, computed step by step (the explicit path): it runs for
    ``need_weights=True`` (so weights are never silently missing) and for ``backend="eager"``.
    Otherwise the call goes to the backend named ``backend`` (:data:`BACKENDS`), which
    computes the same function: ``"sdpa"`` (:func:`fused_attention`, PyTorch's fused kernel,
    the default), ``"eager"`` (:func:`eager_attention`: this body), ``"invariant"``
    (:func:`per_query_attention`, batch-invariant decoding) or one added by
    :func:`register_backend`.

    Args:
        q: queries ``(B, H, Tq, Dh)``; k: keys ``(B, H, Tk, Dh)``; v: values ``(B, H, Tk, Dh)``.
        attn_mask: bool, broadcastable to ``(B, H, Tq, Tk)``, ``True`` = may attend; or
            ``None`` (§3.2.3).
        is_causal: additionally apply the look-ahead mask (queries are the last ``Tq`` positions).
        dropout_p: dropout on the attention weights (training only; the caller passes 0 in eval).
        backend: a name in :data:`BACKENDS` (``"sdpa"``, ``"eager"``, ...).
        need_weights: also return the attention weights ``(B, H, Tq, Tk)``.
        record: a list the explicit path appends this call's :class:`AttentionSteps` to (every
            intermediate, for inspection: :func:`attention_steps`); implies ``need_weights``.
        point: called as ``point("scores", masked scores)`` and ``point("pattern", weights)``
            (see :data:`Point`); what it returns is used instead. Implies ``need_weights``.

    Returns:
        ``(output (B, H, Tq, Dh), weights or None)``. Fully masked query rows give zeros.

    Raises:
        ValueError: unknown backend, a mask that is not boolean, or ``is_causal`` with fewer
            keys than queries.
    """
    check_backend(backend)
    if attn_mask is not None and attn_mask.dtype != torch.bool:
        raise ValueError(f"attention mask must be boolean (True = may attend), got {attn_mask.dtype}")
    if not need_weights and record is None and point is None:
        return BACKENDS[backend](q, k, v, attn_mask, is_causal, dropout_p), None
    if is_causal:  # fold the look-ahead mask in, so the masked scores show it
        attn_mask = combine_masks(attn_mask, causal_mask(q.size(-2), k.size(-2), device=q.device))
    scores = q @ k.transpose(-2, -1)  # Q Kᵀ (..., Tq, Tk)
    scaled = scores / math.sqrt(q.size(-1))  # ÷ sqrt(d_k)
    # illegal connections set to the dtype's minimum ("-inf" in §3.2.3: finite, so no NaN)
    masked = scaled if attn_mask is None else scaled.masked_fill(~attn_mask, torch.finfo(scaled.dtype).min)
    if point is not None:
        masked = point("scores", masked)
    weights = torch.softmax(masked.float(), dim=-1).to(q.dtype)
    if attn_mask is not None:  # a fully masked row would be uniform over illegal keys: zero it
        weights = weights.masked_fill(~attn_mask, 0.0)
    if point is not None:
        weights = point("pattern", weights)
    output = (F.dropout(weights, p=dropout_p) if dropout_p > 0.0 else weights) @ v  # (..., Tq, Dh)
    if record is not None:
        record.append(AttentionSteps(q, k, v, scores, scaled, masked, weights, output))
    return output, weights


# The backends scaled_dot_product_attention dispatches to (signature: Backend), registered
# below under their names.


def eager_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None,
    is_causal: bool,
    dropout_p: float,
) -> torch.Tensor:
    """The ``"eager"`` backend: Eq. 1 as written, the explicit path of
    :func:`scaled_dot_product_attention` (shapes as :data:`Backend`)."""
    return scaled_dot_product_attention(q, k, v, attn_mask, is_causal, dropout_p, need_weights=True)[0]


def fused_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None,
    is_causal: bool,
    dropout_p: float,
) -> torch.Tensor:
    """The ``"sdpa"`` backend: :func:`torch.nn.functional.scaled_dot_product_attention`, PyTorch's
    fused kernel (shapes as :data:`Backend`)."""
    if is_causal and attn_mask is None and q.size(-2) == k.size(-2):
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
    causal = causal_mask(q.size(-2), k.size(-2), device=q.device) if is_causal else None
    if attn_mask is None:  # the look-ahead mask alone leaves every query row a key
        return F.scaled_dot_product_attention(q, k, v, attn_mask=causal, dropout_p=dropout_p)
    attn_mask = attn_mask if causal is None else attn_mask & causal
    # SDPA gives NaN for a query row with no legal key (an empty sequence). Finding such
    # rows would cost a host sync, so instead let them attend to every key (a finite
    # result) and zero their output afterwards.
    has_key = attn_mask.any(-1, keepdim=True)  # (..., Tq, 1)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask | ~has_key, dropout_p=dropout_p)
    return out * has_key


# Batch-invariant decoding (inference only). A fused kernel's summation order depends on how
# many queries and keys share a call, so one query attending over a key/value cache and the
# same query inside a full causal forward can differ in the last bit; in bfloat16 (8-bit
# mantissa) that changes greedy tokens at near-ties. Calling SDPA once per query, over exactly
# the keys it may see, makes each query's output the same bit for bit however the queries are
# batched. A forward over Tq queries makes Tq calls, which is why
# qkv.inference.weight_layout.prepare_for_inference switches a model to it, not training.
def per_query_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None,
    is_causal: bool,
    dropout_p: float,
) -> torch.Tensor:
    """SDPA once per query over its keys (the first ``Tk - Tq + i + 1`` under ``is_causal``),
    its mask row sliced to match (signature: :data:`Backend`).

    Shape: ``q (B, H, Tq, Dh)``, ``k``/``v (B, H, Tk, Dh)``, ``attn_mask`` bool broadcastable to
    ``(B, H, Tq, Tk)`` or ``None`` → ``(B, H, Tq, Dh)``.

    Raises:
        ValueError: ``is_causal`` with ``Tk < Tq`` (as :func:`~qkv.nn.masks.causal_mask`).
    """
    tq, tk = q.size(-2), k.size(-2)
    if is_causal and tk < tq:
        raise ValueError(f"k_len ({tk}) must be >= q_len ({tq})")  # as causal_mask says
    if attn_mask is not None:
        attn_mask = attn_mask.expand(*attn_mask.shape[:-2], tq, tk)
    outs = []
    for i in range(tq):
        end = tk - tq + i + 1 if is_causal else tk
        row = None if attn_mask is None else attn_mask[..., i : i + 1, :end]
        outs.append(
            scaled_dot_product_attention(
                q[..., i : i + 1, :], k[..., :end, :], v[..., :end, :], row, dropout_p=dropout_p
            )[0]
        )
    return outs[0] if tq == 1 else torch.cat(outs, dim=-2)


# The backends, registered here explicitly (no other module registers one as a side effect).
register_backend("sdpa", fused_attention)
register_backend("eager", eager_attention)
register_backend("invariant", per_query_attention)


class KVCache:
    """Keys and values of one attention module kept across decoding steps (inference only).

    ``k``/``v`` have shape ``(B, H, L, Dh)``. Self-attention appends the new steps with
    :meth:`append`; cross-attention stores the encoder memory's once with :meth:`set`.
    Appending writes into a buffer that grows by doubling, so a step copies only its own keys
    and values, not the whole history (``torch.cat`` per step would copy O(L) every step), and
    allocates nothing except when the buffer grows.
    """

    def __init__(self) -> None:
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None
        self._spare: tuple[torch.Tensor, torch.Tensor] | None = None  # reorder's target
        self.length = 0

    @property
    def k(self) -> torch.Tensor | None:
        return None if self._k is None else self._k[:, :, : self.length]

    @property
    def v(self) -> torch.Tensor | None:
        return None if self._v is None else self._v[:, :, : self.length]

    def set(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Replace the contents with ``k``, ``v`` ``(B, H, L, Dh)``."""
        self._k, self._v, self.length = k, v, k.size(2)

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Add ``k``, ``v`` ``(B, H, T, Dh)`` after the cached steps; returns all keys and
        values ``(B, H, L + T, Dh)``."""
        end = self.length + k.size(2)
        # _k and _v are set together (here and in set()): one is None exactly when the other is
        if self._k is None or self._v is None or end > self._k.size(2) or self._k.shape[:2] != k.shape[:2]:
            capacity = max(2 * end, 32)
            old_k, old_v = self.k, self.v
            self._k = k.new_empty(k.size(0), k.size(1), capacity, k.size(3))
            self._v = v.new_empty(v.size(0), v.size(1), capacity, v.size(3))
            if old_k is not None and old_v is not None:
                self._k[:, :, : self.length] = old_k
                self._v[:, :, : self.length] = old_v
        self._k[:, :, self.length : end] = k
        self._v[:, :, self.length : end] = v
        self.length = end
        return self._k[:, :, :end], self._v[:, :, :end]  # self.k, self.v

    def reorder(self, index: torch.Tensor) -> None:
        """Select batch rows (beam search): ``index`` is a long tensor of shape ``(B',)``.

        With the batch size unchanged (every beam search step) the rows are gathered into a
        second buffer of the same capacity, which becomes the cache while the old one waits for
        the next reorder: no allocation per step, and the next append has room.
        """
        buf_k, buf_v = self._k, self._v  # set together: one is None exactly when the other is
        if buf_k is None or buf_v is None:
            return
        n = self.length
        k, v = buf_k[:, :, :n], buf_v[:, :, :n]  # self.k, self.v
        if index.numel() != buf_k.size(0):
            self.set(k.index_select(0, index), v.index_select(0, index))
            return
        if self._spare is None or self._spare[0].shape != buf_k.shape:
            self._spare = (torch.empty_like(buf_k), torch.empty_like(buf_v))
        spare_k, spare_v = self._spare
        torch.index_select(k, 0, index, out=spare_k[:, :, :n])
        torch.index_select(v, 0, index, out=spare_v[:, :, :n])
        self._spare, self._k, self._v = (buf_k, buf_v), spare_k, spare_v


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1..head_h) W_O, head_i = Attention(Q W_Q_i, K W_K_i, V W_V_i).

    Source: Vaswani et al. 2017, §3.2.2; lecture notes ("Multi-head Attention").
    The h per-head matrices ``W_Q_i``, ``W_K_i``, ``W_V_i`` (each ``d_model × d_k``) are stored
    stacked, and the projections of one input are packed into one ``nn.Linear``, so they run as
    one matrix multiply (the layout of ``torch.nn.MultiheadAttention.in_proj_weight``):

    - self-attention (``cross=False``): ``w_qkv = nn.Linear(D, 3·H·d_k)``; output rows
      ``[0, H·d_k)`` are Q (head i at rows ``i·d_k ... (i+1)·d_k``), then K, then V;
    - cross-attention (``cross=True``): ``w_q = nn.Linear(D, H·d_k)`` on the decoder side and
      ``w_kv = nn.Linear(D, 2·H·d_k)`` (K rows, then V rows) on the encoder memory;
    - ``w_o = nn.Linear(H·d_k, D)`` (``W_O``).

    (Weights saved by earlier versions, with separate ``w_q``/``w_k``/``w_v``, are rewritten
    to this layout by :func:`qkv.compat.pack_old_projections` as a model loads them.)

    Args:
        d_model: model width D.
        n_heads: number of heads H; ``d_k = d_model // n_heads`` unless given.
        dropout: dropout on the attention weights (0 in the paper's base model description,
            which applies dropout to sub-layer outputs; kept as an option).
        bias: use biases in the projections.
        backend: a name in :data:`BACKENDS` (``"sdpa"``, ``"eager"``, ... see
            :func:`scaled_dot_product_attention`); an attribute that may be changed later (as
            :func:`~qkv.inference.weight_layout.prepare_for_inference` does, to ``"invariant"``).
        d_k: per-head width (default ``d_model // n_heads``).
        rotary: a :class:`~qkv.nn.positional.RotaryEmbedding` applied to queries and keys of
            self-attention (RoPE), or ``None`` (positions added to the embeddings instead).
        cross: encoder-decoder attention (keys and values from ``memory``, §3.2.3).

    Raises:
        ValueError: ``d_model`` not divisible by ``n_heads`` (when ``d_k`` is not given), an
            unknown backend, or ``rotary`` with ``cross=True``.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        backend: str = "sdpa",
        d_k: int | None = None,
        rotary: nn.Module | None = None,
        cross: bool = False,
    ) -> None:
        super().__init__()
        if d_k is None:
            if d_model % n_heads:
                raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
            d_k = d_model // n_heads
        check_backend(backend)
        if cross and rotary is not None:
            raise ValueError(
                "rotary positions apply to self-attention only, not cross-attention "
                "(the memory's positions are already encoded)"
            )
        self.d_model, self.n_heads, self.d_k = d_model, n_heads, d_k
        self.dropout, self.backend, self.cross = dropout, backend, cross
        inner = n_heads * d_k
        if cross:
            self.w_q = nn.Linear(d_model, inner, bias=bias)
            self.w_kv = self._packed(d_model, inner, 2, bias)
        else:
            self.w_qkv = self._packed(d_model, inner, 3, bias)
        self.w_o = nn.Linear(inner, d_model, bias=bias)
        self.rotary = rotary
        # The hooks on the values inside a call (HeadHook): how qkv.explain reads and replaces
        # Q, K, V, the pattern and each head's output by name, which a forward hook cannot see.
        # Empty (no cost) unless a hook is installed.
        self.head_hooks: list[HeadHook] = []

    @staticmethod
    @torch.no_grad()
    def _packed(d_model: int, inner: int, parts: int, bias: bool) -> nn.Linear:
        """``nn.Linear(d_model, parts·inner)`` initialised part by part as ``parts`` separate
        ``nn.Linear(d_model, inner)`` would be (weight, then bias, in order): packed projections
        start from the same distribution, and for a seed the same values, as separate ones."""
        packed = nn.utils.skip_init(nn.Linear, d_model, parts * inner, bias=bias)
        for i in range(parts):
            rows = slice(i * inner, (i + 1) * inner)
            nn.init.kaiming_uniform_(packed.weight[rows], a=math.sqrt(5))  # nn.Linear's init
            if bias:
                nn.init.uniform_(packed.bias[rows], -(d_model**-0.5), d_model**-0.5)
        return packed

    def _split(self, x: torch.Tensor, parts: int) -> list[torch.Tensor]:
        """``(B, T, parts·H·Dh)`` → ``parts`` tensors ``(B, H, T, Dh)`` (views, no copy)."""
        b, t, _ = x.shape
        x = x.view(b, t, parts, self.n_heads, self.d_k)  # (B, T, parts, H, Dh)
        return list(x.permute(2, 0, 3, 1, 4).unbind(0))  # parts × (B, H, T, Dh)

    def _heads(
        self,
        x: torch.Tensor,
        memory: torch.Tensor | None,
        cache: KVCache | None,
        positions: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries, keys and values split into heads, ``(B, H, T, Dh)`` each (rotary applied,
        the cache read and updated; keys and values cover the cached positions too)."""
        if self.cross != (memory is not None):
            raise ValueError(
                "cross-attention needs memory"
                if self.cross
                else "memory given to a self-attention module (build it with cross=True)"
            )
        if memory is None:
            q, k, v = self._self_heads(x, cache, positions)
        else:
            q, k, v = self._cross_heads(x, memory, cache)
        if self.head_hooks:
            q, k, v = (self._point(name, t) for name, t in (("q", q), ("k", k), ("v", v)))
        return q, k, v

    def _point(self, name: str, value: torch.Tensor) -> torch.Tensor:
        """``value`` passed through every installed :class:`HeadHook`, in order."""
        for hook in self.head_hooks:
            value = hook.fire(name, value)
        return value

    def _self_heads(
        self, x: torch.Tensor, cache: KVCache | None, positions: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        packed = self.w_qkv(x)
        q, k, v = self._split(packed, 3)  # (B, H, Tq, Dh) each
        if self.rotary is not None:
            # queries and keys rotated in one call on a view of both (2, B, H, Tq, Dh), by
            # consecutive positions from the cache's length unless given
            at = positions if positions is not None else 0 if cache is None else cache.length
            qk = packed.view(*x.shape[:2], 3, self.n_heads, self.d_k)[:, :, :2].permute(2, 0, 3, 1, 4)
            q, k = self.rotary(qk, at).unbind(0)
        if cache is not None:
            k, v = cache.append(k, v)  # (B, H, L + Tq, Dh)
        return q, k, v

    def _cross_heads(
        self, x: torch.Tensor, memory: torch.Tensor, cache: KVCache | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        (q,) = self._split(self.w_q(x), 1)  # (B, H, Tq, Dh)
        if cache is not None and cache.k is not None and cache.v is not None:  # v is set with k
            return q, cache.k, cache.v  # encoder memory does not change while decoding
        k, v = self._split(self.w_kv(memory), 2)  # (B, H, S, Dh) each
        if cache is not None:
            cache.set(k, v)
        return q, k, v

    def steps(
        self,
        x: torch.Tensor,
        memory: torch.Tensor | None = None,
        attn_mask: torch.Tensor | None = None,
        is_causal: bool = False,
        positions: torch.Tensor | None = None,
    ) -> AttentionSteps:
        """Every intermediate of Eq. 1 for all heads of this call, for inspection.

        Same inputs as :meth:`forward` (without a cache); the look-ahead mask is folded into
        ``attn_mask`` so ``AttentionSteps.masked`` shows it. ``steps(...).output`` concatenated over
        heads and multiplied by ``W_O`` is :meth:`forward`'s output (tested).

        Shape: ``x (B, Tq, D)`` → :class:`AttentionSteps` with ``(B, H, Tq, Tk)`` scores and
        weights and ``(B, H, T, Dh)`` q, k, v and output.
        """
        q, k, v = self._heads(x, memory, None, positions)
        if is_causal:
            attn_mask = combine_masks(attn_mask, causal_mask(q.size(-2), k.size(-2), device=q.device))
        return attention_steps(q, k, v, attn_mask)

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor | None = None,
        attn_mask: torch.Tensor | None = None,
        is_causal: bool = False,
        cache: KVCache | None = None,
        need_weights: bool = False,
        positions: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Self-attention (``cross=False``, no ``memory``) or cross-attention over ``memory``.

        Shape:
            x: ``(B, Tq, D)`` queries (and keys/values for self-attention).
            memory: ``(B, S, D)`` encoder output for cross-attention, ``None`` for self-attention.
            attn_mask: bool, broadcastable to ``(B, H, Tq, Tk)``, ``True`` = may attend
                (§3.2.3).
            is_causal: apply the look-ahead mask (self-attention).
            cache: a :class:`KVCache` updated in place for incremental decoding.
            positions: ``(Tq,)`` or ``(B, Tq)`` long positions of the queries, used by the
                rotary embedding (default: continue after the cached keys).
            Returns ``(output (B, Tq, D), weights (B, H, Tq, Tk) or None)``.

        Raises:
            ValueError: ``memory`` given to a self-attention module or missing for a cross one.
        """
        b, t, _ = x.shape
        q, k, v = self._heads(x, memory, cache, positions)
        # a hook on the scores or the pattern needs them computed: the explicit path of Eq. 1
        hooked = bool(self.head_hooks) and any(hook.weights for hook in self.head_hooks)
        out, weights = scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=attn_mask,
            is_causal=is_causal,
            dropout_p=self.dropout if self.training else 0.0,
            backend=self.backend,
            need_weights=need_weights,
            point=self._point if hooked else None,
        )
        out = out.transpose(1, 2)  # (B, Tq, H, Dh)
        if self.head_hooks:
            out = self._point("z", out)
        out = out.reshape(b, t, self.n_heads * self.d_k)  # (B, Tq, H*Dh)
        return self.w_o(out), weights if need_weights else None
