"""Generation by unmasking: a masked diffusion LM fills every [MASK] of its input in ``steps``
forward passes, in any order.

Sources: Nie et al. 2025 (LLaDA), §2.4 and Appendix B (Algorithms 4–5): at each step predict
every masked token, keep a share of the predictions and leave the rest masked; which ones are
kept is "low-confidence remasking" (the most probable predictions kept) or random;
semi-autoregressive blocks (the masked positions unmasked block after block, left to right).
Sahoo et al. 2024 (MDLM), §3.3: the ancestral sampler, which unmasks each masked token at
random (here with the number per step fixed to its expectation, as LLaDA's random
remasking). Tokens that are not masked, given or already unmasked, never change (the reverse
process "carries over" unmasked tokens, MDLM §3.2.1).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch

from .. import runs
from ..errors import InputTooLong, QkvError
from ..models.diffusion_lm import DiffusionLM
from .sampling import check_sampling, filter_logits

Remasking = Literal["confidence", "random"]
REMASKING: tuple[str, ...] = ("confidence", "random")
DEFAULT_REMASKING: Remasking = "confidence"  # LLaDA's
MASK_CHAR = "_"


def unmask_counts(n_masked: int, steps: int) -> list[int]:
    """How many tokens each of ``steps`` steps unmasks: ``n_masked`` spread evenly, the first
    steps taking one more (LLaDA's ``get_num_transfer_tokens``: the linear schedule's expected
    counts). ``unmask_counts(10, 4) == [3, 3, 2, 2]``."""
    base, extra = divmod(n_masked, steps)
    return [base + (i < extra) for i in range(steps)]


@dataclass
class Trace:
    """The denoising trajectory of a batch (:func:`denoise` with ``trace=True``).

    Attributes:
        states: the tokens before each step and after the last: ``steps + 1`` tensors ``(B, T)``.
        fixed_at: ``(B, T)`` long, the step (0-based) that unmasked each position; ``-1`` for
            positions that were given.
        confidence: ``(B, T)`` float, the probability the model gave the token it kept, at the
            step it was kept (``nan`` for given positions).
    """

    states: list[torch.Tensor] = field(default_factory=list)
    fixed_at: torch.Tensor | None = None
    confidence: torch.Tensor | None = None


def _blocks(masked: torch.Tensor, block_length: int | None) -> list[torch.Tensor]:
    """The masked positions of a row (``masked (T,)`` bool) in left-to-right blocks of
    ``block_length`` (all in one block when ``None``), each a long tensor of positions."""
    positions = masked.nonzero().flatten()
    return list(positions.split(block_length or len(positions))) if len(positions) else []


def denoise(
    model: DiffusionLM,
    x: torch.Tensor,
    steps: int,
    remasking: Remasking = DEFAULT_REMASKING,
    block_length: int | None = None,
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
    trace: Trace | None = None,
) -> torch.Tensor:
    """Fill every ``mask_id`` of ``x`` (LLaDA Algorithm 4/5): the masked positions of each row
    are cut into blocks of ``block_length`` (left to right; ``None``: one block); each block
    gets ``steps / blocks`` steps; at each step the model predicts every masked token (the
    argmax, or a draw at ``temperature`` > 0) and the block's ``unmask_counts`` best by
    ``remasking`` are kept: ``"confidence"`` (the highest predicted probability, LLaDA's
    low-confidence remasking) or ``"random"`` (MDLM's ancestral order).

    Shapes: ``x (B, T)`` long, every row with the same number of masks → ``(B, T)`` long, no
    mask left; positions that were not masked are returned unchanged. ``steps = 1`` with one
    block is the argmax of one forward pass.

    Raises:
        QkvError: ``steps`` < 1, fewer steps than blocks, ``block_length`` < 1, a
            ``temperature`` that is not a finite number >= 0, rows with different numbers of
            masks, an unknown ``remasking``.
    """
    mask_id = model.config.mask_id
    assert mask_id is not None  # DiffusionLM requires it
    if remasking not in REMASKING:
        raise QkvError(f"unknown remasking {remasking!r}; choose {' or '.join(REMASKING)}")
    if steps < 1:
        raise QkvError(f"--steps must be >= 1 (got {steps})")
    if block_length is not None and block_length < 1:
        raise QkvError(f"--block-length must be >= 1 (got {block_length})")
    if temperature != 0.0:
        check_sampling(temperature)  # a finite number > 0, or 0 for the argmax
    masked = x == mask_id
    counts = masked.sum(dim=1).tolist()
    if len(set(counts)) > 1:
        raise QkvError(f"every row needs the same number of masks (got {counts})")
    rows = [_blocks(row, block_length) for row in masked]
    n_blocks = len(rows[0])
    if n_blocks and steps < n_blocks:
        raise QkvError(f"--steps ({steps}) must be at least the number of blocks ({n_blocks})")
    x = x.clone()
    if trace is not None:
        trace.fixed_at = torch.full(x.shape, -1, dtype=torch.long)
        trace.confidence = torch.full(x.shape, float("nan"))
        trace.states = [x.to("cpu", copy=True)]
    step = 0
    for k in range(n_blocks):
        block_steps = steps // n_blocks + (k < steps % n_blocks)
        schedule = unmask_counts(len(rows[0][k]), block_steps)
        for n_keep in schedule:
            if n_keep:
                _step(model, x, [r[k] for r in rows], n_keep, remasking, temperature, generator, trace, step)
            if trace is not None:
                trace.states.append(x.to("cpu", copy=True))  # x changes in place
            step += 1
    return x


def _step(model, x, blocks, n_keep, remasking, temperature, generator, trace, step) -> None:
    """One reverse step: predict the masked tokens and keep ``n_keep`` of each row's block."""
    mask_id = model.config.mask_id
    with torch.no_grad():
        logits = model(x).logits.float()  # (B, T, V)
    if temperature > 0:  # filter_logits keeps a tiny temperature's division finite (greedy-like)
        drawn = torch.softmax(filter_logits(logits.flatten(0, 1), temperature), dim=-1)
        pred = torch.multinomial(drawn, 1, generator=generator).view(x.shape)
    else:
        pred = logits.argmax(dim=-1)
    # p(pred) under the untempered distribution, without materialising it: exp(logit - logsumexp)
    conf = (logits.gather(-1, pred[..., None]).squeeze(-1) - logits.logsumexp(-1)).exp()  # (B, T)
    for b, block in enumerate(blocks):
        cand = block[x[b, block] == mask_id]  # the block's positions still masked
        if remasking == "confidence":
            score = conf[b, cand]
        else:
            score = torch.rand(len(cand), generator=generator, device=x.device)
        keep = cand[score.topk(min(n_keep, len(cand))).indices]
        x[b, keep] = pred[b, keep]
        if trace is not None:
            trace.fixed_at[b, keep.cpu()] = step
            trace.confidence[b, keep.cpu()] = conf[b, keep].cpu()


class DiffusionGenerator:
    """Text from a masked diffusion LM run: continue a prompt, or fill the masked spans of a
    template (``"ROMEO: ____ my lord"``: each ``_`` one token), by :func:`denoise`.

    Args:
        model: a :class:`~qkv.models.diffusion_lm.DiffusionLM` in eval mode.
        tokenizer: its run's tokenizer (the ``[MASK]`` token is the id after its vocabulary).

    Attribute ``last_trace``: the :class:`Trace` of the latest call (one window's, for a
    continuation longer than the context).
    """

    def __init__(self, model: DiffusionLM, tokenizer) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.last_trace: Trace | None = None

    @classmethod
    def from_run(cls, run_dir: str | Path, device: torch.device | str = "cpu") -> DiffusionGenerator:
        """The generator of a ``qkv train diffusion-lm`` run.

        Raises:
            QkvError: a missing or incomplete run, or a run of another kind."""
        model, tokenizer = runs.load_run(run_dir, device=device, family="diffusion-lm")
        return cls(model, tokenizer)

    @property
    def mask_id(self) -> int:
        assert self.model.config.mask_id is not None
        return self.model.config.mask_id

    def encode(self, text: str) -> list[int]:
        """Ids of plain text (no mask); an empty text is the start token."""
        if text == "":
            bos = self.model.config.bos_id
            if bos is None:
                raise QkvError("empty prompt and this model has no start token: give a prompt")
            return [bos]
        return self.tokenizer.encode(text)

    def encode_template(self, template: str, mask_char: str = MASK_CHAR) -> list[int]:
        """Ids of an infill template, every ``mask_char`` one ``[MASK]``.

        Raises:
            QkvError: a ``mask_char`` that is not one character, no ``mask_char`` in the
                template, a template longer than the context, or characters the tokenizer does
                not know (named, at their position in the template).
        """
        if len(mask_char) != 1:
            raise QkvError(f"the mask character must be one character (got {mask_char!r})")
        if mask_char not in template:
            raise QkvError(
                f"the infill template has no {mask_char!r}: each {mask_char!r} stands for one token to fill"
            )
        ids: list[int] = []
        start = 0  # of the piece, in the template
        for piece in re.split(f"({re.escape(mask_char)}+)", template):
            if piece.startswith(mask_char):
                ids += [self.mask_id] * len(piece)
            elif piece:
                try:
                    ids += self.tokenizer.encode(piece)
                except QkvError as exc:  # the tokenizer counts within the piece; the user, the template
                    text, _, n = str(exc).rpartition("position ")
                    where = f"{text}position {start + int(n)}" if n.isdigit() else str(exc)
                    raise QkvError(f"the infill template: {where} (counted from 0)") from None
            start += len(piece)
        self._check_length(len(ids), "the infill template")
        return ids

    def _check_length(self, n: int, what: str) -> None:
        if n > self.model.config.max_len:
            raise InputTooLong(
                f"{what} is {n} tokens, longer than the model's context ({self.model.config.max_len})"
            )

    def _run(self, rows: list[list[int]], trace: bool, seed: int | None, **options) -> list[list[int]]:
        """:func:`denoise` of equal-length rows, seeded; the trace kept in :attr:`last_trace`."""
        device = next(self.model.parameters()).device
        g = None if seed is None else torch.Generator(device=device).manual_seed(seed)
        self.last_trace = Trace() if trace else None
        x = torch.tensor(rows, device=device)
        return denoise(self.model, x, generator=g, trace=self.last_trace, **options).tolist()

    def infill(
        self,
        template: str,
        steps: int | None = None,
        *,
        num_samples: int = 1,
        mask_char: str = MASK_CHAR,
        seed: int | None = None,
        trace: bool = False,
        **options,
    ) -> list[str]:
        """The template with its masks filled, ``num_samples`` times. ``steps``: default one per
        masked token; ``options``: :func:`denoise`'s ``remasking``, ``block_length``,
        ``temperature``. Raises :class:`QkvError` as :meth:`encode_template` and :func:`denoise`."""
        ids = self.encode_template(template, mask_char)
        n = ids.count(self.mask_id)
        rows = self._run([ids] * num_samples, trace, seed, steps=n if steps is None else steps, **options)
        return self.tokenizer.decode_batch(rows)

    def generate(
        self,
        prompt: str,
        max_new_tokens: int,
        steps: int | None = None,
        *,
        num_samples: int = 1,
        seed: int | None = None,
        trace: bool = False,
        **options,
    ) -> list[str]:
        """``prompt`` followed by ``max_new_tokens`` tokens unmasked in ``steps`` steps in all
        (default one per token). A continuation that does not fit the context beside the prompt
        is made in windows of half the context, each conditioned on the tokens before it (at
        most the other half). Returns the new text only, ``num_samples`` samples.

        Raises:
            QkvError: ``max_new_tokens`` < 1, a prompt longer than the context less one token,
                and :func:`denoise`'s errors.
        """
        if max_new_tokens < 1:
            raise QkvError(f"max_new_tokens must be >= 1 (got {max_new_tokens})")
        prompt_ids = self.encode(prompt)
        max_len = self.model.config.max_len
        self._check_length(len(prompt_ids) + 1, "the prompt with one new token")
        steps = max_new_tokens if steps is None else steps
        window = max_new_tokens if len(prompt_ids) + max_new_tokens <= max_len else max_len // 2
        rows = [list(prompt_ids) for _ in range(num_samples)]
        done = 0
        while done < max_new_tokens:
            chunk = min(window, max_new_tokens - done)
            chunk_steps = math.ceil(steps * chunk / max_new_tokens)  # 0 only for steps 0: refused
            # every row has the same length: one window of the same width per row
            x = [r[max(0, len(r) - (max_len - chunk)) :] + [self.mask_id] * chunk for r in rows]
            filled = self._run(x, trace, None if seed is None else seed + done, steps=chunk_steps, **options)
            for r, f in zip(rows, filled, strict=True):
                r += f[-chunk:]
            done += chunk
        return self.tokenizer.decode_batch([r[len(prompt_ids) :] for r in rows])
