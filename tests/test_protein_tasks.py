"""Protein tasks: data sets and splits, metrics, baselines, probing/fine-tuning, classify and
embed, bad input at the command line, and smoke runs on the real shared data."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from cli_runs import tiny_mlm_run
from safetensors.torch import load_file

from qkv.cli import main
from qkv.data.protein_tasks import (
    load_amp_scanner,
    load_flip_secondary_structure,
    load_signalp,
    load_user_file,
    stratified_split,
)
from qkv.errors import QkvError
from qkv.evaluate.baselines import baseline_metrics, composition, window_features
from qkv.evaluate.classification import classification_metrics, per_group_binary_mcc
from qkv.inference.protein import ProteinEncoder
from qkv.models.config import EncoderConfig
from qkv.models.encoder import EncoderModel

DATA = Path(os.environ.get("QKV_DATA_DIR", Path(__file__).resolve().parents[2] / "shared" / "data"))
TINY = ["d_model=32", "n_heads=2", "d_ff=64", "n_layers=1", "max_len=64", "threads=1"]


def need_data(*parts: str) -> None:
    if not DATA.joinpath(*parts).exists():
        if os.environ.get("CI"):
            pytest.fail(f"shared data missing: {DATA.joinpath(*parts)}")
        pytest.skip("shared data not available (set QKV_DATA_DIR)")


@pytest.fixture
def data_dir(monkeypatch):
    monkeypatch.setenv("QKV_DATA_DIR", str(DATA))


def _toy_sequences(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """Class "pos" is lysine-rich, "neg" glutamate-rich: learnable from composition."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        label = "pos" if i % 2 else "neg"
        rich = "K" if label == "pos" else "E"
        seq = "".join(
            rich if rng.random() < 0.4 else rng.choice("ACDGILMNPSTVWY") for _ in range(rng.randint(8, 30))
        )
        rows.append((seq, label))
    return rows


@pytest.fixture
def toy_csv(tmp_path) -> Path:
    path = tmp_path / "toy.csv"
    lines = ["id,sequence,label,split"]
    for i, (seq, label) in enumerate(_toy_sequences(120)):
        lines.append(f"t{i},{seq},{label},{'train' if i < 80 else 'val' if i < 100 else 'test'}")
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def pretrained_run(tmp_path) -> Path:
    """A tiny protein-mlm run directory (random weights) to start probes and fine-tunes from."""
    return tiny_mlm_run(tmp_path / "mlm")


def test_stratified_split_is_80_10_10_and_fixed():
    labels = ["a"] * 500 + ["b"] * 300
    s1, s2 = stratified_split(labels, 0), stratified_split(labels, 0)
    assert s1 == s2 and s1.count("train") == 640 and s1.count("val") == 80 and s1.count("test") == 80
    for part in ("train", "val", "test"):  # class shares kept in every part
        picked = [lab for lab, s in zip(labels, s1, strict=True) if s == part]
        assert abs(picked.count("a") / len(picked) - 500 / 800) < 0.02


def test_user_csv_and_fasta_with_labels(tmp_path, toy_csv):
    task = load_user_file(toy_csv)
    assert task.classes == ("neg", "pos") and len(task.split("train")) == 80
    assert task.records[0].id == "t0" and task.label_ids(task.records[1]) == [1]
    fasta, labels = tmp_path / "x.fasta", tmp_path / "x.txt"
    fasta.write_text(">a\nMKT\n>b\nACD\n>c\nKKK\n")
    labels.write_text("1\n0\n")
    with pytest.raises(QkvError, match="2 labels but .* has 3 records"):
        load_user_file(fasta, labels)
    with pytest.raises(QkvError, match="labels=FILE"):
        load_user_file(fasta)
    bad = tmp_path / "bad.csv"
    bad.write_text("sequence,label\nMK-T,1\n")
    with pytest.raises(QkvError, match=r"row2: character '-' at position 3"):
        load_user_file(bad)
    bad.write_text("seq,label\nMKT,1\n")
    with pytest.raises(QkvError, match="'sequence' and 'label' columns"):
        load_user_file(bad)


def test_signalp_partitions_and_types(data_dir):
    need_data("signalp6", "train_set.fasta")
    task = load_signalp(0)
    assert len(task.records) == 20290 and set(task.classes) == {
        "NO_SP",
        "SP",
        "LIPO",
        "TAT",
        "TATLIPO",
        "PILIN",
    }
    sizes = {s: len(task.split(s)) for s in ("train", "val", "test")}
    assert sizes == {"test": 5896, "val": 7392, "train": 7002}  # partitions 0, 1, 2
    assert {r.group for r in task.records} == {"EUKARYA", "ARCHAEA", "POSITIVE", "NEGATIVE"}
    assert max(len(r.sequence) for r in task.records) == 70
    assert len(load_signalp(1).split("test")) == 7392


def test_amp_scanner_and_flip(data_dir):
    need_data("peptides", "amp_ascan", "seqs.fasta")
    amp = load_amp_scanner()
    assert len(amp.records) == 3556 and amp.classes == ("non-AMP", "AMP")
    test = amp.split("test")
    assert len(test) in (355, 356, 357) and abs(sum(r.label == "AMP" for r in test) / len(test) - 0.5) < 0.01
    need_data("flip_secondary_structure", "sampled.fasta")
    flip = load_flip_secondary_structure()
    assert {s: len(flip.split(s)) for s in ("train", "val", "test")} == {
        "train": 9712,
        "val": 1080,
        "test": 364,
    }
    rec = flip.records[0]
    ids = flip.label_ids(rec)
    assert len(ids) == len(rec.sequence) == len(rec.label)
    assert all((i == -100) == (not ok) for i, ok in zip(ids, rec.resolved, strict=True))


def test_metrics_match_hand_computed_values():
    m = classification_metrics(
        [0, 0, 1, 1], [0, 1, 1, 1], np.array([[0.9, 0.1], [0.4, 0.6], [0.2, 0.8], [0.1, 0.9]]), ("a", "b")
    )
    assert m["accuracy"] == 0.75 and m["auroc"] == 1.0
    assert m["mcc"] == pytest.approx(1 / np.sqrt(3))  # (TP·TN − FP·FN) / sqrt(...) = 2/sqrt(12)
    assert m["per_class"]["b"] == {"precision": 2 / 3, "recall": 1.0, "f1": 0.8, "support": 2}
    assert m["confusion"] == [[1, 1], [0, 2]]
    groups = per_group_binary_mcc(
        [0, 1, 2, 0, 1], [0, 1, 1, 0, 0], ["x", "x", "x", "y", "y"], ["NO_SP", "SP", "TAT"], "NO_SP"
    )
    assert groups["x"]["any_vs_NO_SP"] == 1.0 and groups["x"]["SP"] == pytest.approx(0.5)
    assert groups["y"]["SP"] == 0.0 and "TAT" not in groups["y"]


def test_baseline_features_and_fit(toy_csv):
    comp = composition("KKAE")
    assert comp[:20].sum() == pytest.approx(1.0) and comp[20] == pytest.approx(np.log(4))
    win = window_features("ACD", half=1)
    assert win.shape == (3, 3 * 21) and (win.sum(1) == 3).all()
    assert win[0, 20] == 1  # left of the first residue is "outside"
    m = baseline_metrics(load_user_file(toy_csv))
    assert m["accuracy"] >= 0.9  # K-rich vs E-rich is linear in composition


def _params(model_dir: Path) -> dict:
    return load_file(str(model_dir / "model.safetensors"))


def test_probe_trains_only_the_head_and_classify_keeps_order(tmp_path, toy_csv, pretrained_run, capsys):
    out = tmp_path / "probe"
    code = main(
        [
            "train",
            "protein-cls",
            "--task",
            str(toy_csv),
            "--init",
            str(pretrained_run),
            "--freeze",
            "--out",
            str(out),
            "--quiet",
            "--json",
            "max_epochs=30",
            "eval_every=10",
            "max_tokens=512",
            "threads=1",
        ]
    )
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["mode"] == "probe" and summary["trainable_parameters"] == 32 * 2 + 2
    before, after = _params(pretrained_run), _params(out)
    encoder_keys = [k for k in before if not k.startswith(("sequence_head", "residue_head"))]
    assert len(encoder_keys) > 10
    assert [k for k in encoder_keys if not torch.equal(after[k], before[k])] == []
    assert summary["validation"]["accuracy"] > 0.6  # the head did learn something
    assert (out / "confusion.png").is_file() and summary["test"]["n"] == 20
    # classify: one row per FASTA record, in order, probabilities summing to 1
    fasta = tmp_path / "q.fasta"
    seqs = _toy_sequences(7, seed=3)
    fasta.write_text("".join(f">q{i} some description\n{s}\n" for i, (s, _) in enumerate(seqs)))
    assert main(["classify", str(out), str(fasta)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "id\tlabel\tp_neg\tp_pos" and [line.split("\t")[0] for line in lines[1:]] == [
        f"q{i}" for i in range(7)
    ]
    assert all(abs(float(line.split("\t")[2]) + float(line.split("\t")[3]) - 1) < 1e-3 for line in lines[1:])
    # embed: mean embeddings in input order, ids (whole header lines) kept, per-residue on request
    emb = tmp_path / "emb"
    assert main(["embed", str(out), str(fasta), "--out", str(emb), "--per-residue"]) == 0
    from safetensors import safe_open

    with safe_open(str(emb / "shard-00000.safetensors"), "pt") as f:  # one layer: layer 1, the last
        ids = json.loads(f.metadata()["ids"])
        mean, r0 = f.get_tensor("mean/layer1"), f.get_tensor("residues/layer1/q0 some description")
    assert ids == [f"q{i} some description" for i in range(7)]
    assert mean.shape == (7, 32) and r0.shape == (len(seqs[0][0]), 32)
    torch.testing.assert_close(r0.mean(0), mean[0])


def test_fine_tune_changes_the_encoder_and_learns(tmp_path, toy_csv, pretrained_run, capsys):
    out = tmp_path / "ft"
    assert (
        main(
            [
                "train",
                "protein-cls",
                "--task",
                str(toy_csv),
                "--init",
                str(pretrained_run),
                "--out",
                str(out),
                "--quiet",
                "--json",
                "max_epochs=40",
                "eval_every=20",
                "max_tokens=512",
                "lr=3e-3",
                "pooling=mean",
            ]
        )
        == 0
    )
    summary = json.loads(capsys.readouterr().out)
    assert summary["mode"] == "fine-tune" and summary["validation"]["accuracy"] >= 0.85
    before, after = _params(pretrained_run), _params(out)
    assert not torch.equal(after["layers.0.ffn.w_1.weight"], before["layers.0.ffn.w_1.weight"])
    # the saved run reloads to identical predictions
    enc = ProteinEncoder.from_run(out)
    p1 = enc.predict(["KKAKKLK", "EEAEELE"])
    p2 = ProteinEncoder.from_run(out).predict(["KKAKKLK", "EEAEELE"])
    np.testing.assert_array_equal(np.stack(p1), np.stack(p2))
    assert p1[0].argmax() == 1 and p1[1].argmax() == 0


def test_lora_trains_adapters_and_head_then_merges_into_the_encoder(
    tmp_path, toy_csv, pretrained_run, capsys
):
    out = tmp_path / "lora"
    args = ["train", "protein-cls", "--task", str(toy_csv), "--init", str(pretrained_run), "--out", str(out)]
    args += ["--quiet", "--json", "max_epochs=30", "eval_every=10", "max_tokens=512", "lr=3e-3"]
    assert main([*args, "train.lora_rank=4", "train.lora_modules=qkv,o,ffn", "threads=1"]) == 0
    summary = json.loads(capsys.readouterr().out)
    # one layer of width 32 (Q/K/V 32 → 96, W_O 32 → 32, W_1 32 → 64, W_2 64 → 32), rank 4, + the head
    assert summary["mode"] == "lora"
    assert summary["trainable_parameters"] == 4 * ((32 + 96) + (32 + 32) + (32 + 64) + (64 + 32)) + 32 * 2 + 2
    before, after = _params(pretrained_run), _params(out)
    assert not [k for k in after if "lora_" in k or "base_layer" in k], "merged: the plain names"
    assert set(after) - set(before) <= {"sequence_head.weight", "sequence_head.bias"}
    assert torch.equal(after["embed.weight"], before["embed.weight"]), "not adapted, frozen"
    assert not torch.equal(
        after["layers.0.self_attn.w_qkv.weight"], before["layers.0.self_attn.w_qkv.weight"]
    )
    assert summary["validation"]["accuracy"] > 0.6
    assert (out / "adapter_model.safetensors").is_file() and (out / "adapter_config.json").is_file()
    assert ProteinEncoder.from_run(out).predict(["KKAKKLK"])[0].shape == (2,)


def test_residue_windows_cover_long_chains(caplog):
    cfg = EncoderConfig(
        vocab_size=30,
        d_model=16,
        n_heads=2,
        d_ff=32,
        n_layers=1,
        max_len=10,
        pad_id=1,
        num_labels=3,
        dropout=0.0,
    )
    enc = ProteinEncoder(EncoderModel(cfg).eval(), ("H", "E", "C"), "residue")
    probs = enc.predict(["MKTAYIAKQRQISFVKSHFSRQ", "MK"])
    assert probs[0].shape == (22, 3) and probs[1].shape == (2, 3)
    seq_enc = ProteinEncoder(EncoderModel(cfg).eval(), ("a", "b", "c"), "sequence")
    assert seq_enc.predict(["MKTAYIAKQRQ"])[0].shape == (3,)
    assert any(
        "1 sequence(s) longer than the model's 8 residues were cut" in r.getMessage()
        and r.levelname == "WARNING"
        for r in caplog.records
    )


@pytest.mark.parametrize(
    "content, needle",
    [
        (">a\nMK1T\n", "a: character '1' at position 3"),
        ("", "no FASTA records"),
    ],
)
def test_classify_bad_input_is_one_line(tmp_path, toy_csv, pretrained_run, capsys, content, needle):
    run = tmp_path / "run"
    assert (
        main(
            [
                "train",
                "protein-cls",
                "--task",
                str(toy_csv),
                "--out",
                str(run),
                "--quiet",
                "--max-steps",
                "2",
                "baseline=false",
                *TINY,
            ]
        )
        == 0
    )
    capsys.readouterr()
    bad = tmp_path / "bad.fasta"
    bad.write_text(content)
    assert main(["classify", str(run), str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and needle in err[0]
    assert main(["classify", str(pretrained_run), str(bad)]) == 2
    assert "without a task head" in capsys.readouterr().err or content == ""


def test_cli_refuses_wrong_task_level_and_probe_without_init(toy_csv, tmp_path, capsys):
    assert main(["train", "protein-residue", "--task", str(toy_csv), "--out", str(tmp_path / "r")]) == 2
    assert "per-sequence task" in capsys.readouterr().err
    assert (
        main(["train", "protein-cls", "--task", str(toy_csv), "--freeze", "--out", str(tmp_path / "p")]) == 2
    )
    assert "needs init=RUN_DIR" in capsys.readouterr().err
    assert not (tmp_path / "p").exists()
    fasta, labels = tmp_path / "x.fasta", tmp_path / "x.txt"
    fasta.write_text(">a\nMKT\n>b\nACD\n>c\nKKK\n")
    labels.write_text("1\n0\n")
    assert (
        main(
            [
                "train",
                "protein-cls",
                "--task",
                str(fasta),
                "--labels",
                str(labels),
                "--out",
                str(tmp_path / "q"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "has 2 labels but" in err[0] and "has 3 records" in err[0]


def test_signalp_and_secondary_structure_smoke_on_real_data(tmp_path, data_dir, capsys):
    need_data("signalp6", "train_set.fasta")
    need_data("flip_secondary_structure", "sampled.fasta")
    out = tmp_path / "sp"
    assert (
        main(
            [
                "train",
                "protein-cls",
                "--task",
                "signalp",
                "--out",
                str(out),
                "--quiet",
                "--json",
                "--max-steps",
                "3",
                "baseline=false",
                "max_tokens=4096",
                *TINY,
            ]
        )
        == 0
    )
    summary = json.loads(capsys.readouterr().out)
    assert summary["test"]["n"] == 5896 and set(summary["test"]["per_kingdom_mcc"]) == {
        "EUKARYA",
        "ARCHAEA",
        "POSITIVE",
        "NEGATIVE",
    }
    assert main(["evaluate", str(out), "--split", "val"]) == 0
    assert json.loads(capsys.readouterr().out)["n"] == 7392
    out = tmp_path / "ss"
    assert (
        main(
            [
                "train",
                "protein-residue",
                "--task",
                "secondary-structure",
                "--out",
                str(out),
                "--quiet",
                "--json",
                "--max-steps",
                "2",
                "baseline=false",
                "max_tokens=4096",
                *TINY,
            ]
        )
        == 0
    )
    summary = json.loads(capsys.readouterr().out)
    assert 0.2 < summary["test"]["q3"] < 0.7 and summary["test"]["n"] > 70000


@pytest.mark.skipif(not (DATA / "antibody" / "paratope_test.tsv").is_file(), reason="antibody data not found")
def test_antibody_tasks_load_with_their_published_or_fixed_splits(monkeypatch):
    from qkv.data.protein_tasks import load_task

    monkeypatch.setenv("QKV_DATA_DIR", str(DATA))
    paratope = load_task("paratope", "residue")
    assert [len(paratope.split(s)) for s in ("train", "val", "test")] == [720, 90, 90]
    assert paratope.classes == ("N", "P") and paratope.score == "auprc"
    record = paratope.split("test")[0]
    assert len(paratope.label_ids(record)) == len(record.sequence)
    share = np.mean([i for r in paratope.split("train") for i in paratope.label_ids(r)])
    assert 0.05 < share < 0.15  # about one residue in ten contacts the antigen
    dev = load_task("developability", "sequence")
    assert [len(dev.split(s)) for s in ("train", "val", "test")] == [1927, 241, 241]
    assert dev.score == "auroc" and load_task("developability", "sequence").records == dev.records


def test_auprc_is_average_precision_of_the_positive_class():
    y = [0, 0, 1, 1, 0, 1]
    p = np.array([[0.9, 0.1], [0.6, 0.4], [0.35, 0.65], [0.2, 0.8], [0.3, 0.7], [0.7, 0.3]])
    m = classification_metrics(y, p.argmax(1), p, ("neg", "pos"))
    # ranked by p(pos): 0.8 (+), 0.7 (-), 0.65 (+), 0.4 (-), 0.3 (+), 0.1 (-) → AP = (1 + 2/3 + 3/5) / 3
    assert m["auprc"] == pytest.approx((1 + 2 / 3 + 3 / 5) / 3)


def test_the_same_seed_trains_the_same_classifier(tmp_path, toy_csv):
    """Two runs with one seed end with the same weights, in one process, whatever random numbers
    were drawn before (the initial weights follow ``train.seed``, not torch's own seed)."""
    from safetensors.torch import load_file

    runs = [tmp_path / "a", tmp_path / "b"]
    for run in runs:
        torch.rand(3)  # the process's random stream moves on between the two runs
        args = ["train", "protein-cls", "--task", str(toy_csv), "--out", str(run), "--quiet"]
        assert main([*args, "--max-steps", "2", "baseline=false", "train.seed=5", *TINY]) == 0
    first, second = (load_file(run / "model.safetensors") for run in runs)
    assert first.keys() == second.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)


def test_inputs_given_as_relative_paths_are_found_again_by_a_resume_from_elsewhere(
    tmp_path, toy_csv, pretrained_run, monkeypatch
):
    """--task and --init relative to where the run started: train_config.json records them
    absolute, so --resume from another working directory finds them."""
    monkeypatch.chdir(tmp_path)
    args = ["train", "protein-cls", "--task", toy_csv.name, "--init", pretrained_run.name, "--out", "cls"]
    assert main([*args, "--quiet", "max_tokens=512", "eval_every=5", "threads=1", "train.max_steps=5"]) == 0
    saved = json.loads((tmp_path / "cls" / "train_config.json").read_text())
    assert saved["task"] == str(toy_csv.resolve()) and saved["init"] == str(pretrained_run.resolve())
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert main(["train", "protein-cls", "--out", "../cls", "--resume", "--quiet", "train.max_steps=8"]) == 0
    assert json.loads((tmp_path / "cls" / "summary.json").read_text())["steps"] == 8
