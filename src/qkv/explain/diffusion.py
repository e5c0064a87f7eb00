"""Looking inside a masked diffusion LM: the denoising trajectory (which position is fixed at
which step, and how sure the model was) and the bidirectional attention at any step.

Sources: Nie et al. 2025 (LLaDA), §2.4 and Fig. 5 (the sampling process drawn as tokens
appearing step by step, coloured by when); the attention is the encoder's self-attention
(Vaswani et al. 2017, §3.2), taken on the partly masked input of the chosen step.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from .. import runs
from ..errors import QkvError
from ..extras import require
from ..inference.diffusion import MASK_CHAR, DiffusionGenerator, Trace
from .explainer import DEFAULT_MAX_CHARS, DecodingOptions, Explainer, _gathered, _Pass

if TYPE_CHECKING:
    from matplotlib.figure import Figure

MASK_LABEL = "▒"  # how a still-masked position is drawn


def token_pieces(tokenizer, ids: list[int], mask_id: int | None = None) -> list[str]:
    """The tokenizer's piece of each id, ``mask_id`` as :data:`MASK_LABEL`: what the explainer's
    attention maps are labelled from (:func:`~qkv.explain.labels.piece_labels` and word
    merging read the pieces' own word markers)."""
    return [MASK_LABEL if i == mask_id else str(tokenizer.id_to_token(i)) for i in ids]


def token_labels(tokenizer, ids: list[int], mask_id: int | None = None) -> list[str]:
    """One display label per token (:func:`token_pieces`), white space and the byte-level word
    marker visible: a newline as ``⏎``, a space as ``␣``."""
    return [
        p.replace("\n", "⏎").replace("Ġ", "␣").replace(" ", "␣")
        for p in token_pieces(tokenizer, ids, mask_id)
    ]


def trajectory(trace: Trace, tokenizer, row: int = 0) -> list[dict]:
    """One row of a trace as JSON-ready records, one per position: ``position``, ``token`` (the
    label of its final token, :func:`token_labels`), ``step`` (the step that unmasked it, ``-1``
    if given) and ``confidence`` (the probability of the kept token then; ``None`` if given).

    Raises ``ValueError`` for an empty trace.
    """
    if trace.fixed_at is None or trace.confidence is None:
        raise ValueError("the trace is empty: run denoise(..., trace=Trace())")
    labels = token_labels(tokenizer, trace.states[-1][row].tolist())  # no mask is left at the end
    fixed, conf = trace.fixed_at[row].tolist(), trace.confidence[row].tolist()
    return [
        {"position": i, "token": lab, "step": s, "confidence": None if s < 0 else round(c, 4)}
        for i, (lab, s, c) in enumerate(zip(labels, fixed, conf, strict=True))
    ]


def plot_trajectory(rows: list[dict], title: str = "") -> Figure:
    """The denoising trajectory (:func:`trajectory`'s records): positions across, steps down;
    the token unmasked at each step written in its cell, coloured by the model's confidence
    when it was kept; given tokens on a grey top line.

    Raises:
        MissingExtra: matplotlib is not installed (``pip install 'qkv[plot]'``).
    """
    steps = max([r["step"] for r in rows] + [0]) + 1
    grid = np.full((steps, len(rows)), np.nan)
    for r in rows:
        if r["step"] >= 0:
            grid[r["step"], r["position"]] = r["confidence"]
    require("plot", "drawing the denoising trajectory")
    from matplotlib import colormaps
    from matplotlib.figure import Figure  # the object API: no pyplot, no backend chosen

    cmap = colormaps["viridis"].with_extremes(bad="white")
    fig = Figure(figsize=(1.5 + 0.22 * len(rows), 1.2 + 0.22 * (steps + 1)), layout="constrained")
    ax = fig.subplots()
    image = ax.imshow(grid, cmap=cmap, vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest")
    for r in rows:
        given = r["step"] < 0
        ax.text(
            r["position"], -1 if given else r["step"], r["token"], ha="center", va="center", fontsize=7,
            color="#555555" if given else "white",
        )  # fmt: skip
    ax.set_ylim(steps - 0.5, -1.5)
    ax.set_xlabel("position")
    ax.set_ylabel("step (top row: given tokens)")
    ax.set_xticks([])
    ax.set_title(title or "denoising trajectory: the token kept at each step")
    fig.colorbar(image, ax=ax, label="confidence when kept", shrink=0.8)
    return fig


class DiffusionLMExplainer(Explainer[str]):
    """Masked diffusion LMs (``qkv train diffusion-lm``): the input is an infill template (each
    ``_`` one token to fill) or a prompt (then ``max_new_tokens`` masks are appended, as far as
    the context allows). The output holds the filled text and the trajectory; the attention is
    that of the input of step ``options.step`` (default the last step's), masks shown as
    :data:`MASK_LABEL`."""

    family, kinds, input_label = "diffusion-lm", ("encoder",), "template (_ = a token to fill) or prompt"

    def __init__(
        self, run_dir: str | Path, device: torch.device | str = "cpu", max_chars: int = DEFAULT_MAX_CHARS
    ) -> None:
        model, tokenizer = runs.load_run(run_dir, device=device, family="diffusion-lm")
        self.generator = DiffusionGenerator(model, tokenizer)
        super().__init__(model, run_dir, max_chars)
        self.tokenizer, self.subword = tokenizer, tokenizer.kind == "bpe"
        self.example = (
            "ROMEO:\nBut soft, ____ light through yonder ______ breaks"
            if tokenizer.kind == "char"
            else "The ____ of"
        )

    def layers(self, kind: str) -> nn.ModuleList:
        return self.model.layers

    def template(self, text: str, max_new_tokens: int) -> str:
        """``text`` itself when it has a mask, else ``text`` with masks appended (at most what
        the context holds beside it)."""
        if MASK_CHAR in text:
            return text
        room = self.config.max_len - len(self.generator.encode(text))
        if room < 1:
            raise QkvError(f"the prompt fills the model's context ({self.config.max_len} tokens)")
        return text + MASK_CHAR * min(max_new_tokens, room)

    def count_tokens(self, text: str) -> int:
        return len(self.generator.encode_template(self.template(text, 1)))

    def _prepare(self, text, options: DecodingOptions):
        gen = self.generator
        template = self.template(text, options.max_new_tokens)
        filled = gen.infill(template, seed=options.seed, trace=True, temperature=options.temperature)[0]
        trace = gen.last_trace
        assert trace is not None
        n_steps = len(trace.states) - 1  # at least 1: a template has a mask
        step = n_steps - 1 if options.step is None else options.step
        if not 0 <= step < n_steps:
            raise QkvError(f"step {step} out of range: this denoising took steps 0..{n_steps - 1}")
        state = trace.states[step].to(next(self.model.parameters()).device)
        pieces = token_pieces(self.tokenizer, state[0].tolist(), gen.mask_id)

        def forward(need_weights):
            return {"encoder": self.model(state, need_weights=need_weights).attentions}

        rows = trajectory(trace, self.tokenizer)
        template_ids = trace.states[0].to(state.device)  # (1, T): the input, every blank masked
        filled_ids = trace.states[-1][0].to(state.device)  # (T,): no mask left
        blanks = (template_ids[0] == gen.mask_id).nonzero()[:, 0]  # (N,) the filled positions

        def score() -> torch.Tensor:
            """The probability of each filled token, read off the template (the first step's input)."""
            return _gathered(self.model(template_ids).logits[0, blanks], filled_ids[blanks])

        output = {
            "text": filled,
            "next_tokens": [],
            "classes": [],
            "residues": None,
            "step": step,
            "steps": n_steps,
            "trajectory": rows,
        }
        labels = [rows[i]["token"] for i in blanks.tolist()]
        return _Pass(forward, {"encoder": (pieces, pieces)}, output, score=(labels, score))
