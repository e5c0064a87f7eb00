"""Protein embeddings at scale (qkv.inference.embed, ``qkv embed``): overlapping windows that
leave no seam, layer selection, batching that does not change results, shards with ids in input
order, byte-identical resume after a kill, and refusals that write nothing."""

from __future__ import annotations

import json
import random
from io import BytesIO
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open

from qkv.cli import main
from qkv.data.protein import record_id
from qkv.data.tokenizers import AminoAcidTokenizer
from qkv.errors import QkvError
from qkv.files import save_weights, write_json
from qkv.inference.embed import (
    MANIFEST,
    Embedder,
    EmbedJob,
    encode_layers,
    model_sha256,
    read_embeddings,
    resolve_layers,
    windows,
)
from qkv.inference.protein import ProteinEncoder
from qkv.models.config import EncoderConfig
from qkv.models.encoder import EncoderModel

TOK = AminoAcidTokenizer()
WIDTH = 16  # residues per window of the tiny models (max_len 18)
TOL = 1e-5  # float32 results of the same rows in differently shaped batches
AFRESH = "give another --out (or remove it) to start afresh"


def _model(max_len: int = WIDTH + 2, n_layers: int = 2, seed: int = 0, d_model: int = 16) -> EncoderModel:
    """A random rotary encoder: its weights fit any max_len (rotary tables are not weights)."""
    torch.manual_seed(seed)
    cfg = EncoderConfig(
        vocab_size=TOK.vocab_size,
        d_model=d_model,
        n_heads=2,
        d_ff=2 * d_model,
        n_layers=n_layers,
        max_len=max_len,
        pad_id=TOK.pad_id,
        dropout=0.0,
    )
    return EncoderModel(cfg).eval()


def _encoder(model: EncoderModel | None = None, max_tokens: int = 16384) -> ProteinEncoder:
    return ProteinEncoder(model or _model(), (), "mlm", max_tokens=max_tokens)


def _sequences(n: int, seed: int = 0, longest: int = 50) -> list[str]:
    rng = random.Random(seed)
    return [
        "".join(rng.choice("ACDEFGHIKLMNPQRSTVWY") for _ in range(rng.randint(1, longest))) for _ in range(n)
    ]


@pytest.fixture
def run_dir(tmp_path) -> Path:
    """A protein-mlm run directory holding :func:`_model`."""
    run = tmp_path / "run"
    model = _model()
    save_weights(model, run / "model.safetensors")
    write_json(run / "config.json", model.config.to_dict())
    write_json(run / "train_config.json", {"recipe": "protein-mlm"})
    TOK.save(run / "tokenizer.json")
    return run


def _protein(length: int, seed: int) -> str:
    rng = random.Random(seed)
    return "".join(rng.choice("ACDEFGHIKLMNPQRSTVWY") for _ in range(length))


def _fasta(path: Path, seqs: list[str], ids: list[str] | None = None) -> Path:
    ids = ids or [f"p{i}" for i in range(len(seqs))]
    path.write_text("".join(f">{i} a protein\n{s}\n" for i, s in zip(ids, seqs, strict=True)))
    return path


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


# windows


@pytest.mark.parametrize("width", [1, 2, 5, 16, 17])
def test_windows_partition_the_chain_with_a_quarter_width_of_context(width):
    for length in range(1, 6 * width + 3):
        ws = windows(length, width)
        assert ws[0].own_start == 0 and ws[-1].own_stop == length
        assert all(a.own_stop == b.own_start for a, b in zip(ws, ws[1:], strict=False))
        for w in ws:
            assert 0 <= w.start <= w.own_start < w.own_stop <= w.stop <= length
            assert w.stop - w.start == min(width, length)
            # an owned residue is never nearer a cut edge than a quarter width (chain ends are no cut)
            left = w.own_start - w.start if w.start > 0 else width
            right = w.stop - w.own_stop if w.stop < length else width
            assert min(left, right) >= width // 4, (length, w)
    assert windows(16, 16) == [(0, 16, 0, 16)]
    assert windows(17, 16) == [(0, 16, 0, 9), (1, 17, 9, 17)]


@torch.no_grad()
def test_a_sequence_that_fits_one_window_is_exactly_its_direct_encoding():
    model = _model()
    seq = _protein(WIDTH, seed=3)  # exactly one full window
    _, residues = _encoder(model).embed([seq], per_residue=True)
    hidden = model.encode(torch.tensor([TOK.encode(seq)]))[0][0, 1:-1]
    assert torch.equal(torch.from_numpy(residues[0]), hidden)


def _local_model(max_len: int) -> EncoderModel:
    """An encoder whose residues attend almost only to neighbours within a few positions:
    queries and keys are one constant vector in the rotary planes of frequencies 1, 0.32 and 0.1
    (d_k 16),
    so the attention logit falls off with the distance |m - n| alone. The same weights at any
    max_len give the long-context reference."""
    model = _model(max_len, d_model=32)
    inner, d_k = 32, 16
    u = torch.zeros(d_k)
    u[:3] = u[d_k // 2 : d_k // 2 + 3] = 4.0
    with torch.no_grad():
        for layer in model.layers:
            w = layer.self_attn.w_qkv  # rows: queries, keys, values, each (heads, d_k)
            w.weight[: 2 * inner] = 0
            w.bias[: 2 * inner] = u.repeat(2 * inner // d_k)
    return model


@torch.no_grad()
def test_window_handover_leaves_no_seam_against_a_long_context_run():
    """Each residue comes from the window it is most central in, so with context that matters
    only nearby, the windows join into the long-context result everywhere, the handover residues
    included; consecutive windows cut at their edges (the contrast) do not."""
    seq = _protein(45, seed=5)  # windows start at 0, 8, 16, 24, 29: four handovers
    short, long = _local_model(WIDTH + 2), _local_model(64)
    full = long.encode(torch.tensor([TOK.encode(seq)]))[0][0, 1:-1]  # (45, D)
    _, residues = _encoder(short).embed([seq], per_residue=True)
    error = (torch.from_numpy(residues[0]) - full).norm(dim=-1)
    assert error.max() < 1e-3, error
    cut = torch.cat(
        [
            short.encode(torch.tensor([TOK.encode(seq[s : s + WIDTH])]))[0][0, 1:-1]
            for s in range(0, 45, WIDTH)
        ]
    )
    cut_error = (cut - full).norm(dim=-1)
    assert cut_error[[WIDTH - 1, WIDTH, 2 * WIDTH - 1, 2 * WIDTH]].min() > 1e-2  # the seams it shows


# layers


@torch.no_grad()
def test_layers_are_esm_repr_layers_read_by_hooks():
    model = _model(n_layers=3)
    tokens = torch.tensor([TOK.encode("MKTAYIAKQR"), TOK.encode("ACDE") + [TOK.pad_id] * 6])
    states = encode_layers(model, tokens, [0, 1, 2, 3])
    hidden, mask, _ = model.encode(tokens)
    assert torch.equal(states[3], hidden)  # the last = after the final norm
    torch.testing.assert_close(states[0], model.embed_tokens(tokens, mask), rtol=0, atol=0)
    x = states[0]
    for k, layer in enumerate(model.layers[:2], 1):
        x, _ = layer(x, mask[:, None, None, :])
        torch.testing.assert_close(states[k][mask], x[mask], rtol=0, atol=0)  # padding aside
    assert not model.layers[0]._forward_pre_hooks and not model.layers[1]._forward_hooks  # removed
    assert resolve_layers([-1], 3) == (3,) and resolve_layers([0, -4, 2, 2], 3) == (0, 2)
    assert resolve_layers("all", 3) == (0, 1, 2, 3)
    for bad in ([4], [-5]):
        with pytest.raises(QkvError, match=f"layer {bad[0]} does not exist: this model has 3 layers"):
            resolve_layers(bad, 3)


def test_batching_and_sorting_do_not_change_results_and_the_mean_is_the_residues_mean():
    seqs = _sequences(12, seed=1)
    ids = [f"s{i}" for i in range(12)]
    embedder = Embedder(_encoder(), "all", per_residue=True, max_tokens=10_000)
    together = embedder.embed(seqs, ids)
    small = Embedder(_encoder(), "all", per_residue=True, max_tokens=40).embed(seqs, ids)  # row by row
    alone = [embedder.embed([s], [i]) for s, i in zip(seqs, ids, strict=True)]
    assert together.keys() == small.keys()
    for name in together:
        torch.testing.assert_close(together[name], small[name], rtol=0, atol=TOL)
    for j, (sid, part) in enumerate(zip(ids, alone, strict=True)):
        for k in (0, 1, 2):
            torch.testing.assert_close(
                together[f"mean/layer{k}"][j], part[f"mean/layer{k}"][0], rtol=0, atol=TOL
            )
            residues = together[f"residues/layer{k}/{sid}"]
            assert residues.shape == (len(seqs[j]), 16)
            torch.testing.assert_close(together[f"mean/layer{k}"][j], residues.mean(0), rtol=0, atol=1e-6)


# the directory of shards


def test_cli_writes_shards_in_input_order_with_ids_and_read_embeddings_reads_them(tmp_path, run_dir, capsys):
    seqs = _sequences(7, seed=2)
    fasta = _fasta(tmp_path / "in.fasta", seqs)
    out = tmp_path / "emb"
    args = ["embed", str(run_dir), str(fasta), "--out", str(out), "--shard-size", "3", "--layers", "0,-1"]
    assert main([*args, "--per-residue", "--max-tokens", "64", "--quiet"]) == 0
    assert sorted(p.name for p in out.iterdir()) == [
        MANIFEST,
        *(f"shard-0000{i}.safetensors" for i in range(3)),
    ]
    with safe_open(str(out / "shard-00001.safetensors"), "pt") as f:
        assert json.loads(f.metadata()["ids"]) == ["p3 a protein", "p4 a protein", "p5 a protein"]
        assert f.get_tensor("mean/layer0").shape == (3, 16) and f.get_tensor("mean/layer2").shape == (3, 16)
        assert f.get_tensor("residues/layer2/p4 a protein").shape == (len(seqs[4]), 16)
        assert len(f.keys()) == 2 + 2 * 3
    ids, means = read_embeddings(out)
    assert (
        ids == [f"p{i} a protein" for i in range(7)] and means.shape == (7, 16) and means.dtype == np.float32
    )
    direct, _ = _encoder(ProteinEncoder.from_run(run_dir).model).embed(seqs)
    np.testing.assert_allclose(means, direct, rtol=0, atol=TOL)
    assert read_embeddings(out, layer=0)[1].shape == (7, 16)
    with pytest.raises(QkvError, match=r"holds layers \[0, 2\], not layer 1"):
        read_embeddings(out, layer=1)
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["complete"] and manifest["settings"]["layers"] == [0, 2]
    assert manifest["settings"]["windows"] == {"width": WIDTH, "stride": WIDTH // 2, "rule": "centre-most"}
    # the same command again: nothing to do, nothing rewritten
    before = _files(out)
    assert main([*args, "--per-residue", "--max-tokens", "64", "--quiet"]) == 0
    assert _files(out) == before


class Killed(BaseException):
    """What the simulated SIGKILL raises (not an Exception: nothing may catch it)."""


def test_a_killed_run_resumes_to_byte_identical_shards(tmp_path, monkeypatch):
    seqs = _sequences(20, seed=4)
    fasta = _fasta(tmp_path / "in.fasta", seqs)
    embedder = Embedder(_encoder(max_tokens=120), [1, 2], per_residue=True)
    EmbedJob.open(embedder, fasta, tmp_path / "whole", shard_size=6).run()

    calls = []

    def kill_in_shard_two(done: int) -> None:
        calls.append(done)
        if sum(calls) > 14:  # shards 0 and 1 (12 sequences) are written, shard 2 is half done
            raise Killed

    with pytest.raises(Killed):
        EmbedJob.open(embedder, fasta, tmp_path / "resumed", shard_size=6).run(kill_in_shard_two)
    written = _files(tmp_path / "resumed")
    assert set(written) == {MANIFEST, "shard-00000.safetensors", "shard-00001.safetensors"}
    embedded: list[list[str]] = []
    real = Embedder.embed
    monkeypatch.setattr(
        Embedder, "embed", lambda self, s, ids, p=None: embedded.append(ids) or real(self, s, ids, p)
    )
    job = EmbedJob.open(embedder, fasta, tmp_path / "resumed", shard_size=6)
    assert (job.total, job.done) == (20, 12)
    job.run()
    assert embedded == [[f"p{i} a protein" for i in range(12, 18)], ["p18 a protein", "p19 a protein"]]
    assert _files(tmp_path / "resumed") == _files(tmp_path / "whole")
    # a listed shard cut to half its bytes (a full disk, a copy stopped midway): it and the
    # shards after it are embedded again, to the same bytes
    shard = tmp_path / "resumed" / "shard-00001.safetensors"
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    embedded.clear()
    EmbedJob.open(embedder, fasta, tmp_path / "resumed", shard_size=6).run()
    assert [ids[0].split()[0] for ids in embedded] == ["p6", "p12", "p18"]
    assert _files(tmp_path / "resumed") == _files(tmp_path / "whole")


def test_another_model_input_or_setting_is_refused_in_one_line_with_nothing_written(
    tmp_path, run_dir, capsys
):
    fasta = _fasta(tmp_path / "in.fasta", _sequences(5))
    out = tmp_path / "emb"
    assert main(["embed", str(run_dir), str(fasta), "--out", str(out), "--quiet"]) == 0
    before = _files(out)
    capsys.readouterr()
    other = _fasta(tmp_path / "other.fasta", _sequences(5, seed=9))
    for argv, differ in [
        ([str(run_dir), str(fasta), "--layers", "all"], "layers"),
        ([str(run_dir), str(other)], "input_sha256"),
        ([str(run_dir), str(fasta), "--max-tokens", "100"], "max_tokens"),
    ]:
        assert main(["embed", *argv, "--out", str(out), "--quiet"]) == 2
        err = capsys.readouterr().err
        assert err == f"error: {out} holds embeddings made with another {differ}; {AFRESH}\n"
        assert _files(out) == before
    save_weights(_model(seed=1), run_dir / "model.safetensors")
    assert main(["embed", str(run_dir), str(fasta), "--out", str(out), "--quiet"]) == 2
    assert "another model_sha256;" in capsys.readouterr().err and _files(out) == before
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    assert main(["embed", str(run_dir), str(fasta), "--out", str(busy), "--quiet"]) == 2
    assert (
        capsys.readouterr().err
        == f"error: {busy} is not empty and holds no {MANIFEST}; give a new or empty directory\n"
    )
    assert _files(busy) == {"notes.txt": b"mine"}


def test_the_model_digest_covers_the_encoder_weights_only():
    """Heads a checkpoint lacks are randomly initialised at each load: they must not make a
    resumed run look like another model's."""
    model, same = _model(), _model()
    with torch.no_grad():
        same.sequence_head.weight.normal_()
        same.mlm_transform[0].bias.normal_()
    assert model_sha256(same) == model_sha256(model)
    with torch.no_grad():
        same.layers[1].ffn.w_2.bias[0] += 1e-3
    assert model_sha256(same) != model_sha256(model)


@pytest.mark.parametrize(
    "records, message",
    [
        ("", "no FASTA records found"),
        (">a\nMKV\n>b\n\n", "record b has an empty sequence"),
        (
            ">a\nMKV\n" * 4 + ">z\nMK-V\n",
            "in.fasta: z: character '-' at position 3 is not an amino-acid code",
        ),
        (">a\nMKV\n>b\nMKV\n>a\nMKV\n", "duplicate record id 'a'"),
    ],
)
def test_bad_input_is_refused_before_anything_is_written(tmp_path, run_dir, capsys, records, message):
    fasta = tmp_path / "in.fasta"
    fasta.write_text(records)
    out = tmp_path / "emb"
    # the bad record comes after the first shard: the whole file is checked first
    assert main(["embed", str(run_dir), str(fasta), "--out", str(out), "--shard-size", "1", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1
    assert not out.exists()


def test_protein_options_and_a_file_out_are_refused_where_they_do_not_apply(tmp_path, run_dir, capsys):
    fasta = _fasta(tmp_path / "in.fasta", _sequences(2))
    out = tmp_path / "e.safetensors"
    assert main(["embed", str(run_dir), str(fasta), "--out", str(out)]) == 2
    assert "protein embeddings go into a directory" in capsys.readouterr().err
    text = tmp_path / "t.txt"
    text.write_text("a sentence\n")
    assert main(["embed", "--model", "minilm", str(text), "--out", str(out), "--per-residue"]) == 2
    assert (
        capsys.readouterr().err
        == "error: --per-residue applies to protein embeddings only (not with --model)\n"
    )
    assert main(["embed", str(run_dir), str(fasta), "--out", str(tmp_path / "d"), "--layers", "1,x"]) == 2
    assert "--layers 1,x: give layer numbers (e.g. 0 6 -1, or 0,6,-1)" in capsys.readouterr().err
    assert not out.exists() and not (tmp_path / "d").exists()


# reading per-residue tensors; ids are whole header lines


def test_read_embeddings_per_residue_gives_the_models_per_residue_output(tmp_path, run_dir):
    seqs = _sequences(7, seed=6, longest=40)  # some longer than a window: joined windows
    fasta = _fasta(tmp_path / "in.fasta", seqs)
    out = tmp_path / "emb"
    args = ["embed", str(run_dir), str(fasta), "--out", str(out), "--shard-size", "3", "--layers", "1,-1"]
    assert main([*args, "--per-residue", "--quiet"]) == 0
    ids, residues = read_embeddings(out, per_residue=True)
    assert ids == residues.ids == [f"p{i} a protein" for i in range(7)] and len(residues) == 7
    _, direct = _encoder(ProteinEncoder.from_run(run_dir).model).embed(seqs, per_residue=True)
    items = list(residues)
    for i, sid in enumerate(ids):
        for got in (items[i], residues[i], residues[sid], residues[i - 7]):
            assert got.dtype == np.float32 and got.shape == (len(seqs[i]), 16)
            np.testing.assert_allclose(got, direct[i], rtol=0, atol=TOL)
    layer1 = read_embeddings(out, layer=1, per_residue=True)[1]
    assert layer1.layer == 1 and not np.allclose(layer1[0], items[0])
    with pytest.raises(KeyError):
        residues["p0"]  # an id is the whole header
    with pytest.raises(IndexError):
        residues[7]
    means = read_embeddings(out)[1]  # the means as before, and the mean of the residues
    np.testing.assert_allclose(means, np.stack([r.mean(0) for r in items]), rtol=0, atol=1e-6)
    assert main([*args[:4], str(tmp_path / "means"), "--quiet"]) == 0
    with pytest.raises(QkvError, match="holds mean embeddings only: embed again with --per-residue"):
        read_embeddings(tmp_path / "means", per_residue=True)


def test_ids_are_whole_headers_and_a_directory_begun_with_first_words_goes_on_with_them(tmp_path):
    seqs = _sequences(6, seed=7)
    fasta = tmp_path / "in.fasta"
    headers = [f"sp|P{i}|X_HUMAN  Protein {i} OS=Homo sapiens" for i in range(6)]
    fasta.write_text("".join(f">{h} \n{s}\n" for h, s in zip(headers, seqs, strict=True)))
    embedder = Embedder(_encoder(), [-1], per_residue=True)
    EmbedJob.open(embedder, fasta, tmp_path / "new", shard_size=2).run()
    assert read_embeddings(tmp_path / "new")[0] == headers  # the line, as fair-esm's label
    # a directory of an older qkv (no "ids" in its manifest; ids cut at the first space), killed
    # after its first shard: the rest keeps the first words, so all its ids are of one kind
    old = tmp_path / "old"
    job = EmbedJob.open(embedder, fasta, old, shard_size=2)
    job.id_of = record_id

    def kill_after_the_first_shard(_: int) -> None:
        if job.done:
            raise Killed

    with pytest.raises(Killed):
        job.run(kill_after_the_first_shard)
    manifest = json.loads((old / MANIFEST).read_text())
    del manifest["ids"]
    write_json(old / MANIFEST, manifest)
    EmbedJob.open(embedder, fasta, old, shard_size=2).run()
    ids, residues = read_embeddings(old, per_residue=True)
    assert ids == [f"sp|P{i}|X_HUMAN" for i in range(6)] and residues[5].shape == (len(seqs[5]), 16)
    assert "ids" not in json.loads((old / MANIFEST).read_text())
    # a duplicate is a whole header: two records that share a first word are two sequences
    fasta.write_text(">a x\nMKV\n>a y\nMKV\n")
    EmbedJob.open(embedder, fasta, tmp_path / "two").run()
    assert read_embeddings(tmp_path / "two")[0] == ["a x", "a y"]


# fair-esm extract.py's files (their equality with extract.py's: tests/test_fair_esm_cli.py)


def test_esm_files_resume_as_extract_py_does_and_hold_what_include_asks(tmp_path, run_dir, capsys):
    seqs = _sequences(5, seed=8)
    fasta = _fasta(tmp_path / "in.fasta", seqs)
    out = tmp_path / "esm"
    args = ["embed", str(run_dir), str(fasta), "--out", str(out), "--format", "esm", "--shard-size", "2"]
    again = [*args, "--include", "mean", "bos", "--layers", "0", "-1", "--quiet"]
    assert main(again) == 0
    names = [f"p{i} a protein.pt" for i in range(5)]
    assert sorted(p.name for p in out.iterdir()) == sorted([MANIFEST, *names])
    assert max(map(len, seqs)) > WIDTH  # cut to their first WIDTH residues, as extract.py cuts them
    means = _encoder(ProteinEncoder.from_run(run_dir).model).embed([s[:WIDTH] for s in seqs])[0]
    for i, name in enumerate(names):
        saved = torch.load(out / name, weights_only=True)
        assert list(saved) == ["label", "mean_representations", "bos_representations"]
        assert saved["label"] == f"p{i} a protein" and list(saved["mean_representations"]) == [0, 2]
        mean = saved["mean_representations"][2]
        torch.testing.assert_close(mean, torch.from_numpy(means[i]), rtol=0, atol=TOL)
        assert saved["bos_representations"][2].shape == (16,)
    before = _files(out)
    assert main(again) == 0
    assert _files(out) == before  # all there: nothing rewritten
    (out / names[3]).unlink()  # a missing file: its chunk is embedded again, to the same values
    assert main(again) == 0
    assert _files(out).keys() == before.keys()
    for name in names[2:4]:
        rewritten, first = torch.load(out / name, weights_only=True), torch.load(BytesIO(before[name]))
        assert torch.equal(rewritten["mean_representations"][2], first["mean_representations"][2])
    capsys.readouterr()
    # another include is another job; --include belongs to --format esm; read_embeddings says how to read
    assert main([*args, "--include", "per_tok", "--layers", "0", "-1", "--quiet"]) == 2
    assert "holds embeddings made with another per_residue, include;" in capsys.readouterr().err
    assert main([*args[:4], str(tmp_path / "s"), "--include", "mean"]) == 2
    assert capsys.readouterr().err == (
        "error: --include goes with --format esm (the shards hold means, and --per-residue tensors)\n"
    )
    with pytest.raises(QkvError, match=r"holds fair-esm extract.py files: read each <label>.pt with torch"):
        read_embeddings(out)
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize(
    "header, message",
    [
        ("../escape", "record '../escape': its file ../escape.pt would not be inside the output folder"),
        ("/abs", "record '/abs': its file /abs.pt would not be inside the output folder"),
        ("a//b", "would not be inside the output folder"),
        ("x" * 300, "its file name is longer than 255 bytes"),
    ],
)
def test_a_label_that_names_no_file_inside_out_is_refused_before_anything_is_written(
    tmp_path, run_dir, capsys, header, message
):
    fasta = tmp_path / "in.fasta"
    fasta.write_text(f">ok\nMKV\n>{header}\nMKV\n")
    out = tmp_path / "esm"
    argv = ["embed", str(run_dir), str(fasta), "--out", str(out), "--format", "esm", "--shard-size", "1"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1
    assert not out.exists() and not (tmp_path / "escape.pt").exists()


def test_the_clis_include_choices_are_the_libraries():
    from qkv.cli import embed as cli_embed
    from qkv.inference import embed

    assert cli_embed.ESM_INCLUDE == embed.ESM_INCLUDE
