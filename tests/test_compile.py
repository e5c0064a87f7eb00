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
