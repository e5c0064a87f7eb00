"""The explainer's "follow a token" data (qkv.explain.block) and POST /api/activation: the
numbers the page draws are the named activations, and those are the forward pass's."""

from __future__ import annotations

import pytest
import torch
from fastapi.testclient import TestClient

from qkv.errors import QkvError
from qkv.explain.activations import record_activations
from qkv.explain.block import TOP_LENS
from qkv.explain.server import create_app
from qkv.recipes.loading import load_explainer

INPUTS = {
    "translation": "Ein Mann liest ein Buch.",
    "lm": "ROMEO:\nBut soft",
    "diffusion-lm": "ROMEO:\nBut ____ soft",
    "protein": "GIGKFLHSAKKFGKAFV",
}


def _cache(ex, text):
    with record_activations(ex.model) as cache:
        ex._prepared(text, None).forward(True)
    return cache


@pytest.mark.parametrize("family", INPUTS)
def test_the_pages_numbers_are_the_named_activations(tiny_runs, family):
    ex = load_explainer(tiny_runs[family])
    block = ex.explain(INPUTS[family]).output["block"]
    cache = _cache(ex, INPUTS[family])
    stack = "decoder" if family == "translation" else ""
    paths = cache.layers(stack)
    assert len(block["layers"]) == len(paths)
    assert len(block["tokens"]) == cache[f"{paths[0]}.resid_pre"].size(1)
    for row, path in zip(block["layers"], paths, strict=True):
        resid = cache[f"{path}.resid_pre"][0]
        assert row["resid_pre"] == pytest.approx(resid.norm(dim=-1).tolist(), abs=1e-4)
        ffn = row["sublayers"][-1]
        assert ffn["name"] == "ffn"
        assert ffn["out_norm"] == pytest.approx(cache[f"{path}.ffn.out"][0].norm(dim=-1).tolist(), abs=1e-4)
        hidden = cache[f"{path}.ffn.hidden"][0]
        best = hidden.max(-1).values.tolist()
        assert [top[0][1] for top in row["ffn_top"]] == pytest.approx(best, abs=1e-4)
        assert [top[0][0] for top in row["ffn_top"]] == hidden.argmax(-1).tolist()
        assert all(len(top) == TOP_LENS for top in row["lens"])
    # the lens of the last layer is the model's own output distribution: next tokens, or an
    # encoder's masked-token head (whichever head the run was trained with)
    if family == "translation":
        logits = cache["generator"][0]
    elif family == "protein":
        with torch.no_grad():
            logits = ex.model.mlm_head(ex.model.mlm_transform(cache["final_norm"]))[0]
    else:
        logits = cache["logits"][0]
    probs = torch.softmax(logits.float(), -1)
    assert [top[0][1] for top in block["layers"][-1]["lens"]] == pytest.approx(
        probs.max(-1).values.tolist(), abs=1e-4
    )
    assert [top[0][1] for top in block["final"]] == pytest.approx(logits.max(-1).values.tolist(), abs=1e-4)


def test_the_rnn_has_no_block_views(tiny_runs):
    ex = load_explainer(tiny_runs["translation-rnn"])
    assert ex.explain(INPUTS["translation"]).output["block"] is None


def test_one_activation_by_name(tiny_runs):
    ex = load_explainer(tiny_runs["lm"])
    cache = _cache(ex, INPUTS["lm"])
    got = ex.activation(INPUTS["lm"], "layers.1.ffn.hidden", 3)
    assert got["shape"] == list(cache["layers.1.ffn.hidden"].shape)
    assert got["values"] == pytest.approx(cache["layers.1.ffn.hidden"][0, 3].tolist(), abs=1e-5)
    pattern = ex.activation(INPUTS["lm"], "layers.0.self_attn.pattern", 2)["values"]  # (H, Tk)
    assert torch.tensor(pattern)[:, 3:].abs().max() == 0  # the look-ahead mask: no later key


@pytest.mark.parametrize(
    ("name", "token", "message"),
    [
        (
            "layers.0.ffn.hiden",
            0,
            "unknown activation name 'layers.0.ffn.hiden'; did you mean layers.0.ffn.hidden",
        ),
        ("layers.7.resid_post", 0, "layer 7 out of range: the model has layers 0..1"),
        ("layers.0.resid_post", 99, "token 99 out of range: layers.0.resid_post has tokens 0..14"),
    ],
)
def test_bad_activation_requests_get_one_line_and_a_422(tiny_runs, name, token, message):
    ex = load_explainer(tiny_runs["lm"])
    with pytest.raises(QkvError, match="^" + message.replace(".", r"\.").replace("(", r"\(")):
        ex.activation(INPUTS["lm"], name, token)
    client = TestClient(create_app(ex))
    answer = client.post("/api/activation", json={"text": INPUTS["lm"], "name": name, "token": token})
    assert answer.status_code == 422
    detail = answer.json()["detail"]
    assert detail.startswith(message) and "\n" not in detail
    negative = client.post("/api/activation", json={"text": INPUTS["lm"], "name": name, "token": -1})
    assert negative.status_code == 422


def test_the_logit_lens_picture_names_each_layers_top_output(tiny_runs):
    from qkv.explain.plots import plot_logit_lens

    block = load_explainer(tiny_runs["lm"]).explain(INPUTS["lm"]).output["block"]
    fig = plot_logit_lens(block)
    ax = fig.axes[0]
    assert ax.images[0].get_array().shape == (len(block["layers"]), len(block["tokens"]))
    cells = [t.get_text() for t in ax.texts]
    assert len(cells) == len(block["layers"]) * len(block["tokens"])
    assert cells[-1] == str(block["layers"][-1]["lens"][-1][0][0])[:14]


def test_lens_labels_say_whether_a_piece_starts_a_word():
    from qkv.explain.labels import vocabulary_label

    assert [vocabulary_label(p) for p in ["▁the", "ing", ".", "<eos>", "Ġcat"]] == [
        "the",
        "##ing",
        ".",
        "<eos>",
        "cat",
    ]
    assert [vocabulary_label(p, subword=False) for p in ["\n", " ", "a"]] == ["⏎", "␣", "a"]
