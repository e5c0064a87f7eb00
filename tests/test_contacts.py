"""Contact prediction from attention (Rao et al. 2021): parity with fair-esm's
``predict_contacts`` on a random ESM-2, APC and precision against their formulas, windows over
long chains, the shared structures read to ``chains.tsv``'s sequences, the fitted head equal to
scikit-learn's fit of the same pairs, and ``qkv contacts`` end to end with its refusals."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from qkv import cli
from qkv.cli import contacts as contacts_cli
from qkv.data.structures import (
    ANTIBODY_CHAINS,
    FIT_ENTRIES,
    contact_map,
    read_chain,
    shared_chains,
    shared_entries,
)
from qkv.errors import QkvError
from qkv.hub.convert import export_hf
from qkv.inference.contacts import (
    ContactHead,
    apc,
    attention_features,
    contact_precision,
    contact_regression,
    fit_contact_head,
    predict_contacts,
    symmetrize,
    window_starts,
)
from qkv.inference.protein import ProteinEncoder

esm = pytest.importorskip("esm")

DATA = Path(os.environ.get("QKV_DATA_DIR", Path(__file__).resolve().parents[2] / "shared" / "data"))
SEQS = {
    "p1": "MKTAYIAKQRQISFVKSHFSRQLEERLGLIEVQAPILSRVGDGTQDNLSGAEKAVQVKVKALPDAQFEVVHSLAKWKRQTLG",
    "p2": "GSHMSLFDFFKNKGSAATATDRLKLLLDKHRXDIVSNLLEEVKK",
}
SHORT_FIT, SHORT_EVAL = ("1A8O_A", "1UBI_A"), ("1MOL_A",)  # mmCIF.gz + PDB; BinaryCIF


@pytest.fixture
def data_dir(monkeypatch):
    if not (DATA / "structures" / "chains.tsv").is_file():
        if os.environ.get("CI"):
            pytest.fail(f"shared data missing: {DATA / 'structures'}")
        pytest.skip("shared structures not available (set QKV_DATA_DIR)")
    monkeypatch.setenv("QKV_DATA_DIR", str(DATA))


@pytest.fixture(scope="module")
def esm2():
    """A random fair-esm ESM-2 (2 layers, 64 dims, 4 heads; eval) with a random, non-zero
    contact regression, its alphabet, and the qkv encoder converted from it."""
    from qkv.hub.fair_esm import from_fair_esm

    torch.manual_seed(0)
    alphabet = esm.data.Alphabet.from_architecture("ESM-1b")
    model = esm.model.esm2.ESM2(
        num_layers=2, embed_dim=64, attention_heads=4, alphabet=alphabet, token_dropout=True
    ).eval()
    with torch.no_grad():
        model.contact_head.regression.weight.normal_(0.0, 100.0)  # features are ~1/L
        model.contact_head.regression.bias.fill_(-0.5)
    conv = from_fair_esm(model.state_dict(), 2, 64, 4)
    encoder = ProteinEncoder(conv.model, (), "mlm", tokenizer=conv.tokenizer)
    return model, alphabet, conv, encoder


def esm_contacts(model, alphabet, seq: str) -> torch.Tensor:
    _, _, tokens = alphabet.get_batch_converter()([("x", seq)])
    with torch.no_grad():
        return model.predict_contacts(tokens)[0]


def test_contact_probabilities_match_fair_esm(esm2):
    model, alphabet, conv, encoder = esm2
    head = ContactHead.from_state(conv.kept, 2, 4)
    assert head is not None and head.weight.abs().min() > 0
    for seq in SEQS.values():
        ours = predict_contacts(encoder, head, seq)
        ref = esm_contacts(model, alphabet, seq)
        assert ours.shape == ref.shape == (len(seq), len(seq))
        torch.testing.assert_close(ours, ref, atol=1e-5, rtol=0)
        assert ours.std() > 0.05  # the maps differ across pairs: the comparison has teeth


def test_symmetrize_and_apc_follow_their_formulas():
    x = torch.tensor([[1.0, 2.0, 0.5], [0.0, 3.0, 1.0], [4.0, 1.0, 2.0]])
    s = symmetrize(x)
    assert torch.equal(s, torch.tensor([[2.0, 2.0, 4.5], [2.0, 6.0, 2.0], [4.5, 2.0, 4.0]]))
    total = float(x.sum())
    expected = torch.tensor(
        [[float(x[i, j] - x[i].sum() * x[:, j].sum() / total) for j in range(3)] for i in range(3)]
    )
    torch.testing.assert_close(apc(x), expected)
    assert abs(float(apc(x)[0, 0]) - (1.0 - 3.5 * 5.0 / 14.5)) < 1e-6  # one entry by hand
    batch = torch.stack([x, 2 * x])  # per map, over the last two dimensions
    torch.testing.assert_close(apc(batch), torch.stack([expected, 2 * expected]))


def test_contact_map_and_precision_on_hand_made_maps():
    line = np.arange(10)[:, None] * np.array([[3.8, 0.0, 0.0]])  # residues 3.8 Å apart on a line
    truth = contact_map(line)
    assert truth[0, 2] and not truth[0, 3] and truth.trace() == 10  # 7.6 Å < 8 < 11.4 Å

    length = 30  # pairs with j - i >= 24: i = 0..5, 21 of them
    truth, probs = np.zeros((length, length), bool), np.zeros((length, length))
    ranked = [(0, 29), (1, 29), (0, 28), (2, 29), (1, 28), (0, 27), (3, 29)]  # best first
    for rank, (i, j) in enumerate(ranked):
        probs[i, j] = 1.0 - rank / 10
    for i, j in [(0, 29), (0, 28), (1, 28), (0, 27), (5, 29), (2, 5)]:  # (2, 5): too close to count
        truth[i, j] = True
    probs[2, 5] = 5.0
    got = contact_precision(probs, truth)
    # top L/5 = 6 pairs: 4 hits; top L/2 = 15: the 7 ranked, then 8 of the 14 ties at 0 in row
    # order, which leaves (5, 29) out: 4 hits; top L = 21 (every pair): 5 hits
    assert got == {"L": 5 / 21, "L/2": 4 / 15, "L/5": 4 / 6}
    assert contact_precision(probs, truth, top=("L/10",)) == {"L/10": 2 / 3}
    with pytest.raises(QkvError, match="L or L/n"):
        contact_precision(probs, truth, top=("top5",))
    with pytest.raises(QkvError, match="no pair"):
        contact_precision(probs[:10, :10], truth[:10, :10])


def test_windows_over_a_chain_longer_than_the_model(esm2):
    _, _, conv, _ = esm2
    encoder = ProteinEncoder(conv.model, (), "mlm", tokenizer=conv.tokenizer)
    encoder.width = 10  # rotary positions: any width runs
    seq = SEQS["p1"][:23]
    assert window_starts(23, 10) == [0, 5, 10, 13] and window_starts(10, 10) == [0]
    features, covered = attention_features(encoder, seq)
    alone = [attention_features(encoder, seq[s : s + 10])[0] for s in (0, 5)]
    assert torch.equal(features[0, 1], alone[0][0, 1])  # in window 0 only: exactly its value
    torch.testing.assert_close(features[6, 8], (alone[0][6, 8] + alone[1][1, 3]) / 2)  # windows 0 and 5
    head = ContactHead(torch.randn(8), torch.tensor(0.2), 2, 4)
    probs = predict_contacts(encoder, head, seq)
    assert probs[0, 1] == head.probabilities(alone[0])[0, 1]
    assert not covered[0, 20] and probs[0, 20] == 0 and probs[20, 0] == 0  # no shared window
    assert probs[6, 14] == head.probabilities(alone[1])[1, 9]  # in window 5 only
    torch.testing.assert_close(probs, probs.T)


def test_head_saves_and_reloads_identically(tmp_path, esm2):
    _, _, conv, encoder = esm2
    head = ContactHead.from_state(conv.kept, 2, 4, "random esm2")
    assert head is not None
    path = head.save(tmp_path / "head.safetensors")
    again = ContactHead.load(path)
    assert torch.equal(again.weight, head.weight) and torch.equal(again.bias, head.bias)
    assert (again.n_layers, again.n_heads, again.model) == (2, 4, "random esm2")
    assert torch.equal(
        predict_contacts(encoder, again, SEQS["p2"]), predict_contacts(encoder, head, SEQS["p2"])
    )
    # ESM's own names: fair-esm's contact head loads it
    state = load_file(path)
    assert state["regression.weight"].shape == (1, 8) and state["regression.bias"].shape == (1,)
    save_file({"x": torch.zeros(2)}, tmp_path / "other.safetensors")
    with pytest.raises(QkvError, match="not a qkv contact head"):
        ContactHead.load(tmp_path / "other.safetensors")
    with pytest.raises(QkvError, match="does not fit"):
        ContactHead(torch.zeros(7), torch.zeros(()), 2, 4)


def test_shared_set_reads_to_its_table_and_splits_by_entry(data_dir):
    entries = shared_entries()
    assert len(entries) == 40
    fit = [e for e in entries if e.split == "fit"]
    evaluate = [e for e in entries if e.split == "evaluate"]
    assert len(fit) == len(evaluate) == 20
    assert not {e.pdb_id for e in fit} & {e.pdb_id for e in evaluate}  # an entry stays together
    assert {e.pdb_id for e in fit} == set(FIT_ENTRIES)
    assert set(ANTIBODY_CHAINS) <= {e.name for e in evaluate}
    assert sum(e.name.startswith("6ZU5") for e in evaluate) == 4
    (ubi,) = shared_chains(names=["1UBI_A"])
    row = next(e for e in entries if e.name == "1UBI_A")
    assert ubi.sequence == row.sequence and ubi.sequence.startswith("MQIFVKTLTGK")
    assert ubi.coords.shape == (76, 3) and ubi.coords.dtype == np.float32
    contacts = ubi.contacts()
    assert contacts.shape == (76, 76) and (contacts == contacts.T).all()
    assert 0.03 < contacts[np.triu_indices(76, 6)].mean() < 0.2  # a folded protein's share
    with pytest.raises(QkvError, match="no chain 1XYZ_A"):
        shared_chains(names=["1XYZ_A"])


PDB_LINE = (  # PDB's fixed columns: serial, atom, residue, chain, number, x y z, occupancy, B, element
    "ATOM  {serial:5d}  {atom:<3s} {res:3s} {chain}{num:4d}    {x:8.3f}{y:8.3f}{z:8.3f}"
    "  1.00 10.00           C\n"
)


def _pdb(path: Path, atoms: list[tuple[str, str, int]]) -> Path:
    lines = [
        PDB_LINE.format(serial=n, atom=a, res=r, chain="A", num=k, x=3.8 * k, y=float(a == "CB"), z=0.0)
        for n, (a, r, k) in enumerate(atoms, 1)
    ]
    path.write_bytes(
        gzip.compress("".join(lines).encode()) if path.suffix == ".gz" else "".join(lines).encode()
    )
    return path


def test_read_chain_keeps_cb_residues_and_refuses_bad_files(tmp_path):
    good = _pdb(
        tmp_path / "toy.pdb.gz",
        [
            ("CA", "MET", 1),
            ("CB", "MET", 1),
            ("CA", "GLY", 2),
            ("CA", "LYS", 3),
            ("CA", "ALA", 4),
            ("CB", "ALA", 4),
        ],
    )
    chain = read_chain(good, "A")
    assert chain.name == "toy_A" and chain.sequence == "MGA"  # LYS without Cβ left out
    np.testing.assert_allclose(chain.coords[:, 0], [3.8, 7.6, 15.2])
    assert chain.coords[1, 1] == 0.0 and chain.coords[0, 1] == 1.0  # Gly: Cα; others: Cβ
    with pytest.raises(QkvError, match=r"no chain 'B' in its first model \(chains: A\)"):
        read_chain(good, "B")
    trace = _pdb(tmp_path / "trace.pdb", [("CA", "MET", 1), ("CA", "LYS", 2), ("CA", "GLY", 3)])
    with pytest.raises(QkvError, match="no amino acid with a Cβ"):
        read_chain(trace, "A")
    (tmp_path / "x.txt").write_text("hello")
    with pytest.raises(QkvError, match="not a structure file name"):
        read_chain(tmp_path / "x.txt", "A")
    with pytest.raises(QkvError, match="cannot read"):
        read_chain(tmp_path / "missing.cif", "A")


def test_fitted_head_is_sklearns_fit_of_the_pairs_six_apart(data_dir, esm2):
    _, _, _, encoder = esm2
    chains = shared_chains(names=SHORT_FIT)
    head = fit_contact_head(encoder, chains, "random esm2")
    xs, ys = [], []
    for chain in chains:  # the examples spelled out: every pair i < j with j - i >= 6
        features, _ = attention_features(encoder, chain.sequence)
        truth = chain.contacts()
        n = len(chain.sequence)
        pairs = [(i, j) for i in range(n) for j in range(i + 6, n)]
        xs += [features[i, j].numpy() for i, j in pairs]
        ys += [truth[i, j] for i, j in pairs]
    ref = contact_regression(0.15).fit(np.array(xs), np.array(ys))
    np.testing.assert_allclose(head.weight.numpy(), ref.coef_[0], rtol=1e-5, atol=1e-6)
    assert abs(float(head.bias) - ref.intercept_[0]) < 1e-5
    assert head.info["chains"] == ",".join(SHORT_FIT) and int(head.info["pairs"]) == len(ys)
    assert ref.get_params()["solver"] == "liblinear" and ref.get_params()["C"] == 0.15


# ---- qkv contacts, end to end -------------------------------------------------------------


@pytest.fixture
def run_cli(monkeypatch, capsys):
    """``qkv ARGS`` in this process → (status, stdout, stderr), with ``contacts`` registered."""
    if contacts_cli not in cli.VERBS:
        monkeypatch.setattr(cli, "VERBS", (*cli.VERBS, contacts_cli))

    def run(*args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        status = cli.main([str(a) for a in args])
        out, err = capsys.readouterr()
        return status, out, err

    return run


def refused(result: tuple[int, str, str], needle: str) -> None:
    status, out, err = result
    lines = err.strip().splitlines()
    assert status == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    assert needle in lines[0] and not out, (needle, err)


@pytest.fixture(scope="module")
def esm_run(tmp_path_factory, esm2):
    """The converted random ESM-2 as a qkv run directory, its contact head in hf_extra."""
    from qkv.hub.convert import write_run

    run = tmp_path_factory.mktemp("contacts") / "esm_run"
    write_run(esm2[2], run, "random fair-esm ESM2")
    return run


def test_cli_predicts_fits_plots_and_refuses(tmp_path, data_dir, esm2, esm_run, run_cli, tiny_runs):
    model, alphabet, _, _ = esm2
    fasta = tmp_path / "seqs.fasta"
    fasta.write_text("".join(f">{k} a protein\n{v}\n" for k, v in SEQS.items()))

    # the checkpoint's own head (hf_extra.safetensors): fair-esm's predict_contacts
    status, _, err = run_cli(
        "contacts", esm_run, fasta, "--out", tmp_path / "own.safetensors", "--device", "cpu"
    )
    assert status == 0, err
    own = load_file(tmp_path / "own.safetensors")
    with safe_open(str(tmp_path / "own.safetensors"), "pt") as f:
        assert json.loads(f.metadata()["ids"]) == list(SEQS)
    for k, seq in SEQS.items():
        assert own[k].dtype == torch.float32
        torch.testing.assert_close(own[k], esm_contacts(model, alphabet, seq), atol=1e-5, rtol=0)

    # an HF folder with the head in its weights (as the Hub's ESM-2 checkpoints have it)
    export_hf(esm_run, tmp_path / "hf")
    status, _, err = run_cli(
        "contacts", tmp_path / "hf", fasta, "--out", tmp_path / "hf.safetensors", "--device", "cpu"
    )  # on the CPU as the first: bit for bit only on the same device
    assert status == 0, err
    from_hf = load_file(tmp_path / "hf.safetensors")
    assert all(torch.equal(from_hf[k], own[k]) for k in SEQS)

    # fit on two short real chains, evaluate on a third, draw it
    status, out, err = run_cli(
        "contacts", esm_run, "--fit", "--fit-chains", ",".join(SHORT_FIT), "--eval-chains", SHORT_EVAL[0],
        "--plot", tmp_path / "fig.png", "--device", "cpu",
    )  # fmt: skip
    assert status == 0, err
    rows = [line.split("\t") for line in out.strip().splitlines()]
    assert rows[0] == ["chain", "length", "top_L", "top_L/2", "top_L/5"]
    assert [r[:2] for r in rows[1:]] == [["1MOL_A", "94"], ["mean", ""]]
    assert all(0.0 <= float(x) <= 1.0 for x in rows[1][2:]) and rows[1][2:] == rows[2][2:]
    assert (tmp_path / "fig.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    fitted = ContactHead.load(esm_run / "contact_head.safetensors")
    assert fitted.info["chains"] == ",".join(SHORT_FIT) and fitted.model == str(esm_run.resolve())

    # the run's fitted head now comes first
    status, _, err = run_cli(
        "contacts", esm_run, fasta, "--out", tmp_path / "fit.safetensors", "--device", "cpu"
    )
    assert status == 0, err
    encoder = ProteinEncoder.load(esm_run)
    torch.testing.assert_close(
        load_file(tmp_path / "fit.safetensors")["p2"], predict_contacts(encoder, fitted, SEQS["p2"])
    )

    # refusals: one line each, nothing written
    out_file = tmp_path / "refused.safetensors"
    empty = tmp_path / "empty.fasta"
    empty.write_text("")
    refused(run_cli("contacts", esm_run, empty, "--out", out_file), "no FASTA records")
    bad = tmp_path / "bad.fasta"
    bad.write_text(">ok\nMKV\n>bad\nMK1V\n")
    refused(run_cli("contacts", esm_run, bad, "--out", out_file), "'1' at position 3")
    refused(run_cli("contacts", tiny_runs["protein"], fasta, "--out", out_file), "--fit")  # no head
    head = esm_run / "contact_head.safetensors"
    refused(  # a head of 2 × 4 maps for a model of other sizes
        run_cli("contacts", tiny_runs["protein"], fasta, "--out", out_file, "--head", head),
        "2 layers × 4 heads",
    )
    refused(run_cli("contacts", "antiberty", "--fit"), "--head-out")
    refused(run_cli("contacts", esm_run, "--fit", "--fit-chains", "9ZZZ_A", "--head-out", out_file), "9ZZZ_A")
    refused(run_cli("contacts", esm_run, fasta), "--out")
    assert not out_file.exists()
