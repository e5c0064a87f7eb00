"""The explainer's web server: JSON for each model family, caps, no traversal, loopback soak,
clean Ctrl-C."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from qkv.explain.server import MAX_BODY_BYTES, MAX_IMAGE_BYTES, create_app, serve_in_thread
from qkv.recipes.loading import load_explainer

INPUTS = {
    "translation": "Ein Mann liest ein Buch.",
    "lm": "ROMEO:\nBut soft",
    "diffusion-lm": "ROMEO:\nBut soft, ____ light",
    "protein": "GIGKFLHSAKKFGKAFV",
}


@pytest.fixture(scope="module")
def clients(tiny_runs):
    return {
        family: TestClient(create_app(load_explainer(run, max_chars=60))) for family, run in tiny_runs.items()
    }


@pytest.mark.parametrize("family", ["translation", "lm", "diffusion-lm", "protein"])
def test_server_answers_json_for_each_family(clients, family):
    client = clients[family]
    info = client.get("/api/info").json()
    assert info["family"] == family and info["n_layers"] == 2 and info["n_heads"] == 2
    body = {"text": INPUTS[family], "max_new_tokens": 5, "beam_size": 2}
    res = client.post("/api/explain", json=body)
    assert res.status_code == 200 and res.headers["content-type"] == "application/json"
    data = res.json()
    assert [a["kind"] for a in data["attention"]] == info["kinds"]
    for amap in data["attention"]:
        assert len(amap["weights"]) == 2 and len(amap["weights"][0]) == 2
        assert len(amap["weights"][0][0]) == len(amap["query_tokens"])
    steps = client.post("/api/steps", json={**body, "kind": info["kinds"][-1], "layer": 1, "head": 1}).json()
    assert {"q", "k", "v", "scores", "scaled", "mask", "masked", "weights", "output"} <= set(steps)
    assert len(steps["q"][0]) == info["d_k"]
    page = client.get("/")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assert page.headers["content-security-policy"].startswith("default-src 'self'")


def test_diffusion_server_answers_a_long_template_413_and_a_tiny_temperature_200(tiny_runs):
    """A template longer than the model's context is over a cap, as for the other servers (413,
    not 422); a temperature of 1e-300 draws the most likely tokens instead of failing."""
    client = TestClient(create_app(load_explainer(tiny_runs["diffusion-lm"], max_chars=400)))
    res = client.post("/api/explain", json={"text": "a" * 399 + "_"})
    assert res.status_code == 413 and "longer than the model's context (64)" in res.json()["detail"]
    explain = {"text": INPUTS["diffusion-lm"], "temperature": 1e-300}
    steps = {**explain, "kind": "encoder", "layer": 0, "head": 0}
    for path, body in (("/api/explain", explain), ("/api/steps", steps)):
        res = client.post(path, json=body)
        assert res.status_code == 200, res.json()
        assert client.post(path, json={**body, "temperature": 0.5}).status_code == 200  # the next one too


def test_server_refuses_input_over_the_cap_with_a_message(clients):
    client = clients["protein"]
    res = client.post("/api/explain", json={"text": "A" * 61})
    assert res.status_code == 413 and res.json()["detail"] == "input too long: 61 characters, the cap is 60"
    res = client.post(
        "/api/explain",
        content=b'{"text": "' + b"A" * MAX_BODY_BYTES + b'"}',
        headers={"content-type": "application/json"},
    )
    assert res.status_code == 413 and "request body too large" in res.json()["detail"]
    res = client.post("/api/explain", json={"text": "AB1"})
    assert res.status_code == 422 and "'1' at position 3" in res.json()["detail"]
    res = client.post("/api/steps", json={"text": "AAA", "kind": "cross", "layer": 0, "head": 0})
    assert res.status_code == 422 and "no 'cross' attention" in res.json()["detail"]
    assert client.post("/api/explain", json={"text": "AAA", "top_p": 2}).status_code == 422
    assert client.post("/api/explain", json={"txt": "AAA"}).status_code == 422


@pytest.mark.parametrize(
    "path",
    [
        "/static/../server.py",
        "/static/%2e%2e/server.py",
        "/static/..%2fserver.py",
        "/static/%2e%2e%2f%2e%2e%2fcli.py",
        "/static//etc/passwd",
        "/../../etc/passwd",
    ],
)
def test_server_rejects_paths_outside_its_assets(clients, path):
    client = clients["lm"]
    assert client.get("/static/app.js").status_code == 200
    res = client.get(path)
    assert res.status_code == 404 and b"import" not in res.content and b"root:" not in res.content


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc to read memory")
def test_200_sequential_requests_on_loopback_without_errors_or_memory_growth(tiny_runs):
    """A real uvicorn server on 127.0.0.1; bound: resident memory grows < 40 MiB over 200
    requests after 20 warm-up requests."""
    server, thread, base = serve_in_thread(create_app(load_explainer(tiny_runs["protein"])))
    try:
        with httpx.Client(base_url=base, timeout=30) as http:
            body = {"text": INPUTS["protein"] * 2}
            for _ in range(20):
                assert http.post("/api/explain", json=body).status_code == 200
            before = _rss_mib()
            codes = [http.post("/api/explain", json=body).status_code for _ in range(150)]
            codes += [
                http.post(
                    "/api/steps", json={**body, "kind": "encoder", "layer": i % 2, "head": 0}
                ).status_code
                for i in range(50)
            ]
            grown = _rss_mib() - before
        assert codes == [200] * 200
        assert grown < 40, f"resident memory grew {grown:.1f} MiB over 200 requests"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def test_serve_shuts_down_cleanly_on_ctrl_c(tiny_runs):
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "qkv", "explain", str(tiny_runs["lm"]), "--serve", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        for _ in range(300):
            try:
                if httpx.get(f"http://127.0.0.1:{port}/api/info", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        else:
            pytest.fail("server did not start: " + proc.stderr.read1().decode())
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
    assert proc.returncode == 0, err.decode()
    assert b"Traceback" not in err and b"stopped" in err


def test_serve_on_a_taken_port_is_a_clean_error(tiny_runs):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        res = subprocess.run(
            [sys.executable, "-m", "qkv", "explain", str(tiny_runs["lm"]), "--serve", "--port", str(port)],
            capture_output=True,
            timeout=120,
        )
    assert res.returncode == 2 and res.stderr.decode().startswith("error: cannot listen on 127.0.0.1")


# --- a ViT run: images instead of text -----------------------------------------------------


@pytest.fixture(scope="module")
def vit_client(tiny_vit_run):
    return TestClient(create_app(load_explainer(tiny_vit_run)))


def test_server_explains_an_uploaded_image_every_layer_and_head(vit_client):
    from test_explain_vit import _png_bytes

    client = vit_client
    info = client.get("/api/info").json()
    assert (info["family"], info["input"], info["grid_size"]) == ("vit", "image", 4)
    assert info["max_upload_bytes"] == MAX_IMAGE_BYTES
    res = client.post("/api/image/explain", content=_png_bytes(), headers={"content-type": "image/png"})
    assert res.status_code == 200, res.text
    data = res.json()
    assert data["family"] == "vit" and data["input"].startswith("uploaded image")
    (amap,) = data["attention"]
    weights = amap["weights"]  # (L, H, 1 + N, 1 + N)
    assert len(weights) == info["n_layers"] and all(len(layer) == info["n_heads"] for layer in weights)
    assert all(len(head) == 17 and len(head[0]) == 17 for layer in weights for head in layer)
    assert amap["key_tokens"][:2] == ["CLS", "r1c1"]
    out = data["output"]
    assert (
        len(out["rollout"]) == 4 and len(out["classes"]) == 10 and out["image"].startswith("data:image/png")
    )
    steps = client.post("/api/image/steps?layer=1&head=1", content=_png_bytes()).json()
    assert len(steps["weights"]) == 17 and steps["query_tokens"][0] == "CLS"
    picked = client.post("/api/image/explain?example=2").json()
    assert picked["input"].startswith("digits test image 2")
    examples = client.get("/api/image/examples").json()["examples"]
    assert len(examples) == 10 and examples[0]["image"].startswith("data:image/png")
    # text endpoints refuse an image model (and never read a path the client names)
    res = client.post("/api/explain", json={"text": "/etc/passwd"})
    assert res.status_code == 422 and "takes image input" in res.json()["detail"]


def test_server_refuses_bad_image_uploads_with_413_and_422(vit_client):
    from test_explain_vit import bomb_png, truncated_png

    client = vit_client
    res = client.post("/api/image/explain", content=b"\0" * (MAX_IMAGE_BYTES + 1))
    assert res.status_code == 413 and "request body too large" in res.json()["detail"]

    def chunked():  # no Content-Length: the server counts as it reads
        for _ in range(MAX_IMAGE_BYTES // 2**20 + 1):
            yield b"\0" * 2**20

    res = client.post("/api/image/explain", content=chunked())
    assert res.status_code == 413 and "more than the cap" in res.json()["detail"]
    for body, message in [
        (b"%PDF-1.4 not an image", "not an image file"),
        (truncated_png(), "truncated or corrupt"),
        (bomb_png(), "decompression-bomb guard"),
        (b"", "empty upload"),
    ]:
        res = client.post("/api/image/explain", content=body)
        assert res.status_code == 422 and message in res.json()["detail"], res.text
        assert "\n" not in res.json()["detail"]
    assert client.post("/api/image/explain?example=99999").status_code == 422
    assert client.post("/api/image/explain?example=-1").status_code == 422
    assert client.post("/api/image/steps?layer=5&head=0&example=0").status_code == 422


def test_image_endpoints_refuse_a_text_model(clients):
    res = clients["lm"].post("/api/image/explain", content=b"x")
    assert res.status_code == 422 and "takes text input" in res.json()["detail"]


# --- issue 26: every bad input a clean refusal (4xx, a JSON one-line detail) --------------

BAD_SETTINGS = [  # raw JSON text: json.dumps refuses NaN and the infinities by default
    (f'"seed": {2**70}', 422, "invalid request: seed: Input should be less than 18446744073709551616"),
    (f'"seed": {-(2**70)}', 422, "invalid request: seed: Input should be greater than or equal to 0"),
    ('"seed": -1', 422, "invalid request: seed: Input should be greater than or equal to 0"),
    ('"temperature": NaN', 422, "invalid request: temperature: Input should be a finite number"),
    ('"temperature": Infinity', 422, "invalid request: temperature: Input should be a finite number"),
    ('"temperature": -Infinity', 422, "invalid request: temperature: Input should be a finite number"),
    ('"top_p": NaN', 422, "invalid request: top_p: Input should be a finite number"),
    ('"max_new_tokens": 1e400', 422, "invalid request: max_new_tokens: Input should be a finite number"),
    ('"seed": ' + "9" * 5000, 400, "There was an error parsing the body"),  # over Python's int-digit limit
]


@pytest.mark.parametrize("family", ["lm", "protein"])
@pytest.mark.parametrize("path", ["/api/explain", "/api/steps"])
@pytest.mark.parametrize("setting, status, detail", BAD_SETTINGS)
def test_bad_settings_are_refused_with_a_json_message(clients, family, path, setting, status, detail):
    steps = ', "kind": "decoder", "layer": 0, "head": 0' if path == "/api/steps" else ""
    text = "AAA" if family == "protein" else "ROMEO"
    body = f'{{"text": "{text}", {setting}{steps}}}'
    res = clients[family].post(path, content=body, headers={"content-type": "application/json"})
    assert (res.status_code, res.headers["content-type"]) == (status, "application/json"), res.text
    assert res.json() == {"detail": detail}


@pytest.mark.parametrize(
    "settings",
    [
        {"top_p": 5e-324},
        {"temperature": 1e-300},
        {"temperature": 5e-324},
        {"temperature": 1e-300, "top_p": 5e-324, "seed": 2**64 - 1},
    ],
)
def test_tiny_temperature_and_top_p_are_greedy_not_an_error(clients, settings):
    client = clients["lm"]
    greedy = client.post("/api/explain", json={"text": "ROMEO", "temperature": 0, "max_new_tokens": 8}).json()
    res = client.post("/api/explain", json={"text": "ROMEO", "max_new_tokens": 8, **settings})
    assert res.status_code == 200, res.text
    out = res.json()["output"]
    assert out["next_tokens"][0]["prob"] == 1.0
    if "temperature" in settings:
        assert out["text"] == greedy["output"]["text"]


@pytest.mark.parametrize(
    "body, needle",
    [
        (b'{"text": ', "the body is not valid JSON (Expecting value at character 9)"),
        (b"\xff\xfe", "the body is not valid JSON"),
        (b"[1, 2]", "valid dictionary"),
        (b"null", "valid dictionary"),
    ],
)
def test_unparsable_bodies_get_one_line_json(clients, body, needle):
    res = clients["lm"].post("/api/explain", content=body, headers={"content-type": "application/json"})
    assert res.status_code == 422 and needle in res.json()["detail"] and "\n" not in res.json()["detail"]


def test_a_lone_surrogate_is_refused_with_422(clients):
    """JSON can spell a lone surrogate, which is no character (the subword tokenizer raised
    TypeError on it)."""
    body = b'{"text": "Ein \\ud800 Mann", "max_new_tokens": 3, "beam_size": 1}'
    for client in clients.values():
        res = client.post("/api/explain", content=body, headers={"content-type": "application/json"})
        assert res.status_code == 422 and res.json() == {
            "detail": "invalid request: text: Value error, not valid Unicode: a lone surrogate at position 5"
        }


def test_the_openapi_document_is_served_without_a_docs_ui(clients):
    client = clients["lm"]
    res = client.get("/openapi.json")
    assert res.status_code == 200 and res.headers["content-security-policy"].startswith("default-src 'self'")
    doc = res.json()
    assert {
        "/api/info",
        "/api/explain",
        "/api/steps",
        "/api/activation",
        "/api/intervene",
        "/api/image/explain",
        "/api/image/steps",
    } <= set(doc["paths"])
    kinds = doc["components"]["schemas"]["InterveneRequest"]["properties"]["intervention"]["discriminator"]
    assert set(kinds["mapping"]) == {"ablate_head", "zero_neuron", "patch"}
    seed = doc["components"]["schemas"]["ExplainRequest"]["properties"]["seed"]["anyOf"][0]
    assert (seed["minimum"], seed["exclusiveMaximum"]) == (0, 2**64)
    assert doc["paths"]["/api/explain"]["post"]["responses"]["422"]["content"]["application/json"][
        "schema"
    ] == {"$ref": "#/components/schemas/ErrorMessage"}
    assert client.get("/docs").status_code == 404 and client.get("/redoc").status_code == 404


@pytest.mark.parametrize(
    "query",
    [
        "layer=99999999999999999999999&head=0&example=0",
        f"layer=0&head={2**70}&example=0",
        f"layer=0&head=0&example={2**70}",
        "layer=-1&head=0&example=0",
        "layer=0&head=0&example=NaN",
        "layer=0&head=0&example=1e400",
        "layer=1.5&head=0",
    ],
)
def test_image_query_parameters_out_of_range_are_422(vit_client, query):
    res = vit_client.post("/api/image/steps?" + query)
    assert res.status_code == 422 and isinstance(res.json()["detail"], str), res.text
    res = vit_client.post("/api/image/explain?" + query.rpartition("&")[2])
    assert res.status_code in (200, 422) and (res.status_code == 200 or isinstance(res.json()["detail"], str))
