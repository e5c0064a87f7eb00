"""Scaled dot-product attention, masks, multi-head attention and the KV cache.

Expected values and invariants (eager == SDPA, masks block, fully masked rows give zeros) and
parity with torch.nn.MultiheadAttention given the same weights. Mask convention in qkv:
boolean, True = may attend; torch.nn uses True = blocked, converted only here.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch_ref import copy_attention_from_torch

from qkv.nn import (
    KVCache,
    MultiHeadAttention,
    attention_steps,
    causal_mask,
    combine_masks,
    padding_mask,
    scaled_dot_product_attention,
)
from qkv.nn.attention import BACKENDS as REGISTERED
from qkv.nn.attention import register_backend

TOL = 1e-5
BACKENDS = ("eager", "sdpa", "invariant")


def _qkv(b=2, h=3, tq=5, tk=6, dh=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(b, h, tq, dh, generator=g),
        torch.randn(b, h, tk, dh, generator=g),
        torch.randn(b, h, tk, dh, generator=g),
    )


def _key_mask(lengths, tk):
    """(B, 1, 1, Tk) key-padding mask from real lengths (True = real key)."""
    return (torch.arange(tk)[None, :] < torch.tensor(lengths)[:, None])[:, None, None, :]


def _sdpa(q, k, v, backend, **kw):
    out, _ = scaled_dot_product_attention(q, k, v, backend=backend, **kw)
    return out


# --------------------------------------------------------------------------- masks


def test_padding_mask_marks_real_tokens():
    """padding_mask is (B, 1, 1, S) and True exactly where the token is not pad."""
    tokens = torch.tensor([[5, 6, 0, 0], [7, 0, 8, 0]])
    m = padding_mask(tokens, pad_id=0)
    assert m.shape == (2, 1, 1, 4) and m.dtype == torch.bool
    assert m[:, 0, 0].tolist() == [[True, True, False, False], [True, False, True, False]]


def test_causal_mask_values_square_and_shifted():
    """causal_mask is lower-triangular; with k_len > q_len the queries are the last positions."""
    assert causal_mask(3)[0, 0].int().tolist() == [[1, 0, 0], [1, 1, 0], [1, 1, 1]]
    assert causal_mask(2, 4)[0, 0].int().tolist() == [[1, 1, 1, 0], [1, 1, 1, 1]]
    with pytest.raises(ValueError, match=r"k_len \(2\)"):
        causal_mask(3, 2)


def test_combine_masks_is_logical_and_with_broadcast():
    """combine_masks ANDs the masks (broadcasting) and ignores None."""
    pad = _key_mask([2], 3)  # (1, 1, 1, 3): keys 0, 1 real
    out = combine_masks(None, pad, causal_mask(3), None)
    assert out[0, 0].int().tolist() == [[1, 0, 0], [1, 1, 0], [1, 1, 0]]
    assert combine_masks(None, None) is None


def test_mask_must_be_boolean():
    """A float (additive) mask is rejected instead of being misread."""
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="boolean"):
        scaled_dot_product_attention(q, k, v, attn_mask=torch.zeros(1, 1, 5, 6))


# --------------------------------------------------------------------------- masks really block


@pytest.mark.parametrize("backend", BACKENDS)
def test_padding_mask_blocks_masked_keys_and_values(backend):
    """Changing a masked-out key/value changes no output; changing a real one does."""
    q, k, v = _qkv(tk=6)
    mask = _key_mask([4, 2], 6)
    out = _sdpa(q, k, v, backend, attn_mask=mask)

    k2, v2 = k.clone(), v.clone()
    k2[0, :, 4:] = 100.0 * torch.randn_like(k2[0, :, 4:])
    v2[0, :, 4:] = -50.0
    k2[1, :, 2:] = -100.0
    v2[1, :, 2:] = 1e4
    assert torch.allclose(_sdpa(q, k2, v2, backend, attn_mask=mask), out, atol=1e-6, rtol=0)

    v3 = v.clone()
    v3[0, :, 0] += 1.0  # a real key/value of sentence 0: must matter there
    changed = _sdpa(q, k, v3, backend, attn_mask=mask)
    assert (changed[0] - out[0]).abs().max() > 1e-3
    assert torch.allclose(changed[1], out[1], atol=1e-6, rtol=0)  # other sentences untouched


@pytest.mark.parametrize("backend", BACKENDS)
def test_causal_mask_blocks_future_keys(backend):
    """With is_causal, query t does not see keys/values after t (they may change freely)."""
    q, k, v = _qkv(tq=6, tk=6)
    out = _sdpa(q, k, v, backend, is_causal=True)
    t = 2
    k2, v2 = k.clone(), v.clone()
    k2[:, :, t + 1 :] = torch.randn_like(k2[:, :, t + 1 :]) * 10
    v2[:, :, t + 1 :] = 123.0
    out2 = _sdpa(q, k2, v2, backend, is_causal=True)
    assert torch.allclose(out2[:, :, : t + 1], out[:, :, : t + 1], atol=1e-6, rtol=0)
    assert (out2[:, :, t + 1 :] - out[:, :, t + 1 :]).abs().max() > 1e-2


# --------------------------------------------------------------------------- eager == sdpa


def _mask_cases(b, tq, tk):
    g = torch.Generator().manual_seed(1)
    rand = torch.rand(b, 1, tq, tk, generator=g) > 0.3
    rand[..., 0] = True  # keep every row attendable
    return {
        "none": dict(),
        "padding": dict(attn_mask=_key_mask([tk, tk - 2][:b], tk)),
        "causal": dict(is_causal=True),
        "causal+padding": dict(attn_mask=_key_mask([tk, tk - 1][:b], tk), is_causal=True),
        "random": dict(attn_mask=rand),
    }


@pytest.mark.parametrize("case", ["none", "padding", "causal", "causal+padding", "random"])
@pytest.mark.parametrize("tq,tk", [(5, 5), (3, 7), (1, 4)])
def test_eager_equals_sdpa(case, tq, tk):
    """The three backends compute the same function (max abs difference <= 1e-5)."""
    q, k, v = _qkv(b=2, h=3, tq=tq, tk=tk, dh=8)
    kw = _mask_cases(2, tq, tk)[case]
    eager = _sdpa(q, k, v, "eager", **kw)
    for backend in ("sdpa", "invariant"):
        fast = _sdpa(q, k, v, backend, **kw)
        assert eager.shape == fast.shape == (2, 3, tq, 8)
        assert (eager - fast).abs().max() <= TOL


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", ["none", "causal", "causal+padding", "random"])
def test_invariant_backend_gives_each_query_the_bits_of_computing_it_alone(dtype, case):
    """The "invariant" backend: query i computed alone (over the keys it may see, as in a
    decoding step over a key/value cache) gives bit for bit row i of the batched call. (SDPA
    itself does not promise this: its kernels block the keys differently per call shape.)"""
    tq = tk = 40
    q, k, v = (t.to(dtype) for t in _qkv(b=2, h=3, tq=tq, tk=tk, dh=16))
    kw = _mask_cases(2, tq, tk)[case]
    full = _sdpa(q, k, v, "invariant", **kw)
    mask = kw.get("attn_mask")
    for i in range(tq):
        end = i + 1 if kw.get("is_causal") else tk
        row_mask = None if mask is None else mask.expand(2, 1, tq, tk)[:, :, i : i + 1, :end]
        alone = _sdpa(q[:, :, i : i + 1], k[:, :, :end], v[:, :, :end], "invariant", attn_mask=row_mask)
        assert torch.equal(alone[:, :, 0], full[:, :, i]), f"query {i}"


def test_causal_attention_refuses_more_queries_than_keys_in_every_backend():
    """Under is_causal the queries are the last Tq positions, so Tq > Tk is an error."""
    q, k, v = _qkv(b=1, h=2, tq=5, tk=3)
    for backend in BACKENDS:
        with pytest.raises(ValueError, match=r"k_len \(3\) must be >= q_len \(5\)"):
            _sdpa(q, k, v, backend, is_causal=True)


def test_sdpa_causal_matches_explicit_lower_triangular_mask():
    """is_causal=True is the same as passing the lower-triangular mask explicitly."""
    q, k, v = _qkv(tq=5, tk=5)
    for backend in BACKENDS:
        a = _sdpa(q, k, v, backend, is_causal=True)
        b = _sdpa(q, k, v, backend, attn_mask=torch.ones(5, 5, dtype=torch.bool).tril())
        assert (a - b).abs().max() <= TOL


@pytest.mark.parametrize("backend", BACKENDS)
def test_fully_masked_query_row_gives_zeros_not_nan(backend):
    """A query with no legal key yields an all-zero output row (never NaN); other rows unaffected."""
    q, k, v = _qkv(b=2, h=2, tq=4, tk=5)
    mask = torch.ones(2, 1, 4, 5, dtype=torch.bool)
    mask[0, :, 1] = False  # query 1 of sentence 0 sees nothing
    mask[1] = False  # sentence 1 sees nothing at all (an empty sequence)
    out = _sdpa(q, k, v, backend, attn_mask=mask)
    assert not torch.isnan(out).any()
    assert torch.equal(out[0, :, 1], torch.zeros_like(out[0, :, 1]))
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    reference = _sdpa(q, k, v, "eager", attn_mask=torch.ones_like(mask))
    keep = [0, 2, 3]
    assert (out[0, :, keep] - reference[0, :, keep]).abs().max() <= TOL


def test_fully_masked_row_weights_are_zero():
    """need_weights on a fully masked row returns zero weights, not a uniform or NaN row."""
    q, k, v = _qkv(b=1, h=1, tq=2, tk=3)
    mask = torch.tensor([[True, True, False], [False, False, False]])
    _, w = scaled_dot_product_attention(q, k, v, attn_mask=mask, need_weights=True)
    assert torch.equal(w[0, 0, 1], torch.zeros(3))
    assert torch.allclose(w[0, 0, 0].sum(), torch.tensor(1.0))


@pytest.mark.parametrize("backend", BACKENDS)
def test_attention_weights_rows_sum_to_one_masked_exactly_zero(backend):
    """Returned weights are a distribution over legal keys: rows sum to 1, masked entries are 0.0."""
    q, k, v = _qkv(b=2, h=3, tq=5, tk=6)
    mask = combine_masks(_key_mask([6, 3], 6), causal_mask(5, 6))
    out, w = scaled_dot_product_attention(q, k, v, attn_mask=mask, need_weights=True, backend=backend)
    assert w is not None and w.shape == (2, 3, 5, 6)
    assert torch.allclose(w.sum(-1), torch.ones(2, 3, 5), atol=1e-6)
    full = mask.expand_as(w)
    assert torch.all(w[~full] == 0.0)
    assert torch.all(w[full] > 0.0)
    assert torch.allclose(out, w @ v, atol=1e-6)


def test_need_weights_false_returns_none():
    """Without need_weights no weights are returned (and with it they always are)."""
    q, k, v = _qkv()
    for backend in BACKENDS:
        assert scaled_dot_product_attention(q, k, v, backend=backend)[1] is None
        assert scaled_dot_product_attention(q, k, v, backend=backend, need_weights=True)[1] is not None


def test_unknown_backend_rejected():
    """An unknown backend name raises ValueError naming it."""
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="flash9"):
        scaled_dot_product_attention(q, k, v, backend="flash9")
    with pytest.raises(ValueError, match="flash9"):
        MultiHeadAttention(16, 4, backend="flash9")


def test_a_registered_backend_is_called_with_the_documented_arguments(monkeypatch):
    """register_backend: the function gets (q, k, v, attn_mask, is_causal, dropout_p) and its output
    is the result, from the function and from MultiHeadAttention; need_weights still takes the
    explicit path. The paper's two backends are registered by nn.attention itself."""
    assert {"sdpa", "eager", "invariant"} <= set(REGISTERED)
    calls = []

    def doubled(q, k, v, attn_mask, is_causal, dropout_p):
        calls.append((attn_mask, is_causal, dropout_p))
        return 2 * REGISTERED["eager"](q, k, v, attn_mask, is_causal, dropout_p)

    monkeypatch.setitem(REGISTERED, "doubled", None)  # so that the name is removed afterwards
    register_backend("doubled", doubled)
    q, k, v = _qkv()
    out, w = scaled_dot_product_attention(q, k, v, is_causal=True, backend="doubled")
    assert w is None and calls == [(None, True, 0.0)]
    torch.testing.assert_close(out, 2 * _sdpa(q, k, v, "eager", is_causal=True))
    _, w = scaled_dot_product_attention(q, k, v, backend="doubled", need_weights=True)
    assert w is not None and len(calls) == 1
    mha = MultiHeadAttention(16, 4, backend="doubled").eval()
    x = torch.randn(2, 3, 16)
    with torch.no_grad():
        doubled_out = mha(x)[0]
        mha.backend = "eager"
        torch.testing.assert_close(doubled_out - mha.w_o.bias, 2 * (mha(x)[0] - mha.w_o.bias))


# --------------------------------------------------------------------------- attention_steps


def test_attention_steps_intermediates_are_consistent():
    """scores = QKᵀ, scaled = scores/sqrt(d_k), masked = finfo.min where blocked, weights =
    softmax(masked) with blocked entries 0, output = weights @ V."""
    q, k, v = _qkv(b=2, h=2, tq=3, tk=4, dh=5)
    mask = _key_mask([4, 2], 4)
    s = attention_steps(q, k, v, mask)
    assert torch.allclose(s.scores, q @ k.transpose(-2, -1), atol=1e-6)
    assert torch.allclose(s.scaled, s.scores / math.sqrt(5), atol=1e-6)
    blocked = ~mask.expand_as(s.scaled)
    assert torch.all(s.masked[blocked] == torch.finfo(torch.float32).min)
    assert torch.equal(s.masked[~blocked], s.scaled[~blocked])
    expected_w = torch.softmax(s.scaled.masked_fill(blocked, float("-inf")), dim=-1)
    assert torch.allclose(s.weights, expected_w, atol=1e-6)
    assert torch.all(s.weights[blocked] == 0.0)
    assert torch.allclose(s.output, s.weights @ v, atol=1e-6)
    assert s.output.shape == (2, 2, 3, 5)


def test_attention_hand_computed_example():
    """A 1-query, 2-key example worked by hand: scores (2, 0)/sqrt(4) -> softmax (e/(e+1), 1/(e+1))."""
    q = torch.tensor([[[[2.0, 0.0, 0.0, 0.0]]]])  # (1, 1, 1, 4)
    k = torch.tensor([[[[1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0]]]])
    v = torch.tensor([[[[10.0, 0.0, 0.0, 0.0], [0.0, 10.0, 0.0, 0.0]]]])
    s = attention_steps(q, k, v)
    p = math.e / (math.e + 1)
    assert torch.allclose(s.scaled, torch.tensor([[[[1.0, 0.0]]]]))
    assert torch.allclose(s.weights, torch.tensor([[[[p, 1 - p]]]]), atol=1e-6)
    assert torch.allclose(s.output, torch.tensor([[[[10 * p, 10 * (1 - p), 0.0, 0.0]]]]), atol=1e-5)
    for backend in BACKENDS:
        assert torch.allclose(_sdpa(q, k, v, backend), s.output, atol=1e-5)


def test_the_mask_keywords_of_0_1_are_gone():
    """0.2.0 removed the old mask keywords (``mask=``, the layers' ``self_mask=`` /
    ``memory_mask=``): each is an unknown keyword now, and the new names give the result."""
    from qkv.nn import DecoderLayer, LayerConfig

    q, k, v = _qkv()
    mask = _key_mask([6, 3], 6)
    with pytest.raises(TypeError, match="unexpected keyword argument 'mask'"):
        scaled_dot_product_attention(q, k, v, mask=mask)
    mha, x = MultiHeadAttention(16, 4).eval(), torch.randn(2, 6, 16)
    with pytest.raises(TypeError, match="unexpected keyword argument 'mask'"):
        mha(x, mask=mask)
    layer = DecoderLayer(LayerConfig(d_model=16, n_heads=4, d_ff=32, dropout=0.0)).eval()
    for old in ("self_mask", "memory_mask"):
        with pytest.raises(TypeError, match=f"unexpected keyword argument '{old}'"):
            layer(x, x, **{old: mask})
    assert layer(x, x, src_mask=mask)[0].shape == x.shape


# --------------------------------------------------------------------------- parity with torch.nn


def _mha_pair(d_model=16, n_heads=4, backend="sdpa", cross=False):
    theirs = nn.MultiheadAttention(d_model, n_heads, batch_first=True).eval()
    with torch.no_grad():  # non-zero biases so a wrong bias mapping cannot pass
        theirs.in_proj_bias.normal_()
        theirs.out_proj.bias.normal_()
    ours = MultiHeadAttention(d_model, n_heads, backend=backend, cross=cross).eval()
    copy_attention_from_torch(ours, theirs)
    return ours, theirs


@pytest.mark.parametrize("backend", BACKENDS)
def test_mha_self_attention_matches_torch_with_key_padding(backend, no_torch_fastpath):
    """Self-attention with a key-padding mask equals nn.MultiheadAttention (mask polarity flipped)."""
    ours, theirs = _mha_pair(backend=backend)
    x = torch.randn(3, 6, 16)
    keep = _key_mask([6, 4, 1], 6)  # (B, 1, 1, S), True = real
    with torch.no_grad():
        ref, ref_w = theirs(
            x, x, x, key_padding_mask=~keep[:, 0, 0], need_weights=True, average_attn_weights=False
        )
        out, w = ours(x, attn_mask=keep, need_weights=True)
        out_fast, _ = ours(x, attn_mask=keep)
    assert (out - ref).abs().max() <= TOL
    assert (out_fast - ref).abs().max() <= TOL
    assert (w - ref_w).abs().max() <= TOL


def test_mha_causal_self_attention_matches_torch(no_torch_fastpath):
    """Causal self-attention equals nn.MultiheadAttention with a bool attn_mask (True = blocked)."""
    ours, theirs = _mha_pair()
    x = torch.randn(2, 5, 16)
    blocked = ~torch.ones(5, 5, dtype=torch.bool).tril()
    with torch.no_grad():
        ref, _ = theirs(x, x, x, attn_mask=blocked, need_weights=False)
        out, _ = ours(x, is_causal=True)
    assert (out - ref).abs().max() <= TOL


@pytest.mark.parametrize("backend", BACKENDS)
def test_mha_cross_attention_matches_torch(backend, no_torch_fastpath):
    """Cross-attention (queries from x, keys/values from memory, padded memory) equals torch's."""
    ours, theirs = _mha_pair(backend=backend, cross=True)
    x, memory = torch.randn(2, 4, 16), torch.randn(2, 7, 16)
    keep = _key_mask([7, 3], 7)
    with torch.no_grad():
        ref, _ = theirs(x, memory, memory, key_padding_mask=~keep[:, 0, 0], need_weights=False)
        out, _ = ours(x, memory=memory, attn_mask=keep)
    assert out.shape == (2, 4, 16)
    assert (out - ref).abs().max() <= TOL


def test_mha_rejects_indivisible_d_model():
    """d_model not divisible by n_heads (and no explicit d_k) fails at construction, naming both."""
    with pytest.raises(ValueError, match=r"d_model \(10\).*n_heads \(3\)"):
        MultiHeadAttention(10, 3)


def test_mha_packed_projection_shapes_and_row_order():
    """Self-attention packs Q, K, V rows into one w_qkv (torch's in_proj layout); cross-attention
    keeps w_q for the queries and packs K, V rows into w_kv; no separate w_k / w_v remain."""
    self_attn, cross = MultiHeadAttention(16, 4, d_k=3), MultiHeadAttention(16, 4, d_k=3, cross=True)
    assert self_attn.w_qkv.weight.shape == (3 * 12, 16) and self_attn.w_o.weight.shape == (16, 12)
    assert cross.w_q.weight.shape == (12, 16) and cross.w_kv.weight.shape == (2 * 12, 16)
    assert {n.split(".")[0] for n, _ in self_attn.named_parameters()} == {"w_qkv", "w_o"}
    assert {n.split(".")[0] for n, _ in cross.named_parameters()} == {"w_q", "w_kv", "w_o"}
    # Head i's queries are rows i*d_k:(i+1)*d_k, keys the same rows + H*d_k, values + 2*H*d_k.
    x = torch.randn(1, 5, 16)
    s = self_attn.steps(x)
    w, b = self_attn.w_qkv.weight, self_attn.w_qkv.bias
    for part, got in enumerate((s.q, s.k, s.v)):
        rows = slice(part * 12 + 3, part * 12 + 6)  # head 1
        torch.testing.assert_close(got[0, 1], x[0] @ w[rows].T + b[rows])


def test_mha_memory_must_match_the_kind():
    """memory given to a self-attention module, or missing for a cross one, is a ValueError
    (not a silent self-attention); rotary positions are refused for cross-attention."""
    x = torch.randn(1, 3, 16)
    with pytest.raises(ValueError, match="cross=True"):
        MultiHeadAttention(16, 4)(x, memory=x)
    with pytest.raises(ValueError, match="needs memory"):
        MultiHeadAttention(16, 4, cross=True)(x)
    with pytest.raises(ValueError, match="needs memory"):
        MultiHeadAttention(16, 4, cross=True).steps(x)
    from qkv.nn.positional import RotaryEmbedding

    with pytest.raises(ValueError, match="rotary"):
        MultiHeadAttention(16, 4, rotary=RotaryEmbedding(4, 8), cross=True)


# --------------------------------------------------------------------------- KV cache


@pytest.mark.parametrize("backend", BACKENDS)
def test_kv_cache_one_token_at_a_time_equals_full_causal(backend):
    """Feeding tokens one by one through a KVCache equals one causal pass over the sequence."""
    mha = MultiHeadAttention(16, 4, backend=backend).eval()
    x = torch.randn(2, 6, 16)
    with torch.no_grad():
        full, _ = mha(x, is_causal=True)
        cache = KVCache()
        steps = [mha(x[:, t : t + 1], cache=cache)[0] for t in range(6)]
    assert cache.k.shape == cache.v.shape == (2, 4, 6, 4)
    assert (torch.cat(steps, dim=1) - full).abs().max() <= TOL


@pytest.mark.parametrize("backend", BACKENDS)
def test_kv_cache_in_chunks_equals_full_causal(backend):
    """Chunks of several tokens with a cache (shifted causal mask) equal the full causal pass."""
    mha = MultiHeadAttention(16, 4, backend=backend).eval()
    x = torch.randn(2, 7, 16)
    with torch.no_grad():
        full, _ = mha(x, is_causal=True)
        cache = KVCache()
        parts = [mha(x[:, a:b], cache=cache, is_causal=True)[0] for a, b in ((0, 3), (3, 4), (4, 7))]
    assert (torch.cat(parts, dim=1) - full).abs().max() <= TOL


def test_cross_attention_cache_reuses_memory_projection():
    """The cross-attention cache is filled once and gives the same output as recomputing."""
    mha = MultiHeadAttention(16, 4, cross=True).eval()
    x, memory = torch.randn(2, 3, 16), torch.randn(2, 5, 16)
    with torch.no_grad():
        ref, _ = mha(x, memory=memory)
        cache = KVCache()
        first, _ = mha(x[:, :1], memory=memory, cache=cache)
        k_before = cache.k
        # A different memory is ignored once the cache is full: the cache really is used.
        second, _ = mha(x[:, 1:], memory=torch.zeros_like(memory), cache=cache)
    assert cache.k.data_ptr() == k_before.data_ptr() and torch.equal(cache.k, k_before)
    assert cache.k.shape == (2, 4, 5, 4)
    assert (torch.cat([first, second], 1) - ref).abs().max() <= TOL


def test_kv_cache_reorder_selects_batch_rows():
    """KVCache.reorder picks batch rows by index (beam search bookkeeping)."""
    cache = KVCache()
    k = torch.arange(3.0)[:, None, None, None].expand(3, 1, 2, 1).clone()
    cache.append(k, k + 10)
    cache.reorder(torch.tensor([2, 2, 0]))
    assert cache.k[:, 0, 0, 0].tolist() == [2.0, 2.0, 0.0]
    assert cache.v[:, 0, 0, 0].tolist() == [12.0, 12.0, 10.0]
    # Appending after a reorder continues each selected row.
    step = torch.tensor([5.0, 6.0, 7.0])[:, None, None, None]
    cache.append(step, step + 10)
    assert cache.length == 3 and cache.k[:, 0, :, 0].tolist() == [[2, 2, 5], [2, 2, 6], [0, 0, 7]]


def test_kv_cache_reorder_and_append_allocate_nothing_per_step():
    """Beam search's step (reorder, then append) reuses two buffers: after the first step the
    cache's storage alternates between them, and the values are the gathered rows."""
    torch.manual_seed(0)
    cache = KVCache()
    cache.append(torch.randn(4, 2, 3, 5), torch.randn(4, 2, 3, 5))
    expected_k = cache.k.clone()
    pointers = set()
    for _ in range(6):
        index = torch.randint(0, 4, (4,))
        expected_k = expected_k.index_select(0, index)
        cache.reorder(index)
        new = torch.randn(4, 2, 1, 5)
        expected_k = torch.cat([expected_k, new], dim=2)
        cache.append(new, new)
        pointers.add(cache.k.data_ptr())
        assert torch.equal(cache.k, expected_k)
    assert len(pointers) == 2, "two buffers, swapped at every reorder"
    cache.reorder(torch.tensor([1, 3]))  # fewer rows (not beam search's case): still right
    assert torch.equal(cache.k, expected_k[[1, 3]])


def test_kv_cache_append_grows_and_keeps_history():
    """Appending one step at a time past the buffer's capacity keeps every earlier step."""
    cache = KVCache()
    steps = [torch.full((2, 1, 1, 3), float(i)) for i in range(70)]
    for step in steps:
        k, v = cache.append(step, -step)
    assert k.shape == (2, 1, 70, 3) and torch.equal(k, torch.cat(steps, dim=2))
    assert torch.equal(v, -k)


# --------------------------------------------------------------------------- property test


@settings(max_examples=40, deadline=None)
@given(
    b=st.integers(1, 3),
    h=st.integers(1, 4),
    tq=st.integers(1, 8),
    extra_k=st.integers(0, 4),
    dh=st.integers(1, 16),
    kind=st.sampled_from(["none", "padding", "random", "causal", "causal+random"]),
    seed=st.integers(0, 2**31 - 1),
)
def test_property_eager_equals_sdpa_random_shapes(b, h, tq, extra_k, dh, kind, seed):
    """For random shapes and masks (incl. fully masked rows), eager and SDPA agree within 1e-5."""
    tk = tq + extra_k
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, h, t, dh, generator=g) for t in (tq, tk, tk))
    kw = {}
    if kind == "padding":
        lengths = torch.randint(0, tk + 1, (b,), generator=g)  # length 0 = fully masked
        kw["attn_mask"] = (torch.arange(tk)[None] < lengths[:, None])[:, None, None, :]
    elif kind in ("random", "causal+random"):
        kw["attn_mask"] = torch.rand(b, 1, tq, tk, generator=g) > 0.5
    if kind.startswith("causal"):
        kw["is_causal"] = True
    eager = _sdpa(q, k, v, "eager", **kw)
    fast = _sdpa(q, k, v, "sdpa", **kw)
    assert not torch.isnan(fast).any() and not torch.isnan(eager).any()
    assert (eager - fast).abs().max() <= TOL


# --------------------------------------------------------------------------- weights are read live


def test_eval_mode_weight_edits_take_effect_immediately():
    """In eval mode under no_grad (inference), editing weights in place changes the very next
    output: zeroing head h's columns of W_O leaves exactly the other heads' contributions
    (computed from steps()), and editing w_qkv changes the output. (Nothing caches weights.)"""
    torch.manual_seed(3)
    mha, h, d_k = MultiHeadAttention(16, 4).eval(), 2, 4
    x, mask = torch.randn(2, 5, 16), _key_mask([5, 3], 5)
    with torch.no_grad():
        first, _ = mha(x, attn_mask=mask)
        heads = mha.steps(x, attn_mask=mask).output  # (B, H, T, Dh)
        w_o = mha.w_o.weight.clone()
        contribution = [heads[:, j] @ w_o[:, j * d_k : (j + 1) * d_k].T for j in range(4)]
        # forward == sum of the per-head contributions + bias (so the split above is right)
        torch.testing.assert_close(first, sum(contribution) + mha.w_o.bias)

        mha.w_o.weight[:, h * d_k : (h + 1) * d_k] = 0.0
        second, _ = mha(x, attn_mask=mask)
        others = sum(c for j, c in enumerate(contribution) if j != h) + mha.w_o.bias
        torch.testing.assert_close(second, others)
        assert (second - first).abs().max() > 1e-3

        mha.w_qkv.weight[2 * 16 :].mul_(2.0)  # the value rows (and bias): V doubles, so does
        mha.w_qkv.bias[2 * 16 :].mul_(2.0)  # every head's output
        third, _ = mha(x, attn_mask=mask)
        torch.testing.assert_close(third - mha.w_o.bias, 2 * (second - mha.w_o.bias))
        mha.w_qkv.weight[:16].mul_(3.0)  # the query rows: sharper attention
        assert (mha(x, attn_mask=mask)[0] - third).abs().max() > 1e-3


# --------------------------------------------------------------------------- no graph breaks


@pytest.mark.parametrize("backend", BACKENDS)
def test_forward_compiles_without_graph_breaks(backend):
    """No host syncs in forward: torch._dynamo traces self-attention with a bool padding mask
    (rows with no legal key included), causal self-attention and cross-attention, in training
    mode with autograd, as one graph each."""
    import torch._dynamo as dynamo

    x, memory = torch.randn(2, 5, 16, requires_grad=True), torch.randn(2, 4, 16)
    pad = _key_mask([5, 0], 5)  # sentence 1 is empty: every query row fully masked
    self_attn = MultiHeadAttention(16, 4, dropout=0.1, backend=backend).train()
    cross = MultiHeadAttention(16, 4, dropout=0.1, backend=backend, cross=True).train()
    calls = {
        "padding": lambda: self_attn(x, attn_mask=pad)[0],
        "causal": lambda: self_attn(x, is_causal=True)[0],
        "causal+padding": lambda: self_attn(x, attn_mask=pad, is_causal=True)[0],
        "cross": lambda: cross(x, memory=memory, attn_mask=_key_mask([4, 2], 4))[0],
    }
    for name, call in calls.items():
        dynamo.reset()
        explanation = dynamo.explain(call)()
        assert explanation.graph_break_count == 0, (name, explanation.break_reasons)
        assert explanation.graph_count == 1, name
    dynamo.reset()
    out = calls["padding"]()
    out.sum().backward()
    assert not torch.isnan(out).any() and torch.equal(out[1], out[1, :1].expand(5, 16))
