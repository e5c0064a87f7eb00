"""The recurrent baseline (issue 29): the lecture's recurrence, the GRU step, additive attention,
the bottleneck, the Transformer without positions, and RNN runs through qkv's tools."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from qkv.errors import ConfigError, QkvError
from qkv.inference.search import beam_search, greedy_decode
from qkv.inference.translator import Translator
from qkv.models.config import RNNConfig, TransformerConfig
from qkv.models.rnn import RNNSeq2Seq, final_states
from qkv.models.transformer import Transformer
from qkv.nn.recurrent import AdditiveAttention, elman_step, gru_step
from qkv.recipes.loading import load_explainer
from qkv.runs import load_run

PAD, BOS, EOS = 0, 1, 2


def _rnn(**kw) -> RNNSeq2Seq:
    cfg = dict(src_vocab_size=40, tgt_vocab_size=40, d_model=16, dropout=0.0, max_len=32)
    return RNNSeq2Seq(RNNConfig(**{**cfg, **kw})).eval()


SRC = torch.tensor([[5, 6, 7, 8, 9, EOS], [10, 11, EOS, PAD, PAD, PAD]])
TGT = torch.tensor([[BOS, 12, 13, 14], [BOS, 15, 16, PAD]])


# ---------- the notes' recurrence and the GRU


def test_the_notes_recurrence_is_one_step_of_torch_rnn():
    rnn = nn.RNN(5, 7, nonlinearity="tanh", batch_first=True)
    x, h = torch.randn(3, 5), torch.randn(3, 7)
    _, want = rnn(x[:, None], h[None])
    got, y = elman_step(
        x, h, rnn.weight_ih_l0.T, rnn.weight_hh_l0.T, w_hy=None, bias=rnn.bias_ih_l0 + rnn.bias_hh_l0
    )
    torch.testing.assert_close(got, want[0], atol=1e-6, rtol=0)
    assert y is None
    w_hy = torch.randn(7, 4)
    _, y = elman_step(x, h, rnn.weight_ih_l0.T, rnn.weight_hh_l0.T, w_hy)
    h_plain = torch.tanh(x @ rnn.weight_ih_l0.T + h @ rnn.weight_hh_l0.T)  # the lecture: no biases
    torch.testing.assert_close(y, h_plain @ w_hy)


def test_gru_step_is_one_step_of_torch_gru():
    gru = nn.GRU(5, 7, batch_first=True)
    x, h = torch.randn(3, 5), torch.randn(3, 7)
    _, want = gru(x[:, None], h[None])
    got = gru_step(x, h, gru.weight_ih_l0, gru.weight_hh_l0, gru.bias_ih_l0, gru.bias_hh_l0)
    torch.testing.assert_close(got, want[0], atol=1e-6, rtol=0)


# ---------- additive attention


def test_additive_attention_weights_sum_to_one_over_real_positions_only():
    attn = AdditiveAttention(8, 6, 4)
    keys = torch.randn(2, 5, 6)
    mask = torch.tensor([[True] * 5, [True, True, False, False, False]])
    context, weights = attn(torch.randn(2, 8), attn.project_keys(keys), keys, mask)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2))
    assert torch.all(weights[1, 2:] == 0) and torch.all(weights[1, :2] > 0)
    torch.testing.assert_close(context, torch.einsum("bs,bsd->bd", weights, keys))


def test_model_alignment_sums_to_one_and_ignores_padding():
    model = _rnn()
    alpha = model(SRC, TGT, need_weights=True).cross_attentions[0]  # (B, 1, T, S)
    assert alpha.shape == (2, 1, 4, 6)
    torch.testing.assert_close(alpha.sum(-1), torch.ones(2, 1, 4))
    assert torch.all(alpha[1, :, :, 3:] == 0)


def test_what_sits_at_source_padding_changes_nothing():
    model = _rnn(share_embeddings=False)
    base = model(SRC, TGT).logits
    with torch.no_grad():
        model.src_embed.weight[PAD] += 1.0  # packing keeps the encoder from reading padding
    after = model(SRC, TGT).logits
    assert torch.equal(after, base)


# ---------- the bottleneck


def test_the_bottleneck_decoder_sees_only_the_final_states():
    torch.manual_seed(1)
    for attention, should_change in (("none", False), ("additive", True)):
        model = _rnn(attention=attention)
        memory, mask, _ = model.encode(SRC)
        base = model.decode(TGT, memory, mask)[0]
        changed = memory.clone()
        changed[0, 1:4] += torch.randn(3, memory.size(-1))  # states between the first and last
        changed[0, 4, :16] += 1.0  # the forward half at the second-to-last real position
        after = model.decode(TGT, changed, mask)[0]
        assert (not torch.allclose(after, base)) == should_change, attention
        if not should_change:
            assert torch.equal(after[0], base[0])


def test_final_states_are_what_the_bidirectional_encoder_ends_with():
    model = _rnn()
    memory, mask, _ = model.encode(SRC)
    emb = model.src_embed(SRC)
    for b, n in enumerate((6, 3)):  # each sentence alone, unpadded: nn.GRU's own final states
        _, h_n = model.encoder(emb[b : b + 1, :n])
        torch.testing.assert_close(final_states(memory, mask)[b], torch.cat([h_n[0, 0], h_n[1, 0]]))


# ---------- decoding and runs


@pytest.mark.parametrize("attention,cell", [("additive", "gru"), ("none", "gru"), ("additive", "lstm")])
def test_incremental_decoding_equals_the_full_forward(attention, cell):
    model = _rnn(attention=attention, cell=cell, n_encoder_layers=2, n_decoder_layers=2)
    full = model(SRC, TGT).logits
    memory, mask, _ = model.encode(SRC)
    caches = model.new_caches()
    steps = [model.decode(TGT[:, t : t + 1], memory, mask, caches=caches, start_pos=t)[0] for t in range(4)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=0)
    assert beam_search(model, SRC, beam_size=1, max_new_tokens=6) == greedy_decode(
        model, SRC, max_new_tokens=6
    )


def test_a_tiny_rnn_overfits_a_handful_of_pairs():
    torch.manual_seed(0)
    model = _rnn(d_model=32).train()
    src = torch.randint(3, 40, (8, 6))
    src[:, -1] = EOS
    body = torch.flip(src[:, :-1], dims=[1])  # reverse the source: needs the alignment, not just a bag
    tgt_in = torch.cat([torch.full((8, 1), BOS), body], 1)
    tgt_out = torch.cat([body, torch.full((8, 1), EOS)], 1)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(200):
        loss = nn.functional.cross_entropy(model(src, tgt_in).logits.transpose(1, 2), tgt_out)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.05
    assert greedy_decode(model.eval(), src) == body.tolist()


def test_an_rnn_run_reloads_to_identical_outputs(tiny_runs):
    model, tok = load_run(tiny_runs["translation-rnn"])
    again, _ = load_run(tiny_runs["translation-rnn"])
    assert isinstance(model, RNNSeq2Seq)
    assert torch.equal(model(SRC, TGT).logits, again(SRC, TGT).logits)
    translator = Translator(model, tok, beam_size=2)
    assert translator.translate(["Ein Mann fährt.", ""]) == Translator(again, tok, beam_size=2).translate(
        ["Ein Mann fährt.", ""]
    )


def test_the_explainer_shows_the_alignment_and_refuses_the_bottleneck(tiny_runs, tmp_path):
    explainer = load_explainer(tiny_runs["translation-rnn"])
    assert explainer.kinds == ("cross",) and explainer.info()["step_through"] is False
    result = explainer.explain("Ein Mann liest ein Buch.")
    (amap,) = result.attention
    assert amap.weights.shape[:2] == (1, 1)
    torch.testing.assert_close(amap.weights.sum(-1), torch.ones(amap.weights.shape[:-1]), atol=1e-5, rtol=0)
    with pytest.raises(QkvError, match="additive attention"):
        explainer.steps("Ein Mann.", "cross", 0, 0)
    from qkv.explain.plots import write_pictures

    names = {p.name for p in write_pictures(explainer, "Ein Mann liest.", tmp_path / "png")}
    assert {"alignment.png", "attention_cross.png"} <= names and "steps.png" not in names

    bottleneck = tmp_path / "bottleneck"
    bottleneck.mkdir()
    for name in ("tokenizer.json", "train_config.json"):
        (bottleneck / name).write_bytes((tiny_runs["translation-rnn"] / name).read_bytes())
    cfg = json.loads((tiny_runs["translation-rnn"] / "config.json").read_text())
    from qkv.files import save_weights

    model = RNNSeq2Seq(RNNConfig(**{**cfg, "attention": "none"}))
    save_weights(model, bottleneck / "model.safetensors")
    model.config.save(bottleneck / "config.json")
    with pytest.raises(QkvError, match="bottleneck RNN.*no attention"):
        load_explainer(bottleneck)


def test_rnn_config_refuses_bad_values_in_one_line():
    with pytest.raises(ConfigError) as err:
        RNNConfig(d_model=0, cell="rnn", dropout=1.5, attention="dot")  # type: ignore[arg-type]
    message = str(err.value)
    assert "\n" not in message
    for name in ("d_model", "cell", "dropout", "attention"):
        assert name in message


# ---------- the Transformer without positions


def test_positional_none_makes_the_encoder_permutation_equivariant():
    """Without positions the encoder is permutation-equivariant; sinusoids (§3.5) and rotary
    positions break it."""

    def encoder_out(positional: str, src: torch.Tensor) -> torch.Tensor:
        torch.manual_seed(0)
        cfg = TransformerConfig(
            src_vocab_size=40,
            tgt_vocab_size=40,
            d_model=16,
            n_heads=2,
            d_ff=32,
            n_encoder_layers=2,
            n_decoder_layers=1,
            dropout=0.0,
            positional=positional,  # type: ignore[arg-type]
        )
        return Transformer(cfg).eval().encode(src)[0]

    src = torch.tensor([[5, 6, 7, 8, 9, EOS]])
    perm = torch.tensor([3, 0, 5, 1, 4, 2])
    for positional, equivariant in (("none", True), ("sinusoidal", False), ("rotary", False)):
        permuted_out = encoder_out(positional, src[:, perm])
        matches = torch.allclose(permuted_out, encoder_out(positional, src)[:, perm], atol=1e-5)
        assert matches == equivariant, positional
