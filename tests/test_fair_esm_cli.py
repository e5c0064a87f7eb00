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
from cli_runs import refused, run_main
from safetensors.torch import load_file
from test_fair_esm import random_esm2

from qkv import cli, runs
from qkv.inference.embed import windows

esm = pytest.importorskip("esm")

WT = "MKTAYIAKQRQISFVKSHFSRQLEERLGLIEVQAPILSRVGD"  # 42 residues
SEQS = {"p1": WT, "p2": "GSHMSLFDFFKNKGSAAATLSDKASQVVEG"}
NAME = "esm2_t6_8M_UR50D"  # an ESM-2 name; the file behind it here is a random model of its sizes
LAYERS, DIM, HEADS = 6, 320, 20  # esm2_t6_8M_UR50D's (a file under its name must have them)


@pytest.fixture(scope="module")
def fair(tmp_path_factory):
    """fair-esm's random ESM2 (esm2_t6_8M_UR50D's sizes, a random contact regression), its
    alphabet, and its torch hub checkpoint ``.pt`` with the regression file beside it."""
    model, alphabet = random_esm2(seed=3, layers=LAYERS, dim=DIM, heads=HEADS)
    with torch.no_grad():
        model.contact_head.regression.weight.normal_(0.0, 100.0)  # features are ~1/L
    state = model.state_dict()
    regression = {k: v for k, v in state.items() if k.startswith("contact_head.")}
    body = {f"encoder.sentence_encoder.{k}": v for k, v in state.items() if k not in regression}
    cfg = argparse.Namespace(
        encoder_layers=LAYERS, encoder_embed_dim=DIM, encoder_attention_heads=HEADS, token_dropout=True
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
            reps = model(tokens_of(alphabet, seq), repr_layers=[0, 1, LAYERS])["representations"]
        for ours, theirs in (("layer0", 0), ("layer1", 1), (f"layer{LAYERS}", LAYERS)):
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
    got = load_file(tmp_path / "e" / "shard-00000.safetensors")[f"residues/layer{LAYERS}/long"]
    assert got.shape == (1023, DIM)
    by_hand = torch.empty(1023, DIM)
    for start, stop, own in ((0, 1022, slice(0, 512)), (1, 1023, slice(512, 1023))):
        with torch.no_grad():
            reps = model(tokens_of(alphabet, chain[start:stop]), repr_layers=[LAYERS])["representations"]
            reps = reps[LAYERS]
        by_hand[own] = reps[0, 1 + own.start - start : 1 + own.stop - start]
    assert (got - by_hand).abs().max() <= 1e-5


# fair-esm extract.py's files: `qkv embed --format esm`


def extract_py(model, alphabet, fasta: Path, repr_layers, include, truncation_seq_length: int = 1022) -> dict:
    """What fair-esm 2.0's ``scripts/extract.py`` saves, label → dict. The script is not in the
    installed package (facebookresearch/esm, scripts/extract.py, ``run``), so its lines are
    repeated here as they are, on the CPU, with torch.save left out: its dataset, batches,
    batch converter (truncating), layer numbering and the dict of each label."""
    dataset = esm.FastaBatchedDataset.from_file(fasta)
    batches = dataset.get_batch_indices(4096, extra_toks_per_seq=1)
    data_loader = torch.utils.data.DataLoader(
        dataset, collate_fn=alphabet.get_batch_converter(truncation_seq_length), batch_sampler=batches
    )
    return_contacts = "contacts" in include
    repr_layers = [(i + model.num_layers + 1) % (model.num_layers + 1) for i in repr_layers]
    saved = {}
    with torch.no_grad():
        for labels, strs, toks in data_loader:
            out = model(toks, repr_layers=repr_layers, return_contacts=return_contacts)
            representations = {layer: t.to(device="cpu") for layer, t in out["representations"].items()}
            if return_contacts:
                contacts = out["contacts"].to(device="cpu")
            for i, label in enumerate(labels):
                result = {"label": label}
                truncate_len = min(truncation_seq_length, len(strs[i]))
                if "per_tok" in include:
                    result["representations"] = {
                        layer: t[i, 1 : truncate_len + 1].clone() for layer, t in representations.items()
                    }
                if "mean" in include:
                    result["mean_representations"] = {
                        layer: t[i, 1 : truncate_len + 1].mean(0).clone()
                        for layer, t in representations.items()
                    }
                if "bos" in include:
                    result["bos_representations"] = {
                        layer: t[i, 0].clone() for layer, t in representations.items()
                    }
                if return_contacts:
                    result["contacts"] = contacts[i, :truncate_len, :truncate_len].clone()
                saved[label] = result
    return saved


def assert_same_files(out: Path, expected: dict) -> None:
    """Every label's ``out/<label>.pt`` (extract.py's path) holds what extract.py saves: the same
    keys in the same order, label, int layer keys, shapes, float32 values to 1e-5, each tensor
    its own storage; and nothing else is there but the manifest."""
    for label, theirs in expected.items():
        ours = torch.load(out / f"{label}.pt", weights_only=True)
        assert list(ours) == list(theirs) and ours["label"] == label
        for key in set(theirs) - {"label", "contacts"}:
            assert list(ours[key]) == list(theirs[key]) and all(type(k) is int for k in ours[key])
            for layer, ref in theirs[key].items():
                got = ours[key][layer]
                assert got.dtype == torch.float32 and got.shape == ref.shape, (key, layer)
                assert got.untyped_storage().nbytes() == got.numel() * 4  # not a view of a batch
                assert (got - ref).abs().max() <= 1e-5, (label, key, layer)
        if "contacts" in theirs:
            assert ours["contacts"].shape == theirs["contacts"].shape
            assert (ours["contacts"] - theirs["contacts"]).abs().max() <= 1e-5
            assert theirs["contacts"].std() > 0.05  # a map, not a constant
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert files == sorted(["manifest.json", *(f"{label}.pt" for label in expected)])


def test_embed_format_esm_writes_extract_pys_files(fair, run_cli, tmp_path):
    model, alphabet, path = fair
    fasta = tmp_path / "seqs.fasta"
    fasta.write_text(
        f">p1 first protein OS=Homo sapiens\n{WT}\n>sp|Q9|X/2-31 a slash\n{SEQS['p2']}\n"
        ">  spaced header  \nMKTAYIAKQRQISFVK\n"
    )
    include = ["per_tok", "mean", "bos", "contacts"]
    status, _, err = run_cli(
        "embed", path, fasta, "--out", tmp_path / "e", "--format", "esm", "--include", *include,
        "--layers", "0", "3", "-1", "--quiet", "--device", "cpu",
    )  # fmt: skip
    assert status == 0, err
    expected = extract_py(model, alphabet, fasta, [0, 3, -1], include)
    assert set(expected) == {"p1 first protein OS=Homo sapiens", "sp|Q9|X/2-31 a slash", "spaced header"}
    assert_same_files(tmp_path / "e", expected)
    assert (tmp_path / "e" / "sp|Q9|X" / "2-31 a slash.pt").is_file()  # a '/' makes a folder, as there


def test_embed_format_esm_cuts_a_long_sequence_as_extract_py_does(fair, run_cli, tmp_path):
    model, alphabet, path = fair
    chain = "".join(np.random.default_rng(1).choice(list("ACDEFGHIKLMNPQRSTVWY"), 1030))
    fasta = tmp_path / "long.fasta"
    fasta.write_text(f">long one\n{chain}\n>short\n{WT}\n")
    status, _, err = run_cli(
        "embed", path, fasta, "--out", tmp_path / "e", "--format", "esm", "--per-residue", "--quiet"
    )
    assert status == 0, err
    expected = extract_py(model, alphabet, fasta, [-1], ["mean", "per_tok"])
    assert expected["long one"]["representations"][LAYERS].shape == (1022, DIM)
    assert_same_files(tmp_path / "e", expected)


def test_a_checkpoint_whose_sizes_contradict_its_esm_name_is_refused(capsys, tmp_path, monkeypatch):
    """A 2-layer, 64-wide model saved as esm2_t6_8M_UR50D.pt (6 layers of 320): one line naming
    the file, the name's sizes and the checkpoint's, exit 2, nothing written, by every verb
    and by its ESM name through torch hub's cache."""
    model, _ = random_esm2(seed=0)
    cfg = argparse.Namespace(encoder_layers=2, encoder_embed_dim=64, encoder_attention_heads=4)
    folder = tmp_path / "hub" / "checkpoints"
    folder.mkdir(parents=True)
    path = folder / f"{NAME}.pt"
    torch.save({"model": model.state_dict(), "cfg": {"model": cfg}}, path)
    fasta = tmp_path / "s.fasta"
    fasta.write_text(f">a\n{WT}\n")
    new = tmp_path / "new"
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    for source in (path, NAME):
        for verb in (
            ("embed", source, fasta, "--out", new, "--format", "esm"),
            ("embed", source, fasta, "--out", new),
            ("score-variants", source, "--wt", WT, "--saturation", "--out", new),
            ("contacts", source, fasta, "--out", new),
            ("convert", "hf", source, new),
        ):
            refused(
                run_main(capsys, *map(str, verb)),
                f"{path}: the name {NAME} says 6 layers of width 320, but the checkpoint holds 2 "
                "layers of width 64",
            )
            assert not new.exists()
    # the same file under a name that is no ESM model's loads
    path.rename(tmp_path / "mine.pt")
    status, _, err = run_main(
        capsys, "embed", str(tmp_path / "mine.pt"), str(fasta), "--out", str(new), "--quiet"
    )
    assert status == 0, err


@pytest.mark.parametrize("verb", [("embed",), ("score-variants",), ("contacts",)])
def test_the_protein_verbs_help_names_every_kind_of_model(capsys, verb):
    with pytest.raises(SystemExit):
        cli.main([*verb, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for kind in (
        "a qkv run directory",
        "an HF folder",
        "a short name (antiberty, sapiens-vh, sapiens-vl)",
        "a Hub name org/name[@REVISION]",
        "a fair-esm ESM-2 checkpoint file NAME.pt",
        "esm2_t6_8M_UR50D ... esm2_t48_15B_UR50D (torch hub's cached $TORCH_HOME/hub/checkpoints/NAME.pt",
    ):
        assert kind in text, (verb, kind)
