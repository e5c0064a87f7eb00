"""The live page (``qkv explain RUN --live DIR``): in Chromium, the exported LM writes what
qkv writes (greedy) and what the page's sampler replayed in Python writes (seeded sampling), draws
the attention of the chosen layer and head as the model computes it, asks no host but its own,
and answers bad input with a message on the page and no error in the console."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import urlparse

import numpy as np
import pytest
import torch
from test_docs import _serve, built_site  # noqa: F401 - built_site is a fixture
from test_explain_browser import CHROMIUM, chromium_page

from qkv import runs
from qkv.cli import main
from qkv.errors import QkvError
from qkv.explain.live import mulberry32, page_sampler, write_live_page
from qkv.files import read_json, write_json
from qkv.hub.onnx_export import empty_cache, read_manifest
from qkv.inference.lm import generate_tokens

pytest.importorskip("onnxscript")
LIVE_DOCS = Path(__file__).resolve().parent.parent / "docs" / "live"  # the site's models, one folder each
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium (set QKV_CHROMIUM or install chromium)")


def served_live_page(run, folder: Path):
    """Write the run's live page into ``folder`` and serve it while the fixture lives:
    yields ``(base URL, folder)``."""
    write_live_page(run, folder)
    server, base = _serve(folder)
    yield base, folder
    server.shutdown()


@pytest.fixture(scope="module")
def site(tiny_runs, tmp_path_factory):
    """The live page of the tiny LM, served over HTTP: ``(base URL, folder)``."""
    yield from served_live_page(tiny_runs["lm"], tmp_path_factory.mktemp("live") / "site")


def stayed_on_site(base: str, requests: list[str], errors: list[str]) -> None:
    """The page asked no host but its own and logged no console error."""
    assert all(url.startswith(base) for url in requests), [u for u in requests if not u.startswith(base)]
    assert not errors, errors


def run_page(page, base: str, prompt: str, new: bool = False, **fields: str) -> str:
    """Open the page, type ``prompt`` and the ``fields``, generate; the text the model wrote
    (``new``: the whole output box, a translation; else the LM's continuation)."""
    page.goto(base)
    page.wait_for_selector('body[data-ready="1"]', timeout=60_000)
    page.fill("#prompt", prompt)
    for name, value in fields.items():
        page.fill(f"#{name}", value)
    page.click("#generate")
    page.wait_for_selector('body[data-done="1"]', timeout=60_000)
    if new:
        return page.locator("#output").inner_text()
    return page.locator("#output .new").inner_text() if page.locator("#output .new").count() else ""


@pytest.fixture(scope="module")
def translator_site(tiny_runs, tmp_path_factory):
    """The live page of the tiny translator, served: ``(base URL, folder)``."""
    yield from served_live_page(tiny_runs["translation"], tmp_path_factory.mktemp("live_mt") / "site")


def test_a_typed_german_sentence_translates_as_qkv_translate_does(translator_site, tiny_runs):
    from qkv.inference.search import greedy_decode
    from qkv.inference.translator import Translator

    base, _ = translator_site
    translator = Translator.from_run(tiny_runs["translation"], beam_size=1)
    model, tok = runs.load_run(tiny_runs["translation"])
    cfg = model.config
    with chromium_page() as (page, requests, errors):
        for sentence in ("Ein Mann fährt mit dem Fahrrad.", "Eine Frau liest ein Buch im Park."):
            expected = translator.translate([sentence])[0]
            assert run_page(page, base, sentence, new=True) == expected
            src = torch.tensor([tok.encode(sentence) + [cfg.eos_id]])
            written = greedy_decode(model, src)[0]
            assert page.evaluate("window.live.tokens") == [cfg.bos_id, *written]
            with torch.no_grad():  # the drawn cross-attention is the model's
                memory, src_mask, _ = model.encode(src)
                _, _, cross = model.decode(
                    torch.tensor([[cfg.bos_id, *written]]), memory, src_mask, need_weights=True
                )
            drawn = page.evaluate("Array.from(window.live.attention.data)")
            assert torch.allclose(
                torch.tensor(drawn).view_as(torch.stack(cross)), torch.stack(cross), atol=1e-4
            )
        run_page(page, base, "   ", new=True)
        assert "type a sentence first" in page.locator("#message").inner_text()
        stayed_on_site(base, requests, errors)


@pytest.fixture(scope="module")
def vit_site(tiny_vit_run, tmp_path_factory):
    """The live page of the tiny ViT (8 × 8 digits), served: ``(base URL, folder)``."""
    yield from served_live_page(tiny_vit_run, tmp_path_factory.mktemp("live_vit") / "site")


def open_image(page, base: str, path: Path) -> None:
    page.goto(base)
    page.wait_for_selector('body[data-ready="1"]', timeout=60_000)
    page.set_input_files("#file", str(path))
    page.wait_for_selector('body[data-done="1"]', timeout=60_000)


def test_an_opened_image_is_classified_as_the_model_does(vit_site, tiny_vit_run, tmp_path):
    from PIL import Image

    from qkv.data.images import to_model_input

    base, _ = vit_site
    model, _ = runs.load_run(tiny_vit_run)
    size = model.config.image_size
    image = np.random.default_rng(0).integers(0, 256, (size, size), dtype=np.uint8)
    Image.fromarray(image, "L").save(tmp_path / "digit.png")
    (tmp_path / "notes.png").write_text("not an image", encoding="utf-8")
    with torch.no_grad():
        out = model(to_model_input(image[None, ..., None]), need_weights=True)
    with chromium_page() as (page, requests, errors):
        open_image(page, base, tmp_path / "digit.png")
        probs = torch.tensor(page.evaluate("window.live.probs"))
        weights = torch.tensor(page.evaluate("Array.from(window.live.attention.data)"))
        assert torch.allclose(probs, out.logits.softmax(-1)[0], atol=1e-4)
        assert torch.allclose(weights.view(-1), torch.stack(out.attentions).view(-1), atol=1e-4)
        classes = read_classes(tiny_vit_run)
        assert page.locator("#output").inner_text().startswith(classes[int(probs.argmax())])
        open_image(page, base, tmp_path / "notes.png")
        assert "notes.png is not an image" in page.locator("#message").inner_text()
        stayed_on_site(base, requests, errors)


@pytest.fixture(scope="module")
def caption_site(tiny_caption_run, tmp_path_factory):
    """The live page of the tiny captioner (56 × 56 scenes, 4 × 4 patches), served."""
    yield from served_live_page(tiny_caption_run, tmp_path_factory.mktemp("live_caption") / "site")


def test_a_composed_scene_is_captioned_as_qkv_caption_does(caption_site, tiny_caption_run):
    """Garments picked into the grid make the scene qkv.data.scenes paints (pixel for pixel), and
    the page writes qkv caption's greedy caption with the model's cross-attention."""
    from qkv.data.images import load_fashion_mnist
    from qkv.data.scenes import CELL
    from qkv.inference.caption import Captioner

    base, _ = caption_site
    test = load_fashion_mnist("test")
    captioner = Captioner.from_run(tiny_caption_run, beam_size=1)
    layouts = [{0: (4, 0), 3: (8, 1)}, {1: (5, 2), 2: (5, 3), 3: (9, 0)}]  # cell: (label, k-th image)
    with chromium_page() as (page, requests, errors):
        page.goto(base)
        page.wait_for_selector('body[data-ready="1"]', timeout=60_000)
        for layout in layouts:
            page.click("#empty")
            scene = np.zeros((56, 56, 1), np.uint8)
            for cell, (label, k) in layout.items():
                page.click(f'#grid button[data-cell="{cell}"]')
                page.click(f'#palette canvas[data-label="{label}"][data-index="{k}"]')
                row, col = divmod(cell, 2)
                image = test.images[np.flatnonzero(test.labels == label)[k]]
                scene[row * CELL : (row + 1) * CELL, col * CELL : (col + 1) * CELL] = image
            page.wait_for_selector('body[data-done="1"]', timeout=60_000)
            pixels = np.rint((np.array(page.evaluate("window.live.pixels")) + 1) * 127.5)
            np.testing.assert_array_equal(pixels, scene.ravel())  # the scene, pixel for pixel
            ids = captioner.caption_ids(scene[None])[0]
            assert page.evaluate("window.live.tokens") == [captioner.config.bos_id, *ids]
            assert page.locator("#output").inner_text() == captioner.caption(scene[None])[0]
            assert page.locator("#words button").count() == len(ids)
            cross = torch.tensor(captioner.cross_attention(scene, ids))  # (L, H, T, N)
            drawn = torch.tensor(page.evaluate("Array.from(window.live.attention.data)"))
            drawn = drawn.view(cross.shape[0], cross.shape[1], len(ids) + 1, -1)[:, :, : len(ids)]
            assert torch.allclose(drawn, cross, atol=1e-4)
        page.click("#empty")
        page.click("#generate")
        page.wait_for_selector('body[data-done="1"]', timeout=60_000)
        assert "put a garment in the grid first" in page.locator("#message").inner_text()
        stayed_on_site(base, requests, errors)


def read_classes(run_dir) -> list[str]:
    return read_json(Path(run_dir) / "task.json")["classes"]


def test_mulberry32_is_the_reference_generator():
    # the first draws of the published JavaScript mulberry32 (a|=0; a=a+0x6D2B79F5|0; ...), run
    # with node: seed 0 and seed 7
    draws = mulberry32(0)
    assert [next(draws) for _ in range(3)] == [0.26642920868471265, 0.0003297457005828619, 0.2232720274478197]
    draws = mulberry32(7)
    assert [next(draws) for _ in range(2)] == [0.011704753153026104, 0.06195825757458806]


def test_page_sampler_keeps_top_k_and_follows_the_draw():
    logits = [0.0, 3.0, 3.0, -1.0]
    assert page_sampler(logits, 0.5, 0, None) == 1  # greedy: the first largest
    assert page_sampler(logits, 0.0, 1.0, 2) == 1 and page_sampler(logits, 0.99, 1.0, 2) == 2
    assert page_sampler(logits, 0.999, 1.0, None) == 3  # every id can come out without top-k
    with pytest.raises(ValueError):
        page_sampler(logits, 0.5, -1.0, None)


def test_greedy_and_seeded_sampling_write_what_python_writes(site, tiny_runs):
    base, _ = site
    model, tok = runs.load_run(tiny_runs["lm"])
    prompt = tok.encode("ROMEO:")
    greedy = tok.decode(generate_tokens(model, [prompt], 50, do_sample=False)[0])
    draws, ids = mulberry32(7), list(prompt)
    with torch.no_grad():
        for _ in range(50):
            logits = model(torch.tensor([ids])).logits[0, -1].tolist()
            ids.append(page_sampler(logits, next(draws), 0.8, 10))
    sampled = tok.decode(ids[len(prompt) :])
    with chromium_page() as (page, requests, errors):
        assert run_page(page, base, "ROMEO:", n="50", temperature="0") == greedy
        assert (
            run_page(page, base, "ROMEO:", n="50", temperature="0.8", **{"top-k": "10", "seed": "7"})
            == sampled
        )
        stayed_on_site(base, requests, errors)


def test_the_attention_drawn_is_the_models(site, tiny_runs):
    base, _ = site
    model, tok = runs.load_run(tiny_runs["lm"])
    with chromium_page() as (page, _, errors):
        run_page(page, base, "ROMEO:", n="10", temperature="0")
        page.select_option("#layer", "1")
        page.select_option("#head", "1")
        assert page.locator("#attention").get_attribute("data-layer") == "1"
        tokens = page.evaluate("window.live.tokens")
        dims = page.evaluate("window.live.attention.dims")
        weights = page.evaluate(
            "(() => { const a = window.live.attention, t = a.dims[3], at = (a.dims[2] + 1) * t * t;"
            " return Array.from(a.data.slice(at, at + t * t)); })()"
        )  # layer 1, head 1
        assert not errors, errors
    with torch.no_grad():
        ref = model(torch.tensor([tokens]), need_weights=True).attentions[1][0, 1]  # (T, T)
    assert dims == [2, 1, 2, len(tokens), len(tokens)]
    assert torch.allclose(torch.tensor(weights).view(len(tokens), len(tokens)), ref, atol=1e-4)


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        ("", "type a prompt first"),
        ("R" * 64, "reads at most 64"),
        ("ROMEO: Zounds", "is not in the model's vocabulary"),
    ],
)
def test_bad_input_is_a_message_on_the_page(site, prompt, message):
    base, _ = site
    with chromium_page() as (page, _, errors):
        run_page(page, base, prompt)
        assert message in page.locator("#message").inner_text()
        assert not errors, errors


def test_write_refuses_in_one_line(tiny_runs, tiny_caption_run, tmp_path, capsys):
    with pytest.raises(QkvError, match="runs lm, translation, vit, caption runs so far"):
        write_live_page(tiny_runs["diffusion-lm"], tmp_path / "dlm")
    assert not (tmp_path / "dlm").exists()
    other = shutil.copytree(tiny_caption_run, tmp_path / "folder-captioner")
    write_json(other / "task.json", {"task": "folder", "background": "white"})
    with pytest.raises(QkvError, match="composes garment scenes; this captioner's task is 'folder'"):
        write_live_page(other, tmp_path / "cap")
    assert not (tmp_path / "cap").exists()
    assert main(["explain", str(tiny_runs["lm"]), "--live", str(tmp_path / "page")]) == 0
    assert (tmp_path / "page" / "index.html").is_file() and (
        tmp_path / "page" / "model" / "decoder.onnx"
    ).is_file()
    assert main(["explain", str(tiny_runs["lm"]), "--live", str(tmp_path / "page")]) != 0
    assert "already exists and is not empty" in capsys.readouterr().err


def replay(folder: Path, prompt: str, n: int, temperature: float, top_k: int | None, seed: int) -> str:
    """What the live page writes, replayed in Python through the same ONNX graph (onnxruntime)
    and the page's sampler."""
    ort = pytest.importorskip("onnxruntime")
    cfg = read_manifest(folder)["config"]
    vocab = read_json(folder / "tokenizer.json")["model"]["vocab"]
    chars = {i: c for c, i in vocab.items()}
    session = ort.InferenceSession(str(folder / "decoder.onnx"), providers=["CPUExecutionProvider"])
    cache = empty_cache(SimpleNamespace(**cfg), 1)
    feed, out, draws = [[vocab[c] for c in prompt]], [], mulberry32(seed)
    for _ in range(n):
        logits, cache["past_keys"], cache["past_values"], _ = session.run(
            None, {"tokens": np.array(feed, np.int64), **cache}
        )
        out.append(page_sampler(logits[0, -1].tolist(), next(draws), temperature, top_k))
        feed = [[out[-1]]]
    return "".join(chars[i] for i in out)


def test_the_docs_site_runs_the_lm_in_the_browser(built_site):  # noqa: F811 - the fixture imported above
    """The site's live page (docs/live: the package's page and runtime; ?model=lm, the lm recipe's
    model in docs/live/lm) writes what the Python replay writes, from the site alone."""
    server, base = _serve(built_site)
    folder = LIVE_DOCS / "lm"
    try:
        with chromium_page() as (page, requests, errors):
            url = base + "live/?model=lm"
            assert run_page(page, url, "ROMEO:", n="50", temperature="0") == replay(
                folder, "ROMEO:", 50, 0, None, 0
            )
            seeded = {"temperature": "0.8", "top-k": "10", "seed": "7"}
            expected = replay(folder, "ROMEO:", 50, 0.8, 10, 7)
            assert run_page(page, url, "ROMEO:", n="50", **seeded) == expected
            stayed_on_site(base, requests, errors)
    finally:
        server.shutdown()


def greedy_replay(folder: Path, inputs: dict, limit: int) -> tuple[list[int], np.ndarray]:
    """Greedy decoding through an exported encoder-decoder (onnxruntime), as the page decodes:
    the ids written, and the cross-attention of one teacher-forced pass over them."""
    ort = pytest.importorskip("onnxruntime")
    cfg = read_manifest(folder)["config"]
    encoder, decoder = (
        ort.InferenceSession(str(folder / name), providers=["CPUExecutionProvider"])
        for name in ("encoder.onnx", "decoder.onnx")
    )
    (memory, *_) = encoder.run(None, inputs)
    feeds = {"memory": memory, **({"src": inputs["src"]} if "src" in inputs else {})}
    empty = empty_cache(SimpleNamespace(**cfg), 1)
    cache, token, out = dict(empty), cfg["bos_id"], []
    for _ in range(limit):
        logits, cache["past_keys"], cache["past_values"], *_ = decoder.run(
            None, {"tgt": np.array([[token]]), **feeds, **cache}
        )
        token = int(logits[0, -1].argmax())
        if token == cfg["eos_id"]:
            break
        out.append(token)
    *_, cross = decoder.run(None, {"tgt": np.array([[cfg["bos_id"], *out]]), **feeds, **empty})
    return out, cross


def test_the_docs_site_translates_in_the_browser(built_site):  # noqa: F811 - the fixture imported above
    """The site's translator (the demo run, float16 weights) writes what the onnxruntime replay of
    its committed graphs writes."""
    from tokenizers import Tokenizer

    server, base = _serve(built_site)
    folder = LIVE_DOCS / "translation"
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    eos = read_manifest(folder)["config"]["eos_id"]
    try:
        with chromium_page() as (page, requests, errors):
            for sentence in ("Ein Mann fährt mit dem Fahrrad.", "Zwei Hunde spielen im Schnee."):
                src = np.array([tok.encode(sentence, add_special_tokens=False).ids + [eos]])
                ids, _ = greedy_replay(folder, {"src": src}, src.shape[1] + 50)
                assert run_page(page, base + "live/?model=translation", sentence, new=True) == tok.decode(ids)
            stayed_on_site(base, requests, errors)
    finally:
        server.shutdown()


def test_the_docs_site_captions_a_composed_scene(built_site):  # noqa: F811 - the fixture imported above
    """The site's captioner: garments picked into the grid make the scene from the site's own
    garments.png, captioned as the onnxruntime replay of its committed graphs captions it."""
    from PIL import Image
    from tokenizers import Tokenizer

    server, base = _serve(built_site)
    folder = LIVE_DOCS / "caption"
    sheet = np.asarray(Image.open(folder / "garments.png"))
    cell = read_json(folder / "garments.json")["cell"]
    cfg = read_manifest(folder)["config"]
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    layout = {0: (4, 0), 1: (4, 1), 3: (8, 2)}  # two coats above a bag
    scene = np.zeros((2 * cell, 2 * cell), np.uint8)
    try:
        with chromium_page() as (page, requests, errors):
            page.goto(base + "live/?model=caption")
            page.wait_for_selector('body[data-ready="1"]', timeout=60_000)
            for at, (label, k) in layout.items():
                page.click(f'#grid button[data-cell="{at}"]')
                page.click(f'#palette canvas[data-label="{label}"][data-index="{k}"]')
                row, col = divmod(at, 2)
                scene[row * cell : (row + 1) * cell, col * cell : (col + 1) * cell] = sheet[
                    label * cell : (label + 1) * cell, k * cell : (k + 1) * cell
                ]
            page.wait_for_selector('body[data-done="1"]', timeout=60_000)
            pixels = (scene / 127.5 - 1).astype(np.float32)[None, None]
            ids, cross = greedy_replay(folder, {"images": pixels}, cfg["max_len"] - 1)
            assert page.locator("#output").inner_text() == tok.decode(ids)
            drawn = np.array(page.evaluate("Array.from(window.live.attention.data)"), np.float32)
            np.testing.assert_allclose(drawn, cross.ravel(), atol=1e-4)
            stayed_on_site(base, requests, errors)
    finally:
        server.shutdown()


def test_a_model_name_that_is_not_a_folder_name_is_refused_on_the_page(site):
    base, _ = site
    with chromium_page() as (page, requests, errors):
        page.goto(base + "?model=../secret")
        page.wait_for_function("document.getElementById('message').textContent.length > 0", timeout=60_000)
        assert 'no model named "../secret"' in page.locator("#message").inner_text()
        assert not any("secret" in urlparse(url).path for url in requests) and not errors, (requests, errors)


def test_the_docs_site_classifies_an_opened_image(built_site, tmp_path):  # noqa: F811 - the fixture imported above
    """The site's ViT: an opened image gets the probabilities the onnxruntime replay of its
    committed graph gives the same pixels."""
    from PIL import Image

    ort = pytest.importorskip("onnxruntime")
    folder = LIVE_DOCS / "vit"
    cfg = read_manifest(folder)["config"]
    size = cfg["image_size"]
    image = np.zeros((size, size), np.uint8)
    image[4:-4, size // 2 - 3 : size // 2 + 3] = 220  # a bar: trouser-like
    Image.fromarray(image, "L").save(tmp_path / "bar.png")
    graph = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    logits, *_ = graph.run(None, {"images": (image / 127.5 - 1).astype(np.float32)[None, None]})
    expected = torch.tensor(logits[0]).softmax(-1)
    server, base = _serve(built_site)
    try:
        with chromium_page() as (page, requests, errors):
            open_image(page, base + "live/?model=vit", tmp_path / "bar.png")
            assert torch.allclose(torch.tensor(page.evaluate("window.live.probs")), expected, atol=1e-4)
            stayed_on_site(base, requests, errors)
    finally:
        server.shutdown()
