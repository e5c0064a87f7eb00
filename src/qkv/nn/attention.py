"""Scaled dot-product attention and multi-head attention (with a key/value cache).

Source: Vaswani et al. 2017, §3.2.1 (Eq. 1) and §3.2.2; lecture notes ``001_*.txt`` (query,
key, value; matrix form; multi-head) and ``003_*.txt`` (softmax, masking).

Mask convention (see :mod:`qkv.nn.masks`): boolean, ``True`` = may attend, broadcastable to
``(B, H, q_len, k_len)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .masks import causal_mask, combine_masks

BACKENDS = ("sdpa", "eager")


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


def attention_steps(q, k, v, mask=None) -> AttentionSteps:
    """Eq. 1 step by step: ``softmax(mask(QKᵀ / sqrt(d_k))) V``, returning every intermediate.

    Args:
        q: ``(..., Tq, d_k)``; k: ``(..., Tk, d_k)``; v: ``(..., Tk, d_v)``.
        mask: bool, broadcastable to ``(..., Tq, Tk)``, ``True`` = may attend.

    A query row whose keys are all masked gets all-zero weights (hence a zero output), not NaN.
    """
    d_k = q.size(-1)
    scores = q @ k.transpose(-2, -1)  # (..., Tq, Tk)
    scaled = scores / math.sqrt(d_k)
    if mask is None:
        masked = scaled
        weights = torch.softmax(scaled.float(), dim=-1).to(q.dtype)
    else:
        masked = scaled.masked_fill(~mask, torch.finfo(scaled.dtype).min)
        weights = torch.softmax(masked.float(), dim=-1).to(q.dtype)
        # A fully masked row would be uniform over illegal keys: zero it instead.
        weights = weights.masked_fill(~mask, 0.0)
    return AttentionSteps(q, k, v, scores, scaled, masked, weights, weights @ v)


def scaled_dot_product_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    backend: str = "sdpa",
    need_weights: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Attention(Q, K, V) = softmax(Q Kᵀ / sqrt(d_k)) V  (Vaswani et al. 2017, Eq. 1).

    Two backends compute the same function: ``"eager"`` (explicit math, can return the
    weights) and ``"sdpa"`` (:func:`torch.nn.functional.scaled_dot_product_attention`, fused and
    fast). ``need_weights=True`` always takes the explicit path, so weights are never silently
    missing.

    Args:
        q: queries ``(B, H, Tq, Dh)``; k: keys ``(B, H, Tk, Dh)``; v: values ``(B, H, Tk, Dh)``.
        mask: bool, broadcastable to ``(B, H, Tq, Tk)``, ``True`` = may attend; or ``None``.
        is_causal: additionally apply the look-ahead mask (queries are the last ``Tq`` positions).
        dropout_p: dropout on the attention weights (training only; the caller passes 0 in eval).
        backend: ``"sdpa"`` or ``"eager"``.
        need_weights: also return the attention weights ``(B, H, Tq, Tk)``.

    Returns:
        ``(output (B, H, Tq, Dh), weights or None)``. Fully masked query rows give zeros.

    Raises:
        ValueError: unknown backend, or a mask that is not boolean.
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown attention backend {backend!r}; choose one of {BACKENDS}")
    if mask is not None and mask.dtype != torch.bool:
        raise ValueError(f"attention mask must be boolean (True = may attend), got {mask.dtype}")
    fast = backend == "sdpa" and not need_weights
    if fast and is_causal and mask is None and q.size(-2) == k.size(-2):
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
        return out, None
    if is_causal:
        mask = combine_masks(mask, causal_mask(q.size(-2), k.size(-2), device=q.device))
        is_causal = False
    if fast:
        # SDPA gives NaN for a query row with no legal key; such rows are rare (empty
        # sequences), so route them through the explicit path instead of paying on every call.
        if mask is None or bool(mask.any(-1).all()):
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
            return out, None
    steps = attention_steps(q, k, v, mask)
    weights = steps.weights
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p)
        return weights @ v, steps.weights
    return steps.output, weights if need_weights else None


class KVCache:
    """Keys and values of one attention module kept across decoding steps (inference only).

    ``k``/``v`` have shape ``(B, H, L, Dh)``. Self-attention appends the new steps with
    :meth:`append`; cross-attention stores the encoder memory's once with :meth:`set`.
    Appending writes into a buffer that grows by doubling, so a step copies only its own keys
    and values, not the whole history (``torch.cat`` per step would copy O(L) every step).
    """

    def __init__(self) -> None:
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None
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
        if self._k is None or end > self._k.size(2) or self._k.shape[:2] != k.shape[:2]:
            capacity = max(2 * end, 32)
            old_k, old_v = self.k, self.v
            self._k = k.new_empty(k.size(0), k.size(1), capacity, k.size(3))
            self._v = v.new_empty(v.size(0), v.size(1), capacity, v.size(3))
            if old_k is not None:
                self._k[:, :, : self.length] = old_k
                self._v[:, :, : self.length] = old_v
        self._k[:, :, self.length: end] = k
        self._v[:, :, self.length: end] = v
        self.length = end
        return self.k, self.v

    def reorder(self, index: torch.Tensor) -> None:
        """Select batch rows (beam search): ``index`` is a long tensor of shape ``(B',)``."""
        if self._k is not None:
            self.set(self.k.index_select(0, index), self.v.index_select(0, index))


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1..head_h) W_O, head_i = Attention(Q W_Q_i, K W_K_i, V W_V_i).

    Source: Vaswani et al. 2017, §3.2.2; notes ``001_*.txt`` ("Multi-head Attention").
    The per-head projections are stored stacked as ``w_q``, ``w_k``, ``w_v``:
    ``nn.Linear(d_model, n_heads * d_k)``, and ``w_o``: ``nn.Linear(n_heads * d_k, d_model)``.

    Args:
        d_model: model width D.
        n_heads: number of heads H; ``d_k = d_model // n_heads`` unless given.
        dropout: dropout on the attention weights (0 in the paper's base model description,
            which applies dropout to sub-layer outputs; kept as an option).
        bias: use biases in the four projections.
        backend: ``"sdpa"`` or ``"eager"`` (see :func:`scaled_dot_product_attention`).
        rotary: a :class:`~qkv.nn.positional.RotaryEmbedding` applied to queries and keys of
            self-attention (RoPE), or ``None`` (positions added to the embeddings instead).

    Raises:
        ValueError: ``d_model`` not divisible by ``n_heads`` (when ``d_k`` is not given).
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, bias: bool = True,
                 backend: str = "sdpa", d_k: int | None = None, rotary: nn.Module | None = None) -> None:
        super().__init__()
        if d_k is None:
            if d_model % n_heads:
                raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
            d_k = d_model // n_heads
        if backend not in BACKENDS:
            raise ValueError(f"unknown attention backend {backend!r}; choose one of {BACKENDS}")
        self.d_model, self.n_heads, self.d_k = d_model, n_heads, d_k
        self.dropout, self.backend = dropout, backend
        inner = n_heads * d_k
        self.w_q = nn.Linear(d_model, inner, bias=bias)
        self.w_k = nn.Linear(d_model, inner, bias=bias)
        self.w_v = nn.Linear(d_model, inner, bias=bias)
        self.w_o = nn.Linear(inner, d_model, bias=bias)
        self.rotary = rotary
        self._fused_cache: dict = {}  # inference-only stacked projections, see _fused

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        return x.view(b, t, self.n_heads, self.d_k).transpose(1, 2)  # (B, H, T, Dh)

    def train(self, mode: bool = True):
        # Fused optimizers (AdamW(fused=True), used by make_adam) update weights in place
        # without bumping ``_version``, so a stack cached during one validation would be stale
        # at the next: drop it whenever the mode changes (the loop calls eval()/train()).
        self._fused_cache.clear()
        return super().train(mode)

    def _fused(self, linears: tuple[nn.Linear, ...]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The stacked weight and bias of ``linears``. In eval mode without autograd
        (inference) the stack is cached until a weight changes (in-place updates bump
        ``_version``, moves change ``data_ptr``, and :meth:`train` / ``eval()`` clear it):
        re-stacking every decoding step would move more memory than the matrix-vector product
        itself reads."""
        def stack() -> tuple[torch.Tensor, torch.Tensor | None]:
            weight = torch.cat([lin.weight for lin in linears])
            bias = None if linears[0].bias is None else torch.cat([lin.bias for lin in linears])
            return weight, bias

        if self.training:
            return stack()
        params = [p for lin in linears for p in (lin.weight, lin.bias) if p is not None]
        if torch.is_grad_enabled() and any(p.requires_grad for p in params):
            return stack()
        key = tuple((p.data_ptr(), p._version, p.dtype) for p in params)
        cached = self._fused_cache.get(len(linears))
        if cached is None or cached[0] != key:
            with torch.no_grad():
                cached = (key, *stack())
            self._fused_cache[len(linears)] = cached
        return cached[1], cached[2]

    def _project(self, x: torch.Tensor, linears: tuple[nn.Linear, ...]) -> list[torch.Tensor]:
        """Several projections of the same input as one matrix multiply (faster than one per
        projection); returns each split into heads, ``(B, H, T, Dh)``."""
        weight, bias = self._fused(linears)
        out = F.linear(x, weight, bias)  # (B, T, len(linears) * H * Dh)
        return [self._split(part) for part in out.chunk(len(linears), dim=-1)]

    def _heads(self, x: torch.Tensor, memory: torch.Tensor | None, cache: KVCache | None,
               positions: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries, keys and values split into heads, ``(B, H, T, Dh)`` each (rotary applied,
        the cache read and updated)."""
        t = x.size(1)
        if memory is None:
            q, k, v = self._project(x, (self.w_q, self.w_k, self.w_v))  # (B, H, Tq, Dh) each
            if self.rotary is not None:
                if positions is None:
                    start = 0 if cache is None else cache.length
                    positions = torch.arange(start, start + t, device=x.device)
                q, k = self.rotary(q, positions), self.rotary(k, positions)
            if cache is not None:
                k, v = cache.append(k, v)  # (B, H, L + Tq, Dh)
        elif cache is not None and cache.k is not None:
            q = self._split(self.w_q(x))  # (B, H, Tq, Dh)
            k, v = cache.k, cache.v  # encoder memory does not change while decoding
        else:
            q = self._split(self.w_q(x))  # (B, H, Tq, Dh)
            k, v = self._project(memory, (self.w_k, self.w_v))  # (B, H, S, Dh) each
            if cache is not None:
                cache.set(k, v)
        return q, k, v

    def steps(self, x: torch.Tensor, memory: torch.Tensor | None = None,
              mask: torch.Tensor | None = None, is_causal: bool = False,
              positions: torch.Tensor | None = None) -> AttentionSteps:
        """Every intermediate of Eq. 1 for all heads of this call, for inspection.

        Same inputs as :meth:`forward` (without a cache); the look-ahead mask is folded into
        ``mask`` so ``AttentionSteps.masked`` shows it. ``steps(...).output`` concatenated over
        heads and multiplied by ``W_O`` is :meth:`forward`'s output (tested).

        Shape: ``x (B, Tq, D)`` → :class:`AttentionSteps` with ``(B, H, Tq, Tk)`` scores and
        weights and ``(B, H, T, Dh)`` q, k, v and output.
        """
        q, k, v = self._heads(x, memory, None, positions)
        if is_causal:
            mask = combine_masks(mask, causal_mask(q.size(-2), k.size(-2), device=q.device))
        return attention_steps(q, k, v, mask)

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        is_causal: bool = False,
        cache: KVCache | None = None,
        need_weights: bool = False,
        positions: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Self-attention (``memory=None``) or cross-attention over ``memory``.

        Shape:
            x: ``(B, Tq, D)`` queries (and keys/values for self-attention).
            memory: ``(B, S, D)`` encoder output for cross-attention, or ``None``.
            mask: bool, broadcastable to ``(B, H, Tq, Tk)``, ``True`` = may attend.
            is_causal: apply the look-ahead mask (self-attention).
            cache: a :class:`KVCache` updated in place for incremental decoding.
            positions: ``(Tq,)`` or ``(B, Tq)`` long positions of the queries, used by the
                rotary embedding (default: continue after the cached keys).
            Returns ``(output (B, Tq, D), weights (B, H, Tq, Tk) or None)``.
        """
        b, t, _ = x.shape
        q, k, v = self._heads(x, memory, cache, positions)
        out, weights = scaled_dot_product_attention(
            q, k, v, mask=mask, is_causal=is_causal,
            dropout_p=self.dropout if self.training else 0.0,
            backend=self.backend, need_weights=need_weights,
        )
        out = out.transpose(1, 2).reshape(b, t, self.n_heads * self.d_k)  # (B, Tq, H*Dh)
        return self.w_o(out), weights
