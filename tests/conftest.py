"""Shared test setup: single-threaded, seeded torch (the suite must be fast and reproducible)."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seeded_single_thread():
    """Every test starts from the same RNG state and runs on one CPU thread."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    yield


@pytest.fixture
def qkv_logs(monkeypatch, caplog):
    """caplog sees the ``qkv`` loggers even after a CLI call in this process stopped their
    propagation (the CLI logs to its own stderr handler)."""
    monkeypatch.setattr(logging.getLogger("qkv"), "propagate", True)
    caplog.set_level(logging.DEBUG, logger="qkv")
    return caplog


@pytest.fixture
def no_torch_fastpath():
    """Disable torch.nn's fused "fast path" (it returns zeros at padded positions via nested
    tensors), so torch.nn reference modules compute every position with plain math."""
    previous = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    yield
    torch.backends.mha.set_fastpath_enabled(previous)


def _write_run(run, model, config, recipe: str, tokenizer, extra: dict | None = None):
    from qkv.files import save_weights, write_json

    run.mkdir(parents=True)
    save_weights(model, run / "model.safetensors")
    write_json(run / "config.json", config.to_dict())
    write_json(run / "train_config.json", {"recipe": recipe})
    tokenizer.save(run / "tokenizer.json")
    for name, data in (extra or {}).items():
        write_json(run / name, data)
    return run


@pytest.fixture(scope="session")
def tiny_runs(tmp_path_factory) -> dict:
    """Run directories of the model families with tiny random models (2 layers, 2 heads):
    ``{"translation": path, "translation-rnn": path, "lm": path, "diffusion-lm": path,
    "protein": path}`` (protein: a 2-class sequence classifier; translation-rnn: a GRU with
    additive attention). For code that reads runs; nothing here is trained."""
    from qkv.data.tokenizers import AminoAcidTokenizer, CharTokenizer, SubwordTokenizer
    from qkv.models import DecoderLM, LMConfig, Transformer, TransformerConfig
    from qkv.models.config import DiffusionLMConfig, EncoderConfig, RNNConfig
    from qkv.models.diffusion_lm import DiffusionLM
    from qkv.models.encoder import EncoderModel
    from qkv.models.rnn import RNNSeq2Seq

    root = tmp_path_factory.mktemp("tiny_runs")
    torch.manual_seed(0)
    sentences = [
        "Ein Mann fährt mit dem Fahrrad.",
        "Eine Frau liest ein Buch im Park.",
        "A man rides a bike.",
        "A woman reads a book in the park.",
    ] * 5
    bpe = SubwordTokenizer.train(sentences, vocab_size=120, min_frequency=1)
    mt_cfg = TransformerConfig(
        src_vocab_size=bpe.vocab_size,
        tgt_vocab_size=bpe.vocab_size,
        d_model=16,
        n_heads=2,
        d_ff=32,
        n_encoder_layers=2,
        n_decoder_layers=2,
        max_len=64,
    )
    rnn_cfg = RNNConfig(src_vocab_size=bpe.vocab_size, tgt_vocab_size=bpe.vocab_size, d_model=16, max_len=64)
    chars = CharTokenizer.train("ROMEO:\nBut soft, what light through yonder window breaks?")
    lm_cfg = LMConfig(
        vocab_size=chars.vocab_size,
        d_model=16,
        n_heads=2,
        d_ff=32,
        n_layers=2,
        max_len=64,
        positional="rotary",
    )
    # the LM's model without its look-ahead mask, and [MASK] after the characters
    dlm_cfg = DiffusionLMConfig(
        **{**dataclasses.asdict(lm_cfg), "vocab_size": chars.vocab_size + 1, "mask_id": chars.vocab_size}
    )
    aa = AminoAcidTokenizer()
    enc_cfg = EncoderConfig(
        vocab_size=aa.vocab_size,
        d_model=16,
        n_heads=2,
        d_ff=32,
        n_layers=2,
        max_len=64,
        num_labels=2,
        dropout=0.0,
        positional="rotary",
    )
    return {
        "translation": _write_run(root / "mt", Transformer(mt_cfg), mt_cfg, "translation", bpe),
        "translation-rnn": _write_run(
            root / "rnn",
            RNNSeq2Seq(rnn_cfg),
            rnn_cfg,
            "translation-rnn",
            bpe,
            {"train_config.json": {"recipe": "translation-rnn", "model_type": "rnn-seq2seq"}},
        ),
        "lm": _write_run(root / "lm", DecoderLM(lm_cfg), lm_cfg, "lm", chars),
        "diffusion-lm": _write_run(root / "dlm", DiffusionLM(dlm_cfg), dlm_cfg, "diffusion-lm", chars),
        "protein": _write_run(
            root / "protein",
            EncoderModel(enc_cfg),
            enc_cfg,
            "protein-cls",
            aa,
            {"task.json": {"task": "toy", "level": "sequence", "classes": ["non-AMP", "AMP"]}},
        ),
    }


@pytest.fixture(scope="session")
def tiny_vit_run(tmp_path_factory):
    """A ``qkv train vit`` run directory on scikit-learn's 8 × 8 digits: 2 layers, 2 heads,
    2 × 2 patches (16 patches + the class token), 20 steps (a few seconds on one thread;
    barely trained: for code that reads runs, not for accuracy)."""
    return train_digits_vit(
        tmp_path_factory.mktemp("tiny_vit") / "run",
        "model.d_model=16",
        "model.d_ff=32",
        "train.max_steps=20",
        "train.eval_every=1000",
        "train.warmup_steps=5",
        "batch_size=32",
        "baseline=false",
        "train.precision=fp32",
    )


def train_digits_vit(run, *overrides: str):
    """``qkv train vit --task digits`` into ``run``: 2 layers, 2 heads, 2 × 2 patches, lr 3e-3
    on one thread, plus ``overrides``; asserts it succeeded and returns ``run``."""
    from qkv.cli import main

    code = main(
        [
            "train",
            "vit",
            "--task",
            "digits",
            "--out",
            str(run),
            "--quiet",
            "model.n_heads=2",
            "model.n_layers=2",
            "model.patch_size=2",
            "train.lr=3e-3",
            "train.threads=1",
            *overrides,
        ]
    )
    assert code == 0
    return run


CAPTION_STEPS = 80
CAPTIONS = [
    "a coat",
    "two t-shirts",
    "a sandal to the left of a bag",
    "a bag to the right of a sandal",
    "two dresses above a sneaker",
    "a boot below a pullover",
    "a shirt above two trousers",
]


@pytest.fixture(scope="session")
def tiny_caption_run(tmp_path_factory) -> Path:
    """A ``qkv train caption`` run directory with a tiny captioner: 56 × 56 grey scenes in
    14-pixel patches (a 4 × 4 grid), 2 encoder and 2 decoder layers, 2 heads, trained for a
    moment to write the words of :data:`CAPTIONS` (a second or so)."""
    import numpy as np
    import torch.nn.functional as F

    from qkv.data.batching import pad_sequences
    from qkv.data.images import to_model_input
    from qkv.data.tokenizers import SubwordTokenizer
    from qkv.files import save_weights, write_json
    from qkv.models.caption import CaptionModel
    from qkv.models.config import CaptionConfig

    run = tmp_path_factory.mktemp("caption") / "run"
    run.mkdir()
    torch.manual_seed(0)
    tokenizer = SubwordTokenizer.train(CAPTIONS * 3, vocab_size=80, min_frequency=1)
    config = CaptionConfig(
        vocab_size=tokenizer.vocab_size,
        d_model=16,
        n_heads=2,
        d_ff=32,
        n_encoder_layers=2,
        n_decoder_layers=2,
        image_size=56,
        patch_size=14,
        channels=1,
        max_len=16,
    )
    model = CaptionModel(config)
    # Untrained, it writes one piece over and over; a few steps on CAPTIONS (each over an image
    # of noise) and it writes their words.
    images = to_model_input(
        np.random.default_rng(0).integers(0, 256, (len(CAPTIONS), 56, 56, 1), dtype=np.uint8)
    )
    ids = [tokenizer.encode(c) for c in CAPTIONS]
    tgt_in = pad_sequences([[config.bos_id, *x] for x in ids], config.pad_id)
    tgt_out = pad_sequences([[*x, config.eos_id] for x in ids], config.pad_id)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(CAPTION_STEPS):
        logits = model(images, tgt_in).logits
        loss = F.cross_entropy(logits.flatten(0, 1), tgt_out.flatten(), ignore_index=config.pad_id)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    save_weights(model, run / "model.safetensors")
    write_json(run / "config.json", config.to_dict())
    write_json(
        run / "train_config.json",
        {"recipe": "caption", "model_type": "caption", "task": "scenes", "eval_scenes": 6, "split_seed": 0},
    )
    write_json(run / "task.json", {"task": "scenes", "background": "black"})
    tokenizer.save(run / "tokenizer.json")
    return run
