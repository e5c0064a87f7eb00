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


# --- issue 68: each name read by its token axis; a value JSON cannot hold is null --------


def test_activation_reads_every_name_by_its_token_axis(tiny_runs):
    """``scores`` (B, H, Tq, Tk) is read at a query (it read the head axis: token 3 of a 15-token
    prompt was refused, token 1 gave head 1); k at a key, z (B, T, H, d_k) at axis 1; the
    translator's positions (1, T, D) at a token, 422 past the input (they were (T, D): token 20
    of a 7-token source read feature 20); a pooled head's (B, classes) logits have no token."""
    ex = load_explainer(tiny_runs["lm"])
    cache = _cache(ex, INPUTS["lm"])
    for name, token, expected in [
        ("layers.0.self_attn.scores", 3, cache["layers.0.self_attn.scores"][0, :, 3]),
        ("layers.1.self_attn.pattern", 14, cache["layers.1.self_attn.pattern"][0, :, 14]),
        ("layers.0.self_attn.k", 5, cache["layers.0.self_attn.k"][0, :, 5]),
        ("layers.1.self_attn.z", 9, cache["layers.1.self_attn.z"][0, 9]),
    ]:
        got = ex.activation(INPUTS["lm"], name, token)
        assert got["token"] == token and torch.tensor(got["values"]).shape == expected.shape, name
        assert torch.tensor(got["values"]) == pytest.approx(expected, abs=1e-5)
    with pytest.raises(
        QkvError, match=r"^token 15 out of range: layers\.0\.self_attn\.scores has tokens 0\.\.14$"
    ):
        ex.activation(INPUTS["lm"], "layers.0.self_attn.scores", 15)

    mt = load_explainer(tiny_runs["translation"])
    client = TestClient(create_app(mt))
    body = {"text": INPUTS["translation"], "name": "src_positional"}
    n_src = mt.count_tokens(INPUTS["translation"])
    row = client.post("/api/activation", json={**body, "token": n_src - 1}).json()
    assert row["shape"] == [1, n_src, 16]
    assert row["values"] == pytest.approx(mt.model.positional.pe[n_src - 1].tolist(), abs=1e-5)
    res = client.post("/api/activation", json={**body, "token": 20})
    assert res.status_code == 422
    assert res.json()["detail"] == f"token 20 out of range: src_positional has tokens 0..{n_src - 1}"

    protein = load_explainer(tiny_runs["protein"])
    pooled = protein.activation(INPUTS["protein"], "logits", 1)
    assert pooled["token"] is None and pooled["shape"] == [1, 2] and len(pooled["values"]) == 2


def test_the_diffusion_lms_logits_are_json_with_null_for_the_mask_token(tiny_runs):
    """The diffusion LM never predicts its mask token: that logit is -inf, which JSON cannot
    hold (the server answered 500); it is null, the others the model's."""
    ex = load_explainer(tiny_runs["diffusion-lm"])
    client = TestClient(create_app(ex))
    res = client.post("/api/activation", json={"text": INPUTS["diffusion-lm"], "name": "logits", "token": 7})
    assert res.status_code == 200, res.text
    values = res.json()["values"]
    mask_id = ex.config.mask_id
    assert values[mask_id] is None and all(v is not None for i, v in enumerate(values) if i != mask_id)
    cache = _cache(ex, INPUTS["diffusion-lm"])
    logits = cache["logits"][0, 7]
    assert [v for i, v in enumerate(values) if i != mask_id] == pytest.approx(
        [float(x) for i, x in enumerate(logits) if i != mask_id], abs=1e-5
    )
