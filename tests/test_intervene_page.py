"""Interventions in the explainer (issue 68): ``Explainer.intervene`` and ``POST /api/intervene``
(the output before and after ablating a head, zeroing an FFN neuron or patching the residual
stream from another input), checked against the hook points run by hand
(:func:`qkv.explain.hooks.run_with_hooks`, one full forward pass per token, no KV cache); the
refusals; and the pages: the served page's and the standalone page's "ablate this head" in
headless Chromium (as ``test_explain_browser.py`` drives it).

A random tiny LM barely depends on its heads (its next-token distribution is nearly uniform), so
the LM tests train one for a moment on one line of text (:func:`trained_lm_run`): there, every
head's ablation changes the greedy continuation.
"""

from __future__ import annotations

import shutil

import pytest
import torch
import torch.nn.functional as F
from fastapi.testclient import TestClient

from qkv.errors import QkvError
from qkv.explain.explainer import DecodingOptions
from qkv.explain.hooks import run_with_hooks
from qkv.explain.interventions import ablate_heads, ablate_neurons
from qkv.explain.server import create_app, serve_in_thread
from qkv.recipes.loading import load_explainer

LINE = "ROMEO:\nBut soft, what light through yonder window breaks?\n"
PROMPT = "ROMEO:\nBut soft"
GREEDY = {"temperature": 0, "max_new_tokens": 20}
SENTENCE = "Ein Mann liest ein Buch."


@pytest.fixture(scope="module")
def trained_lm_run(tmp_path_factory):
    """A character LM (2 layers, 2 heads, d_model 32) trained for 60 steps to recite
    :data:`LINE` (about a second on one thread): its greedy continuation of :data:`PROMPT`
    is ``", what light through"``, and it depends on every head."""
    from conftest import _write_run

    from qkv.data.tokenizers import CharTokenizer
    from qkv.models import DecoderLM, LMConfig

    torch.manual_seed(0)
    chars = CharTokenizer.train(LINE)
    config = LMConfig(
        vocab_size=chars.vocab_size,
        d_model=32,
        n_heads=2,
        d_ff=64,
        n_layers=2,
        max_len=64,
        positional="rotary",
        dropout=0.0,
    )
    model = DecoderLM(config)
    ids = torch.tensor([chars.encode(LINE)])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(60):
        loss = F.cross_entropy(model(ids[:, :-1]).logits.flatten(0, 1), ids[0, 1:])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    return _write_run(tmp_path_factory.mktemp("trained_lm") / "run", model, config, "lm", chars)


@pytest.fixture(scope="module")
def lm(trained_lm_run):
    return load_explainer(trained_lm_run)


@torch.no_grad()
def _greedy_lm(explainer, prompt: str, n: int, hooks=()) -> str:
    """``n`` tokens after ``prompt``, each the argmax of a full forward pass over everything so
    far with ``hooks`` attached (no KV cache)."""
    ids = explainer.generator.encode_prompt(prompt)
    start = len(ids)
    for _ in range(n):
        logits = run_with_hooks(explainer.model, torch.tensor([ids]), hooks=hooks).logits[0, -1]
        ids.append(int(logits.argmax()))
    return explainer.tokenizer.decode(ids[start:])


@torch.no_grad()
def _greedy_translation(explainer, text: str, hooks=()) -> str:
    """Greedy decoding of ``text`` (as ``greedy_decode``: up to the source's length + 50 pieces,
    at most ``max_len``), each step a full teacher-forced pass with ``hooks`` attached."""
    cfg, tok = explainer.config, explainer.tokenizer
    src = torch.tensor([tok.encode(text) + [cfg.eos_id]])
    tgt, out = [cfg.bos_id], []
    for _ in range(min(src.size(1) + 50, cfg.max_len)):
        logits = run_with_hooks(explainer.model, src, torch.tensor([tgt]), hooks=hooks).logits[0, -1]
        token = int(logits.argmax())
        if token == cfg.eos_id:
            break
        out.append(token)
        tgt.append(token)
    return tok.decode(out)


@torch.no_grad()
def _teacher_forced_lm(explainer, prompt: str, continuation: str, hooks=()) -> list[float]:
    """The probability of each token of ``continuation`` after ``prompt``, one pass with ``hooks``."""
    ids = explainer.generator.encode_prompt(prompt)
    new = explainer.generator.encode_prompt(continuation)
    whole = torch.tensor([ids + new])
    probs = run_with_hooks(explainer.model, whole, hooks=hooks).logits[0].softmax(-1)
    return [float(probs[len(ids) - 1 + i, t]) for i, t in enumerate(new)]


# --- the API against the hooks run by hand -----------------------------------------------


@pytest.mark.parametrize("layer, head", [(0, 0), (0, 1), (1, 0), (1, 1)])
def test_ablating_a_head_changes_the_lm_output_as_run_with_hooks_says(lm, layer, head):
    client = TestClient(create_app(lm))
    body = {"text": PROMPT, **GREEDY, "intervention": {"kind": "ablate_head", "layer": layer, "head": head}}
    res = client.post("/api/intervene", json=body)
    assert res.status_code == 200, res.text
    r = res.json()
    hooks = ablate_heads(f"layers.{layer}.self_attn", head)
    assert r["before"]["text"] == _greedy_lm(lm, PROMPT, 20) == ", what light through"
    assert r["after"]["text"] == _greedy_lm(lm, PROMPT, 20, hooks)
    assert r["changed"] and r["after"]["text"] != r["before"]["text"]
    assert r["intervention"] == {
        "kind": "ablate_head",
        "stack": "decoder",
        "layer": layer,
        "head": head,
        "mode": "zero",
    }
    assert (
        r["description"]
        == f"decoder self-attention, layer {layer + 1}, head {head + 1}: its output set to zero"
    )
    tokens = r["tokens"]
    assert "".join(tokens["labels"]) == ", what light through".replace(" ", "␣")
    assert tokens["before"] == pytest.approx(_teacher_forced_lm(lm, PROMPT, r["before"]["text"]), abs=1e-5)
    assert tokens["after"] == pytest.approx(
        _teacher_forced_lm(lm, PROMPT, r["before"]["text"], hooks), abs=1e-5
    )


def test_mean_ablation_is_the_heads_mean_over_the_input(tiny_runs):
    """On a classifier (one forward pass), the head set to its mean over the input's positions is
    :func:`ablate_heads` with ``mode="mean"`` (the mean over the run), and zeroing a neuron is
    :func:`ablate_neurons`."""
    ex = load_explainer(tiny_runs["protein"])
    text = "GIGKFLHSAKKFGKAFV"
    tokens = torch.tensor([ex._ids(text)])
    for intervention, hooks in [
        (
            {"kind": "ablate_head", "layer": 0, "head": 1, "mode": "mean"},
            ablate_heads("layers.0.self_attn", 1, "mean"),
        ),
        ({"kind": "zero_neuron", "layer": 1, "neuron": 7}, ablate_neurons("layers.1.ffn", 7)),
    ]:
        r = ex.intervene(text, intervention)
        expected = run_with_hooks(ex.model, tokens, head="sequence", hooks=hooks).logits.softmax(-1)[0]
        assert [c["prob"] for c in r["after"]["classes"]] == pytest.approx(expected.tolist(), abs=1e-5)
        assert r["tokens"]["labels"] == ["non-AMP", "AMP"]
        assert r["tokens"]["after"] == pytest.approx(expected.tolist(), abs=1e-5)
        assert r["tokens"]["before"] == pytest.approx([c["prob"] for c in r["before"]["classes"]], abs=1e-5)


def test_ablating_a_cross_attention_head_changes_the_translation_as_run_with_hooks_says(tiny_runs):
    ex = load_explainer(tiny_runs["translation"])
    client = TestClient(create_app(ex))
    intervention = {"kind": "ablate_head", "stack": "cross", "layer": 0, "head": 1}
    r = client.post(
        "/api/intervene", json={"text": SENTENCE, "beam_size": 1, "intervention": intervention}
    ).json()
    hooks = ablate_heads("decoder.layers.0.cross_attn", 1)
    assert r["before"]["text"] == _greedy_translation(ex, SENTENCE)
    assert r["after"]["text"] == _greedy_translation(ex, SENTENCE, hooks)
    assert r["changed"] and r["after"]["text"] != r["before"]["text"]
    assert r["tokens"]["labels"][-1] == "<eos>" and len(r["tokens"]["after"]) == len(r["tokens"]["labels"])


def test_patching_the_first_layer_reads_the_other_inputs_tokens(lm):
    """The stream entering layer 0 is each token's embedding: patched from another input of
    the same length, the model continues that input; from a longer one, its first
    ``len(input)`` tokens (the common prefix); from a shorter one, those tokens then the
    input's own rest. A later layer patched at every position moves the output too."""
    other = "But soft, what light"  # 20 characters; PROMPT has 15
    cases = [
        (other[:15], other[:15]),
        (other, other[:15]),
        ("ROMEO", "ROMEO" + PROMPT[5:]),
        ("But s", "But s" + PROMPT[5:]),
    ]
    for source, equivalent in cases:
        r = lm.intervene(
            PROMPT, {"kind": "patch", "source_text": source, "layer": 0}, DecodingOptions(**GREEDY)
        )
        assert r["after"]["text"] == _greedy_lm(lm, equivalent, 20), source
        common = min(len(source), len(PROMPT))
        assert r["description"].endswith(
            f"layer 1 patched from the other input's run at positions 1..{common}"
        )
    same = lm.intervene(
        PROMPT, {"kind": "patch", "source_text": PROMPT, "layer": 1}, DecodingOptions(**GREEDY)
    )
    assert not same["changed"] and same["tokens"]["after"] == same["tokens"]["before"]
    moved = lm.intervene(
        PROMPT,
        {"kind": "patch", "source_text": other[:15], "layer": 1, "point": "resid_post"},
        DecodingOptions(**GREEDY),
    )
    assert moved["changed"] and "leaving layer 2" in moved["description"]


def test_patching_the_translators_encoder_from_a_sentence_of_the_same_length(tiny_runs):
    ex = load_explainer(tiny_runs["translation"])
    other = "Eine Frau liest ein Buch."
    assert ex.count_tokens(other) == ex.count_tokens(SENTENCE)
    r = ex.intervene(
        SENTENCE, {"kind": "patch", "source_text": other, "layer": 0}, DecodingOptions(beam_size=1)
    )
    assert r["after"]["text"] == ex.explain(other, DecodingOptions(beam_size=1)).output["text"]
    assert "encoder layer 1" in r["description"]


def test_the_diffusion_lm_answers_an_intervention(tiny_runs):
    client = TestClient(create_app(load_explainer(tiny_runs["diffusion-lm"])))
    body = {
        "text": "ROMEO: ____ light",
        "temperature": 0,
        "intervention": {"kind": "zero_neuron", "layer": 1, "neuron": 0},
    }
    res = client.post("/api/intervene", json=body)
    assert res.status_code == 200, res.text
    r = res.json()
    assert len(r["tokens"]["labels"]) == 4 and len(r["before"]["text"]) == len("ROMEO: ____ light")


# --- refusals: one line, a 422 (never a 500) -----------------------------------------------


BAD = [
    (
        {"kind": "ablate_head", "layer": 0, "head": 0},
        "say which attention to ablate: stack = encoder, decoder, cross",
    ),
    (
        {"kind": "ablate_head", "stack": "crosss", "layer": 0, "head": 0},
        "a translation model has no 'crosss' attention",
    ),
    (
        {"kind": "ablate_head", "stack": "cross", "layer": 2, "head": 0},
        "layer 2 out of range: the model has layers 0..1",
    ),
    (
        {"kind": "ablate_head", "stack": "cross", "layer": 0, "head": 2},
        "head 2 out of range: the model has heads 0..1",
    ),
    (
        {"kind": "ablate_head", "stack": "cross", "layer": 0, "head": 0, "mode": "max"},
        "invalid request: intervention.ablate_head.mode",
    ),
    (
        {"kind": "ablate_head", "stack": "cross", "layer": -1, "head": 0},
        "invalid request: intervention.ablate_head.layer",
    ),
    (
        {"kind": "zero_neuron", "layer": 0, "neuron": 32},
        "neuron 32 out of range: the FFN of layer 0 has neurons 0..31",
    ),
    ({"kind": "zero_neuron", "layer": 2**70, "neuron": 0}, "layer 1180591620717411303424 out of range"),
    (
        {"kind": "patch", "source_text": "Eine Frau", "layer": 3},
        "layer 3 out of range: the encoder stack has layers 0..1",
    ),
    ({"kind": "patch", "source_text": " ", "layer": 0}, "source_text: empty input"),
    (
        {"kind": "patch", "source_text": "Eine Frau", "layer": 0, "point": "z"},
        "invalid request: intervention.patch.point",
    ),
    (
        {"kind": "patch", "source_text": "Ein \ud800", "layer": 0},
        "invalid request: intervention.patch.source_text",
    ),
    ({"kind": "steer", "layer": 0}, "invalid request: intervention: Input tag 'steer'"),
    (
        {"kind": "zero_neuron", "layer": 0, "neuron": 0, "head": 1},
        "invalid request: intervention.zero_neuron.head",
    ),
]


@pytest.mark.parametrize("intervention, message", BAD)
def test_bad_interventions_get_one_line_and_a_422(tiny_runs, intervention, message):
    client = TestClient(create_app(load_explainer(tiny_runs["translation"])))
    body = {"text": SENTENCE, "beam_size": 1, "intervention": intervention}
    res = client.post("/api/intervene", content=_json(body), headers={"content-type": "application/json"})
    assert res.status_code == 422, res.text
    detail = res.json()["detail"]
    assert detail.startswith(message) and "\n" not in detail


def _json(body: dict) -> bytes:
    """``body`` as JSON with lone surrogates spelled as escapes (json.dumps's default)."""
    import json

    return json.dumps(body).encode()


def test_the_python_api_refuses_the_same_one_line(tiny_runs):
    ex = load_explainer(tiny_runs["lm"])
    for intervention, message in [
        ({"kind": "ablate_head", "layer": 0}, "a ablate_head intervention needs head"),
        ({"kind": "ablate_head", "layer": True, "head": 0}, "layer is an index (0, 1, ...), got True"),
        (
            {"kind": "zero_neuron", "layer": 0, "neuron": 0, "mode": "mean"},
            "unknown field 'mode' of a zero_neuron",
        ),
        ({"kind": "patch", "layer": 0}, "a patch needs source_text"),
        ("ablate", "an intervention is an object with a kind, got str"),
        ({"kind": "steer"}, "unknown intervention kind 'steer'; choose ablate_head, zero_neuron, patch"),
    ]:
        with pytest.raises(
            QkvError, match="^" + message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")
        ):
            ex.intervene("ROMEO", intervention)


def test_an_input_over_the_cap_is_a_413(tiny_runs):
    client = TestClient(create_app(load_explainer(tiny_runs["lm"], max_chars=60)))
    body = {"text": "ROMEO", "intervention": {"kind": "patch", "source_text": "R" * 61, "layer": 0}}
    res = client.post("/api/intervene", json=body)
    assert (
        res.status_code == 413
        and res.json()["detail"] == "source_text: input too long: 61 characters, the cap is 60"
    )


def test_a_recurrent_run_refuses_interventions(tiny_runs):
    ex = load_explainer(tiny_runs["translation-rnn"])
    client = TestClient(create_app(ex))
    assert client.get("/api/info").json()["intervene"] is None
    body = {
        "text": SENTENCE,
        "intervention": {"kind": "ablate_head", "stack": "cross", "layer": 0, "head": 0},
    }
    res = client.post("/api/intervene", json=body)
    assert res.status_code == 422
    assert res.json()["detail"].startswith("a recurrent model has no attention heads")


def test_info_says_what_each_model_can_do(tiny_runs):
    info = load_explainer(tiny_runs["translation"]).info()["intervene"]
    assert info == {
        "ablate_head": ["encoder", "decoder", "cross"],
        "zero_neuron": {"stack": "decoder", "layers": 2, "d_ff": [32, 32]},
        "patch": {"stack": "encoder", "layers": 2, "points": ["resid_pre", "resid_post"]},
    }


# --- the pages in Chromium -------------------------------------------------------------------

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_browser = pytest.mark.skipif(
    CHROMIUM is None, reason="no Chromium installed (Debian: apt-get install chromium; .ci/run installs it)"
)


@needs_browser
def test_the_served_translator_page_ablates_a_head(tiny_runs):
    """Pick cross-attention layer 1 head 2 on the served page and ablate it: the page shows the
    output before and after, as ``/api/intervene`` (and the hooks run by hand) say."""
    from test_explain_browser import ARTIFACTS, chromium_page

    ex = load_explainer(tiny_runs["translation"])
    expected = _greedy_translation(ex, SENTENCE, ablate_heads("decoder.layers.0.cross_attn", 1))
    server, thread, base = serve_in_thread(create_app(ex))
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    try:
        with chromium_page() as (page, requests, errors):
            page.goto(base + "/")
            page.locator("#family", has_text="translation").wait_for()
            page.fill("#input", SENTENCE)
            page.fill("#beam-size", "1")
            page.click("#run")
            page.wait_for_selector('body[data-ready="1"]', timeout=60_000)
            assert page.locator("#ablate-head").is_visible()
            page.select_option("#kind", "cross")
            page.locator('#overview .head[data-layer="0"][data-head="1"]').click()
            page.click("#ablate-head")
            page.wait_for_selector('body[data-intervene-ready="1"]', timeout=60_000)
            result = page.locator("#ablate-result")
            what = result.locator(".iv-what").inner_text()
            before = result.locator(".iv-before").inner_text()
            after = result.locator(".iv-after").inner_text()
            verdict = result.locator(".iv-verdict").inner_text()
            cells = result.locator(".iv-tokens tr").nth(2).locator("td").all_inner_texts()
            page.locator("#attention-card").screenshot(path=str(ARTIFACTS / "explain_intervene.png"))
            # the block card: zero a neuron, then patch from another input
            page.locator('#block-ffn button.zero[data-layer="1"]').first.click()
            page.wait_for_selector('body[data-intervene-ready="1"]', timeout=60_000)
            neuron = page.locator("#block-result .iv-what").inner_text()
            page.fill("#patch-text", "Eine Frau liest ein Buch.")
            page.click("#patch-run")
            page.wait_for_selector('body[data-intervene-ready="1"]', timeout=60_000)
            patched = page.locator("#block-result .iv-after").inner_text()
    finally:
        server.should_exit = True
        thread.join(timeout=10)
    assert not errors, errors
    assert {url.split("/")[2] for url in requests} == {base.split("/")[2]}
    assert what == "cross-attention, layer 1, head 2: its output set to zero"
    api = ex.intervene(
        SENTENCE,
        {"kind": "ablate_head", "stack": "cross", "layer": 0, "head": 1},
        DecodingOptions(beam_size=1),
    )
    assert before == api["before"]["text"] and after == api["after"]["text"] == expected != before
    assert verdict == "The output changed."
    assert cells == [f"{100 * p:.1f}%" for p in api["tokens"]["after"]][: len(cells)]
    assert neuron.startswith("neuron ") and "of the FFN of decoder layer 2 set to zero" in neuron
    other = ex.explain("Eine Frau liest ein Buch.", DecodingOptions(beam_size=1)).output["text"]
    assert patched == other  # the same length: every encoder position patched at layer 1


@needs_browser
def test_the_standalone_lm_page_holds_every_heads_ablation(lm, tmp_path):
    """``qkv.show`` of a small LM precomputes each head's ablation; the page's button shows the
    one of the selected head, as the hooks run by hand say, with nothing fetched."""
    from test_explain_html import _open

    from qkv.recipes.loading import show

    page = show(lm, PROMPT, **GREEDY)
    heads = page.html.count('"description":')
    assert heads == 4
    path = page.save(tmp_path / "lm.html")
    report = _open(path)  # renders from file://, no request but the file, no console error
    assert not report["errors"] and all(url.startswith("file://") for url in report["requests"])
    playwright = pytest.importorskip("playwright.sync_api")
    shown = {}
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        tab = browser.new_page(viewport={"width": 1400, "height": 1000})
        errors = []
        tab.on("pageerror", lambda exc: errors.append(str(exc)))
        tab.goto(path.resolve().as_uri())
        tab.wait_for_selector('body[data-ready="1"]', timeout=30_000)
        assert tab.locator("#ablate-mode-label").is_hidden() and tab.locator("#block-intervene").is_hidden()
        for layer, head in [(0, 1), (1, 0)]:
            tab.locator(f'#overview .head[data-layer="{layer}"][data-head="{head}"]').click()
            tab.click("#ablate-head")
            tab.wait_for_selector('body[data-intervene-ready="1"]', timeout=30_000)
            shown[layer, head] = tab.locator("#ablate-result .iv-after").inner_text()
        browser.close()
    assert not errors, errors
    for (layer, head), after in shown.items():
        assert after == _greedy_lm(lm, PROMPT, 20, ablate_heads(f"layers.{layer}.self_attn", head))
        assert after != ", what light through"
