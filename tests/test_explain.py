"""Looking inside models: attention weights of every layer/head, Eq. 1 step by step, labels."""

from __future__ import annotations

import pytest
import torch

from qkv.errors import QkvError
from qkv.explain import capture_steps, merge_attention, piece_labels, word_groups
from qkv.explain.explainer import DecodingOptions, InputTooLong
from qkv.nn.attention import MultiHeadAttention
from qkv.nn.masks import causal_mask
from qkv.recipes.loading import load_explainer

INPUTS = {"translation": "Ein Mann liest ein Buch.", "lm": "ROMEO:\nBut soft", "protein": "GIGKFLHSAKKFGKAFV"}


def test_sdpa_output_is_the_one_implied_by_the_explicit_weights():
    """The fast path returns no weights; the weights of the explicit path, applied to V and
    W_O, give exactly the SDPA output, with and without a mask."""
    torch.manual_seed(1)
    mha = MultiHeadAttention(16, 4, backend="sdpa").eval()
    x = torch.randn(2, 7, 16)
    for mask in (None, causal_mask(7), torch.tensor([[True] * 5 + [False] * 2]).view(1, 1, 1, 7)):
        fast, none = mha(x, attn_mask=mask)
        assert none is None
        steps = mha.steps(x, attn_mask=mask)
        implied = mha.w_o((steps.weights @ steps.v).transpose(1, 2).reshape(2, 7, 16))
        torch.testing.assert_close(implied, fast, atol=1e-5, rtol=1e-5)
        explicit, weights = mha(x, attn_mask=mask, need_weights=True)
        torch.testing.assert_close(weights, steps.weights)
        torch.testing.assert_close(explicit, fast, atol=1e-5, rtol=1e-5)


def test_steps_are_eq1_with_the_actual_numbers():
    torch.manual_seed(2)
    mha = MultiHeadAttention(8, 2).eval()
    x = torch.randn(1, 5, 8)
    s = mha.steps(x, is_causal=True)
    torch.testing.assert_close(s.scores, s.q @ s.k.transpose(-2, -1))
    torch.testing.assert_close(s.scaled, s.scores / 2.0)  # d_k = 4
    future = ~causal_mask(5).reshape(5, 5)
    assert bool((s.masked[..., future] == torch.finfo(torch.float32).min).all())
    assert bool((s.weights[..., future] == 0).all())  # masked entries are exactly 0
    torch.testing.assert_close(s.weights.sum(-1), torch.ones(1, 2, 5))
    torch.testing.assert_close(s.output, s.weights @ s.v)


@pytest.mark.parametrize("family", ["translation", "lm", "protein"])
def test_explain_every_layer_and_head_rows_sum_to_one(tiny_runs, family):
    ex = load_explainer(tiny_runs[family])
    result = ex.explain(INPUTS[family], merge_words=False)
    assert [a.kind for a in result.attention] == list(ex.kinds)
    for amap in result.attention:
        L, H, tq, tk = amap.weights.shape
        assert (L, H) == (2, 2) and (tq, tk) == (len(amap.query_tokens), len(amap.key_tokens))
        torch.testing.assert_close(amap.weights.sum(-1), torch.ones(L, H, tq))
        if amap.kind == "decoder":  # the look-ahead mask really blocks
            assert bool((amap.weights[..., ~causal_mask(tq).reshape(tq, tq)] == 0).all())
    assert result.to_dict()["attention"][0]["weights"][0][0][0]  # JSON-ready nested lists


@pytest.mark.parametrize("family", ["translation", "lm", "protein"])
def test_step_through_reproduces_the_modules_output(tiny_runs, family):
    """Per-head outputs of the step-through, concatenated and projected by W_O, equal what the
    attention module returned inside the model's forward pass."""
    ex = load_explainer(tiny_runs[family])
    for kind in ex.kinds:
        module = ex.attention_module(kind, 1)
        seen = []
        handle = module.register_forward_hook(  # full-sequence calls (beam search uses a cache)
            lambda m, a, kw, out, seen=seen: seen.append(out[0]) if kw.get("cache") is None else None,
            with_kwargs=True,
        )
        try:
            ex.explain(INPUTS[family])
            head_rows = [ex.steps(INPUTS[family], kind, 1, h) for h in range(module.n_heads)]
        finally:
            handle.remove()
        out = torch.cat([torch.tensor(r["output"]) for r in head_rows], dim=-1)  # (Tq, H*Dh)
        torch.testing.assert_close(module.w_o(out), seen[0][0], atol=1e-4, rtol=1e-4)
        row = head_rows[0]
        weights = torch.tensor(row["weights"])
        assert weights.shape == (len(row["query_tokens"]), len(row["key_tokens"]))
        torch.testing.assert_close(weights.sum(-1), torch.ones(weights.size(0)), atol=1e-4, rtol=0)
        blocked = ~torch.tensor(row["mask"])
        assert bool((weights[blocked] == 0).all())
        assert all(
            v is None
            for r, m in zip(row["masked"], row["mask"], strict=True)
            for v, ok in zip(r, m, strict=True)
            if not ok
        )


def test_capture_refuses_a_module_outside_the_forward_pass(tiny_runs):
    ex = load_explainer(tiny_runs["lm"])
    with pytest.raises(ValueError, match="not called"):
        capture_steps(MultiHeadAttention(16, 2), lambda: ex.model(torch.tensor([[1, 2]])))


def test_bpe_pieces_merge_into_words_and_rows_still_sum_to_one():
    pieces = ["▁Ein", "▁Fahr", "rad", ".", "<eos>"]
    groups, labels = word_groups(pieces)
    assert groups == [[0], [1, 2], [3], [4]] and labels == ["Ein", "Fahrrad", ".", "<eos>"]
    assert piece_labels(pieces) == ["Ein", "Fahr", "##rad", ".", "<eos>"]
    assert piece_labels([" ", "\n", "a"], subword=False) == ["␣", "⏎", "a"]
    w = torch.softmax(torch.randn(3, 5, 5), -1)
    merged = merge_attention(w, groups, groups)
    assert merged.shape == (3, 4, 4)
    torch.testing.assert_close(merged.sum(-1), torch.ones(3, 4))
    torch.testing.assert_close(merged[:, 1, 1], (w[:, 1, 1] + w[:, 1, 2] + w[:, 2, 1] + w[:, 2, 2]) / 2)
    with pytest.raises(ValueError, match="cover"):
        merge_attention(w, [[0, 1]], groups)


def test_translation_explains_its_own_output(tiny_runs):
    ex = load_explainer(tiny_runs["translation"])
    result = ex.explain(INPUTS["translation"], DecodingOptions(beam_size=2))
    enc, dec, cross = result.attention
    assert enc.key_tokens[-1] == "<eos>" and cross.key_tokens == enc.key_tokens
    assert dec.query_tokens[0] == "<bos>" and cross.query_tokens[-1] == "<eos>"
    assert cross.weights.shape[-2:] == (len(dec.query_tokens), len(enc.key_tokens))
    assert isinstance(result.output["text"], str)


def test_lm_and_protein_outputs(tiny_runs):
    lm = load_explainer(tiny_runs["lm"]).explain(INPUTS["lm"], DecodingOptions(max_new_tokens=5, top_k=3))
    probs = [t["prob"] for t in lm.output["next_tokens"]]
    assert len(probs) == 10 and probs == sorted(probs, reverse=True) and sum(probs) <= 1.0001
    protein = load_explainer(tiny_runs["protein"]).explain(INPUTS["protein"])
    assert [c["label"] for c in protein.output["classes"]] == ["non-AMP", "AMP"]
    assert abs(sum(c["prob"] for c in protein.output["classes"]) - 1) < 1e-3
    assert protein.attention[0].key_tokens[0] == "<cls>" and protein.attention[0].key_tokens[1] == "G"


def test_bad_input_is_named(tiny_runs, tmp_path):
    ex = load_explainer(tiny_runs["protein"], max_chars=30)
    with pytest.raises(InputTooLong, match="31 characters, the cap is 30"):
        ex.explain("A" * 31)
    with pytest.raises(QkvError, match="'1' at position 2"):
        ex.explain("A1")
    with pytest.raises(QkvError, match="empty input"):
        ex.explain("  ")
    with pytest.raises(InputTooLong, match="tokens, the model's limit is 64"):
        load_explainer(tiny_runs["protein"]).explain("A" * 70)
    with pytest.raises(QkvError, match="no 'cross' attention"):
        ex.steps("AAA", "cross", 0, 0)
    with pytest.raises(QkvError, match="layer 5 out of range"):
        ex.steps("AAA", "encoder", 5, 0)
    with pytest.raises(QkvError, match="not found"):
        load_explainer(tmp_path / "nope")


EXPECTED_FILES = {
    "translation": {
        "attention_encoder.png",
        "attention_decoder.png",
        "attention_cross.png",
        "alignment.png",
        "positional_encoding.png",
        "steps.png",
        "logit_lens.png",
        "explanation.json",
    },
    "lm": {
        "attention_decoder.png",
        "positional_encoding.png",
        "next_tokens.png",
        "steps.png",
        "logit_lens.png",
        "explanation.json",
    },
    "protein": {
        "attention_encoder.png",
        "positional_encoding.png",
        "classes.png",
        "steps.png",
        "logit_lens.png",
        "explanation.json",
    },
}


@pytest.mark.parametrize("family", ["translation", "lm", "protein"])
def test_explain_cli_writes_the_pictures(tiny_runs, tmp_path, family):
    from PIL import Image

    from qkv.cli import main

    out = tmp_path / family
    assert (
        main(
            [
                "explain",
                str(tiny_runs[family]),
                "--input",
                INPUTS[family],
                "--out",
                str(out),
                "--max-new-tokens",
                "4",
                "--beam",
                "2",
            ]
        )
        == 0
    )
    assert {p.name for p in out.iterdir()} == EXPECTED_FILES[family]
    for png in out.glob("*.png"):
        with Image.open(png) as im:
            assert im.format == "PNG" and min(im.size) > 200


def test_attention_grid_has_one_heatmap_per_layer_and_head():
    from qkv.explain.plots import plot_attention_grid

    weights = torch.softmax(torch.randn(3, 4, 5, 6), -1)
    fig = plot_attention_grid(weights, list("abcde"), list("uvwxyz"), "test")
    heatmaps = [ax for ax in fig.axes if ax.get_images() and ax.get_title()]
    assert len(heatmaps) == 12 and len(fig.axes) == 13  # + the colour bar
    assert heatmaps[5].get_title() == "layer 2, head 2"
    assert [t.get_text() for t in heatmaps[0].get_xticklabels()] == list("uvwxyz")
    with pytest.raises(ValueError, match="labels"):
        plot_attention_grid(weights, list("abc"), list("uvwxyz"), "test")


def test_explain_cli_errors_are_one_line(tiny_runs, tmp_path, capsys):
    from qkv.cli import main

    assert main(["explain", str(tiny_runs["protein"]), "--input", "AXZ-", "--out", str(tmp_path)]) == 2
    assert "character '-' at position 4" in capsys.readouterr().err
    assert main(["explain", str(tiny_runs["lm"]), "--out", str(tmp_path)]) == 2
    assert "either --input" in capsys.readouterr().err
    assert main(["explain", str(tmp_path / "missing"), "--input", "x", "--out", str(tmp_path)]) == 2
    assert "run directory not found" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # nothing written for a refused input


def test_residue_classifier_labels_every_residue(tiny_runs, tmp_path):
    import json
    import shutil

    run = tmp_path / "residue"
    shutil.copytree(tiny_runs["protein"], run)
    (run / "task.json").write_text(json.dumps({"task": "toy", "level": "residue", "classes": ["H", "C"]}))
    (run / "train_config.json").write_text(json.dumps({"recipe": "protein-residue"}))
    ex = load_explainer(run)
    result = ex.explain("gigkflhs*")  # lowercase and a trailing stop codon are accepted
    assert result.output["classes"] == [] and len(result.output["residues"]) == 8
    assert set(result.output["residues"]) <= {"H", "C"}
    assert ex.info()["level"] == "residue" and ex.info()["layers_per_kind"] == {"encoder": 2}


def test_a_point_the_output_skips_is_named_as_such_not_as_unknown(tiny_runs):
    """A sequence classifier's pass never reaches its masked-LM head: /api/activation says the
    point exists but this output does not compute it; a name the model lacks stays unknown."""
    from qkv.explain.hooks import hook_points

    explainer = load_explainer(tiny_runs["protein"])
    skipped = [n for n in hook_points(explainer.model) if n.startswith("mlm_head")]
    assert skipped
    with pytest.raises(QkvError, match=f"^'{skipped[0]}' is a point of this model that its protein output"):
        explainer.activation("MKTAYIAK", skipped[0], 0)
    with pytest.raises(QkvError, match="^unknown activation name 'mlm_hed'"):
        explainer.activation("MKTAYIAK", "mlm_hed", 0)
    assert explainer.activation("MKTAYIAK", "layers.0.resid_post", 0)["token"] == 0
