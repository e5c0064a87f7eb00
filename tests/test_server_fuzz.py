"""Schema-driven fuzzing of the explainer server on every family's server (issues 26 and 69:
every bad input a clean refusal, no 5xx).

Schemathesis reads the app's own ``/openapi.json`` and generates requests for every operation,
valid ones ("positive": within the schema) and invalid ones ("negative": wrong types, values
out of range, missing or extra fields), sent in-process over the ASGI transport (no socket).
A tiny model of each family the explainer serves is served (:data:`FAMILIES`: the translator
and its RNN baseline, the character LM, the masked diffusion LM, a protein classifier and a
protein MLM, a converted BERT and a text classifier on it, a ViT and a captioner), and every
operation of the document is fuzzed on each: the text endpoints on an image model's server and
the image endpoints on a text model's are refusals too. Half the positive cases get values the
model accepts (:func:`_valid`: an input in the model's vocabulary, one of the model's own
activation names, attention kinds and intervention stacks, layers and heads within or one past
the model's), so they reach the model rather than the first refusal; for a ViT and a
captioner, a real PNG. Every response must be:

- no server error (no 5xx; an exception escaping the app fails the test too);
- a status code the document lists for that operation, with the listed content type, and a
  body that conforms to the listed schema (errors are ``{"detail": "one line"}``);
- a 4xx for every negative request.

Random values rarely hit every name, so :func:`test_every_name_each_server_accepts_is_answered`
walks them all: each hook point of the model (:func:`qkv.explain.hooks.hook_points`, the names
``POST /api/activation`` reads; no endpoint lists them) at the first token and one far past the
input, each attention kind of ``/api/info`` (and one the model lacks) through ``/api/steps``,
and each intervention ``/api/info`` offers (every stack, both ablation modes, both patch points,
an index one past the model's) through ``/api/intervene``.

Bounded: at most :data:`MAX_EXAMPLES` cases per operation and mode on the character LM's server
(the widest sampling settings) and :data:`FAMILY_EXAMPLES` on the others, derandomized (the
same cases every run). About 2 minutes of CPU in all, plus training the tiny ViT and captioner
fixtures (seconds).
"""

from __future__ import annotations

import dataclasses
import itertools
import shutil
from collections import Counter
from pathlib import Path

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from qkv.explain.hooks import hook_points
from qkv.explain.server import create_app
from qkv.recipes.loading import load_explainer

MAX_EXAMPLES = 60
FAMILY_EXAMPLES = 10
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    negative_data_rejection,
]
ALPHABET = "ROMEO:\nBut soft, what light"  # characters of the tiny character models' vocabulary
RESIDUES = "ACDEFGHIKLMNPQRSTVWY"
GERMAN = [
    "Ein",
    "Mann",
    "fährt",
    "mit",
    "dem",
    "Fahrrad.",
    "Eine",
    "Frau",
    "liest",
    "ein",
    "Buch",
    "im",
    "Park.",
]
WORDS = ["a", "man", "rides", "bike", "the", "park", ".", "woman"]  # the tiny BERT's own words
BERT_VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, *[f"w{i}" for i in range(37)]]

# family -> (where its run comes from, an input it reads, inputs in its vocabulary)
FAMILIES = {
    "lm": ("tiny_runs", "ROMEO:\nBut soft", st.text(ALPHABET, min_size=1, max_size=24)),
    "diffusion-lm": (
        "tiny_runs",
        "ROMEO:\nBut soft, ____ light",
        st.builds(lambda a, b: f"{a}_{b}", st.text(ALPHABET, max_size=10), st.text(ALPHABET, max_size=10)),
    ),
    "translation": (
        "tiny_runs",
        "Ein Mann liest ein Buch.",
        st.lists(st.sampled_from(GERMAN), min_size=1, max_size=6).map(" ".join),
    ),
    "translation-rnn": (
        "tiny_runs",
        "Eine Frau fährt.",
        st.lists(st.sampled_from(GERMAN), min_size=1, max_size=6).map(" ".join),
    ),
    "protein": ("tiny_runs", "GIGKFLHSAKKFGKAFV", st.text(RESIDUES, min_size=1, max_size=20)),
    "protein-mlm": ("protein_mlm_run", "GIGKFLHSAKK", st.text(RESIDUES, min_size=1, max_size=20)),
    "text": (
        "text_runs",
        "a man rides ||| the woman .",
        st.lists(st.sampled_from([*WORDS, "|||"]), min_size=1, max_size=8).map(" ".join),
    ),
    "text-cls": (
        "text_runs",
        "the man rides a bike .",
        st.lists(st.sampled_from(WORDS), min_size=1, max_size=8).map(" ".join),
    ),
    "vit": ("tiny_vit_run", None, None),
    "caption": ("tiny_caption_run", None, None),
}


@pytest.fixture(scope="module")
def protein_mlm_run(tmp_path_factory) -> Path:
    from cli_runs import tiny_mlm_run

    return tiny_mlm_run(tmp_path_factory.mktemp("protein_mlm") / "run")


@pytest.fixture(scope="module")
def text_runs(tmp_path_factory) -> dict[str, Path]:
    """A tiny random BERT (2 layers, 2 heads, width 16) converted from Hugging Face (an
    ``encoder`` run: the text explainer, no classes), and a ``text-cls`` run on it (a 2-class
    sequence head): ``{"text": path, "text-cls": path}``."""
    import torch
    import transformers

    from qkv.files import save_weights, write_json
    from qkv.hub.convert import import_hf
    from qkv.models.encoder import EncoderModel

    root = tmp_path_factory.mktemp("text_runs")
    torch.manual_seed(0)
    bert = transformers.BertConfig(
        vocab_size=len(BERT_VOCAB),
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=64,
    )
    transformers.BertForMaskedLM(bert).eval().save_pretrained(root / "hf")
    (root / "hf" / "vocab.txt").write_text("\n".join(BERT_VOCAB) + "\n", encoding="utf-8")
    encoder = import_hf(root / "hf", root / "text").model
    cls = shutil.copytree(root / "text", root / "text-cls")
    config = dataclasses.replace(encoder.config, num_labels=2)
    model = EncoderModel(config)
    heads = ("sequence_head.", "residue_head.")  # the converted model's are 1-class placeholders
    model.load_state_dict(
        {k: v for k, v in encoder.state_dict().items() if not k.startswith(heads)}, strict=False
    )
    save_weights(model, cls / "model.safetensors")
    write_json(cls / "config.json", config.to_dict())
    write_json(cls / "train_config.json", {"recipe": "text-cls"})
    write_json(cls / "task.json", {"task": "toy", "classes": ["negative", "positive"]})
    return {"text": root / "text", "text-cls": cls}


@pytest.fixture
def served(request):
    """``(explainer, app)`` of the tiny run of the test's ``family`` (the ``family`` argument)."""
    family = request.node.callspec.params["family"]
    source = request.getfixturevalue(FAMILIES[family][0])
    run = source[family] if isinstance(source, dict) else source
    explainer = load_explainer(run, max_chars=60)
    return explainer, create_app(explainer)


def _valid(explainer, family: str) -> st.SearchStrategy:
    """Values ``family``'s model accepts (and indices one past them), for half the positive
    cases: body keys for the text endpoints; for an image model a PNG and the steps' layer and
    head."""
    info = explainer.info()
    layer, head = st.integers(0, info["n_layers"]), st.integers(0, info["n_heads"])
    if explainer.input_kind == "image":
        from test_explain_vit import _png_bytes

        return st.fixed_dictionaries({"png": st.just(_png_bytes()), "layer": layer, "head": head})
    text = FAMILIES[family][2]
    names = st.sampled_from([*hook_points(explainer.model), "logits"])
    stacks = st.sampled_from([*info["kinds"], None])
    interventions = st.one_of(
        st.fixed_dictionaries(
            {
                "kind": st.just("ablate_head"),
                "stack": stacks,
                "layer": layer,
                "head": head,
                "mode": st.sampled_from(["zero", "mean"]),
            }
        ),
        st.fixed_dictionaries({"kind": st.just("zero_neuron"), "layer": layer, "neuron": st.integers(0, 64)}),
        st.fixed_dictionaries(
            {
                "kind": st.just("patch"),
                "source_text": text,
                "layer": layer,
                "point": st.sampled_from(["resid_pre", "resid_post"]),
            }
        ),
    )
    return st.fixed_dictionaries(
        {
            "text": text,
            "kind": st.sampled_from(info["kinds"]),
            "layer": layer,
            "head": head,
            "name": names,
            "token": st.one_of(st.integers(0, 2), st.integers(0, 30)),  # mostly within a short input
            "intervention": interventions,
            "max_new_tokens": st.integers(0, 8),
            "beam_size": st.sampled_from([None, 1, 2]),  # a random beam of 16 only costs time
        }
    )


def _apply(case, valid: dict) -> None:
    """Replace the generated values named in ``valid`` (body keys; for an image operation the
    body, and the query's layer and head) by ones the model accepts."""
    if isinstance(case.body, dict):
        case.body.update({k: v for k, v in valid.items() if k in case.body})
    elif "png" in valid:
        case.body, case.media_type = valid["png"], "application/octet-stream"
        case.query = {k: valid.get(k, v) for k, v in (case.query or {}).items() if k != "example"}


def _fuzz(app, valid: st.SearchStrategy, max_examples: int) -> Counter:
    """Every operation of ``app``'s document, positive and negative (when it has inputs); half
    the positive cases get the values drawn from ``valid``. Returns the count of responses per
    operation and status code: ``{(label, status): n}``."""
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    statuses: Counter = Counter()
    for result in schema.get_all_operations():
        op = result.ok()
        has_inputs = bool(len(op.query) or len(op.body))
        _run(
            op,
            GenerationMode.POSITIVE,
            st.one_of(st.none(), valid) if has_inputs else st.none(),
            max_examples,
            statuses,
        )
        if has_inputs:
            _run(op, GenerationMode.NEGATIVE, st.none(), max_examples, statuses)
    return statuses


def _run(op, mode: GenerationMode, fix: st.SearchStrategy, max_examples: int, statuses: Counter) -> None:
    """Up to ``max_examples`` cases of ``op`` in ``mode``, each checked with :data:`CHECKS` and
    counted in ``statuses``; a case ``fix`` draws a dict for gets its values (:func:`_apply`)."""

    @settings(
        max_examples=max_examples,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
        phases=[Phase.explicit, Phase.generate, Phase.shrink],
    )
    @given(case=op.as_strategy(generation_mode=mode), fixed=fix)
    def run(case, fixed):
        if fixed is not None:
            _apply(case, fixed)
        response = case.call()
        statuses[op.label, response.status_code] += 1
        case.validate_response(response, checks=CHECKS)

    run()


OPERATIONS = {
    "GET /",
    "GET /api/info",
    "POST /api/explain",
    "POST /api/steps",
    "POST /api/activation",
    "POST /api/intervene",
    "GET /api/image/examples",
    "POST /api/image/explain",
    "POST /api/image/steps",
}


def test_the_fuzz_covers_every_operation_of_the_document(tiny_runs):
    schema = schemathesis.openapi.from_asgi("/openapi.json", create_app(load_explainer(tiny_runs["lm"])))
    assert {result.ok().label for result in schema.get_all_operations()} == OPERATIONS


@pytest.mark.filterwarnings("ignore:context longer than the model's max_len")
@pytest.mark.parametrize("family", list(FAMILIES))
def test_fuzzed_requests_never_get_a_server_error(family, served):
    explainer, app = served
    examples = MAX_EXAMPLES if family == "lm" else FAMILY_EXAMPLES
    answers = _fuzz(app, _valid(explainer, family), examples)
    assert not [code for _, code in answers if code >= 500], answers
    assert sum(answers.values()) >= (300 if family == "lm" else 100), answers
    # the values the model accepts reach it: its input's explanation answered
    explain = "POST /api/image/explain" if explainer.input_kind == "image" else "POST /api/explain"
    assert answers[explain, 200] > 0 and answers[explain, 422] > 0, answers


def _answer(client: TestClient, path: str, body: dict, *allowed: int) -> int:
    """POST ``body`` to ``path``; assert the status is one of ``allowed`` and an error's detail
    is one line. Returns the status."""
    res = client.post(path, json=body)
    assert res.status_code in allowed, (path, body, res.status_code, res.text[:300])
    if res.status_code != 200:
        detail = res.json()["detail"]
        assert isinstance(detail, str) and detail and "\n" not in detail, (path, body, detail)
    return res.status_code


def _walk_activations(client: TestClient, explainer, text: str) -> dict[str, int]:
    """Every hook point (and ``logits``) at token 0 and at a token far past the input:
    ``{name: status at token 0}``. A name the model's pass does not reach (a classifier's
    masked-token head) is an unknown name, a 422; one whose value has no token axis (a pooled
    head's logits) answers with ``token: null`` whatever the token."""
    body = {"text": text, "max_new_tokens": 3, "beam_size": 1}
    answers = {}
    for name in [*hook_points(explainer.model), "logits"]:
        answers[name] = _answer(client, "/api/activation", {**body, "name": name, "token": 0}, 200, 422)
        past = client.post("/api/activation", json={**body, "name": name, "token": 10**6})
        assert past.status_code == 422 or past.json()["token"] is None, (name, past.text[:300])
    return answers


def _walk_steps(client: TestClient, info: dict, text: str) -> None:
    """``/api/steps`` for each attention kind at its first and (one past) its last layer and
    head, and a kind the model lacks."""
    body = {"text": text, "max_new_tokens": 3, "beam_size": 1}
    ok = 200 if info["step_through"] else 422
    for kind in info["kinds"]:
        layers = info["layers_per_kind"][kind]
        for layer, head in itertools.product((0, layers - 1, layers), (0, info["n_heads"])):
            inside = layer < layers and head < info["n_heads"]
            _answer(
                client,
                "/api/steps",
                {**body, "kind": kind, "layer": layer, "head": head},
                ok if inside else 422,
            )
    missing = next(k for k in ("encoder", "decoder", "cross", "nope") if k not in info["kinds"])
    _answer(client, "/api/steps", {**body, "kind": missing, "layer": 0, "head": 0}, 422)


def _walk_interventions(client: TestClient, info: dict, text: str) -> None:
    """``/api/intervene`` with each intervention ``/api/info`` offers: each stack's first head
    zeroed and set to its mean (and a head and a layer one past), a neuron of each layer (and
    one past), each patch point (and a layer one past); on a model that offers none (the RNN),
    a 422."""
    body = {"text": text, "max_new_tokens": 3, "beam_size": 1}
    offered = info["intervene"]
    if offered is None:
        _answer(
            client,
            "/api/intervene",
            {**body, "intervention": {"kind": "zero_neuron", "layer": 0, "neuron": 0}},
            422,
        )
        return
    for stack in offered["ablate_head"]:
        layers = info["layers_per_kind"][stack]
        for layer, head, mode in [
            (0, 0, "zero"),
            (layers - 1, 0, "mean"),
            (layers, 0, "zero"),
            (0, info["n_heads"], "zero"),
        ]:
            spec = {"kind": "ablate_head", "stack": stack, "layer": layer, "head": head, "mode": mode}
            inside = layer < layers and head < info["n_heads"]
            _answer(client, "/api/intervene", {**body, "intervention": spec}, 200 if inside else 422)
    neurons = offered["zero_neuron"]
    for layer, d_ff in enumerate(neurons["d_ff"]):
        for neuron in (0, d_ff):
            spec = {"kind": "zero_neuron", "layer": layer, "neuron": neuron}
            _answer(client, "/api/intervene", {**body, "intervention": spec}, 200 if neuron < d_ff else 422)
    spec = {"kind": "zero_neuron", "layer": neurons["layers"], "neuron": 0}
    _answer(client, "/api/intervene", {**body, "intervention": spec}, 422)
    if offered["patch"] is not None:
        for point, layer in itertools.product(offered["patch"]["points"], (0, offered["patch"]["layers"])):
            spec = {
                "kind": "patch",
                "source_text": text[: len(text) // 2 + 1],
                "layer": layer,
                "point": point,
            }
            _answer(
                client,
                "/api/intervene",
                {**body, "intervention": spec},
                200 if layer < offered["patch"]["layers"] else 422,
            )


@pytest.mark.filterwarnings("ignore:context longer than the model's max_len")
@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_name_each_server_accepts_is_answered(family, served):
    """Each name and index the text endpoints take, walked on each family's server: 200 within
    the model, a one-line 422 outside it, never a 5xx. The review's case: ``logits`` on the
    masked diffusion LM (its mask token's logit is -inf) answered 500."""
    explainer, app = served
    client = TestClient(app)
    info = client.get("/api/info").json()
    text = FAMILIES[family][1]
    if explainer.input_kind == "image":  # the text endpoints refuse, by name; the image steps walked
        for name in [*hook_points(explainer.model)[:3], "logits"]:
            _answer(client, "/api/activation", {"text": "a", "name": name, "token": 0}, 422)
        for layer, head in itertools.product(range(info["n_layers"] + 1), range(info["n_heads"] + 1)):
            inside = layer < info["n_layers"] and head < info["n_heads"]
            res = client.post(f"/api/image/steps?layer={layer}&head={head}&example=0")
            assert res.status_code == (200 if inside else 422), res.text[:300]
        return
    answers = _walk_activations(client, explainer, text)
    assert all(status == 200 for name, status in answers.items() if ".layers." in f".{name}"), answers
    assert answers["logits"] == 200, answers
    _walk_steps(client, info, text)
    _walk_interventions(client, info, text)
