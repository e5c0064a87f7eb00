"""The explainer page without a server: one self-contained HTML document, for Jupyter and files.

:func:`standalone_page` runs the model once, in Python, on one input and writes everything the page of
``qkv explain --serve`` draws into the page itself: the output, the attention weights of every
kind, layer and head (the head view, the heatmap, all heads, the ViT image overlays) and, for
the Eq. 1 step-through, every head's Q, K and V (float32) and the mask, from which the page's
script recomputes QKᵀ, the scaling, the mask, the softmax and the output exactly as
:func:`qkv.nn.attention.attention_steps` does (Vaswani et al. 2017, §3.2.1, Eq. 1). The page's
script and style are inlined from ``static/``, and a Content-Security-Policy forbids every
request (no server, no CDN, no host: it works offline, from ``file://`` and inside a notebook).

Long inputs are cut before the model runs, to :data:`MAX_TOKENS` tokens by default, and the
page says so: the page holds ``n_layers × n_heads × T²`` weights, and past a few hundred tokens
a browser would stall drawing them.

Interventions: a page cannot rerun its model, so it holds every head's ablation, computed here
(:func:`head_ablations`: each head of each attention kind set to zero, the output decoded again
as the page's was, :meth:`~qkv.explain.explainer.Explainer.intervene`) when the model has at
most :data:`MAX_ABLATIONS` heads in all; its "ablate this head" button looks them up. Zeroing a
neuron and patching from another input need the model (``qkv explain RUN --serve``).
"""

from __future__ import annotations

import base64
import dataclasses
import html
import io
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import QkvError
from .capture import capture_all_steps
from .explainer import PAIR_SEPARATOR, DecodingOptions, Explainer, Explanation, split_pair

STATIC_DIR = Path(__file__).parent / "static"
MAX_TOKENS = 64
"""The default cap on the tokens of a text input shown by :func:`standalone_page` (the step-through's
tables show at most 64 rows anyway)."""
MAX_ABLATIONS = 48
"""A standalone page holds every head's ablation when the model has at most this many heads
over all its attention kinds (each one decodes the output again: a few seconds for a small
model)."""
COMPACT_OUTPUT = ("text", "classes", "residues", "prediction", "similarity", "decoding")
"""The keys of an output an ablation keeps (what the page compares; not the images, maps or
trajectories)."""
UNCAPPED_CHARS = 10_000_000
STANDALONE_CSP = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:"
STYLE_LINK = '<link rel="stylesheet" href="/static/style.css">'
SCRIPT_TAG = '<script src="/static/app.js"></script>'

logger = logging.getLogger(__name__)


@dataclass(repr=False)
class ExplainerPage:
    """A standalone explainer page: Jupyter shows it (:meth:`_repr_html_`, an ``<iframe>``
    whose ``srcdoc`` is :attr:`html`, so the page's script and style cannot touch the
    notebook's); :meth:`save` writes it as one ``.html`` file.

    Attributes:
        html: the whole document (UTF-8 text; its script, style and data inline).
        explanation: what the page shows (:class:`~qkv.explain.explainer.Explanation`).
        notes: what was cut from the input to fit the caps (empty if nothing was).
        height: the iframe's height in the notebook, in CSS pixels (the page scrolls inside).
    """

    html: str
    explanation: Explanation
    notes: list[str] = field(default_factory=list)
    height: int = 900

    def __repr__(self) -> str:
        # a short line where there is no HTML display (a terminal): never the whole document
        return (
            f"<ExplainerPage: {self.explanation.family} model, {len(self.html):,} characters of HTML"
            f"{', input cut' if self.notes else ''}; .save(path) writes it>"
        )

    def _repr_html_(self) -> str:
        # sandbox without allow-same-origin: the page runs in an opaque origin of its own
        return (
            f'<iframe srcdoc="{html.escape(self.html, quote=True)}" sandbox="allow-scripts" '
            f'style="width: 100%; height: {self.height}px; border: 1px solid #ddd; border-radius: 4px;" '
            f'title="qkv explain: {html.escape(self.explanation.family)} model"></iframe>'
        )

    def save(self, path: str | Path) -> Path:
        """Write :attr:`html` to ``path`` (UTF-8; parent folders created) and return the path.
        Raises ``OSError`` when it cannot be written."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.html, encoding="utf-8")
        return path


def standalone_page(
    explainer: Explainer,
    input: Any = None,
    *,
    pair: str | None = None,
    options: DecodingOptions | None = None,
    max_tokens: int = MAX_TOKENS,
    merge_words: bool = True,
    height: int = 900,
    **decoding: Any,
) -> ExplainerPage:
    """The explainer page of one input to an explainer, self-contained:
    ``standalone_page(explainer, "Ein Mann liest.")`` as the last line of a notebook cell draws
    it; ``.save("page.html")`` writes it. :func:`qkv.show` is the same page of a run directory
    (or of an explainer): the one ``show``.

    Args:
        explainer: an explainer (:func:`qkv.load_explainer` loads the one of a run directory,
            trained or converted; :func:`qkv.show` takes a run directory).
        input: what the model reads. Text runs: a string (a sentence to translate, a prompt,
            a protein sequence, a sentence). A sentence encoder (a converted MiniLM or BERT, a
            ``text-cls`` run) also takes a pair, as ``pair=`` (below), as a tuple
            ``(first, second)`` or typed ``"first ||| second"``. ViT runs: a PIL image, a uint8
            array ``(H, W)`` or ``(H, W, channels)`` (converted and resized to the model's input
            like an image file), an image file's path or bytes, or an ``int`` (that image of
            the run's test split). ``None``: the page's example input (test image 0 for a ViT).
        pair: the second sentence of a pair (sentence encoders only): the page's Output then
            shows the cosine similarity of the two sentences' embeddings, the heatmaps the
            attention across both (BERT's ``[CLS] first [SEP] second [SEP]``).
        options: decoding of translation and LM runs (beam size; temperature, top-k, top-p,
            seed, max_new_tokens); ``**decoding``: the same fields as keywords
            (``standalone_page(explainer, "ROMEO:", temperature=0)``), overriding ``options``.
        max_tokens: text inputs longer than this many tokens (special tokens included) are
            cut to fit before the model runs, and the page says so. A ViT reads its whole
            image (``1 + grid²`` tokens).
        merge_words: subword models: attention between words rather than pieces (the
            step-through is always on pieces, as the model computes it).
        height: the notebook iframe's height in pixels.

    Returns:
        an :class:`ExplainerPage` (``_repr_html_`` for Jupyter, ``.save(path)``, ``.html``).

    Raises:
        QkvError: ``explainer`` not an explainer (a run directory: :func:`qkv.show`), an
            empty input, an input of the wrong kind (an image for a text run, a pair
            for a model that is not a sentence encoder), an unknown decoding keyword,
            ``max_tokens`` < 1 or ``height`` < 100; as the explainer for an input the model
            cannot read.
    """
    if not isinstance(explainer, Explainer):
        raise QkvError(
            f"qkv.explain.standalone_page takes an explainer, got {type(explainer).__name__}: for a run "
            "directory call qkv.show(run_dir, ...) or pass qkv.load_explainer(run_dir)"
        )
    options = page_settings(options, max_tokens, height, decoding)
    data = page_data(
        explainer, input, pair=pair, options=options, max_tokens=max_tokens, merge_words=merge_words
    )
    return ExplainerPage(render_page(data), data["explanation_object"], data["notes"], height)


def page_settings(
    options: DecodingOptions | None, max_tokens: int, height: int, decoding: dict[str, Any]
) -> DecodingOptions:
    """The decoding options of a page (``options`` with the keywords ``decoding`` applied),
    after checking the page's settings.

    Raises:
        QkvError: ``max_tokens`` < 1, ``height`` < 100 or an unknown decoding keyword.
    """
    if max_tokens < 1:
        raise QkvError(f"max_tokens must be >= 1 (got {max_tokens})")
    if height < 100:
        raise QkvError(f"height must be >= 100 pixels (got {height})")
    return _decoding(options, decoding)


def _decoding(options: DecodingOptions | None, decoding: dict[str, Any]) -> DecodingOptions:
    known = {f.name for f in dataclasses.fields(DecodingOptions)}
    unknown = sorted(set(decoding) - known)
    if unknown:
        raise QkvError(
            f"unknown option {', '.join(unknown)}; the decoding options are {', '.join(sorted(known))}"
        )
    return dataclasses.replace(options or DecodingOptions(), **decoding)


# ---------- the input


def _image_input(explainer: Explainer, image: Any) -> tuple[Any, str | None]:
    """An image input as :meth:`~qkv.explain.vision.ImageExplainer.read` takes it, and a caption
    for inputs whose own caption would say nothing (arrays and PIL images become PNG bytes)."""
    if image is None:
        return 0, None
    if isinstance(image, (str, Path, bytes, int)) and not isinstance(image, bool):
        return image, None
    if isinstance(image, np.ndarray):
        if image.dtype != np.uint8 or image.ndim not in (2, 3):
            raise QkvError(
                f"an image array must be uint8 (H, W) or (H, W, channels), got {image.dtype} {image.shape}"
            )
        from PIL import Image

        image = Image.fromarray(image if image.ndim == 2 or image.shape[-1] != 1 else image[..., 0])
        caption = f"array {image.width}×{image.height}"
    elif hasattr(image, "save") and hasattr(
        image, "mode"
    ):  # a PIL image, without importing PIL for the check
        caption = f"PIL image {image.width}×{image.height} ({image.mode})"
    else:
        raise QkvError(
            f"a {explainer.family} model takes an image (PIL image, uint8 array, file path or test index), "
            f"not a {type(image).__name__}"
        )
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue(), caption


def _text_input(explainer: Explainer, text: Any, pair: str | None) -> str:
    """One string for the explainer (a pair joined as ``first ||| second``)."""
    if isinstance(text, (tuple, list)):
        if len(text) != 2 or pair is not None:
            raise QkvError("a pair is two sentences: give (first, second), or the first and pair=second")
        text, pair = text
    if text is None:
        if pair is not None:
            raise QkvError("pair= is the second sentence: give the first as the input")
        return str(explainer.example)
    wrong = next((x for x in (text, pair) if x is not None and not isinstance(x, str)), None)
    if wrong is not None:
        raise QkvError(f"a {explainer.family} model takes text (a str), not a {type(wrong).__name__}")
    if pair is None:
        return text
    if explainer.family != "text":
        raise QkvError(f"pair= is for sentence encoders (text runs); this is a {explainer.family} model")
    if PAIR_SEPARATOR in text or PAIR_SEPARATOR in pair:
        raise QkvError(f"a sentence of a pair may not contain {PAIR_SEPARATOR!r}")
    return f"{text} {PAIR_SEPARATOR} {pair}"


def longest_prefix(text: str, fits: Callable[[str], bool]) -> str:
    """The longest prefix of ``text`` that ``fits`` (cut back to a word boundary when one is
    near), by bisection on its length: tokenizers count more tokens for a longer prefix (up to
    a token or two at the cut, which the bisection tolerates)."""
    low, high = 0, len(text)  # fits(text[:low]) holds; text[:high + 1] does not, or is all of it
    while low < high:
        mid = (low + high + 1) // 2
        if fits(text[:mid]):
            low = mid
        else:
            high = mid - 1
    cut = text[:low]
    space = max(cut.rfind(" "), cut.rfind("\n"))
    if low < len(text) and not text[low].isspace() and space > 0.7 * low:
        cut = cut[:space]  # do not end inside a word
    return cut.rstrip()


def fit_text(explainer: Explainer, text: str, max_tokens: int) -> tuple[str, list[str]]:
    """``text`` cut to ``max_tokens`` tokens (and to the explainer's ``max_chars``; a pair: each
    sentence to its share), with one note per cut saying what was dropped."""
    limit = min(max_tokens, explainer.token_limit)
    notes, whole = [], "the input is"
    if len(text) > explainer.max_chars:
        notes.append(
            f"the input has {len(text):,} characters; the page shows the first {explainer.max_chars:,} "
            "(the explainer's max_chars)"
        )
        text, whole = text[: explainer.max_chars], f"its first {explainer.max_chars:,} characters are"
    total = explainer.count_tokens(text)
    if total <= limit:
        return text, notes

    def within(n: int) -> Callable[[str], bool]:
        return lambda prefix: explainer.count_tokens(prefix) <= n

    pair = split_pair(text)
    if pair is None:
        cut = longest_prefix(text, within(limit))
    else:
        # Each sentence alone counts [CLS] and [SEP]; together they share one [CLS]: n1 + n2 - 1.
        # A sentence within half the cap is kept whole; the other gets the rest.
        n1, n2 = (explainer.count_tokens(s) for s in pair)
        half = (limit + 1) // 2
        budget = (n1, limit + 1 - n1) if n1 <= half else (limit + 1 - n2, n2) if n2 <= half else (half, half)
        first, second = (longest_prefix(s, within(n)) for s, n in zip(pair, budget, strict=True))
        cut = f"{first} {PAIR_SEPARATOR} {second}"
    if not cut.strip() or cut.strip() == PAIR_SEPARATOR:
        raise QkvError(f"the input's first token is already over the cap of {limit} tokens")
    shown = explainer.count_tokens(cut)
    notes.append(
        f"{whole} {total:,} tokens long; the page shows the first {shown} (the cap is {limit} tokens: "
        "show(..., max_tokens=N) or qkv explain --max-tokens N raises it, for a larger, slower page)"
    )
    logger.info("explain: input cut from %d to %d tokens", total, shown)
    return cut, notes


# ---------- what the page holds


def _float32_base64(t: torch.Tensor) -> str:
    """A tensor's values as little-endian float32, base64: exact, and a third smaller than
    decimal JSON."""
    return base64.b64encode(t.detach().float().contiguous().cpu().numpy().astype("<f4").tobytes()).decode(
        "ascii"
    )


def step_data(explainer: Explainer, prepared, kind: str) -> dict:
    """Q, K, V of every layer and head of ``kind`` (one forward pass, every layer hooked) and
    the mask, for the page to recompute Eq. 1: ``{"query_tokens", "key_tokens", "d_k",
    "n_heads", "layers": [{"q", "k", "v": base64 float32 (H, T, d_k), "mask": "01…" row by
    row (Tq × Tk, 1 = may attend)}]}``."""
    from .labels import piece_labels

    modules = [explainer.attention_module(kind, i) for i in range(len(explainer.layers(kind)))]
    steps = capture_all_steps(modules, lambda: prepared.forward(False))
    layers = []
    for s in steps:
        allowed = s.masked[0] > torch.finfo(s.masked.dtype).min  # (H, Tq, Tk)
        # Masks broadcast over heads (nn/masks.py), so one head's mask is every head's.
        layers.append(
            {
                "q": _float32_base64(s.q[0]),
                "k": _float32_base64(s.k[0]),
                "v": _float32_base64(s.v[0]),
                "mask": "".join("1" if a else "0" for a in allowed[0].flatten().tolist()),
            }
        )
    q_pieces, k_pieces = prepared.pieces[kind]
    return {
        "query_tokens": piece_labels(q_pieces, explainer.subword),
        "key_tokens": piece_labels(k_pieces, explainer.subword),
        "d_k": modules[0].d_k,
        "n_heads": modules[0].n_heads,
        "layers": layers,
    }


def head_ablations(explainer: Explainer, input: Any, options: DecodingOptions) -> dict:
    """Every head's zero-ablation (:meth:`~qkv.explain.explainer.Explainer.intervene`) of
    ``input``, for the standalone page: ``{"before", "tokens": {"labels", "before"} or None,
    "heads": {kind: [layer][head] → {"description", "after", "changed", "tokens_after"}},
    "note": None}``, outputs cut to :data:`COMPACT_OUTPUT`. A model with no heads to ablate,
    or more than :data:`MAX_ABLATIONS`, gets ``{"heads": None, "note": why}``."""
    spec = explainer.intervene_info()
    if spec is None:
        return {"heads": None, "note": None}
    shape = {
        kind: (len(explainer.layers(kind)), explainer.attention_module(kind, 0).n_heads)
        for kind in spec["ablate_head"]
    }
    total = sum(n_layers * n_heads for n_layers, n_heads in shape.values())
    if total > MAX_ABLATIONS:
        return {
            "heads": None,
            "note": f"This page holds no head ablations: the model has {total} heads, more than the "
            f"{MAX_ABLATIONS} a page precomputes. qkv explain RUN --serve ablates any head.",
        }

    def compact(output: dict) -> dict:
        return {k: output[k] for k in COMPACT_OUTPUT if k in output}

    heads: dict[str, list] = {}
    first: dict | None = None
    for kind, (n_layers, n_heads) in shape.items():
        heads[kind] = []
        for layer in range(n_layers):
            row = []
            for head in range(n_heads):
                ablation = {"kind": "ablate_head", "stack": kind, "layer": layer, "head": head}
                r = explainer.intervene(input, ablation, options)
                first = first or r
                tokens = r["tokens"]
                row.append(
                    {
                        "description": r["description"],
                        "after": compact(r["after"]),
                        "changed": r["changed"],
                        "tokens_after": None if tokens is None else tokens["after"],
                    }
                )
            heads[kind].append(row)
    assert first is not None  # every model has a head
    tokens = first["tokens"]
    return {
        "before": compact(first["before"]),
        "tokens": None if tokens is None else {"labels": tokens["labels"], "before": tokens["before"]},
        "heads": heads,
        "note": None,
    }


@torch.no_grad()
def page_data(
    explainer: Explainer,
    input: Any = None,
    *,
    pair: str | None = None,
    options: DecodingOptions | None = None,
    max_tokens: int = MAX_TOKENS,
    merge_words: bool = True,
) -> dict:
    """Everything the standalone page draws, JSON-ready: ``info``, ``explanation`` (as the
    server's ``/api/explain`` answers), ``body`` (the input and the decoding, as the page
    describes them), ``steps`` (:func:`step_data` per kind), ``interventions``
    (:func:`head_ablations`) and ``notes``; plus
    ``explanation_object`` (the :class:`Explanation`, not JSON: :func:`render_page` drops it).
    Raises as :func:`standalone_page`."""
    options = options or DecodingOptions()
    if explainer.input_kind == "image":
        if pair is not None:
            raise QkvError("pair= is for sentence encoders; this is a vit model, which takes an image")
        image, caption = _image_input(explainer, input)
        explanation = explainer.explain(image, options, merge_words=False)
        explanation.text = caption or explanation.text
        prepared = explainer._prepared(image, options)
        shown: Any = image
        notes: list[str] = []
        body: dict[str, Any] = {"image": explanation.text}
    else:
        text, notes = fit_text(explainer, _text_input(explainer, input, pair), max_tokens)
        explanation = explainer.explain(text, options, merge_words)
        prepared = explainer._prepared(text, options)
        body = {"text": text, **dataclasses.asdict(options)}
        shown = text
    return {
        "info": explainer.info(),
        "explanation": explanation.to_dict(packed=True),
        "explanation_object": explanation,
        "body": body,
        "steps": {kind: step_data(explainer, prepared, kind) for kind in explainer.kinds}
        if explainer.step_through
        else {},
        "interventions": head_ablations(explainer, shown, options),
        "notes": notes,
    }


def _script_json(data: dict) -> str:
    """JSON safe inside ``<script>``: no ``<``, ``>`` or ``&`` (escaped as \\u003c …), so no
    ``</script>`` or comment in the data can end the element; NaN refused."""
    text = json.dumps(data, ensure_ascii=True, allow_nan=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def render_page(data: dict) -> str:
    """The standalone HTML document of :func:`page_data`'s answer: ``static/index.html`` with
    its style and script inline, the data in a ``<script type="application/json">`` element
    the script reads instead of asking a server, and a Content-Security-Policy that forbids
    every request."""
    page = (STATIC_DIR / "index.html").read_text(encoding="utf-8")
    style = (STATIC_DIR / "style.css").read_text(encoding="utf-8")
    script = (STATIC_DIR / "app.js").read_text(encoding="utf-8")
    if STYLE_LINK not in page or SCRIPT_TAG not in page or "</script" in script.lower():
        raise RuntimeError("static/index.html or app.js changed: the standalone page cannot inline them")
    payload = {k: v for k, v in data.items() if k != "explanation_object"}
    csp = f'<meta http-equiv="Content-Security-Policy" content="{STANDALONE_CSP}">'
    return (
        page.replace('<meta charset="utf-8">', f'<meta charset="utf-8">\n  {csp}', 1)
        .replace(STYLE_LINK, f"<style>\n{style}</style>", 1)
        .replace(
            SCRIPT_TAG,
            f'<script type="application/json" id="qkv-data">{_script_json(payload)}</script>\n'
            f"  <script>\n{script}</script>",
            1,
        )
    )
