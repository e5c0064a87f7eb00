"""Fast inference: oneDNN-packed bfloat16 linears (values, the fused activation, the state dict,
tied weights, greedy tokens equal to full recomputation), skipping dropout calls in eval mode,
and the throughput lines of ``qkv generate`` / ``qkv translate --verbose``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from qkv.cli import main
from qkv.device import cpu_has_native_bf16
from qkv.errors import QkvError
from qkv.inference.lm import generate_tokens
from qkv.inference.quantize import Int8Linear, quantize_int8
from qkv.inference.stats import DecodeStats
from qkv.inference.weight_layout import (
    PackedLinear,
    onednn_available,
    onednn_bf16_available,
    prepare_for_inference,
)
from qkv.models import DecoderLM, LMConfig
from qkv.nn.feedforward import PositionwiseFeedForward

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("QKV_DATA_DIR", ROOT.parent / "shared" / "data"))

needs_onednn_bf16 = pytest.mark.skipif(
    not onednn_bf16_available(), reason="oneDNN bfloat16 needs a CPU with native bfloat16 (AVX512_BF16/AMX)"
)


def _lm_like(cfg: LMConfig) -> DecoderLM:
    """A random LM of ``cfg`` in eval mode, weights pushed away from the init so that greedy
    continuations vary (see tests/test_lm.py)."""
    torch.manual_seed(0)
    model = DecoderLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return model.eval()


def _lm(**kw) -> DecoderLM:
    """A small random LM (:func:`_lm_like`)."""
    return _lm_like(
        LMConfig(
            vocab_size=50,
            d_model=64,
            n_heads=4,
            d_ff=256,
            n_layers=2,
            max_len=64,
            bias=True,
            activation="gelu",
            **kw,
        )
    )


@needs_onednn_bf16
@pytest.mark.parametrize("activation", [None, "relu", "gelu"])
def test_packed_linear_equals_linear_then_activation(activation):
    """PackedLinear computes act(x Wᵀ + b) on bfloat16 inputs of any batch shape, within
    bfloat16 rounding (2 units in the last place of outputs of size ~10)."""
    torch.manual_seed(0)
    linear = nn.Linear(96, 80).to(torch.bfloat16).eval()
    packed = PackedLinear(linear, activation).eval()
    act = {None: lambda h: h, "relu": F.relu, "gelu": F.gelu}[activation]
    for shape in ((1, 1, 96), (3, 7, 96), (5, 96)):
        x = torch.randn(shape).to(torch.bfloat16)
        ref = act(F.linear(x.float(), linear.weight.float(), linear.bias.float()))
        out = packed(x)
        assert out.dtype == torch.bfloat16 and out.shape == (*shape[:-1], 80)
        torch.testing.assert_close(out.float(), ref, atol=0.1, rtol=2**-7)
    assert packed.weight is linear.weight and packed.bias is linear.bias


needs_onednn = pytest.mark.skipif(not onednn_available(), reason="PyTorch built without oneDNN")


@needs_onednn
@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh", "relu"])
def test_batched_float32_encoder_packs_every_linear_with_the_activation_fused(activation):
    """prepare_for_inference(batch_rows=...) puts a float32 encoder's linears on oneDNN, the
    FFN's activation fused into w_1; outputs match the unpacked model within float32 rounding
    and the state dict is unchanged."""
    from qkv.models.config import EncoderConfig
    from qkv.models.encoder import EncoderModel

    torch.manual_seed(0)
    model = EncoderModel(
        EncoderConfig(
            vocab_size=30,
            d_model=64,
            n_heads=4,
            d_ff=256,
            n_layers=2,
            activation=activation,
            norm_first=False,
        )
    ).eval()
    tokens = torch.randint(2, 30, (4, 20))
    tokens[1, 12:] = model.config.pad_id
    with torch.no_grad():
        ref = model(tokens).hidden
    before = {k: v.clone() for k, v in model.state_dict().items()}
    prepare_for_inference(model, batch_rows=4096)
    ffn = model.layers[0].ffn
    assert isinstance(ffn.w_1, PackedLinear) and ffn.w_1.activation == activation
    assert isinstance(model.layers[0].self_attn.w_qkv, PackedLinear)
    with torch.no_grad():
        out = model(tokens).hidden
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    after = model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)


@needs_onednn_bf16
def test_packed_linear_refuses_training_mode_and_unknown_activation():
    linear = nn.Linear(8, 4).to(torch.bfloat16)
    with pytest.raises(ValueError, match="unknown fused activation 'tanh'"):
        PackedLinear(linear, "tanh")
    packed = PackedLinear(linear.eval())
    packed.train()
    with pytest.raises(RuntimeError, match="for inference"):
        packed(torch.randn(1, 8).to(torch.bfloat16))


@needs_onednn_bf16
def test_prepare_bfloat16_packs_keeps_state_dict_and_ties_and_decodes_as_recomputation():
    """A bfloat16 LM prepared for CPU decoding: every linear is packed (the FFN's GELU fused
    into w_1), the state dict and the tie between embedding and output projection are
    unchanged, the logits match the unprepared model's within bfloat16 rounding, and greedy
    decoding with the cache gives the tokens of full recomputation on the same model."""
    model = _lm().to(torch.bfloat16)
    x = torch.randint(0, 50, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        before = model(x).logits.float()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    prepare_for_inference(model)
    linears = [m for m in model.modules() if isinstance(m, (nn.Linear, PackedLinear))]
    assert linears and all(isinstance(m, PackedLinear) for m in linears)
    ffn = model.layers[0].ffn
    assert isinstance(ffn, PositionwiseFeedForward) and ffn.w_1.activation == "gelu"
    after_state = model.state_dict()
    assert after_state.keys() == state.keys()
    assert all(torch.equal(after_state[k], v) for k, v in state.items())
    with torch.no_grad():
        after = model(x).logits.float()
    scale = before.abs().max()
    assert (after - before).abs().max() <= 0.03 * scale, "bfloat16 rounding, not a different function"
    prompt = x[0].tolist()
    cached = generate_tokens(model, [prompt], 24, do_sample=False)[0]
    seq = list(prompt)
    with torch.no_grad():
        for _ in range(24):
            seq.append(int(model(torch.tensor([seq]), last_only=True).logits[0, -1].argmax()))
    assert cached == seq[len(prompt) :] and len(set(cached)) > 3
    prepare_for_inference(model)  # a second call changes nothing
    assert isinstance(model.layers[0].ffn.w_1, PackedLinear) and model.layers[0].ffn.w_1.activation == "gelu"
    tied = prepare_for_inference(_lm(tie_embeddings=True).to(torch.bfloat16))
    assert isinstance(tied.lm_head, PackedLinear) and tied.lm_head.weight is tied.embed.weight
    assert "lm_head.weight" not in dict(tied.named_parameters())  # still one parameter


@needs_onednn_bf16
@pytest.mark.parametrize("shape", [(3072, 768), (768, 3072), (200, 64)])
def test_batch_invariant_packed_linear_gives_one_row_the_bits_of_many(shape):
    """With batch_invariant=True a row's output does not depend on how many rows share the
    product (oneDNN's one-row kernel sums some shapes in another order: 768 <- 3072 here)."""
    n_in, n_out = shape
    torch.manual_seed(0)
    packed = PackedLinear(nn.Linear(n_in, n_out).eval().to(torch.bfloat16), batch_invariant=True)
    x = torch.randn(1, 48, n_in).to(torch.bfloat16)
    with torch.no_grad():
        many = packed(x)
        alone = torch.cat([packed(x[:, t : t + 1]) for t in range(48)], dim=1)
    assert torch.equal(alone, many)


@needs_onednn_bf16
def test_bfloat16_cached_decoding_gives_the_logits_of_full_recomputation_bit_for_bit():
    """prepare_for_inference makes bfloat16 decoding batch-invariant by default: every step's
    logits over the key/value cache equal, bit for bit, that position's logits in one forward
    over the whole sequence (without it, kernel summation orders differ in the last bit and
    greedy tokens flip at near-ties)."""
    torch.manual_seed(0)
    cfg = LMConfig(
        vocab_size=50, d_model=64, n_heads=4, d_ff=3072, n_layers=2, max_len=64, bias=True, activation="gelu"
    )
    model = prepare_for_inference(_lm_like(cfg).to(torch.bfloat16))
    assert all(m.backend == "invariant" for m in model.modules() if hasattr(m, "backend"))
    prompt = torch.randint(0, 50, (1, 8), generator=torch.Generator().manual_seed(1))
    cached, full, tokens = _cached_and_full_logits(model, prompt, 40)
    assert torch.equal(cached, full)
    assert len(set(tokens)) > 3


@torch.no_grad()
def _cached_and_full_logits(model, prompt: torch.Tensor, steps: int):
    """Greedy decoding of ``steps`` tokens after ``prompt (1, T)`` with the key/value cache:
    ``(each step's logits (steps, V), the same positions' logits of one forward over the
    whole sequence (steps, V), the new tokens)``."""
    caches, seq, cached = model.new_caches(), prompt, []
    logits = model(seq, caches=caches, last_only=True).logits[:, -1]
    for _ in range(steps):
        cached.append(logits)
        nxt = logits.max(-1).indices[:, None]
        seq = torch.cat([seq, nxt], dim=1)
        logits = model(nxt, caches=caches, last_only=True).logits[:, -1]
    t = prompt.size(1)
    return torch.cat(cached), model(seq[:, :-1]).logits[0, t - 1 :], seq[0, t:].tolist()


def test_int8_linear_error_stays_within_half_a_quantisation_step():
    """Int8Linear rounds each weight row to int8 with scale max|row| / 127: every output is
    within sum_i |x_i| * scale_j / 2 of the exact product, plus the bfloat16 rounding of the
    scale and of the output (2^-8 relative each)."""
    torch.manual_seed(0)
    linear = nn.Linear(96, 40).eval().to(torch.bfloat16)
    q = Int8Linear(linear)
    x = torch.randn(5, 96).to(torch.bfloat16)
    exact = x.float() @ linear.weight.float().T + linear.bias.float()
    with torch.no_grad():
        y = q(x[None])[0].float()
    assert y.shape == (5, 40) and q(x).dtype == torch.bfloat16
    bound = x.abs().float() @ (q.scale.float() / 2)[None].expand(96, -1) + exact.abs() * 2**-7
    assert ((y - exact).abs() <= bound).all()
    assert (y - exact).abs().max() > 0, "int8 rounding is visible"


def test_quantize_int8_keeps_state_dict_and_decodes_as_recomputation_bit_for_bit():
    """quantize_int8 swaps every linear (the tied output projection too) for Int8Linear; the
    state dict and the tie are unchanged; with prepare_for_inference's batch invariance the
    cached greedy logits equal a full forward's bit for bit, and stay close to bfloat16's."""
    model = _lm(tie_embeddings=True).to(torch.bfloat16)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randint(0, 50, (1, 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        before = model(x).logits.float()
    prepare_for_inference(quantize_int8(model))
    assert all(
        isinstance(m, Int8Linear)
        for m in model.modules()
        if isinstance(m, (nn.Linear, PackedLinear, Int8Linear))
    )
    assert model.lm_head.weight is model.embed.weight
    after_state = model.state_dict()
    assert after_state.keys() == state.keys() and all(
        torch.equal(after_state[k], v) for k, v in state.items()
    )
    with torch.no_grad():
        after = model(x).logits.float()
    assert (after - before).abs().max() <= 0.05 * before.abs().max()
    cached, full, _ = _cached_and_full_logits(model, x, 24)
    assert torch.equal(cached, full)


def test_quantize_int8_refuses_float32_and_training_mode():
    """int8 weights run with bfloat16 activations, and only for inference: one-line errors."""
    with pytest.raises(QkvError, match="cast the model to bfloat16"):
        quantize_int8(_lm())
    with pytest.raises(QkvError, match="eval"):
        quantize_int8(_lm().to(torch.bfloat16).train())
    q = Int8Linear(nn.Linear(8, 4).to(torch.bfloat16)).train()
    with pytest.raises(RuntimeError, match="for inference"):
        q(torch.randn(1, 8).to(torch.bfloat16))


def test_prepare_leaves_a_model_in_training_mode_unpacked():
    """Packing is for inference only: a model still in training mode keeps nn.Linear."""
    model = _lm().to(torch.bfloat16).train()
    prepare_for_inference(model)
    assert not any(isinstance(m, PackedLinear) for m in model.modules())


def test_eval_mode_skips_dropout_but_training_applies_it():
    """Dropout calls are skipped in eval mode (a decoding-speed measure); training still drops."""
    cfg = LMConfig(
        vocab_size=20,
        d_model=32,
        n_heads=2,
        d_ff=64,
        n_layers=2,
        max_len=16,
        dropout=0.5,
        activation_dropout=0.5,
    )
    model = DecoderLM(cfg)
    x = torch.randint(0, 20, (2, 8))
    model.eval()
    with torch.no_grad():
        assert torch.equal(model(x).logits, model(x).logits)
    model.train()
    torch.manual_seed(0)
    first = model(x).logits
    assert not torch.allclose(first, model(x).logits), "training mode still applies dropout"


def test_decode_stats_summary():
    stats = DecodeStats(items=1, new_tokens=128, seconds=2.0, first_token_seconds=0.1)
    line = stats.summary()
    assert line.startswith("128 new tokens in 2.00 s: 64.0 tokens/s")
    assert "then 66.8 tokens/s" in line  # 127 tokens in 1.9 s
    stats = DecodeStats(items=10, new_tokens=150, seconds=4.0)
    assert stats.summary("sentences") == "10 sentences in 4.00 s: 2.5 sentences/s, 38 output tokens/s"


def test_generate_and_translate_verbose_print_throughput(tiny_runs, capsys):
    """``--verbose`` adds one throughput line on stderr; stdout holds only the text."""
    assert (
        main(
            [
                "generate",
                str(tiny_runs["lm"]),
                "--prompt",
                "RO",
                "--greedy",
                "--max-new-tokens",
                "7",
                "--verbose",
            ]
        )
        == 0
    )
    out, err = capsys.readouterr()
    assert out.startswith("RO") and "tokens/s" not in out
    assert re.search(r"^7 new tokens in [0-9.]+ s: [0-9.]+ tokens/s", err, re.M), err
    assert (
        main(
            [
                "generate",
                str(tiny_runs["lm"]),
                "--prompt",
                "RO",
                "--greedy",
                "--max-new-tokens",
                "7",
                "--dtype",
                "int8",
            ]
        )
        == 0
    )  # int8 weights
    assert capsys.readouterr().out.startswith("RO")
    assert main(["translate", str(tiny_runs["translation"]), "Ein Mann.", "Eine Frau.", "--verbose"]) == 0
    out, err = capsys.readouterr()
    assert len(out.splitlines()) == 2 and "sentences/s" not in out
    assert re.search(r"^2 sentences in [0-9.]+ s: [0-9.]+ sentences/s", err, re.M), err


@pytest.mark.skipif(
    not (DATA / "flip_secondary_structure").is_dir() or not (DATA / "multi30k").is_dir(),
    reason=f"FLIP or Multi30k not found under {DATA} (set QKV_DATA_DIR)",
)
@pytest.mark.skipif(
    not cpu_has_native_bf16(),
    reason="limits.py times bfloat16 kernels, emulated (about 20x slower) on a CPU without native bf16",
)
def test_limits_benchmark_runs(tiny_runs):
    """benchmarks/limits.py --quick (the bounds and workloads a-d; c on a tiny random run)
    completes and reports each workload as a fraction of its bound, with float32 greedy
    tokens equal to full recomputation's: a check that it runs, not a figure."""
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "limits.py"),
            "--quick",
            "--translation-run",
            str(tiny_runs["translation"]),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env={**os.environ, "QKV_DATA_DIR": str(DATA)},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    for workload in (
        "(a) batch-1 greedy",
        "(b) batched greedy",
        "(c) translation, beam 4",
        "(d) protein encoder inference",
    ):
        assert workload in out, out
    assert len(re.findall(r"\*\*\d+%", out)) >= 5, out
    fp32_a = re.search(r"^\| fp32 \| \d+ MB \|.*$", out, re.M).group(0)
    assert "| 8 of 8 (" in fp32_a, fp32_a
    if onednn_bf16_available():  # batch-invariant bfloat16 decoding (the default) is exact too
        bf16_a = re.search(r"^\| bf16 \| \d+ MB \|.*$", out, re.M).group(0)
        assert "| 8 of 8 (" in bf16_a, bf16_a
