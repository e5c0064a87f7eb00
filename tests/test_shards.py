"""Token shards (``qkv prepare``): a corpus tokenized once and read from disk trains exactly as
the same corpus read into memory, preparations resume after an interruption to the same bytes,
and bad inputs are refused before anything is written."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from qkv.cli import main
from qkv.data import prepare
from qkv.data.protein import held_out
from qkv.data.protein_mlm import ShardBatches
from qkv.data.shards import PreparedData, Split, SplitWriter
from qkv.data.text import load_corpus, split_train_val, windows_at
from qkv.data.tokenizers import CharTokenizer, SubwordTokenizer, load_tokenizer
from qkv.errors import QkvError
from qkv.recipes.lm import LMRun, LMSettings
from qkv.settings import resolve

DATA = Path(os.environ.get("QKV_DATA_DIR", Path(__file__).resolve().parents[2] / "shared" / "data"))
needs_data = pytest.mark.skipif(
    not (DATA / "tinyshakespeare" / "input.txt").is_file() and not os.environ.get("CI"),
    reason=f"tiny-shakespeare not found under {DATA} (set QKV_DATA_DIR)",
)
PROTEOMES = [DATA / "refseq_proteomes" / n for n in ("mgenitalium_proteins.faa", "baphidicola_proteins.faa")]


@pytest.fixture(autouse=True)
def data_dir(monkeypatch):
    monkeypatch.setenv("QKV_DATA_DIR", str(DATA))


@pytest.fixture
def small_chunks(monkeypatch):
    """64 KB chunks: tiny-shakespeare is read in 18 of them, as a large corpus would be."""
    monkeypatch.setattr(prepare, "CHUNK_BYTES", 1 << 16)


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_windows_read_across_shard_boundaries(tmp_path):
    stream = np.arange(1000) % 251
    writer = SplitWriter(tmp_path, vocab_size=251, shard_tokens=97)
    writer.add(stream[:500])
    writer.add(stream[500:], new_sequence=False)
    writer.flush()
    assert [s[0] for s in writer.shards] == [97] * 10 + [30]
    split = Split(tmp_path, np.dtype(np.uint8), tuple(tuple(s) for s in writer.shards))
    offsets = torch.tensor([0, 90, 96, 97, 500, 935])  # inside one shard, across one or two boundaries
    x, y = windows_at(split, offsets, 64)
    ref_x, ref_y = windows_at(torch.from_numpy(stream), offsets, 64)
    assert torch.equal(x, ref_x) and torch.equal(y, ref_y)


@needs_data
def test_prepared_text_trains_bit_identically_to_the_text_in_memory(tmp_path, small_chunks):
    meta = prepare.prepare_lm(["tinyshakespeare"], tmp_path / "data", shard_tokens=200_000)
    assert len(meta["splits"]["train"]) == 6 and meta["dtype"] == "uint8"  # windows cross shards
    text = load_corpus("tinyshakespeare")
    train_text, val_text = split_train_val(text)
    tok = CharTokenizer.train(text)
    data = PreparedData.open(tmp_path / "data", "lm")
    assert load_tokenizer(data.tokenizer_path).chars == tok.chars
    assert np.array_equal(data.train.window(0, len(data.train)), tok.encode(train_text))
    assert np.array_equal(data.val.window(0, len(data.val)), tok.encode(val_text))
    settings = [
        "model.d_model=32",
        "model.n_heads=2",
        "model.d_ff=64",
        "model.n_layers=2",
        "model.max_len=32",
        "model.dropout=0.1",
        "batch_size=8",
        "num_samples=1",
        "sample_tokens=8",
        "train.max_steps=30",
        "train.eval_every=15",
        "train.precision=fp32",
        "train.warmup_steps=5",
    ]
    runs = {}
    for name, extra in (("text", []), ("shards", [f"data={tmp_path / 'data'}"])):
        recipe = resolve(LMSettings, None, settings + extra)
        runs[name] = LMRun.train(recipe, tmp_path / name, progress=False)
    assert runs["text"]["validation"] == runs["shards"]["validation"]
    a, b = (tmp_path / n / "model.safetensors" for n in ("text", "shards"))
    assert a.read_bytes() == b.read_bytes()
    record = json.loads((tmp_path / "shards" / "data.json").read_text())
    assert record["tokens"] == {"train": len(tok.encode(train_text)), "val": len(tok.encode(val_text))}
    prepare.prepare_lm(["tinyshakespeare"], tmp_path / "again", shard_tokens=300_000)
    recipe = resolve(LMSettings, None, [*settings, f"data={tmp_path / 'again'}", "train.max_steps=40"])
    with pytest.raises(QkvError, match="not the data this run started on"):
        LMRun.train(recipe, tmp_path / "shards", resume=True, progress=False)


def test_text_is_read_in_chunks_as_python_reads_it_whole(tmp_path, monkeypatch):
    monkeypatch.setattr(prepare, "CHUNK_BYTES", 64)
    path = tmp_path / "crlf.txt"
    text = "".join(f"Zeile {i}: grüß dich\r\n  eingerückt\r\n\r\n" for i in range(40))
    path.write_bytes(text.encode("utf-8"))
    chunks = [chunk for _, chunk in prepare.text_chunks(path)]
    assert len(chunks) > 10 and "".join(chunks) == path.read_text(encoding="utf-8")
    assert all(c.endswith("\n") and not c[0].isspace() for c in chunks)  # cut before a line's text
    meta = prepare.prepare_lm([str(path)], tmp_path / "data", val_fraction=0.25)
    train_text, val_text = split_train_val(path.read_text(encoding="utf-8"), 0.25)
    tok = CharTokenizer.train(train_text + val_text)
    data = PreparedData.open(tmp_path / "data", "lm")
    assert np.array_equal(data.train.window(0, len(data.train)), tok.encode(train_text))
    assert np.array_equal(data.val.window(0, len(data.val)), tok.encode(val_text))
    assert meta["chars"] == {"train": len(train_text), "val": len(val_text)}


@needs_data
def test_bpe_shards_hold_the_ids_of_the_whole_text_and_the_sample_is_recorded(tmp_path, small_chunks):
    meta = prepare.prepare_lm(["tinyshakespeare"], tmp_path / "all", tokenizer="bpe", vocab_size=600)
    train_text, val_text = split_train_val(load_corpus("tinyshakespeare"))
    tok = SubwordTokenizer.train(train_text.split("\n\n"), 600, byte_level=True)
    data = PreparedData.open(tmp_path / "all", "lm")
    assert np.array_equal(data.train.window(0, len(data.train)), tok.encode(train_text))
    assert np.array_equal(data.val.window(0, len(data.val)), tok.encode(val_text))
    assert meta["bpe_sample"]["fraction"] == 1.0 and meta["dtype"] == "uint16"
    sampled = prepare.prepare_lm(
        ["tinyshakespeare"], tmp_path / "s", tokenizer="bpe", vocab_size=600, bpe_sample_chars=100_000, seed=7
    )["bpe_sample"]
    assert sampled["seed"] == 7 and abs(sampled["fraction"] - 100_000 / len(train_text)) < 1e-9
    assert 50_000 < sampled["chars"] < 150_000  # about the size asked for


@needs_data
@pytest.mark.parametrize("kind", ["lm", "lm-bpe", "protein-mlm"])
def test_an_interrupted_preparation_resumes_to_the_same_files(tmp_path, small_chunks, monkeypatch, kind):
    def run(out):
        if kind == "lm":
            return prepare.prepare_lm(["tinyshakespeare"], out, shard_tokens=150_000)
        if kind == "lm-bpe":  # resumed with the merges learnt before the interruption
            return prepare.prepare_lm(
                ["tinyshakespeare"], out, tokenizer="bpe", vocab_size=400, shard_tokens=60_000
            )
        return prepare.prepare_protein_mlm([str(p) for p in PROTEOMES], out, shard_tokens=60_000)

    run(tmp_path / "whole")
    flush, calls = SplitWriter.flush, []

    def interrupted(self):
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt
        flush(self)

    monkeypatch.setattr(SplitWriter, "flush", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "resumed")
    assert (tmp_path / "resumed" / "progress.json").is_file()
    with pytest.raises(Exception, match="did not finish; run the same qkv prepare command again"):
        PreparedData.open(tmp_path / "resumed", kind.removesuffix("-bpe"))
    monkeypatch.setattr(SplitWriter, "flush", flush)
    run(tmp_path / "resumed")
    assert _files(tmp_path / "resumed").keys() == _files(tmp_path / "whole").keys()
    for name, content in _files(tmp_path / "whole").items():
        if name != "meta.json":  # holds the paths
            assert _files(tmp_path / "resumed")[name] == content, name


@needs_data
def test_protein_shards_hold_out_by_id_drop_duplicates_and_batch_within_the_budget(tmp_path):
    fasta = tmp_path / "dup.fasta"
    fasta.write_text(">a1\nMKTAYIAKQR\n>a2\nmktayiakqr*\n>bad\nMK-TA\n>b1\nMSSHHHHHHL\n")
    meta = prepare.prepare_protein_mlm(
        [str(p) for p in PROTEOMES] + [str(fasta)], tmp_path / "p", shard_tokens=50_000
    )
    assert meta["records"]["duplicates"] == 1 and meta["records"]["skipped"] == 1
    data = PreparedData.open(tmp_path / "p", "protein-mlm")
    train = {data.train.sequence(i).tobytes() for i in range(data.train.num_sequences)}
    val = [data.val.sequence(i).tobytes() for i in range(data.val.num_sequences)]
    assert val and not train & set(val)  # no held-out protein verbatim in training
    from Bio.SeqIO.FastaIO import SimpleFastaParser

    with open(PROTEOMES[0]) as handle:
        ids = [t.split()[0] for t, _ in SimpleFastaParser(handle)]
    assert sum(held_out(i, 0.02) for i in ids) <= len(val)
    for shard in range(len(data.train.shards)):
        lengths = np.diff(data.train.shard_starts(shard, 0, data.train.shards[shard][1] + 1))
        assert (np.diff(lengths) >= 0).all()  # sorted by length: neighbours bucket well
    batches = ShardBatches(data.train, width=126, max_tokens=2048, seed=5)
    assert len(batches) == -(-len(data.train) // 2048)
    for i in range(40):
        rows = batches[i]
        assert rows == batches[i]  # made again identically (resume, every process)
        assert len(rows) * (max(map(len, rows)) + 2) <= 2048 and max(map(len, rows)) <= 126
        assert all(bytes(r) in b"".join(train) for r in rows[:2])
    assert batches[0] != ShardBatches(data.train, 126, 2048, seed=6)[0]


@needs_data
def test_bad_data_is_refused_in_one_line_before_anything_is_written(tmp_path, capsys, small_chunks):
    def refused(*args: str, needle: str) -> None:
        capsys.readouterr()
        assert main([*args, "--quiet"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and len(err.strip().splitlines()) == 1 and needle in err, err

    data = tmp_path / "data"
    prepare.prepare_lm(["tinyshakespeare"], data, shard_tokens=200_000)
    refused("prepare", "lm", "tinyshakespeare", "--out", str(data), needle="already prepared")
    refused(
        "prepare", "lm", str(tmp_path / "missing.txt"), "--out", str(tmp_path / "x"), needle="missing.txt"
    )
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    refused("prepare", "lm", "tinyshakespeare", "--out", str(tmp_path / "busy"), needle="not empty")
    assert os.listdir(tmp_path / "busy") == ["notes.txt"]
    latin = tmp_path / "latin1.txt"
    latin.write_bytes(b"caf\xe9\n" * 10)
    refused("prepare", "lm", str(latin), "--out", str(tmp_path / "l"), needle="not UTF-8 text (byte 3)")
    refused("prepare", "protein-mlm", str(latin), "--out", str(tmp_path / "f"), needle="latin1.txt")
    assert not (tmp_path / "l").exists() and not (tmp_path / "f").exists()
    run = str(tmp_path / "run")
    refused(
        "train", "lm", "--out", run, f"data={data}", "corpus=other.txt", needle="leave out corpus='other.txt'"
    )
    refused("train", "protein-mlm", "--out", run, f"data={data}", needle="prepared for lm, not protein-mlm")
    refused("train", "lm", "--out", run, f"data={tmp_path}", needle="not a prepared data directory")
    shard = data / "train" / "tokens-00002.bin"
    shard.write_bytes(shard.read_bytes()[:-10])
    refused(
        "train",
        "lm",
        "--out",
        run,
        f"data={data}",
        needle="tokens-00002.bin is 199,990 bytes, expected 200,000",
    )
    assert not Path(run).exists()
