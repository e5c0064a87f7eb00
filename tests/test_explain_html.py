"""The standalone explainer page (``qkv.show``, ``qkv explain --html``): one HTML file
that renders from ``file://`` in headless Chromium with no console error and no request but
the file itself, for every kind of run; Jupyter's ``_repr_html_``; long inputs cut and said so;
the page's Eq. 1 step-through equals the explainer's; a sentence encoder's Output.

The browser tests need Debian's ``chromium`` and the ``playwright`` package (as
``test_explain_browser.py``); the MiniLM ones the offline weights (``make pretrained``).
"""

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
from pretrained_marks import needs_minilm

from qkv.cli import main
from qkv.errors import QkvError
from qkv.explain import ExplainerPage
from qkv.explain.standalone import longest_prefix, render_page
from qkv.recipes.loading import load_explainer, show

CHROMIUM = os.environ.get("QKV_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
INPUTS = {
    "translation": "Ein Mann liest ein Buch.",
    "translation-rnn": "Ein Mann liest ein Buch.",
    "lm": "ROMEO:\nBut soft",
    "protein": "GIGKFLHSAKKFGKAFV",
}
MINILM_PAIR = ("A man rides a bicycle through the park.", "Someone is cycling outdoors.")


needs_browser = pytest.mark.skipif(
    CHROMIUM is None, reason="no Chromium installed (Debian: apt-get install chromium; .ci/run installs it)"
)


@pytest.fixture(scope="module")
def minilm_run(tmp_path_factory):
    """``qkv convert hf minilm RUN``: the real all-MiniLM-L6-v2 as a converted encoder run."""
    run = tmp_path_factory.mktemp("minilm") / "run"
    assert main(["convert", "hf", "minilm", str(run)]) == 0
    return run


def _open(path: Path) -> dict:
    """Open ``path`` from ``file://`` in headless Chromium and report what happened: requests,
    console errors and uncaught exceptions, the count of head tiles, step-through rows, the
    Output's text, and what the page's own script computes for Eq. 1 (``localSteps``)."""
    playwright = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
    report: dict = {"requests": [], "errors": []}
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.on("request", lambda req: report["requests"].append(req.url))
        page.on("console", lambda msg: report["errors"].append(msg.text) if msg.type == "error" else None)
        page.on("pageerror", lambda exc: report["errors"].append(str(exc)))
        page.goto(path.resolve().as_uri())
        page.wait_for_selector('body[data-ready="1"]', timeout=30_000)
        page.wait_for_selector('body[data-steps-ready="1"]', timeout=30_000)
        report["heads"] = page.locator("#overview .head").count()
        report["image_heads"] = page.locator("#image-overview .head").count()
        report["step_rows"] = page.locator("#step-weights tbody tr").count()
        report["output"] = page.locator("#output").inner_text()
        report["input"] = page.locator("#standalone-input").inner_text()
        report["input_box_hidden"] = page.locator("#input").is_hidden() and page.locator("#run").is_hidden()
        report["head_view_lines"] = page.locator("#head-view line").count()
        report["heatmap_width"] = page.evaluate("() => document.getElementById('heatmap').width")
        report["local_steps"] = page.evaluate(
            "() => { const k = state.kind; return state.standalone.steps[k] ? localSteps(k, "
            "state.info.layers_per_kind[k] - 1, state.info.n_heads - 1) : null; }"
        )
        report["kind"] = page.evaluate("() => state.kind")
        report["steps_text"] = page.locator("#steps").inner_text()
        report["weights"] = page.evaluate("() => state.data.attention.map((a) => a.weights)")
        if report["image_heads"]:
            report["overlay_tinted"] = page.evaluate("""() => {
                const cv = document.getElementById("overlay"), d = cv.getContext("2d")
                    .getImageData(0, 0, cv.width, cv.height).data;
                let n = 0;
                for (let i = 0; i < d.length; i += 4) if (d[i] > d[i + 2] + 40) n++;
                return n / (d.length / 4);
            }""")
        browser.close()
    return report


def _assert_clean(report: dict, path: Path, page: ExplainerPage) -> None:
    """No console error, no request but the file, and the attention weights the page unpacked
    are the explanation's (to the 1/65535 of their packing)."""
    assert report["errors"] == [], report["errors"]
    for got, want in zip(report["weights"], page.explanation.attention, strict=True):
        np.testing.assert_allclose(np.array(got), want.weights.numpy(), atol=1 / 65535)
    assert report["requests"] == [path.resolve().as_uri()], f"the page asked for more: {report['requests']}"


def _assert_steps_match(report: dict, explainer, page: ExplainerPage, text) -> None:
    """The page's Eq. 1 (recomputed in the browser from the saved Q, K, V) equals the
    explainer's own step-through of the same head, every stage, to float32 precision."""
    info = explainer.info()
    kind = report["kind"]
    layer, head = info["layers_per_kind"][kind] - 1, info["n_heads"] - 1
    want = explainer.steps(text, kind, layer, head)
    got = report["local_steps"]
    assert got["query_tokens"] == want["query_tokens"] and got["key_tokens"] == want["key_tokens"]
    assert got["mask"] == want["mask"]
    for name in ("q", "k", "v", "scores", "scaled", "weights", "output"):
        np.testing.assert_allclose(np.array(got[name]), np.array(want[name]), atol=2e-4, err_msg=name)
    masked = [[v is None for v in row] for row in got["masked"]]
    assert masked == [[v is None for v in row] for row in want["masked"]]
    np.testing.assert_allclose(np.array(got["weights"]).sum(-1), 1.0, atol=1e-6)


# ---------- in the browser, from a file


@needs_browser
@pytest.mark.parametrize("family", ["translation", "lm", "protein"])
def test_standalone_page_renders_from_a_file_without_requests(tiny_runs, family, tmp_path):
    explainer = load_explainer(tiny_runs[family])
    page = show(explainer, INPUTS[family])
    path = page.save(tmp_path / "sub" / f"{family}.html")
    report = _open(path)
    _assert_clean(report, path, page)
    info = explainer.info()
    n_kinds = len(info["kinds"])
    assert report["heads"] == info["n_layers"] * info["n_heads"] and n_kinds == {"translation": 3}.get(
        family, 1
    )
    assert report["head_view_lines"] > 0 and report["heatmap_width"] > 0 and report["input_box_hidden"]
    assert report["input"].startswith(INPUTS[family].split("\n")[0])
    if family == "translation":
        assert page.explanation.output["text"] in report["output"] and "beam size 4" in report["output"]
    elif family == "lm":
        assert "Next-token probabilities" in report["output"] and "seed 0" in report["output"]
    else:
        assert "non-AMP" in report["output"] and "%" in report["output"]
    assert report["step_rows"] == len(report["local_steps"]["query_tokens"]) > 1
    if not explainer.subword:  # character LM, residues: a token is a label
        assert report["step_rows"] == len(page.explanation.attention[0].query_tokens)
    _assert_steps_match(report, explainer, page, page.explanation.text)


@needs_browser
def test_rnn_page_shows_the_alignment_and_says_why_there_is_no_step_through(tiny_runs, tmp_path):
    explainer = load_explainer(tiny_runs["translation-rnn"])
    page = show(explainer, INPUTS["translation-rnn"])
    path = page.save(tmp_path / "rnn.html")
    report = _open(path)
    _assert_clean(report, path, page)
    assert report["kind"] == "cross" and report["heads"] == 1  # one layer, one "head": α
    assert report["head_view_lines"] > 0 and report["heatmap_width"] > 0
    assert report["local_steps"] is None and report["step_rows"] == 0
    assert "additive" in report["steps_text"] and "Bahdanau" in report["steps_text"]
    alignment = np.array(report["weights"][0])  # (1 layer, 1 head, target words, source words)
    np.testing.assert_allclose(alignment.sum(-1), 1.0, atol=1e-3)


@needs_browser
def test_vit_page_draws_the_image_overlays_from_a_file(tiny_vit_run, tmp_path):
    explainer = load_explainer(tiny_vit_run)
    info = explainer.info()
    pixels = np.zeros((40, 40), dtype=np.uint8)
    pixels[8:32, 12:28] = 230  # a bright block on black: a 2-D array of another size is resized
    page = show(explainer, pixels)
    path = page.save(tmp_path / "vit.html")
    report = _open(path)
    _assert_clean(report, path, page)
    assert report["image_heads"] == report["heads"] == info["n_layers"] * info["n_heads"]
    assert report["overlay_tinted"] > 0.2  # the orange class-token overlay is drawn over the image
    assert report["step_rows"] == 1 + info["grid_size"] ** 2
    assert "array 40×40" in report["input"] and "predicted:" in report["output"]
    image = page.explanation.output["image"]
    assert image.startswith("data:image/png;base64,")  # the model's input, inline
    png = io.BytesIO()
    Image.fromarray(pixels).save(png, format="PNG")  # what show() hands the explainer
    _assert_steps_match(report, explainer, page, png.getvalue())


@needs_browser
@needs_minilm
def test_minilm_page_shows_the_pairs_cosine_similarity(minilm_run, tmp_path):
    from qkv.inference.text import TextEncoder

    explainer = load_explainer(minilm_run)
    page = show(explainer, MINILM_PAIR[0], pair=MINILM_PAIR[1])
    path = page.save(tmp_path / "minilm.html")
    report = _open(path)
    _assert_clean(report, path, page)
    cosine = TextEncoder.load(minilm_run).similarity(*MINILM_PAIR)
    assert page.explanation.output["similarity"]["cosine"] == pytest.approx(cosine, abs=1e-5)
    assert 0.3 < cosine < 1.0  # two descriptions of one scene
    assert f"cosine similarity {cosine:.3f}" in report["output"]
    assert report["heads"] == 6 * 12
    tokens = page.explanation.attention[0].query_tokens
    assert tokens[0] == "[CLS]" and tokens.count("[SEP]") == 2  # the pair read together
    _assert_steps_match(report, explainer, page, page.explanation.text)


@needs_browser
@needs_minilm
def test_minilm_single_sentence_output_names_its_closest_words(minilm_run, tmp_path):
    from qkv.inference.text import TextEncoder

    page = show(minilm_run, "The cat sleeps on the warm windowsill.")
    embedding = page.explanation.output["embedding"]
    assert embedding["dim"] == 384 and embedding["norm"] > 0
    closest = embedding["closest_words"]
    cosines = [w["cosine"] for w in closest]
    assert (
        len(cosines) == 5
        and cosines == sorted(cosines, reverse=True)
        and -1 <= cosines[-1] <= cosines[0] <= 1
    )
    # the content words, not "the" or "on"; the number is the two embedded alone's cosine
    assert {w["word"] for w in closest[:3]} == {"cat", "sleeps", "windowsill"}
    encoder = TextEncoder.load(minilm_run)
    assert cosines[0] == pytest.approx(
        encoder.similarity(page.explanation.text, closest[0]["word"]), abs=1e-4
    )
    path = page.save(tmp_path / "one.html")
    report = _open(path)
    _assert_clean(report, path, page)
    assert "a sentence embedding of 384 numbers" in report["output"]
    assert f"{closest[0]['word']}\n{cosines[0]:.3f}" in report["output"]


@needs_browser
def test_long_input_is_cut_and_the_page_says_so(tiny_runs, tmp_path):
    """A 2,000-character prompt: cut to the cap before the model runs, the cut said on the page
    (and in ``notes``); the page stays small and renders."""
    explainer = load_explainer(tiny_runs["lm"], max_chars=5000)
    text = "ROMEO: But soft, what light through yonder window breaks? " * 35
    page = show(explainer, text, max_tokens=40)
    (attn,) = page.explanation.attention
    assert 29 <= len(attn.query_tokens) <= 40  # cut back to a word boundary near the cap
    assert text.startswith(page.explanation.text) and not page.explanation.text.endswith(" ")
    assert len(page.notes) == 1 and f"the input is {len(text):,} tokens long" in page.notes[0]
    assert f"shows the first {len(attn.query_tokens)}" in page.notes[0]
    path = page.save(tmp_path / "long.html")
    report = _open(path)
    _assert_clean(report, path, page)
    assert page.notes[0] in report["input"]
    # an explainer loaded with a character cap: that cut first, then the model's 64 tokens
    capped = show(load_explainer(tiny_runs["lm"], max_chars=100), text, max_tokens=1000)
    assert (
        capped.notes[0]
        == "the input has 2,030 characters; the page shows the first 100 (the explainer's max_chars)"
    )
    assert capped.notes[1].startswith(
        "its first 100 characters are 100 tokens long; the page shows the first "
    )
    assert len(capped.explanation.attention[0].query_tokens) <= 64  # the model's context


# ---------- without a browser


def test_repr_html_is_an_isolated_iframe_holding_the_whole_page(tiny_runs):
    page = show(tiny_runs["protein"], INPUTS["protein"], height=500)
    frame = page._repr_html_()
    match = re.fullmatch(
        r'<iframe srcdoc="([^"]*)" sandbox="allow-scripts" style="[^"]*height: 500px;[^"]*"[^>]*></iframe>',
        frame,
    )
    assert match, frame[:300]
    assert html.unescape(match.group(1)) == page.html
    assert (
        repr(page)
        == f"<ExplainerPage: protein model, {len(page.html):,} characters of HTML; .save(path) writes it>"
    )
    doc = page.html
    assert "default-src 'none'" in doc  # the page's CSP: no request to any host
    assert "/static/" not in doc and "<script src" not in doc and '<link rel="stylesheet"' not in doc
    assert re.search(r"https?://", doc.split('id="qkv-data"')[0]) is None  # nothing external in the markup
    data = json.loads(
        re.search(r'<script type="application/json" id="qkv-data">(.*?)</script>', doc, re.S).group(1)
    )
    assert set(data) == {"info", "explanation", "body", "steps", "interventions", "notes"}
    heads = data["interventions"]["heads"]["encoder"]  # every head's ablation: 2 layers × 2 heads
    assert [len(layer) for layer in heads] == [2, 2]
    assert heads[1][0]["description"] == "encoder self-attention, layer 2, head 1: its output set to zero"
    steps = data["steps"]["encoder"]
    assert len(steps["layers"]) == 2 and steps["n_heads"] == 2
    q = np.frombuffer(base64.b64decode(steps["layers"][0]["q"]), dtype="<f4")
    assert q.size == 2 * len(steps["query_tokens"]) * steps["d_k"]  # (H, T, d_k)


def test_data_cannot_close_the_script_element():
    """Data holding ``</script>`` and an HTML comment stays data: escaped in the JSON."""
    evil = {"text": "</script><script>alert(1)</script><!-- & -->", "weights": [0.25, 1e-07]}
    doc = render_page({"body": evil, "notes": []})
    assert doc.count("</script>") == 2  # the data element's and the script's own
    data = json.loads(re.search(r'id="qkv-data">(.*?)</script>', doc, re.S).group(1))  # type: ignore[union-attr]
    assert data == {"body": evil, "notes": []}


def test_bad_inputs_are_one_line_errors_before_anything_is_written(tiny_runs, tiny_vit_run, tmp_path):
    with pytest.raises(QkvError, match="pair= is for sentence encoders"):
        show(tiny_runs["lm"], "ROMEO", pair="JULIET")
    with pytest.raises(QkvError, match="takes text"):
        show(tiny_runs["translation"], 3)
    with pytest.raises(QkvError, match="takes an image"):
        show(tiny_vit_run, {"not": "an image"})
    with pytest.raises(QkvError, match="unknown option temprature"):
        show(tiny_runs["lm"], "ROMEO", temprature=0.5)
    with pytest.raises(QkvError, match="max_tokens must be >= 1"):
        show(tiny_runs["lm"], "ROMEO", max_tokens=0)
    with pytest.raises(QkvError, match="run directory not found"):
        show(tmp_path / "nowhere", "x")
    with pytest.raises(QkvError, match="empty input"):
        show(tiny_runs["lm"], "   ")


def test_a_run_directory_s_page_is_qkv_show_s_and_the_explain_package_takes_explainers(tiny_runs):
    """0.2.0 removed the forwarders of 0.1: the one ``show`` is ``qkv.show``
    (:func:`qkv.recipes.loading.show`); the explain package's page of an explainer,
    ``qkv.explain.standalone_page``, takes an explainer (a run directory is refused in one line
    naming ``qkv.show``), and ``qkv.explain.show``, ``qkv.explain.load_explainer`` and
    ``qkv.explain.loader`` are gone."""
    import importlib

    import qkv.explain
    from qkv.recipes import loading

    refusal = r"^qkv\.explain\.standalone_page takes an explainer.*qkv\.show\(run_dir"
    with pytest.raises(QkvError, match=refusal) as info:
        qkv.explain.standalone_page(tiny_runs["lm"], "ROMEO", temperature=0, max_new_tokens=3)
    assert "\n" not in str(info.value)
    new = loading.show(tiny_runs["lm"], "ROMEO", temperature=0, max_new_tokens=3)
    short = qkv.show(tiny_runs["lm"], "ROMEO", temperature=0, max_new_tokens=3)  # the short name
    assert short.explanation.output == new.explanation.output and short.notes == new.notes
    assert type(qkv.load_explainer(tiny_runs["lm"])) is type(loading.load_explainer(tiny_runs["lm"]))
    assert not hasattr(qkv.explain, "load_explainer") and not hasattr(qkv.explain, "show")
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("qkv.explain.loader")


def test_image_inputs_pil_array_and_file_give_the_same_page(tiny_vit_run, tmp_path):
    explainer = load_explainer(tiny_vit_run)
    pixels = (np.arange(64, dtype=np.uint8).reshape(8, 8) * 4).astype(np.uint8)
    Image.fromarray(pixels).save(tmp_path / "digit.png")
    pages = [show(explainer, x) for x in (pixels, Image.fromarray(pixels), str(tmp_path / "digit.png"))]
    first = pages[0].explanation
    for page in pages[1:]:
        assert page.explanation.output["classes"] == first.output["classes"]
        torch.testing.assert_close(page.explanation.attention[0].weights, first.attention[0].weights)
    assert [p.explanation.text for p in pages] == [
        "array 8×8",
        "PIL image 8×8 (L)",
        str(tmp_path / "digit.png"),
    ]


def test_decoding_keywords_reach_the_model(tiny_runs):
    greedy = show(tiny_runs["lm"], "ROMEO", temperature=0, max_new_tokens=7)
    again = show(tiny_runs["lm"], "ROMEO", temperature=0, max_new_tokens=7)
    assert greedy.explanation.output["text"] == again.explanation.output["text"]
    assert len(greedy.explanation.output["text"]) == 7  # a character model: one token, one character
    body = json.loads(
        re.search(r'id="qkv-data">(.*?)</script>', greedy.html, re.S).group(1)  # type: ignore[union-attr]
    )["body"]
    assert body["temperature"] == 0 and body["max_new_tokens"] == 7 and body["text"] == "ROMEO"


def test_longest_prefix_ends_at_a_word_boundary():
    words = "alpha beta gamma delta epsilon"
    assert longest_prefix(words, lambda p: len(p) <= 13) == "alpha beta"  # not "alpha beta ga"
    assert longest_prefix(words, lambda p: len(p) <= 100) == words
    assert longest_prefix("abcdefgh", lambda p: len(p) <= 3) == "abc"  # no space to go back to


@needs_minilm
def test_pair_over_the_cap_keeps_a_short_first_sentence_whole(minilm_run):
    explainer = load_explainer(minilm_run)
    long = "The committee discussed the budget for the next fiscal year at great length. " * 4
    page = show(explainer, "A short question?", pair=long, max_tokens=32)
    tokens = page.explanation.attention[0].query_tokens
    assert len(tokens) <= 32 and tokens.count("[SEP]") == 2
    assert page.explanation.text.startswith("A short question? ||| The committee")
    assert page.notes and "the page shows the first" in page.notes[0]


# ---------- the command line


def test_cli_html_writes_the_same_page_and_refuses_bad_combinations(tiny_runs, tmp_path, capsys):
    run = str(tiny_runs["translation"])
    out = tmp_path / "page.html"
    assert main(["explain", run, "--input", INPUTS["translation"], "--html", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    assert out.read_text(encoding="utf-8") == show(run, INPUTS["translation"]).html
    for args, needle in [
        (["--html", str(tmp_path / "x.html"), "--serve"], "--html writes the page of one --input"),
        (["--input", "x"], "--input needs --out DIR (PNG pictures) or --html FILE"),
        (
            ["--input", "Hallo", "--pair", "Welt", "--html", str(tmp_path / "y.html")],
            "--pair is for sentence encoders",
        ),
        (
            ["--input", "Hallo", "--max-tokens", "0", "--html", str(tmp_path / "y.html")],
            "--max-tokens must be >= 1",
        ),
    ]:
        assert main(["explain", run, *args]) == 2
        assert needle in capsys.readouterr().err
    assert not (tmp_path / "x.html").exists() and not (tmp_path / "y.html").exists()


def test_cli_html_of_a_vit_run_takes_an_image_file(tiny_vit_run, tmp_path, capsys):
    image = tmp_path / "in.png"
    Image.new("L", (30, 30), 180).save(image)
    out = tmp_path / "vit.html"
    assert main(["explain", str(tiny_vit_run), "--input", str(image), "--html", str(out)]) == 0
    doc = out.read_text(encoding="utf-8")
    assert str(image) in doc and "data:image/png;base64," in doc


def test_notebook_renders_show_as_html(tiny_runs, tmp_path):
    """Executed in a real Jupyter kernel (nbclient), ``show(...)`` as a cell's last line gives a
    ``text/html`` output: the iframe holding the page."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(
            "import qkv.recipes.loading\n"
            f"qkv.recipes.loading.show({str(tiny_runs['lm'])!r}, 'ROMEO', temperature=0)"
        )
    ]
    nbclient.NotebookClient(
        nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    (output,) = nb.cells[0].outputs
    frame = output["data"]["text/html"]
    assert frame.startswith("<iframe srcdoc=") and "qkv-data" in html.unescape(frame)


def _buffer_png(size=(8, 8)) -> bytes:
    buf = io.BytesIO()
    Image.new("L", size, 100).save(buf, format="PNG")
    return buf.getvalue()


def test_image_bytes_and_test_index_inputs(tiny_vit_run):
    by_bytes = show(tiny_vit_run, _buffer_png())
    assert by_bytes.explanation.text.startswith("uploaded image")
    by_index = show(tiny_vit_run, 3)
    assert "digits test image 3" in by_index.explanation.text
