"""Encoder and decoder layers equal torch.nn.TransformerEncoderLayer / TransformerDecoderLayer
given the same weights (post-LN and pre-LN, padding masks and the causal target mask).

torch.nn masks use the opposite polarity (True = blocked); they are converted here only.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch_ref import copy_attention_from_torch

from qkv.nn import DecoderLayer, EncoderLayer, LayerConfig, ResidualNorm

D, H, FF = 16, 4, 32
TOL = 1e-5


def _copy_norm(ours: nn.LayerNorm, theirs: nn.LayerNorm) -> None:
    ours.weight.copy_(theirs.weight)
    ours.bias.copy_(theirs.bias)


def _randomise(module: nn.Module) -> None:
    """Give every parameter (biases, LayerNorm gains too) random values, so that a wrong mapping
    of any single tensor shows up in the outputs."""
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn_like(p) * 0.3 + (1.0 if p.dim() == 1 and p.numel() == D else 0.0))


def _copy_self_attention_and_ffn(ours, theirs) -> None:
    """The parts torch's encoder and decoder layers share: self-attention, FFN, norm1."""
    copy_attention_from_torch(ours.self_attn, theirs.self_attn)
    ours.ffn.w_1.load_state_dict(theirs.linear1.state_dict())
    ours.ffn.w_2.load_state_dict(theirs.linear2.state_dict())
    _copy_norm(ours.self_attn_block.norm, theirs.norm1)


def _config(norm_first: bool, backend: str) -> LayerConfig:
    return LayerConfig(
        d_model=D, n_heads=H, d_ff=FF, dropout=0.1, norm_first=norm_first, attention_backend=backend
    )


def _encoder_pair(norm_first: bool, backend: str):
    theirs = nn.TransformerEncoderLayer(
        D, H, FF, dropout=0.1, activation="relu", batch_first=True, norm_first=norm_first
    )
    _randomise(theirs)
    ours = EncoderLayer(_config(norm_first, backend))
    with torch.no_grad():
        _copy_self_attention_and_ffn(ours, theirs)
        _copy_norm(ours.ffn_block.norm, theirs.norm2)
    return ours.eval(), theirs.eval()


def _decoder_pair(norm_first: bool, backend: str):
    theirs = nn.TransformerDecoderLayer(
        D, H, FF, dropout=0.1, activation="relu", batch_first=True, norm_first=norm_first
    )
    _randomise(theirs)
    ours = DecoderLayer(_config(norm_first, backend))
    with torch.no_grad():
        _copy_self_attention_and_ffn(ours, theirs)
        copy_attention_from_torch(ours.cross_attn, theirs.multihead_attn)
        _copy_norm(ours.cross_attn_block.norm, theirs.norm2)
        _copy_norm(ours.ffn_block.norm, theirs.norm3)
    return ours.eval(), theirs.eval()


def _keep(lengths, n):
    """(B, 1, 1, n) bool, True = real position."""
    return (torch.arange(n)[None, :] < torch.tensor(lengths)[:, None])[:, None, None, :]


@pytest.mark.parametrize("backend", ["sdpa", "eager"])
@pytest.mark.parametrize("norm_first", [False, True], ids=["post-LN", "pre-LN"])
def test_encoder_layer_matches_torch(norm_first, backend, no_torch_fastpath):
    """EncoderLayer == nn.TransformerEncoderLayer (same weights, key-padding mask), all positions."""
    ours, theirs = _encoder_pair(norm_first, backend)
    x = torch.randn(3, 7, D)
    keep = _keep([7, 5, 2], 7)
    with torch.no_grad():
        ref = theirs(x, src_key_padding_mask=~keep[:, 0, 0])
        out, _ = ours(x, attn_mask=keep)
    assert out.shape == ref.shape == (3, 7, D)
    assert (out - ref).abs().max() <= TOL


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-LN", "pre-LN"])
def test_encoder_layer_matches_torch_without_mask(norm_first, no_torch_fastpath):
    """EncoderLayer == nn.TransformerEncoderLayer with no mask at all."""
    ours, theirs = _encoder_pair(norm_first, "sdpa")
    x = torch.randn(2, 5, D)
    with torch.no_grad():
        assert (ours(x)[0] - theirs(x)).abs().max() <= TOL


@pytest.mark.parametrize("backend", ["sdpa", "eager"])
@pytest.mark.parametrize("norm_first", [False, True], ids=["post-LN", "pre-LN"])
def test_decoder_layer_matches_torch(norm_first, backend, no_torch_fastpath):
    """DecoderLayer == nn.TransformerDecoderLayer with causal target mask, target and memory padding."""
    ours, theirs = _decoder_pair(norm_first, backend)
    tgt, memory = torch.randn(3, 6, D), torch.randn(3, 8, D)
    tgt_keep, src_keep = _keep([6, 4, 1], 6), _keep([8, 3, 5], 8)
    blocked = ~torch.ones(6, 6, dtype=torch.bool).tril()  # torch polarity: True = may NOT attend
    with torch.no_grad():
        ref = theirs(
            tgt,
            memory,
            tgt_mask=blocked,
            tgt_key_padding_mask=~tgt_keep[:, 0, 0],
            memory_key_padding_mask=~src_keep[:, 0, 0],
        )
        out, _ = ours(tgt, memory, tgt_mask=tgt_keep, src_mask=src_keep, is_causal=True)
    assert out.shape == ref.shape == (3, 6, D)
    assert (out - ref).abs().max() <= TOL


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-LN", "pre-LN"])
def test_decoder_layer_causal_only_matches_torch(norm_first, no_torch_fastpath):
    """DecoderLayer with is_causal only (no self mask) == torch with the square subsequent mask."""
    ours, theirs = _decoder_pair(norm_first, "sdpa")
    tgt, memory = torch.randn(2, 5, D), torch.randn(2, 4, D)
    float_mask = nn.Transformer.generate_square_subsequent_mask(5)  # additive -inf form
    with torch.no_grad():
        ref = theirs(tgt, memory, tgt_mask=float_mask, tgt_is_causal=True)
        out, _ = ours(tgt, memory, is_causal=True)
    assert (out - ref).abs().max() <= TOL


def test_layer_parity_is_sensitive_to_the_mask(no_torch_fastpath):
    """Sanity check of the parity harness: without the causal mask ours no longer matches torch's
    causal output (so the parity tests above can fail)."""
    ours, theirs = _decoder_pair(False, "sdpa")
    tgt, memory = torch.randn(2, 5, D), torch.randn(2, 4, D)
    blocked = ~torch.ones(5, 5, dtype=torch.bool).tril()
    with torch.no_grad():
        ref = theirs(tgt, memory, tgt_mask=blocked)
        out, _ = ours(tgt, memory, is_causal=False)
    assert (out - ref).abs().max() > 1e-3


def test_residual_norm_post_and_pre_order():
    """post-LN = LayerNorm(x + f(x)); pre-LN = x + f(LayerNorm(x)) (dropout off in eval)."""
    x = torch.randn(2, 3, D)
    f = nn.Linear(D, D)
    for norm_first in (False, True):
        block = ResidualNorm(D, dropout=0.5, norm_first=norm_first).eval()
        with torch.no_grad():
            block.norm.weight.uniform_(0.5, 1.5)
            out, extra = block(x, lambda h: (f(h), "extra"))
            expected = x + f(block.norm(x)) if norm_first else block.norm(x + f(x))
        assert extra == "extra"
        assert torch.allclose(out, expected, atol=1e-6)


def test_dyt_starts_at_the_configured_alpha_everywhere():
    """``dyt_alpha`` (α₀, Zhu et al. 2025) reaches every DyT of a model: the sub-layers' and the
    final norm; a non-positive one is refused by the config in one line."""
    from qkv.models.config import LMConfig
    from qkv.models.decoder_lm import DecoderLM
    from qkv.nn.norms import DyT

    config = LMConfig(vocab_size=20, d_model=8, n_heads=2, d_ff=16, n_layers=2, norm="dyt", dyt_alpha=0.2)
    model = DecoderLM(config)
    alphas = [m.alpha.item() for m in model.modules() if isinstance(m, DyT)]
    assert len(alphas) == 2 * 2 + 1 and alphas == pytest.approx([0.2] * 5)
    with pytest.raises(ValueError, match=r"dyt_alpha \(0.0\) must be > 0"):
        LMConfig(vocab_size=20, dyt_alpha=0.0)
