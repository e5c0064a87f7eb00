"""Explaining a captioner: each generated word's cross-attention over the image (Show, Attend
and Tell's figure) on the standalone page, in the PNG pictures and in ``qkv.show``; the page's
numbers are the model's own."""

from __future__ import annotations

import base64
import html
import io
import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import qkv
from qkv import runs
from qkv.cli import main
from qkv.data.images import to_model_input
from qkv.errors import QkvError
from qkv.explain import ExplainerPage
from qkv.explain.caption import CaptionExplainer
from qkv.explain.plots import plot_caption_attention, plot_caption_heads
from qkv.inference.search import beam_search, greedy_decode
from qkv.recipes.loading import load_explainer

DATA = Path(os.environ.get("QKV_DATA_DIR", Path(__file__).resolve().parents[2] / "shared" / "data"))
CHROMIUM = os.environ.get("QKV_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def explainer(tiny_caption_run) -> CaptionExplainer:
    return load_explainer(tiny_caption_run)


@pytest.fixture(scope="module")
def image_file(tmp_path_factory) -> Path:
    """A 60 × 60 grey PNG (resized to the model's 56 × 56): a bright block on black."""
    pixels = np.zeros((60, 60), dtype=np.uint8)
    pixels[6:30, 34:56] = 220
    path = tmp_path_factory.mktemp("images") / "scene.png"
    Image.fromarray(pixels).save(path)
    return path


def _page_data(doc: str) -> dict:
    """The JSON a standalone page embeds (what its script draws)."""
    found = re.search(r'<script type="application/json" id="qkv-data">(.*?)</script>', doc, re.S)
    assert found is not None
    return json.loads(found.group(1))


def _pixels(data_url: str) -> np.ndarray:
    """uint8 ``(H, W, C)`` of a ``data:image/png;base64,`` URL."""
    with Image.open(io.BytesIO(base64.b64decode(data_url.split(",", 1)[1]))) as img:
        arr = np.array(img, dtype=np.uint8)
    return arr[..., None] if arr.ndim == 2 else arr


def _model_word_maps(
    run: Path, pixels: np.ndarray, ids: list[int], spans: list[tuple[int, int]]
) -> np.ndarray:
    """By hand: CaptionModel.forward(need_weights=True) on bos + ids, each decoder layer's
    cross-attention rows of a word's pieces averaged, as ``(n_words, L, H, G, G)``."""
    model, _ = runs.load_run(run, family="caption")
    cfg = model.config
    with torch.no_grad():
        out = model(to_model_input(pixels[None]), torch.tensor([[cfg.bos_id, *ids]]), need_weights=True)
    cross = torch.stack([w[0] for w in out.cross_attentions])  # (L, H, 1 + T, N)
    g = cfg.grid_size
    return np.stack([cross[:, :, a].reshape(cross.shape[0], cross.shape[1], g, g).numpy() for a, b in spans])


def test_the_pages_word_maps_are_the_models_cross_attention(tiny_caption_run, image_file, tmp_path):
    several = []  # words of several pieces: their map is the mean of the pieces' rows
    for beam in (1, 3):
        page = qkv.show(tiny_caption_run, str(image_file), beam_size=beam)
        data = _page_data(page.save(tmp_path / f"beam{beam}.html").read_text(encoding="utf-8"))
        out = data["explanation"]["output"]
        assert data["explanation"]["family"] == "caption" and data["info"]["input"] == "image"
        assert out["decoding"] == ("greedy decoding" if beam == 1 else "beam search, beam size 3")
        pixels = _pixels(out["image"])
        assert pixels.shape == (56, 56, 1)
        # the caption is the model's own decoding of these pixels
        model, _ = runs.load_run(tiny_caption_run, family="caption")
        x = to_model_input(pixels[None])
        with torch.no_grad():
            ids = greedy_decode(model, x)[0] if beam == 1 else beam_search(model, x, beam)[0]
        assert out["ids"] == ids
        words = out["words"]
        spans = [(w["start"], w["end"]) for w in words]
        assert [i for a, b in spans for i in range(a, b)] == list(range(len(ids)))  # every piece, once
        assert len(words) > 1 and " ".join(w["text"] for w in words) == out["text"]
        several += [w["text"] for w in words if w["end"] - w["start"] > 1]
        want = _model_word_maps(tiny_caption_run, pixels, ids, spans)
        got = np.array([w["maps"] for w in words], dtype=float).reshape(want.shape)
        assert got.shape[1:] == (2, 2, 4, 4)
        np.testing.assert_allclose(got, want, atol=1e-6, rtol=0)
        np.testing.assert_allclose(got.sum((-1, -2)), 1.0, atol=1e-5)  # a distribution over patches
    assert several, "no word of several pieces: the mean over pieces went untested"


def test_explanation_holds_every_kind_and_the_cross_rows_match_the_word_maps(explainer, image_file):
    result = explainer.explain(str(image_file), merge_words=False)
    assert result.text == str(image_file)
    kinds = {a.kind: a for a in result.attention}
    assert list(kinds) == ["encoder", "decoder", "cross"]
    out = result.output
    t = len(out["ids"])
    assert kinds["encoder"].weights.shape == (2, 2, 16, 16) and kinds["encoder"].query_tokens[:2] == [
        "r1c1",
        "r1c2",
    ]
    assert (
        kinds["decoder"].weights.shape == (2, 2, 1 + t, 1 + t) and kinds["decoder"].query_tokens[0] == "<bos>"
    )
    cross = kinds["cross"]
    assert cross.weights.shape == (2, 2, 1 + t, 16) and cross.query_tokens[-1] == "<eos>"
    for w in out["words"]:
        rows = cross.weights[:, :, w["start"]].reshape(2, 2, 4, 4).numpy()  # the first piece's
        np.testing.assert_allclose(np.array(w["maps"]), rows, atol=1e-6)
    steps = explainer.steps(str(image_file), "cross", 1, 1)
    assert len(steps["q"]) == 1 + t and len(steps["k"]) == 16
    info = explainer.info()
    assert (info["family"], info["grid_size"], info["map_grid"], info["layers_per_kind"]["cross"]) == (
        "caption",
        4,
        4,
        2,
    )


def test_cli_writes_the_pictures_and_the_page(tiny_caption_run, image_file, tmp_path, capsys):
    pics = tmp_path / "pics"
    assert (
        main(
            ["explain", str(tiny_caption_run), "--input", str(image_file), "--out", str(pics), "--beam", "1"]
        )
        == 0
    )
    names = {Path(p).name for p in capsys.readouterr().out.split()}
    assert {
        "caption_attention.png",
        "caption_attention_layer1.png",
        "caption_attention_layer2.png",
        "attention_cross.png",
        "steps.png",
        "explanation.json",
    } <= names
    for name in names - {"explanation.json"}:
        with Image.open(pics / name) as img:
            assert img.format == "PNG" and img.width > 200
    saved = json.loads((pics / "explanation.json").read_text(encoding="utf-8"))
    assert saved["family"] == "caption" and all(len(w["maps"]) == 2 for w in saved["output"]["words"])
    page = tmp_path / "page.html"
    assert main(["explain", str(tiny_caption_run), "--input", str(image_file), "--html", str(page)]) == 0
    doc = page.read_text(encoding="utf-8")
    assert 'id="caption-card"' in doc and "Content-Security-Policy" in doc and "<script src=" not in doc
    assert _page_data(doc)["explanation"]["output"]["decoding"] == "greedy decoding"  # the run's own beam


def test_the_page_decodes_as_qkv_caption_does(explainer, tiny_caption_run, image_file, capsys):
    """Without a beam size the page (and qkv explain) decode as the run does (its beam_size: 1
    here), so the page and qkv caption give one caption for one image; --beam still chooses."""
    page = explainer.explain(str(image_file)).output
    assert page["decoding"] == "greedy decoding"
    assert main(["caption", str(tiny_caption_run), str(image_file)]) == 0
    assert page["text"] in capsys.readouterr().out
    beam = explainer.explain(str(image_file), qkv.explain.DecodingOptions(beam_size=3)).output
    assert beam["decoding"] == "beam search, beam size 3"


def test_caption_figures_have_one_panel_per_word(explainer):
    result = explainer.explain(0)
    assert result.text.startswith("scenes test image 0 (reference: ")
    image = _pixels(result.output["image"])
    words = ["a", "coat", "above", "two", "bags"]
    maps = np.random.default_rng(0).dirichlet(np.ones(16), size=(5, 2, 2)).reshape(5, 2, 2, 4, 4)
    fig = plot_caption_attention(image, words, maps)
    assert len(fig.axes) == 1 + 5 + 1  # the input, a panel per word, a colour bar
    assert "mean of heads" in fig._suptitle.get_text() and "layer 2 of 2" in fig._suptitle.get_text()
    assert "head 1" in plot_caption_attention(image, words, maps, layer=0, head=0)._suptitle.get_text()
    assert len(plot_caption_heads(image, words, maps, 1).axes) == 5 * 3 + 1  # words × (heads, mean) + bar
    assert len(plot_caption_attention(image, [], maps[:0]).axes) == 1  # an empty caption: the input
    with pytest.raises(ValueError, match="maps must be"):
        plot_caption_attention(image, words, maps[:2])


def test_show_gives_a_notebook_page_for_every_kind_of_image_input(explainer, tiny_caption_run, image_file):
    page = qkv.show(explainer, np.asarray(Image.open(image_file)), beam_size=1)
    assert isinstance(page, ExplainerPage) and page.explanation.text == "array 60×60"
    frame = page._repr_html_()
    assert frame.startswith("<iframe srcdoc=") and 'sandbox="allow-scripts"' in frame
    assert "caption-card" in html.unescape(frame)
    from_bytes = qkv.explain.standalone_page(explainer, image_file.read_bytes(), beam_size=1)
    from_path = qkv.show(tiny_caption_run, image_file, beam_size=1)
    words = [p.explanation.output["words"] for p in (page, from_bytes, from_path)]
    assert words[0] == words[1] == words[2]


def test_a_wrong_input_is_a_one_line_error(explainer, tiny_caption_run, tmp_path, capsys):
    from PIL import Image

    notes = tmp_path / "notes.txt"
    notes.write_text("not an image\n", encoding="utf-8")
    tiny = tmp_path / "tiny.png"
    Image.new("L", (1, 1), 200).save(tiny)
    small = io.BytesIO()
    Image.new("L", (16000, 1), 200).save(small, format="PNG")
    cases = [
        (str(tiny), r"1x1 pixels is too small \(at least 4x4\)"),  # as qkv caption refuses it
        (small.getvalue(), "16000x1 pixels is too small"),
        (str(notes), "not an image"),
        (b"not an image at all", "not an image"),
        (b"", "empty upload"),
        (str(tmp_path / "missing.png"), "image file not found"),
        ({"not": "an image"}, "takes an image"),
        (np.zeros((56, 56), dtype=np.float32), "uint8"),
    ]
    for bad, message in cases:
        with pytest.raises(QkvError, match=message) as caught:
            qkv.show(explainer, bad)
        assert "\n" not in str(caught.value)
    with pytest.raises(QkvError, match="beam size must be between 1"):
        explainer.explain(0, qkv.explain.DecodingOptions(beam_size=10_000))
    assert (
        main(["explain", str(tiny_caption_run), "--input", str(notes), "--html", str(tmp_path / "p.html")])
        == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "not an image" in err[0]
    assert not (tmp_path / "p.html").exists()
    assert (
        main(["explain", str(tiny_caption_run), "--input", str(tiny), "--html", str(tmp_path / "p.html")])
        == 2
    )
    assert "too small" in capsys.readouterr().err and not (tmp_path / "p.html").exists()


@pytest.mark.skipif(
    not (DATA / "fashion-mnist" / "t10k-images-idx3-ubyte.gz").is_file() and not os.environ.get("CI"),
    reason=f"Fashion-MNIST not found under {DATA} (set QKV_DATA_DIR)",
)
def test_served_page_answers_for_test_images_and_uploads(explainer, image_file):
    from fastapi.testclient import TestClient

    from qkv.explain.server import create_app

    client = TestClient(create_app(explainer))
    info = client.get("/api/info").json()
    assert info["family"] == "caption" and info["input"] == "image" and info["max_upload_bytes"] > 0
    examples = client.get("/api/image/examples").json()["examples"]
    assert len(examples) == 6 and examples[0]["image"].startswith("data:image/png;base64,")
    picked = client.post("/api/image/explain?example=2")
    assert picked.status_code == 200 and picked.json()["input"].startswith("scenes test image 2")
    uploaded = client.post("/api/image/explain", content=image_file.read_bytes())
    assert uploaded.status_code == 200 and uploaded.json()["output"]["words"] is not None
    steps = client.post("/api/image/steps?layer=1&head=0", content=image_file.read_bytes())
    assert steps.status_code == 200 and steps.json()["kind"] == "encoder"
    bad = client.post("/api/image/explain", content=b"not an image")
    assert bad.status_code == 422 and "not an image" in bad.json()["detail"]


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium installed (Debian: apt-get install chromium)")
def test_the_page_draws_one_overlay_per_word_in_a_browser(explainer, image_file, tmp_path):
    playwright = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
    page = qkv.show(explainer, str(image_file), beam_size=1)
    path = page.save(tmp_path / "caption.html")
    requests, errors = [], []
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        tab = browser.new_page(viewport={"width": 1400, "height": 1000})
        tab.on("request", lambda req: requests.append(req.url))
        tab.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
        tab.on("pageerror", lambda exc: errors.append(str(exc)))
        tab.goto(path.resolve().as_uri())
        tab.wait_for_selector('body[data-ready="1"]', timeout=30_000)
        tab.wait_for_selector('body[data-steps-ready="1"]', timeout=30_000)
        tiles = tab.locator("#word-maps .word-map").count()
        words = tab.locator("#word-maps figcaption").all_inner_texts()
        hidden = tab.evaluate("() => [$('caption-card').hidden, $('image-card').hidden]")
        tab.select_option("#word-head", "1")
        tab.select_option("#word-layer", "0")
        after = tab.locator("#word-maps .word-map").count()
        output = tab.locator("#output").inner_text()
        dims = tab.locator("#dims").inner_text()
        browser.close()
    out = page.explanation.output
    assert errors == [] and requests == [path.resolve().as_uri()]
    assert tiles == after == 1 + len(out["words"]) and words[1:] == [w["text"] or "∅" for w in out["words"]]
    assert hidden == [False, True]  # the word card shows; the ViT's class-token card does not
    assert "greedy decoding" in output
    assert dims.startswith("encoder 2 + decoder 2 layers × 2 heads")  # both stacks, not the encoder's alone


def test_the_block_follows_the_captions_tokens_through_the_decoder(explainer, image_file):
    """The captioner's block views follow the decoder's tokens (its input: <bos> and the
    caption), whose last lens row is the next piece the decoder chose."""
    result = explainer.explain(str(image_file), merge_words=False)  # the block follows pieces
    block = result.output["block"]
    assert block["stack"] == "decoder" and len(block["layers"]) == explainer.config.n_decoder_layers
    decoder = next(a for a in result.attention if a.kind == "decoder")
    assert len(block["tokens"]) == len(decoder.query_tokens)
    for layer in block["layers"]:
        assert [len(s["out_norm"]) for s in layer["sublayers"]] == [len(block["tokens"])] * 3
        assert [s["name"] for s in layer["sublayers"]] == ["self_attn", "cross_attn", "ffn"]


def test_the_standalone_pages_block_views_follow_a_clicked_piece(explainer, image_file, tmp_path):
    """The captioner's standalone page (qkv.show): a click on a piece of the caption shows its
    residual stream, norms, FFN neurons, logit lens and sampler, and the page fetches nothing."""
    pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
    from test_explain_browser import check_block_views, chromium_page

    page = qkv.show(explainer, str(image_file), beam_size=1)
    path = page.save(tmp_path / "caption.html")
    with chromium_page() as (tab, requests, errors):
        tab.goto(path.resolve().as_uri())
        tab.wait_for_selector('body[data-ready="1"]', timeout=30_000)
        check_block_views(tab, page.explanation.output["block"])
    assert errors == [] and requests == [path.resolve().as_uri()]
