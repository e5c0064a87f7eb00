"""The live page: the model runs in the reader's browser (``qkv explain RUN --live DIR``).

:func:`write_live_page` exports the run to ONNX with its attention weights
(:func:`qkv.hub.onnx_export.export_onnx`) and writes, beside the graphs, a page that loads them
with onnxruntime-web (WebAssembly; vendored in ``static/ort/`` with its licence and checksums,
no CDN), tokenizes in the browser, decodes one token at a time through the exported key/value
cache, and draws the attention of any layer and head. The folder is a static site: serve it
(``python -m http.server -d DIR``, or a docs site; browsers do not load WebAssembly from
``file://``).

Families so far: the decoder LM with a character vocabulary (greedy, or sampling with temperature
and top-k; the attention of the whole text) and the translator (greedy, as ``qkv translate
--beam 1``; its subword tokenizer read in the browser by tokenizers.js, vendored in
``static/tokenizers/``; the cross-attention of what it wrote) and the ViT (an image drawn with
the mouse or opened from a file, at the model's size; the classes' probabilities and every
layer's attention) and the captioner of garment scenes (the reader picks Fashion-MNIST garments
into the 2 × 2 grid, from a sheet of test images written beside the graphs; greedy, as
``qkv caption`` with beam 1; where each word of the caption looked). Others are refused in one
line. A translator's page names its languages (:func:`translation_languages`, written into the
export's ``onnx.json`` as ``"languages"``) and the characters of a sentence its vocabulary lacks.

The page samples with a seeded generator so that Python can replay it: :func:`page_sampler` is
the same sampler, step for step (mulberry32 for the uniform draw; softmax in float64 over
``logits / temperature``; top-k keeps the k largest, ties to the lower id; the token is the first
id, in id order, whose running sum passes the draw).
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from ..data.images import load_fashion_mnist
from ..data.scenes import CELL, NOUNS
from ..data.tokenizers import CharTokenizer, load_tokenizer
from ..errors import QkvError
from ..files import refuse_nonempty, write_json
from ..hub.onnx_export import MANIFEST, export_onnx, read_manifest

STATIC = Path(__file__).parent / "static"
VENDORED = {  # folder under static/ -> the files the page loads (README.txt and SHA256SUMS stay)
    "ort": ("ort.wasm.min.js", "ort-wasm-simd-threaded.mjs", "ort-wasm-simd-threaded.wasm", "LICENSE"),
    "tokenizers": ("tokenizers.min.mjs", "LICENSE"),
}
LIVE_RECIPES = ("lm", "translation", "vit", "caption")
GARMENTS_PER_CLASS = 4  # the composer's choice of Fashion-MNIST test images per class
LANGUAGE_NAMES = {"en": "English", "de": "German", "fr": "French", "cs": "Czech"}  # Multi30k's
_MASK32 = 0xFFFFFFFF


def write_live_page(run_dir: str | Path, out_dir: str | Path, weights: str = "float32") -> Path:
    """Write the live page of the run in ``run_dir`` into the new folder ``out_dir``:
    ``index.html``, ``live.js``, ``ort/`` (onnxruntime-web), ``tokenizers/`` (tokenizers.js) and
    ``model/`` (the export, with attention outputs; a captioner's garments beside it). ``weights``:
    as :func:`~qkv.hub.onnx_export.export_onnx`'s (``"float16"`` halves the download). Returns
    the page's path.

    Raises:
        QkvError: ``out_dir`` exists and is not empty; a run of a family the page does not run
            yet; what :func:`~qkv.hub.onnx_export.export_onnx` raises.
    """
    from ..runs.info import RunInfo, run_settings
    from ..runs.layout import TOKENIZER

    out = Path(out_dir)
    refuse_nonempty(out, "folder")
    recipe = RunInfo.read(Path(run_dir)).recipe
    if recipe not in LIVE_RECIPES:
        raise QkvError(f"the live page runs {', '.join(LIVE_RECIPES)} runs so far; this is a {recipe!r} run")
    if recipe == "lm" and not isinstance(load_tokenizer(Path(run_dir) / TOKENIZER), CharTokenizer):
        raise QkvError("the live page runs LMs with a character vocabulary so far; this run's is not one")
    sheet = _garment_sheet(run_dir) if recipe == "caption" else None  # before anything is written
    languages = translation_languages(run_settings(run_dir)) if recipe == "translation" else None
    export_onnx(run_dir, out / "model", attentions=True, weights=weights)
    if languages is not None:
        write_json(out / "model" / MANIFEST, {**read_manifest(out / "model"), "languages": languages})
    if sheet is not None:
        from PIL import Image

        Image.fromarray(sheet, "L").save(out / "model" / "garments.png")
        write_json(
            out / "model" / "garments.json",
            {"nouns": list(NOUNS), "cell": CELL, "per_class": GARMENTS_PER_CLASS},
        )
    for folder, names in VENDORED.items():
        (out / folder).mkdir()
        for name in names:
            shutil.copyfile(STATIC / folder / name, out / folder / name)
    shutil.copyfile(STATIC / "live.js", out / "live.js")
    shutil.copyfile(STATIC / "live.html", out / "index.html")
    return out / "index.html"


def translation_languages(settings: dict) -> dict | None:
    """What a translation run translates, from its settings (``train_config.json``, as
    :func:`~qkv.runs.info.run_settings` reads it): ``{"source": {"code", "name"}, "target":
    {...}}``. A Multi30k run: ``src_lang``/``tgt_lang`` (``"de"`` → ``{"code": "de", "name":
    "German"}``; the recipe's defaults, de and en, where the file leaves them out). A run on
    its own pairs (``data=``): the two ``columns`` it read (code ``None``), or ``None`` when the
    file's columns have no names."""
    if settings.get("data"):
        columns = settings.get("columns")
        if not columns:
            return None
        names = [c.strip() for c in str(columns).split(",")]
        return {"source": {"code": None, "name": names[0]}, "target": {"code": None, "name": names[-1]}}
    codes = (str(settings.get("src_lang", "de")), str(settings.get("tgt_lang", "en")))
    return {
        side: {"code": code, "name": LANGUAGE_NAMES.get(code, code)}
        for side, code in zip(("source", "target"), codes, strict=True)
    }


def _garment_sheet(run_dir: str | Path) -> np.ndarray:
    """The composer's garments: the first :data:`GARMENTS_PER_CLASS` Fashion-MNIST test images
    of each class, uint8 ``(10 * 28, GARMENTS_PER_CLASS * 28)``, a row per class (:data:`NOUNS`
    order). A captioner trained on other images is refused: the page composes scenes only.

    Raises:
        QkvError: the run's task is not the scenes of :mod:`qkv.data.scenes`; Fashion-MNIST is
            missing (see :func:`~qkv.data.images.load_fashion_mnist`).
    """
    from ..runs.info import run_json
    from ..runs.layout import TASK

    task = run_json(run_dir, TASK, missing={}).get("task")
    if task != "scenes":
        raise QkvError(
            f"the live page composes garment scenes; this captioner's task is {task!r}, not 'scenes'"
        )
    test = load_fashion_mnist("test")
    picks = [np.flatnonzero(test.labels == label)[:GARMENTS_PER_CLASS] for label in range(len(NOUNS))]
    rows = [np.concatenate([test.images[i, :, :, 0] for i in pick], axis=1) for pick in picks]
    return np.concatenate(rows, axis=0)


def mulberry32(seed: int) -> Iterator[float]:
    """Uniform draws in [0, 1) from mulberry32 (Tommy Ettinger's 32-bit generator), the page's
    ``mulberry32(seed)`` bit for bit: JavaScript has no seedable generator of its own."""
    state = seed & _MASK32
    while True:
        state = (state + 0x6D2B79F5) & _MASK32
        t = ((state ^ (state >> 15)) * (state | 1)) & _MASK32
        t = ((t + (((t ^ (t >> 7)) * (t | 61)) & _MASK32)) & _MASK32) ^ t
        yield ((t ^ (t >> 14)) & _MASK32) / 4294967296


def page_sampler(logits: Sequence[float], u: float, temperature: float, top_k: int | None) -> int:
    """The page's choice of the next token from one row of float logits and a uniform draw
    ``u`` (see the module docstring); ``temperature`` 0 is greedy (the first largest logit).

    Raises:
        ValueError: a negative temperature or a top-k below 1.
    """
    if temperature < 0 or (top_k is not None and top_k < 1):
        raise ValueError(f"temperature must be >= 0 and top_k >= 1 (got {temperature}, {top_k})")
    values = [float(x) for x in logits]
    if temperature == 0:
        return max(range(len(values)), key=lambda i: (values[i], -i))
    best = sorted(range(len(values)), key=lambda i: (-values[i], i))[: top_k or len(values)]
    kept = sorted(best)  # id order: the order the page sums in
    weights = [math.exp((values[i] - values[best[0]]) / temperature) for i in kept]
    total = sum(weights)
    running = 0.0
    for i, weight in zip(kept, weights, strict=True):
        running += weight / total
        if running > u:
            return i
    return kept[-1]
