"""Recipe: train a masked diffusion language model (LLaDA, Nie et al. 2025; MDLM, Sahoo et al.
2024) on the corpora ``qkv train lm`` reads: the same corpus, split, tokenizer and token
shards, the same batches; the model has no look-ahead mask and learns to restore the masked
tokens of a window masked at a ratio t ~ U(ε, 1), weighted by 1/t (the negative ELBO,
:mod:`qkv.train.diffusion`).

Why a recipe of its own rather than an ``objective`` setting of ``lm``: the run holds another
architecture (bidirectional, one more token, [MASK]), is scored by a bound rather than an exact
likelihood and generates by unmasking (:mod:`qkv.inference.diffusion`), so everything that
reads a run (``qkv generate``, ``qkv evaluate``, the explainer) must tell the two apart by the
recipe name ``train_config.json`` records. The data and the loop are ``lm``'s, by subclassing.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import ClassVar

import torch

from .. import runs
from ..data.lm import eval_rows, masked_rows
from ..errors import ConfigError
from ..explain.diffusion import DiffusionLMExplainer
from ..files import write_text
from ..inference.diffusion import DEFAULT_REMASKING, REMASKING, DiffusionGenerator, Remasking
from ..models.config import DiffusionLMConfig
from ..models.diffusion_lm import DiffusionLM
from ..models.model_types import DIFFUSION_LM
from ..train.diffusion import (
    DEFAULT_EPS,
    BoundEstimate,
    estimate_bound,
    mask_tokens,
    masked_diffusion_loss,
    sample_times,
)
from ..train.loop import LoopState
from .common import closing_sentence
from .lm import LMRun, LMSettings, _metrics, run_split, start_token
from .recipe import Recipe

logger = logging.getLogger(__name__)

EVAL_WINDOWS = 128  # windows per validation batch, as lm's


@dataclass(frozen=True, kw_only=True)
class DiffusionLMSettings(LMSettings):
    """Settings of ``qkv train diffusion-lm``: :class:`~qkv.recipes.lm.LMSettings` (corpus,
    tokenizer, ``data=`` shards, batches, schedule; ``init`` and LoRA are refused: there is no
    pretrained diffusion LM to continue) with a :class:`~qkv.models.config.DiffusionLMConfig`,
    and:

    - ``eps``: the smallest masking ratio (t ~ U(eps, 1); MDLM's 1e-3);
    - ``by_line``: read the corpus one sequence per line (proteins: each line a row from
      position 0, closed by a newline token, padded), as ``lm`` reads IgLM's corpora;
    - ``bound_samples``: Monte Carlo draws of (t, masks) per validation window for the final
      bound and its standard error (validation during training uses one, with a fixed seed);
    - ``steps``, ``remasking``, ``block_length``: how ``samples.txt`` is generated
      (:func:`~qkv.inference.diffusion.denoise`; ``steps`` ``None``: one per token).
      ``temperature`` (LMSettings') applies; ``top_k`` does not.
    """

    model: DiffusionLMConfig = DiffusionLMConfig()
    eps: float = DEFAULT_EPS
    by_line: bool = False
    bound_samples: int = 4
    steps: int | None = None
    remasking: Remasking = DEFAULT_REMASKING
    block_length: int | None = None

    # lm's, and how the corpus is read (one sequence per line or one stream)
    FIXED_ON_RESUME: ClassVar[tuple[str, ...]] = (*LMSettings.FIXED_ON_RESUME, "by_line")

    def __post_init__(self) -> None:
        if self.init is not None:
            raise ConfigError(
                "init continues a pretrained autoregressive LM; a diffusion LM starts from random "
                "weights (leave init out)"
            )
        super().__post_init__()
        if not 0.0 < self.eps < 1.0:
            raise ConfigError(f"eps ({self.eps}) must be in (0, 1)")
        if self.bound_samples < 1 or (self.steps is not None and self.steps < 1):
            raise ConfigError(f"bound_samples ({self.bound_samples}) and steps ({self.steps}) must be >= 1")
        if self.remasking not in REMASKING:
            raise ConfigError(f"remasking ({self.remasking!r}) must be one of {', '.join(REMASKING)}")
        if self.block_length is not None and self.block_length < 1:
            raise ConfigError(f"block_length ({self.block_length}) must be >= 1 (or null: one block)")
        if self.by_line and self.data is not None:
            raise ConfigError("by_line reads a text corpus; data= shards are one stream")

    def model_config(self, tok) -> DiffusionLMConfig:
        """``model`` with the tokenizer's vocabulary plus [MASK] (the last id) and its start
        token."""
        return replace(
            self.model, vocab_size=tok.vocab_size + 1, mask_id=tok.vocab_size, bos_id=start_token(tok)
        )


class DiffusionLMRun(LMRun):
    """``qkv train diffusion-lm``: ``lm``'s data and batches; the loss is the masked diffusion
    objective with MDLM's low-discrepancy t per batch; validation and the best weights by the
    bound per token (``val_loss``, nats, one Monte Carlo draw per window, fixed seed);
    ``summary.json`` holds the bound with ``bound_samples`` draws and its standard error."""

    name = "diffusion-lm"
    settings: DiffusionLMSettings

    def by_line(self, tok) -> bool:
        return self.settings.by_line or super().by_line(tok)

    def build_model(self, config: DiffusionLMConfig) -> DiffusionLM:  # type: ignore[override]
        model = DiffusionLM(config).to(self.device)
        self.zero_shot = None
        self.block_size = config.max_len
        assert config.mask_id is not None
        self.mask_id = config.mask_id  # the steps' model may be wrapped (DDP, compiled): no .config
        logger.info(f"model: {model.num_parameters() / 1e6:.2f} M parameters on {self.device}")
        return model

    def loss(self, model, item) -> tuple[torch.Tensor, int]:
        x0, valid = masked_rows(self.train_data, item, self.block_size)
        count = x0.numel() if valid is None else int(valid.sum())  # before the move: no device sync
        x0 = x0.to(self.device)
        valid = None if valid is None else valid.to(self.device)
        t = sample_times(len(x0), self.settings.eps, stratified=True, device=self.device)
        xt, masked = mask_tokens(x0, t, self.mask_id, valid)
        return masked_diffusion_loss(model(xt, valid).logits, x0, masked, t).sum(), count

    def _bound(self, model, samples: int, max_batches: int | None) -> BoundEstimate:
        s = self.settings
        return validation_bound(model, self.val_data, samples, s.eps, s.train.seed, max_batches)

    def validate(self, model) -> dict:
        b = self._bound(model, 1, self.settings.eval_limit)
        return _metrics(b.nats_per_token * b.tokens, b.tokens, self.chars_per_token)

    def summarize(self, model, state: LoopState) -> dict:
        s = self.settings
        b = self._bound(model, s.bound_samples, s.summary_limit)
        summary: dict = {"validation": bound_metrics(b, self.chars_per_token)}
        generator = DiffusionGenerator(model, self.tokenizer)
        summary["samples"] = write_samples(generator, self.run_dir / "samples.txt", s)
        return summary


def validation_bound(
    model: DiffusionLM, data, samples: int, eps: float, seed: int, max_batches: int | None = None
) -> BoundEstimate:
    """The bound per token of a split (:func:`~qkv.train.diffusion.estimate_bound`), over at
    most ``max_batches`` batches of :data:`EVAL_WINDOWS` rows."""

    def batches() -> Iterator:
        for n, batch in enumerate(eval_rows(data, model.config.max_len, EVAL_WINDOWS)):
            if max_batches is not None and n >= max_batches:
                return
            yield batch

    model.eval()
    assert model.config.mask_id is not None
    return estimate_bound(model, batches(), model.config.mask_id, samples, eps, seed)


def bound_metrics(b: BoundEstimate, chars_per_token: float, prefix: str = "val_") -> dict:
    """``lm``'s metric names for the bound (``val_loss`` = the bound per token, nats; its
    perplexity and bits an upper bound on the model's), with its standard error and draws."""
    se = b.stderr
    return {
        **_metrics(b.nats_per_token * b.tokens, b.tokens, chars_per_token, prefix),
        f"{prefix}loss_stderr": se,
        f"{prefix}bits_per_char_stderr": se / chars_per_token / math.log(2),
        "bound_samples": b.samples,
        "tokens": b.tokens,
    }


def write_samples(generator: DiffusionGenerator, path: Path, settings: DiffusionLMSettings) -> list[str]:
    """``num_samples`` samples of ``sample_tokens`` tokens from the start token, unmasked
    window by window (:meth:`~qkv.inference.diffusion.DiffusionGenerator.generate`)."""
    s = settings
    texts = generator.generate(
        "",
        s.sample_tokens,
        s.steps,
        num_samples=s.num_samples,
        seed=s.train.seed,
        remasking=s.remasking,
        block_length=s.block_length,
        temperature=s.temperature,
    )
    header = (
        f"# {s.num_samples} samples, {s.sample_tokens} tokens each, from the start token, unmasked "
        f"in {s.steps or s.sample_tokens} steps ({s.remasking} remasking, temperature {s.temperature}, "
        f"seed {s.train.seed})\n"
    )
    write_text(path, header + "\n---------------\n".join(texts) + "\n")
    return texts


def evaluate_run(run_dir: str | Path, split: str = "val", device: torch.device | str = "cpu") -> dict:
    """The bound per token and per character of a run on its corpus split (``"val"`` or
    ``"train"``), with its Monte Carlo standard error: the run's ``bound_samples`` draws per
    window and its seed (on the device of training, the same figure as ``summary.json``), under
    ``lm``'s names (``loss``, ``ppl``, ``bits_per_char``, ... and ``loss_stderr``).

    Raises:
        QkvError: a missing run, a run of another kind, an unknown split."""
    model, tok = runs.load_run(run_dir, device=device, family="diffusion-lm")
    meta = runs.RunInfo.read(run_dir).settings
    data, chars_per_token = run_split(run_dir, tok, split)
    b = validation_bound(model, data, meta["bound_samples"], meta["eps"], meta["train"]["seed"])
    return {"split": split, **bound_metrics(b, chars_per_token, prefix="")}


def summary_text(summary: dict, run_dir: Path) -> str:
    """What ``qkv train diffusion-lm`` shows at the end: a sample and the validation bound."""
    v = summary["validation"]
    return (
        f"sample:\n{summary['samples'][0]}\n\n"
        f"validation bound {v['val_loss']:.4f} ± {v['val_loss_stderr']:.4f} nats/token "
        f"({v['val_bits_per_char']:.3f} bits/char, an upper bound on the NLL; {v['bound_samples']} "
        f"draws per window) {closing_sentence(summary, run_dir)}"
    )


RECIPE = Recipe(
    name="diffusion-lm",
    settings=DiffusionLMSettings,
    train=DiffusionLMRun.train,
    evaluate=evaluate_run,
    splits=("val", "train"),
    summary=summary_text,
    model_type=DIFFUSION_LM,
    explainer=DiffusionLMExplainer,
    inputs="text",
)
