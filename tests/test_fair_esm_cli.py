"""fair-esm checkpoints from the command line: a random ``esm.model.esm2.ESM2`` saved as torch
hub saves ESM-2 (``{"model": ..., "cfg": {"model": Namespace}}`` with fairseq's
``encoder.sentence_encoder.`` prefix, ``<name>-contact-regression.pt`` beside it) is taken by
``convert``, ``embed``, ``score-variants`` and ``contacts`` as a ``.pt`` path and, through
``TORCH_HOME``, by ESM's own model name; each matches fair-esm's own code to 1e-5. ESM-2's
windows: 1,022 residues between ``<cls>`` and ``<eos>``, as it was trained."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from test_fair_esm import random_esm2

from qkv import cli, runs
from qkv.inference.embed import windows

esm = pytest.importorskip("esm")

WT = "MKTAYIAKQRQISFVKSHFSRQLEERLGLIEVQAPILSRVGD"  # 42 residues
SEQS = {"p1": WT, "p2": "GSHMSLFDFFKNKGSAAATLSDKASQVVEG"}
NAME = "esm2_t6_8M_UR50D"  # an ESM-2 name; the file behind it here is the random model


@pytest.fixture(scope="module")
def fair(tmp_path_factory):
    """fair-esm's random ESM2 (2 layers, 64 dims, 4 heads, a random contact regression), its
    alphabet, and its torch hub checkpoint ``.pt`` with the regression file beside it."""
    model, alphabet = random_esm2(seed=3)
    with torch.no_grad():
        model.contact_head.regression.weight.normal_(0.0, 100.0)  # features are ~1/L
    state = model.state_dict()
    regression = {k: v for k, v in state.items() if k.startswith("contact_head.")}
    body = {f"encoder.sentence_encoder.{k}": v for k, v in state.items() if k not in regression}
    cfg = argparse.Namespace(
        encoder_layers=2, encoder_embed_dim=64, encoder_attention_heads=4, token_dropout=True
    )
    folder = tmp_path_factory.mktemp("torch_home") / "hub" / "checkpoints"
    folder.mkdir(parents=True)
    path = folder / f"{NAME}.pt"
    torch.save({"model": body, "cfg": {"model": cfg}}, path)
    torch.save({"model": regression}, folder / f"{NAME}-contact-regression.pt")
    return model, alphabet, path


@pytest.fixture
def run_cli(capsys):
    def run(*args) -> tuple[int, str, str]:
        capsys.readouterr()
        status = cli.main([str(a) for a in args])
        out, err = capsys.readouterr()
        return status, out, err

    return run


@pytest.fixture
def fasta(tmp_path) -> Path:
    path = tmp_path / "seqs.fasta"
    path.write_text("".join(f">{k}\n{v}\n" for k, v in SEQS.items()))
    return path


def tokens_of(alphabet, seq: str) -> torch.Tensor:
    return alphabet.get_batch_converter()([("x", seq)])[2]


def test_convert_writes_a_run_and_an_hf_folder_from_the_pt(fair, run_cli, tmp_path):
    model, alphabet, path = fair
    status, _, err = run_cli("convert", "hf", path, tmp_path / "run")
    assert status == 0, err
    ours, _ = runs.load_run(tmp_path / "run")
    tokens = tokens_of(alphabet, WT)
    with torch.no_grad():
        ref = model(tokens)["logits"]
        assert (ours(tokens).logits - ref).abs().max() <= 1e-5
    assert json.loads((tmp_path / "run" / "hf.json").read_text())["source"] == str(path.resolve())
    # an HF folder straight from the .pt, which transformers reads
    transformers = pytest.importorskip("transformers")
    status, _, err = run_cli("convert", "--to", "hf", path, tmp_path / "hf")
    assert status == 0, err
    hf = transformers.EsmForMaskedLM.from_pretrained(tmp_path / "hf").eval()
    with torch.no_grad():
        assert (hf(tokens).logits - ref).abs().max() <= 1e-5
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["max_position_embeddings"] == 1026


def test_embed_takes_esms_layer_spelling_and_matches_repr_layers(fair, run_cli, fasta, tmp_path):
    model, alphabet, path = fair
    status, _, err = run_cli(
        "embed", path, fasta, "--out", tmp_path / "e", "--layers", "0", "1", "-1", "--quiet"
    )
    assert status == 0, err
    got = load_file(tmp_path / "e" / "shard-00000.safetensors")
    for i, seq in enumerate(SEQS.values()):
        with torch.no_grad():
            reps = model(tokens_of(alphabet, seq), repr_layers=[0, 1, 2])["representations"]
        for ours, theirs in (("layer0", 0), ("layer1", 1), ("layer2", 2)):
            ref = reps[theirs][0, 1 : len(seq) + 1].mean(0)  # extract.py's mean over the residues
            assert (got[f"mean/{ours}"][i] - ref).abs().max() <= 1e-5
    # the comma form gives the same bytes
    status, _, err = run_cli("embed", path, fasta, "--out", tmp_path / "c", "--layers", "0,1,-1", "--quiet")
    assert status == 0, err
    assert load_file(tmp_path / "c" / "shard-00000.safetensors").keys() == got.keys()


def test_score_variants_matches_predict_py(fair, run_cli, tmp_path):
    model, alphabet, path = fair
    (tmp_path / "m.csv").write_text("mutant\nK2W\nQ9P:S13C\n")
    status, out, err = run_cli("score-variants", path, "--wt", WT, "--mutations", tmp_path / "m.csv")
    assert status == 0, err
    expected = []
    for row in ("K2W", "Q9P:S13C"):  # predict.py's masked marginals, on fair-esm's model
        score = 0.0
        for mutation in row.split(":"):
            wt, idx, mt = mutation[0], int(mutation[1:-1]), mutation[-1]
            tokens = tokens_of(alphabet, WT)
            tokens[0, idx] = alphabet.mask_idx
            with torch.no_grad():
                lp = torch.log_softmax(model(tokens)["logits"][0, idx], dim=-1)
            score += float(lp[alphabet.get_idx(mt)] - lp[alphabet.get_idx(wt)])
        expected.append(score)
    got = [float(line.split("\t")[-1]) for line in out.splitlines()[1:]]
    assert np.abs(np.array(got) - expected).max() <= 1e-5


def test_contacts_use_the_checkpoints_own_regression(fair, run_cli, fasta, tmp_path):
    model, alphabet, path = fair
    status, _, err = run_cli("contacts", path, fasta, "--out", tmp_path / "c.safetensors", "--device", "cpu")
    assert status == 0, err
    got = load_file(tmp_path / "c.safetensors")
    for k, seq in SEQS.items():
        with torch.no_grad():
            ref = model.predict_contacts(tokens_of(alphabet, seq))[0]
        assert (got[k] - ref).abs().max() <= 1e-5 and ref.std() > 0.05


def test_esm_names_are_read_from_torch_hub_s_cache(fair, run_cli, tmp_path, monkeypatch):
    model, alphabet, path = fair
    monkeypatch.setenv("TORCH_HOME", str(path.parents[2]))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    status, _, err = run_cli("convert", "hf", NAME, tmp_path / "run")
    assert status == 0, err
    assert json.loads((tmp_path / "run" / "hf.json").read_text())["source"] == NAME
    ours, _ = runs.load_run(tmp_path / "run")
    tokens = tokens_of(alphabet, WT)
    with torch.no_grad():
        assert (ours(tokens).logits - model(tokens)["logits"]).abs().max() <= 1e-5
    # not cached: the HF Hub's facebook/<name>, which offline is one line
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "empty"))
    status, _, err = run_cli("convert", "hf", "esm2_t12_35M_UR50D", tmp_path / "other")
    assert status == 2 and err.count("\n") == 1 and "facebook/esm2_t12_35M_UR50D" in err, err
    # an unknown ESM name: one line, exit 2, nothing written
    for verb in (
        ("convert", "hf", "esm2_t7_1M_UR50D", tmp_path / "new"),
        ("embed", "esm2_t7_1M_UR50D", tmp_path / "x.fasta", "--out", tmp_path / "new"),
    ):
        status, out, err = run_cli(*verb)
        assert status == 2 and err.count("\n") == 1 and "unknown ESM model 'esm2_t7_1M_UR50D'" in err, err
        assert not (tmp_path / "new").exists() and not (tmp_path / "other").exists()


def test_esm2_windows_are_1022_residues_as_it_was_trained(fair, run_cli, tmp_path):
    """A chain of 1,023 residues is one residue past ESM-2's 1,022: two windows, each residue's
    vector from the window it is most central in, equal to fair-esm run on those windows by
    hand. 1,022 residues are one window."""
    model, alphabet, path = fair
    assert windows(1022, 1022) == [(0, 1022, 0, 1022)]
    assert windows(1023, 1022) == [(0, 1022, 0, 512), (1, 1023, 512, 1023)]
    rng = np.random.default_rng(0)
    chain = "".join(rng.choice(list("ACDEFGHIKLMNPQRSTVWY"), 1023))
    (tmp_path / "long.fasta").write_text(f">long\n{chain}\n")
    status, _, err = run_cli(
        "embed", path, tmp_path / "long.fasta", "--out", tmp_path / "e", "--per-residue", "--quiet"
    )
    assert status == 0, err
    manifest = json.loads((tmp_path / "e" / "manifest.json").read_text())
    assert manifest["settings"]["windows"]["width"] == 1022
    got = load_file(tmp_path / "e" / "shard-00000.safetensors")["residues/layer2/long"]
    assert got.shape == (1023, 64)
    by_hand = torch.empty(1023, 64)
    for start, stop, own in ((0, 1022, slice(0, 512)), (1, 1023, slice(512, 1023))):
        with torch.no_grad():
            reps = model(tokens_of(alphabet, chain[start:stop]), repr_layers=[2])["representations"][2]
        by_hand[own] = reps[0, 1 + own.start - start : 1 + own.stop - start]
    assert (got - by_hand).abs().max() <= 1e-5
