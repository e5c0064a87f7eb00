"""Every family's training step compiles as one graph (no host syncs, no Python fallbacks in
forward): ``torch.compile(fullgraph=True)`` raises on any graph break. The ``aot_eager``
backend traces forward and backward (AOTAutograd) without generating C++ code, so this stays
fast; ``train.compile=true`` uses the default backend on the same graph."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from qkv.models import DecoderLM, LMConfig, Transformer, TransformerConfig
from qkv.models.config import EncoderConfig
from qkv.models.encoder import EncoderModel


def _transformer_step(model, src, tgt):
    logits = model(src, tgt).logits
    return F.cross_entropy(logits.flatten(0, 1), tgt.flatten(), ignore_index=0)


def _lm_step(model, tokens):
    logits = model(tokens[:, :-1]).logits
    return F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())


def _encoder_step(model, tokens):
    mlm = model(tokens).logits
    cls = model.classify_sequence(tokens).logits
    residues = model.classify_residues(tokens).logits
    return (
        F.cross_entropy(mlm.flatten(0, 1), tokens.flatten())
        + cls.logsumexp(-1).mean()
        + residues.logsumexp(-1).mean()
    )


def _padded(vocab, pad, lengths, width):
    x = torch.randint(3, vocab, (len(lengths), width))
    for i, n in enumerate(lengths):
        x[i, n:] = pad
    return x


CASES = {
    "encoder-decoder": lambda norm: (
        Transformer(
            TransformerConfig(
                src_vocab_size=40,
                tgt_vocab_size=40,
                d_model=16,
                n_heads=2,
                d_ff=32,
                n_encoder_layers=2,
                n_decoder_layers=2,
                norm=norm,
            )
        ),
        _transformer_step,
        (_padded(40, 0, [7, 4], 7), _padded(40, 0, [6, 3], 6)),
    ),
    "decoder-only": lambda norm: (
        DecoderLM(
            LMConfig(
                vocab_size=40,
                d_model=16,
                n_heads=2,
                d_ff=32,
                n_layers=2,
                positional="rotary",
                dropout=0.1,
                norm=norm,
            )
        ),
        _lm_step,
        (torch.randint(0, 40, (2, 9)),),
    ),
    "encoder": lambda norm: (
        EncoderModel(
            EncoderConfig(
                vocab_size=30,
                d_model=16,
                n_heads=2,
                d_ff=32,
                n_layers=2,
                num_labels=3,
                dropout=0.1,
                norm=norm,
            )
        ),
        _encoder_step,
        (_padded(30, 1, [8, 5], 8),),
    ),
}


@pytest.mark.parametrize("norm", ["layernorm", "dyt"])
@pytest.mark.parametrize("family", list(CASES))
def test_training_step_compiles_with_no_graph_break(family, norm):
    torch._dynamo.reset()
    model, step, inputs = CASES[family](norm)
    model.train()
    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    loss = compiled(model, *inputs)  # fullgraph=True: any graph break raises here
    loss.backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    explanation = torch._dynamo.explain(step)(model, *inputs)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    torch._dynamo.reset()


def test_train_compile_setting_compiles_the_training_steps(tmp_path, monkeypatch):
    """``train.compile=true`` sends the training steps through torch.compile (here with the
    fast ``aot_eager`` backend) and still writes a plain, loadable run (no compile wrapper in
    the saved names). Protein tasks run their heads through ``forward(head=...)``, so the
    compiled module is what trains."""
    from safetensors.torch import load_file

    from qkv import runs
    from qkv.cli import main

    compiled = []
    real_compile = torch.compile

    def compile_fast(model, **kwargs):
        compiled.append(model)
        return real_compile(model, backend="aot_eager")

    monkeypatch.setattr(torch, "compile", compile_fast)
    out = tmp_path / "run"
    assert (
        main(
            [
                "train",
                "protein-cls",
                "--task",
                "amp-scanner",
                "--out",
                str(out),
                "--quiet",
                "train.compile=true",
                "model.d_model=16",
                "model.n_heads=2",
                "model.d_ff=32",
                "model.n_layers=1",
                "model.max_len=32",
                "train.max_steps=3",
                "train.eval_every=3",
                "baseline=false",
                "max_tokens=1024",
                "train.threads=1",
            ]
        )
        == 0
    )
    torch._dynamo.reset()
    assert len(compiled) == 1
    assert not any("_orig_mod" in k for k in load_file(str(out / "model.safetensors")))
    model, _ = runs.load_run(out)
    assert model.config.num_labels == 2


def _demo_losses(run_dir, device: str, compiled: bool) -> tuple[float, float]:
    """The demo recipe's model (``qkv train translation``'s defaults) on real Multi30k pairs for
    20 steps: the training loss over the 20 steps and the validation loss after them."""
    import json

    from qkv.recipes.registry import get
    from qkv.settings import resolve

    recipe = get("translation")
    overrides = [
        f"train.device={device}",
        f"train.compile={str(compiled).lower()}",
        "train.precision=fp32",  # the numerics of the step, not of bfloat16's rounding
        "train.max_minutes=null",
        "train.max_steps=20",
        "train.seed=1",
        "train_limit=4000",
        "val_limit=64",
        "test=false",
    ]
    recipe.train(resolve(recipe.settings, overrides=overrides), run_dir, progress=False)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = next(r["train_loss"] for r in rows if r.get("step") == 20 and "train_loss" in r)
    return train, next(r["val_loss"] for r in rows if "val_loss" in r)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the GPU path: needs a CUDA device")
def test_the_compiled_demo_step_on_cuda_matches_eager_over_20_steps(tmp_path):
    """The demo model's GPU path, ``train.compile=true`` on CUDA (issue 72), trains as the eager
    step does: the loss over 20 steps, and the validation loss of the weights they make, agree
    within 1e-3 relative."""
    eager = _demo_losses(tmp_path / "eager", "cuda", compiled=False)
    compiled = _demo_losses(tmp_path / "compiled", "cuda", compiled=True)
    torch._dynamo.reset()
    assert compiled == pytest.approx(eager, rel=1e-3)
