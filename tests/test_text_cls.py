"""Text classification on a pretrained encoder (``qkv train text-cls``) and the text-encoder
CLI (embed, similarity, search): data loading errors, the probe's frozen encoder, and a short
real run on SST-2 with MiniLM whose saved model reloads to the same test figures."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from pretrained_marks import needs_minilm

from qkv.errors import QkvError

DATA = Path(os.environ.get("QKV_DATA_DIR", Path(__file__).resolve().parents[2] / "shared" / "data"))


needs_sst2 = pytest.mark.skipif(
    not (DATA / "sst2" / "test.tsv").is_file(), reason=f"SST-2 not found under {DATA} (set QKV_DATA_DIR)"
)


def test_labelled_file_errors_name_the_line(tmp_path):
    from qkv.data.text_tasks import load_text_task, read_labelled

    bad = tmp_path / "bad.tsv"
    bad.write_text("sentence\tlabel\ngood film\t1\n\t0\n", encoding="utf-8")
    with pytest.raises(QkvError, match=r"bad\.tsv, line 3: empty text or label"):
        read_labelled(bad)
    bad.write_text("text\tscore\nx\t1\n", encoding="utf-8")
    with pytest.raises(QkvError, match="needs a header with a 'sentence' .* and a 'label' column"):
        read_labelled(bad)
    with pytest.raises(QkvError, match="unknown text task 'nope'"):
        load_text_task("nope")
    ok = tmp_path / "reviews.csv"
    ok.write_text("text,label\n" + "".join(f"review {i},{'pos' if i % 2 else 'neg'}\n" for i in range(40)))
    task = load_text_task(str(ok))
    assert task.classes == ("neg", "pos")
    assert sum(len(v) for v in task.texts.values()) == 40 and len(task.texts["test"]) == 4


@needs_minilm
def test_probe_trains_only_the_head_and_scratch_starts_from_random_weights():
    from qkv.hub.pretrained import load
    from qkv.recipes.text_cls import TextClsSettings, build_model

    probe, _ = build_model(TextClsSettings(freeze=True), 2)
    trainable = {n for n, p in probe.named_parameters() if p.requires_grad}
    assert trainable == {"sequence_head.weight", "sequence_head.bias"}
    assert probe.config.dropout == 0.0 and probe.config.pooling == "mean"
    pretrained, _ = load("minilm")
    assert torch.equal(probe.embed.weight, pretrained.embed.weight)
    scratch, _ = build_model(TextClsSettings(scratch=True), 2)
    assert not torch.equal(scratch.embed.weight, pretrained.embed.weight)
    with pytest.raises(ValueError, match="exclude each other"):
        TextClsSettings(freeze=True, scratch=True)


@needs_minilm
def test_lora_trains_adapters_and_the_head_on_the_frozen_encoder():
    from dataclasses import replace

    from qkv.hub.pretrained import load
    from qkv.recipes.text_cls import TextClsSettings, build_model

    recipe = TextClsSettings(train=replace(TextClsSettings().train, lora_rank=8))
    assert recipe.mode == "lora" and recipe.peak_lr == 5e-4
    model, _ = build_model(recipe, 2)
    trainable = {n: p.numel() for n, p in model.named_parameters() if p.requires_grad}
    assert {n for n in trainable if "lora_" not in n} == {"sequence_head.weight", "sequence_head.bias"}
    # MiniLM: 6 layers of width 384; rank 8 on the packed Q/K/V (384 → 1152) and W_O (384 → 384)
    assert sum(v for n, v in trainable.items() if "lora_" in n) == 6 * 8 * ((384 + 1152) + (384 + 384))
    pretrained, _ = load("minilm")
    assert torch.equal(model.embed.weight, pretrained.embed.weight)
    with pytest.raises(ValueError, match="lora_rank"):
        TextClsSettings(freeze=True, train=recipe.train)


@needs_minilm
def test_cli_embed_similarity_and_search(tmp_path, capsys):
    from safetensors import safe_open

    from qkv.cli import main

    lines = ["A dog runs on the grass.", "The stock market fell sharply today.", "A puppy plays in a park."]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(lines) + "\n\n", encoding="utf-8")
    assert (
        main(
            [
                "embed",
                "--model",
                "minilm",
                str(corpus),
                "--out",
                str(tmp_path / "e.safetensors"),
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    with safe_open(tmp_path / "e.safetensors", "pt") as f:
        vectors = f.get_tensor("mean")
        assert json.loads(f.metadata()["ids"]) == lines
    assert vectors.shape == (3, 384)
    assert torch.allclose(vectors.norm(dim=-1), torch.ones(3), atol=1e-5)
    capsys.readouterr()
    assert (
        main(["search", "a dog playing outside", "--corpus", str(corpus), "--top-k", "2", "--device", "cpu"])
        == 0
    )
    hits = [line.split("\t") for line in capsys.readouterr().out.strip().splitlines()]
    assert [h[1] for h in hits] != [] and "stock" not in " ".join(h[1] for h in hits)
    assert float(hits[0][0]) >= float(hits[1][0])
    from qkv.inference.text import TextEncoder

    query = torch.from_numpy(TextEncoder.load("minilm").embed(["a dog playing outside"]))[0]
    best = lines.index(hits[0][1])
    assert abs(float(hits[0][0]) - float(vectors[best] @ query)) < 1e-4  # the score is the cosine
    assert main(["similarity", "A dog runs.", "A dog runs.", "--device", "cpu"]) == 0
    assert capsys.readouterr().out.strip() == "1.0000"
    empty = tmp_path / "empty.txt"
    empty.write_text("\n \n", encoding="utf-8")
    assert main(["embed", "--model", "minilm", str(empty), "--out", str(tmp_path / "x.safetensors")]) == 2
    assert capsys.readouterr().err.strip() == f"error: {empty} holds no text"
    assert not (tmp_path / "x.safetensors").exists()


@needs_minilm
@needs_sst2
@pytest.mark.parametrize("mode", ["fine-tune", "lora"])
def test_text_cls_short_run_on_sst2_reloads_to_the_same_test_figures(tmp_path, monkeypatch, mode):
    from qkv.cli import main
    from qkv.inference.text import TextEncoder
    from qkv.recipes.text_cls import evaluate_run

    monkeypatch.setenv("QKV_DATA_DIR", str(DATA))
    out = tmp_path / "run"
    assert (
        main(
            [
                "train",
                "text-cls",
                "--out",
                str(out),
                "--max-steps",
                "4",
                "--quiet",
                "train.eval_every=4",
                "baseline=false",
                "train.threads=1",
                *(["train.lora_rank=4"] if mode == "lora" else []),
            ]
        )
        == 0
    )
    summary = json.loads((out / "summary.json").read_text())
    assert summary["mode"] == mode and summary["steps"] == 4
    assert (out / "adapter_model.safetensors").is_file() == (mode == "lora")
    assert summary["test"]["n"] == 1821 and summary["validation"]["n"] == 872
    again = evaluate_run(out, "test")
    assert again["accuracy"] == summary["test"]["accuracy"]
    encoder = TextEncoder.load(out)
    assert encoder.classes == ("negative", "positive")
    probs = encoder.predict(["a gorgeous , witty , seductive movie .", "dull and lifeless"])
    assert probs.shape == (2, 2) and abs(float(probs.sum()) - 2.0) < 1e-5
    texts = tmp_path / "reviews.txt"
    texts.write_text("a gorgeous , witty , seductive movie .\ndull and lifeless\n", encoding="utf-8")
    import contextlib
    import io

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        assert main(["classify", str(out), str(texts), "--device", "cpu"]) == 0
    rows = [line.split("\t") for line in buffer.getvalue().splitlines()]
    assert rows[0] == ["text", "label", "p_negative", "p_positive"] and len(rows) == 3
    assert abs(float(rows[2][3]) - float(probs[1, 1])) < 1e-4
