"""Protein sequences: the amino-acid tokenizer, FASTA edge cases, MLM corruption statistics,
the encoder (padding never matters, pooling), and a pretraining smoke run on real data."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest
import torch

from qkv.cli import main
from qkv.data.masking import IGNORE, mask_tokens
from qkv.data.protein import held_out, read_fasta
from qkv.data.tokenizers import AMINO_ACIDS, AminoAcidTokenizer, load_tokenizer
from qkv.errors import QkvError
from qkv.models.config import EncoderConfig
from qkv.models.encoder import EncoderModel, masked_mean

DATA = Path(os.environ.get("QKV_DATA_DIR", Path(__file__).resolve().parents[2] / "shared" / "data"))


def test_amino_acid_tokenizer_round_trip_and_specials(tmp_path):
    tok = AminoAcidTokenizer()
    assert tok.vocab_size == 5 + 20 + 5
    ids = tok.encode("mkTAyiXBZUO*")
    assert ids[0] == tok.cls_id and ids[-1] == tok.eos_id and len(ids) == 11 + 2
    assert tok.decode(ids) == "MKTAYIXBZUO"
    assert tok.residue_ids == [tok.encode(a, add_special_tokens=False)[0] for a in AMINO_ACIDS]
    tok.save(tmp_path / "tokenizer.json")
    again = load_tokenizer(tmp_path / "tokenizer.json")
    assert isinstance(again, AminoAcidTokenizer) and again.encode("ACD") == tok.encode("ACD")


@pytest.mark.parametrize(
    "seq, char, pos",
    [
        ("MK-LV", "-", 3),
        ("MKL V", " ", 4),
        ("MK1", "1", 3),
        ("M**", "*", 2),
        ("MK.", ".", 3),
        ("<mask>", "<", 1),
    ],
)
def test_amino_acid_tokenizer_refuses_other_characters(seq, char, pos):
    with pytest.raises(QkvError) as err:
        AminoAcidTokenizer().encode(seq, "P12345")
    msg = str(err.value)
    assert "P12345" in msg and repr(char) in msg and f"position {pos}" in msg


def _write(path: Path, text: str, newline: str = "\n") -> Path:
    path.write_bytes(text.replace("\n", newline).encode("utf-8"))
    return path


def test_fasta_windows_newlines_lowercase_and_stop(tmp_path):
    path = _write(tmp_path / "a.fasta", ">p1 first protein\nmkt\nAYI*\n>p2\nACDE\n", "\r\n")
    recs = read_fasta(path)
    assert [(r.id, r.sequence) for r in recs] == [("p1", "MKTAYI"), ("p2", "ACDE")]
    assert recs[0].description == "p1 first protein"


@pytest.mark.parametrize(
    "text, needle",
    [
        (">p1\nMKT\n>p2\n\n>p3\nAC\n", "p2 has an empty sequence"),
        (">p1\nMKT\n>p1\nACD\n", "duplicate record id 'p1'"),
        ("", "no FASTA records"),
        ("just some text\n", "is it a FASTA file"),
        (">p1\nMK-T\n", "position 3"),
    ],
)
def test_fasta_problems_are_named(tmp_path, text, needle):
    with pytest.raises(QkvError, match=needle.replace("(", r"\(")):
        read_fasta(_write(tmp_path / "bad.fasta", text))


def test_fasta_skip_invalid_keeps_the_good_records(tmp_path, caplog):
    path = _write(tmp_path / "c.fasta", ">p1\nMKT\n>p2\nMK-T\n>p3\nAC\n")
    with caplog.at_level(logging.WARNING, logger="qkv.data.protein"):
        recs = read_fasta(path, skip_invalid=True)
    assert [(r.name, r.levelno) for r in caplog.records if "skipped 1" in r.getMessage()] == [
        ("qkv.data.protein", logging.WARNING)
    ]
    assert [r.id for r in recs] == ["p1", "p3"]
    with pytest.raises(QkvError, match="not found"):
        read_fasta(tmp_path / "missing.fasta")


def test_mlm_masking_statistics():
    """15 % of residues chosen, never specials; of those 80 % <mask>, 10 % random, 10 % kept."""
    tok = AminoAcidTokenizer()
    g = torch.Generator().manual_seed(0)
    rows = torch.randint(5, 25, (400, 300), generator=g)
    rows[:, 0], rows[:, -1], rows[:50, 200:] = tok.cls_id, tok.eos_id, tok.pad_id
    inputs, labels = mask_tokens(rows, list(range(5)), tok.mask_id, tok.residue_ids, 0.15, g)
    chosen = labels != IGNORE
    eligible = rows >= 5
    assert not (chosen & ~eligible).any()
    assert torch.equal(labels[chosen], rows[chosen]) and torch.equal(inputs[~chosen], rows[~chosen])
    share = chosen.sum() / eligible.sum()
    assert abs(share - 0.15) < 0.005
    masked = (inputs[chosen] == tok.mask_id).float().mean()
    kept = (inputs[chosen] == rows[chosen]).float().mean()  # 10 % kept + 10 % × 1/20 random hits
    assert abs(masked - 0.8) < 0.01 and abs(kept - 0.105) < 0.01
    assert set(inputs[chosen & (inputs != tok.mask_id)].tolist()) <= set(tok.residue_ids)
    all_masked, _ = mask_tokens(rows, list(range(5)), tok.mask_id, tok.residue_ids, 0.15, g, (1.0, 0.0))
    assert set(all_masked[all_masked != rows].tolist()) == {tok.mask_id}


def _encoder(**kw) -> EncoderModel:
    torch.manual_seed(0)
    return EncoderModel(
        EncoderConfig(
            vocab_size=30,
            d_model=16,
            n_heads=2,
            d_ff=32,
            n_layers=2,
            max_len=40,
            num_labels=3,
            dropout=0.0,
            **kw,
        )
    ).eval()


@pytest.mark.parametrize("pooling", ["cls", "mean"])
@pytest.mark.parametrize("positional", ["learned", "rotary"])
def test_padding_never_changes_encoder_outputs(pooling, positional):
    """A sequence alone and right-padded in a batch give the same hidden states at real
    positions, the same pooled class logits and the same per-residue logits."""
    model = _encoder(pooling=pooling, positional=positional)
    tok = AminoAcidTokenizer()
    short, long = tok.encode("MKTAYIAK"), tok.encode("MKTAYIAKQRQISFVKSHFSRQ")
    batch = torch.full((2, len(long)), tok.pad_id)
    batch[0, : len(short)], batch[1] = torch.tensor(short), torch.tensor(long)
    with torch.no_grad():
        alone = model.classify_sequence(torch.tensor([short]))
        both = model.classify_sequence(batch)
        torch.testing.assert_close(both.logits[0], alone.logits[0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(both.hidden[0, : len(short)], alone.hidden[0], atol=1e-5, rtol=1e-5)
        res_alone = model.classify_residues(torch.tensor([short])).logits[0]
        res_both = model.classify_residues(batch).logits[0, : len(short)]
        torch.testing.assert_close(res_both, res_alone, atol=1e-5, rtol=1e-5)


def test_masked_mean_ignores_padding():
    hidden = torch.tensor([[[1.0], [3.0], [100.0]]])
    assert masked_mean(hidden, torch.tensor([[True, True, False]])).item() == 2.0


def test_encoder_is_bidirectional():
    """Unlike the LM, an early position's hidden state changes when a later token changes."""
    model = _encoder()
    x = torch.tensor([[0, 5, 6, 7, 8, 2]])
    y = x.clone()
    y[0, 4] = 9
    with torch.no_grad():
        assert not torch.allclose(model(x).hidden[0, 1], model(y).hidden[0, 1])


def test_held_out_split_is_stable_and_sized():
    ids = [f"P{i:05d}" for i in range(20000)]
    share = sum(held_out(i, 0.02) for i in ids) / len(ids)
    assert abs(share - 0.02) < 0.004 and held_out("P00001", 0.02) == held_out("P00001", 0.02)


def test_protein_mlm_smoke_on_real_data(tmp_path, capsys, monkeypatch):
    """`qkv train protein-mlm` on the real corpora for a few steps writes a loadable run."""
    if not (DATA / "uniprot_mmseqs2" / "DB.fasta.gz").is_file():
        if os.environ.get("CI"):
            pytest.fail(f"protein corpora missing in {DATA}")
        pytest.skip("protein corpora not available (set QKV_DATA_DIR)")
    monkeypatch.setenv("QKV_DATA_DIR", str(DATA))
    out = tmp_path / "run"
    code = main(
        [
            "train",
            "protein-mlm",
            "--out",
            str(out),
            "--max-steps",
            "4",
            "--quiet",
            "--json",
            "eval_every=2",
            "lr_decay_steps=4",
            "warmup_steps=2",
            "d_model=32",
            "n_heads=2",
            "d_ff=64",
            "n_layers=1",
            "max_len=64",
            "max_tokens=2048",
            "train_limit=2000",
            "val_limit=100",
            "precision=fp32",
        ]
    )
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    val = summary["validation"]
    assert summary["steps"] == 4 and 1.0 < val["val_ppl"] < 40 and 15 < val["unigram_ppl"] < 20
    for name in ("model.safetensors", "config.json", "tokenizer.json", "metrics.jsonl"):
        assert (out / name).is_file()
    assert main(["evaluate", str(out)]) == 0  # recomputed from the saved run: the same figure
    again = json.loads(capsys.readouterr().out)
    assert again["val_ppl"] == pytest.approx(val["val_ppl"], rel=1e-4) and again["uniform_ppl"] == 20.0
