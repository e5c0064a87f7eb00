"""The five tokenizers share one interface (:class:`qkv.data.tokenizers.Tokenizer`): each one
satisfies the Protocol, round-trips text, and keeps the defaults its callers rely on."""

from __future__ import annotations

from pathlib import Path

import pytest

from qkv.data.tokenizers import (
    AminoAcidTokenizer,
    CharTokenizer,
    HFTokenizer,
    PretrainedProteinTokenizer,
    SubwordTokenizer,
    Tokenizer,
    load_tokenizer,
)

SENTENCES = ["the cat sat on the mat.", "a dog ran in the park!", "the dog sat."]
PROTEIN = "MKTAYIAKQR"


def _word_vocab(tmp_path: Path) -> Path:
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat", "."]
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(words) + "\n", encoding="utf-8")
    return path


def _residue_vocab(tmp_path: Path) -> Path:
    path = tmp_path / "residues.txt"
    path.write_text(
        "\n".join(["<cls>", "<pad>", "<eos>", "<unk>", "<mask>", *"ACDEFGHIKLMNPQRSTVWYX"]) + "\n",
        encoding="utf-8",
    )
    return path


def _all(tmp_path: Path) -> dict[str, tuple[Tokenizer, str]]:
    """Each tokenizer (typed as the Protocol, so mypy checks the classes against it) with a text
    it encodes losslessly."""
    subword: Tokenizer = SubwordTokenizer.train(SENTENCES, vocab_size=80, min_frequency=1)
    char: Tokenizer = CharTokenizer.train("".join(SENTENCES))
    hf: Tokenizer = HFTokenizer.from_vocab(_word_vocab(tmp_path))
    amino: Tokenizer = AminoAcidTokenizer()
    pretrained: Tokenizer = PretrainedProteinTokenizer(HFTokenizer.from_vocab(_residue_vocab(tmp_path)))
    return {
        "bpe": (subword, SENTENCES[0]),
        "char": (char, SENTENCES[1]),
        "hf": (hf, "the cat sat on the mat"),
        "amino-acid": (amino, PROTEIN),
        "hf-protein": (pretrained, PROTEIN),
    }


KINDS = ["bpe", "char", "hf", "amino-acid", "hf-protein"]


@pytest.mark.parametrize("kind", KINDS)
def test_satisfies_protocol_and_round_trips(kind, tmp_path):
    tok, text = _all(tmp_path)[kind]
    assert isinstance(tok, Tokenizer)
    assert tok.kind == kind
    assert tok.vocab_size > 0
    assert tok.eos_id is None or 0 <= tok.eos_id < tok.vocab_size
    ids = tok.encode(text)
    assert all(0 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == text
    assert tok.encode_batch([text, text]) == [ids, ids]
    assert tok.decode_batch([ids]) == [text]
    assert isinstance(tok.id_to_token(ids[0]), str)


@pytest.mark.parametrize("kind", KINDS)
def test_add_special_tokens_by_keyword(kind, tmp_path):
    """Every tokenizer takes ``add_special_tokens=`` and keeps its own default: none added by
    qkv's BPE and character tokenizers (recipes add bos/eos), the model's own framing by the
    pretrained and protein ones."""
    tok, text = _all(tmp_path)[kind]
    bare = tok.encode(text, add_special_tokens=False)
    framed = tok.encode(text, add_special_tokens=True)
    assert tok.decode(bare) == tok.decode(framed) == text
    if kind == "char":  # no special tokens at all
        assert framed == bare == tok.encode(text)
    else:
        assert framed[1:-1] == bare and framed[-1] == tok.eos_id
        assert tok.encode(text) == (bare if kind == "bpe" else framed)
    assert tok.encode_batch([text], add_special_tokens=False) == [bare]


@pytest.mark.parametrize("kind", KINDS)
def test_save_and_load_tokenizer(kind, tmp_path):
    tok, text = _all(tmp_path)[kind]
    tok.save(tmp_path / "tokenizer.json")
    back = load_tokenizer(tmp_path / "tokenizer.json")
    assert isinstance(back, Tokenizer)
    assert back.encode(text, add_special_tokens=False) == tok.encode(text, add_special_tokens=False)


def test_protein_tokenizers_keep_positional_seq_id(tmp_path):
    """The protein tokenizers' second positional argument is still the sequence id that errors
    name (``encode(seq, sid, add_special_tokens=False)`` in :mod:`qkv.inference.protein`)."""
    from qkv.errors import QkvError

    for kind in ("amino-acid", "hf-protein"):
        tok = _all(tmp_path)[kind][0]
        assert isinstance(tok, (AminoAcidTokenizer, PretrainedProteinTokenizer))
        with pytest.raises(QkvError, match="P12345"):
            tok.encode("MK-V", "P12345", add_special_tokens=False)
        with pytest.raises(QkvError, match="sequence 2"):
            tok.encode_batch(["MKV", "M K"])
