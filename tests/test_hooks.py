"""Hook points that read and write (qkv.explain.hooks, qkv.explain.interventions), for every
family: an identity hook leaves the output bit for bit, a point replaced by its recorded value
leaves it unchanged, zeroing every head of a layer is removing that attention sub-layer by hand,
and the helpers (head and neuron ablation, patching, steering, the patching table) do what they
say."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from test_activations import FAMILIES, SMALL, _lm

from qkv.explain import (
    ablate_heads,
    ablate_neurons,
    activation_patching,
    hook_points,
    hooked,
    patch_from,
    record_activations,
    run_with_cache,
    run_with_hooks,
    steer,
)
from qkv.explain.activations import readout
from qkv.explain.capture import capture_steps
from qkv.models.config import RNNConfig, TransformerConfig
from qkv.models.rnn import RNNSeq2Seq
from qkv.models.transformer import Transformer
from qkv.nn.attention import MultiHeadAttention

HEADS = ("scores", "pattern")


def _logits(out) -> torch.Tensor:
    return out if isinstance(out, torch.Tensor) else out.logits


def _model(family: str):
    torch.manual_seed(0)
    model, inputs = FAMILIES[family]()
    with torch.no_grad():  # heads initialised to zero would hide every change
        for p in model.parameters():
            if not p.any():
                p.normal_(std=0.1)
    return model.eval(), inputs


def _attention_paths(model) -> list[str]:
    return [path for path, m in model.named_modules() if isinstance(m, MultiHeadAttention)]


@pytest.mark.parametrize("family", FAMILIES)
@torch.no_grad()
def test_an_identity_hook_on_every_point_leaves_the_output_bit_for_bit(family):
    model, inputs = _model(family)
    plain = _logits(model(*inputs))
    seen: list[str] = []

    def identity(value: torch.Tensor, name: str) -> torch.Tensor:
        seen.append(name)
        return value

    # the fused attention kernel runs unless the scores or the pattern are hooked
    fused = [(lambda name: not name.endswith(HEADS), identity)]
    assert torch.equal(_logits(run_with_hooks(model, *inputs, hooks=fused)), plain)
    # hooked scores and pattern: the explicit path of Eq. 1, the same numbers as recording
    recorded, _ = run_with_cache(model, *inputs)
    explicit = _logits(
        run_with_hooks(model, *inputs, hooks=[(lambda name: True, identity)], need_weights=True)
    )
    assert torch.equal(explicit, _logits(recorded))
    torch.testing.assert_close(explicit, plain, atol=1e-5, rtol=1e-5)
    names = set(hook_points(model))
    assert set(seen) <= names and {"logits", f"{_attention_paths(model)[0]}.pattern"} <= set(seen)


@pytest.mark.parametrize("family", FAMILIES)
@torch.no_grad()
def test_a_point_replaced_by_its_recorded_value_leaves_the_output(family):
    model, inputs = _model(family)
    out, cache = run_with_cache(model, *inputs)
    replaced: list[str] = []

    def recorded(value: torch.Tensor, name: str) -> torch.Tensor:
        replaced.append(name)
        return cache[name].clone()

    again = run_with_hooks(model, *inputs, hooks=[(lambda name: name in cache, recorded)], need_weights=True)
    assert torch.equal(_logits(again), _logits(out))
    assert len(set(replaced)) == len(cache)


@pytest.mark.parametrize("family", FAMILIES)
@torch.no_grad()
def test_zeroing_every_head_of_a_layer_is_removing_its_attention_by_hand(family):
    model, inputs = _model(family)
    for path in _attention_paths(model):
        module = model.get_submodule(path)
        ablated = _logits(run_with_hooks(model, *inputs, hooks=ablate_heads(path, range(module.n_heads))))

        def without(x: torch.Tensor, *args, module=module, **kwargs):
            bias = module.w_o.bias
            return torch.zeros_like(x) + (0 if bias is None else bias), None  # W_O's bias alone

        module.forward = without
        try:
            by_hand = _logits(model(*inputs))
        finally:
            del module.forward
        torch.testing.assert_close(ablated, by_hand, atol=1e-6, rtol=1e-6)
        assert not torch.allclose(ablated, _logits(model(*inputs)), atol=1e-4)


def test_the_rnn_baseline_has_hook_points_on_its_parts():
    cfg = RNNConfig(src_vocab_size=30, tgt_vocab_size=30, d_model=16, max_len=32)
    model = RNNSeq2Seq(cfg).eval()
    src, tgt = torch.randint(4, 30, (2, 7)), torch.randint(4, 30, (2, 5))
    with torch.no_grad():
        plain = model(src, tgt).logits
        zeroed = run_with_hooks(
            model, src, tgt, hooks=[("src_embed", lambda v, n: torch.zeros_like(v))]
        ).logits
    assert "src_embed" in hook_points(model) and not torch.allclose(plain, zeroed)


def test_the_head_ablation_is_two_lines_and_zeroes_that_head_only():
    model, (tokens,) = _lm()
    model.eval()
    logits = run_with_hooks(model, tokens, hooks=ablate_heads("layers.1.self_attn", 1)).logits
    # the recording block inside the hooks' block: its hook runs after theirs, so it sees their value
    with (
        hooked(model, ablate_heads("layers.1.self_attn", 1)),
        record_activations(model, "layers.1.self_attn.z") as cache,
    ):
        model(tokens)
    z = cache["layers.1.self_attn.z"]
    assert torch.equal(z[:, :, 1], torch.zeros_like(z[:, :, 1])) and z[:, :, 0].abs().sum() > 0
    assert not torch.allclose(logits, model(tokens).logits)


@torch.no_grad()
def test_mean_ablation_replaces_a_neuron_with_its_mean_over_the_run():
    model, (tokens,) = _lm()
    model.eval()
    with record_activations(model, "layers.0.ffn.hidden") as clean:
        model(tokens)
    ablation = ablate_neurons("layers.0.ffn", [3, 5], mode="mean", positions=[2])
    with hooked(model, ablation), record_activations(model, "layers.0.ffn.hidden") as cache:
        model(tokens)
    hidden, before = cache["layers.0.ffn.hidden"], clean["layers.0.ffn.hidden"]
    torch.testing.assert_close(hidden[:, 2, [3, 5]], before[:, :, [3, 5]].mean(dim=(0, 1)).expand(2, 2))
    keep = torch.ones_like(hidden, dtype=torch.bool)
    keep[:, 2, 3] = keep[:, 2, 5] = False
    assert torch.equal(hidden[keep], before[keep])
    with pytest.raises(ValueError, match="unknown ablation mode 'half'"):
        ablate_neurons("layers.0.ffn", 1, mode="half")  # type: ignore[arg-type]


@torch.no_grad()
def test_patching_every_position_of_a_layer_restores_the_clean_run():
    model, (tokens,) = _lm()
    model.eval()
    clean, corrupted = tokens[:1], tokens[1:]
    out, cache = run_with_cache(model, clean)
    patched = run_with_hooks(model, corrupted, hooks=patch_from(cache, "layers.0.resid_pre"))
    torch.testing.assert_close(patched.logits, out.logits, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match=r"cannot patch 'layers.0.resid_pre': the source holds \(1, 7, 16\)"):
        run_with_hooks(model, tokens, hooks=patch_from(cache, "layers.0.resid_pre"))


@torch.no_grad()
def test_the_patching_table_restores_the_last_position_at_the_last_layer():
    torch.manual_seed(1)
    model, (tokens,) = _lm()
    model.eval()
    clean, corrupted = tokens[:1], tokens[1:]
    answer = int(model(clean).logits[0, -1].argmax())

    def metric(out) -> float:
        return float(out.logits[0, -1].log_softmax(-1)[answer])

    table = activation_patching(model, clean, corrupted, metric, point="resid_post")
    assert table.values.shape == (3, 7) and table.rows == ["layers.0", "layers.1", "layers.2"]
    assert table.normalised()[-1, -1] == pytest.approx(1.0, abs=1e-4)  # the logits read it alone
    assert table.normalised()[-1, :-1].abs().max() < 1e-4  # earlier positions: not read by the last
    heads = activation_patching(model, clean, corrupted, metric, point="self_attn.z", by="head")
    assert heads.values.shape == (3, 2) and heads.columns == ["head 0", "head 1"]
    with pytest.raises(ValueError, match="'resid_post' has no heads"):
        activation_patching(model, clean, corrupted, metric, point="resid_post", by="head")


@torch.no_grad()
def test_a_steering_vector_is_added_to_the_stream_the_head_reads():
    model, (tokens,) = _lm()
    model.eval()
    vector = torch.randn(16)
    out, cache = run_with_cache(model, tokens, names_filter="layers.2.resid_post")
    steered = run_with_hooks(
        model, tokens, hooks=steer("layers.2.resid_post", vector, scale=2.0, positions=[-1])
    )
    _, head = readout(model)
    stream = cache["layers.2.resid_post"].clone()
    stream[:, -1] += 2.0 * vector
    torch.testing.assert_close(steered.logits, head(stream), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(steered.logits[:, :-1], out.logits[:, :-1])


def test_bad_hooks_get_one_line_and_leave_nothing_behind():
    model, (tokens,) = _lm()
    with pytest.raises(
        ValueError, match=r"unknown hook point 'layers.0.self_attn.zz' for DecoderLM; did you mean"
    ):
        run_with_hooks(model, tokens, hooks=[("layers.0.self_attn.zz", lambda v, n: None)])
    with pytest.raises(
        ValueError, match=r"the hook on 'layers.0.ffn.hidden' returned \(3,\); it must return"
    ):
        run_with_hooks(model, tokens, hooks=[("layers.0.ffn.hidden", lambda v, n: torch.zeros(3))])
    with pytest.raises(TypeError, match="a hook's target is a point name or a filter function"):
        run_with_hooks(model, tokens, hooks=[(5, lambda v, n: None)])  # type: ignore[list-item]
    with pytest.raises(RuntimeError, match="boom"), hooked(model, ablate_heads("layers.0.self_attn", 0)):
        raise RuntimeError("boom")
    assert [m for m in model.modules() if m._forward_hooks or m._forward_pre_hooks] == []
    assert all(not m.head_hooks for m in model.modules() if isinstance(m, MultiHeadAttention))


@torch.no_grad()
def test_nested_blocks_run_outer_then_inner_and_unwind():
    model, (tokens,) = _lm()
    model.eval()
    order: list[str] = []
    outer = [("layers.0.self_attn.q", lambda v, n: order.append("outer"))]
    inner = [("layers.0.self_attn.q", lambda v, n: order.append("inner"))]
    with hooked(model, outer):
        with hooked(model, inner):
            model(tokens)
        model(tokens)
    model(tokens)
    assert order == ["outer", "inner", "outer"]


@torch.no_grad()
def test_a_shared_embedding_and_the_positions_are_named_by_role():
    torch.manual_seed(0)
    cfg = TransformerConfig(
        src_vocab_size=40, tgt_vocab_size=40, n_encoder_layers=1, n_decoder_layers=1, **SMALL
    )
    model = Transformer(replace(cfg, share_embeddings=True)).eval()
    src, tgt = torch.randint(4, 40, (2, 9)), torch.randint(4, 40, (2, 7))
    assert model.src_embed is model.tgt_embed  # the translation recipe's default
    _, cache = run_with_cache(model, src, tgt)
    torch.testing.assert_close(cache["src_embed"], model.src_embed(src))
    torch.testing.assert_close(cache["tgt_embed"], model.tgt_embed(tgt))
    assert cache["src_positional"].shape == (1, 9, 16) and cache["tgt_positional"].shape == (1, 7, 16)
    assert "positional" not in cache and "encode" not in model.__dict__  # the role wrapper is gone
    # writing one role leaves the other
    zeroed = run_with_hooks(model, src, tgt, hooks=[("tgt_embed", lambda v, n: torch.zeros_like(v))])
    with (
        hooked(model, [("tgt_embed", lambda v, n: torch.zeros_like(v))]),
        record_activations(model, "encoder") as enc,
    ):
        model(src, tgt)
    torch.testing.assert_close(enc["encoder"], cache["encoder"])
    assert not torch.allclose(zeroed.logits, model(src, tgt).logits)


@torch.no_grad()
def test_recorded_keys_are_copies_a_beam_reorder_cannot_change():
    torch.manual_seed(0)
    model, (tokens,) = _lm()
    model.eval()
    caches = model.new_caches()
    model(tokens, caches=caches)
    with record_activations(model, "layers.0.self_attn.k") as cache:
        model(tokens[:, :1], caches=caches)
    before = cache["layers.0.self_attn.k"].clone()
    for c in caches:
        c.reorder(torch.tensor([1, 0]))
    model(tokens[:, 1:2], caches=caches)
    assert torch.equal(cache["layers.0.self_attn.k"], before)


@torch.no_grad()
def test_the_cache_refuses_names_that_are_not_strings_in_one_line():
    model, (tokens,) = _lm()
    _, cache = run_with_cache(model.eval(), tokens)
    with pytest.raises(KeyError, match="activation names are strings such as 'layers.0.resid_post', got 5"):
        cache[5]  # type: ignore[index]
    assert 5 not in cache and cache.get(5) is None  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="a layer index is an int, got '1'"):
        cache.layer("1")  # type: ignore[arg-type]


@torch.no_grad()
def test_a_cached_step_records_its_pattern_and_steps_through():
    model, (tokens,) = _lm()
    model.eval()
    caches = model.new_caches()
    model(tokens[:, :4], caches=caches)
    with record_activations(model) as cache:
        model(tokens[:, 4:5], caches=caches)
    assert cache["layers.0.self_attn.pattern"].shape == (2, 2, 1, 5)
    module = model.get_submodule("layers.0.self_attn")
    steps = capture_steps(module, lambda: model(tokens))
    _, full = run_with_cache(model, tokens, names_filter=lambda name: name.startswith("layers.0.self_attn."))
    torch.testing.assert_close(steps.weights, full["layers.0.self_attn.pattern"])
    torch.testing.assert_close(steps.masked, full["layers.0.self_attn.scores"])
    torch.testing.assert_close(steps.output.transpose(1, 2), full["layers.0.self_attn.z"])
    torch.testing.assert_close(steps.weights @ steps.v, steps.output)  # Eq. 1
