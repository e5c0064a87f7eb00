"""The local interactive explainer: a FastAPI app over an :class:`~qkv.explain.explainers.Explainer`.

``qkv explain RUN_DIR --serve`` binds to 127.0.0.1 (this machine only) and serves:

- ``GET /``: the page (``static/index.html``), its script and style under ``/static/``. Every
  asset ships inside the package and the page may load nothing from any other host (a
  Content-Security-Policy of ``'self'`` says so to the browser).
- ``GET /api/info``: the model (family, layers, heads, d_k, the input cap, an example input).
- ``POST /api/explain``: the model's output and every layer's and head's attention.
- ``POST /api/steps``: Eq. 1 step by step for one ``kind``/``layer``/``head``.

A ViT run (:class:`~qkv.explain.vision.ImageExplainer`) takes images instead of text; the
two text endpoints refuse it, and these answer instead:

- ``GET /api/image/examples``: a few test-set images to pick (index, true class, PNG).
- ``POST /api/image/explain[?example=K]``: the body is an image file's bytes (any
  ``Content-Type``; Pillow reads the content), or empty with ``example`` = a test-set index.
  Answers as ``/api/explain``, plus the image, the patch grid and the rollout.
- ``POST /api/image/steps?layer=L&head=H[&example=K]``: Eq. 1 for one head, the same body.

Errors are JSON ``{"detail": message}``: 413 for an input over the cap (``max_chars``
characters, the model's context in tokens, or a request body over :data:`MAX_BODY_BYTES`,
for images :data:`MAX_IMAGE_BYTES`), 422 for anything else wrong with the input (unknown
characters, layer out of range, bad settings, an image that is not one, is truncated or is
a decompression bomb). Requests are answered one at a time (a lock): a model is not re-entrant while
a step-through's hook is attached, and one user on a laptop needs no more.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from pathlib import Path
from typing import Callable

from fastapi import FastAPI, Query, Request
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from ..errors import QkvError
from .explainers import DecodingOptions, Explainer, InputTooLong

STATIC_DIR = Path(__file__).parent / "static"
MAX_BODY_BYTES = 64 * 1024
MAX_IMAGE_BYTES = 8 * 1024 * 1024  # an image upload (a large phone photo is 3-5 MB)
IMAGE_API = "/api/image/"
DECODING_FIELDS = {f.name for f in dataclasses.fields(DecodingOptions)}  # body keys that decode
CSP = "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'"

logger = logging.getLogger(__name__)


class ExplainRequest(BaseModel):
    """Body of ``POST /api/explain``: the input and the decoding settings."""

    model_config = ConfigDict(extra="forbid")
    text: str
    beam_size: int = Field(4, ge=1, le=16)
    max_new_tokens: int = Field(40, ge=0, le=400)
    temperature: float = Field(1.0, ge=0.0, le=10.0)
    top_k: int | None = Field(None, ge=1)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    seed: int | None = 0
    merge_words: bool = True

    def options(self) -> DecodingOptions:
        return DecodingOptions(**self.model_dump(include=DECODING_FIELDS))


class StepsRequest(ExplainRequest):
    """Body of ``POST /api/steps``: an explain body plus the head to step through."""

    kind: str
    layer: int = Field(ge=0)
    head: int = Field(ge=0)


def create_app(explainer: Explainer) -> FastAPI:
    """The web app for one loaded model. Raises nothing; errors become JSON responses."""
    app = FastAPI(title="qkv explain", docs_url=None, redoc_url=None, openapi_url=None)
    lock = threading.Lock()

    def too_large(size: str, cap: int) -> JSONResponse:
        return JSONResponse({"detail": f"request body too large: {size} bytes, the cap is {cap}"},
                            status_code=413)

    @app.middleware("http")
    async def guard(request: Request, call_next):
        length = request.headers.get("content-length")
        cap = MAX_IMAGE_BYTES if request.url.path.startswith(IMAGE_API) else MAX_BODY_BYTES
        if length is not None and length.isdigit() and int(length) > cap:
            return too_large(length, cap)
        response = await call_next(request)
        response.headers["Content-Security-Policy"] = CSP
        response.headers["X-Content-Type-Options"] = "nosniff"
        return response

    @app.exception_handler(QkvError)
    async def input_error(request: Request, exc: QkvError):
        return JSONResponse({"detail": str(exc)}, status_code=413 if isinstance(exc, InputTooLong) else 422)

    @app.get("/")
    def index():
        return FileResponse(STATIC_DIR / "index.html", media_type="text/html")

    images = explainer.input_kind == "image"

    def check_input_kind(want: str) -> None:
        if explainer.input_kind != want:
            where = "POST the image file to /api/image/explain" if images else "POST JSON to /api/explain"
            raise QkvError(f"this {explainer.family} model takes {explainer.input_kind} input: {where}")

    @app.get("/api/info")
    def info():
        return {**explainer.info(), "max_upload_bytes": MAX_IMAGE_BYTES} if images else explainer.info()

    @app.post("/api/explain")
    def explain(body: ExplainRequest):
        check_input_kind("text")
        with lock:
            return explainer.explain(body.text, body.options(), body.merge_words).to_dict()

    @app.post("/api/steps")
    def steps(body: StepsRequest):
        check_input_kind("text")
        with lock:
            return explainer.steps(body.text, body.kind, body.layer, body.head, body.options())

    async def image_input(request: Request, example: int | None) -> bytes | int:
        """The uploaded bytes (read up to the cap, whatever Content-Length said), or the
        index of a test image."""
        check_input_kind("image")
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

    @app.get(IMAGE_API + "examples")
    def image_examples():  # a plain def: FastAPI runs it on a worker thread
        check_input_kind("image")
        with lock:
            return {"examples": explainer.examples()}

    @app.post(IMAGE_API + "explain")
    async def image_explain(request: Request, example: int | None = Query(None, ge=0)):
        image = await image_input(request, example)
        return await locked(lambda: explainer.explain(image).to_dict())

    @app.post(IMAGE_API + "steps")
    async def image_steps(request: Request, layer: int = Query(ge=0), head: int = Query(ge=0),
                          example: int | None = Query(None, ge=0)):
        image = await image_input(request, example)
        return await locked(explainer.steps, image, "encoder", layer, head)

    # StaticFiles resolves paths inside STATIC_DIR only: "..", encoded or not, gets a 404.
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    return app


def serve(explainer: Explainer, host: str = "127.0.0.1", port: int = 8765,
          log: Callable[[str], None] | None = None) -> int:
    """Serve the page until Ctrl-C (uvicorn finishes the request in flight, then returns 0).

    ``log`` receives the two status lines (address, stopped); by default they go to the
    ``qkv.explain.server`` logger at INFO. uvicorn's own logging is left unconfigured
    (``log_config=None``): its records propagate to whatever the caller set up.

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
    log(f"qkv explain: {explainer.family} model {explainer.run_dir} at http://{host}:{port}/ "
        "(Ctrl-C to stop)")
    uvicorn.run(create_app(explainer), host=host, port=port, log_level="warning", log_config=None)
    log("qkv explain: stopped")
    return 0


def serve_in_thread(app: FastAPI, host: str = "127.0.0.1", port: int = 0, timeout: float = 10.0):
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
