"""Named activations (qkv.explain.activations): every family's cached intermediates rebuild its
own forward pass, the logit lens's last layer is the model's logits, and a KV-cached decode
records what the full forward records at the same position."""

from __future__ import annotations

import pytest
import torch

from qkv.explain.activations import logit_lens, readout, record_activations, run_with_cache
from qkv.models.caption import CaptionModel
from qkv.models.config import (
    CaptionConfig,
    DiffusionLMConfig,
    EncoderConfig,
    LMConfig,
    RNNConfig,
    TransformerConfig,
    ViTConfig,
)
from qkv.models.decoder_lm import DecoderLM
from qkv.models.diffusion_lm import DiffusionLM
from qkv.models.encoder import EncoderModel
from qkv.models.rnn import RNNSeq2Seq
from qkv.models.transformer import Transformer
from qkv.models.vit import VisionTransformer
from qkv.nn.attention import MultiHeadAttention

TOL = 1e-5
SMALL = dict(d_model=16, n_heads=2, d_ff=32, max_len=32)


def _tokens(vocab: int, shape: tuple[int, int] = (2, 7)) -> torch.Tensor:
    return torch.randint(4, vocab, shape)


def _translator(norm_first: bool) -> tuple[torch.nn.Module, tuple]:
    cfg = TransformerConfig(
        src_vocab_size=40,
        tgt_vocab_size=40,
        n_encoder_layers=2,
        n_decoder_layers=2,
        norm_first=norm_first,
        **SMALL,
    )
    return Transformer(cfg), (_tokens(40, (2, 9)), _tokens(40))


def _lm() -> tuple[torch.nn.Module, tuple]:
    return DecoderLM(LMConfig(vocab_size=30, n_layers=3, positional="rotary", **SMALL)), (_tokens(30),)


def _diffusion() -> tuple[torch.nn.Module, tuple]:
    cfg = DiffusionLMConfig(vocab_size=31, mask_id=30, n_layers=2, **SMALL)
    return DiffusionLM(cfg), (_tokens(30),)


def _encoder() -> tuple[torch.nn.Module, tuple]:
    cfg = EncoderConfig(vocab_size=33, n_layers=2, num_labels=2, norm="dyt", **SMALL)
    return EncoderModel(cfg), (_tokens(33),)


def _vit() -> tuple[torch.nn.Module, tuple]:
    cfg = ViTConfig(image_size=8, patch_size=2, channels=1, n_layers=2, num_labels=3, **SMALL)
    return VisionTransformer(cfg), (torch.randn(2, 1, 8, 8),)


def _captioner() -> tuple[torch.nn.Module, tuple]:
    cfg = CaptionConfig(
        image_size=28,
        patch_size=7,
        vocab_size=24,
        n_encoder_layers=1,
        n_decoder_layers=2,
        **{**SMALL, "max_len": 12},
    )
    return CaptionModel(cfg), (torch.rand(2, 1, 28, 28), _tokens(24, (2, 6)))


FAMILIES = {
    "translation (post-LN)": lambda: _translator(False),
    "translation (pre-LN)": lambda: _translator(True),
    "lm": _lm,
    "diffusion-lm": _diffusion,
    "encoder (DyT)": _encoder,
    "vit": _vit,
    "caption": _captioner,
}


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, atol=TOL, rtol=TOL)


def _check_sublayer(cache, sub: str, stream: torch.Tensor, norm_first: bool) -> torch.Tensor:
    """The sub-layer ``sub`` reads ``stream`` and adds its output back (§3.1); returns the
    stream after it, as the cache has it."""
    out = cache[f"{sub}.out"]
    if norm_first:  # x + Sublayer(LN(x))
        _close(cache[f"{sub}.norm_in"], stream)
        _close(cache[f"{sub}.resid_post"], stream + out)
    else:  # LN(x + Sublayer(x))
        _close(cache[f"{sub}.norm_in"], stream + out)
        _close(cache[f"{sub}.resid_post"], cache[f"{sub}.norm_out"])
    return cache[f"{sub}.resid_post"]


def _check_attention(model, cache, sub: str) -> None:
    module = model.get_submodule(sub)
    pattern, v, z = cache[f"{sub}.pattern"], cache[f"{sub}.v"], cache[f"{sub}.z"]
    _close(pattern.sum(-1), torch.ones_like(pattern.sum(-1)))
    _close(z, (pattern @ v).transpose(1, 2))  # Eq. 1, per head, before W_O
    _close(cache[f"{sub}.out"], module.w_o(z.flatten(-2)))


def _check_ffn(model, cache, sub: str) -> None:
    module = model.get_submodule(sub)
    _close(cache[f"{sub}.hidden"], module.activation(cache[f"{sub}.pre"]))
    _close(cache[f"{sub}.out"], module.w_2(cache[f"{sub}.hidden"]))


@pytest.mark.parametrize("family", FAMILIES)
@torch.no_grad()
def test_the_cache_rebuilds_the_forward_pass(family):
    torch.manual_seed(0)
    model, inputs = FAMILIES[family]()
    model.eval()
    output, cache = run_with_cache(model, *inputs)
    norm_first = model.config.norm_first
    stacks = [s for s in ("encoder", "decoder") if cache.layers(s)] or [""]
    for stack in stacks:
        paths = cache.layers(stack)
        assert paths, stack
        stream = cache[f"{paths[0]}.resid_pre"]
        for path in paths:
            _close(cache[f"{path}.resid_pre"], stream)
            subs = ["self_attn"] + (["cross_attn"] if f"{path}.cross_attn.out" in cache else []) + ["ffn"]
            for sub in subs:
                stream = _check_sublayer(cache, f"{path}.{sub}", stream, norm_first)
                if sub == "ffn":
                    _check_ffn(model, cache, f"{path}.{sub}")
                else:
                    _check_attention(model, cache, f"{path}.{sub}")
            _close(cache[f"{path}.resid_post"], stream)
        assert cache.residual_stream(stack).shape[0] == len(paths) + 1
    _close(cache["logits"], output.logits)
    lens = logit_lens(model, cache)
    assert lens.shape[0] == len(cache.layers(readout(model)[0]))
    _close(lens[-1], output.logits)  # the last layer's lens is the model's own output


def test_names_say_where_a_value_lives():
    torch.manual_seed(0)
    model, inputs = _translator(False)
    _, cache = run_with_cache(model.eval(), *inputs)
    b, s = inputs[0].shape
    t = inputs[1].size(1)
    assert cache["src_embed"].shape == (b, s, 16)
    assert cache["encoder"].shape == (b, s, 16)  # memory
    assert cache["decoder.layers.1.cross_attn.pattern"].shape == (b, 2, t, s)
    assert cache["decoder.layers.0.self_attn.q"].shape == (b, 2, t, 8)
    assert cache["encoder.layers.0.ffn.hidden"].shape == (b, s, 32)
    assert cache["generator"].shape == (b, t, 40)
    # the look-ahead mask really blocks: no weight on a later target position
    assert cache["decoder.layers.0.self_attn.pattern"].triu(1).abs().max() == 0


def test_bad_names_and_layers_get_one_line():
    model, inputs = _lm()
    _, cache = run_with_cache(model.eval(), *inputs)
    with pytest.raises(
        KeyError, match=r"unknown activation name 'layers.0.ffn.hiden'; did you mean layers.0.ffn.hidden"
    ):
        cache["layers.0.ffn.hiden"]
    with pytest.raises(IndexError, match="layer 3 out of range: the model has 3 layers"):
        cache.layer(3)
    assert cache.layer(-1) == "layers.2"


def test_hooks_leave_with_the_block():
    model, inputs = _lm()
    with pytest.raises(RuntimeError, match="boom"), record_activations(model):
        raise RuntimeError("boom")
    hooks = [m for m in model.modules() if m._forward_hooks or m._forward_pre_hooks]
    assert hooks == [] and all(not m.head_hooks for m in model.modules() if isinstance(m, MultiHeadAttention))


@torch.no_grad()
def test_a_kv_cached_decode_records_what_the_full_forward_does():
    torch.manual_seed(0)
    model, (tokens,) = _lm()
    model.eval()
    tokens = tokens[:1]
    _, full = run_with_cache(model, tokens)
    caches = model.new_caches()
    for t in range(tokens.size(1)):
        _, step = run_with_cache(model, tokens[:, t : t + 1], caches=caches)
        for name in full:
            if name.endswith((".k", ".v")):  # every cached key so far
                _close(step[name], full[name][:, :, : t + 1])
            elif name.endswith((".pattern", ".scores")):  # the new query's row over the keys so far
                _close(step[name], full[name][:, :, t : t + 1, : t + 1])
            elif name.endswith(".q"):
                _close(step[name], full[name][:, :, t : t + 1])
            elif name != "positional":
                _close(step[name], full[name][:, t : t + 1])


@torch.no_grad()
def test_the_translators_decoding_steps_are_recorded_too():
    torch.manual_seed(0)
    model, (src, tgt) = _translator(True)
    model.eval()
    _, full = run_with_cache(model, src[:1], tgt[:1, :4])
    memory, src_mask, _ = model.encode(src[:1])
    caches = model.new_caches()
    for t in range(4):
        with record_activations(model) as step:
            model.decode(tgt[:1, t : t + 1], memory, src_mask, caches=caches, start_pos=t)
        _close(step["decoder.layers.1.resid_post"], full["decoder.layers.1.resid_post"][:, t : t + 1])
        _close(step["decoder.layers.0.cross_attn.k"], full["decoder.layers.0.cross_attn.k"])


def test_the_rnn_has_its_parts_but_no_residual_stream():
    cfg = RNNConfig(src_vocab_size=30, tgt_vocab_size=30, d_model=16, max_len=32)
    model = RNNSeq2Seq(cfg).eval()
    out, cache = run_with_cache(model, _tokens(30), _tokens(30, (2, 5)))
    _close(cache["logits"], out.logits)
    assert cache["src_embed"].shape == (2, 7, 16)
    with pytest.raises(ValueError, match="RNNSeq2Seq has no residual stream"):
        logit_lens(model, cache)
