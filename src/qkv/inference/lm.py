"""Text generation with a decoder-only LM: incremental decoding with a key/value cache.

Every path (greedy, temperature, top-k, top-p) runs the prompt once ("prefill"), then feeds one
new token per step, reusing the keys and values of earlier positions (Vaswani et al. 2017
§3.2.3: each position attends only to earlier ones, so their keys/values never change).
Batched prompts of different lengths are left-padded, with a padding mask and position ids
that start at each row's first real token.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from .. import runs
from ..cpu_share import CpuShare
from ..errors import QkvError
from ..models.decoder_lm import DecoderLM
from ..models.model_types import DECODER_LM, built_as
from ..nn.embeddings import check_token_ids
from ..runs.layout import WEIGHTS
from .quantize import cast_weights
from .sampling import check_sampling, choose_next, next_token_probs
from .stats import DecodeStats
from .weight_layout import prepare_for_inference

SEED_RANGE = (-(2**63), 2**64)  # what torch.Generator.manual_seed accepts: [-2**63, 2**64)


def _left_pad(rows: list[list[int]], device) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(tokens (B, L), attention_mask (B, L) bool or None when no row is padded)``."""
    longest = max(len(r) for r in rows)
    tokens = torch.zeros(len(rows), longest, dtype=torch.long)
    mask = torch.zeros(len(rows), longest, dtype=torch.bool)
    for i, r in enumerate(rows):
        tokens[i, longest - len(r) :] = torch.tensor(r, dtype=torch.long)
        mask[i, longest - len(r) :] = True
    padded = bool((~mask).any())
    return tokens.to(device), mask.to(device) if padded else None


@torch.inference_mode()
def generate_tokens(
    model: DecoderLM,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    do_sample: bool = True,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    stop_tokens: Sequence[int] = (),
    stop: Callable[[int, list[int]], bool] | None = None,
    generator: torch.Generator | None = None,
    on_tokens: Callable[[list[int | None]], None] | None = None,
    cpu: CpuShare | None = None,
) -> list[list[int]]:
    """Continue each prompt by up to ``max_new_tokens`` tokens.

    Args:
        model: a :class:`DecoderLM` (put it in eval mode).
        prompts: token ids per row (each non-empty; lengths may differ).
        do_sample: ``False`` = greedy (argmax); else sample with ``temperature``, ``top_k``,
            ``top_p`` (see :mod:`qkv.inference.sampling`).
        stop_tokens: ids that end a row (the stop token is kept in its output).
        stop: ``(row, new ids so far) -> bool``, e.g. a stop-string check.
        generator: random generator for reproducible samples.
        on_tokens: called after each step with the new id per row (``None`` for finished rows).
        cpu: the caller's :class:`~qkv.cpu_share.CpuShare`, ticked after each step (its thread
            count may follow the machine's load); ``None``: torch's thread count is left alone.

    Returns:
        the new ids of each row (prompt excluded).

    A context longer than ``max_len`` is cut to its last tokens (a sliding window, with a
    warning); the cache is then rebuilt from the window, so positions stay within the range
    the model was trained on.

    Raises:
        QkvError: ``max_new_tokens`` < 1, an empty prompt, or meaningless sampling settings.
        ValueError: a token id outside the model's vocabulary.
    """
    _check_request(model, prompts, max_new_tokens, do_sample, temperature, top_k, top_p)
    max_len = model.config.max_len
    keep = max(1, (3 * max_len) // 4)  # window kept when the context is full
    rows = _Rows(model, prompts, set(stop_tokens), stop)
    logits = rows.prefill(max_len)
    for step in range(max_new_tokens):
        next_ids = choose_next(logits, do_sample, temperature, top_k, top_p, generator)  # (B,)
        emitted = rows.append(next_ids.tolist())
        if cpu is not None:
            cpu.tick(1)
        if on_tokens is not None:
            on_tokens(emitted)
        if rows.finished or step == max_new_tokens - 1:
            break
        # prefill is called from here only: its warning's stacklevel counts this frame
        logits = rows.prefill(keep) if rows.cache_full else rows.feed(next_ids)
    return rows.new


def _check_request(
    model: DecoderLM,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    do_sample: bool,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
) -> None:
    """Refuse what :func:`generate_tokens` cannot do, before the model runs."""
    if max_new_tokens < 1:
        raise QkvError(f"max_new_tokens must be >= 1 (got {max_new_tokens})")
    if not prompts or any(len(p) == 0 for p in prompts):
        raise QkvError("every prompt needs at least one token")
    if do_sample:
        check_sampling(temperature, top_k, top_p)
    # The model's forward does not check ids (no host syncs there): check the user's once here.
    assert model.config.vocab_size is not None  # DecoderLM.__init__ required it
    check_token_ids(torch.tensor([i for p in prompts for i in p]), model.config.vocab_size)


class _Rows:
    """The rows :func:`generate_tokens` continues: each one's ids so far (prompt and new), its
    new ids and whether it has ended, and the model's key/value caches and padding mask."""

    def __init__(
        self,
        model: DecoderLM,
        prompts: Sequence[Sequence[int]],
        stop_tokens: set[int],
        stop: Callable[[int, list[int]], bool] | None,
    ) -> None:
        self.model, self.stop_tokens, self.stop = model, stop_tokens, stop
        self.device = next(model.parameters()).device
        self.seqs = [list(p) for p in prompts]
        self.new: list[list[int]] = [[] for _ in self.seqs]
        self.done = [False] * len(self.seqs)
        self.warned = False

    def prefill(self, window: int) -> torch.Tensor:
        """Run the last ``window`` ids of every row (left-padded) through the model into new
        caches, warning once when a row is longer; the next-token logits ``(B, V)``."""
        max_len = self.model.config.max_len
        if not self.warned and any(len(s) > window for s in self.seqs):
            warnings.warn(
                f"context longer than the model's max_len ({max_len} tokens): using a "
                f"sliding window of the last {window} tokens",
                # the caller of generate_tokens: past prefill, generate_tokens and the frame of
                # its @torch.inference_mode() wrapper
                stacklevel=4,
            )
            self.warned = True
        tokens, self.mask = _left_pad([s[-window:] for s in self.seqs], self.device)
        self.caches = self.model.new_caches()
        return self.model(tokens, attention_mask=self.mask, caches=self.caches, last_only=True).logits[:, -1]

    def append(self, ids: list[int]) -> list[int | None]:
        """Add one id to each row still going, ending a row at a stop token or when ``stop``
        says so; the ids added (``None`` for rows that had ended)."""
        emitted: list[int | None] = []
        for i, tok in enumerate(ids):
            if self.done[i]:
                emitted.append(None)
                continue
            self.seqs[i].append(tok)
            self.new[i].append(tok)
            emitted.append(tok)
            if tok in self.stop_tokens or (self.stop is not None and self.stop(i, self.new[i])):
                self.done[i] = True
        return emitted

    @property
    def finished(self) -> bool:
        return all(self.done)

    @property
    def cache_full(self) -> bool:
        return self.caches[0].length >= self.model.config.max_len

    def feed(self, next_ids: torch.Tensor) -> torch.Tensor:
        """One new id per row ``(B,)`` through the model, reusing the caches; the next-token
        logits ``(B, V)``."""
        if self.mask is not None:
            self.mask = torch.cat([self.mask, self.mask.new_ones(self.mask.size(0), 1)], dim=1)  # (B, L + 1)
        return self.model(
            next_ids[:, None], attention_mask=self.mask, caches=self.caches, last_only=True
        ).logits[:, -1]


class TextGenerator:
    """Prompts in, text out, for a trained language-model run.

    Args:
        model: a :class:`DecoderLM`, used as given (:meth:`from_run` also lays its weights out
            for fast CPU decoding, see :func:`~qkv.inference.weight_layout.prepare_for_inference`);
        tokenizer: its :class:`~qkv.data.tokenizers.CharTokenizer` or
            :class:`~qkv.data.tokenizers.SubwordTokenizer`;
        cpu: the caller's :class:`~qkv.cpu_share.CpuShare` (an entry point's), ticked between
            tokens; ``None``: torch's thread count is left as the calling program set it.

    Attribute ``last_stats``: the :class:`~qkv.inference.stats.DecodeStats` of the latest
    :meth:`generate` call (``None`` before one).
    """

    def __init__(self, model: DecoderLM, tokenizer, cpu: CpuShare | None = None) -> None:
        self.model, self.tokenizer, self.cpu = model, tokenizer, cpu
        self.last_stats: DecodeStats | None = None

    @classmethod
    def from_run(
        cls,
        run_dir: str | Path,
        device: torch.device | str = "cpu",
        weights: str = WEIGHTS,
        dtype: torch.dtype = torch.float32,
        quantize: str | None = None,
        cpu: CpuShare | None = None,
    ) -> TextGenerator:
        """Load a trained LM run (or a pretrained short name, ``iglm``, or a Hub name of a GPT-2,
        ``org/name`` or ``org/name@revision``).
        ``dtype=torch.bfloat16`` casts the weights for faster decoding (decoding streams the
        weights, and bfloat16 halves their bytes; where the CPU has native bfloat16 they go to
        oneDNN's kernel; ``benchmarks/limits.py``; logits differ slightly from float32's, and
        decoding with the cache gives bit for bit the logits of full recomputation, see
        ``batch_invariant``). The weights' memory layout is chosen here, once, for the dtype and
        device (values unchanged; see :func:`~qkv.inference.weight_layout.prepare_for_inference`).
        ``quantize="int8"``: int8 weights with bfloat16 activations
        (:mod:`qkv.inference.quantize`; faster than bfloat16 weights where the CPU has native
        bfloat16, at a small quality cost measured in ``benchmarks/RESULTS.md``). ``cpu``: as
        the class's.

        Raises:
            QkvError: an unknown ``quantize``, a missing run, or a model that is not an LM."""
        from ..hub.hub_names import is_hub_name
        from ..hub.pretrained import is_short_name, load

        if quantize not in (None, "int8"):
            raise QkvError(f"unknown quantisation {quantize!r}; choose int8 (or none)")
        if is_short_name(run_dir) or is_hub_name(run_dir):
            model, tokenizer = load(run_dir, device)
            if not built_as(model, DECODER_LM):
                raise QkvError(f"{run_dir} is not a language model")
        else:
            model, tokenizer = runs.load_run(run_dir, weights, device, family="lm")
        return cls(prepare_for_inference(cast_weights(model, quantize or dtype)), tokenizer, cpu)

    def encode_prompt(self, prompt: str) -> list[int]:
        """Ids of ``prompt``. An empty prompt starts from the start token (``"\\n"`` for a
        character model, ``<bos>`` for BPE).

        Raises:
            QkvError: characters outside a character vocabulary (named), or an empty prompt
                for a model with no start token.
        """
        if prompt == "":
            if self.model.config.bos_id is None:
                raise QkvError("empty prompt and this model has no start token: give a prompt")
            return [self.model.config.bos_id]
        # a pretrained model's tokenizer may frame its input ([CLS] ... [SEP]); a prompt is not framed
        ids = (
            self.tokenizer.encode(prompt, add_special_tokens=False)
            if getattr(self.tokenizer, "kind", None) == "hf"
            else self.tokenizer.encode(prompt)
        )
        unk = getattr(self.tokenizer, "unk_id", None)
        if unk is not None and unk in ids:
            warnings.warn(
                f"{ids.count(unk)} piece(s) of the prompt are unknown to the tokenizer "
                "and were mapped to <unk>",
                stacklevel=2,
            )
        return ids

    def generate(
        self,
        prompts: Sequence[str],
        max_new_tokens: int = 200,
        do_sample: bool = True,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        stop: Sequence[str] = (),
        seed: int | None = None,
        stream: Callable[[int, str], None] | None = None,
    ) -> list[str]:
        """Continuations of ``prompts`` (prompt text excluded).

        ``stop``: strings that end a row (cut off before the stop string). ``stream(row, text)``
        receives each row's new text as it is produced (held back only while it could still
        be the start of a stop string). ``seed`` makes sampling reproducible: an integer in
        torch's range, ``-2**63 <= seed < 2**64`` (a negative seed is the same as
        ``seed + 2**64``).

        Raises:
            QkvError: as :func:`generate_tokens` and :meth:`encode_prompt`, or a seed outside
                that range.
        """
        if seed is not None and not SEED_RANGE[0] <= seed < SEED_RANGE[1]:
            raise QkvError(f"seed must be an integer in [-2**63, 2**64) (got {seed})")
        ids = [self.encode_prompt(p) for p in prompts]
        generator = None
        if seed is not None:
            generator = torch.Generator(device=next(self.model.parameters()).device).manual_seed(seed)
        eos = [] if self.model.config.eos_id is None else [self.model.config.eos_id]
        texts = _StopAndStream(self.tokenizer, len(prompts), stop, stream, eos)
        stats = DecodeStats(items=len(prompts))

        def on_tokens(emitted):
            stats.first_token()
            if stream is not None:
                texts.show(emitted)

        # Decoding every step is needed only to find stop strings or to stream text.
        per_step = bool(stop) or stream is not None
        new = generate_tokens(
            self.model,
            ids,
            max_new_tokens,
            do_sample,
            temperature,
            top_k,
            top_p,
            stop_tokens=eos,
            stop=texts.cut if per_step else None,
            generator=generator,
            on_tokens=on_tokens,
            cpu=self.cpu,
        )
        stats.new_tokens = sum(map(len, new))
        self.last_stats = stats.stop()
        if not per_step:
            return [self.tokenizer.decode(n) for n in new]
        if stream is not None:
            texts.show_rest()
        return texts.texts

    @torch.no_grad()
    def next_token_probs(
        self, prompt: str, k: int = 10, temperature: float = 1.0, top_p: float | None = None
    ) -> list[tuple[str, float]]:
        """The ``k`` most likely next tokens after ``prompt`` and their probabilities under
        ``temperature`` (and ``top_p``), most likely first: ``[(token text, probability)]``.

        Probabilities are finite for any accepted setting: a temperature or ``top_p`` too small
        for float32 gives the most likely token probability 1 (shared among ties), see
        :func:`~qkv.inference.sampling.filter_logits`.

        Raises:
            QkvError: meaningless settings (:func:`~qkv.inference.sampling.check_sampling`), or
                as :meth:`encode_prompt`.
        """
        ids = self.encode_prompt(prompt)[-self.model.config.max_len :]
        device = next(self.model.parameters()).device
        logits = self.model(torch.tensor([ids], device=device), last_only=True).logits[:, -1]
        probs = next_token_probs(logits, temperature, None, top_p)[0]
        top = torch.topk(probs, min(k, probs.numel()))
        return [
            (self.tokenizer.id_to_token(i), p)
            for i, p in zip(top.indices.tolist(), top.values.tolist(), strict=True)
        ]


class _StopAndStream:
    """What :meth:`TextGenerator.generate` does with each row's new ids as they come: decode
    them to find the stop strings (the text is cut before the first), and pass the new text to
    ``stream``, holding back the end that could still be the start of a stop string."""

    def __init__(
        self,
        tokenizer,
        rows: int,
        stop: Sequence[str],
        stream: Callable[[int, str], None] | None,
        eos: list[int],
    ) -> None:
        self.tokenizer, self.stop, self.stream, self.eos = tokenizer, stop, stream, eos
        self.texts = ["" for _ in range(rows)]
        self.shown = [0] * rows
        self.hold = max((len(s) for s in stop), default=1) - 1

    def cut(self, i: int, new_ids: list[int]) -> bool:
        """Decode row ``i``'s new ids; whether they hold a stop string (the text is then cut)."""
        texts = self.texts
        texts[i] = self.tokenizer.decode(new_ids)
        hits = [texts[i].find(s) for s in self.stop if s and s in texts[i]]
        if hits:
            texts[i] = texts[i][: min(hits)]
            return True
        return False

    def show(self, emitted: list[int | None]) -> None:
        """Stream what each row has gained since it was last shown (all of it once the row has
        ended)."""
        assert self.stream is not None
        texts, shown = self.texts, self.shown
        for i, t in enumerate(emitted):
            if t is None and shown[i] >= len(texts[i]):
                continue
            end = len(texts[i]) if t is None or t in self.eos else max(shown[i], len(texts[i]) - self.hold)
            if end > shown[i]:
                self.stream(i, texts[i][shown[i] : end])
                shown[i] = end

    def show_rest(self) -> None:
        """At the end: stream what each row held back."""
        assert self.stream is not None
        for i, text in enumerate(self.texts):
            if len(text) > self.shown[i]:
                self.stream(i, text[self.shown[i] :])
