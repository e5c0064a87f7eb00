"""The pages show only what answers the input on screen: in Chromium, a refused input (an empty
sentence, a 3,000-character one, a character outside an LM's vocabulary, a file that is not an
image) clears the last result on the live page and on the served page; the live translator names
the languages it translates and the characters its vocabulary lacks (as its tokenizer reads them:
<unk>); the live ViT's header gives the tokens an image is, not its position table's size."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import test_explain_live
from test_explain_browser import CHROMIUM, chromium_page
from test_explain_live import open_image, stayed_on_site

from qkv.explain.live import translation_languages, write_live_page
from qkv.files import write_json
from qkv.hub.onnx_export import read_manifest
from qkv.inference.translator import unknown_characters_note

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium (set QKV_CHROMIUM or install chromium)")
# the tiny runs' live pages, served: the fixtures of test_explain_live
site, translator_site, vit_site = (
    test_explain_live.site,
    test_explain_live.translator_site,
    test_explain_live.vit_site,
)
SENTENCE = "Ein Mann fährt mit dem Fahrrad."
UNKNOWN = "unknown characters (not in the model's vocabulary, read as <unk>): "


def load(page, base: str) -> None:
    page.goto(base)
    page.wait_for_selector('body[data-ready="1"]', timeout=60_000)


def submit(page, prompt: str) -> None:
    """Type ``prompt`` into the loaded page and run the model, without reloading the page (what
    the last input left on it stays unless the page clears it)."""
    page.fill("#prompt", prompt)
    page.click("#generate")
    page.wait_for_selector('body[data-done="1"]', timeout=60_000)


def attention_cleared(page) -> bool:
    """No attention held and the heatmap's canvas blank."""
    return page.evaluate(
        "(() => { const c = document.getElementById('attention');"
        " const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;"
        " return window.live.attention === null && d.every((v) => v === 0); })()"
    )


@pytest.mark.parametrize(
    ("bad", "message"),
    [("   ", "type a sentence first"), ("Ein Mann fährt. " * 188, "the model reads at most 64")],
)
def test_a_refused_sentence_clears_the_last_translation(translator_site, bad, message):
    base, _ = translator_site
    with chromium_page() as (page, requests, errors):
        load(page, base)
        submit(page, SENTENCE)
        assert page.locator("#output").inner_text() != "" and not attention_cleared(page)
        submit(page, bad)
        assert message in page.locator("#message").inner_text()
        assert page.locator("#output").inner_text() == ""
        assert attention_cleared(page) and page.evaluate("window.live.tokens.length") == 0
        stayed_on_site(base, requests, errors)


@pytest.mark.parametrize(
    ("bad", "message"), [("", "type a prompt first"), ("ROMEO: Zounds", "is not in the model's vocabulary")]
)
def test_a_refused_prompt_clears_the_last_text(site, bad, message):
    base, _ = site
    with chromium_page() as (page, requests, errors):
        load(page, base)
        page.fill("#n", "10")
        submit(page, "ROMEO:")
        assert page.locator("#output .new").count() == 1 and not attention_cleared(page)
        submit(page, bad)
        assert message in page.locator("#message").inner_text()
        assert page.locator("#output").inner_text() == "" and attention_cleared(page)
        stayed_on_site(base, requests, errors)


def test_a_file_that_is_not_an_image_clears_the_last_classes(vit_site, tmp_path):
    from PIL import Image

    base, _ = vit_site
    Image.fromarray(np.full((8, 8), 200, np.uint8), "L").save(tmp_path / "digit.png")
    (tmp_path / "notes.png").write_text("not an image", encoding="utf-8")
    with chromium_page() as (page, requests, errors):
        open_image(page, base, tmp_path / "digit.png")
        assert "%" in page.locator("#output").inner_text() and page.evaluate("window.live.probs") is not None
        page.set_input_files("#file", str(tmp_path / "notes.png"))
        page.wait_for_selector('body[data-done="1"]', timeout=60_000)
        assert "notes.png is not an image" in page.locator("#message").inner_text()
        assert page.locator("#output").inner_text() == "" and page.evaluate("window.live.probs") is None
        assert attention_cleared(page)
        stayed_on_site(base, requests, errors)


def test_the_vit_header_gives_the_tokens_of_an_image(vit_site, tiny_vit_run):
    """8 × 8 digits in 2 × 2 patches: 16 patches and the class token, 17 tokens (the position
    table holds the config's max_len, 1024)."""
    base, folder = vit_site
    assert read_manifest(folder / "model")["config"]["max_len"] == 1024
    with chromium_page() as (page, _, errors):
        load(page, base)
        about = page.locator("#about").inner_text()
        assert not errors, errors
    assert "an image of 8 × 8 pixels is 16 patches of 2 × 2 + the class token: 17 tokens" in about
    assert "1024" not in about and "context" not in about


def test_the_translator_names_its_languages(translator_site):
    """The tiny run's settings name no languages: the recipe's, German into English."""
    base, folder = translator_site
    assert read_manifest(folder / "model")["languages"] == {
        "source": {"code": "de", "name": "German"},
        "target": {"code": "en", "name": "English"},
    }
    with chromium_page() as (page, requests, errors):
        load(page, base)
        assert page.locator("#prompt-label").inner_text() == "Source: German (de)"
        assert page.locator("#output-label").inner_text() == "Translation: English (en)"
        assert page.locator("#generate").inner_text() == "Translate"
        assert "translation recipe's run (German (de) → English (en))" in page.locator("#about").inner_text()
        stayed_on_site(base, requests, errors)


def test_a_run_records_the_languages_its_page_names(tiny_runs, tmp_path):
    run = shutil.copytree(tiny_runs["translation"], tmp_path / "fr-en")
    write_json(run / "train_config.json", {"recipe": "translation", "src_lang": "fr", "tgt_lang": "en"})
    write_live_page(run, tmp_path / "page")
    languages = read_manifest(tmp_path / "page" / "model")["languages"]
    assert languages["source"] == {"code": "fr", "name": "French"}
    own = {"data": "antibodies.tsv", "columns": "heavy,light"}
    assert translation_languages(own) == {
        "source": {"code": None, "name": "heavy"},
        "target": {"code": None, "name": "light"},
    }
    assert translation_languages({"data": "pairs.tsv", "columns": None}) is None


def unknown_characters(tokenizer_json: Path, text: str) -> list[str]:
    """The characters of ``text`` the tokenizer reads as <unk>, as ``qkv translate`` finds them."""
    from qkv.data.tokenizers import SubwordTokenizer

    return SubwordTokenizer.load(tokenizer_json).unknown_characters(text)


def test_unknown_characters_are_named_beside_the_translation(translator_site, tiny_runs):
    """The translation stands (qkv translate's: the tiny model writes to its max_len, 64 tokens)
    and the characters read as <unk> are named under it."""
    from qkv.inference.translator import Translator

    base, folder = translator_site
    text = "Ein Mann 😀 fährt 中文 mit\tdem Fahrrad."
    expected = unknown_characters(folder / "model" / "tokenizer.json", text)
    assert {"😀", "中", "文", "\t"} <= set(expected)
    translation = Translator.from_run(tiny_runs["translation"], beam_size=1).translate([text])[0]
    with chromium_page() as (page, requests, errors):
        load(page, base)
        submit(page, text)
        warning = page.locator("#warning")
        assert warning.is_visible() and page.locator("#output").inner_text() == translation
        named = ", ".join(json.dumps(ch, ensure_ascii=False) for ch in expected)
        assert warning.inner_text() == UNKNOWN + named == unknown_characters_note(expected)
        submit(page, SENTENCE)  # every character known: no warning
        assert warning.is_hidden() and not unknown_characters(folder / "model" / "tokenizer.json", SENTENCE)
        stayed_on_site(base, requests, errors)


def test_a_refused_input_clears_the_served_pages_result(tiny_runs):
    """The served page (qkv explain --serve) of the LM: a prompt with a character outside the
    vocabulary is refused (a 422) and the last prompt's output and attention go."""
    from qkv.explain.server import create_app, serve_in_thread
    from qkv.recipes.loading import load_explainer

    server, thread, base = serve_in_thread(create_app(load_explainer(tiny_runs["lm"])))
    try:
        with chromium_page() as (page, _, errors):
            page.goto(base + "/")
            page.locator("#family", has_text="lm").wait_for()
            assert page.locator("#run").inner_text() == "Generate"
            page.fill("#input", "ROMEO:")
            page.click("#run")
            page.wait_for_selector('body[data-ready="1"]', timeout=60_000)
            assert page.locator("#output-text").count() == 1 and page.locator("#overview .head").count() > 0
            page.fill("#input", "ROMEO: Zounds")
            page.click("#run")
            page.wait_for_selector("#error:not([hidden])", timeout=60_000)
            assert "Z" in page.locator("#error").inner_text()
            assert page.locator("#output-text").count() == 0 and page.locator("#overview .head").count() == 0
            assert page.locator("#block-card").is_hidden() and page.locator("#layer option").count() == 0
            assert page.locator("#run").inner_text() == "Generate"
            # the refusal's 422 is logged by the browser; nothing else may be
            assert [e for e in errors if "status of 422" not in e] == []
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def test_qkv_translate_and_the_served_page_name_unknown_characters_as_the_live_page(tiny_runs):
    """One note for a sentence with characters the vocabulary lacks: ``qkv translate`` warns
    with it (its line named), the served explainer answers the characters, the tokenizer finds
    exactly those its ids hold as <unk>, and a sentence of known characters gets none."""
    from cli_runs import qkv

    from qkv.data.tokenizers import SubwordTokenizer
    from qkv.explain.explainers import TranslationExplainer

    run = Path(tiny_runs["translation"])
    tok = SubwordTokenizer.load(run / "tokenizer.json")
    text = "Ein Mann 😀 fährt 中文 mit dem Fahrrad."
    unknown = tok.unknown_characters(text)
    assert unknown == ["😀", "中", "文"] and tok.encode(text).count(tok.unk_id) == 3
    done = qkv("translate", str(run), "--beam", "1", SENTENCE, text)
    assert done.returncode == 0, done.stderr[-1500:]
    assert f"input line 2: {unknown_characters_note(unknown)}" in done.stderr
    assert "input line 1" not in done.stderr
    answer = TranslationExplainer(run).explain(text).to_dict()["output"]
    assert answer["unknown_characters"] == unknown
    assert TranslationExplainer(run).explain(SENTENCE).to_dict()["output"]["unknown_characters"] == []
