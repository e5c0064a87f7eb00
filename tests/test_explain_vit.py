"""Explaining a Vision Transformer: attention rollout, the image explainer, the CLI's pictures."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

from qkv.cli import main
from qkv.data.images import read_image
from qkv.errors import QkvError
from qkv.explain.rollout import attention_rollout
from qkv.explain.vision import ImageExplainer
from qkv.recipes.loading import load_explainer


def _png_bytes(size=(20, 12), mode="L", color=200) -> bytes:
    buf = io.BytesIO()
    Image.new(mode, size, color).save(buf, format="PNG")
    return buf.getvalue()


def truncated_png() -> bytes:
    """The first half of a 64 × 64 noise PNG: the header reads, the pixel data stops short."""
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (64, 64), dtype=np.uint8)).save(
        buf, format="PNG"
    )
    return buf.getvalue()[: len(buf.getvalue()) // 2]


def bomb_png() -> bytes:
    """A decompression bomb: 5000 × 4000 = 20 M one-bit pixels (over ``MAX_PIXELS``) in a
    file of a few kilobytes."""
    buf = io.BytesIO()
    Image.new("1", (5000, 4000)).save(buf, format="PNG", optimize=True)
    return buf.getvalue()


# --- attention rollout (Abnar & Zuidema 2020) ----------------------------------------------


def test_rollout_rows_sum_to_one_and_match_the_definition():
    torch.manual_seed(0)
    weights = torch.randn(3, 4, 6, 6).softmax(-1)  # (L, H, T, T)
    weights[1, :, 2] = 0.0  # a fully masked query row: still a distribution after the identity
    rollout = attention_rollout(weights)
    assert rollout.shape == (6, 6) and rollout.dtype == torch.float32
    torch.testing.assert_close(rollout.sum(-1), torch.ones(6))
    assert bool((rollout >= 0).all())
    expected = torch.eye(6)
    for layer in weights:  # by hand: heads averaged, + I, rows renormalised, multiplied
        a = layer.mean(0) + torch.eye(6)
        expected = (a / a.sum(-1, keepdim=True)) @ expected
    torch.testing.assert_close(rollout, expected)
    # one layer whose rows sum to 1: exactly 0.5 A + 0.5 I
    torch.testing.assert_close(attention_rollout(weights[:1]), 0.5 * weights[0].mean(0) + 0.5 * torch.eye(6))


def test_rollout_takes_per_layer_arrays_and_refuses_bad_shapes():
    arrays = [np.full((2, 5, 5), 0.2, dtype=np.float32) for _ in range(3)]  # uniform attention
    rollout = attention_rollout(arrays)
    torch.testing.assert_close(rollout.sum(-1), torch.ones(5))
    torch.testing.assert_close(rollout, attention_rollout(torch.from_numpy(np.stack(arrays))))
    with pytest.raises(ValueError, match="at least one layer"):
        attention_rollout([])
    with pytest.raises(ValueError, match=r"\(layers, heads, T, T\)"):
        attention_rollout(torch.ones(2, 3, 4, 5))


# --- the explainer ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def explainer(tiny_vit_run) -> ImageExplainer:
    return load_explainer(tiny_vit_run)


def test_load_explainer_gives_an_image_explainer_with_patch_tokens(explainer):
    assert isinstance(explainer, ImageExplainer)
    info = explainer.info()
    assert (info["family"], info["input"], info["n_layers"], info["n_heads"]) == ("vit", "image", 2, 2)
    assert (info["image_size"], info["patch_size"], info["grid_size"]) == (8, 2, 4)
    assert explainer.token_labels()[:3] == ["CLS", "r1c1", "r1c2"] and len(explainer.token_labels()) == 17


def test_explain_an_image_file_bytes_and_test_pick(explainer, tmp_path):
    path = tmp_path / "seven.png"
    path.write_bytes(_png_bytes())
    by_path = explainer.explain(str(path))
    by_bytes = explainer.explain(path.read_bytes())
    assert by_path.text == str(path) and by_bytes.text.startswith("uploaded image")
    amap = by_path.attention[0]
    assert amap.weights.shape == (2, 2, 17, 17) and amap.query_tokens[0] == "CLS"
    torch.testing.assert_close(amap.weights, by_bytes.attention[0].weights)
    torch.testing.assert_close(amap.weights.sum(-1), torch.ones(2, 2, 17))
    out = by_path.output
    assert abs(sum(c["prob"] for c in out["classes"]) - 1) < 1e-3 and out["prediction"] in explainer.classes
    rollout = np.array(out["rollout"])
    assert rollout.shape == (4, 4) and abs(rollout.sum() + out["rollout_cls"] - 1) < 1e-3
    assert out["image"].startswith("data:image/png;base64,")
    pick = explainer.explain("test:3")
    assert pick.text.startswith("digits test image 3 (true class:")
    pixels, _ = explainer.test_image(3)
    torch.testing.assert_close(explainer.explain(pixels).attention[0].weights, pick.attention[0].weights)
    steps = explainer.steps(3, "encoder", 1, 1)
    assert len(steps["q"]) == 17 and len(steps["q"][0]) == explainer.info()["d_k"]
    assert steps["query_tokens"][0] == "CLS" and all(steps["mask"][0])


def test_explainer_refuses_bad_images_with_one_line(explainer, tmp_path):
    cases = [
        (b"not an image at all", "not an image file"),
        (truncated_png(), "truncated or corrupt"),
        (bomb_png(), "decompression-bomb guard"),
        (b"", "empty upload"),
        (str(tmp_path / "missing.png"), "image file not found"),
        (10_000, "out of range"),
        (np.zeros((8, 8, 3), np.uint8), "pixels must be uint8"),
    ]
    for image, message in cases:
        with pytest.raises(QkvError, match=message) as exc:
            explainer.explain(image)
        assert "\n" not in str(exc.value)
    assert explainer.examples(4)[0]["image"].startswith("data:image/png")


def test_read_image_takes_a_binary_file_object():
    data = io.BytesIO(_png_bytes(color=255))
    assert read_image(data, 4, 1).tolist() == [[[255]] * 4] * 4
    with pytest.raises(QkvError, match="^image data: not an image file"):
        read_image(io.BytesIO(b"junk"), 4, 1)


# --- qkv explain --input IMAGE --out DIR ------------------------------------------------


def test_cli_explain_writes_the_vit_pictures(tiny_vit_run, tmp_path, capsys):
    image = tmp_path / "input.png"
    image.write_bytes(_png_bytes(size=(30, 30), mode="RGB", color=(250, 250, 250)))
    assert (
        main(
            [
                "explain",
                str(tiny_vit_run),
                "--input",
                str(image),
                "--out",
                str(tmp_path / "pics"),
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out.split()
    names = {p.rsplit("/", 1)[-1] for p in printed}
    assert {
        "attention_layer1.png",
        "attention_layer2.png",
        "rollout.png",
        "classes.png",
        "attention_encoder.png",
        "steps.png",
        "explanation.json",
    } <= names
    for path in printed:
        with open(path, "rb") as f:
            assert len(f.read()) > 2000
    assert (
        main(
            [
                "explain",
                str(tiny_vit_run),
                "--input",
                str(tmp_path / "nope.png"),
                "--out",
                str(tmp_path / "x"),
            ]
        )
        == 2
    )
    assert "image file not found" in capsys.readouterr().err


def test_image_attention_figure_has_one_panel_per_head(explainer):
    from qkv.explain.plots import decode_png_data_url, plot_image_attention, plot_rollout

    result = explainer.explain(0)
    image = decode_png_data_url(result.output["image"])
    assert image.shape == (8, 8, 1) and image.dtype == np.uint8
    fig = plot_image_attention(image, result.attention[0].weights[1], 2, layer=1)
    assert len(fig.axes) == 2 + 1  # two heads, a colour bar
    assert len(plot_rollout(image, result.output["rollout"], 2).axes) == 3
    with pytest.raises(ValueError, match="tokens"):
        plot_image_attention(image, result.attention[0].weights[1], 4, layer=1)


def test_the_block_views_follow_every_token_and_the_lens_ends_at_the_prediction(explainer):
    """The ViT's head reads the pooled class token: one lens row per layer (the same for every
    token), whose last layer is the page's class probabilities."""
    out = explainer.explain("test:0").output
    block = out["block"]
    assert block["pooled"] and len(block["tokens"]) == 1 + explainer.config.n_patches
    assert len(block["layers"]) == explainer.config.n_layers
    last = block["layers"][-1]["lens"][0]
    best = max(out["classes"], key=lambda c: c["prob"])
    assert last[0][0] == best["label"] and last[0][1] == pytest.approx(best["prob"], abs=1e-4)
