"""End to end in a real headless browser: the explainer page of each model family.

Needs Debian's ``chromium`` (``.ci/run`` installs it) and the ``playwright`` Python package,
driven with ``executable_path`` set to the system browser (no browser download). Screenshots
go to ``$QKV_TEST_ARTIFACTS`` (default ``test-artifacts/``) as ``explain_<family>.png``.
"""

from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from pathlib import Path

import pytest

from qkv.explain.explainer import DecodingOptions
from qkv.explain.server import create_app, serve_in_thread
from qkv.recipes.loading import load_explainer

CHROMIUM = os.environ.get("QKV_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="no Chromium installed (Debian: apt-get install chromium; .ci/run installs it)"
)
playwright = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")

INPUTS = {
    "translation": "Ein Mann liest ein Buch.",
    "lm": "ROMEO:\nBut soft",
    "diffusion-lm": "ROMEO:\nBut soft, ____ light",
    "protein": "GIGKFLHSAKKFGKAFV",
}
ARTIFACTS = Path(os.environ.get("QKV_TEST_ARTIFACTS", "test-artifacts"))


@pytest.mark.parametrize("family", ["translation", "lm", "diffusion-lm", "protein"])
def test_page_types_input_and_renders_every_head(tiny_runs, family):
    explainer = load_explainer(tiny_runs[family])
    server, thread, base = serve_in_thread(create_app(explainer))
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    hosts = set()
    try:
        with playwright.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.on("request", lambda req: hosts.add(req.url.split("/")[2]))
            errors = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(base + "/")
            page.locator("#family", has_text=family).wait_for()  # /api/info fills in an example first
            page.fill("#input", INPUTS[family])
            page.click("#run")
            page.wait_for_selector('body[data-ready="1"]', timeout=60_000)
            page.wait_for_selector("#overview .head")
            heads = page.locator("#overview .head").count()
            info = explainer.info()
            assert heads == info["n_layers"] * info["n_heads"]
            page.locator("#steps").scroll_into_view_if_needed()
            page.wait_for_timeout(300)
            page.screenshot(path=str(ARTIFACTS / f"explain_{family}.png"), full_page=True)
            browser.close()
    finally:
        server.should_exit = True
        thread.join(timeout=10)
    assert not errors, errors
    assert hosts == {base.split("/")[2]}, f"the page asked other hosts: {hosts}"
    assert (ARTIFACTS / f"explain_{family}.png").stat().st_size > 10_000


def test_vit_page_uploads_an_image_and_draws_the_overlays(tiny_vit_run, tmp_path):
    """A ViT run: upload a PNG, the class-token overlay of every layer × head and the rollout
    are drawn over the image, the Eq. 1 step-through has the patches as tokens; then a
    test-set thumbnail runs too. Screenshot: ``explain_vit.png``."""
    from test_explain_vit import _png_bytes

    explainer = load_explainer(tiny_vit_run)
    info = explainer.info()
    server, thread, base = serve_in_thread(create_app(explainer))
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    hosts, errors = set(), []
    try:
        with playwright.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.on("request", lambda req: hosts.add(req.url.split("/")[2]))
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(base + "/")
            page.wait_for_selector("#examples .example")
            assert page.locator("#input").is_hidden() and page.locator("#image-card").is_hidden()
            page.set_input_files(
                "#file",
                files=[
                    {
                        "name": "upload.png",
                        "mimeType": "image/png",
                        "buffer": _png_bytes(size=(40, 40), color=230),
                    }
                ],
            )
            page.wait_for_selector('body[data-ready="1"]', timeout=60_000)
            page.wait_for_selector('body[data-steps-ready="1"]', timeout=60_000)
            assert page.locator("#image-overview .head").count() == info["n_layers"] * info["n_heads"]
            assert "uploaded image" in page.locator("#output").inner_text()
            # the overlay is drawn: orange patches over the (grey) image
            warm = page.evaluate("""() => {
                const cv = document.getElementById("overlay"), ctx = cv.getContext("2d");
                const d = ctx.getImageData(0, 0, cv.width, cv.height).data;
                let n = 0;
                for (let i = 0; i < d.length; i += 4) if (d[i] > d[i + 2] + 40) n++;
                return n / (d.length / 4);
            }""")
            assert warm > 0.5, (
                f"only {warm:.0%} of the overlay is tinted"
            )  # near-uniform attention: all of it
            assert page.locator("#step-weights tbody tr").count() == 1 + info["grid_size"] ** 2
            page.locator("#image-overview .head").last.click()
            assert (
                page.locator("#overlay-caption")
                .inner_text()
                .startswith(f"Layer {info['n_layers']}, head {info['n_heads']}")
            )
            page.locator("#image-card").scroll_into_view_if_needed()
            page.wait_for_timeout(200)
            page.screenshot(path=str(ARTIFACTS / "explain_vit.png"), full_page=True)
            page.locator("#examples .example").nth(1).click()
            # (a locator, not wait_for_function: its polling evaluates strings, which the CSP forbids)
            page.locator("#output", has_text="digits test image").wait_for(timeout=60_000)
            browser.close()
    finally:
        server.should_exit = True
        thread.join(timeout=10)
    assert not errors, errors
    assert hosts == {base.split("/")[2]}, f"the page asked other hosts: {hosts}"
    assert (ARTIFACTS / "explain_vit.png").stat().st_size > 10_000


def test_served_minilm_page_outputs_the_pairs_cosine_similarity(tmp_path):
    """A converted MiniLM (a sentence encoder): typed as ``first ||| second``, the Output shows
    the pair's cosine similarity (the same as ``qkv similarity``); one sentence, what its
    embedding is made of. (The Output was empty for these runs.)"""
    from qkv.cli import main
    from qkv.errors import QkvError
    from qkv.hub.pretrained import locate
    from qkv.inference.text import TextEncoder

    try:
        locate("minilm")
    except QkvError as exc:
        pytest.skip(str(exc))
    run = tmp_path / "minilm"
    assert main(["convert", "hf", "minilm", str(run)]) == 0
    first, second = "A dog runs in the park.", "A puppy is running on the grass."
    cosine = TextEncoder.load(run).similarity(first, second)
    server, thread, base = serve_in_thread(create_app(load_explainer(run)))
    errors, outputs = [], []
    try:
        with playwright.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(base + "/")
            # /api/info fills the box with an example: type only after it has answered
            page.locator("#family", has_text="text").wait_for()
            for text in (f"{first} ||| {second}", first):
                page.fill("#input", text)
                page.click("#run")
                page.wait_for_selector('body[data-ready="1"]', timeout=60_000)
                outputs.append(page.locator("#output").inner_text())
            browser.close()
    finally:
        server.should_exit = True
        thread.join(timeout=10)
    assert not errors, errors
    assert f"cosine similarity {cosine:.3f}" in outputs[0] and 0.3 < cosine < 1
    assert "a sentence embedding of 384 numbers" in outputs[1] and "Its words closest to it" in outputs[1]
    assert "puppy" not in outputs[1] and "park" in outputs[1]  # the sentence's own words


def test_diffusion_page_shows_the_attention_at_a_clicked_step(tiny_runs):
    """A click on a token of the trajectory reruns the model and shows the attention on the
    input of the step that unmasked it (its masks drawn ▒)."""
    server, thread, base = serve_in_thread(create_app(load_explainer(tiny_runs["diffusion-lm"])))
    try:
        with playwright.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            page = browser.new_page()
            errors = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(base + "/")
            page.locator("#family", has_text="diffusion-lm").wait_for()
            page.fill("#input", "ROMEO: ____ light")  # characters of the tiny vocabulary
            page.fill("#temperature", "0")
            page.click("#run")
            page.wait_for_selector('body[data-ready="1"]', timeout=60_000)
            assert "input of step 3" in page.inner_text("#output")
            assert page.locator("#trajectory .traj-token:not(.given)").count() == 4
            first = page.locator('#trajectory .traj-token[title^="unmasked at step 0,"]')
            first.click()
            # a selector, not wait_for_function: the page's CSP forbids evaluating strings
            page.locator("#output", has_text="input of step 0").wait_for(timeout=60_000)
            page.wait_for_selector('body[data-ready="1"]', timeout=60_000)
            assert page.locator("#trajectory .traj-token.shown").count() == 1
            browser.close()
    finally:
        server.should_exit = True
        thread.join(timeout=10)
    assert not errors, errors


def check_block_views(page, block: dict) -> None:
    """The "follow a token" card of a page that has run: click a token, by mouse and by
    keyboard, and each view (residual stream, norms, FFN neurons, logit lens, sampler) shows
    that token's numbers; the sampler redraws for a new temperature and top-k."""
    page.wait_for_selector('body[data-block-ready="1"]', timeout=30_000)
    n_layers, tokens = len(block["layers"]), block["tokens"]
    buttons = page.locator("#block-tokens button")
    assert buttons.count() == len(tokens)
    assert buttons.nth(len(tokens) - 1).get_attribute("aria-pressed") == "true"  # the last, at first
    buttons.nth(0).click()
    assert buttons.nth(0).get_attribute("aria-pressed") == "true"
    assert page.locator("#block-stream .stream-row").count() == n_layers
    first = page.locator("#block-stream .stream-row").nth(0).inner_text()
    assert f"{block['layers'][0]['resid_pre'][0]:.2f}" in first  # the page's number is the block's
    sublayers = sum(len(layer["sublayers"]) for layer in block["layers"])
    assert page.locator("#block-norms tr").count() == 1 + sublayers
    assert page.locator("#block-ffn .ffn-layer").count() == n_layers
    assert f"neuron {block['layers'][0]['ffn_top'][0][0][0]}" in page.locator("#block-ffn").inner_text()
    assert page.locator("#lens-table tr").count() == 1 + n_layers
    top = block["layers"][-1]["lens"][0][0]
    assert f"{top[1] * 100:.1f}%" in page.locator("#lens-table tr").nth(n_layers).inner_text()
    page.locator("#block-tokens button").nth(1).focus()  # keyboard: Tab to a token, Enter
    page.keyboard.press("Enter")
    assert buttons.nth(1).get_attribute("aria-pressed") == "true"
    before = page.locator("#sampler-bars .bar-row").count()
    page.fill("#block-top-k", "2")
    page.locator("#sampler-bars .bar-row").nth(1).wait_for()
    assert page.locator("#sampler-bars .bar-row").count() == 2 <= before
    page.fill("#block-temperature", "0.1")
    assert (
        "2 kept" in page.locator("#sampler-note").inner_text()
        or "2 of" in page.locator("#sampler-note").inner_text()
    )


@contextmanager
def chromium_page():
    """``(page, requests, errors)``: a headless Chromium page, the URLs it requests and the
    errors it raises or logs to its console."""
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        requests, errors = [], []
        page.on("request", lambda req: requests.append(req.url))
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
        try:
            yield page, requests, errors
        finally:
            browser.close()


@pytest.mark.parametrize("family", ["translation", "lm"])
def test_a_clicked_token_shows_every_view_of_the_block(tiny_runs, family):
    explainer = load_explainer(tiny_runs[family])
    server, thread, base = serve_in_thread(create_app(explainer))
    try:
        with chromium_page() as (page, requests, errors):
            page.goto(base + "/")
            page.locator("#family", has_text=family).wait_for()
            page.fill("#input", INPUTS[family])
            if family == "translation":  # greedy, so the test's own explain() has the same output
                page.fill("#beam-size", "1")
            page.click("#run")
            page.wait_for_selector('body[data-ready="1"]', timeout=60_000)
            options = DecodingOptions(beam_size=1)  # an LM's block reads the prompt alone
            check_block_views(page, explainer.explain(INPUTS[family], options).output["block"])
            if family == "lm":  # the page's sampler is qkv.inference.sampling's (token 1 chosen)
                page.fill("#block-temperature", "0.7")
                page.fill("#block-top-k", "5")
                page.fill("#block-top-p", "0.8")
                shown = page.locator("#sampler-bars .bar-value").all_inner_texts()
                expected = _sampler_probs(explainer, INPUTS[family], 1, 0.7, 5, 0.8)
            page.locator("#block-card").screenshot(path=str(ARTIFACTS / f"explain_block_{family}.png"))
    finally:
        server.should_exit = True
        thread.join(timeout=10)
    assert not errors, errors
    assert {url.split("/")[2] for url in requests} == {base.split("/")[2]}
    if family == "lm":
        assert len(expected) >= 2  # top-p 0.8 keeps several of the untrained model's 5
        assert [float(v.rstrip(" %")) for v in shown] == pytest.approx(expected, abs=0.051)


def _sampler_probs(explainer, text, token, temperature, top_k, top_p) -> list[float]:
    """The percentages ``next_token_probs`` gives the kept tokens at ``token``, largest first."""
    import torch

    from qkv.explain.activations import record_activations
    from qkv.inference.sampling import next_token_probs

    with record_activations(explainer.model) as cache:
        explainer._prepared(text, None).forward(False)
    probs = next_token_probs(cache["logits"][0, token : token + 1], temperature, top_k, top_p)[0]
    kept = torch.sort(probs[probs > 0], descending=True).values
    return [round(100 * float(p), 1) for p in kept]
