"""The lecture notes' worked examples, reproduced with qkv's code.

- ``001_*.txt`` "Shape Example": n = 2 tokens, d = 4, d_k = 3, H = 5 heads.
- ``003_*.txt`` attention example for i = 2: raw scores -> scaled scores -> softmax.
- §3.5 of the paper / both notes: sinusoidal positional encoding values and properties.
"""

from __future__ import annotations

import math

import pytest
import torch

from qkv.nn import (
    MultiHeadAttention,
    SinusoidalPositionalEncoding,
    attention_steps,
    sinusoidal_positional_encoding,
)
from qkv.nn.positional import check_positions

# --------------------------------------------------------------------------- 001: shape table

N, D, D_K, H = 2, 4, 3, 5


def _per_projection(packed: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """W_Q, W_K, W_V (or their biases) from the packed w_qkv: rows Q, then K, then V."""
    return packed.chunk(3, dim=0)


@pytest.fixture
def mha_001():
    return MultiHeadAttention(d_model=D, n_heads=H, d_k=D_K, backend="eager").eval()


def test_001_projection_and_output_weight_shapes(mha_001):
    """W_q^h, W_k^h, W_v^h are d x d_k = 4x3 per head; W^o is d x H·d_k = 4x15. The 3·5 per-head
    matrices are stacked into one packed w_qkv (all Q heads, then K, then V)."""
    assert mha_001.w_qkv.weight.shape == (3 * H * D_K, D)
    for w in _per_projection(mha_001.w_qkv.weight):  # W_Q, W_K, W_V: the 5 heads stacked
        assert w.shape == (H * D_K, D)
        for h in range(H):
            assert w[h * D_K : (h + 1) * D_K].T.shape == (4, 3)
    assert mha_001.w_o.weight.shape == (4, 15)


def test_001_per_head_shapes_and_concatenated_output(mha_001):
    """Per head q, k, v are n x d_k = 2x3, A is n x n = 2x2 (rows sum to 1), z is 2x3; the
    concatenation is 2x15 and the output 2x4, and the module computes exactly that."""
    x = torch.randn(1, N, D)  # input: n x d = 2x4 (batch of one)
    captured = {}
    handle = mha_001.w_o.register_forward_pre_hook(lambda m, args: captured.setdefault("concat", args[0]))
    with torch.no_grad():
        out, weights = mha_001(x, need_weights=True)
    handle.remove()

    heads = []
    for h in range(H):
        rows = slice(h * D_K, (h + 1) * D_K)
        qh, kh, vh = (
            x[0] @ w[rows].T + b[rows]
            for w, b in zip(
                _per_projection(mha_001.w_qkv.weight), _per_projection(mha_001.w_qkv.bias), strict=True
            )
        )
        assert qh.shape == kh.shape == vh.shape == (2, 3)
        a = torch.softmax(qh @ kh.T / math.sqrt(D_K), dim=-1)
        assert a.shape == (2, 2)
        assert torch.allclose(a.sum(-1), torch.ones(2), atol=1e-6)
        assert torch.allclose(weights[0, h], a, atol=1e-6)
        z = a @ vh
        assert z.shape == (2, 3)
        heads.append(z)
    concat = torch.cat(heads, dim=-1)
    assert concat.shape == (2, 15)
    assert torch.allclose(captured["concat"][0], concat, atol=1e-6)
    expected = concat @ mha_001.w_o.weight.T + mha_001.w_o.bias  # (2x15)(15x4) -> 2x4
    assert weights.shape == (1, H, 2, 2)
    assert out.shape == (1, 2, 4)
    assert torch.allclose(out[0], expected.detach(), atol=1e-6)


def test_001_heads_without_explicit_d_k_need_divisibility():
    """The table's H·d_k = 15 != d = 4 is only possible with an explicit d_k; the default
    d_k = d / H refuses d = 4, H = 5."""
    with pytest.raises(ValueError, match=r"d_model \(4\)"):
        MultiHeadAttention(d_model=4, n_heads=5)


# --------------------------------------------------------------------------- 003: softmax example

SCORES_003 = [23.2, 70.8, 33.7, 5.7, -12.4, 27.8, -22.4]  # step 1: e_2ᵀ·e_j, j = 1..7
SCALED_003 = [0.8, 2.6, 1.2, 0.2, -0.4, 1.0, -0.8]  # step 2, printed to 1 decimal
SOFTMAX_003 = [0.1, 0.55, 0.14, 0.05, 0.03, 0.12, 0.02]  # step 3, printed to 2 decimals
D_003 = 768  # not stated in the note; every d in 760..769 (e.g. BERT-base's 768) reproduces it


def _steps_003():
    """attention_steps on a query and 7 keys whose dot products are the note's raw scores, and
    V = the 7 one-hot vectors (so the output reads off the weights, as in step 4)."""
    q = torch.zeros(1, D_003, dtype=torch.float64)
    q[0, 0] = 1.0
    k = torch.zeros(7, D_003, dtype=torch.float64)
    k[:, 0] = torch.tensor(SCORES_003, dtype=torch.float64)
    v = torch.eye(7, dtype=torch.float64)
    return attention_steps(q, k, v)


def test_003_scores_and_scaling():
    """Step 1 and 2: the scores are the dot products; divided by sqrt(768) they round to the note's
    (0.8, 2.6, 1.2, 0.2, -0.4, 1.0, -0.8)."""
    s = _steps_003()
    assert torch.allclose(s.scores[0], torch.tensor(SCORES_003, dtype=torch.float64))
    assert [round(x, 1) for x in s.scaled[0].tolist()] == SCALED_003


def test_003_softmax_values():
    """Step 3: softmax of the scaled scores rounds to the note's (0.10, 0.55, 0.14, 0.05, 0.03,
    0.12, 0.02); step 4: with one-hot values the output is that weight vector."""
    s = _steps_003()
    assert [round(x, 2) for x in s.weights[0].tolist()] == SOFTMAX_003
    assert torch.allclose(s.weights.sum(), torch.tensor(1.0, dtype=torch.float64))
    assert torch.allclose(s.output, s.weights)


def test_003_softmax_definition():
    """softmax(x)_j = exp(x_j) / sum_k exp(x_k) on the note's rounded step-2 values (by hand:
    exp(2.6) / sum = 0.5594). The note's 0.55 comes from the unrounded scores, not from these."""
    expected = [math.exp(v) / sum(math.exp(u) for u in SCALED_003) for v in SCALED_003]
    # scaled scores = q·k / sqrt(d_k) with d_k = 1, q = 1 and k_j = the step-2 value
    q = torch.ones(1, 1, dtype=torch.float64)
    k = torch.tensor(SCALED_003, dtype=torch.float64)[:, None]
    got = attention_steps(q, k, torch.eye(7, dtype=torch.float64)).weights[0]
    assert torch.allclose(got, torch.tensor(expected, dtype=torch.float64))
    assert round(float(got[1]), 4) == 0.5594


# --------------------------------------------------------------------------- positional encoding


def test_positional_encoding_hand_computed_d4():
    """PE for d = 4: pos 0 = (0, 1, 0, 1); pos 1 = (sin 1, cos 1, sin 0.01, cos 0.01);
    pos 2 = (sin 2, cos 2, sin 0.02, cos 0.02), since 10000^(2/4) = 100."""
    pe = sinusoidal_positional_encoding(max_len=3, d_model=4)
    expected = torch.tensor(
        [
            [0.0, 1.0, 0.0, 1.0],
            [0.841471, 0.540302, 0.00999983, 0.99995],
            [0.909297, -0.416147, 0.0199987, 0.99980],
        ]
    )
    assert pe.shape == (3, 4) and pe.dtype == torch.float32
    assert torch.allclose(pe, expected, atol=1e-6, rtol=0)


@pytest.mark.parametrize("pos,i", [(0, 0), (1, 0), (5, 3), (17, 100), (49, 255)])
def test_positional_encoding_formula_d512(pos, i):
    """PE(pos, 2i) = sin(pos / 10000^(2i/512)), PE(pos, 2i+1) = cos(same) for the base model."""
    pe = sinusoidal_positional_encoding(max_len=50, d_model=512)
    angle = pos / 10000 ** (2 * i / 512)
    assert abs(float(pe[pos, 2 * i]) - math.sin(angle)) < 1e-6
    assert abs(float(pe[pos, 2 * i + 1]) - math.cos(angle)) < 1e-6


@pytest.mark.parametrize("d", [4, 16, 512])
def test_positional_encoding_rows_have_norm_sqrt_half_d(d):
    """Each row holds d/2 (sin, cos) pairs of one angle, so ||PE(pos)|| = sqrt(d/2) for every pos."""
    pe = sinusoidal_positional_encoding(max_len=200, d_model=d).double()
    assert torch.allclose(
        pe.norm(dim=1), torch.full((200,), math.sqrt(d / 2), dtype=torch.float64), atol=1e-5
    )


def test_positional_encoding_relative_shift_is_a_rotation():
    """§3.5: PE(pos + k) is a linear function of PE(pos): each (sin, cos) pair rotates by k·ω_i."""
    d, k = 8, 3
    pe = sinusoidal_positional_encoding(max_len=20, d_model=d).double()
    omega = 1.0 / 10000 ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    s, c = pe[:-k, 0::2], pe[:-k, 1::2]
    ck, sk = torch.cos(k * omega), torch.sin(k * omega)
    assert torch.allclose(pe[k:, 0::2], s * ck + c * sk, atol=1e-6)
    assert torch.allclose(pe[k:, 1::2], c * ck - s * sk, atol=1e-6)


def test_003_positional_vectors_are_the_first_pe_columns():
    """Note 003's p_1 = (0.00, 0.84, ..., 0.14) and p_2 = (1.00, 0.54, ..., -0.99) are the first
    two PE columns (sin and cos at frequency 1) over positions 0..3, rounded to 2 decimals."""
    pe = sinusoidal_positional_encoding(max_len=4, d_model=8)
    col0 = [round(x, 2) for x in pe[:, 0].tolist()]
    col1 = [round(x, 2) for x in pe[:, 1].tolist()]
    assert col0[:2] == [0.0, 0.84] and col0[-1] == 0.14
    assert col1[:2] == [1.0, 0.54] and col1[-1] == -0.99


def test_positional_module_lookup_and_limits():
    """The module returns PE rows for given positions; check_positions (called where positions
    enter, not in forward) rejects positions >= max_len; an odd d is refused."""
    module = SinusoidalPositionalEncoding(max_len=10, d_model=6)
    table = sinusoidal_positional_encoding(10, 6)
    assert torch.equal(module(torch.tensor([[3, 0, 9]])), table[[3, 0, 9]][None])
    check_positions(torch.tensor([[3, 0, 9]]), 10)
    check_positions(torch.zeros(0, dtype=torch.long), 10)
    with pytest.raises(ValueError, match=r"position 10 exceeds .*max_len \(10\)"):
        check_positions(torch.tensor([[3, 10, 2]]), 10)
    with pytest.raises(ValueError, match=r"d_model \(5\)"):
        sinusoidal_positional_encoding(4, 5)
