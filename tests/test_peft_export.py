"""``qkv convert --to peft``: a LoRA run's adapters as a PEFT adapter beside its HF base model
(:mod:`qkv.hub.peft_export`), loaded back with ``peft`` and ``transformers`` and compared with
the run's own logits."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest
import torch
from cli_runs import DATA, ESM_VOCAB, refused, run_main, tiny_gpt2_folder
from safetensors.torch import load_file

from qkv.runs import load_run

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

TOL = 1e-4  # PEFT's logits against qkv's
APART = 1e-2  # the base model without the adapters is at least this far from them
SENTENCES = [
    "The cat sat on the mat.",
    "A dog ran in the park, and the cat watched it.",
    "Two birds sang in the old tree by the river.",
]
WORDS = ["good", "bad", "film", "movie", "great", "awful", "plot", "the", "a", "very"]
# a few steps at a high rate and a large alpha: adapters far from zero in seconds
LORA = ["train.lora_rank=4", "train.lora_alpha=32", "train.lr=3e-2", "--quiet"]


def _train(tmp_path_factory, name: str, *args: str) -> Path:
    from qkv.cli import main

    out = tmp_path_factory.mktemp(name) / "run"
    assert main([*args, "--out", str(out), *LORA]) == 0
    return out


@pytest.fixture(scope="module")
def gpt2_lora(tmp_path_factory) -> tuple[Path, Path]:
    """(a tiny random GPT-2 HF folder with a byte-level BPE tokenizer, a LoRA lm run from it
    with adapters on every projection)."""
    folder = tiny_gpt2_folder(tmp_path_factory.mktemp("gpt2"), SENTENCES)
    corpus = folder / "text.txt"
    corpus.write_text("\n".join(SENTENCES * 40) + "\n", encoding="utf-8")
    run = _train(
        tmp_path_factory, "lm", "train", "lm", "--init", str(folder), f"corpus={corpus}", "--max-steps", "6",
        "train.lora_modules=qkv,o,ffn", "train.warmup_steps=1", "model.max_len=32", "batch_size=4",
        "eval_every=6", "sample_tokens=4", "num_samples=1",
    )  # fmt: skip
    return folder, run


@pytest.fixture(scope="module")
def bert_lora(tmp_path_factory) -> tuple[Path, Path]:
    """(a tiny random BertModel folder (with its pooler) and WordPiece vocabulary, a LoRA
    text-cls run from it reading the pooled [CLS] state, adapters on Q/K/V and the
    feed-forward layers but not W_O)."""
    folder = tmp_path_factory.mktemp("bert")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    cfg = transformers.BertConfig(
        vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.BertModel(cfg).save_pretrained(folder)
    rng = random.Random(0)
    rows = [
        f"{' '.join(rng.choices(WORDS, k=5))} {'good' if i % 2 else 'bad'},{'pos' if i % 2 else 'neg'}"
        for i in range(60)
    ]
    task = folder / "task.csv"
    task.write_text("text,label\n" + "\n".join(rows) + "\n", encoding="utf-8")
    run = _train(
        tmp_path_factory, "text-cls", "train", "text-cls", "--init", str(folder), f"task={task}",
        "pooling=cls", "train.lora_modules=qkv,ffn", "--max-steps", "6", "max_len=16",
        "baseline=false", "train.warmup_steps=1", "train.eval_every=6",
    )  # fmt: skip
    return folder, run


def _esm_folder(tmp_path_factory) -> Path:
    """A tiny random EsmModel folder (rotary, token dropout, with its pooler) and vocabulary."""
    folder = tmp_path_factory.mktemp("esm")
    cfg = transformers.EsmConfig(
        vocab_size=33, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=160, position_embedding_type="rotary", token_dropout=True,
        mask_token_id=32, pad_token_id=1,
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.EsmModel(cfg).eval().save_pretrained(folder)
    (folder / "vocab.txt").write_text("\n".join(ESM_VOCAB) + "\n", encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def esm_lora(tmp_path_factory) -> tuple[Path, Path]:
    """(the ESM folder, a LoRA protein-cls run from it on lysine- vs glutamate-rich toy
    sequences, the head reading the pooled <cls> state, adapters on every projection)."""
    folder = _esm_folder(tmp_path_factory)
    rng = random.Random(0)
    rows = ["id,sequence,label,split"]
    for i in range(60):
        rich = "K" if i % 2 else "E"
        seq = "".join(
            rich if rng.random() < 0.4 else rng.choice("ACDGILMNPSTVWY") for _ in range(rng.randint(8, 30))
        )
        rows.append(
            f"t{i},{seq},{'pos' if i % 2 else 'neg'},{'train' if i < 40 else 'val' if i < 50 else 'test'}"
        )
    task = folder / "toy.csv"
    task.write_text("\n".join(rows) + "\n", encoding="utf-8")
    run = _train(
        tmp_path_factory, "protein-cls", "train", "protein-cls", "--task", str(task), "--init", str(folder),
        "model.pooling=cls", "train.lora_modules=qkv,o,ffn", "--max-steps", "6", "baseline=false",
    )  # fmt: skip
    return folder, run


def _export(capsys, run: Path, out: Path) -> str:
    code, stdout, err = run_main(capsys, "convert", "--to", "peft", str(run), str(out))
    assert code == 0, err
    assert not stdout
    return err


def _tokens(kind: str, vocab_size: int) -> torch.Tensor:
    """A batch without padding: random word/residue ids, a leading [CLS]/<cls> for encoders."""
    g = torch.Generator().manual_seed(1)
    if kind == "lm":
        return torch.randint(0, vocab_size, (3, 16), generator=g)
    low, high, cls = (5, vocab_size, 2) if kind == "bert" else (4, 29, 0)
    tokens = torch.randint(low, high, (3, 12), generator=g)
    tokens[:, 0] = cls
    return tokens


def _peft_model(out: Path, auto_class: str):
    base = getattr(transformers, auto_class).from_pretrained(out / "base").eval()
    return peft.PeftModel.from_pretrained(base, out).eval()


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return (a - b).abs().max().item()


def test_an_lm_adapter_on_gpt2s_packed_conv1d_gives_the_runs_logits_in_peft(gpt2_lora, tmp_path, capsys):
    folder, run = gpt2_lora
    out = tmp_path / "peft"
    assert "W0 from best.safetensors" in _export(capsys, run, out)
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["target_modules"] == ["attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"]
    assert (config["r"], config["lora_alpha"], config["fan_in_fan_out"]) == (4, 32.0, True)
    assert config["task_type"] == "CAUSAL_LM" and not config["modules_to_save"]
    assert config["base_model_name_or_path"] == str((out / "base").resolve())
    # c_attn is qkv's packed matrix: one adapter, B rows in qkv's order, A and B as trained
    ours_ab = load_file(run / "adapter_model.safetensors")
    theirs_ab = load_file(out / "adapter_model.safetensors")
    b = theirs_ab["base_model.model.transformer.h.1.attn.c_attn.lora_B.weight"]
    assert torch.equal(b, ours_ab["layers.1.self_attn.w_qkv.lora_B.weight"]) and b.shape == (96, 4)
    # W0 is the pretrained checkpoint's, bit for bit (the run cut the positions to its window)
    base, pretrained = load_file(out / "base" / "model.safetensors"), load_file(folder / "model.safetensors")
    assert set(base) == set(pretrained)
    assert all(torch.equal(v, pretrained[k][: v.shape[0]]) for k, v in base.items())

    ours, _ = load_run(run)
    tokens = _tokens("lm", ours.config.vocab_size)
    model = _peft_model(out, "AutoModelForCausalLM")
    with torch.no_grad():
        expected = ours(tokens).logits
        assert _max_diff(model(input_ids=tokens).logits, expected) <= TOL
        with model.disable_adapter():
            assert _max_diff(model(input_ids=tokens).logits, expected) > APART
        auto = peft.AutoPeftModelForCausalLM.from_pretrained(out).eval()  # through base_model_name_or_path
        assert _max_diff(auto(input_ids=tokens).logits, expected) <= TOL
        assert _max_diff(model.merge_and_unload()(input_ids=tokens).logits, expected) <= TOL


def _classifier_matches(run: Path, out: Path, family: str):
    """Assert that the exported sequence classifier gives the run's logits (also merged) and
    that its base without the adapters computes other states; ``(merged model, tokens, the
    run's output)``."""
    ours, _ = load_run(run)
    tokens = _tokens(family, ours.config.vocab_size)
    model = _peft_model(out, "AutoModelForSequenceClassification")
    with torch.no_grad():
        expected = ours(tokens, head="sequence")
        assert _max_diff(model(input_ids=tokens).logits, expected.logits) <= TOL
        # without the adapters the encoder computes other states: the adapters matter
        bare = transformers.AutoModel.from_pretrained(out / "base").eval()
        assert _max_diff(bare(input_ids=tokens).last_hidden_state, expected.hidden) > APART
        merged = model.merge_and_unload()
        assert _max_diff(merged(input_ids=tokens).logits, expected.logits) <= TOL
    return merged, tokens, expected


def test_a_bert_classifier_splits_the_packed_qkv_adapter_and_keeps_its_head(bert_lora, tmp_path, capsys):
    folder, run = bert_lora
    out = tmp_path / "peft"
    _export(capsys, run, out)
    config = json.loads((out / "adapter_config.json").read_text())
    # W_O has no adapter, so the feed-forward W_2 (`output.dense`, which would also match
    # `attention.output.dense`) is named layer by layer
    assert config["target_modules"] == [
        "attention.self.key", "attention.self.query", "attention.self.value", "intermediate.dense",
        "encoder.layer.0.output.dense", "encoder.layer.1.output.dense",
    ]  # fmt: skip
    assert config["modules_to_save"] == ["classifier"] and config["task_type"] == "SEQ_CLS"
    assert config["fan_in_fan_out"] is False
    base_config = json.loads((out / "base" / "config.json").read_text())
    assert base_config["architectures"] == ["BertModel"]
    assert base_config["id2label"] == {"0": "neg", "1": "pos"}
    # one rank-r update of the packed (3D, D) matrix = three that share A, B split by rows
    ours_ab = load_file(run / "adapter_model.safetensors")
    theirs_ab = load_file(out / "adapter_model.safetensors")
    name = "base_model.model.bert.encoder.layer.0.attention.self.{}.lora_{}.weight"
    for p in ("query", "key", "value"):
        assert torch.equal(theirs_ab[name.format(p, "A")], ours_ab["layers.0.self_attn.w_qkv.lora_A.weight"])
    split = torch.cat([theirs_ab[name.format(p, "B")] for p in ("query", "key", "value")])
    assert torch.equal(split, ours_ab["layers.0.self_attn.w_qkv.lora_B.weight"])
    pretrained = load_file(folder / "model.safetensors")
    base = load_file(out / "base" / "model.safetensors")
    assert set(base) == set(pretrained) and all(torch.equal(v, pretrained[k]) for k, v in base.items())

    merged, tokens, expected = _classifier_matches(run, out, "bert")
    with torch.no_grad():
        assert _max_diff(merged.bert(input_ids=tokens).last_hidden_state, expected.hidden) <= TOL


def test_an_esm_classifier_maps_its_pooler_and_head_to_esms_classification_head(esm_lora, tmp_path, capsys):
    folder, run = esm_lora
    out = tmp_path / "peft"
    _export(capsys, run, out)
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["target_modules"] == [
        "attention.output.dense", "attention.self.key", "attention.self.query", "attention.self.value",
        "intermediate.dense", "output.dense",
    ]  # fmt: skip
    assert config["modules_to_save"] == ["classifier"]
    names = set(load_file(out / "adapter_model.safetensors"))
    assert {
        f"base_model.model.classifier.{m}.{k}" for m in ("dense", "out_proj") for k in ("weight", "bias")
    } <= names
    assert json.loads((out / "base" / "config.json").read_text())["architectures"] == ["EsmModel"]

    _classifier_matches(run, out, "esm")


@pytest.mark.skipif(
    not (DATA / "antibody" / "paratope_train.tsv").is_file(), reason=f"paratope data not under {DATA}"
)
def test_a_per_residue_head_is_esms_token_classifier(tmp_path_factory, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("QKV_DATA_DIR", str(DATA))
    folder = _esm_folder(tmp_path_factory)
    run = _train(
        tmp_path_factory, "residue", "train", "protein-residue", "--task", "paratope", "--init", str(folder),
        "--max-steps", "3", "baseline=false",
    )  # fmt: skip
    out = tmp_path / "peft"
    _export(capsys, run, out)
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["task_type"] == "TOKEN_CLS" and config["modules_to_save"] == ["classifier"]
    ours, _ = load_run(run)
    tokens = _tokens("esm", ours.config.vocab_size)
    model = _peft_model(out, "AutoModelForTokenClassification")
    with torch.no_grad():
        expected = ours(tokens, head="residue").logits
        assert _max_diff(model(input_ids=tokens).logits, expected) <= TOL
        assert _max_diff(model.merge_and_unload()(input_ids=tokens).logits, expected) <= TOL


def test_without_the_training_checkpoints_w0_is_the_merged_weight_minus_the_update(
    bert_lora, tmp_path, capsys
):
    folder, run = bert_lora
    copy = tmp_path / "run"
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns("best.safetensors", "last.safetensors"))
    out = tmp_path / "peft"
    assert "W0 = W - (α/r)·B A" in _export(capsys, copy, out)
    pretrained = load_file(folder / "model.safetensors")
    base = load_file(out / "base" / "model.safetensors")
    assert max(_max_diff(v, pretrained[k]) for k, v in base.items() if v.is_floating_point()) <= 1e-6
    ours, _ = load_run(run)
    tokens = _tokens("bert", ours.config.vocab_size)
    model = _peft_model(out, "AutoModelForSequenceClassification")
    with torch.no_grad():
        assert _max_diff(model(input_ids=tokens).logits, ours(tokens, head="sequence").logits) <= TOL


def test_refusals_are_one_line_and_write_nothing(gpt2_lora, bert_lora, tmp_path, capsys):
    folder, run = gpt2_lora
    out = tmp_path / "out"
    plain = tmp_path / "plain"
    assert run_main(capsys, "convert", "hf", str(folder), str(plain))[0] == 0
    refused(
        run_main(capsys, "convert", "--to", "peft", str(plain), str(out)),
        f"{plain} has no LoRA adapters; qkv convert --to hf exports it",
    )
    refused(run_main(capsys, "convert", "--to", "peft", str(tmp_path / "nothing"), str(out)), "not found")
    refused(run_main(capsys, "convert", "--to", "peft", str(run)), "usage: qkv convert --to peft")
    assert not out.exists()
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    refused(
        run_main(capsys, "convert", "--to", "peft", str(run), str(out)), "already exists and is not empty"
    )
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    # a sequence head over the mean of the tokens: no transformers class computes it
    mean = tmp_path / "mean"
    shutil.copytree(bert_lora[1], mean)
    config = json.loads((mean / "config.json").read_text())
    (mean / "config.json").write_text(json.dumps({**config, "pooling": "mean"}))
    empty = tmp_path / "empty"
    refused(
        run_main(capsys, "convert", "--to", "peft", str(mean), str(empty)),
        "mean of the tokens",
        "pooling=cls",
    )
    assert not empty.exists()
