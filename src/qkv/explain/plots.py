"""Pictures of attention (matplotlib, written as PNG): what ``qkv explain --out DIR`` draws.

- :func:`plot_attention_grid`: one heatmap per layer and head (rows: layers, columns: heads),
  query tokens down, key tokens across, one shared colour bar (0 to the largest weight).
- :func:`plot_alignment`: cross-attention of a translation, source × target, averaged over the
  heads of one layer (the "alignment" picture of Bahdanau et al. 2015 and the notes).
- :func:`plot_positional_encoding`: the positions × dimensions matrix a model adds (sinusoidal
  PE of §3.5, learned embeddings) or the rotary angles' cosines.
- :func:`plot_bars`: probabilities as horizontal bars (next tokens, classes).
- :func:`plot_logit_lens`: the logit lens, layers × tokens, each cell the top output there.
- :func:`plot_image_attention`: a ViT's class-token attention over the patches, one panel per
  head of a layer, overlaid on the image with the patch grid drawn; :func:`plot_rollout`:
  attention rollout (Abnar & Zuidema 2020) drawn the same way.
- :func:`plot_caption_attention`: a captioner's cross-attention for each generated word over
  the image, one panel per word in caption order (Show, Attend and Tell, Xu et al. 2015,
  Figures 2 and 3); :func:`plot_caption_heads`: the same for every head of one decoder layer.
- :func:`plot_patching`: an activation-patching table (Meng et al. 2022, §2.1), layers × positions
  or heads, each cell the share of the clean run's metric that patching it restores.

Every function returns the :class:`~matplotlib.figure.Figure` so tests can count axes;
:func:`save` writes it atomically. Figures are built with matplotlib's object API
(:func:`figure`, no pyplot): nothing global changes (no backend chosen, no figure manager, no
display needed), and a figure is freed like any object once unreferenced. matplotlib is the
``plot`` extra (``pip install 'qkv[plot]'``): it is imported when the first figure is made, so
importing this module needs none, and a missing one is refused in one line (:func:`figure`).
"""

from __future__ import annotations

import base64
import io
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..extras import require
from ..files import atomic_write, write_text
from ..nn.positional import LearnedPositionalEmbedding, RotaryEmbedding, SinusoidalPositionalEncoding

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from .explainer import DecodingOptions, Explainer
    from .interventions import PatchingTable

CMAP = "Blues"
OVERLAY_CMAP = "inferno"  # bright on a grey image, readable where the image is dark or light
OVERLAY_ALPHA = 0.6
MAX_LABELLED = 60  # beyond this many tokens an axis is drawn without token labels


MAX_LABEL_CHARS = 16  # longer labels (a long merged word) are cut with "…"


def figure(**kwargs: Any) -> Figure:
    """A new matplotlib :class:`~matplotlib.figure.Figure` of the object API (no pyplot);
    ``kwargs`` are its own (``figsize`` in inches, ``layout``). Every picture of qkv starts here.

    Raises:
        MissingExtra: matplotlib is not installed (``pip install 'qkv[plot]'``).
    """
    require("plot", "drawing pictures")
    from matplotlib.figure import Figure

    return Figure(**kwargs)


def _short(labels: list[str]) -> list[str]:
    return [x if len(x) <= MAX_LABEL_CHARS else x[: MAX_LABEL_CHARS - 1] + "…" for x in labels]


def _label_axes(ax, query_tokens, key_tokens, fontsize):
    query_tokens, key_tokens = _short(query_tokens), _short(key_tokens)
    if len(key_tokens) <= MAX_LABELLED:
        ax.set_xticks(range(len(key_tokens)), key_tokens, rotation=90, fontsize=fontsize)
    else:
        ax.set_xticks([])
    if len(query_tokens) <= MAX_LABELLED:
        ax.set_yticks(range(len(query_tokens)), query_tokens, fontsize=fontsize)
    else:
        ax.set_yticks([])


def plot_attention_grid(
    weights: torch.Tensor, query_tokens: list[str], key_tokens: list[str], title: str
) -> Figure:
    """Heads × layers grid of attention heatmaps.

    Args:
        weights: ``(n_layers, n_heads, Tq, Tk)`` float, values in [0, 1]; the colour scale
            runs from 0 to the largest of them.
        query_tokens / key_tokens: labels of the ``Tq`` rows / ``Tk`` columns.
        title: figure title (the attention kind).

    Returns the figure: ``n_layers * n_heads`` heatmap axes, then one colour-bar axis.
    Raises ``ValueError`` if the labels do not match the weights' shape.
    """
    n_layers, n_heads, tq, tk = weights.shape
    if (tq, tk) != (len(query_tokens), len(key_tokens)):
        raise ValueError(f"weights are {tq}×{tk} but got {len(query_tokens)}×{len(key_tokens)} labels")
    cell = 0.16 if max(tq, tk) <= MAX_LABELLED else 0.05
    side = max(2.2, cell * max(tq, tk) + 1.0)
    fig = figure(figsize=(side * n_heads + 1.2, side * n_layers + 0.8), layout="constrained")
    axes = fig.subplots(n_layers, n_heads, squeeze=False)
    fontsize = 8 if max(tq, tk) <= 30 else 6
    # One colour scale for the whole grid, up to its largest weight: diffuse heads (weights
    # near 1/Tk) would all look white on a fixed 0..1 scale.
    vmax = float(weights.max()) or 1.0
    image = None
    for layer in range(n_layers):
        for head in range(n_heads):
            ax = axes[layer][head]
            image = ax.imshow(
                weights[layer, head].float().numpy(),
                cmap=CMAP,
                vmin=0.0,
                vmax=vmax,
                aspect="auto",
                interpolation="nearest",
            )
            ax.set_title(f"layer {layer + 1}, head {head + 1}", fontsize=9)
            _label_axes(ax, query_tokens, key_tokens, fontsize)
    assert image is not None  # a model has at least one layer and one head: the loop drew a map
    fig.colorbar(image, ax=axes, shrink=0.6, label="attention weight")
    fig.suptitle(f"{title} (rows: queries, columns: keys)")
    return fig


def plot_alignment(
    cross_weights: torch.Tensor, target_tokens: list[str], source_tokens: list[str], layer: int = -1
) -> Figure:
    """Translation alignment: cross-attention of one layer averaged over its heads.

    Shape: ``cross_weights (n_layers, n_heads, T, S)``; ``layer`` indexes the first axis
    (default: the last layer). Rows are target tokens, columns source tokens.
    """
    n_layers = cross_weights.size(0)
    layer = layer % n_layers
    mean = cross_weights[layer].float().mean(0)  # (T, S)
    t, s = mean.shape
    fig = figure(figsize=(max(4.0, 0.3 * s + 2), max(3.5, 0.3 * t + 1.5)), layout="constrained")
    ax = fig.subplots()
    image = ax.imshow(
        mean.numpy(),
        cmap=CMAP,
        vmin=0.0,
        vmax=float(mean.max()) or 1.0,
        aspect="auto",
        interpolation="nearest",
    )
    _label_axes(ax, target_tokens, source_tokens, 9)
    ax.set_xlabel("source")
    ax.set_ylabel("target (token produced)")
    ax.set_title(f"cross-attention alignment, layer {layer + 1} of {n_layers}, mean of heads")
    fig.colorbar(image, ax=ax, label="attention weight")
    return fig


def positional_matrix(model: torch.nn.Module, n_positions: int = 100) -> tuple[torch.Tensor, str]:
    """The position matrix of ``model`` and a caption: ``(n_positions, width)`` float.

    Sinusoidal PE (§3.5) and learned embeddings are what is added to the token embeddings;
    a rotary model adds nothing, so its ``cos(pos · θ_i)`` per rotation plane is shown.
    Raises ``ValueError`` for a model without positional information.
    """
    for module in model.modules():
        if isinstance(module, SinusoidalPositionalEncoding):
            return module.pe[:n_positions], "sinusoidal positional encoding PE (Vaswani et al. 2017, §3.5)"
        if isinstance(module, LearnedPositionalEmbedding):
            return module.embedding.weight.detach()[:n_positions], "learned positional embeddings"
        if isinstance(module, RotaryEmbedding):
            half = module.cos.size(1) // 2
            return module.cos[:n_positions, :half], "rotary positions (RoPE): cos(pos · θ_i) per plane"
    raise ValueError("this model has no positional encoding to draw")


def plot_positional_encoding(matrix: torch.Tensor, title: str) -> Figure:
    """Heatmap of a ``(positions, dimensions)`` matrix, diverging colours around 0."""
    fig = figure(figsize=(7, 4.5), layout="constrained")
    ax = fig.subplots()
    limit = float(matrix.abs().max()) or 1.0
    image = ax.imshow(
        matrix.float().numpy(), cmap="RdBu_r", vmin=-limit, vmax=limit, aspect="auto", interpolation="nearest"
    )
    ax.set_xlabel("dimension")
    ax.set_ylabel("position")
    ax.set_title(title, fontsize=10)
    fig.colorbar(image, ax=ax)
    return fig


def plot_bars(labels: list[str], probs: list[float], title: str) -> Figure:
    """Horizontal probability bars, the first label on top."""
    fig = figure(figsize=(5.5, 0.35 * len(labels) + 1.2), layout="constrained")
    ax = fig.subplots()
    ax.barh(range(len(labels)), probs, color="#1f5fa8")
    ax.set_yticks(range(len(labels)), [repr(x)[1:-1] if x.strip() != x or not x else x for x in labels])
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_xlabel("probability")
    ax.set_title(title, fontsize=10)
    for i, p in enumerate(probs):
        ax.text(min(p + 0.01, 0.9), i, f"{p:.3f}", va="center", fontsize=8)
    return fig


def _draw_image(ax, image: np.ndarray) -> None:
    """``image`` uint8 ``(S, S, 1 or 3)`` in pixel coordinates, no ticks."""
    if image.shape[-1] == 1:
        ax.imshow(image[..., 0], cmap="gray", vmin=0, vmax=255, interpolation="nearest")
    else:
        ax.imshow(image, interpolation="nearest")
    ax.set_xticks([])
    ax.set_yticks([])


def _overlay(ax, image: np.ndarray, values: np.ndarray, patch_size: int, vmax: float):
    """``values (G, G)`` (one per patch) over ``image (G·P, G·P, C)``, the patch grid in white.
    Returns the overlay's image artist (for a colour bar)."""
    _draw_image(ax, image)
    size = image.shape[0]
    edge = (-0.5, size - 0.5, size - 0.5, -0.5)  # (left, right, bottom, top): pixel centres
    artist = ax.imshow(
        values,
        cmap=OVERLAY_CMAP,
        vmin=0.0,
        vmax=vmax,
        alpha=OVERLAY_ALPHA,
        extent=edge,
        interpolation="nearest",
    )
    for k in range(1, size // patch_size):
        ax.axhline(k * patch_size - 0.5, color="white", linewidth=0.6, alpha=0.7)
        ax.axvline(k * patch_size - 0.5, color="white", linewidth=0.6, alpha=0.7)
    return artist


def plot_image_attention(
    image: np.ndarray, weights: torch.Tensor, patch_size: int, layer: int, max_cols: int = 4
) -> Figure:
    """One layer of a ViT: for each head, the class token's attention to the patches overlaid
    on the image, the patch grid drawn, one colour scale for the layer (0 to its largest
    patch weight).

    Args:
        image: uint8 ``(S, S, C)`` (``C`` 1 or 3), the model's input.
        weights: ``(H, 1 + N, 1 + N)`` float, this layer's attention; token 0 is the class
            token, ``1 + i`` patch ``i`` in reading order (``N = (S / patch_size)²``).
        patch_size: ``P``. layer: 0-based, for the title. max_cols: heads per row.

    Returns the figure: ``H`` image axes (unused grid cells removed), then a colour-bar axis.
    Raises ``ValueError`` if the token count does not match the image and patch size.
    """
    n_heads, n_tokens = weights.shape[0], weights.shape[-1]
    g = image.shape[0] // patch_size
    if n_tokens != 1 + g * g:
        raise ValueError(
            f"{n_tokens} tokens, but a {image.shape[0]}-pixel image in {patch_size}-pixel "
            f"patches has 1 + {g * g}"
        )
    cls = weights[:, 0, 1:].float().reshape(n_heads, g, g).numpy()  # (H, G, G)
    vmax = float(cls.max()) or 1.0
    cols = min(n_heads, max_cols)
    rows = math.ceil(n_heads / cols)
    fig = figure(figsize=(2.7 * cols + 1.0, 2.9 * rows + 0.6), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    artist = None
    for head, ax in enumerate(axes):
        if head >= n_heads:
            ax.remove()
            continue
        artist = _overlay(ax, image, cls[head], patch_size, vmax)
        ax.set_title(f"head {head + 1} (CLS→CLS {float(weights[head, 0, 0]):.2f})", fontsize=9)
    assert artist is not None  # a layer has at least one head: the loop drew an overlay
    fig.colorbar(artist, ax=axes[:n_heads].tolist(), shrink=0.8, label="attention weight")
    fig.suptitle(f"layer {layer + 1}: attention from the class token to each patch")
    return fig


def plot_rollout(image: np.ndarray, rollout: np.ndarray, patch_size: int, caption: str = "") -> Figure:
    """The image, and the class token's attention rollout over it.

    Args:
        image: uint8 ``(S, S, C)``. rollout: ``(G, G)`` float, the class token's row of
            :func:`~qkv.explain.rollout.attention_rollout` at the patches
            (``G = S / patch_size``). caption: a line under the title (e.g. the prediction).

    Returns the figure: two image axes, then a colour-bar axis.
    """
    rollout = np.asarray(rollout, dtype=float)
    fig = figure(figsize=(6.6, 3.6), layout="constrained")
    left, right = fig.subplots(1, 2)
    _draw_image(left, image)
    left.set_title("model input", fontsize=9)
    artist = _overlay(right, image, rollout, patch_size, float(rollout.max()) or 1.0)
    right.set_title("rollout: class token ← patches", fontsize=9)
    fig.colorbar(artist, ax=right, shrink=0.8)
    fig.suptitle(
        "attention rollout (Abnar & Zuidema 2020)" + (f"\n{caption}" if caption else ""), fontsize=10
    )
    return fig


def _word_label(word: str) -> str:
    return _short([word or "∅"])[0]


def plot_caption_attention(
    image: np.ndarray,
    words: list[str],
    maps: np.ndarray,
    layer: int = -1,
    head: int | None = None,
    caption: str = "",
    max_cols: int = 6,
) -> Figure:
    """Where each word of a generated caption looks: the image, then one panel per word (caption
    order, ``max_cols`` panels a row) with the word's cross-attention over the patches laid on
    the image, one colour scale for the figure (0 to its largest weight) — the figure of Show,
    Attend and Tell (Xu et al. 2015, Figures 2 and 3) with encoder-decoder attention (Vaswani
    et al. 2017, §3.2.3) for the soft attention.

    Args:
        image: uint8 ``(S, S, C)`` (``C`` 1 or 3), the model's input.
        words: the ``W`` words. maps: ``(W, n_layers, n_heads, G, G)`` float, each word's
            cross-attention (the mean over its pieces) per decoder layer and head, patch
            ``(r, c)`` at ``[..., r, c]`` (``G`` divides ``S``; ``G = 1`` for a pooled memory).
        layer: the decoder layer shown (0-based; -1 the last; taken modulo the layer count, as
            :func:`plot_alignment` does). head: that head (0-based), or ``None``: the mean over
            the layer's heads. caption: a line under the title (the caption, the input).

    Returns the figure: ``1 + W`` image axes (unused grid cells removed), then a colour-bar
    axis. Raises ``ValueError`` if ``maps`` does not match ``words`` or the image.
    """
    maps = np.asarray(maps, dtype=float)
    if maps.ndim != 5 or len(maps) != len(words) or image.shape[0] % max(maps.shape[-1], 1):
        raise ValueError(
            f"maps must be (words={len(words)}, layers, heads, G, G) with G dividing the image's "
            f"{image.shape[0]} pixels, got {maps.shape}"
        )
    n_layers, g = maps.shape[1], maps.shape[-1]
    layer = layer % n_layers
    chosen = maps[:, layer].mean(1) if head is None else maps[:, layer, head]  # (W, G, G)
    vmax = float(chosen.max()) if len(words) else 1.0
    cols = min(1 + len(words), max_cols)
    rows = math.ceil((1 + len(words)) / cols)
    fig = figure(figsize=(2.0 * cols + 1.0, 2.25 * rows + 0.9), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    _draw_image(axes[0], image)
    axes[0].set_title("input", fontsize=9)
    artist = None
    for i, ax in enumerate(axes[1:]):
        if i >= len(words):
            ax.remove()
            continue
        artist = _overlay(ax, image, chosen[i], image.shape[0] // g, vmax or 1.0)
        ax.set_title(f"{i + 1}. {_word_label(words[i])}", fontsize=10)
    if artist is not None:
        used = axes[1 : 1 + len(words)].tolist()
        fig.colorbar(artist, ax=used, shrink=0.8, label="attention weight")
    which = "mean of heads" if head is None else f"head {head + 1}"
    fig.suptitle(
        f"where each word looks: cross-attention, decoder layer {layer + 1} of {n_layers}, {which}"
        + (f"\n{caption}" if caption else ""),
        fontsize=10,
    )
    return fig


def plot_caption_heads(image: np.ndarray, words: list[str], maps: np.ndarray, layer: int) -> Figure:
    """One decoder layer of a captioner: rows are the caption's words, columns the layer's heads
    and their mean, each panel the word's cross-attention over the image; one colour scale for
    the figure.

    Args:
        image: uint8 ``(S, S, C)``. words: the ``W`` words. maps: ``(W, n_layers, n_heads, G, G)``
            as :func:`plot_caption_attention` takes. layer: 0-based.

    Returns the figure: ``W × (n_heads + 1)`` image axes, then a colour-bar axis (none for a
    caption without words: one empty axis saying so). Raises ``IndexError`` for a layer out
    of range.
    """
    maps = np.asarray(maps, dtype=float)
    if not len(words):
        fig = figure(figsize=(4, 1.5), layout="constrained")
        ax = fig.subplots()
        ax.axis("off")
        ax.text(0.5, 0.5, "the caption is empty: no word to show", ha="center", va="center")
        return fig
    per_head = maps[:, layer]  # (W, H, G, G)
    panels = np.concatenate([per_head, per_head.mean(1, keepdims=True)], axis=1)  # (W, H + 1, G, G)
    n_words, n_cols, g = panels.shape[0], panels.shape[1], panels.shape[-1]
    vmax = float(panels.max()) or 1.0
    fig = figure(figsize=(1.6 * n_cols + 1.6, 1.6 * n_words + 0.8), layout="constrained")
    axes = fig.subplots(n_words, n_cols, squeeze=False)
    artist = None
    for w in range(n_words):
        for c in range(n_cols):
            ax = axes[w][c]
            artist = _overlay(ax, image, panels[w, c], image.shape[0] // g, vmax)
            if w == 0:
                ax.set_title("mean" if c == n_cols - 1 else f"head {c + 1}", fontsize=9)
            if c == 0:
                ax.set_ylabel(_word_label(words[w]), fontsize=10)
    assert artist is not None  # a caption with words: the loop drew an overlay
    fig.colorbar(artist, ax=axes, shrink=0.6, label="attention weight")
    fig.suptitle(f"decoder layer {layer + 1}: each word's cross-attention over the image", fontsize=10)
    return fig


def decode_png_data_url(url: str) -> np.ndarray:
    """A ``data:image/png;base64,...`` URL (as in a ViT explanation's ``output["image"]``) as
    uint8 ``(H, W, C)``. Raises ``ValueError`` for another kind of URL."""
    from PIL import Image

    prefix = "data:image/png;base64,"
    if not url.startswith(prefix):
        raise ValueError("not a PNG data URL")
    with Image.open(io.BytesIO(base64.b64decode(url[len(prefix) :]))) as img:
        arr = np.asarray(img, dtype=np.uint8)
    return arr[..., None] if arr.ndim == 2 else arr


def plot_steps(steps: dict, title: str = "") -> Figure:
    """Eq. 1 of one head in four panels: QKᵀ, ÷ sqrt(d_k), mask (−∞ shown blank), softmax.

    Args:
        steps: one head's step-through as returned by
            :meth:`~qkv.explain.explainer.Explainer.steps` (``scores``, ``scaled``, ``masked``,
            ``weights`` as ``(Tq, Tk)`` nested lists, ``query_tokens``, ``key_tokens``, ``d_k``).

    Returns the figure: four heatmap axes, each with its own colour bar.
    """
    panels = [
        ("scores", "S = Q Kᵀ", "RdBu_r"),
        ("scaled", f"S / √d_k  (√{steps['d_k']} = {math.sqrt(steps['d_k']):.2f})", "RdBu_r"),
        ("masked", "masked: −∞ where not allowed (blank)", "RdBu_r"),
        ("weights", "A = softmax(rows)  (each row sums to 1)", CMAP),
    ]
    tq, tk = len(steps["query_tokens"]), len(steps["key_tokens"])
    side = max(2.6, 0.22 * max(tq, tk) + 1.2)
    fig = figure(figsize=(4 * side + 2, side + 0.9), layout="constrained")
    axes = fig.subplots(1, 4)
    for ax, (name, caption, cmap) in zip(axes, panels, strict=True):
        values = np.array([[np.nan if v is None else v for v in row] for row in steps[name]], dtype=float)
        if name == "weights":
            image = ax.imshow(
                values,
                cmap=cmap,
                vmin=0,
                vmax=float(np.nanmax(values)) or 1.0,
                aspect="auto",
                interpolation="nearest",
            )
        else:
            limit = float(np.nanmax(np.abs(values))) or 1.0
            image = ax.imshow(
                values, cmap=cmap, vmin=-limit, vmax=limit, aspect="auto", interpolation="nearest"
            )
        ax.set_title(caption, fontsize=9)
        _label_axes(ax, steps["query_tokens"], steps["key_tokens"], 8 if max(tq, tk) <= 30 else 6)
        fig.colorbar(image, ax=ax, shrink=0.8)
    fig.suptitle(
        title or f"Eq. 1 step by step: {steps['kind']} layer {steps['layer'] + 1}, head {steps['head'] + 1}"
    )
    return fig


def plot_logit_lens(block: dict, max_tokens: int = 40) -> Figure:
    """The logit lens (nostalgebraist 2020) of every token: rows are layers (the first at the
    top), columns the followed stack's tokens (at most ``max_tokens``, the last ones); each cell
    names the output the model's own head reads off the residual stream after that layer, at
    that position, coloured by its probability. ``block`` is an explanation's
    ``output["block"]`` (:func:`~qkv.explain.block.follow_tokens`)."""
    tokens = block["tokens"][-max_tokens:]
    first = len(block["tokens"]) - len(tokens)
    layers = block["layers"]
    probs = np.array([[row["lens"][first + t][0][1] for t in range(len(tokens))] for row in layers])
    fig = figure(figsize=(max(6.0, 0.62 * len(tokens) + 1.8), 0.5 * len(layers) + 1.6), layout="constrained")
    ax = fig.add_subplot()
    image = ax.imshow(probs, cmap="Blues", vmin=0.0, vmax=1.0, aspect="auto")
    for i, row in enumerate(layers):
        for t in range(len(tokens)):
            label, p = row["lens"][first + t][0]
            ax.text(
                t,
                i,
                _short([str(label)])[0],
                ha="center",
                va="center",
                fontsize=7,
                color="white" if p > 0.6 else "black",
            )
    ax.set_xticks(range(len(tokens)), _short(tokens), rotation=60, ha="right", fontsize=8)
    ax.set_yticks(range(len(layers)), [f"layer {i + 1}" for i in range(len(layers))], fontsize=8)
    stack = "decoder " if block["stack"] == "decoder" else ""
    ax.set_title(f"logit lens: the most likely output after each {stack}layer, at each position")
    fig.colorbar(image, ax=ax, label="probability", shrink=0.8)
    return fig


PATCHING_CMAP = "RdBu"  # diverging: blue = the clean run's metric restored, red = pushed the other way


def plot_patching(
    table: PatchingTable,
    labels: list[str] | None = None,
    metric: str = "metric",
    normalised: bool = True,
    annotate: bool | None = None,
) -> Figure:
    """An activation-patching table as a heatmap (causal tracing: Meng et al. 2022, §2.1 and
    Figure 1; Wang et al. 2022, §3): rows are the layers (the first at the top), columns the
    positions or the heads of :attr:`~qkv.explain.interventions.PatchingTable.columns`; each
    cell is the corrupted run's metric with that layer's point patched there from the clean run.

    Args:
        table: from :func:`~qkv.explain.interventions.activation_patching`, ``values`` of shape
            ``(n_layers, n_columns)``.
        labels: one label per column (the clean input's tokens, for a table by position);
            default: the table's own columns (``"0"``, ``"1"``, ... or ``"head 0"``, ...).
        metric: what the metric measures, for the title (``"logit('\\n') - logit(' ')"``).
        normalised: draw :meth:`~qkv.explain.interventions.PatchingTable.normalised` (0 = no
            effect, 1 = the clean run's metric restored); ``False``: the change of the metric,
            ``values - corrupted``, in its own units (also what a table whose two runs have the
            same metric draws).
        annotate: write each cell's value in it (default: when the table has at most 24
            columns and 16 rows).

    Returns the figure: one heatmap axis (its title names the point and the metric), then its
    colour bar. The colours diverge around 0 (no effect), symmetric, so that blue is the clean
    run's direction and red the other.

    Raises:
        ValueError: ``labels`` whose number is not the table's number of columns.
    """
    n_rows, n_columns = table.values.shape
    if labels is not None and len(labels) != n_columns:
        raise ValueError(f"{len(labels)} labels for a table of {n_columns} columns")
    restorable = normalised and table.clean != table.corrupted
    values = (table.normalised() if restorable else table.values - table.corrupted).float().numpy()
    limit = max(float(np.abs(values).max()), 1.0 if restorable else 0.0) or 1.0
    fig = figure(
        figsize=(max(5.0, 0.42 * n_columns + 2.4), max(2.4, 0.42 * n_rows + 1.6)), layout="constrained"
    )
    ax = fig.add_subplot()
    image = ax.imshow(
        values, cmap=PATCHING_CMAP, vmin=-limit, vmax=limit, aspect="auto", interpolation="nearest"
    )
    names = _short(list(table.columns if labels is None else labels))
    if n_columns <= MAX_LABELLED:
        rotation = 0 if max(map(len, names), default=0) <= 2 else 90 if labels is not None else 60
        ax.set_xticks(range(n_columns), names, rotation=rotation, fontsize=8)
    else:
        ax.set_xticks([])
    ax.set_yticks(range(n_rows), table.rows, fontsize=8)
    by_head = bool(table.columns) and table.columns[0].startswith("head")
    ax.set_xlabel("head patched" if by_head else "position patched")
    if annotate is None:
        annotate = n_columns <= 24 and n_rows <= 16
    if annotate:
        for i in range(n_rows):
            for j in range(n_columns):
                ax.text(
                    j,
                    i,
                    f"{values[i, j]:.2f}",
                    ha="center",
                    va="center",
                    fontsize=7,
                    color="white" if abs(values[i, j]) > 0.6 * limit else "black",
                )
    ax.set_title(f"activation patching: {table.point} from the clean run; {metric}", fontsize=10)
    label = "share of the clean metric restored" if restorable else "change of the metric"
    fig.colorbar(image, ax=ax, label=label, shrink=0.85)
    return fig


def save(fig: Figure, path: str | Path, dpi: int = 110) -> Path:
    """Write ``fig`` as PNG atomically (nothing half-written on Ctrl-C).

    ``fig`` is a pyplot-free :class:`~matplotlib.figure.Figure`: there is nothing to close.
    """
    path = Path(path)
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=dpi, format="png"))
    return path


def write_pictures(
    explainer: Explainer,
    text: str,
    out_dir: str | Path,
    options: DecodingOptions | None = None,
    merge_words: bool = True,
    layer: int = -1,
    head: int = 0,
) -> list[Path]:
    """Every picture of one input, as PNG files in ``out_dir`` (created), plus
    ``explanation.json`` (the numbers drawn). Returns the paths written.

    Files: ``attention_<kind>.png`` per attention kind (heads × layers grid),
    ``alignment.png`` (translation), ``positional_encoding.png``, ``next_tokens.png`` (LM) or
    ``classes.png`` (protein sequence classifier), ``logit_lens.png`` (:func:`plot_logit_lens`, a
    model with a residual stream and a per-token head), ``trajectory.png`` (a masked diffusion LM's
    denoising, :func:`~qkv.explain.diffusion.plot_trajectory`), ``steps.png`` (Eq. 1 step by step for
    ``head`` of ``layer`` of the first attention kind, when the model's attention is Eq. 1;
    ``layer`` also picks the alignment's).

    A ViT run (``explainer.input_kind == "image"``; ``text`` is then an image path or
    ``test:INDEX``) gets ``attention_layer<l>.png`` per layer (the class token's attention
    to the patches, one panel per head, over the image), ``rollout.png``, ``classes.png``,
    ``attention_encoder.png`` and ``steps.png`` (tokens: ``CLS`` and the patches). A caption
    run gets ``caption_attention.png`` (each word's cross-attention over the image, mean of
    the heads of decoder layer ``layer``), ``caption_attention_layer<l>.png`` per decoder
    layer (words × heads), and the encoder-decoder's pictures (patches as source tokens).

    Raises: as :meth:`~qkv.explain.explainer.Explainer.explain`.
    """
    result = explainer.explain(text, options, merge_words=merge_words)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    if "words" in result.output:  # a captioner: each word's cross-attention over the image
        written += _write_caption_pictures(result, out, layer)
    elif explainer.input_kind == "image":
        written += _write_image_pictures(result, out)
    for amap in result.attention:
        fig = plot_attention_grid(amap.weights, amap.query_tokens, amap.key_tokens, amap.title)
        written.append(save(fig, out / f"attention_{amap.kind}.png"))
        if amap.kind == "cross":
            fig = plot_alignment(amap.weights, amap.query_tokens, amap.key_tokens, layer)
            written.append(save(fig, out / "alignment.png"))
    try:
        matrix, title = positional_matrix(explainer.model)
        written.append(save(plot_positional_encoding(matrix, title), out / "positional_encoding.png"))
    except ValueError:
        pass  # a model without positions has nothing to draw
    output = result.output
    if "trajectory" in output:  # a masked diffusion LM: which position was unmasked when
        from .diffusion import plot_trajectory

        written.append(save(plot_trajectory(output["trajectory"]), out / "trajectory.png"))
    if output["next_tokens"]:
        fig = plot_bars(
            [t["token"] for t in output["next_tokens"]],
            [t["prob"] for t in output["next_tokens"]],
            "next-token probabilities after the prompt",
        )
        written.append(save(fig, out / "next_tokens.png"))
    if output["classes"]:
        title = "class probabilities" + (
            f" (prediction: {output['prediction']})" if "prediction" in output else ""
        )
        fig = plot_bars(
            [c["label"] for c in output["classes"]], [c["prob"] for c in output["classes"]], title
        )
        written.append(save(fig, out / "classes.png"))
    if output.get("block") and not output["block"]["pooled"]:
        written.append(save(plot_logit_lens(output["block"]), out / "logit_lens.png"))
    if explainer.step_through:
        kind = explainer.kinds[0]
        steps = explainer.steps(text, kind, layer % explainer.n_layers, head, options)
        written.append(save(plot_steps(steps), out / "steps.png"))
    write_text(out / "explanation.json", json.dumps(result.to_dict(), ensure_ascii=False) + "\n")
    written.append(out / "explanation.json")
    return written


def _write_image_pictures(result, out: Path) -> list[Path]:
    """The ViT-only pictures of :func:`write_pictures`: one class-token overlay per layer and
    the rollout, drawn from a ViT :class:`~qkv.explain.explainer.Explanation`."""
    output, amap = result.output, result.attention[0]
    image = decode_png_data_url(output["image"])
    written = [
        save(
            plot_image_attention(image, amap.weights[layer], output["patch_size"], layer),
            out / f"attention_layer{layer + 1}.png",
        )
        for layer in range(amap.weights.size(0))
    ]
    caption = f"{result.text}: predicted {output['prediction']}"
    written.append(
        save(plot_rollout(image, output["rollout"], output["patch_size"], caption), out / "rollout.png")
    )
    return written


def _write_caption_pictures(result, out: Path, layer: int) -> list[Path]:
    """The captioner-only pictures of :func:`write_pictures`, drawn from a caption
    :class:`~qkv.explain.explainer.Explanation`'s ``words``."""
    output = result.output
    image = decode_png_data_url(output["image"])
    words = [w["text"] for w in output["words"]]
    g, n_layers, n_heads = output["map_grid"], output["n_decoder_layers"], output["n_heads"]
    maps = np.array([w["maps"] for w in output["words"]], dtype=float).reshape(-1, n_layers, n_heads, g, g)
    caption = f"“{output['text']}” ({output['decoding']}; {result.text})"
    fig = plot_caption_attention(image, words, maps, layer, caption=caption)
    written = [save(fig, out / "caption_attention.png")]
    for index in range(n_layers):
        fig = plot_caption_heads(image, words, maps, index)
        written.append(save(fig, out / f"caption_attention_layer{index + 1}.png"))
    return written
