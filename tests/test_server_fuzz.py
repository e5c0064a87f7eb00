"""Schema-driven fuzzing of the explainer server (issue 26: every bad input a clean refusal).

Schemathesis reads the app's own ``/openapi.json`` and generates requests for every operation,
valid ones ("positive": within the schema) and invalid ones ("negative": wrong types, values
out of range, missing or extra fields), sent in-process over the ASGI transport (no socket).
Two tiny models are served: a character LM (``/api/explain`` and ``/api/steps`` with the
sampling settings; half the positive bodies get a prompt in the model's vocabulary, so they
reach the sampler rather than the "unknown characters" refusal) and a ViT (the image
endpoints; some bodies are a real PNG). Every response must be:

- no server error (no 5xx; an exception escaping the app fails the test too);
- a status code the document lists for that operation, with the listed content type, and a
  body that conforms to the listed schema (errors are ``{"detail": "one line"}``);
- a 4xx for every negative request.

Bounded: at most :data:`MAX_EXAMPLES` cases per operation and mode, derandomized (the same
cases every run). With hypothesis 6.170 and schemathesis 4.32 that is 484 requests: 4
operations on each app, 12 runs (an operation with no inputs has one case and no negative
mode); 101 answered 200, 370 422 and 13 400 (a body FastAPI cannot parse), none 5xx. About
15 s on 2 cores, plus ~7 s to train the tiny ViT fixture; the test asserts at least 300.
``POST /api/activation`` (a named activation at one token) and ``POST /api/intervene`` (the
output before and after ablating a head, zeroing a neuron or patching from another input) have
joined the LM's operations since those counts were taken, and a masked diffusion LM is served
for those two (its logit of the mask token is -inf, which JSON cannot hold: it answered 500);
half their positive bodies get a real activation name and token, and an intervention within
(or just past) the tiny models' layers, heads and neurons.
"""

from __future__ import annotations

from collections import Counter

import pytest
import schemathesis
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

from qkv.explain.server import create_app
from qkv.recipes.loading import load_explainer

MAX_EXAMPLES = 60
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    negative_data_rejection,
]
HEADS = {"layer": st.integers(0, 1), "head": st.integers(0, 1)}  # both tiny models: 2 layers, 2 heads
ALPHABET = "ROMEO:\nBut soft, what light"  # characters of the tiny models' vocabulary
NAMES = st.sampled_from(
    [
        "logits",
        "embed",
        "layers.0.resid_pre",
        "layers.1.self_attn.scores",
        "layers.0.self_attn.k",
        "layers.1.self_attn.z",
        "layers.1.ffn.hidden",
    ]
)
INTERVENTIONS = st.one_of(  # indices up to one past the tiny models' (2 layers, 2 heads, d_ff 32)
    st.fixed_dictionaries(
        {
            "kind": st.just("ablate_head"),
            "layer": st.integers(0, 2),
            "head": st.integers(0, 2),
            "mode": st.sampled_from(["zero", "mean"]),
        }
    ),
    st.fixed_dictionaries(
        {"kind": st.just("zero_neuron"), "layer": st.integers(0, 2), "neuron": st.integers(0, 32)}
    ),
    st.fixed_dictionaries(
        {
            "kind": st.just("patch"),
            "source_text": st.text(alphabet=ALPHABET + "_", max_size=24),
            "layer": st.integers(0, 2),
            "point": st.sampled_from(["resid_pre", "resid_post"]),
        }
    ),
)
TEXT_VALID = {  # POST /api/activation, /api/intervene; small decodings
    "name": NAMES,
    "token": st.integers(0, 30),
    "intervention": INTERVENTIONS,
    "max_new_tokens": st.integers(0, 8),
}
LM_VALID = st.fixed_dictionaries(
    {
        "text": st.text(alphabet=ALPHABET, min_size=1, max_size=24),
        "kind": st.just("decoder"),
        **HEADS,
        **TEXT_VALID,
    }
)
DIFFUSION_VALID = st.fixed_dictionaries(  # a template with a blank; its logits half the time
    {
        **TEXT_VALID,
        "text": st.builds(
            lambda a, b: f"{a}_{b}", st.text(ALPHABET, max_size=10), st.text(ALPHABET, max_size=10)
        ),
        "name": st.one_of(st.just("logits"), NAMES),
        "token": st.integers(0, 12),
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


def _fuzz(app, operations: set[str], valid: st.SearchStrategy) -> Counter:
    """Every operation of ``app``'s document in ``operations``, positive and negative (when it
    has inputs); half the positive cases get the values drawn from ``valid``. Returns the
    count of responses per status code."""
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    statuses: Counter = Counter()
    for result in schema.get_all_operations():
        op = result.ok()
        if op.label not in operations:
            continue
        has_inputs = bool(len(op.query) or len(op.body))
        for mode in (
            (GenerationMode.POSITIVE, GenerationMode.NEGATIVE) if has_inputs else (GenerationMode.POSITIVE,)
        ):
            fix = st.one_of(st.none(), valid) if has_inputs and mode is GenerationMode.POSITIVE else st.none()

            @settings(
                max_examples=MAX_EXAMPLES,
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
                statuses[response.status_code] += 1
                case.validate_response(response, checks=CHECKS)

            run()
    return statuses


@pytest.mark.filterwarnings("ignore:context longer than the model's max_len")
def test_fuzzed_requests_never_get_a_server_error(tiny_runs, tiny_vit_run):
    from test_explain_vit import _png_bytes

    lm_app = create_app(load_explainer(tiny_runs["lm"], max_chars=60))
    diffusion_app = create_app(load_explainer(tiny_runs["diffusion-lm"], max_chars=60))
    vit_app = create_app(load_explainer(tiny_vit_run))
    text_ops = {
        "GET /",
        "GET /api/info",
        "POST /api/explain",
        "POST /api/steps",
        "POST /api/activation",
        "POST /api/intervene",
    }
    image_ops = {
        "GET /api/info",
        "GET /api/image/examples",
        "POST /api/image/explain",
        "POST /api/image/steps",
    }
    statuses = _fuzz(lm_app, text_ops, LM_VALID)
    statuses += _fuzz(diffusion_app, {"POST /api/activation", "POST /api/intervene"}, DIFFUSION_VALID)
    statuses += _fuzz(vit_app, image_ops, st.fixed_dictionaries({"png": st.just(_png_bytes()), **HEADS}))
    assert not [code for code in statuses if code >= 500], statuses
    assert sum(statuses.values()) >= 300 and statuses[200] > 0 and statuses[422] > 0, statuses
