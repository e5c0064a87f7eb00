"""Decoder-only language model: incremental decoding, sampling, padding, the sliding window,
causality, a torch.nn reference, its parts (CharTokenizer, RoPE, DyT, LMConfig, the LR schedule),
and the ``qkv train lm`` / ``generate`` / ``evaluate`` commands on real tiny-shakespeare."""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from cli_runs import run_main
from torch import nn
from torch_ref import copy_attention_from_torch

from qkv.cli import main
from qkv.data.text import IGNORE_INDEX, sequence_batch
from qkv.data.tokenizers import CharTokenizer, load_tokenizer
from qkv.errors import QkvError
from qkv.inference.lm import generate_tokens
from qkv.inference.sampling import check_sampling, choose_next, filter_logits, next_token_probs
from qkv.models.config import LMConfig
from qkv.models.decoder_lm import DecoderLM, position_ids
from qkv.nn.attention import MultiHeadAttention
from qkv.nn.norms import DyT, build_norm
from qkv.nn.positional import RotaryEmbedding
from qkv.recipes.lm import split_nll
from qkv.train.optim import warmup_cosine_lr

POSITIONALS = ["learned", "sinusoidal", "rotary"]
V = 13


def _lm(positional: str = "learned", norm: str = "layernorm", max_len: int = 32, **kw) -> DecoderLM:
    """A small random LM in eval mode. Weights are pushed far from the N(0, 0.02) init so the
    logits are well separated (greedy ties would make token comparisons meaningless); the head
    is untied by default because a random tied model mostly repeats its last token."""
    kw.setdefault("tie_embeddings", False)
    cfg = LMConfig(
        vocab_size=V,
        d_model=16,
        n_heads=2,
        d_ff=32,
        n_layers=2,
        max_len=max_len,
        positional=positional,
        norm=norm,
        **kw,
    )
    model = DecoderLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.4)
        model.embed.weight.mul_(2.5)  # as large as the sinusoids, so tokens matter as much
    return model.eval()


@torch.no_grad()
def _greedy_no_cache(model: DecoderLM, prompt: list[int], n: int) -> list[int]:
    """Re-run the model on the whole prefix each step; argmax of the last position."""
    seq = list(prompt)
    for _ in range(n):
        seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
    return seq[len(prompt) :]


def _prompt(n: int, seed: int) -> list[int]:
    return torch.randint(0, V, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


# ---------------------------------------------------------------- incremental decoding


@pytest.mark.parametrize("positional", POSITIONALS)
def test_cached_decoding_equals_full_recomputation(positional):
    """Prefill + one token at a time through the KV cache gives the logits of a full forward
    pass, and generate_tokens' greedy output equals re-running the whole prefix every step."""
    model = _lm(positional)
    tokens = torch.tensor([_prompt(20, 1)])
    with torch.no_grad():
        full = model(tokens).logits  # (1, 20, V)
        caches = model.new_caches()
        steps = [model(tokens[:, :6], caches=caches).logits]
        for t in range(6, 20):
            steps.append(model(tokens[:, t : t + 1], caches=caches).logits)
    assert caches[0].k.shape == (1, 2, 20, 8)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)

    seen = set()
    for seed, length in [(1, 5), (2, 3), (4, 8), (5, 1), (6, 5)]:
        prompt = _prompt(length, seed)
        cached = generate_tokens(model, [prompt], 25, do_sample=False)[0]
        assert len(cached) == 25
        assert cached == _greedy_no_cache(model, prompt, 25)
        seen.update(cached)
    assert len(seen) >= 4, "near-constant outputs would not test anything"


@pytest.mark.parametrize("positional", POSITIONALS)
def test_left_padded_batch_equals_one_by_one(positional):
    """Prompts of different lengths, generated together (left-padded, with masks and position
    ids), give exactly the tokens each prompt gets alone."""
    model = _lm(positional)
    prompts = [_prompt(3, 3), _prompt(9, 4), _prompt(1, 5), _prompt(6, 6)]
    batched = generate_tokens(model, prompts, 12, do_sample=False)
    alone = [generate_tokens(model, [p], 12, do_sample=False)[0] for p in prompts]
    assert batched == alone
    assert alone[0] == _greedy_no_cache(model, prompts[0], 12)


@pytest.mark.parametrize("positional", POSITIONALS)
def test_padded_sequence_batch_scores_each_sequence_as_alone(positional):
    """Per-sequence batches (protein corpora): right padding is never attended and never
    scored, so a sequence's summed NLL in a batch equals its NLL alone; a sequence longer than
    the context is scored on its first block_size + 1 tokens."""
    model = _lm(positional, max_len=8)
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(0, V, (n,), generator=g) for n in (3, 9, 6, 12)]
    x, y = sequence_batch(seqs, 8)
    assert x.shape == y.shape == (4, 8) and int((y != IGNORE_INDEX).sum()) == 2 + 8 + 5 + 8
    with torch.no_grad():
        batched = F.cross_entropy(model(x).logits.transpose(1, 2), y, reduction="none").sum(1)
        for row, s in enumerate(seqs):
            cut = s[:9]
            alone = F.cross_entropy(model(cut[None, :-1]).logits[0], cut[1:], reduction="sum")
            torch.testing.assert_close(batched[row], alone, atol=1e-5, rtol=1e-5)
        nll, n = split_nll(model, seqs, 8, batch_windows=3)  # sorted by length, two batches
    assert n == 23 and nll == pytest.approx(float(batched.sum()), rel=1e-5)
    with pytest.raises(QkvError, match="at least 2 tokens"):
        sequence_batch([torch.tensor([1])], 8)


def test_position_ids_of_left_padded_rows():
    mask = torch.tensor([[False, False, True, True], [True, True, True, True]])
    assert position_ids(mask).tolist() == [[0, 0, 0, 1], [0, 1, 2, 3]]


@pytest.mark.parametrize("positional", POSITIONALS)
def test_sliding_window_beyond_max_len(positional):
    """Generating past max_len warns once and keeps going; each token is the argmax of a fresh
    forward pass over the window the cache was rebuilt from (the last 3/4 max_len tokens
    whenever the cache is full)."""
    max_len, n = 12, 30
    model = _lm(positional, max_len=max_len)
    prompt = _prompt(5, 7)
    with pytest.warns(UserWarning, match="sliding window") as record:
        out = generate_tokens(model, [prompt], n, do_sample=False)[0]
    assert len(out) == n
    warned = [w for w in record if "sliding window" in str(w.message)]
    assert len(warned) == 1 and warned[0].filename == __file__, "the warning names its caller's line"

    keep = (3 * max_len) // 4
    seq, start, expected = list(prompt), 0, []
    with torch.no_grad():
        for _ in range(n):
            tok = int(model(torch.tensor([seq[start:]])).logits[0, -1].argmax())
            expected.append(tok)
            seq.append(tok)
            if len(seq) - 1 - start >= max_len:  # the cache is full: rebuild from the window
                start = len(seq) - keep
    assert out == expected


def test_prompt_longer_than_max_len_is_windowed_with_a_warning():
    model = _lm("learned", max_len=8)
    prompt = _prompt(20, 8)
    with pytest.warns(UserWarning, match="sliding window"):
        out = generate_tokens(model, [prompt], 3, do_sample=False)[0]
    with torch.no_grad():
        first = int(model(torch.tensor([prompt[-8:]])).logits[0, -1].argmax())
    assert len(out) == 3 and out[0] == first


def test_generate_tokens_rejects_bad_arguments():
    model = _lm()
    with pytest.raises(QkvError, match="max_new_tokens"):
        generate_tokens(model, [[1, 2]], 0)
    with pytest.raises(QkvError, match="at least one token"):
        generate_tokens(model, [[1], []], 3)
    with pytest.raises(QkvError, match="temperature"):
        generate_tokens(model, [[1]], 3, temperature=0.0)


def test_stop_tokens_end_a_row_and_are_kept():
    model = _lm()
    prompt = _prompt(4, 9)
    free = generate_tokens(model, [prompt], 10, do_sample=False)[0]
    stop = free[3]
    cut = generate_tokens(model, [prompt, prompt], 10, do_sample=False, stop_tokens=[stop])
    first = free.index(stop)
    assert cut == [free[: first + 1]] * 2


# ---------------------------------------------------------------- sampling


def test_top_k_1_sampling_equals_greedy():
    model = _lm("rotary")
    prompts = [_prompt(4, 10), _prompt(7, 11)]
    greedy = generate_tokens(model, prompts, 20, do_sample=False)
    g = torch.Generator().manual_seed(123)
    sampled = generate_tokens(model, prompts, 20, do_sample=True, top_k=1, temperature=1.5, generator=g)
    assert sampled == greedy


def test_temperature_near_zero_approaches_greedy():
    model = _lm("sinusoidal")
    prompts = [_prompt(4, 12), _prompt(2, 13)]
    greedy = generate_tokens(model, prompts, 20, do_sample=False)
    g = torch.Generator().manual_seed(7)
    cold = generate_tokens(model, prompts, 20, temperature=1e-4, generator=g)
    assert cold == greedy
    hot = generate_tokens(model, prompts, 20, temperature=5.0, generator=torch.Generator().manual_seed(7))
    assert hot != greedy, "at a high temperature the samples must differ from greedy"
    probs = next_token_probs(torch.tensor([[1.0, 0.99, 0.5]]), temperature=1e-4)
    assert probs[0, 0] == pytest.approx(1.0, abs=1e-6)


def test_top_p_keeps_exactly_the_nucleus():
    """Nucleus = smallest set of most likely tokens with cumulative probability >= p."""
    p = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = torch.stack([p.log(), p[[3, 1, 2, 0]].log()])  # second row: same, permuted
    inf = float("-inf")
    out = filter_logits(logits, top_p=0.7)
    expected = torch.tensor(
        [[math.log(0.5), math.log(0.3), inf, inf], [inf, math.log(0.3), inf, math.log(0.5)]]
    )
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(
        next_token_probs(logits, top_p=0.7), torch.tensor([[0.625, 0.375, 0, 0], [0, 0.375, 0, 0.625]])
    )
    assert torch.isfinite(filter_logits(logits, top_p=0.4)).sum(-1).tolist() == [1, 1]
    assert torch.isfinite(filter_logits(logits, top_p=0.9)).sum(-1).tolist() == [3, 3]
    torch.testing.assert_close(filter_logits(logits, top_p=1.0), logits)
    torch.testing.assert_close(filter_logits(logits, temperature=2.0), logits / 2)
    top2 = filter_logits(logits, top_k=2)
    assert torch.isfinite(top2).tolist() == [[True, True, False, False], [False, True, False, True]]

    g = torch.Generator().manual_seed(0)
    draws = choose_next(p.log().expand(4000, 4), top_p=0.7, generator=g)
    counts = torch.bincount(draws, minlength=4).tolist()
    assert counts[2] == counts[3] == 0
    assert counts[0] > 0 and counts[1] > 0
    assert counts[0] / 4000 == pytest.approx(0.625, abs=0.03)
    assert choose_next(logits, do_sample=False).tolist() == [0, 3]


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        (dict(temperature=0.0), "temperature"),
        (dict(temperature=-1.0), "temperature"),
        (dict(top_k=0), "top_k"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
    ],
)
def test_meaningless_sampling_settings_are_refused(kwargs, needle):
    with pytest.raises(QkvError, match=needle):
        check_sampling(**kwargs)


# ---------------------------------------------------------------- causality


@pytest.mark.parametrize(
    "positional, norm, norm_first, backend",
    [
        ("learned", "layernorm", True, "sdpa"),
        ("sinusoidal", "layernorm", True, "sdpa"),
        ("rotary", "layernorm", True, "sdpa"),
        ("learned", "dyt", True, "sdpa"),
        ("rotary", "dyt", True, "eager"),
        ("sinusoidal", "rmsnorm", False, "eager"),
    ],
)
def test_no_leakage_from_future_tokens(positional, norm, norm_first, backend):
    """Logits at positions <= t do not change when the tokens after t change."""
    model = _lm(positional, norm, norm_first=norm_first, attention_backend=backend)
    a = torch.randint(0, V, (2, 12))
    t = 5
    b = a.clone()
    b[:, t + 1 :] = (a[:, t + 1 :] + torch.randint(1, V, (2, 12 - t - 1))) % V
    assert (a[:, t + 1 :] != b[:, t + 1 :]).all()
    with torch.no_grad():
        la, lb = model(a).logits, model(b).logits
    torch.testing.assert_close(la[:, : t + 1], lb[:, : t + 1], atol=1e-6, rtol=1e-6)
    assert (la[:, t + 1 :] - lb[:, t + 1 :]).abs().max() > 1e-2, "later positions must see the change"


# ---------------------------------------------------------------- training


def test_tiny_lm_overfits_a_sentence():
    """A few hundred Adam steps on one sentence: loss < 0.05, and greedy decoding from its
    first character reproduces it."""
    text = "the quick brown fox jumps over the lazy dog."
    tok = CharTokenizer.train(text)
    ids = torch.tensor([tok.encode(text)])
    cfg = LMConfig(vocab_size=tok.vocab_size, d_model=32, n_heads=2, d_ff=64, n_layers=2, max_len=len(text))
    model = DecoderLM(cfg)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(300):
        logits = model(ids[:, :-1]).logits
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), ids[0, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.05
    model.eval()
    new = generate_tokens(model, [ids[0, :1].tolist()], len(text) - 1, do_sample=False)[0]
    assert tok.decode(ids[0, :1].tolist() + new) == text


def test_eval_outputs_follow_fused_optimizer_updates():
    """Validation after training steps sees the new weights: a fused AdamW (which updates in
    place without bumping tensor versions) trains between two eval-mode passes, and the second
    pass equals the attention recomputed by hand from the current packed weights."""
    mha = MultiHeadAttention(16, 2)
    x = torch.randn(2, 5, 16)
    opt = torch.optim.AdamW(mha.parameters(), lr=0.1, fused=True)
    mha.eval()
    with torch.no_grad():
        before = mha(x)[0]
    mha.train()
    mha(x)[0].pow(2).sum().backward()
    opt.step()
    mha.eval()
    with torch.no_grad():
        after = mha(x)[0]
        q, k, v = mha.w_qkv(x).chunk(3, dim=-1)  # rows: Q, then K, then V
    split = lambda t: t.view(2, 5, 2, 8).transpose(1, 2)  # noqa: E731  (B, H, T, Dh)
    ref = nn.functional.scaled_dot_product_attention(split(q), split(k), split(v))
    ref = mha.w_o(ref.transpose(1, 2).reshape(2, 5, 16))
    assert (after - before).abs().max() > 1e-3
    torch.testing.assert_close(after, ref, atol=1e-5, rtol=1e-5)


def test_inference_layout_assigns_new_parameters(tmp_path):
    """prepare_for_inference gives float32 Linear weights (in, out) storage by assigning new
    Parameters (the old ones are left as they were: no .data surgery), keeps tied weights tied,
    and changes neither the outputs nor the saved file; save_weights leaves the model's layout
    alone. bfloat16 weights keep the default layout; a second call changes nothing."""
    from safetensors.torch import load_file

    from qkv.files import load_weights, save_weights
    from qkv.inference.weight_layout import prepare_for_inference

    model = _lm(tie_embeddings=True)
    x = torch.tensor([_prompt(9, 3)])
    with torch.no_grad():
        before = model(x).logits
    tokens = generate_tokens(model, x.tolist(), 6, do_sample=False)
    save_weights(model, tmp_path / "before.safetensors")
    old = {name: p for name, p in model.named_parameters()}
    old_ptr = {name: p.data_ptr() for name, p in old.items()}

    prepare_for_inference(model)
    new = dict(model.named_parameters())
    head = model.lm_head.weight
    assert head is model.embed.weight and head is not old["embed.weight"]
    assert head.shape == (V, 16) and head.t().is_contiguous() and not head.is_contiguous()
    qkv = model.layers[0].self_attn.w_qkv.weight
    assert qkv is not old["layers.0.self_attn.w_qkv.weight"] and qkv.t().is_contiguous()
    assert all(p.is_contiguous() and p.data_ptr() == old_ptr[n] for n, p in old.items())
    assert model.layers[0].self_attn_block.norm.weight is old["layers.0.self_attn_block.norm.weight"]
    with torch.no_grad():
        torch.testing.assert_close(model(x).logits, before, atol=1e-5, rtol=1e-5)
    assert generate_tokens(model, x.tolist(), 6, do_sample=False) == tokens

    save_weights(model, tmp_path / "after.safetensors")
    assert dict(model.named_parameters()) == new and not head.is_contiguous()  # untouched
    assert (tmp_path / "after.safetensors").read_bytes() == (tmp_path / "before.safetensors").read_bytes()
    assert "lm_head.weight" not in load_file(tmp_path / "after.safetensors")  # tied: stored once
    fresh = _lm(tie_embeddings=True)
    load_weights(fresh, tmp_path / "after.safetensors")
    with torch.no_grad():
        torch.testing.assert_close(fresh(x).logits, before, atol=1e-5, rtol=1e-5)

    prepare_for_inference(model)
    assert dict(model.named_parameters()) == new, "a second call changes nothing"
    half = prepare_for_inference(prepare_for_inference(_lm()).to(torch.bfloat16))
    assert all(m.weight.is_contiguous() for m in half.modules() if isinstance(m, nn.Linear))
    assert generate_tokens(half, x.tolist(), 3, do_sample=False)  # runs in bfloat16


def test_text_generator_from_run_lays_out_once(tiny_runs):
    """Loading a run for generation chooses the layout for its dtype (float32: (in, out));
    a model handed to TextGenerator directly is used as given."""
    from qkv.inference.lm import TextGenerator

    gen = TextGenerator.from_run(tiny_runs["lm"])
    assert gen.model.lm_head.weight.t().is_contiguous()
    half = TextGenerator.from_run(tiny_runs["lm"], dtype=torch.bfloat16)
    assert half.model.lm_head.weight.is_contiguous()
    model = _lm()
    assert TextGenerator(model, gen.tokenizer).model.lm_head.weight.is_contiguous()


# ---------------------------------------------------------------- input checks at entry points


def test_generate_tokens_checks_token_ids():
    """Ids are checked where they enter (generate_tokens), not in the model's forward (no
    host syncs there): an id outside the vocabulary is a ValueError naming the range."""
    model = _lm()
    with pytest.raises(ValueError, match=rf"out of range \[0, {V}\): min 0, max {V}"):
        generate_tokens(model, [[1, 2], [0, V]], 3)
    with pytest.raises(ValueError, match="min -1"):
        generate_tokens(model, [[-1]], 3, do_sample=False)
    assert len(generate_tokens(model, [[0, V - 1]], 2, do_sample=False)[0]) == 2


def test_translation_search_checks_source_ids_and_length(tiny_runs):
    """greedy_decode and beam_search (what Translator calls) check user-given source tensors:
    ids outside the source vocabulary and sources longer than max_len are ValueErrors."""
    from qkv.inference.search import beam_search, greedy_decode
    from qkv.inference.translator import load_run

    model, _ = load_run(tiny_runs["translation"])
    cfg = model.config
    good = torch.tensor([[5, 6, cfg.eos_id]])
    assert isinstance(greedy_decode(model, good, max_new_tokens=3)[0], list)
    for search in (greedy_decode, beam_search):
        with pytest.raises(ValueError, match=rf"out of range \[0, {cfg.src_vocab_size}\)"):
            search(model, torch.tensor([[5, cfg.src_vocab_size]]), max_new_tokens=3)
        with pytest.raises(ValueError, match=rf"max_len \({cfg.max_len}\)"):
            search(model, torch.full((1, cfg.max_len + 1), 5), max_new_tokens=3)


def test_byte_level_bpe_is_lossless_and_starts_from_newline():
    """The LM recipe's BPE keeps newlines and spacing exactly, and an empty prompt starts from
    the newline token."""
    from qkv.data.tokenizers import SubwordTokenizer
    from qkv.recipes.lm import start_token

    text = "ROMEO:\nBut soft,  what light?\n\nJULIET:\nAy me! é\n" * 20
    tok = SubwordTokenizer.train(text.split("\n\n"), 300, byte_level=True)
    sample = "ROMEO:\n  what   light?\tnew ☃\n"
    assert tok.decode(tok.encode(sample)) == sample
    assert tok.encode("\n") == [start_token(tok)]
    chars = CharTokenizer.train("ab\n")
    assert start_token(chars) == chars.encode("\n")[0]
    assert start_token(CharTokenizer.train("ab")) is None


def test_warmup_cosine_schedule():
    lr, min_lr, warmup, decay = 1e-3, 1e-4, 10, 100
    f = [warmup_cosine_lr(s, lr, min_lr, warmup, decay) for s in range(1, 131)]  # f[s - 1]
    assert f[0] == pytest.approx(lr / (warmup + 1))
    assert f[warmup] == pytest.approx(lr) and max(f) == f[warmup]  # peak at step warmup + 1
    assert all(a < b for a, b in zip(f[:warmup], f[1 : warmup + 1], strict=True))  # rising warm-up
    assert all(a > b for a, b in zip(f[warmup:decay], f[warmup + 1 : decay + 1], strict=True))  # cosine decay
    assert f[decay] == pytest.approx(min_lr)  # step decay + 1
    assert all(x == min_lr for x in f[decay + 1 :])
    mid = (warmup + decay) // 2 + 1  # half-way through the decay: the mean of the two
    assert f[mid - 1] == pytest.approx((lr + min_lr) / 2)


# ---------------------------------------------------------------- parts


def test_char_tokenizer_round_trip_and_unknown_characters(tmp_path):
    text = "First Citizen:\nBefore we proceed any further, hear me speak.\n"
    tok = CharTokenizer.train(text)
    assert tok.chars == sorted(set(text)) and tok.vocab_size == len(set(text))
    assert tok.decode(tok.encode(text)) == text
    assert tok.bos_id == tok.encode("\n")[0]
    with pytest.raises(QkvError) as err:
        tok.encode("hear mé, Zé")
    msg = str(err.value)
    assert "'é'" in msg and "'Z'" in msg and "2 character(s)" in msg
    assert "first at position 6" in msg  # the first unknown character in the text, 'é'
    with pytest.raises(QkvError, match="position 0"):
        tok.encode("Zé")
    tok.save(tmp_path / "tokenizer.json")
    back = load_tokenizer(tmp_path / "tokenizer.json")
    assert isinstance(back, CharTokenizer)
    assert back.chars == tok.chars and back.bos_id == tok.bos_id
    assert back.encode(text) == tok.encode(text)
    assert CharTokenizer(["a", "b"]).bos_id is None
    with pytest.raises(QkvError):
        CharTokenizer(["a", "a"])


def test_rotary_dot_product_depends_only_on_relative_position():
    rope = RotaryEmbedding(8, 64)
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)

    def dot(m: int, n: int) -> float:
        return float((rope(q, torch.tensor([m])) * rope(k, torch.tensor([n]))).sum())

    for m, n in [(3, 0), (10, 7), (0, 5)]:
        for s in (1, 9, 40):
            assert dot(m + s, n + s) == pytest.approx(dot(m, n), abs=1e-5)
    assert abs(dot(3, 0) - dot(4, 0)) > 1e-3, "the offset itself must matter"
    x = torch.randn(2, 3, 5, 8)
    torch.testing.assert_close(rope(x, torch.arange(5)).norm(dim=-1), x.norm(dim=-1))  # a rotation
    torch.testing.assert_close(rope(x, torch.zeros(5, dtype=torch.long)), x)


def test_dyt_formula():
    dyt = DyT(6)
    with torch.no_grad():
        dyt.alpha.fill_(0.7)
        dyt.weight.copy_(torch.randn(6))
        dyt.bias.copy_(torch.randn(6))
    x = torch.randn(3, 4, 6) * 3
    torch.testing.assert_close(dyt(x), dyt.weight * torch.tanh(0.7 * x) + dyt.bias)
    no_bias = build_norm("dyt", 6, bias=False)
    assert no_bias.bias is None and no_bias.alpha.item() == 0.5
    torch.testing.assert_close(no_bias(x), torch.tanh(0.5 * x))


@pytest.mark.parametrize(
    "kwargs, needles",
    [
        (dict(norm="batchnorm"), ["norm", "batchnorm"]),
        (dict(positional="alibi"), ["positional", "alibi"]),
        (dict(d_model=30, n_heads=4), ["d_model (30)", "n_heads (4)"]),
        (dict(positional="rotary", d_model=12, n_heads=4), ["d_k (3)", "rotary"]),
        (dict(dropout=1.0), ["dropout"]),
        (dict(bos_id=99), ["bos_id (99)"]),
        (dict(norm="batchnorm", positional="alibi"), ["batchnorm", "alibi"]),
    ],
)
def test_lm_config_rejects_bad_values(kwargs, needles):
    with pytest.raises(ValueError) as err:
        LMConfig(vocab_size=50, **kwargs)
    for needle in needles:
        assert needle in str(err.value)


def test_lm_config_json_round_trip(tmp_path):
    cfg = LMConfig(vocab_size=50, positional="rotary", norm="dyt", bos_id=3)
    (tmp_path / "c.json").write_text(json.dumps(cfg.to_dict()))
    assert LMConfig.load(tmp_path / "c.json") == cfg
    with pytest.raises(ValueError, match="n_layer"):
        LMConfig.from_dict({"vocab_size": 5, "n_layer": 2})


# ---------------------------------------------------------------- torch.nn reference


def test_decoder_lm_matches_a_torch_reference(no_torch_fastpath):
    """DecoderLM (pre-LN, GELU, learned positions, biases, tied head) equals embeddings +
    positions + nn.TransformerEncoder (norm_first, causal mask) + LayerNorm + tied head."""
    d, h, ff, n_layers, max_len = 16, 4, 32, 2, 16
    ours = DecoderLM(
        LMConfig(vocab_size=V, d_model=d, n_heads=h, d_ff=ff, n_layers=n_layers, max_len=max_len, bias=True)
    ).eval()
    emb, pos, final = nn.Embedding(V, d), nn.Embedding(max_len, d), nn.LayerNorm(d)
    layer = nn.TransformerEncoderLayer(
        d, h, ff, dropout=0.0, activation="gelu", batch_first=True, norm_first=True
    )
    stack = nn.TransformerEncoder(layer, n_layers, enable_nested_tensor=False).eval()
    with torch.no_grad():
        for p in [*stack.parameters(), *final.parameters()]:
            p.copy_(torch.randn_like(p) * 0.3 + (1.0 if p.dim() == 1 and p.numel() == d else 0.0))
        ours.embed.weight.copy_(emb.weight)
        ours.positional.embedding.weight.copy_(pos.weight)
        for mine, theirs in zip(ours.layers, stack.layers, strict=True):
            copy_attention_from_torch(mine.self_attn, theirs.self_attn)
            mine.ffn.w_1.load_state_dict(theirs.linear1.state_dict())
            mine.ffn.w_2.load_state_dict(theirs.linear2.state_dict())
            mine.self_attn_block.norm.load_state_dict(theirs.norm1.state_dict())
            mine.ffn_block.norm.load_state_dict(theirs.norm2.state_dict())
        ours.final_norm.load_state_dict(final.state_dict())
    tokens = torch.randint(0, V, (3, 11))
    with torch.no_grad():
        x = emb(tokens) + pos(torch.arange(11))
        causal = nn.Transformer.generate_square_subsequent_mask(11)
        ref = final(stack(x, mask=causal, is_causal=True)) @ emb.weight.T
        out = ours(tokens).logits
    assert ours.lm_head.weight is ours.embed.weight
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------- CLI on real tiny-shakespeare

DATA = Path(os.environ.get("QKV_DATA_DIR", Path(__file__).resolve().parents[2] / "shared" / "data"))
# Outside CI a missing corpus skips these tests; in CI it must fail, not pass silently.
needs_data = pytest.mark.skipif(
    not (DATA / "tinyshakespeare" / "input.txt").is_file() and not os.environ.get("CI"),
    reason=f"tiny-shakespeare not found under {DATA} (set QKV_DATA_DIR)",
)
SMOKE = [
    "eval_every=10",
    "sample_tokens=20",
    "num_samples=1",
    "d_model=32",
    "n_heads=2",
    "d_ff=64",
    "n_layers=1",
    "--quiet",
]


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    os.environ.setdefault("QKV_DATA_DIR", str(DATA))
    out = tmp_path_factory.mktemp("lm") / "run"
    assert main(["train", "lm", "--out", str(out), "--max-steps", "20", *SMOKE]) == 0
    return out


_run = run_main


def _clean_error(code: int, out: str, err: str, *needles: str) -> None:
    assert code == 2
    assert out == "", "a refused command writes nothing to stdout"
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: ")
    for needle in needles:
        assert needle in err, err


@needs_data
def test_lm_run_directory(lm_run):
    for name in (
        "samples.txt",
        "model.safetensors",
        "summary.json",
        "config.json",
        "tokenizer.json",
        "train_config.json",
        "metrics.jsonl",
        "train_state.pt",
    ):
        assert (lm_run / name).is_file(), name
    summary = json.loads((lm_run / "summary.json").read_text())
    assert summary["steps"] == 20
    sample = summary["samples"][0]
    assert len(sample) == 20 and sample in (lm_run / "samples.txt").read_text()
    assert load_tokenizer(lm_run / "tokenizer.json").vocab_size == 65
    rows = [json.loads(line) for line in (lm_run / "metrics.jsonl").read_text().splitlines()]
    val = [r for r in rows if "val_loss" in r]
    assert [r["step"] for r in val] == [10, 20]
    assert val[-1]["val_loss"] < val[0]["val_loss"] < math.log(65) + 0.1
    # The final number is the best checkpoint re-scored: it must equal the best validation seen.
    best = min(r["val_loss"] for r in val)
    assert summary["validation"]["val_loss"] == pytest.approx(best, abs=1e-6)


@needs_data
def test_generate_prompt_reproducible_and_empty(lm_run, capsys):
    run = str(lm_run)
    code, out, _ = _run(
        capsys, "generate", run, "--prompt", "ROMEO:", "--max-new-tokens", "20", "--seed", "1"
    )
    assert code == 0
    assert out.startswith("ROMEO:") and out.endswith("\n") and len(out) == 6 + 20 + 1
    assert (
        _run(capsys, "generate", run, "--prompt", "ROMEO:", "--max-new-tokens", "20", "--seed", "1")[1] == out
    )
    assert (
        _run(capsys, "generate", run, "--prompt", "ROMEO:", "--max-new-tokens", "20", "--seed", "2")[1] != out
    )
    code, empty, _ = _run(capsys, "generate", run, "--prompt", "", "--max-new-tokens", "20", "--seed", "1")
    assert code == 0 and len(empty) == 20 + 1
    newline = _run(capsys, "generate", run, "--prompt", "\n", "--max-new-tokens", "20", "--seed", "1")[1]
    assert newline == "\n" + empty, "an empty prompt starts from '\\n'"
    code, greedy, _ = _run(capsys, "generate", run, "--prompt", "ROMEO:", "--max-new-tokens", "8", "--greedy")
    assert (
        code == 0
        and greedy
        == _run(
            capsys,
            "generate",
            run,
            "--prompt",
            "ROMEO:",
            "--max-new-tokens",
            "8",
            "--top-k",
            "1",
            "--seed",
            "5",
        )[1]
    )


@needs_data
def test_generate_stop_string_cuts_before_it(lm_run, capsys):
    run = str(lm_run)
    args = ["generate", run, "--prompt", "ROMEO:", "--max-new-tokens", "30", "--seed", "3"]
    text = _run(capsys, *args)[1][len("ROMEO:") : -1]
    stop = text[6:8]
    code, out, _ = _run(capsys, *args, "--stop", stop)
    assert code == 0 and out == "ROMEO:" + text[: text.find(stop)] + "\n"


@needs_data
@pytest.mark.parametrize(
    "args, needles",
    [
        (["--prompt", "héllo"], ["'é'", "position 1"]),
        (["--temperature", "0"], ["temperature", "greedy"]),
        (["--temperature", "-1"], ["temperature"]),
        (["--top-p", "0"], ["top_p"]),
        (["--top-p", "1.5"], ["top_p"]),
        (["--max-new-tokens", "0"], ["max_new_tokens"]),
        (["--top-probs", "0"], ["--top-probs"]),
        (["--top-probs", "-1"], ["--top-probs"]),
        (["--top-probs", "3", "--temperature", "0"], ["temperature"]),
    ],
    ids=[
        "unknown-char",
        "temperature-0",
        "temperature-neg",
        "top-p-0",
        "top-p-1.5",
        "max-new-tokens-0",
        "top-probs-0",
        "top-probs-neg",
        "top-probs-temperature-0",
    ],
)
def test_generate_bad_input_is_a_clean_error(lm_run, capsys, args, needles):
    _clean_error(*_run(capsys, "generate", str(lm_run), "--seed", "1", *args), *needles)


@needs_data
def test_generate_top_probs(lm_run, capsys):
    code, out, _ = _run(capsys, "generate", str(lm_run), "--prompt", "ROMEO", "--top-probs", "5")
    assert code == 0
    lines = out.splitlines()
    assert len(lines) == 5
    probs = [float(line.split("\t")[0]) for line in lines]
    assert probs == sorted(probs, reverse=True) and all(p > 0 for p in probs)
    assert sum(probs) <= 1.0 + 1e-3
    assert all(len(eval(line.split("\t")[1])) == 1 for line in lines)  # one character each


@needs_data
def test_evaluate_prints_one_json_object(lm_run, capsys):
    code, out, _ = _run(capsys, "evaluate", str(lm_run))
    assert code == 0
    result = json.loads(out)
    assert set(result) == {
        "split",
        "loss",
        "ppl",
        "bits_per_token",
        "bits_per_char",
        "tokens",
    }  # one name each
    summary = json.loads((lm_run / "summary.json").read_text())
    assert result["split"] == "val"
    assert result["loss"] == pytest.approx(summary["validation"]["val_loss"], abs=1e-6)
    assert result["ppl"] == pytest.approx(math.exp(result["loss"]))
    assert result["bits_per_token"] == pytest.approx(result["loss"] / math.log(2))
    assert result["bits_per_char"] == pytest.approx(result["bits_per_token"])  # char model
    assert result["tokens"] == summary["validation"]["tokens"]


@needs_data
def test_resume_continues_to_more_steps(lm_run, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(lm_run, run)
    code, out, err = _run(
        capsys, "train", "lm", "--out", str(run), "--resume", "--max-steps", "30", "--json", *SMOKE
    )
    assert code == 0, err
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 30 and json.loads(out)["steps"] == 30
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "val_loss" in r] == [10, 20, 30]
    # Without --resume the non-empty directory is refused, nothing overwritten.
    before = (run / "model.safetensors").read_bytes()
    _clean_error(*_run(capsys, "train", "lm", "--out", str(run), "--max-steps", "5", *SMOKE), "--resume")
    assert (run / "model.safetensors").read_bytes() == before


@needs_data
def test_a_text_run_resumes_on_its_own_text_only(lm_run, tmp_path, capsys):
    """A run on tiny-shakespeare keeps the sha256 of its split texts in data.json: resuming it on
    other text (the same characters reversed), another split, or token shards (even of the same
    text) is refused in one line and nothing of the run changes; a run saved without data.json
    (an older qkv) is checked against the inputs its settings named."""
    run = tmp_path / "run"
    shutil.copytree(lm_run, run)
    text = (DATA / "tinyshakespeare" / "input.txt").read_text(encoding="utf-8")
    (tmp_path / "rev.txt").write_text(text[::-1], encoding="utf-8")
    assert (
        main(
            [
                "prepare",
                "lm",
                str(DATA / "tinyshakespeare" / "input.txt"),
                "--out",
                str(tmp_path / "d"),
                "--quiet",
            ]
        )
        == 0
    )
    capsys.readouterr()
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    resume = ("train", "lm", "--out", str(run), "--resume", "--max-steps", "25", *SMOKE)
    for other, named in (
        (f"corpus={tmp_path / 'rev.txt'}", "corpus="),
        ("val_fraction=0.2", "val_fraction=0.2"),
        (f"data={tmp_path / 'd'}", "data="),
    ):
        _clean_error(
            *_run(capsys, *resume, other), "cannot resume", named, "is not the data this run started on"
        )
        assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before
    (run / "data.json").unlink()  # as an older qkv left it
    _clean_error(*_run(capsys, *resume, f"corpus={tmp_path / 'rev.txt'}"), "corpus=")


@pytest.mark.parametrize(
    "override, needle",
    [("d_modle=64", "d_modle"), ("norm=batchnorm", "batchnorm"), ("tokenizer=word", "tokenizer")],
)
def test_lm_recipe_bad_config_fails_before_writing(tmp_path, capsys, override, needle):
    out = tmp_path / "run"
    _clean_error(*_run(capsys, "train", "lm", override, "--out", str(out), "--max-steps", "5"), needle)
    assert not out.exists()
