"""Zero-shot variant scoring (Meier et al. 2021): parity with ESM's reference scoring
(facebookresearch/esm ``examples/variant-prediction/predict.py``, its few lines rewritten here
on fair-esm's own model and alphabet) on a random ESM-2 converted by qkv; mutation parsing and
its refusals; the additive rule for multi-mutants; the window rule for long sequences; the
``score-variants`` command end to end; the heatmap; the DMS loaders and the benchmark."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from test_fair_esm import random_esm2

from qkv import cli
from qkv.cli import variants as variants_cli
from qkv.data.tokenizers import AMINO_ACIDS
from qkv.errors import QkvError
from qkv.files import write_json
from qkv.hub.fair_esm import esm_tokenizer, from_fair_esm, hf_config, to_hf_names
from qkv.inference.protein import ProteinEncoder
from qkv.inference.variants import (
    METHODS,
    VariantScorer,
    additive_scores,
    parse_variant,
    parse_variants,
    window_start,
)

esm = pytest.importorskip("esm")

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("QKV_DATA_DIR", ROOT.parent / "shared" / "data"))
WT = "MKTAYIAKQRQISFVKSHFSRQLEERLGLIEVQAPILSRVGD"  # 42 residues


@pytest.fixture(scope="module")
def ref():
    """fair-esm's random ESM2, its alphabet, and qkv's scorer on the converted model."""
    model, alphabet = random_esm2(seed=1)
    conv = from_fair_esm(model.state_dict(), 2, 64, 4)
    return model, alphabet, VariantScorer(ProteinEncoder(conv.model, (), "mlm", tokenizer=conv.tokenizer))


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    """The same random ESM-2 as an HF folder (config.json, model.safetensors, tokenizer.json)."""
    model, _ = random_esm2(seed=1)
    folder = tmp_path_factory.mktemp("esm2_tiny")
    write_json(folder / "config.json", hf_config(2, 64, 4))
    tensors = to_hf_names(model.state_dict())
    del tensors["lm_head.decoder.weight"]  # tied to the embeddings: HF does not store it
    save_file({k: v.contiguous() for k, v in tensors.items()}, folder / "model.safetensors")
    esm_tokenizer().save(folder / "tokenizer.json")
    return folder


# --- ESM's predict.py, on fair-esm's model ---------------------------------------------------


@torch.no_grad()
def predict_py_token_probs(model, alphabet, sequence: str, masked: bool) -> torch.Tensor:
    """predict.py's ``token_probs`` ``(1, L + 2, V)``: one pass (wt-marginals), or one pass per
    token with that token masked (masked-marginals)."""
    _, _, batch_tokens = alphabet.get_batch_converter()([("protein1", sequence)])
    if not masked:
        return torch.log_softmax(model(batch_tokens)["logits"], dim=-1)
    all_token_probs = []
    for i in range(batch_tokens.size(1)):
        batch_tokens_masked = batch_tokens.clone()
        batch_tokens_masked[0, i] = alphabet.mask_idx
        token_probs = torch.log_softmax(model(batch_tokens_masked)["logits"], dim=-1)
        all_token_probs.append(token_probs[:, i])
    return torch.cat(all_token_probs, dim=0).unsqueeze(0)


def predict_py_label_row(row: str, sequence: str, token_probs, alphabet, offset_idx: int) -> float:
    """predict.py's ``label_row`` (ProteinGym's, which sums the mutations of a multi-mutant)."""
    score = 0.0
    for mutation in row.split(":"):
        wt, idx, mt = mutation[0], int(mutation[1:-1]) - offset_idx, mutation[-1]
        assert sequence[idx] == wt
        score += float(
            token_probs[0, 1 + idx, alphabet.get_idx(mt)] - token_probs[0, 1 + idx, alphabet.get_idx(wt)]
        )
    return score


@torch.no_grad()
def corrected_pppl_terms(model, alphabet, sequence: str) -> np.ndarray:
    """The terms of predict.py's ``compute_pppl``, corrected. predict.py loops ``for i in
    range(1, len(sequence) - 1)`` over token positions and reads ``sequence[i]``, but token ``i``
    is residue ``i - 1`` (token 0 is ``<cls>``): it scores each masked position against the
    next residue and never masks the last two residues. Here token ``i`` (1..L) is scored
    against residue ``i - 1``, every residue once. (predict.py also returns the mutant's
    pseudo-log-likelihood alone; pseudo-ll subtracts the wild type's, a constant per assay.)"""
    _, _, batch_tokens = alphabet.get_batch_converter()([("protein1", sequence)])
    log_probs = []
    for i in range(1, len(sequence) + 1):
        batch_tokens_masked = batch_tokens.clone()
        batch_tokens_masked[0, i] = alphabet.mask_idx
        token_probs = torch.log_softmax(model(batch_tokens_masked)["logits"], dim=-1)
        log_probs.append(token_probs[0, i, alphabet.get_idx(sequence[i - 1])].item())
    return np.array(log_probs)


ROWS = ["M1A", "K2W", "Q9P", "S13C", "D42E", "M1A:K2W", "Q9P:S13C:D42E"]


@pytest.mark.parametrize("method", ["masked-marginals", "wt-marginals"])
def test_marginals_match_esm_predict_py(ref, method):
    model, alphabet, scorer = ref
    token_probs = predict_py_token_probs(model, alphabet, WT, masked=method == "masked-marginals")
    expected = [predict_py_label_row(r, WT, token_probs, alphabet, offset_idx=1) for r in ROWS]
    ours = scorer.score(WT, parse_variants(ROWS, WT), method)
    assert np.abs(ours - expected).max() <= 1e-5
    # the whole saturation matrix too: every position, every amino acid
    matrix = scorer.saturation(WT, method)
    wt_ids = torch.tensor([alphabet.get_idx(c) for c in WT])
    aa_ids = torch.tensor([alphabet.get_idx(a) for a in AMINO_ACIDS])
    lp = token_probs[0, 1 : len(WT) + 1]  # (L, V)
    expected_matrix = (lp[:, aa_ids] - lp[torch.arange(len(WT)), wt_ids][:, None]).numpy()
    assert np.abs(matrix - expected_matrix).max() <= 1e-5


def test_pseudo_ll_matches_corrected_predict_py(ref):
    """Each of the L masked log-probabilities within 1e-5; the score, a difference of two sums
    of L float32 terms each, within 1e-4."""
    model, alphabet, scorer = ref
    wt_terms = corrected_pppl_terms(model, alphabet, WT)
    assert np.abs(scorer.pseudo_log_probs(scorer.residues(WT)) - wt_terms).max() <= 1e-5
    rows = ["K2W", "Q9P:S13C"]
    expected = []
    for row in rows:
        mutant = list(WT)
        for m in row.split(":"):
            mutant[int(m[1:-1]) - 1] = m[-1]
        terms = corrected_pppl_terms(model, alphabet, "".join(mutant))
        assert np.abs(scorer.pseudo_log_probs(scorer.residues("".join(mutant))) - terms).max() <= 1e-5
        expected.append(terms.sum() - wt_terms.sum())
    ours = scorer.score(WT, parse_variants(rows, WT), "pseudo-ll")
    assert np.abs(ours - expected).max() <= 1e-4


def test_multi_mutants_add_for_marginal_methods(ref):
    *_, scorer = ref
    for method in ("masked-marginals", "wt-marginals"):
        singles = scorer.score(WT, parse_variants(["Q9P", "S13C", "D42E"], WT), method)
        triple = scorer.score(WT, parse_variants(["Q9P:S13C:D42E"], WT), method)
        assert triple[0] == pytest.approx(singles.sum(), abs=1e-6)
    # pseudo-ll scores the whole mutated sequence: not the sum of its singles
    singles = scorer.score(WT, parse_variants(["Q9P", "S13C"], WT), "pseudo-ll")
    double = scorer.score(WT, parse_variants(["Q9P:S13C"], WT), "pseudo-ll")
    assert abs(double[0] - singles.sum()) > 1e-4


def test_saturation_matrix_layout(ref):
    *_, scorer = ref
    matrix = scorer.saturation(WT, positions=[2, 5])
    assert matrix.shape == (len(WT), 20)
    assert np.isnan(matrix[0]).all() and not np.isnan(matrix[1]).any()
    assert matrix[1, AMINO_ACIDS.index("K")] == 0  # the wild type's own column
    variants = parse_variants(["K2W", "K2W:Y5G"], WT)
    assert additive_scores(matrix, variants) == pytest.approx(
        [
            matrix[1, AMINO_ACIDS.index("W")],
            matrix[1, AMINO_ACIDS.index("W")] + matrix[4, AMINO_ACIDS.index("G")],
        ]
    )


# --- parsing ---------------------------------------------------------------------------------


def test_parsing_positions_offsets_and_case():
    (m,) = parse_variant("k2w", WT)
    assert (m.wt, m.position, m.mt, m.text) == ("K", 2, "W", "k2w")
    double = parse_variant("M24A:K25W", WT, offset=23)  # numbered from 24 at the first residue
    assert [(x.position, x.mt) for x in double] == [(1, "A"), (2, "W")]
    assert parse_variant("M-2A", WT, offset=-3)[0].position == 1


@pytest.mark.parametrize(
    ("text", "offset", "message"),
    [
        ("A2W", 0, "A2W: the wild type has K at position 2, not A"),
        ("K43A", 0, "K43: position 43 is outside"),
        ("M0A", 0, "position 0 is outside"),
        ("M50A", 0, "position 50 is outside"),
        ("M23A", 23, "position 23 is outside"),
        ("K2B", 0, "'B' is not one of the 20 amino acids"),
        ("K2*", 0, "'*' is not one of the 20 amino acids"),
        ("X2A", 0, "'X' is not one of the 20 amino acids"),
        ("K2W:K2A", 0, "two mutations at position 2"),
        ("K2", 0, "is not a mutation like A42G"),
        ("2W", 0, "is not a mutation like A42G"),
        ("K2W,Q9P", 0, "is not a mutation like A42G"),
        ("", 0, "empty mutation"),
    ],
)
def test_parsing_refusals_are_one_line(text, offset, message):
    with pytest.raises(QkvError) as err:
        parse_variant(text, WT, offset)
    assert message.split(":")[-1].strip() in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(QkvError, match=r"^muts.csv: row 2: "):
        parse_variants([f"K{2 + offset}W", text], WT, offset, "muts.csv: ")


# --- windows -----------------------------------------------------------------------------------


def test_window_never_crosses_the_sequence_ends():
    for length in (5, 16, 17, 40, 101):
        for width in (4, 7, 16):
            for p in range(length):
                s = window_start([p], length, width)
                assert s >= 0 and s + min(width, length) <= length and s <= p < s + width
                if width // 2 <= p < length - width + width // 2 and length > width:
                    assert p - s == width // 2  # centred where the ends allow
    assert window_start([3, 9], 40, 16) == 0 and window_start([30, 38], 40, 16) == 24
    assert window_start([18, 22], 40, 16) == 12
    with pytest.raises(QkvError, match="more than the model's 16 residues apart"):
        window_start([2, 18], 40, 16)


def test_long_sequences_are_scored_in_windows(ref):
    """With a 16-residue model the score of a position is fair-esm's masked marginal on the
    16-residue window around it, framed by <cls> and <eos> (ProteinGym's rule)."""
    model, alphabet, scorer = ref
    narrow = VariantScorer(scorer.encoder)
    narrow.width = 16
    for position in (1, 9, 20, 42):
        s = window_start([position - 1], len(WT), 16)
        window = WT[s : s + 16]
        probs = predict_py_token_probs(model, alphabet, window, masked=True)
        row = f"{WT[position - 1]}{position - s}A"
        expected = predict_py_label_row(row, window, probs, alphabet, offset_idx=1)
        ours = narrow.score(WT, parse_variants([f"{WT[position - 1]}{position}A"], WT))[0]
        assert ours == pytest.approx(expected, abs=1e-5)
    with pytest.raises(QkvError, match="apart"):
        narrow.score(WT, parse_variants(["M1A:D42E"], WT), "pseudo-ll")


# --- models it refuses -----------------------------------------------------------------------


def test_refuses_models_without_a_trained_mlm_head(tiny_runs):
    with pytest.raises(QkvError, match="classifier, not a masked LM"):
        VariantScorer(ProteinEncoder.from_run(tiny_runs["protein"]))
    model, _ = random_esm2()
    with torch.no_grad():  # a base model's checkpoint: the MLM head keeps its initialisation
        model.lm_head.bias.zero_()
        model.lm_head.layer_norm.weight.fill_(1.0)
        model.lm_head.layer_norm.bias.zero_()
    conv = from_fair_esm(model.state_dict(), 2, 64, 4)
    with pytest.raises(QkvError, match="no trained masked-LM head"):
        VariantScorer(ProteinEncoder(conv.model, (), "mlm", tokenizer=conv.tokenizer))


def test_run_directory_and_hf_folder_score_alike(hf_folder, ref, tmp_path):
    """The converted model reached as an HF folder and as a qkv run directory (``qkv convert
    hf``) scores as the in-memory conversion does."""
    from qkv.hub.convert import import_hf

    run = tmp_path / "run"
    import_hf(hf_folder, run)
    variants = parse_variants(["K2W", "Q9P:S13C"], WT)
    expected = ref[2].score(WT, variants)
    for source in (hf_folder, run):
        scores = VariantScorer(ProteinEncoder.load(source)).score(WT, variants)
        assert scores == pytest.approx(expected, abs=1e-6)


def test_unknown_method(ref):
    with pytest.raises(QkvError, match="unknown scoring method 'entropy'"):
        ref[2].score(WT, parse_variants(["K2W"], WT), "entropy")
    assert set(METHODS) == set(variants_cli.METHODS)


# --- the command -----------------------------------------------------------------------------


def run_qkv(monkeypatch, capsys, *argv: str) -> tuple[int, str, str]:
    """``qkv ARGV`` in this process, with ``score-variants`` registered if the CLI does not list
    it yet."""
    if variants_cli not in cli.VERBS:
        monkeypatch.setattr(cli, "VERBS", (*cli.VERBS, variants_cli))
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_scores_a_csv(hf_folder, ref, tmp_path, monkeypatch, capsys):
    csv_path = tmp_path / "muts.csv"
    csv_path.write_text("\ufeffid,mutant,fitness\na,K25W,0.5\nb,Q32P:S36C,-1.2\n", encoding="utf-8")
    out = tmp_path / "scores.tsv"
    common = [str(hf_folder), "--wt", WT, "--mutations", str(csv_path), "--offset", "23", "--device", "cpu"]
    code, stdout, err = run_qkv(monkeypatch, capsys, "score-variants", *common, "--out", str(out))
    assert code == 0, err
    lines = out.read_text(encoding="utf-8").splitlines()
    assert lines[0] == "id\tmutant\tfitness\tscore" and lines[1].startswith("a\tK25W\t0.5\t")
    expected = ref[2].score(WT, parse_variants(["K2W", "Q9P:S13C"], WT))
    assert [float(x.split("\t")[-1]) for x in lines[1:]] == pytest.approx(expected, abs=1e-5)
    # the same on stdout, and with the other methods
    for method in ("wt-marginals", "pseudo-ll"):
        code, stdout, err = run_qkv(monkeypatch, capsys, "score-variants", *common, "--method", method)
        assert code == 0, err
        expected = ref[2].score(WT, parse_variants(["K2W", "Q9P:S13C"], WT), method)
        got = [float(x.split("\t")[-1]) for x in stdout.splitlines()[1:]]
        assert got == pytest.approx(expected, abs=1e-5)


def test_cli_saturation_and_heatmap(hf_folder, ref, tmp_path, monkeypatch, capsys):
    fasta = tmp_path / "wt.fasta"
    fasta.write_text(f">wt\n{WT[:20]}\n{WT[20:]}\n")
    png = tmp_path / "heat.png"
    code, stdout, err = run_qkv(
        monkeypatch, capsys, "score-variants", str(hf_folder), "--wt", str(fasta), "--saturation",
        "--heatmap", str(png), "--device", "cpu",
    )  # fmt: skip
    assert code == 0, err
    rows = [line.split("\t") for line in stdout.splitlines()]
    assert rows[0] == ["mutant", "score"] and len(rows) == 1 + 19 * len(WT) and rows[1][0] == "M1A"
    matrix = ref[2].saturation(WT)
    assert float(rows[1][1]) == pytest.approx(matrix[0, 0], abs=1e-5)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_heatmap_of_a_long_sequence_has_one_panel_per_hundred_positions(tmp_path):
    from qkv.explain.variants import plot_saturation, write_heatmap

    wt = (WT * 6)[:250]
    matrix = np.random.default_rng(0).normal(size=(250, 20)).astype(np.float32)
    fig = plot_saturation(matrix, wt, offset=10)
    assert len(fig.axes) == 3 + 1  # 3 heatmaps, the colour bar
    assert fig.axes[0].get_xticklabels()[0].get_text() == "M"  # wild-type letters below
    top = fig.axes[1].child_axes[0].get_xticklabels()  # position numbers above, offset added
    assert [t.get_text() for t in top][:2] == ["120", "130"]  # positions 101-200 are 111-210
    with pytest.raises(ValueError, match="does not match"):
        plot_saturation(matrix[:10], wt)
    assert write_heatmap(matrix, wt, tmp_path / "h.png").stat().st_size > 10_000


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (
            ["--mutations", "{csv}", "--wt", "MKTAYIAK", "--offset", "0"],
            "row 1: K25W: position 25 is outside",
        ),
        (
            ["--mutations", "{csv}", "--wt", WT, "--offset", "22"],
            "row 1: K25W: the wild type has T at position 25",
        ),
        (["--mutations", "{csv}", "--wt", "MKT4YIAK"], "'4' at position 4 is not an amino-acid code"),
        (["--mutations", "{bad}", "--wt", WT], "row 1: K25J: 'J' is not one of the 20 amino acids"),
        (["--mutations", "{gap}", "--wt", WT], "row 2: empty mutation"),  # a one-column file's empty cell
        (["--mutations", "{csv}", "--wt", "{empty}"], "no FASTA records found"),
        (["--mutations", "{csv}", "--wt", "missing.fasta"], "wild-type FASTA not found"),
        (["--mutations", "{csv}", "--wt", WT, "--column", "variant"], "has no column 'variant'"),
        (["--wt", WT], "give either --mutations CSV or --saturation"),
        (["--saturation", "--wt", WT, "--method", "pseudo-ll"], "need a marginal method"),
        (["--mutations", "{csv}", "--wt", WT, "--model", "protein"], "classifier, not a masked LM"),
    ],
)
def test_cli_refusals_are_one_line_and_write_nothing(
    hf_folder, tiny_runs, tmp_path, monkeypatch, capsys, args, needle
):
    (tmp_path / "m.csv").write_text("mutant\nK25W\n")
    (tmp_path / "bad.csv").write_text("mutant\nK25J\n")
    (tmp_path / "gap.csv").write_text("mutant\nK25W\n\nQ32P\n\n")
    (tmp_path / "empty.fasta").write_text("")
    names = {"{csv}": "m.csv", "{bad}": "bad.csv", "{gap}": "gap.csv", "{empty}": "empty.fasta"}
    args = [str(tmp_path / names[a]) if a in names else a for a in args]
    model = str(hf_folder)
    if "--model" in args:
        i = args.index("--model")
        model, args = str(tiny_runs["protein"]), args[:i] + args[i + 2 :]
    out, png = tmp_path / "out.tsv", tmp_path / "out.png"
    offset = [] if "--offset" in args else ["--offset", "23"]
    code, stdout, err = run_qkv(
        monkeypatch, capsys, "score-variants", model, *args, *offset, "--out", str(out), "--heatmap", str(png)
    )
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], err
    assert not stdout and not out.exists() and not png.exists()


# --- data and benchmark ----------------------------------------------------------------------

needs_dms = pytest.mark.skipif(not (DATA / "dms").is_dir(), reason=f"no dms/ under {DATA} (set QKV_DATA_DIR)")


@needs_dms
def test_dms_assays_select_proteingyms_rows(monkeypatch):
    from qkv.data.dms import load_assay

    monkeypatch.setenv("QKV_DATA_DIR", str(DATA))
    counts = {"BLAT": (4996, {1: 4996}), "TDP-43": (1196, {1: 1196}), "Abeta42": (14483, {1: 468, 2: 14015})}
    for name, (n, by_size) in counts.items():
        assay = load_assay(name)
        variants = parse_variants(assay.variants, assay.wild_type)  # every one fits the wild type
        sizes = dict(zip(*np.unique([len(v) for v in variants], return_counts=True), strict=True))
        assert (len(variants), sizes) == (n, by_size) and assay.scores.shape == (n,)
        assert not np.isnan(assay.scores).any()
    blat = load_assay("BLAT")
    assert blat.variants[0] == "H24C" and blat.scores[0] == pytest.approx(-0.418259925)
    assert float(blat.anchors["esm2_650M"]) == 0.731
    tdp = load_assay("TDP-43")
    assert tdp.variants[0] == "G290N" and len(tdp.wild_type) == 414


@needs_dms
def test_benchmark_runs_on_a_tiny_model(hf_folder, tmp_path):
    out = tmp_path / "results.json"
    done = subprocess.run(
        [
            sys.executable, str(ROOT / "benchmarks" / "zero_shot_dms.py"), str(hf_folder),
            "--assay", "TDP-43", "--max-variants", "60", "--device", "cpu", "--out", str(out),
        ],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
        env={**os.environ, "QKV_DATA_DIR": str(DATA), "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    table = done.stdout.strip().splitlines()
    assert "| ESM-2 650M (ProteinGym, published) |" in table[0] and table[2].startswith("| TDP-43 | 60 | ")
    assert "| 0.121 | 0.047 | 0.021 | -0.12 |" in table[2]
    result = json.loads(out.read_text())["results"][str(hf_folder)]["TDP-43"]
    assert result["n_variants"] == 60 and -1 <= result["spearman"] <= 1


def test_a_wild_type_longer_than_a_file_name_is_read_as_a_sequence():
    """``--wt`` with a whole protein (BLAT's 286 residues): checking it for a file must not fail
    on a name longer than the file system allows (it did: "File name too long")."""
    from qkv.cli.variants import _wild_type

    long = "MSIQHFRVAL" * 30  # 300 residues, over the usual 255-byte name limit
    assert _wild_type(long) == long
