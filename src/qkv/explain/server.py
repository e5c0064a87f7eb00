"""The local interactive explainer: a FastAPI app over an :class:`~qkv.explain.explainer.Explainer`.

``qkv explain RUN_DIR --serve`` binds to 127.0.0.1 (this machine only) and serves:

- ``GET /``: the page (``static/index.html``), its script and style under ``/static/``. Every
  asset ships inside the package and the page may load nothing from any other host (a
  Content-Security-Policy of ``'self'`` says so to the browser).
- ``GET /api/info``: the model (family, layers, heads, d_k, the input cap, an example input).
- ``POST /api/explain``: the model's output and every layer's and head's attention.
- ``POST /api/steps``: Eq. 1 step by step for one ``kind``/``layer``/``head``.
- ``POST /api/activation``: one named activation (``name``, :mod:`qkv.explain.activations`) at
  one ``token`` of its token axis; an unknown name, a layer or a token out of range is a 422.
  A value that is not finite is ``null`` (the diffusion LM's logit of its mask token, ``-inf``).
- ``POST /api/intervene``: the output before and after one intervention (``intervention``:
  ``{"kind": "ablate_head", "stack", "layer", "head", "mode"}``, ``{"kind": "zero_neuron",
  "layer", "neuron"}`` or ``{"kind": "patch", "source_text", "layer", "point"}``), both decoded
  as ``/api/explain`` decodes, the second with the hooks attached
  (:meth:`~qkv.explain.explainer.Explainer.intervene`); a bad stack, layer, head, neuron or
  point is a 422, and so is any intervention on a recurrent run (no heads).

``/api/explain``'s ``output.block`` holds the "follow a token" views of every token
(:func:`qkv.explain.block.follow_tokens`): the residual stream, the norms, the FFN's top neurons,
the logit lens and the final logits.

A ViT run (:class:`~qkv.explain.vision.ImageExplainer`) takes images instead of text; the
text endpoints refuse it, and these answer instead:

- ``GET /api/image/examples``: a few test-set images to pick (index, true class, PNG).
- ``POST /api/image/explain[?example=K]``: the body is an image file's bytes (any
  ``Content-Type``; Pillow reads the content), or empty with ``example`` = a test-set index.
  Answers as ``/api/explain``, plus the image, the patch grid and the rollout.
- ``POST /api/image/steps?layer=L&head=H[&example=K]``: Eq. 1 for one head, the same body.

- ``GET /openapi.json``: the OpenAPI document of these endpoints (no docs UI: FastAPI's loads
  its script from a CDN, which the page's Content-Security-Policy forbids).

Errors are JSON ``{"detail": message}``, the message one line: 413 for an input over the cap
(``max_chars`` characters, the model's context in tokens, or a request body over
:data:`MAX_BODY_BYTES`, for images :data:`MAX_IMAGE_BYTES`), 422 for anything else wrong with
the input (unknown characters, layer out of range, bad settings, an image that is not one, is
truncated or is a decompression bomb), and for a body or query that does not fit the schema
(``"invalid request: temperature: Input should be a finite number"``; the offending value is
never echoed, so NaN, infinities or invalid Unicode cannot break the answer), 400 for a body
that cannot be parsed at all. The settings' bounds: ``temperature`` a finite number in
[0, 10] (0 = greedy; tiny values are greedy-equivalent, see :mod:`qkv.inference.sampling`),
``top_p`` in (0, 1], ``top_k`` >= 1, ``seed`` an integer in [0, 2**64) (what
``torch.Generator.manual_seed`` accepts, negatives aside). Requests are answered one at a time
(a lock): a model is not re-entrant while a step-through's hook is attached, and one user on a
laptop needs no more.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, cast

from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, ConfigDict, Field, field_validator
from starlette.concurrency import run_in_threadpool

from .. import cpu_share
from ..errors import QkvError
from .explainer import DecodingOptions, Explainer, InputTooLong

if TYPE_CHECKING:
    import uvicorn

    from .vision import ImageExplainer

STATIC_DIR = Path(__file__).parent / "static"
MAX_BODY_BYTES = 64 * 1024
MAX_IMAGE_BYTES = 8 * 1024 * 1024  # an image upload (a large phone photo is 3-5 MB)
IMAGE_API = "/api/image/"
DECODING_FIELDS = {f.name for f in dataclasses.fields(DecodingOptions)}  # body keys that decode
CSP = "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'"
SEED_LIMIT = 2**64  # torch.Generator.manual_seed takes seeds below 2**64 (and >= -2**63)

logger = logging.getLogger(__name__)


class SafeJSONResponse(JSONResponse):
    """JSON that any client can parse: non-ASCII escaped (a lone surrogate in an echoed input
    cannot fail to encode), and NaN or infinities refused rather than sent as invalid JSON."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode()


class ErrorMessage(BaseModel):
    """Every error's body: one line naming the problem."""

    detail: str


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorMessage, "description": what}
    for code, what in [
        (400, "the body cannot be parsed"),
        (413, "the input or the body is over the cap"),
        (422, "the input or a setting is wrong (the message says which)"),
    ]
}
IMAGE_ERRORS: dict[int | str, dict[str, Any]] = {
    code: ERROR_RESPONSES[code] for code in (413, 422)
}  # the body is read raw


def _valid_unicode(text: str) -> str:
    """``text`` if it is valid Unicode: JSON can spell a lone surrogate (``"\\ud800"``), which
    is not a character (the tokenizers would fail on it). Raises ValueError (a 422)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"not valid Unicode: a lone surrogate at position {exc.start + 1}") from None
    return text


class ExplainRequest(BaseModel):
    """Body of ``POST /api/explain``: the input and the decoding settings."""

    model_config = ConfigDict(extra="forbid")
    text: str
    beam_size: int | None = Field(None, ge=1, le=16, description="null: the model's own (translation 4)")
    max_new_tokens: int = Field(40, ge=0, le=400)
    temperature: float = Field(
        1.0, ge=0.0, le=10.0, allow_inf_nan=False, description="0 = greedy; tiny values are greedy-equivalent"
    )
    top_k: int | None = Field(None, ge=1)
    top_p: float | None = Field(
        None,
        gt=0.0,
        le=1.0,
        allow_inf_nan=False,
        description="the nucleus always keeps the most likely token",
    )
    seed: int | None = Field(
        0, ge=0, lt=SEED_LIMIT, description="0 <= seed < 2**64, the range torch's generator accepts"
    )
    step: int | None = Field(
        None, ge=0, le=4096, description="a diffusion LM: the denoising step whose input the attention is on"
    )
    merge_words: bool = True

    @field_validator("text")
    @classmethod
    def _unicode(cls, text: str) -> str:
        return _valid_unicode(text)

    def options(self) -> DecodingOptions:
        return DecodingOptions(**self.model_dump(include=DECODING_FIELDS))


class StepsRequest(ExplainRequest):
    """Body of ``POST /api/steps``: an explain body plus the head to step through."""

    kind: str
    layer: int = Field(ge=0)
    head: int = Field(ge=0)


class ActivationRequest(ExplainRequest):
    """Body of ``POST /api/activation``: an explain body plus a named activation
    (:mod:`qkv.explain.activations`) and the token to read it at."""

    name: str = Field(max_length=200, description="e.g. layers.0.ffn.hidden, decoder.layers.1.resid_post")
    token: int = Field(ge=0, description="the token's index in the stack that holds the activation")


class AblateHead(BaseModel):
    """One head's output (``z``, before ``W_O``) set to zero or to its mean over the input."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["ablate_head"]
    stack: str | None = Field(
        None, max_length=20, description="the attention kind: encoder, decoder or cross (null: the only one)"
    )
    layer: int = Field(ge=0)
    head: int = Field(ge=0)
    mode: Literal["zero", "mean"] = "zero"


class ZeroNeuron(BaseModel):
    """One FFN hidden unit of a layer of the stack that produces the output, set to zero."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["zero_neuron"]
    layer: int = Field(ge=0)
    neuron: int = Field(ge=0)


class PatchResidual(BaseModel):
    """The residual stream at one layer of the stack that reads the input, taken from the run
    of another input (the positions both have: a common prefix)."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["patch"]
    source_text: str = Field(description="the other input, whose run is patched in")
    layer: int = Field(ge=0)
    point: Literal["resid_pre", "resid_post"] = "resid_pre"

    @field_validator("source_text")
    @classmethod
    def _unicode(cls, text: str) -> str:
        return _valid_unicode(text)


Intervention = Annotated[AblateHead | ZeroNeuron | PatchResidual, Field(discriminator="kind")]


class InterveneRequest(ExplainRequest):
    """Body of ``POST /api/intervene``: an explain body plus one intervention."""

    intervention: Intervention


# The image endpoints read the raw body themselves; the OpenAPI document says what it is.
IMAGE_BODY = {
    "requestBody": {
        "required": False,
        "description": "an image file (PNG, JPEG, ...), or empty with ?example=INDEX",
        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
    }
}


def validation_message(errors: Sequence[Any]) -> str:
    """Pydantic's validation errors as one line, ``"invalid request: where: what; ..."``,
    without the offending values (they may be NaN, infinite or not valid Unicode)."""
    parts = []
    for error in errors:
        loc = [str(p) for p in error.get("loc", ()) if p != "body"]
        msg = str(error.get("msg", "invalid value"))
        if error.get("type") == "json_invalid":  # loc is ("body", character offset)
            why = (error.get("ctx") or {}).get("error")
            why = why if isinstance(why, str) else msg
            msg, loc = f"the body is not valid JSON ({why} at character {loc[0] if loc else 0})", []
        parts.append((".".join(loc) + ": " if loc else "") + msg)
    return " ".join(("invalid request: " + "; ".join(parts)).split())


def create_app(explainer: Explainer) -> FastAPI:
    """The web app for one loaded model. Raises nothing; errors become JSON responses."""
    # /openapi.json is served; the docs UIs stay off (they load assets from a CDN).
    app = FastAPI(
        title="qkv explain",
        docs_url=None,
        redoc_url=None,
        openapi_url="/openapi.json",
        default_response_class=SafeJSONResponse,
    )
    lock = threading.Lock()  # one request at a time: see the module docstring
    _add_guards(app)
    _add_page(app, explainer)
    _add_text_api(app, explainer, lock)
    _add_image_api(app, explainer, lock)
    # StaticFiles resolves paths inside STATIC_DIR only: "..", encoded or not, gets a 404.
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    return app


def _too_large(size: str, cap: int) -> JSONResponse:
    return SafeJSONResponse(
        {"detail": f"request body too large: {size} bytes, the cap is {cap}"}, status_code=413
    )


def _add_guards(app: FastAPI) -> None:
    """What every request goes through: the body cap (by Content-Length, before the body is
    read), the security headers, and errors turned into one-line JSON answers."""

    @app.middleware("http")
    async def guard(request: Request, call_next):
        length = request.headers.get("content-length")
        cap = MAX_IMAGE_BYTES if request.url.path.startswith(IMAGE_API) else MAX_BODY_BYTES
        if length is not None and length.isdigit() and int(length) > cap:
            return _too_large(length, cap)
        response = await call_next(request)
        response.headers["Content-Security-Policy"] = CSP
        response.headers["X-Content-Type-Options"] = "nosniff"
        return response

    @app.exception_handler(QkvError)
    async def input_error(request: Request, exc: QkvError):
        return SafeJSONResponse(
            {"detail": str(exc)}, status_code=413 if isinstance(exc, InputTooLong) else 422
        )

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError):
        return SafeJSONResponse({"detail": validation_message(exc.errors())}, status_code=422)


def _check_input_kind(explainer: Explainer, want: str) -> None:
    """Refuse a request for the other kind of input, saying where this model's input goes."""
    if explainer.input_kind != want:
        images = explainer.input_kind == "image"
        where = "POST the image file to /api/image/explain" if images else "POST JSON to /api/explain"
        raise QkvError(f"this {explainer.family} model takes {explainer.input_kind} input: {where}")


def _add_page(app: FastAPI, explainer: Explainer) -> None:
    """``GET /`` (the page) and ``GET /api/info`` (the model, for the page's controls)."""
    images = explainer.input_kind == "image"

    @app.get("/", response_class=HTMLResponse)
    def index():
        return FileResponse(STATIC_DIR / "index.html", media_type="text/html")

    @app.get("/api/info")
    def info():
        return {**explainer.info(), "max_upload_bytes": MAX_IMAGE_BYTES} if images else explainer.info()


def _add_text_api(app: FastAPI, explainer: Explainer, lock: threading.Lock) -> None:
    """``POST /api/explain``, ``POST /api/steps``, ``POST /api/activation`` and
    ``POST /api/intervene``: text input, JSON bodies."""

    @app.post("/api/explain", responses=ERROR_RESPONSES)
    def explain(body: ExplainRequest):
        _check_input_kind(explainer, "text")
        with lock:
            return explainer.explain(body.text, body.options(), body.merge_words).to_dict()

    @app.post("/api/steps", responses=ERROR_RESPONSES)
    def steps(body: StepsRequest):
        _check_input_kind(explainer, "text")
        with lock:
            return explainer.steps(body.text, body.kind, body.layer, body.head, body.options())

    @app.post("/api/activation", responses=ERROR_RESPONSES)
    def activation(body: ActivationRequest):
        _check_input_kind(explainer, "text")
        with lock:
            return explainer.activation(body.text, body.name, body.token, body.options())

    @app.post("/api/intervene", responses=ERROR_RESPONSES)
    def intervene(body: InterveneRequest):
        _check_input_kind(explainer, "text")
        with lock:
            return explainer.intervene(body.text, body.intervention.model_dump(), body.options())


def _add_image_api(app: FastAPI, explainer: Explainer, lock: threading.Lock) -> None:
    """The ``/api/image/`` endpoints of a ViT run: test-set examples, and explain and steps on
    an uploaded image (the raw body) or an example."""

    async def image_input(request: Request, example: int | None) -> bytes | int:
        """The uploaded bytes (read up to the cap, whatever Content-Length said), or the
        index of a test image."""
        _check_input_kind(explainer, "image")
        data, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > MAX_IMAGE_BYTES:
                raise InputTooLong(f"request body too large: more than the cap of {MAX_IMAGE_BYTES} bytes")
            data.append(chunk)
        if example is None:
            return b"".join(data)
        if size:
            raise QkvError("send either an image file or ?example=INDEX, not both")
        return example

    def locked(fn, *args):
        def call():
            with lock:
                return fn(*args)

        return run_in_threadpool(call)  # the model runs off the event loop, one call at a time

    @app.get(IMAGE_API + "examples", responses={422: ERROR_RESPONSES[422]})
    def image_examples():  # a plain def: FastAPI runs it on a worker thread
        _check_input_kind(explainer, "image")
        with lock:
            # _check_input_kind passed: only an ImageExplainer takes image input.
            return {"examples": cast("ImageExplainer", explainer).examples()}

    @app.post(IMAGE_API + "explain", responses=IMAGE_ERRORS, openapi_extra=IMAGE_BODY)
    async def image_explain(request: Request, example: int | None = Query(None, ge=0)):
        image = await image_input(request, example)
        return await locked(lambda: explainer.explain(image).to_dict())

    @app.post(IMAGE_API + "steps", responses=IMAGE_ERRORS, openapi_extra=IMAGE_BODY)
    async def image_steps(
        request: Request,
        layer: int = Query(ge=0),
        head: int = Query(ge=0),
        example: int | None = Query(None, ge=0),
    ):
        image = await image_input(request, example)
        return await locked(explainer.steps, image, "encoder", layer, head)


def serve(
    explainer: Explainer, host: str = "127.0.0.1", port: int = 8765, log: Callable[[str], None] | None = None
) -> int:
    """Serve the page until Ctrl-C (uvicorn finishes the request in flight, then returns 0).

    ``log`` receives the two status lines (address, stopped); by default they go to the
    ``qkv.explain.server`` logger at INFO. uvicorn's own logging is left unconfigured
    (``log_config=None``): its records propagate to whatever the caller set up. The CPU
    threads follow the machine's load as serving starts (:func:`qkv.cpu_share.for_command`;
    the request threads take that count at their first operation), and are given back after.

    Raises:
        QkvError: the port is taken or the address cannot be bound.
    """
    import socket

    import uvicorn

    try:  # a clear message instead of uvicorn's log line and exit(1)
        with socket.create_server((host, port)):
            pass
    except OSError as exc:
        raise QkvError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    log = log or logger.info
    log(
        f"qkv explain: {explainer.family} model {explainer.run_dir} at http://{host}:{port}/ (Ctrl-C to stop)"
    )
    with cpu_share.for_command() as cpu:
        cpu.announce()
        uvicorn.run(create_app(explainer), host=host, port=port, log_level="warning", log_config=None)
    log("qkv explain: stopped")
    return 0


def serve_in_thread(
    app: FastAPI, host: str = "127.0.0.1", port: int = 0, timeout: float = 10.0
) -> tuple[uvicorn.Server, threading.Thread, str]:
    """Start ``app`` on a background thread (tests, screenshots); ``port=0`` picks a free port.

    Returns ``(server, thread, base_url)``; stop with ``server.should_exit = True`` then
    ``thread.join()``. Raises ``RuntimeError`` if the server has not started within ``timeout``
    seconds.
    """
    import socket
    import time

    import uvicorn

    if port == 0:
        with socket.socket() as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", log_config=None))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            server.should_exit = True
            raise RuntimeError(f"the explainer server did not start on {host}:{port}")
        time.sleep(0.05)
    return server, thread, f"http://{host}:{port}"
